"""MoE expert banks (ComfyUI only: 0.33.0 ``comfy/ops.py`` ``MoEExperts``): a marked layer whose tensors carry a leading
expert dimension ``[E, out, ...]``.

For W4A8 and for INT8 with 3-D scales, ComfyUI's loader flattens the bank to one 2-D layer of
``E*out`` rows; comfyquant reads such banks the same way (checked, inspected and dequantized
as that layer, the file keeping its shapes).  Banks of other formats have no flattening rule
in ComfyUI: they are reported as not validated.  SGLang has no expert-bank loader.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import comfyquant
from comfyquant import check, codecs, inspect
from comfyquant.cli import main
from comfyquant.repair.run import fix
from kitchen_fixtures import make_weight, markers_for, moe_bank_layer, quantize, seed_defect

E, OUT, K = 4, 32, 256
P = "blocks.0.moe.experts.gate_up"


def bank_of(variant: str, seed: int = 0) -> tuple[dict, dict, dict]:
    """(stored bank tensors, marker, the flattened 2-D layer comfy-kitchen quantized)."""
    layer, flat = moe_bank_layer(variant, P, E, OUT, K, seed=seed, marker="sglang")
    return dict(layer.tensors), dict(layer.marker), flat


def write_bank(path, stored: dict, marker: dict | None, extra: dict | None = None) -> str:
    tensors = {f"{P}.{s}": t for s, t in stored.items()}
    if marker is not None:
        tensors[f"{P}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    tensors["final.norm.weight"] = torch.ones(K, dtype=torch.bfloat16)
    tensors.update(extra or {})
    save_file(tensors, str(path))
    return str(path)


def codes(report) -> dict[str, str]:
    return {f.code: f.severity for f in report.findings}


@pytest.mark.parametrize("variant", ["w4a8_codebook", "w4a8_asym", "int8_convrot"])
def test_flattened_bank_checks_inspects_and_dequantizes(tmp_path, variant):
    stored, marker, flat = bank_of(variant)
    src = write_bank(tmp_path / "bank.safetensors", stored, marker)
    report = check(src, target="comfyui")
    assert report.ok and codes(report).get("L010") == "info", [f.message for f in report.findings]
    kitchen = check(src, target="comfy-kitchen")
    assert not [f for f in kitchen.findings if f.severity == "error"], [f.message for f in kitchen.findings]

    row = next(r for r in inspect(src).rows if r.name == P)
    assert (row.n, row.k) == (E * OUT, K) and f"E={E}" in row.params

    out = tmp_path / "dense.safetensors"
    comfyquant.dequantize(src, str(out))
    codec = codecs.get(marker["format"])
    want = codec.decode(flat, marker).reshape(E, OUT, K)
    with safe_open(str(out), framework="pt") as f:
        got = f.get_tensor(f"{P}.weight")
        assert torch.equal(f.get_tensor(f"{P}.bias"), stored["bias"])  # copied as stored: [E, out]
    assert got.shape == (E, OUT, K) and torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_sglang_refuses_expert_banks(tmp_path):
    """SGLang sees the stored shapes: its W4A8 and INT8 inspections refuse the 3-D tensors with
    their own messages first; an FP8 bank passes inspection and fails when the layer is built
    (B6, which every bank also gets)."""
    stored, marker, _ = bank_of("w4a8_codebook")
    src = write_bank(tmp_path / "bank.safetensors", stored, marker)
    verdict = check(src, target="sglang").verdicts["sglang"]
    assert not verdict.loads and verdict.first.rule == "sglang.W4"
    assert verdict.first.message == f"Comfy W4A8 layer '{P}' needs a 2D packed weight, got ({E}, {OUT}, {K // 2})"
    assert any(v.rule == "sglang.B6" for v in verdict.violations)
    stored, marker, _ = bank_of("int8_convrot")
    src = write_bank(tmp_path / "int8.safetensors", stored, marker)
    verdict = check(src, target="sglang").verdicts["sglang"]
    assert not verdict.loads and verdict.first.message == (
        f"Comfy INT8 layer '{P}' has incompatible weight/scale shapes: ({E}, {OUT}, {K}) and ({E}, {OUT}, 1)"
    )
    fp8 = codecs.get("float8_e4m3fn").encode(make_weight(E * OUT, K))
    banked = {"weight": fp8["weight"].reshape(E, OUT, K).contiguous(), "weight_scale": fp8["weight_scale"].reshape(1).repeat(E)}
    src = write_bank(tmp_path / "fp8.safetensors", banked, {"format": "float8_e4m3fn", "num_experts": E})
    verdict = check(src, target="sglang").verdicts["sglang"]
    assert not verdict.loads and verdict.first.rule == "sglang.B6" and "expert bank of 4 experts" in verdict.first.message


def test_a_defect_inside_a_flattened_bank_is_found(tmp_path):
    stored, marker, flat = bank_of("w4a8_asym")
    broken = seed_defect_bank(stored)
    src = write_bank(tmp_path / "bank.safetensors", broken, marker)
    report = check(src, target="comfy-kitchen")
    found = [f for f in report.findings if f.code == "L004" and f.tensor == f"{P}.weight_correction"]
    assert found and "transposed" in found[0].cause and found[0].expected == "F32 (16, 128)"


def seed_defect_bank(stored: dict) -> dict:
    """The seed defect on the bank's correction (stored [K/G, E*out] like a 2-D layer's)."""
    from kitchen_fixtures import KitchenLayer

    layer = seed_defect(KitchenLayer(P, dict(stored), None, None, None))
    return layer.tensors


@pytest.mark.parametrize("variant", ["fp8", "nvfp4", "mxfp8", "w4a4", "int8_scalar"])
def test_stacked_bank_is_checked_and_dequantized_expert_by_expert(tmp_path, variant):
    """Formats without a flattening rule: every quantized tensor has a leading expert
    dimension and per-tensor scales are [E].  The bank is checked as one expert's
    layer and dequantized expert by expert into [E, out, K]."""
    n = 128 if variant in ("nvfp4", "mxfp8") else OUT  # no padding: every expert is a whole layer
    layer, experts = moe_bank_layer(variant, P, E, n, K, seed=7)
    marker = layer.marker
    _check_and_dequantize_stacked(tmp_path, dict(layer.tensors), marker, experts, n)


def test_stacked_bank_with_one_shared_scale(tmp_path):
    """An FP8 bank whose experts share one scalar scale (ComfyUI's ``MoEExperts``: "[E] or scalar")."""
    codec = codecs.get("float8_e4m3fn")
    weights = [make_weight(OUT, K, seed=20 + e) for e in range(E)]
    scale = max(float(w.float().abs().amax()) for w in weights) / 448.0
    experts = [dict(codec.encode(w, scale=scale)) for w in weights]
    stored = {
        "weight": torch.stack([x["weight"] for x in experts]).contiguous(),
        "weight_scale": experts[0]["weight_scale"],
        "bias": torch.zeros(E, OUT, dtype=torch.bfloat16),
    }
    for x in experts:
        x["bias"] = stored["bias"][0]
    _check_and_dequantize_stacked(tmp_path, stored, {"format": "float8_e4m3fn", "num_experts": E}, experts, OUT)


def _check_and_dequantize_stacked(tmp_path, stored: dict, marker: dict, experts: list[dict], n: int) -> None:
    src = write_bank(tmp_path / "bank.safetensors", stored, marker)
    for target in ("comfyui", "comfy-kitchen"):
        report = check(src, target=target)
        assert report.ok and codes(report).get("L010") == "info", (target, [f.message for f in report.findings])
    assert check(src, deep=True, target="comfyui").ok
    row = next(r for r in inspect(src).rows if r.name == P)
    assert (row.n, row.k) == (E * n, K) and row.params.startswith(f"E={E} bank")
    out = tmp_path / "dense.safetensors"
    comfyquant.dequantize(src, str(out), dtype="bf16")
    codec = codecs.get(marker["format"])
    want = torch.stack([codec.decode(x, marker, dtype="bf16") for x in experts])
    with safe_open(str(out), framework="pt") as f:
        got = f.get_tensor(f"{P}.weight")
    assert got.shape == (E, n, K) and torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_deep_check_reads_every_expert(tmp_path):
    """--deep value checks read a bank's stored tensors: a zero scale of the last expert is found."""
    codec = codecs.get("float8_e4m3fn")
    experts = [codec.encode(make_weight(OUT, K, seed=e)) for e in range(E)]
    scales = torch.stack([x["weight_scale"] for x in experts])
    scales[-1] = 0.0
    stored = {"weight": torch.stack([x["weight"] for x in experts]).contiguous(), "weight_scale": scales}
    src = write_bank(tmp_path / "bank.safetensors", stored, {"format": "float8_e4m3fn", "num_experts": E})
    assert check(src, target="comfyui").ok
    report = check(src, target="comfyui", deep=True)
    assert any(f.code == "D002" for f in report.findings), [f.message for f in report.findings]


def test_bank_marker_must_declare_its_experts(tmp_path):
    """num_experts makes a 3-D weight a bank; it must be the weight's expert count.  Without
    the key the 3-D weight is a wrong shape (L008), as for any layer."""
    stored, marker, _ = bank_of("int8_convrot")
    for bad in (dict(marker, num_experts=2), dict(marker, num_experts="4")):
        src = write_bank(tmp_path / "bank.safetensors", stored, bad)
        report = check(src, target="comfyui")
        assert codes(report).get("L010") == "error" and not report.ok
    src = write_bank(tmp_path / "bank.safetensors", stored, {k: v for k, v in marker.items() if k != "num_experts"})
    report = check(src, target="comfy-kitchen")
    assert "L010" not in codes(report) and codes(report).get("L008") == "error"


def test_fix_leaves_a_bank_as_stored(tmp_path):
    """A repair elsewhere in the file copies the bank's tensors byte for byte, shapes kept."""
    stored, marker, _ = bank_of("w4a8_codebook")
    other = quantize("int8_convrot", make_weight(OUT, K, seed=3))
    extra = {
        "blocks.1.attn.qkv.weight": other["weight"],
        "blocks.1.attn.qkv.weight_scale": other["weight_scale"].reshape(-1),
        "blocks.1.attn.qkv.comfy_quant": torch.tensor(
            list(json.dumps(markers_for("int8_convrot")[1]).encode()), dtype=torch.uint8
        ),
    }
    src = write_bank(tmp_path / "in.safetensors", stored, marker, extra)
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest, target="comfyui")
    assert result.ok, [f.message for f in result.remaining]
    with safe_open(src, framework="pt") as a, safe_open(dest, framework="pt") as b:
        for s in stored:
            name = f"{P}.{s}"
            x, y = a.get_tensor(name), b.get_tensor(name)
            assert x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name
        assert b.get_tensor("blocks.1.attn.qkv.weight_scale").shape == (OUT, 1)


def test_fix_refuses_to_rewrite_a_broken_bank(tmp_path):
    """A repair a bank would need (here its s_rel relabelled from U8, which SGLang requires) is
    refused with the reason: nothing is written, the input is kept, the defect is still reported."""
    stored, marker, _ = bank_of("w4a8_codebook")
    stored["weight_s_rel"] = stored["weight_s_rel"].view(torch.uint8)
    src = write_bank(tmp_path / "in.safetensors", stored, marker)
    before = open(src, "rb").read()
    dest = tmp_path / "out.safetensors"
    result = fix(src, out=str(dest))
    assert not result.ok and not dest.exists() and open(src, "rb").read() == before
    assert any("expert bank" in why for _layer, why in result.plan.refused)
    assert any(f.code == "L002" for f in result.remaining)


def test_convert_copies_a_bank_as_stored(tmp_path):
    """convert re-encodes 2-D layers only: a bank is copied with its stored shapes and marker."""
    stored, marker, _ = bank_of("w4a8_codebook")
    src = write_bank(tmp_path / "in.safetensors", stored, marker)
    dest = tmp_path / "out.safetensors"
    assert main(["convert", src, str(dest), "-t", "int8", "--target", "comfyui"]) == 0
    with safe_open(src, framework="pt") as a, safe_open(str(dest), framework="pt") as b:
        for s in stored:
            x, y = a.get_tensor(f"{P}.{s}"), b.get_tensor(f"{P}.{s}")
            assert x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), s
        assert json.loads(bytes(b.get_tensor(f"{P}.comfy_quant").tolist()))["num_experts"] == E
    assert check(str(dest), target="comfyui").ok
