"""A missing shard is never dropped: every command that reads a shard set to write or measure
from it refuses an incomplete one in one line naming the missing shard -- index kept, no index
(the ``-of-N`` names count it), or the shard a symbolic link loop -- whatever the layout, as
``fix`` and ``migrate`` do; nothing is written and the input stays as it was.  (``check``
reports the same shard as C011.)"""

from __future__ import annotations

import os

import pytest

import foreign_seeds as fs
from builders import dense_layer, fp8_layer, write
from comfyquant.cli import main

pytestmark = pytest.mark.needs_torch

COMMANDS = {
    "dequantize": lambda src, out: ["dequantize", src, out, "--no-progress"],
    "convert": lambda src, out: ["convert", src, "-t", "int8", "-o", out, "--no-progress"],
    "compare": lambda src, out: ["compare", src, src, "--no-progress"],
    "recipe": lambda src, out: ["recipe", src],
    "quantize": lambda src, out: ["quantize", src, "-f", "fp8", "-o", out, "--no-progress"],
    "fix": lambda src, out: ["fix", src, "-o", out],
    "migrate": lambda src, out: ["migrate", src, "-o", out],
}


def source(layout: str, folder: str) -> str:
    if layout == "comfy":
        return write(os.path.join(folder, "one.safetensors"), fp8_layer("blocks.0.a", 32, 64), fp8_layer("blocks.0.b", 32, 64))
    if layout == "dense":
        return write(
            os.path.join(folder, "one.safetensors"), dense_layer("blocks.0.a", 32, 64), dense_layer("blocks.0.b", 32, 64)
        )
    return fs.seed(layout, folder)


@pytest.mark.parametrize("how", ["index", "no index", "link loop"])
@pytest.mark.parametrize("layout", ["comfy", "dense", "legacy", "musubi", "int8-fast"])
def test_an_incomplete_shard_set_is_refused_by_every_command_naming_the_shard(tmp_path, capsys, layout, how):
    one = source(layout, str(tmp_path))
    folder = str(tmp_path / "model")
    shards = fs.split_shards(one, folder, index=how == "index")
    os.unlink(one)
    fs.lose_shard(shards, "loop" if how == "link loop" else "gone")
    inputs = [folder, *([os.path.join(folder, "model.safetensors.index.json")] if how == "index" else [])]
    for src in inputs:
        for command, args in COMMANDS.items():
            out = str(tmp_path / "out")
            before = fs.snapshot(tmp_path)
            rc = main(args(src, out))
            _stdout, err = capsys.readouterr()
            if command == "fix":  # fix reports what it cannot carry over (exit 1) and writes nothing
                assert rc == 1 and not os.path.exists(out), (command, rc, err)
                assert fs.snapshot(tmp_path) == before
                continue
            assert rc == 2, f"{command} {src} ({layout}, {how}): exit {rc}: {err}"
            assert err.count("\n") == 1 and "internal error" not in err, err
            assert shards[1] in err and "[C011]" in err, err
            assert fs.snapshot(tmp_path) == before, f"{command} wrote or changed something"


def test_the_same_set_complete_is_read_whole(tmp_path, capsys):
    """The refusal is the missing shard's, not the shard set's: complete, it dequantizes whole."""
    from safetensors import safe_open

    one = source("comfy", str(tmp_path))
    folder = str(tmp_path / "model")
    fs.split_shards(one, folder)
    out = str(tmp_path / "dense.safetensors")
    assert main(["dequantize", folder, out, "--no-progress"]) == 0
    with safe_open(out, "np") as f:
        assert sorted(f.keys()) == ["blocks.0.a.weight", "blocks.0.b.weight"]
