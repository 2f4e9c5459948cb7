"""Messages in the user's terms: concrete shapes (never a shape formula), real names (never a
placeholder), options on the command line and keywords in the Python API, one word about
damage wherever a damaged file is shown, and outputs named for the model."""

from __future__ import annotations

import json
import os
import re

import pytest

import builders as b
import comfyquant
from comfyquant.cli import main
from comfyquant.errors import ComfyQuantError

FORMULA = re.compile(r"\b(if|else|pad|scale_layout|group_size|//)\b|\(N\b|\bK\)|\bN, |= \(")
"""What a shape rule looks like when it leaks into a message."""


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _broken_shapes(tmp_path) -> str:
    return b.write(
        tmp_path / "shapes.safetensors",
        b.int8_layer("blocks.0.attn", scale_shape=(1, 32)),  # transposed row scale
        b.nvfp4_layer("blocks.1.attn", n=128, k=256, scale_shape=(16, 128)),  # transposed blocked scale
        b.nvfp4_layer("blocks.2.attn", n=128, k=256, scale_shape=(128, 8)),  # another shape
        b.w4a8_layer("blocks.3.attn", correction=b.zeros("F32", (32, 16))),  # transposed correction
    )


def test_shape_findings_show_shapes_never_their_formula(tmp_path, capsys):
    path = _broken_shapes(tmp_path)
    report = comfyquant.check(path)
    shaped = [f for f in report.findings if f.code in ("L001", "L003", "L004")]
    assert {f.layer for f in shaped} >= {"blocks.0.attn", "blocks.1.attn", "blocks.2.attn", "blocks.3.attn"}
    for f in shaped:
        for text in (f.message, f.expected, f.actual, f.cause, f.fix):
            assert not FORMULA.search(text or ""), (f.code, text)
    by_layer = {f.layer: f for f in shaped}
    row_scale = by_layer["blocks.0.attn"]
    assert row_scale.expected == "F32 (32, 1)" and row_scale.actual == "F32 (1, 32)"
    assert row_scale.cause == "stored transposed: (1, 32) instead of (32, 1)"
    assert row_scale.fix == "transpose to (32, 1): comfyquant fix"
    assert "stored transposed: (16, 128) instead of (128, 16)" in by_layer["blocks.1.attn"].cause
    _code, out, _err = _run(capsys, "check", "-v", path)
    assert not FORMULA.search(out), out


def test_a_missing_tensor_expects_a_concrete_shape(tmp_path):
    tensors = b.int8_layer("blocks.0.attn", n=48)
    del tensors["blocks.0.attn.weight_scale"]
    path = b.write(tmp_path / "missing.safetensors", tensors)
    (f,) = [f for f in comfyquant.check(path).findings if f.code == "L001"]
    assert f.expected == "F32 (48, 1)" and f.actual == "absent"


def test_grouped_findings_quote_real_names(tmp_path, capsys):
    """A legacy scaled-FP8 file: SGLang's one message lists every layer without a marker; the
    group prints it as SGLang raises it."""
    tensors = {"scaled_fp8": ("F8_E4M3", (0,), b"")}
    for i in range(3):
        tensors[f"blocks.{i}.attn.weight"] = b.zeros("F8_E4M3", (32, 64))
        tensors[f"blocks.{i}.attn.scale_weight"] = b.ones("F32", ())
    path = b.write(tmp_path / "legacy.safetensors", tensors)
    _code, out, _err = _run(capsys, "check", path)
    assert "<layer>" not in out and "<tensor>" not in out
    assert "missing comfy_quant metadata: ['blocks.0.attn', 'blocks.1.attn', 'blocks.2.attn']" in out
    assert "layers   3: blocks.0.attn, blocks.1.attn, blocks.2.attn" in out


def test_no_finding_prints_an_empty_location(tmp_path, capsys):
    path = b.write(tmp_path / "m.safetensors", b.fp8_layer("blocks.0.attn"), b.int8_layer("blocks.1.attn"))
    _code, out, _err = _run(capsys, "check", path)  # SGLang refuses the mix: a checkpoint-wide finding
    heads = [line for line in out.splitlines() if re.match(r"(ERROR|WARNING|INFO) ", line)]
    assert heads and all(len(line.split(" ", 2)) == 3 and line.split(" ", 2)[2].strip() for line in heads), heads
    assert any(line.endswith(" (checkpoint)") for line in heads), heads


@pytest.mark.needs_torch
@pytest.mark.parametrize("api", [True, False], ids=["api", "cli"])
def test_the_api_names_keywords_the_cli_names_options(tmp_path, capsys, api):
    src = b.write(tmp_path / "m.safetensors", b.fp8_layer("blocks.0.attn"))
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"someone's file")
    if api:
        with pytest.raises(ComfyQuantError) as exc:
            comfyquant.dequantize(src, str(out))
        assert str(exc.value) == f"{out}: exists; pass overwrite=True to replace it"
        with pytest.raises(ComfyQuantError, match="^jobs must be at least 1, got 0$"):
            comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "fp8", jobs=0)
        with pytest.raises(ComfyQuantError, match=r"^max_error must be a finite number >= 0, got nan$"):
            comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "fp8", max_error=float("nan"))
        with pytest.raises(ComfyQuantError, match=r"give format=\.\.\. or rules=\.\.\."):
            comfyquant.quantize(src, str(tmp_path / "q.safetensors"), preset="none")
    else:
        code, _out, err = _run(capsys, "dequantize", src, out)
        assert code == 2 and err == f"comfyquant: {out}: exists; pass --overwrite to replace it\n"
        code, _out, err = _run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "fp8", "--jobs", "0")
        assert code == 2 and err == "comfyquant: --jobs must be at least 1, got 0\n"
        code, _out, err = _run(capsys, "quantize", src, tmp_path / "q.safetensors", "--preset", "none")
        assert code == 2 and "give --format F or --rules FILE" in err


def _truncated(tmp_path) -> str:
    path = b.write(tmp_path / "t.safetensors", *(b.int8_layer(f"blocks.{i}.attn", n=64) for i in range(4)))
    os.truncate(path, os.path.getsize(path) * 2 // 3)
    return path


def test_inspect_says_a_damaged_file_is_damaged_and_exits_like_check(tmp_path, capsys):
    path = _truncated(tmp_path)
    check_code, _out, _err = _run(capsys, "check", path)
    code, out, _err = _run(capsys, "inspect", path)
    assert code == check_code == 1
    first = out.splitlines()[0]
    assert first.startswith("DAMAGED: ") and "[C002]" in first and "comfyquant check" in first
    assert "compression not measured: the file is damaged" in out and re.search(r"compression \d", out) is None
    code, out, _err = _run(capsys, "inspect", "--json", path)
    doc = json.loads(out)
    assert code == 1 and doc["compression_vs_bf16"] is None
    assert doc["damage"] and {d["code"] for d in doc["damage"]} == {"C002"}
    healthy = b.write(tmp_path / "h.safetensors", b.int8_layer("blocks.0.attn"))
    code, out, _err = _run(capsys, "inspect", "--json", healthy)
    assert code == 0 and json.loads(out)["damage"] == []


@pytest.mark.needs_torch
def test_one_count_of_problems_for_one_file(tmp_path, capsys):
    """check counts the problems; the refusing commands name the first and send the user to
    check, instead of a second count of their own (judged for another runtime)."""
    path = _truncated(tmp_path)
    _code, out, _err = _run(capsys, "check", path)
    counted = re.search(r"^(\d+) errors?, ", out, re.M)
    assert counted
    for args in (["dequantize", path, tmp_path / "d.safetensors"], ["convert", path, tmp_path / "c.safetensors", "--to", "fp8"]):
        code, _out, err = _run(capsys, *args)
        assert code == 2 and "[C002]" in err and "comfyquant check lists every problem" in err
        assert not re.search(r"\d+ more error", err), err


def test_inspect_shows_the_shape_of_a_layer_without_n_x_k(tmp_path, capsys):
    path = b.write(tmp_path / "m.safetensors", b.fp8_layer("blocks.0.attn"), {"norm.weight": b.zeros("BF16", (256,))})
    _code, out, _err = _run(capsys, "inspect", path)
    (row,) = [line for line in out.splitlines() if line.startswith("norm ")]
    assert row.split()[:3] == ["norm", "dense", "256"], row
    assert " ? " not in row


@pytest.mark.parametrize("name", ["x.gguf", "x.sft", "x.safetensors", "x"])
def test_a_default_output_is_named_for_the_model_not_the_container(tmp_path, name):
    from comfyquant.io.outputs import default_output

    assert default_output([str(tmp_path / name)], None, "comfy") == str(tmp_path / "x.comfy.safetensors")
    assert default_output([str(tmp_path / "flux.1-dev")], None, "comfy") == str(tmp_path / "flux.1-dev.comfy.safetensors")


def test_json_problems_speak_json_and_show_text_not_python_reprs(tmp_path):
    path = b.write(
        tmp_path / "m.safetensors",
        b.fp8_layer("blocks.0.a", marker=b"{not json"),
        b.fp8_layer("blocks.1.a", marker=b""),
        b.fp8_layer("blocks.2.a", marker=[1, 2]),
    )
    findings = {f.layer: f for f in comfyquant.check(path).findings if f.code in ("M001", "M002")}
    assert findings["blocks.0.a"].actual == "9 bytes: '{not json'"
    assert findings["blocks.1.a"].actual == "empty (0 bytes)"
    assert "holds a JSON array, expected an object" in findings["blocks.2.a"].message
    for f in findings.values():
        assert "b'" not in (f.actual or "") and " list" not in f.message
    # a header no runtime can read gets a report (C009), its words JSON's too
    unreadable = comfyquant.check(b.raw_file(tmp_path / "h.safetensors", "[1, 2]"))
    assert [f.code for f in unreadable.findings if f.code == "C009"] == ["C009"]
    assert "header is a JSON array, expected an object" in next(f.message for f in unreadable.findings if f.code == "C009")
    with pytest.raises(ComfyQuantError, match="header is a JSON array, expected an object"):
        comfyquant.fix(b.raw_file(tmp_path / "h.safetensors", "[1, 2]"), str(tmp_path / "f.safetensors"))
