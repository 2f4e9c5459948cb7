"""The ``bfl`` dialect on files the real writers make.

BFL-layout files are written with diffusers 0.42.1's own BFL quantizer helpers
(``diffusers/quantizers/bfl/utils.py``: ``quantize_nvfp4``, ``quantize_fp8r``) and saved with
``safetensors.torch.save_file``; their reference dequantization is the same module's
``dequantize_nvfp4`` / ``dequantize_fp8r``.  Comfy NVFP4 files are comfy-kitchen 0.2.40's
(``kitchen_fixtures``), dequantized by comfy-kitchen's ``dequantize_nvfp4``.  Translations are
applied the way ``migrate`` writes them (``dialect_helpers.write_claim``).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from comfy_kitchen import float_utils
from comfy_kitchen.backends.eager.quantization import dequantize_nvfp4 as ck_dequantize_nvfp4
from diffusers.quantizers.bfl.utils import dequantize_fp8r, dequantize_nvfp4, quantize_fp8r, quantize_nvfp4
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant import codecs
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects import registry
from comfyquant.dialects.base import EXACT, LOSSY, PERMUTATION, REFUSED
from comfyquant.dialects.report import claim_violations
from comfyquant.numerics import nvfp4_layouts as lay
from dialect_helpers import detect_claim, export_claim, raw_tensors, stored, write_claim
from kitchen_fixtures import make_layer, make_weight, moe_bank_layer, write_layers


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def bfl_nvfp4(n: int, k: int, seed: int, bias: bool = True, input_scale: bool = True) -> dict[str, torch.Tensor]:
    """One layer as diffusers' BFL quantizer stores it (an input_scale as a calibrated writer adds)."""
    w = make_weight(n, k, torch.float32, seed)
    q, s, s2 = quantize_nvfp4(w)
    out = {"weight": q, "weight_scale": s, "weight_scale_2": s2}
    if input_scale:
        out["input_scale"] = torch.tensor(0.0123, dtype=torch.float32)
    if bias:
        out["bias"] = (make_weight(1, n, torch.float32, seed + 7)[0]).to(torch.bfloat16)
    return out


def write(path, layers: dict[str, dict[str, torch.Tensor]], metadata: dict | None = None) -> str:
    save_file({f"{p}.{s}": t.contiguous() for p, ts in layers.items() for s, t in ts.items()}, str(path), metadata=metadata)
    return str(path)


def bfl_reference(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return dequantize_nvfp4(t["weight"], t["weight_scale"], t["weight_scale_2"])


def kitchen_dense(t: dict[str, torch.Tensor], n: int) -> torch.Tensor:
    out = ck_dequantize_nvfp4(t["weight"], t["weight_scale_2"], t["weight_scale"], torch.float32)
    return out[:n]


SHAPES = {
    "blocks.0.qkv": (256, 512),  # N % 128 == 0, K/16 % 4 == 0: both scale layouts have one shape
    "blocks.0.proj": (48, 80),  # K/16 = 5: only the linear layout fits
    "blocks.0.odd": (13, 64),  # N % 16 != 0: Comfy pads the rows (the bias keeps N)
}


@pytest.fixture
def bfl_file(tmp_path):
    layers = {p: bfl_nvfp4(n, k, seed=i) for i, (p, (n, k)) in enumerate(SHAPES.items())}
    return write(tmp_path / "bfl.safetensors", layers), layers


def test_detect_claims_every_nvfp4_layer_and_names_the_coinciding_one(bfl_file):
    path, _ = bfl_file
    claim, found = detect_claim(path, "bfl")
    assert found.name == "bfl"
    assert set(claim.layers) == set(SHAPES)
    assert {t.verdict for t in claim.layers.values()} == {PERMUTATION}
    assert all(t.format == "nvfp4" and t.marker == {"format": "nvfp4"} for t in claim.layers.values())
    # only the layer whose shapes coincide is unsettled, and the evidence is the other layer
    assert claim.layers["blocks.0.qkv"].unsettled and not claim.layers["blocks.0.proj"].unsettled
    u = claim.unsettled[0]
    assert "blocks.0.qkv" in u and ("'blocks.0.proj'" in u or "'blocks.0.odd'" in u) and "only the linear" in u
    assert "rows 13 -> 16" in claim.layers["blocks.0.odd"].why


def test_nvfp4_to_comfy_dequantizes_bit_exactly_like_both_writers(bfl_file, tmp_path):
    path, layers = bfl_file
    claim, _ = detect_claim(path, "bfl")
    out = tmp_path / "comfy.safetensors"
    write_claim(path, claim, str(out))
    for prefix, (n, k) in SHAPES.items():
        reference = bfl_reference(layers[prefix])
        comfy = stored(str(out), prefix)
        assert comfy["weight"].shape == (-(-n // 16) * 16, k // 2)
        assert same_bits(kitchen_dense(comfy, n), reference)
        # comfyquant's own Comfy codec and the dialect decoder agree with both
        assert same_bits(codecs.get("nvfp4").decode(comfy, {"format": "nvfp4"}, dtype=torch.float32), reference)
        assert same_bits(claim.layers[prefix].decoder(layers[prefix]), reference)


def test_migrated_file_is_a_clean_comfy_file(bfl_file, tmp_path):
    path, _ = bfl_file
    claim, _ = detect_claim(path, "bfl")
    out = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, out)
    with open_checkpoint([out]) as ckpt:
        assert registry.detect(ckpt).name == "comfy"
        from comfyquant.checker.run import check_checkpoint

        report = check_checkpoint(ckpt, target="comfyui")
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    assert report.verdicts["comfyui"].loads


def test_round_trip_bfl_comfy_bfl_is_byte_identical(bfl_file, tmp_path):
    path, _ = bfl_file
    claim, _ = detect_claim(path, "bfl")
    comfy = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, comfy)
    back = str(tmp_path / "back.safetensors")
    exported = export_claim(comfy, "bfl")
    assert set(exported.layers) == set(SHAPES)
    assert {t.verdict for t in exported.layers.values()} == {PERMUTATION}
    write_claim(comfy, exported, back)
    assert raw_tensors(back) == raw_tensors(path)
    assert "_quantization_metadata" not in (open_checkpoint([back]).metadata())


def test_round_trip_kitchen_comfy_bfl_comfy_is_byte_identical(tmp_path):
    """A comfy-kitchen file (padded rows, blocked scales) -> BFL -> Comfy gives its bytes back, and
    diffusers' dequantization of the BFL form equals comfy-kitchen's of the Comfy form."""
    kl = [
        make_layer("nvfp4", prefix=f"l{i}", n=n, k=k, seed=i, marker="comfyui")
        for i, (n, k) in enumerate([(13, 64), (256, 512), (48, 80)])
    ]
    kl = [x.with_tensor("input_scale", torch.tensor(0.02)) for x in kl]
    src = write_layers(tmp_path / "kitchen.safetensors", kl, marker_mode="header")
    exported = export_claim(src, "bfl")
    bfl = str(tmp_path / "bfl.safetensors")
    write_claim(src, exported, bfl)
    for x in kl:
        b = stored(bfl, x.prefix)
        assert b["weight"].shape == (x.n, x.k // 2) and b["weight_scale"].shape == (x.n, x.k // 16)
        assert same_bits(bfl_reference(b), kitchen_dense(x.tensors, x.n))
    claim, found = detect_claim(bfl, "bfl")
    assert found.name == "bfl" and set(claim.layers) == {x.prefix for x in kl}
    again = str(tmp_path / "again.safetensors")
    write_claim(bfl, claim, again)
    assert raw_tensors(again) == raw_tensors(src)


def test_export_refuses_what_bfl_cannot_hold(tmp_path):
    no_input = make_layer("nvfp4", prefix="a", n=32, k=64, marker="comfyui")
    pre = (
        make_layer("nvfp4", prefix="b", n=32, k=64, marker="comfyui")
        .with_tensor("pre_quant_scale", torch.ones(64, dtype=torch.bfloat16))
        .with_tensor("input_scale", torch.tensor(0.1))
    )
    src = write_layers(tmp_path / "k.safetensors", [no_input, pre], marker_mode="header")
    exported = export_claim(src, "bfl")
    assert exported.layers["a"].verdict == REFUSED and "input_scale" in exported.layers["a"].why
    assert exported.layers["b"].verdict == REFUSED and "pre_quant_scale" in exported.layers["b"].why


def test_export_refuses_to_drop_padding_that_is_not_zero(tmp_path):
    x = make_layer("nvfp4", prefix="a", n=13, k=64, marker="comfyui").with_tensor("input_scale", torch.tensor(0.1))
    w = x.tensors["weight"].clone()
    w[15, 3] = 0x21  # a code in a padding row
    src = write_layers(tmp_path / "k.safetensors", [x.with_tensor("weight", w)], marker_mode="header")
    exported = export_claim(src, "bfl")
    tr = exported.layers["a"]
    assert tr.verdict == REFUSED and "rows 13..15" in tr.why and not tr.moves
    # the transform is the last guard: it never drops a value either
    with pytest.raises(lay.PaddingNotZero, match="rows 1..1"):
        lay.resize(bytes([0, 0, 1, 0]), (2, 2), (1, 2))


def test_coinciding_shapes_follow_the_file(tmp_path):
    """N % 128 == 0 and (K/16) % 4 == 0: the header cannot tell linear from blocked scales."""
    alone = write(tmp_path / "alone.safetensors", {"x": bfl_nvfp4(128, 64, seed=1)})
    claim, _ = detect_claim(alone, "bfl")
    assert claim.layers["x"].verdict == PERMUTATION
    assert "no comfy_quant marker" in claim.unsettled[0] and "N % 128 == 0" in claim.unsettled[0]
    # without the input_scale the BFL layout requires it is a Comfy layer that lost its marker
    bare = write(tmp_path / "bare.safetensors", {"x": bfl_nvfp4(128, 64, seed=1, input_scale=False)})
    claim, found = detect_claim(bare, "bfl")
    assert claim is None and found.layers == {}
    assert [f.code for f in comfyquant.check(bare).findings if f.layer == "x"][:1] == ["M023"]
    # the same layer next to a marked Comfy layer: a Comfy file that lost a marker, not BFL
    marked = make_layer("nvfp4", prefix="m", n=32, k=64, marker="comfyui")
    layers = {"x": bfl_nvfp4(128, 64, seed=1), "m": marked.tensors}
    mixed = write(
        tmp_path / "mixed.safetensors",
        layers,
        metadata={"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {"m": {"format": "nvfp4"}}})},
    )
    claim, found = detect_claim(mixed, "bfl")
    assert claim is None and found.layers == {} and found.name == "comfy"
    # next to an unmarked layer whose scales are blocked: a Comfy layout without markers
    comfy = make_layer("nvfp4", prefix="c", n=32, k=64, marker="comfyui").tensors
    other = write(tmp_path / "other.safetensors", {"x": bfl_nvfp4(128, 64, seed=1), "c": comfy})
    claim, found = detect_claim(other, "bfl")
    assert claim is None and found.layers == {}


def test_unpadded_rows_without_bias_are_refused(tmp_path):
    path = write(tmp_path / "nobias.safetensors", {"x": bfl_nvfp4(13, 64, seed=2, bias=False)})
    claim, _ = detect_claim(path, "bfl")
    assert claim.layers["x"].verdict == REFUSED and "nothing in the Comfy file would keep N" in claim.layers["x"].why


def test_fp8r_decodes_like_diffusers_and_is_lossy(tmp_path):
    w = make_weight(24, 64, torch.float32, seed=3)
    q, s = quantize_fp8r(w)
    one_q, one_s = quantize_fp8r(make_weight(1, 64, torch.float32, seed=4))
    path = write(
        tmp_path / "fp8r.safetensors",
        {
            "r": {"weight": q, "weight_scale": s, "input_scale": torch.tensor(1.0)},
            "one": {"weight": one_q, "weight_scale": one_s},
        },
    )
    claim, _ = detect_claim(path, "bfl")
    tr = claim.layers["r"]
    assert tr.verdict == LOSSY and tr.format is None and tr.lossy.format == "float8_e4m3fn"
    assert "per-row" in tr.why and tr.drops == ["r.input_scale"]
    assert same_bits(tr.decoder({"weight": q, "weight_scale": s}), dequantize_fp8r(q, s))
    # a single row's scale is a per-tensor scale: exact
    assert claim.layers["one"].verdict == EXACT and claim.layers["one"].format == "float8_e4m3fn"


def test_comfy_fp8_exports_as_fp8r_exactly(tmp_path):
    x = make_layer("fp8_static", prefix="f", n=24, k=64, marker="comfyui")
    src = write_layers(tmp_path / "fp8.safetensors", [x], marker_mode="header")
    exported = export_claim(src, "bfl")
    assert exported.layers["f"].verdict == EXACT
    out = str(tmp_path / "fp8r.safetensors")
    write_claim(src, exported, out)
    b = stored(out, "f")
    assert b["weight_scale"].shape == (24,) and "input_scale" not in b
    comfy = x.tensors["weight"].float() * x.tensors["weight_scale"]
    assert same_bits(dequantize_fp8r(b["weight"], b["weight_scale"]), comfy)
    claim, _ = detect_claim(out, "bfl")
    assert claim.layers["f"].variant == "fp8r"


def test_runtime_says_what_each_runtime_does(bfl_file, tmp_path):
    path, _ = bfl_file
    with open_checkpoint([path]) as ckpt:
        claim = registry.detect(ckpt).claim("bfl")
        comfy = claim_violations(ckpt, claim, "comfyui")
        assert len(comfy) == 3 and all(v.blocking and "size mismatch" in v.message for v in comfy)
        assert claim_violations(ckpt, claim, "sglang") == []  # diffusers names: SGLang reads linear, low first
    packed = write(tmp_path / "flux.safetensors", {"double_blocks.0.img_attn.qkv": bfl_nvfp4(128, 64, seed=5)})
    with open_checkpoint([packed]) as ckpt:
        claim = registry.detect(ckpt).claim("bfl")
        sglang = claim_violations(ckpt, claim, "sglang")
        assert len(sglang) == 1 and sglang[0].fails and "swaps nibbles" in sglang[0].message


def test_byte_permutations_match_comfy_kitchen():
    gen = torch.Generator().manual_seed(9)
    data = torch.randint(0, 256, (40, 12), dtype=torch.uint8, generator=gen)
    assert lay.swap_nibbles(data.numpy().tobytes()) == float_utils.swap_nibbles(data).numpy().tobytes()
    for rows, cols in ((40, 12), (128, 8), (200, 5)):
        scales = torch.randint(1, 255, (rows, cols), dtype=torch.uint8, generator=gen)
        blocked = lay.block(scales.numpy().tobytes(), rows, cols)
        assert blocked == float_utils.to_blocked(scales).contiguous().numpy().tobytes()
        assert lay.unblock(blocked, rows, cols) == scales.numpy().tobytes()
    assert lay.scale_layouts(256, 32, (256, 32)) == {"linear": 32, "blocked": 32}
    assert lay.scale_layouts(48, 5, (48, 5)) == {"linear": 5}
    assert lay.scale_layouts(48, 5, (128, 8)) == {"blocked": 8}


# -- end to end, through the commands ----------------------------------------------------------

needs_migrate = pytest.mark.skipif(not hasattr(comfyquant, "migrate"), reason="migrate is wired on main")


def dense(path: str, tmp_path, name: str) -> dict[str, torch.Tensor]:
    out = str(tmp_path / f"{name}.dense.safetensors")
    comfyquant.dequantize(path, out, dtype="f32", progress=False)
    return load_file(out)


def test_cli_inspect_and_check_name_the_bfl_layout(bfl_file, capsys):
    path, _ = bfl_file
    assert main(["inspect", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dialect"] == "bfl"
    rows = {r["layer"]: r for r in data["layers"]}
    assert {rows[p]["dialect"] for p in SHAPES} == {"bfl (nvfp4)"}
    assert {rows[p]["verdict"] for p in SHAPES} == {PERMUTATION}
    report = comfyquant.check(path, target="comfyui")
    assert not report.verdicts["comfyui"].loads and "size mismatch" in report.verdicts["comfyui"].first.message
    assert [f for f in report.findings if f.code == "F001" and "(bfl)" in f.message]


@needs_migrate
def test_cli_migrate_bfl_to_comfy_and_back(bfl_file, tmp_path):
    path, layers = bfl_file
    out = str(tmp_path / "comfy.safetensors")
    assert main(["migrate", path, "-o", out, "--target", "comfyui"]) == 0
    assert main(["check", "--target", "comfyui", out]) == 0
    before, after = dense(path, tmp_path, "before"), dense(out, tmp_path, "after")
    for prefix in SHAPES:
        assert same_bits(before[f"{prefix}.weight"], bfl_reference(layers[prefix]))
        assert same_bits(after[f"{prefix}.weight"], before[f"{prefix}.weight"])
    back = str(tmp_path / "back.safetensors")
    assert main(["migrate", out, "--to", "bfl", "-o", back]) == 0
    assert raw_tensors(back) == raw_tensors(path)


@needs_migrate
def test_cli_fp8r_is_migrated_only_with_allow_lossy(tmp_path):
    q, s = quantize_fp8r(make_weight(24, 64, torch.float32, seed=11))
    path = write(tmp_path / "fp8r.safetensors", {"r": {"weight": q, "weight_scale": s}})
    assert same_bits(dense(path, tmp_path, "src")["r.weight"], dequantize_fp8r(q, s))
    out = str(tmp_path / "comfy.safetensors")
    assert main(["migrate", path, "-o", out, "--target", "comfyui"]) == 2  # refused: nothing written
    assert not os.path.exists(out)
    assert main(["migrate", path, "-o", out, "--allow-lossy", "--target", "comfyui"]) == 0
    assert main(["check", "--target", "comfyui", out]) == 0
    with open_checkpoint([out]) as ckpt:
        assert ckpt.layers["r"].format_name == "float8_e4m3fn" and ckpt.layers["r"].marker is not None


def test_detection_reads_the_header_only(bfl_file, tmp_path):
    """check and inspect detect dialects on every file: no tensor byte is read for it."""
    path, _ = bfl_file
    mo = str(tmp_path / "mo.safetensors")
    save_file(
        {
            "x.weight": torch.zeros(48, 40, dtype=torch.uint8),
            "x.weight_scale": torch.zeros(48, 5, dtype=torch.float8_e4m3fn),
            "x.weight_scale_2": torch.tensor(1.0),
        },
        mo,
        metadata={"quantization_config": json.dumps({"quant_method": "modelopt", "quant_algo": "NVFP4"})},
    )
    for p, name in ((path, "bfl"), (mo, "modelopt")):
        with open_checkpoint([p]) as ckpt:
            before = {s.name: s.bytes_read for s in ckpt.sources}
            assert registry.detect(ckpt).name == name
            assert {s.name: s.bytes_read for s in ckpt.sources} == before


def test_expert_banks_are_not_exported(tmp_path):
    """A MoE bank's 2-D view is not its stored layout: neither export rewrites it."""
    bank, _ = moe_bank_layer("fp8", "experts", experts=2, n=16, k=64)
    nv, _ = moe_bank_layer("nvfp4", "experts_nv", experts=2, n=16, k=64)
    plain = make_layer("fp8", prefix="plain", n=16, k=64, marker="comfyui")
    src = write_layers(tmp_path / "banks.safetensors", [bank, nv, plain], marker_mode="header")
    with open_checkpoint([src]) as ckpt:
        assert ckpt.layers["experts"].bank is not None and ckpt.layers["experts_nv"].bank is not None
    assert set(export_claim(src, "bfl").layers) == {"plain"}
    assert set(export_claim(src, "modelopt").layers) == {"plain"}
