"""Damaged files in other writers' layouts meet the commands' one input gate before any dialect
view reads them: a truncated file, a span that does not match dtype x shape, an empty dtype, a
bias re-typed to F64 with trailing bytes, overlapping offsets -- each refused in one line naming
the file and the damage (as the same damage in a Comfy-layout file is), never an internal error,
never an output built from the damaged bytes, the input untouched.  Metadata nested tens of
thousands deep is parsed by one bounded parse and never crashes a command."""

from __future__ import annotations

import os

import pytest

import foreign_seeds as fs
from builders import dense_layer, fp8_layer, write
from comfyquant.cli import main

pytestmark = pytest.mark.needs_torch

COMMANDS = {
    "dequantize": lambda src, out, ref: ["dequantize", src, out, "--no-progress"],
    "convert": lambda src, out, ref: ["convert", src, "-t", "fp8", "-o", out, "--no-progress"],
    "compare": lambda src, out, ref: ["compare", src, ref, "--no-progress"],
    "recipe": lambda src, out, ref: ["recipe", src],
    "quantize": lambda src, out, ref: ["quantize", src, "-f", "fp8", "-o", out, "--no-progress"],
}
VERBS = {
    "dequantize": "dequantize",
    "convert": "convert",
    "compare": "compare",
    "recipe": "read a recipe of",
    "quantize": "quantize",
}


def comfy_seed(folder) -> str:
    return write(os.path.join(str(folder), "comfy.safetensors"), fp8_layer("blocks.0.a", n=32, k=64), dense_layer("norm", 8, 16))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeds")
    out = {name: fs.seed(name, folder) for name in fs.SEEDS}
    out["comfy"] = comfy_seed(folder)
    return out


def run(capsys, args) -> tuple[int, str]:
    rc = main(args)
    _out, err = capsys.readouterr()
    return rc, err


@pytest.mark.parametrize("kind", fs.DAMAGES)
@pytest.mark.parametrize("layout", [*fs.SEEDS, "comfy"])
def test_damage_in_any_layout_is_refused_in_one_line_by_every_reading_command(tmp_path, capsys, seeds, layout, kind):
    src = fs.damage(seeds[layout], kind, str(tmp_path / f"{layout}.safetensors"))
    ref = fs.copy(seeds[layout], str(tmp_path / "reference.safetensors"))
    for command, args in COMMANDS.items():
        out = str(tmp_path / "out.safetensors")
        before = fs.snapshot(tmp_path)
        rc, err = run(capsys, args(src, out, ref))
        assert rc == 2, f"{command} {layout} {kind}: exit {rc}: {err}"
        assert err.count("\n") == 1 and "internal error" not in err, err
        assert err.startswith(f"comfyquant: refusing to {VERBS[command]}: {src}: "), err
        assert " [C00" in err, err  # the container finding check reports for it
        assert fs.snapshot(tmp_path) == before, f"{command} {layout} {kind} changed the folder"


@pytest.mark.parametrize("layout", [*fs.SEEDS, "comfy"])
def test_the_gate_names_the_damage_check_reports(tmp_path, capsys, seeds, layout):
    """The refusal quotes check's own finding for the file (one source of truth)."""
    src = fs.damage(seeds[layout], "span", str(tmp_path / "d.safetensors"))
    assert main(["check", src, "--json"]) == 1
    import json

    findings = json.loads(capsys.readouterr().out)["findings"]
    c001 = next(f for f in findings if f["code"] == "C001")
    rc, err = run(capsys, ["dequantize", src, str(tmp_path / "o.safetensors"), "--no-progress"])
    assert rc == 2 and c001["message"] in err and "[C001]" in err


DEEP_KEYS = ["_quantization_metadata", "quantization_config", "comfy_config", "config", "_comfyquant", "comfy.gguf.types"]


@pytest.mark.parametrize("key", DEEP_KEYS)
@pytest.mark.parametrize("layout", [*fs.SEEDS, "comfy"])
def test_metadata_nested_fifty_thousand_deep_never_crashes_a_command(tmp_path, capsys, seeds, layout, key):
    src = fs.deep_metadata(seeds[layout], key, str(tmp_path / "deep.safetensors"))
    ref = fs.copy(seeds[layout], str(tmp_path / "reference.safetensors"))
    commands = dict(COMMANDS)
    commands["migrate"] = lambda s, o, r: ["migrate", s, "-o", o]
    commands["fix"] = lambda s, o, r: ["fix", s, "-o", o]
    commands["check"] = lambda s, o, r: ["check", s, "--deep"]
    commands["inspect"] = lambda s, o, r: ["inspect", s]
    for command, args in commands.items():
        out = str(tmp_path / "out.safetensors")
        rc, err = run(capsys, args(src, out, ref))
        assert rc in (0, 1, 2) and "internal error" not in err, f"{command} {layout} {key}: exit {rc}: {err}"
        if rc == 2:
            assert err.count("\n") == 1 and not os.path.exists(out), err
        if os.path.exists(out):
            os.unlink(out)


def test_the_bounded_parse_refuses_depth_as_invalid_json():
    from comfyquant.io.jsontext import MAX_DEPTH, TooDeep, parse

    assert parse("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    for depth in (MAX_DEPTH + 1, 990, 50_000):
        with pytest.raises(TooDeep):
            parse("[" * depth + "]" * depth)
    assert issubclass(TooDeep, ValueError)  # every caller's "not JSON" path handles it
    assert parse('{"a": "[[[[[[[[[["}') == {"a": "[[[[[[[[[["}  # brackets in strings are text


@pytest.mark.parametrize("kind", ["truncated", "span"])
def test_a_damaged_reference_is_refused_before_the_work(tmp_path, capsys, kind):
    """``quantize --reference`` reads the original weights: a damaged one is refused by the
    same gate, naming it, before anything is quantized."""
    from builders import dense_layer

    src = write(str(tmp_path / "d.safetensors"), dense_layer("blocks.0.a", 32, 256), dense_layer("blocks.0.b", 32, 256))
    ref = fs.damage(src, kind, str(tmp_path / "ref.safetensors"))
    out = str(tmp_path / "o.safetensors")
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["quantize", src, "-f", "fp8", "-o", out, "--reference", ref, "--no-progress"])
    assert rc == 2 and err.startswith(f"comfyquant: refusing to read --reference: {ref}: ") and " [C00" in err, err
    assert fs.snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["truncated", "span", "empty-dtype"])
def test_the_pytorch_loader_refuses_a_damaged_foreign_file_in_one_line(tmp_path, seeds, kind):
    """``load_quantized`` opens checkpoints through the same gate as the commands."""
    import torch

    from comfyquant.torch import load_quantized
    from comfyquant.torch.tensors import LoadError

    src = fs.damage(seeds["legacy"], kind, str(tmp_path / "d.safetensors"))
    model = torch.nn.Module()
    with pytest.raises(LoadError) as exc:
        load_quantized(model, src, strict=False)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"refusing to load {src}: {src}: ") and " [C00" in message
