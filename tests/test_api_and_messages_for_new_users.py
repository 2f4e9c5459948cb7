"""API and message rough edges a new user hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyquant.compat.sglang import inspect_comfy_quant_markers
from comfyquant.errors import InputError
from comfyquant.quantizer.params import validate
from conftest import HAS_TORCH

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
W4A8 = EXAMPLES / "w4a8_sglang.safetensors"


@pytest.mark.parametrize("given", [str(W4A8), W4A8])
def test_sglang_drop_in_takes_one_path(given):
    """One path (str or Path) is a list of one, not a sequence of one-character file names."""
    assert inspect_comfy_quant_markers(given) == inspect_comfy_quant_markers([str(W4A8)])


def test_int8_rotation_size_without_rotation_is_refused():
    with pytest.raises(InputError, match="convrot_groupsize=64 needs convrot=true"):
        validate("int8_tensorwise", {"convrot": False, "convrot_groupsize": 64})
    assert validate("int8_tensorwise", {"convrot": False}).marker() == {"format": "int8_tensorwise"}


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_int8_codec_refuses_a_size_it_would_ignore():
    import torch

    from comfyquant import codecs
    from comfyquant.formats.codec import CodecError

    w = torch.randn(16, 256, dtype=torch.bfloat16)
    with pytest.raises(CodecError, match="needs convrot=True"):
        codecs.get("int8_tensorwise").encode(w, convrot_groupsize=256)
    assert codecs.get("int8_tensorwise").encode(w, convrot=True, convrot_groupsize=64).marker["convrot_groupsize"] == 64


def _plan_lines(tmp_path, fmt: str) -> dict[str, str]:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "comfyquant",
            "quantize",
            str(EXAMPLES / "dense_tiny.safetensors"),
            str(tmp_path / "o.safetensors"),
            "-f",
            fmt,
            "--dry-run",
            "-v",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}


@pytest.mark.skipif(not HAS_TORCH, reason="quantize needs torch")
def test_plan_reasons_say_why_in_the_layers_terms(tmp_path):
    """A runtime's refusal in the plan carries the rule behind it (NVFP4 for SGLang: N a multiple
    of 128), and W4A8's K rule names the multiple K must be, not three sizes to combine."""
    nvfp4 = _plan_lines(tmp_path, "nvfp4")
    assert "N % 128 == 0 and K % 64 == 0" in nvfp4["proj_out"]
    w4a8 = _plan_lines(tmp_path, "w4a8")
    assert "K=48 must be a multiple of 256" in w4a8["img_in"]


def test_transposed_blocked_scales_name_both_shapes(tmp_path):
    """A transposed slot whose shape expression has calls (pad(N, 128)) is named item by item,
    not as 'reversed'."""
    import comfyquant
    from builders import nvfp4_layer, write

    path = write(tmp_path / "t.safetensors", nvfp4_layer("blocks.0.attn.qkv", n=128, k=256, scale_shape=(16, 128)))
    [f] = [f for f in comfyquant.check(path).findings if f.code.startswith("L00") and "weight_scale" in (f.tensor or "")]
    assert "stored transposed: (16, 128) instead of (128, 16)" in f.cause


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        ("w4a8", "add the marker: comfyquant fix --convrot-groupsize C, C being the ConvRot size the layer was rotated with"),
        ("fp8", "add the marker: comfyquant fix"),
    ],
)
def test_unmarked_layer_fix_reads_as_a_command(tmp_path, layer, expected):
    """M023's fix is a command line a user can type, and says what C is (it read 'add the marker
    (comfyquant fix) --convrot-groupsize C')."""
    import comfyquant
    from builders import fp8_layer, w4a8_layer, write

    build = {"w4a8": w4a8_layer, "fp8": fp8_layer}[layer]
    path = write(tmp_path / "u.safetensors", build("blocks.0.attn.qkv", marker=False))
    [f] = [f for f in comfyquant.check(path).findings if f.code == "M023"]
    assert f.fix.startswith(expected), f.fix
