"""fix --allow-lossy on real comfy-kitchen layers: 6-bit -> 4-bit for SGLang, asymmetric ->
symmetric for ComfyUI, F32 group scales -> FP8; the error is measured and reported, and the
lossless repairs really leave the decoded weights unchanged."""

from __future__ import annotations

from pathlib import Path

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
        ("w6a8", "sglang", "6-bit rows -> 4-bit (SGLang reads"),
        ("w6a8", "comfyui", "6-bit rows -> 4-bit (ComfyUI 0.33.0 with comfy-kitchen 0.2.31 reads"),
        ("w6a8", "comfyui==0.31.0", "6-bit rows -> 4-bit (ComfyUI 0.31.0 with comfy-kitchen 0.2.28 reads"),
        ("w6a8", "comfy-kitchen==0.2.31", "6-bit rows -> 4-bit (comfy-kitchen 0.2.31 reads"),
        ("w6a8", "sglang,comfyui", "(SGLang and ComfyUI 0.33.0 with comfy-kitchen 0.2.31 read W4A8"),
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


@pytest.mark.parametrize("target", ["comfy-kitchen", "comfy-kitchen>=0.2.36"])
def test_six_bit_rows_stay_for_the_releases_that_read_them(tmp_path, target):
    """comfy-kitchen from 0.2.36 reads 6-bit W4A8 rows: nothing is re-quantized for it."""
    layer = make_layer("w6a8", n=64, k=256)
    src = write_layers(tmp_path / "in.safetensors", [layer])
    assert check(src, target=target).ok
    result = fix(src, out=str(tmp_path / "out.safetensors"), target=target, allow_lossy=True)
    assert not result.plan.requant and not result.plan.refused


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


# -- exact repairs first, then the re-encode, in one run ----------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _s_channel_as_column(layer):
    """``weight_s_channel`` stored ``(N, 1)`` instead of ``(N,)`` (an exact reshape)."""
    return layer.with_tensor("weight_s_channel", layer.tensors["weight_s_channel"].reshape(-1, 1))


def _weight_as_u8(layer):
    """The packed weight labelled ``U8`` (the same bytes: an exact relabel)."""
    return layer.with_tensor("weight", layer.tensors["weight"].view(torch.uint8))


@pytest.mark.parametrize(
    "variant, damages, target",
    [
        ("w4a8_asym", (seed_defect,), "comfyui"),  # transposed BF16 correction, asymmetric -> symmetric
        ("w4a8_asym", (seed_defect, _s_channel_as_column), "comfyui"),
        ("w6a8", (_s_channel_as_column, _weight_as_u8), "sglang"),  # 6-bit -> 4-bit after a reshape and a relabel
    ],
)
def test_lossy_reencode_starts_from_the_exact_repairs(tmp_path, variant, damages, target):
    """A layer that needs both an exact repair and a re-encode gets both in one run: the
    re-encode decodes the exactly repaired tensors, so its measured error is that of the
    re-encode against the undamaged layer, and the output passes the check."""
    good = make_layer(variant, n=64, k=256)
    clean = write_layers(tmp_path / "clean.safetensors", [good])
    broken = good
    for damage in damages:
        broken = damage(broken)
    src = write_layers(tmp_path / "broken.safetensors", [broken])
    dest = str(tmp_path / "out.safetensors")
    dry = fix(src, target=target, allow_lossy=True, dry_run=True)
    assert not dry.plan.refused and dry.ok
    result = fix(src, out=dest, target=target, allow_lossy=True)
    assert result.ok, [f.message for f in result.remaining]
    kinds = [c.kind for c in result.plan.changes if c.layer == good.prefix]
    assert kinds[-1] == "lossy" and kinds.count("lossless") == len(damages)
    assert check(dest, target=target).ok
    op = result.plan.requant[good.prefix]
    before, after = decoded(clean, good.prefix), decoded(dest, good.prefix)
    rel = (torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before)).item()
    assert abs(rel - op.error) < 1e-6 and op.error == dry.plan.requant[good.prefix].error


def test_fix_allow_lossy_repairs_the_seed_example_as_the_check_advises(tmp_path, capsys):
    """The warning on the bundled seed file advises ``fix --target comfyui --allow-lossy``:
    that command repairs it (the transposed correction exactly, then the symmetric re-encode),
    says which repair is which, and the output passes check for ComfyUI."""
    from comfyquant.cli import main

    seed = str(EXAMPLES / "seed_broken_w4a8.safetensors")
    advice = [f.fix for f in check(seed, target="comfyui").findings if f.fix and "--allow-lossy" in f.fix]
    assert advice == ["for ComfyUI, re-quantize symmetric (comfyquant fix --target comfyui --allow-lossy)"]
    out = str(tmp_path / "seed.fixed.safetensors")
    assert main(["fix", seed, "--target", "comfyui", "--allow-lossy", "-o", out]) == 0
    text = capsys.readouterr().out
    assert "plan: 3 changes, 2 lossless, 1 lossy" in text
    assert "transpose, upcast BF16 -> F32 (exact); the re-encode starts from the repaired tensor" in text
    assert "BF16 (64, 16) -> F32 (16, 64)  [lossless]" in text
    assert "relative L2 error" in text and "[lossy]" in text
    assert "after repair: check passes for comfyui" in text
    report = check(out, target="comfyui")
    assert report.ok and not [f for f in report.findings if f.severity == "warning"]


def test_loader_path_repairs_the_seed_example_in_memory_with_allow_lossy():
    """The ComfyUI Loader node's ``allow_lossy`` runs the same plan in memory
    (``repair.memory.repaired``): the seed file loads, every tensor reads, the notes list the
    exact repair and the re-encode."""
    from comfyquant.comfyui.loading import describe, state_dict
    from comfyquant.repair.memory import RepairRefused, repaired

    seed = str(EXAMPLES / "seed_broken_w4a8.safetensors")
    with pytest.raises(RepairRefused, match="allow-lossy|allow_lossy"):
        with repaired(seed, target="comfyui"):
            pass
    with repaired(seed, target="comfyui", allow_lossy=True) as fixed:
        assert fixed.after.verdicts["comfyui"].loads and fixed.after.ok
        sd = state_dict(fixed.view)
        notes = describe(fixed)
    assert sd["blocks.0.mlp.fc1.weight_s_rel"].dtype == torch.float8_e4m3fn
    assert "blocks.0.mlp.fc1.weight_correction" not in sd
    assert "transpose, upcast BF16 -> F32 (exact)" in notes and "re-quantize: asymmetric -> symmetric" in notes


def test_a_layer_the_reencode_cannot_decode_is_listed_not_raised(tmp_path):
    """A correction no exact repair restores (half its groups cut off): the re-encode could not
    decode the layer, so the plan lists it under "cannot repair" with the reason, like every
    refusal, instead of stopping on the codec's error."""
    good = make_layer("w4a8_asym", n=64, k=256)
    cut = good.with_tensor("weight_correction", good.tensors["weight_correction"][:8].contiguous())
    src = write_layers(tmp_path / "cut.safetensors", [cut])
    result = fix(src, out=str(tmp_path / "out.safetensors"), target="comfyui", allow_lossy=True)
    (layer, why), *_ = result.plan.refused
    assert layer == good.prefix and "weight_correction is BF16 (8, 64), expected F32 (16, 64)" in why
    assert "re-export the layer" in why and not result.plan.requant and not result.outputs
