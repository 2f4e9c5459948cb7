"""``check --deep`` on value defects whose outcome the runtimes were measured on: a finding is an
error exactly when the layer computes garbage, and real comfy-kitchen layers raise no value
error.  Every file is written by comfy-kitchen 0.2.40 (``kitchen_fixtures``), then changed in
one way with torch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import comfyquant  # noqa: E402
from kitchen_fixtures import VARIANTS, make_layer, make_weight, write_layers  # noqa: E402

PREFIX = "blocks.0.attn.qkv"


def _check(tmp_path: Path, layer, name: str = "layer", target: str = "comfyui,comfy-kitchen"):
    path = write_layers(tmp_path / f"{name}.safetensors", [layer])
    return comfyquant.check(path, target=target, deep=True)


def _with(layer, **tensors):
    return replace(layer, tensors=dict(layer.tensors, **tensors))


def _codes(report, prefix: str = "D") -> dict[str, str]:
    return {f.code: f.severity for f in report.findings if f.code.startswith(prefix)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_real_layers_raise_no_value_error(tmp_path, variant):
    """Zero false alarms: every layer comfy-kitchen writes passes --deep without a value error."""
    layer = make_layer(variant, PREFIX, 64, 256, seed=3)
    report = _check(tmp_path, layer)
    assert not [f for f in report.findings if f.code.startswith("D") and f.severity == "error"], report.findings
    said = {n: v.to_dict() for n, v in report.verdicts.items()}
    for name, verdict in report.verdicts.items():
        if name == "comfyui" and VARIANTS[variant].kwargs.get("bits") == 6:
            # a 6-bit layer: ComfyUI 0.33.0's pinned comfy-kitchen (0.2.31) reads 4-bit rows only
            # and fails its first forward (no value error); with comfy-kitchen 0.2.40 it loads
            assert verdict.first.rule == "comfyui.w4a8" and "0.2.31" in verdict.first.cause, said
            assert verdict.with_newer_kitchen.loads, said
        else:
            assert verdict.loads, said


@pytest.mark.parametrize("share, said", [(0.1, "close"), (1.0, "degraded"), (3.0, "garbage")])
def test_dropped_correction_is_measured(tmp_path, share, said):
    """ComfyUI drops a W4A8 correction: the layer is garbage only when the correction is most of
    the weight (the ComfyUI driver measured 0.10, 0.72, 0.95 relative error for these); comfy-kitchen
    decodes the codebook plus the correction exactly and loads it."""
    layer = make_layer("w4a8_codebook", PREFIX, 64, 256, seed=5)
    size = float(make_weight(64, 256, torch.bfloat16, 5).float().pow(2).mean().sqrt())
    correction = torch.randn(256 // 16, 64, generator=torch.Generator().manual_seed(1)) * share * size
    report = _check(tmp_path, _with(layer, weight_correction=correction.float()))
    found = [f for f in report.findings if f.code == "D010"]
    if said == "garbage":
        assert len(found) == 1 and found[0].actual.startswith(said) and found[0].severity == "error"
    else:  # ComfyUI's warning says the layer computes without its correction, no value finding
        assert not found
        warned = [f for f in report.findings if f.code == "comfyui.correction"]
        assert warned and warned[0].severity == "warning" and "off by the correction's share" in warned[0].message
    assert report.verdicts["comfyui"].loads is (said != "garbage")
    assert report.verdicts["comfy-kitchen"].loads
    assert not [f for f in report.findings if "decode is wrong" in (f.cause or "")]


def test_nan_in_one_w4a8_group_scale_degrades_and_every_one_is_garbage(tmp_path):
    """comfy-kitchen rounds code x s_rel onto the INT8 grid: a NaN group becomes one constant
    code (measured: the output stays finite and close); all of them is garbage."""
    layer = make_layer("w4a8_uniform", PREFIX, 64, 256, seed=3)
    s_rel = layer.tensors["weight_s_rel"].float()
    one = s_rel.clone()
    one[0, 0] = float("nan")
    report = _check(tmp_path, _with(layer, weight_s_rel=one.to(torch.float8_e4m3fn)), "one")
    assert _codes(report)["D001"] == "warning" and all(v.loads for v in report.verdicts.values())
    every = torch.full_like(s_rel, float("nan")).to(torch.float8_e4m3fn)
    report = _check(tmp_path, _with(layer, weight_s_rel=every), "all")
    assert _codes(report)["D001"] == "error" and not any(v.loads for v in report.verdicts.values())


def test_saturated_scales_are_garbage(tmp_path):
    """Every FP8 scale at 448 (an overflowed scale clipped by the cast) decodes far too large."""
    layer = make_layer("nvfp4", PREFIX, 64, 256, seed=3)
    scale = layer.tensors["weight_scale"]
    report = _check(tmp_path, _with(layer, weight_scale=torch.full_like(scale.float(), 448.0).to(scale.dtype)))
    assert _codes(report)["D009"] == "error"
    assert not report.verdicts["comfyui"].loads and report.verdicts["comfyui"].first.exception is None


@pytest.mark.parametrize("variant", ["nvfp4", "mxfp8"])
def test_blocked_scales_judged_past_their_padding(tmp_path, variant):
    """Blocked 128x4 scales are zero in their padding by design: every real block zero is
    garbage, one zero block is not (and E8M0's byte 0 is 2**-127, not a valid scale)."""
    layer = make_layer(variant, PREFIX, 64, 256, seed=3)
    scale = layer.tensors["weight_scale"]
    raw = scale.view(torch.uint8).clone()
    report = _check(tmp_path, _with(layer, weight_scale=torch.zeros_like(raw).view(scale.dtype)), "zero")
    assert _codes(report)["D002"] == "error" and not report.verdicts["comfyui"].loads
    raw.reshape(-1)[0] = 0
    report = _check(tmp_path, _with(layer, weight_scale=raw.view(scale.dtype)), "one")
    assert all(v.loads for v in report.verdicts.values())


def test_missing_codebook_shows_in_the_group_scales(tmp_path):
    """Without its codebook the layer decodes uniform levels with s_rel sized for levels near 1:
    most codes leave the INT8 grid (measured garbage in ComfyUI and comfy-kitchen)."""
    layer = make_layer("w4a8_codebook", PREFIX, 64, 256, seed=3)
    tensors = {s: t for s, t in layer.tensors.items() if s != "weight_codebook"}
    report = _check(tmp_path, replace(layer, tensors=tensors))
    assert _codes(report)["D011"] == "error"
    assert not any(v.loads for v in report.verdicts.values())


def test_fp8_bytes_labelled_u8_are_garbage_and_a_u8_cast_is_not(tmp_path):
    """ComfyUI casts a U8 weight to FP8 by value: FP8 bytes labelled U8 become garbage (measured
    2.6 relative); a weight cast to U8 by value only degrades (measured 0.78)."""
    layer = make_layer("fp8", PREFIX, 64, 256, seed=3)
    weight = layer.tensors["weight"]
    report = _check(tmp_path, _with(layer, weight=weight.view(torch.uint8)), "view", target="comfyui")
    assert _codes(report)["D008"] == "error" and not report.verdicts["comfyui"].loads
    cast = weight.float().clamp(0, 255).to(torch.uint8)
    report = _check(tmp_path, _with(layer, weight=cast), "cast", target="comfyui")
    assert "D008" not in _codes(report) and report.verdicts["comfyui"].loads


def test_header_map_dropping_the_rotation_is_garbage(tmp_path):
    """ComfyUI takes the header map's marker: one without ConvRot over a tensor marker saying
    the INT8 weights are rotated computes without the rotation (measured 1.28 relative)."""
    layer = make_layer("int8_convrot", PREFIX, 64, 256, seed=3)
    conflict = json.dumps({"format_version": "1.0", "layers": {PREFIX: {"format": "int8_tensorwise"}}})
    path = write_layers(tmp_path / "conflict.safetensors", [layer], metadata={"_quantization_metadata": conflict})
    report = comfyquant.check(path, target="comfyui")
    verdict = report.verdicts["comfyui"]
    assert not verdict.loads and verdict.first.exception is None
    assert "without the rotation" in verdict.first.message


def test_every_undecidable_class_is_documented():
    """The defects the file cannot show are named in docs/runtimes.md with what is missing."""
    from runtimes.cases import UNDECIDABLE

    page = (Path(__file__).resolve().parent.parent / "docs" / "runtimes.md").read_text()
    for name in UNDECIDABLE:
        assert f"`{name}`" in page, name


def test_awq_scales_decode_with_their_zero_points(tmp_path):
    """AWQ adds its zero points after scaling: every scale zero leaves them (measured degraded,
    0.58), every scale negative is garbage (measured 1.17) in comfy-kitchen."""
    from safetensors.torch import save_file

    from kitchen_fixtures import marker_tensor
    from runtimes.cases import _awq

    base = _awq(64, 256, seed=900)
    scale = base.tensors["weight_scale"]
    verdicts = {}
    for name, value in (("negative", -scale), ("zero", torch.zeros_like(scale))):
        tensors = {f"{PREFIX}.{s}": t for s, t in dict(base.tensors, weight_scale=value).items()}
        tensors[f"{PREFIX}.comfy_quant"] = marker_tensor(base.marker)
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        verdicts[name] = comfyquant.check(str(path), target="comfy-kitchen", deep=True).verdicts["comfy-kitchen"]
    assert not verdicts["negative"].loads and verdicts["negative"].first.exception is None
    assert verdicts["zero"].loads
