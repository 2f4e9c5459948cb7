"""One output rule for every writing command (one output-path helper, one overwrite flag): ``fix``, ``quantize``, ``convert`` (also ``--to dense``) and ``dequantize``
decide their destinations through ``comfyquant.io.outputs.claim``, take ``--overwrite`` (API:
``overwrite=``), name an output the user did not give the same way, and refuse each situation
with the same line: exit 2, one line on stderr naming the path, nothing written, the input
untouched.  ``fix --force`` still works, hidden."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import comfyquant
from builders import W4A8_MARKER, dense_layer, w4a8_layer, write
from comfyquant.cli import main
from comfyquant.errors import ComfyQuantError

COMMANDS = [
    "fix",
    *(pytest.param(c, marks=pytest.mark.needs_torch) for c in ("quantize", "convert", "convert-dense", "dequantize")),
]
TAG = {"fix": "fixed", "quantize": "float8_e4m3fn", "convert": "int8_tensorwise", "convert-dense": "dense", "dequantize": "dense"}
"""The default name's tag: the command's word, or the full name of the format written."""
BROKEN = {k: v for k, v in W4A8_MARKER.items() if k != "convrot"}
"""A W4A8 marker without its ``convrot`` key: something ``fix`` repairs (losslessly)."""


def source(tmp_path, command: str, name: str = "model.safetensors") -> str:
    """An input the command accepts and writes an output for."""
    if command == "quantize":
        return write(tmp_path / name, dense_layer("a"), dense_layer("b"))
    if command == "fix":
        return write(tmp_path / name, w4a8_layer("a.b", marker=BROKEN), dense_layer("n"))
    return write(tmp_path / name, w4a8_layer("a.b"), dense_layer("n"))


def cli_args(command: str, inputs, out=None) -> list[str]:
    inputs = [str(p) for p in (inputs if isinstance(inputs, list) else [inputs])]
    extra = {
        "fix": [],
        "dequantize": ["--no-progress"],
        "quantize": ["-f", "fp8", "--no-progress"],
        "convert": ["-t", "int8", "--no-progress"],
        "convert-dense": ["-t", "dense", "--no-progress"],
    }[command]
    return [command.split("-")[0], *inputs, *(["-o", str(out)] if out is not None else []), *extra]


def api(command: str, src, out=None, **kw):
    """The command's API function, called as a script would."""
    if command == "fix":
        return comfyquant.fix(src, out=None if out is None else str(out), **kw)
    if command == "dequantize":
        return comfyquant.dequantize(src, None if out is None else str(out), progress=False, **kw)
    fn, fmt = {
        "quantize": (comfyquant.quantize, "fp8"),
        "convert": (comfyquant.convert, "int8"),
        "convert-dense": (comfyquant.convert, "dense"),
    }[command]
    return fn(src, None if out is None else str(out), fmt, progress=False, **kw)


def snapshot(root) -> dict[str, str]:
    """Every file and folder under ``root`` with its content's digest: "nothing written"."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            p = os.path.join(folder, d)
            seen[os.path.relpath(p, root)] = "link" if os.path.islink(p) else "dir"
        for f in files:
            p = os.path.join(folder, f)
            if os.path.islink(p) and not os.path.exists(p):
                seen[os.path.relpath(p, root)] = "dangling"
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    seen[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
            else:
                seen[os.path.relpath(p, root)] = "special"
    return seen


def refused(capsys, tmp_path, command: str, args: list[str], src, out, message: str) -> None:
    """The CLI refuses with exactly ``message`` and writes nothing, with or without
    ``--overwrite`` when the situation is not an existing output; the API raises the same
    message, naming its keyword where the CLI names an option."""
    before = snapshot(tmp_path)
    assert main(args) == 2
    got = capsys.readouterr()
    assert got.err == f"comfyquant: {message}\n" and got.out == "", (args, got)
    assert snapshot(tmp_path) == before
    with pytest.raises(ComfyQuantError) as exc:
        api(command, src, out)
    assert str(exc.value) == message.replace("pass --overwrite", "pass overwrite=True")  # the API's keyword
    assert snapshot(tmp_path) == before


# -- each situation, for every writing command ----------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, capsys, command):
    src = source(tmp_path, command)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"someone's file")
    refused(capsys, tmp_path, command, cli_args(command, src, out), src, out, f"{out}: exists; pass --overwrite to replace it")
    assert main(cli_args(command, src, out) + ["--overwrite"]) in (0, 1)
    capsys.readouterr()
    assert out.read_bytes()[:8] != b"someone'" and comfyquant.check(str(out), target="comfy-kitchen").ok
    written = out.read_bytes()
    out.write_bytes(b"someone's file")
    api(command, src, out, overwrite=True)
    assert out.read_bytes() == written  # the API's keyword does what the flag does
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant")]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("how", ["same path", "hard link", "symbolic link"])
def test_an_input_is_never_an_output(tmp_path, capsys, command, how):
    src = source(tmp_path, command)
    out = {"same path": src, "hard link": tmp_path / "alias.safetensors", "symbolic link": tmp_path / "link.safetensors"}[how]
    if how == "hard link":
        os.link(src, out)
    elif how == "symbolic link":
        os.symlink(src, out)
    message = f"{out}: is the input; refusing to overwrite the input checkpoint"
    refused(capsys, tmp_path, command, cli_args(command, src, out), src, out, message)
    refused(capsys, tmp_path, command, cli_args(command, src, out) + ["--overwrite"], src, out, message)
    with pytest.raises(ComfyQuantError, match="is the input"):
        api(command, src, out, overwrite=True)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_folder_that_does_not_exist_is_refused_up_front(tmp_path, capsys, command):
    """A typo in OUT's folder is refused before any work (it failed at the first write), and no
    folder is created."""
    src = source(tmp_path, command)
    out = tmp_path / "nope" / "out.safetensors"
    message = f"{out}: the folder {tmp_path / 'nope'} does not exist"
    refused(capsys, tmp_path, command, cli_args(command, src, out), src, out, message)
    refused(capsys, tmp_path, command, cli_args(command, src, out) + ["--overwrite"], src, out, message)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_folder_that_is_a_file_is_refused(tmp_path, capsys, command):
    src = source(tmp_path, command)
    (tmp_path / "afile").write_bytes(b"x")
    out = tmp_path / "afile" / "out.safetensors"
    message = f"{out}: {tmp_path / 'afile'} is not a folder"
    refused(capsys, tmp_path, command, cli_args(command, src, out) + ["--overwrite"], src, out, message)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_where_the_output_file_goes_is_never_replaced(tmp_path, capsys, command):
    """OUT is a folder and the output's name in it is a folder too: refused, --overwrite or not."""
    src = source(tmp_path, command)
    (tmp_path / "into" / f"model.{TAG[command]}.safetensors").mkdir(parents=True)
    out = tmp_path / "into"
    message = f"{out / f'model.{TAG[command]}.safetensors'}: is a folder; give the output file's path, or a folder for OUT"
    refused(capsys, tmp_path, command, cli_args(command, src, out) + ["--overwrite"], src, out, message)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_special_file_is_never_replaced(tmp_path, capsys, command):
    src = source(tmp_path, command)
    out = tmp_path / "out.safetensors"
    os.mkfifo(out)
    message = f"{out}: is not a regular file (a device, FIFO or socket); refusing to replace it"
    refused(capsys, tmp_path, command, cli_args(command, src, out) + ["--overwrite"], src, out, message)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_dangling_link_at_the_output_is_an_existing_output(tmp_path, capsys, command):
    """A symbolic link whose target is gone is still something the user has there."""
    src = source(tmp_path, command)
    out = tmp_path / "out.safetensors"
    os.symlink(tmp_path / "gone.safetensors", out)
    refused(capsys, tmp_path, command, cli_args(command, src, out), src, out, f"{out}: exists; pass --overwrite to replace it")


# -- default names --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_without_an_output_every_command_names_it_alike(tmp_path, capsys, command):
    """``<stem>.<tag>.safetensors`` next to the input (the tag: ``fixed``, the format's full
    name, ``dense``); a second run refuses to replace it; ``--overwrite`` does."""
    src = source(tmp_path, command, "m.safetensors")
    default = tmp_path / f"m.{TAG[command]}.safetensors"
    assert main(cli_args(command, src)) in (0, 1)
    assert str(default) in capsys.readouterr().out and default.exists()
    assert comfyquant.check(str(default), target="comfy-kitchen").ok
    refused(capsys, tmp_path, command, cli_args(command, src), src, None, f"{default}: exists; pass --overwrite to replace it")
    assert main(cli_args(command, src) + ["--overwrite"]) in (0, 1)
    capsys.readouterr()
    os.unlink(default)
    api(command, src)
    assert default.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_shards_default_to_a_folder_next_to_theirs(tmp_path, capsys, command):
    shards = tmp_path / "ckpt"
    shards.mkdir()
    source(shards, command, "m-00001-of-00002.safetensors")
    write(shards / "m-00002-of-00002.safetensors", dense_layer("z"))
    default = tmp_path / f"ckpt.{TAG[command]}"
    assert main(cli_args(command, shards)) in (0, 1), capsys.readouterr()
    capsys.readouterr()
    assert {"m-00001-of-00002.safetensors", "m-00002-of-00002.safetensors"} <= set(os.listdir(default))
    refused(
        capsys,
        tmp_path,
        command,
        cli_args(command, shards),
        str(shards),
        None,
        f"{default / 'm-00001-of-00002.safetensors'}: exists; pass --overwrite to replace it",
    )


def test_default_names_of_urls_land_in_the_current_folder(tmp_path, monkeypatch):
    from comfyquant.io.outputs import default_output

    monkeypatch.chdir(tmp_path)
    assert default_output(["https://host/org/repo/model.safetensors?download=1"], None, "fixed") == "model.fixed.safetensors"
    shards = ["hf://org/repo/unet/m-00001-of-00002.safetensors", "hf://org/repo/unet/m-00002-of-00002.safetensors"]
    assert default_output(shards, None, "dense") == str(tmp_path / "unet.dense")
    assert default_output([str(tmp_path / "a" / "m.safetensors")], None, "nvfp4") == str(tmp_path / "a" / "m.nvfp4.safetensors")
    assert default_output(["rel/x.bin"], None, "fixed") == "rel/x.fixed.safetensors"  # named for the model, any extension


# -- sharded outputs: the index is an output like the shards ----------------------------------------


def sharded(tmp_path, command: str):
    """Two shards and their index in ``tmp_path/src``."""
    folder = tmp_path / "src"
    folder.mkdir()
    first = source(folder, command, "m-00001-of-00002.safetensors")
    write(folder / "m-00002-of-00002.safetensors", dense_layer("z"))
    names = {}
    for f in ("m-00001-of-00002.safetensors", "m-00002-of-00002.safetensors"):
        with open(folder / f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        names.update({k: f for k in header if k != "__metadata__"})
    (folder / "m.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    assert first
    return str(folder / "m.safetensors.index.json")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_existing_index_in_the_output_folder_is_an_existing_output(tmp_path, capsys, command):
    index = sharded(tmp_path, command)
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.safetensors.index.json").write_text("{}")
    refused(
        capsys,
        tmp_path,
        command,
        cli_args(command, index, out),
        index,
        out,
        f"{out / 'm.safetensors.index.json'}: exists; pass --overwrite to replace it",
    )
    assert main(cli_args(command, index, out) + ["--overwrite"]) in (0, 1)
    capsys.readouterr()
    assert json.loads((out / "m.safetensors.index.json").read_text())["weight_map"]


@pytest.mark.needs_torch
def test_dequantize_refuses_to_replace_an_index_it_makes_up(tmp_path, capsys):
    """Shards without an index get one in the output folder: an index already there is an
    existing output like any other (dequantize replaced it silently)."""
    shards = tmp_path / "src"
    shards.mkdir()
    first = source(shards, "dequantize", "m-00001-of-00002.safetensors")
    second = write(shards / "m-00002-of-00002.safetensors", dense_layer("z"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors.index.json").write_text("{}")
    refused(
        capsys,
        tmp_path,
        "dequantize",
        cli_args("dequantize", [first, second], out),
        [first, second],
        out,
        f"{out / 'model.safetensors.index.json'}: exists; pass --overwrite to replace it",
    )


@pytest.mark.needs_torch
def test_dequantize_two_paths_never_overwrites_the_second_checkpoint(tmp_path, capsys):
    """``dequantize A B`` reads B as the output: when B is a checkpoint (the user meant two
    inputs), it is refused as an existing file instead of replaced by A's dense copy."""
    a = source(tmp_path, "dequantize", "a.safetensors")
    b = source(tmp_path, "dequantize", "b.safetensors")
    before = snapshot(tmp_path)
    assert main(["dequantize", a, b, "--no-progress"]) == 2
    assert capsys.readouterr().err == f"comfyquant: {b}: exists; pass --overwrite to replace it\n"
    assert snapshot(tmp_path) == before


@pytest.mark.needs_torch
def test_the_quality_report_is_an_output_too(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = source(tmp_path, "quantize")
    (tmp_path / "rep.json").write_text("{}")
    out = tmp_path / "q.safetensors"
    args = cli_args("quantize", src, out) + ["--report", str(tmp_path / "rep")]
    before = snapshot(tmp_path)
    assert main(args) == 2
    assert capsys.readouterr().err == f"comfyquant: {tmp_path / 'rep.json'}: exists; pass --overwrite to replace it\n"
    assert snapshot(tmp_path) == before
    assert main(args + ["--overwrite"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "rep.json").read_text())["layers"] and out.exists()


# -- the flag's names -------------------------------------------------------------------------------


def test_fix_force_is_a_hidden_alias_of_overwrite(tmp_path, capsys):
    src = source(tmp_path, "fix")
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"someone's file")
    assert main(["fix", src, "-o", str(out), "--force"]) == 0
    assert comfyquant.check(str(out)).ok
    assert main(["fix", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--overwrite" in text and "--force" not in text


@pytest.mark.parametrize("command", ["fix", "quantize", "convert", "dequantize"])
def test_every_writing_command_says_overwrite_in_the_same_words(capsys, command):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--overwrite replace existing output files (never an input)" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_a_new_output_folder_needs_its_parent(tmp_path, capsys, command):
    """Shards give the folder OUT, created; the folders above it never are."""
    index = sharded(tmp_path, command)
    out = tmp_path / "nope" / "out"
    refused(
        capsys,
        tmp_path,
        command,
        cli_args(command, index, out) + ["--overwrite"],
        index,
        out,
        f"{out}: the folder {tmp_path / 'nope'} does not exist",
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_trailing_slash_makes_out_a_new_folder(tmp_path, capsys, command):
    """``-o new/`` says a folder even for one input file: created, the output inside under the
    name it gets without OUT (it was taken for a file name ending in a slash)."""
    src = source(tmp_path, command)
    assert main(cli_args(command, src, f"{tmp_path / 'new'}/")) in (0, 1)
    capsys.readouterr()
    name = f"model.{TAG[command]}.safetensors"
    assert os.listdir(tmp_path / "new") == [name]
    assert comfyquant.check(str(tmp_path / "new" / name), target="comfy-kitchen").ok
