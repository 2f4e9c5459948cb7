"""nunchaku SVDQuant single files: detection, translations, decoders and runtime verdicts.

The files are built the way nunchaku's published writers build them, re-stated in torch here:

* SVDQ W4A4 int4 linears: deepcompressor ``backend/nunchaku/utils.py::convert_to_nunchaku_w4x4y16_linear_weight``
  with ``NunchakuWeightPacker(bits=4, warp_n=128)`` (the same class nunchaku ships as
  ``nunchaku/lora/flux/packer.py``): ``pack_weight`` (MMA tiles), ``pack_scale`` (wscales, and the
  bias and smoothing factors with ``group_size=-1``), ``pack_lowrank_weight`` (proj_down, proj_up).
* AWQ W4A16 linears: deepcompressor ``backend/tinychat/utils.py::pack_w4`` (``qweight`` viewed as
  I32 ``[N/4, K/2]``) with ``wzeros = -zero * scale``; nunchaku's GEMV computes ``u * s + z``
  (``src/kernels/awq/gemv_awq.cu``).
* Header metadata as nunchaku's Flux checkpoints carry it: ``model_class``, ``config``,
  ``comfy_config``, ``quantization_config``, ``format``.

The expected Comfy tensors are the *inputs* of those packers in Comfy's natural layout
(comfy-kitchen ``svdquant_w4a4`` / ``awq_w4a16``), so each translation is checked bit for bit
against numbers the test chose, not against the code under test.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects.base import PERMUTATION, REFUSED
from comfyquant.dialects.registry import DIALECTS, detect
from comfyquant.dialects.report import claim_violations
from comfyquant.numerics import nunchaku_tiles

GEN = torch.Generator().manual_seed(7)

# -- the published packers, re-stated -------------------------------------------------------------------------


def ref_pack_weight(w: torch.Tensor) -> torch.Tensor:
    """``NunchakuWeightPacker.pack_weight`` for 4 bits, warp_n 128: codes int32 [N, K] -> I8 [N, K/2]."""
    n, k = w.shape
    v = w.reshape(n // 128, 8, 2, 8, 1, k // 64, 1, 2, 4, 8)
    v = v.permute(0, 5, 6, 1, 3, 8, 2, 7, 4, 9).contiguous() & 0xF
    v = (v << torch.arange(0, 32, 4, dtype=torch.int32)).sum(dim=-1, dtype=torch.int32)
    return v.view(torch.int8).view(n, -1)


def ref_pack_scale(s: torch.Tensor) -> torch.Tensor:
    """``pack_scale`` (group_size 64, warp_n 128): scales [N, G] -> the stored [G, N] tensor;
    for a vector [N] (bias, smooth_factor: ``group_size=-1``) the stored [N]."""
    vec = s.dim() == 1
    n = s.shape[0]
    v = s.reshape(n, 1, -1, 1).reshape(n // 128, 1, 8, 2, 4, 2, -1).permute(0, 6, 1, 2, 4, 3, 5).contiguous()
    return v.view(-1) if vec else v.view(-1, n)


def ref_pack_lowrank(w: torch.Tensor, down: bool) -> torch.Tensor:
    """``pack_lowrank_weight``: down [R, K] -> stored [K, R]; up [N, R] -> stored [N, R]."""
    if down:
        r, c = w.shape
        v = w.view(r // 16, 16, c // 16, 16).permute(2, 0, 1, 3)
        cp, rp = c // 16, r // 16
    else:
        c, r = w.shape
        v = w.view(c // 16, 16, r // 16, 16).permute(0, 2, 1, 3)
        cp, rp = c // 16, r // 16
    v = v.reshape(cp, rp, 2, 8, 1, 2, 4, 2).permute(0, 1, 3, 6, 2, 5, 4, 7).contiguous()
    return v.view(c, r)


def ref_pack_w4(u: torch.Tensor) -> torch.Tensor:
    """TinyChat ``pack_w4`` then ``.view(torch.int32)``: unsigned codes [N, K] -> I32 [N/4, K/2]."""
    oc, ic = u.shape
    v = u.to(torch.int32).view(-1, 4, 8)
    v = v[:, 0] | (v[:, 1] << 4) | (v[:, 2] << 8) | (v[:, 3] << 12)
    v = v.view(oc // 4, 4, ic // 64, 16).permute(0, 2, 1, 3).reshape(oc // 4, ic)
    return v.to(torch.int16).view(torch.int32)


def natural_int4(codes: torch.Tensor) -> torch.Tensor:
    """Comfy's row-major int4 pairs (comfy-kitchen ``_pack_int4_row_major``: even column low)."""
    c = codes.to(torch.int32) & 0xF
    return (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)


# -- layers ---------------------------------------------------------------------------------------------------


def svdq_layer(n: int, k: int, rank: int = 32, bias: bool = True, dtype=torch.bfloat16) -> tuple[dict, dict]:
    """(stored tensors by suffix, natural Comfy tensors by Comfy suffix) of one int4 SVDQ linear."""
    codes = torch.randint(-8, 8, (n, k), generator=GEN, dtype=torch.int32)
    scales = (torch.rand(n, k // 64, generator=GEN) * 0.02 + 0.001).to(dtype)
    smooth = (torch.rand(k, generator=GEN) + 0.5).to(dtype)
    down = (torch.randn(rank, k, generator=GEN) * 0.05).to(dtype)  # the packer's [R, K] down weight
    up = (torch.randn(n, rank, generator=GEN) * 0.05).to(dtype)
    stored = {
        "qweight": ref_pack_weight(codes),
        "wscales": ref_pack_scale(scales),
        "smooth_factor": ref_pack_scale(smooth),
        "smooth_factor_orig": smooth.clone(),
        "proj_down": ref_pack_lowrank(down, True),
        "proj_up": ref_pack_lowrank(up, False),
    }
    natural = {
        "weight": natural_int4(codes),
        "weight_scale": scales.t().contiguous(),
        "weight_smooth_factor": smooth,
        "weight_proj_down": down.t().contiguous(),
        "weight_proj_up": up,
    }
    if bias:
        b = torch.randn(n, generator=GEN).to(dtype)
        stored["bias"] = ref_pack_scale(b)
        natural["bias"] = b
    return stored, natural


def awq_layer(n: int, k: int, dtype=torch.bfloat16) -> tuple[dict, dict]:
    u = torch.randint(0, 16, (n, k), generator=GEN, dtype=torch.int32)
    s = (torch.rand(k // 64, n, generator=GEN) * 0.01 + 0.001).to(dtype)
    zero_point = torch.randint(0, 16, (k // 64, n), generator=GEN).to(dtype)
    z = -(zero_point.float() * s.float()).to(dtype)  # TinyChat: wzeros = -zero * scale
    stored = {"qweight": ref_pack_w4(u), "wscales": s, "wzeros": z, "bias": torch.randn(n, generator=GEN).to(dtype)}
    return stored, {"codes": u, "s": s, "z": z}


FLUX_META = {
    "model_class": "NunchakuFluxTransformer2dModel",
    "format": "pt",
    "config": json.dumps({"_class_name": "FluxTransformer2DModel", "num_layers": 1, "num_single_layers": 1}),
    "comfy_config": json.dumps({"model_class": "Flux", "model_config": {"image_model": "flux", "depth": 1}}),
    "quantization_config": json.dumps(
        {
            "method": "svdquant",
            "rank": 32,
            "weight": {"dtype": "int4", "scale_dtype": None, "group_size": 64},
            "activation": {"dtype": "int4", "scale_dtype": None, "group_size": 64},
        }
    ),
}
H = 256  # hidden size (Flux: 3072); every dimension a multiple of 128 as nunchaku requires


def flux_file(tmp_path, meta: dict | None = FLUX_META, name="svdq-int4-flux.safetensors"):
    """A one-block Flux transformer as nunchaku stores it; returns (path, {prefix: natural tensors})."""
    tensors, natural = {}, {}
    svdq = {
        "transformer_blocks.0.attn.to_qkv": (3 * H, H),
        "transformer_blocks.0.attn.add_qkv_proj": (3 * H, H),
        "transformer_blocks.0.attn.to_out.0": (H, H),
        "transformer_blocks.0.ff.net.0.proj": (4 * H, H),
        "transformer_blocks.0.ff.net.2": (H, 4 * H),
        "single_transformer_blocks.0.mlp_fc2": (H, 4 * H),
    }
    for prefix, (n, k) in svdq.items():
        st, nat = svdq_layer(n, k)
        tensors.update({f"{prefix}.{s}": v for s, v in st.items()})
        natural[prefix] = nat
    st, nat = awq_layer(6 * H, H)
    tensors.update({f"transformer_blocks.0.norm1.linear.{s}": v for s, v in st.items()})
    natural["transformer_blocks.0.norm1.linear"] = nat
    tensors["x_embedder.weight"] = torch.randn(H, 64, generator=GEN).to(torch.bfloat16)
    tensors["x_embedder.bias"] = torch.randn(H, generator=GEN).to(torch.bfloat16)
    tensors["transformer_blocks.0.attn.norm_q.weight"] = torch.ones(64, dtype=torch.bfloat16)
    path = tmp_path / name
    save_file(tensors, str(path), metadata=meta)
    return path, natural


def _stored(ckpt, names: list[str]) -> dict:
    return ckpt.read_many([ckpt.tensors[n] for n in names])


def _apply(ckpt, tr) -> dict:
    """Every move of a translation applied to the file's bytes: Comfy suffix -> bytes."""
    data = _stored(ckpt, [m.source for m in tr.moves])
    return {m.suffix: (m.transform(data[m.source]) if m.transform else data[m.source]) for m in tr.moves}


def _as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


# -- tests ----------------------------------------------------------------------------------------------------


def test_registered():
    assert "nunchaku" in DIALECTS


def test_detects_flux_layers_variants_and_metadata(tmp_path):
    path, natural = flux_file(tmp_path)
    with open_checkpoint(str(path)) as ckpt:
        found = detect(ckpt)
        claim = found.claim("nunchaku")
        assert claim is not None and found.name == "nunchaku"
        assert set(claim.layers) == set(natural)
        variants = {p: tr.variant for p, tr in claim.layers.items()}
        assert variants["transformer_blocks.0.norm1.linear"] == "awq w4a16"
        assert {v for p, v in variants.items() if p != "transformer_blocks.0.norm1.linear"} == {"svdq int4"}
        notes = " | ".join(claim.notes)
        for said in (
            "NunchakuFluxTransformer2dModel",
            "comfy_config model_class Flux",
            "precision int4",
            "rank 32",
            "group size 64",
            "FluxTransformer2DModel",
        ):
            assert said in notes, said
        assert "2 fused q/k/v layer(s)" in notes
        assert "modulation" in notes
        assert "TypeError" not in notes  # comfy_config is there
        # the bias sits in ckpt.layers (a Comfy suffix) yet belongs to the nunchaku layer
        assert "bias" in claim.layers["transformer_blocks.0.attn.to_qkv"].inputs
        assert "x_embedder" not in claim.layers


def test_svdq_int4_translation_is_the_exact_permutation(tmp_path):
    path, natural = flux_file(tmp_path)
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        for prefix, nat in natural.items():
            tr = claim.layers[prefix]
            if tr.variant != "svdq int4":
                continue
            assert tr.verdict == PERMUTATION and tr.format == "svdquant_w4a4", tr.why
            out = _apply(ckpt, tr)
            assert set(out) == set(nat)
            for suffix, want in nat.items():
                assert out[suffix] == _as_bytes(want), (prefix, suffix)
            moved = {m.suffix: m for m in tr.moves}
            for suffix, want in nat.items():
                assert moved[suffix].shape == tuple(want.shape), (prefix, suffix)
            assert [d.rsplit(".", 1)[-1] for d in tr.drops] == ["smooth_factor_orig"]


def test_act_unsigned_for_fc2_layers_only(tmp_path):
    path, _ = flux_file(tmp_path)
    with open_checkpoint(str(path)) as ckpt:
        layers = detect(ckpt).claim("nunchaku").layers
        assert layers["transformer_blocks.0.ff.net.2"].marker == {"format": "svdquant_w4a4", "act_unsigned": True}
        assert layers["single_transformer_blocks.0.mlp_fc2"].marker.get("act_unsigned") is True
        assert layers["transformer_blocks.0.ff.net.0.proj"].marker == {"format": "svdquant_w4a4"}
        assert layers["transformer_blocks.0.attn.to_qkv"].marker == {"format": "svdquant_w4a4"}
        assert "fused q/k/v" in layers["transformer_blocks.0.attn.to_qkv"].why


def test_awq_translation_before_settle_and_exact_decoder(tmp_path):
    path, natural = flux_file(tmp_path)
    prefix = "transformer_blocks.0.norm1.linear"
    nat = natural[prefix]
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        tr = claim.layers[prefix]
        assert tr.verdict == PERMUTATION and tr.format == "awq_w4a16" and tr.marker == {"format": "awq_w4a16", "group_size": 64}
        assert tr.unsettled and claim.unsettled  # the zero points are only provisionally exact
        out = _apply(ckpt, tr)  # before settle: the zeros move reads the scales itself
        raw = _stored(ckpt, [e.name for e in tr.inputs.values()])
    assert out["weight"] == _as_bytes(natural_int4(nat["codes"]))
    assert out["weight_scale"] == _as_bytes(nat["s"].float())
    assert out["weight_zeros"] == _as_bytes(nat["z"].float() + 8 * nat["s"].float())
    stored = {s: _tensor(raw[e.name], e) for s, e in tr.inputs.items()}
    got = tr.decoder(stored)
    # nunchaku's GEMV: w = u * s + z (unsigned codes), here in F32
    u, s, z = nat["codes"].float(), nat["s"].float(), nat["z"].float()
    want = (u.view(6 * H, H // 64, 64) * s.t().unsqueeze(-1) + z.t().unsqueeze(-1)).view(6 * H, H)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def _tensor(data: bytes, entry) -> torch.Tensor:
    dt = {
        "BF16": torch.bfloat16,
        "F16": torch.float16,
        "F32": torch.float32,
        "I32": torch.int32,
        "I8": torch.int8,
        "F8_E4M3": torch.float8_e4m3fn,
    }[entry.dtype]
    return torch.frombuffer(bytearray(data), dtype=dt).view(tuple(entry.shape))


def test_awq_settle_makes_exact_comfy_layer(tmp_path):
    from comfyquant.formats.awq.codec import AWQCodec

    path, natural = flux_file(tmp_path)
    prefix = "transformer_blocks.0.norm1.linear"
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        tr = claim.layers[prefix]
        raw = _stored(ckpt, [e.name for e in tr.inputs.values()])
        dense = tr.decoder({s: _tensor(raw[e.name], e) for s, e in tr.inputs.items()})
        findings = DIALECTS["nunchaku"].settle(ckpt, claim)
        assert findings == [] and not tr.unsettled and not claim.unsettled
        assert tr.verdict == PERMUTATION and tr.format == "awq_w4a16"
        out = _apply(ckpt, tr)
    n, k = 6 * H, H
    codes = natural[prefix]["codes"]
    assert out["weight"] == _as_bytes(natural_int4(codes))
    t = {
        "weight": torch.frombuffer(bytearray(out["weight"]), dtype=torch.int8).view(n, k // 2),
        "weight_scale": torch.frombuffer(bytearray(out["weight_scale"]), dtype=torch.float32).view(k // 64, n),
        "weight_zeros": torch.frombuffer(bytearray(out["weight_zeros"]), dtype=torch.float32).view(k // 64, n),
    }
    comfy = AWQCodec()._weight(t, {"K": k, "group_size": 64}, 0, n, torch.float32)
    assert torch.equal(comfy, dense)  # Comfy's (u - 8) * s + (z + 8 s) == nunchaku's u * s + z, bit for bit


def test_awq_inexact_zero_points_stay_refused(tmp_path):
    st, _ = awq_layer(256, 256)
    st["wzeros"][0, 0] = torch.tensor(2.0**-40, dtype=torch.bfloat16)  # z + 8 s needs > 24 bits
    st["wscales"][0, 0] = torch.tensor(1.0, dtype=torch.bfloat16)
    path = tmp_path / "awq.safetensors"
    save_file({f"blocks.0.img_mod.1.{s}": v for s, v in st.items()}, str(path), metadata=FLUX_META)
    from comfyquant.dialects.nunchaku import InexactZeros

    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        tr = claim.layers["blocks.0.img_mod.1"]
        assert tr.verdict == PERMUTATION  # from the header alone
        with pytest.raises(InexactZeros, match="blocks.0.img_mod.1"):
            _apply(ckpt, tr)
        findings = DIALECTS["nunchaku"].settle(ckpt, claim)
        assert tr.verdict == REFUSED and "not exact" in tr.why and not tr.moves and tr.format is None
        assert [f.code for f in findings] == ["F004"]


def test_without_metadata_names_the_loader_error(tmp_path):
    path, natural = flux_file(tmp_path, meta=None, name="no-meta.safetensors")
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        assert set(claim.layers) == set(natural)
        notes = " | ".join(claim.notes)
        assert "no nunchaku metadata" in notes
        assert "the JSON object must be str, bytes or bytearray, not NoneType" in notes
        viol = claim_violations(ckpt, claim, "comfyui")
        assert all("missing or unreadable" in v.fix for v in viol)
    report = comfyquant.check(str(path))
    f001 = [f for f in report.findings if f.code == "F001"]
    assert f001 and "not NoneType" in f001[0].message and report.to_dict()["dialect"] == "nunchaku"


def test_metadata_without_comfy_config(tmp_path):
    meta = {k: v for k, v in FLUX_META.items() if k != "comfy_config"}
    path, _ = flux_file(tmp_path, meta=meta, name="no-comfy-config.safetensors")
    with open_checkpoint(str(path)) as ckpt:
        notes = " | ".join(detect(ckpt).claim("nunchaku").notes)
        assert "no comfy_config" in notes and "NoneType" in notes and "NunchakuFluxTransformer2dModel" in notes


def test_nvfp4_is_refused_without_decoder(tmp_path):
    n, k = 256, 256
    t = {
        "qweight": torch.randint(-128, 127, (n, k // 2), generator=GEN, dtype=torch.int8),
        "wscales": torch.ones(k // 16, n).to(torch.float8_e4m3fn),
        "smooth_factor": torch.ones(k, dtype=torch.bfloat16),
        "smooth_factor_orig": torch.ones(k, dtype=torch.bfloat16),
        "proj_down": torch.zeros(k, 32, dtype=torch.bfloat16),
        "proj_up": torch.zeros(n, 32, dtype=torch.bfloat16),
        "wcscales": torch.ones(n, dtype=torch.bfloat16),
        "wtscale": torch.ones(1, dtype=torch.bfloat16),
    }
    meta = dict(
        FLUX_META,
        quantization_config=json.dumps({"method": "svdquant", "rank": 32, "weight": {"dtype": "fp4_e2m1_all", "group_size": 16}}),
    )
    path = tmp_path / "svdq-fp4.safetensors"
    save_file({f"transformer_blocks.0.attn.to_out.0.{s}": v for s, v in t.items()}, str(path), metadata=meta)
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        tr = claim.layers["transformer_blocks.0.attn.to_out.0"]
        assert tr.variant == "svdq nvfp4" and tr.verdict == REFUSED and tr.decoder is None
        assert "no Comfy format" in tr.why and "precision nvfp4" in " ".join(claim.notes)


@pytest.mark.parametrize("n,k,why", [(200, 256, "N=200 is not a multiple of 128"), (256, 192, "K=192 is not a multiple of 128")])
def test_unpackable_geometry_is_refused(tmp_path, n, k, why):
    t = {
        "qweight": torch.zeros(n, k // 2, dtype=torch.int8),
        "wscales": torch.ones(k // 64, n, dtype=torch.bfloat16),
        "smooth_factor": torch.ones(k, dtype=torch.bfloat16),
        "proj_down": torch.zeros(k, 32, dtype=torch.bfloat16),
        "proj_up": torch.zeros(n, 32, dtype=torch.bfloat16),
    }
    path = tmp_path / "odd.safetensors"
    save_file({f"blocks.0.attn.to_out.{s}": v for s, v in t.items()}, str(path))
    with open_checkpoint(str(path)) as ckpt:
        tr = detect(ckpt).claim("nunchaku").layers["blocks.0.attn.to_out"]
        assert tr.verdict == REFUSED and why in tr.why


def test_runtime_verdicts(tmp_path):
    path, natural = flux_file(tmp_path)
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        comfy = claim_violations(ckpt, claim, "comfyui")
        assert {v.layer for v in comfy} == set(natural)
        assert all(v.fails and not v.blocking and "uninitialized" in v.message for v in comfy)
        kitchen = claim_violations(ckpt, claim, "comfy-kitchen")
        assert {v.layer for v in kitchen} == set(natural) and all(v.fails for v in kitchen)
        sglang = claim_violations(ckpt, claim, "sglang")
        by_layer = {v.layer: v for v in sglang if v.layer}
        # norm1.linear contains SGLang's skip pattern "norm": left unquantized, weight missing
        assert by_layer["transformer_blocks.0.norm1.linear"].fails
        assert "skips" in by_layer["transformer_blocks.0.norm1.linear"].message
        assert "transformer_blocks.0.attn.to_qkv" not in by_layer
        assert any(v.layer is None and not v.fails for v in sglang)


def test_sglang_awq_pattern_mismatch(tmp_path):
    st, _ = svdq_layer(256, 256)
    path = tmp_path / "qwen.safetensors"
    save_file({f"transformer_blocks.0.img_mod.1.{s}": v for s, v in st.items()}, str(path))
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        viol = [v for v in claim_violations(ckpt, claim, "sglang") if v.layer]
        assert len(viol) == 1 and viol[0].blocking and "AWQ W4A16" in viol[0].message


def test_tile_unpack_round_trips_random_shapes():
    """Each unpack inverts the re-stated packer for several tile counts (not only the Flux shapes)."""
    for n, k, r in ((128, 128, 16), (384, 256, 48), (256, 512, 128)):
        codes = torch.randint(-8, 8, (n, k), generator=GEN, dtype=torch.int32)
        got = nunchaku_tiles.svdq_weight(_as_bytes(ref_pack_weight(codes)), n, k)
        assert got == _as_bytes(natural_int4(codes))
        s = torch.randn(n, k // 64, generator=GEN).to(torch.float16)
        assert nunchaku_tiles.svdq_scales(_as_bytes(ref_pack_scale(s)), k // 64, n) == _as_bytes(s.t().contiguous())
        v = torch.randn(n, generator=GEN).to(torch.bfloat16)
        assert nunchaku_tiles.svdq_vector(_as_bytes(ref_pack_scale(v)), n) == _as_bytes(v)
        down = torch.randn(r, k, generator=GEN).to(torch.bfloat16)
        assert nunchaku_tiles.lowrank_down(_as_bytes(ref_pack_lowrank(down, True)), k, r) == _as_bytes(down.t().contiguous())
        up = torch.randn(n, r, generator=GEN).to(torch.bfloat16)
        assert nunchaku_tiles.lowrank_up(_as_bytes(ref_pack_lowrank(up, False)), n, r) == _as_bytes(up)
        u = torch.randint(0, 16, (n, k), generator=GEN, dtype=torch.int32)
        assert nunchaku_tiles.awq_codes(_as_bytes(ref_pack_w4(u)), n, k).tolist() == u.tolist()


def _good_svdq(n=256, k=256, r=32) -> dict:
    return {
        "qweight": torch.zeros(n, k // 2, dtype=torch.int8),
        "wscales": torch.ones(k // 64, n, dtype=torch.bfloat16),
        "smooth_factor": torch.ones(k, dtype=torch.bfloat16),
        "proj_down": torch.zeros(k, r, dtype=torch.bfloat16),
        "proj_up": torch.zeros(n, r, dtype=torch.bfloat16),
    }


BROKEN = {
    "qweight 1-D": dict(_good_svdq(), qweight=torch.zeros(256, dtype=torch.int8)),
    "qweight empty": dict(_good_svdq(), qweight=torch.zeros(0, 128, dtype=torch.int8)),
    "wscales F32": dict(_good_svdq(), wscales=torch.ones(4, 256)),
    "wscales transposed": dict(_good_svdq(), wscales=torch.ones(256, 4, dtype=torch.bfloat16)),
    "rank mismatch": dict(_good_svdq(), proj_up=torch.zeros(256, 16, dtype=torch.bfloat16)),
    "rank 0": _good_svdq(r=0),
    "rank 24": _good_svdq(r=24),
    "no smooth_factor": {k: v for k, v in _good_svdq().items() if k != "smooth_factor"},
    "bias wrong length": dict(_good_svdq(), bias=torch.zeros(255, dtype=torch.bfloat16)),
    "extra weight": dict(_good_svdq(), weight=torch.zeros(256, 256, dtype=torch.bfloat16)),
    "awq zeros shape": {
        "qweight": torch.zeros(64, 128, dtype=torch.int32),
        "wscales": torch.ones(4, 256, dtype=torch.bfloat16),
        "wzeros": torch.ones(2, 256, dtype=torch.bfloat16),
    },
    "awq wscales 1-D": {
        "qweight": torch.zeros(64, 128, dtype=torch.int32),
        "wscales": torch.ones(256, dtype=torch.bfloat16),
        "wzeros": torch.ones(256, dtype=torch.bfloat16),
    },
    "awq K not 64": {
        "qweight": torch.zeros(64, 16, dtype=torch.int32),
        "wscales": torch.ones(1, 256, dtype=torch.bfloat16),
        "wzeros": torch.ones(1, 256, dtype=torch.bfloat16),
    },
    "qweight alone": {"qweight": torch.zeros(256, 128, dtype=torch.int8)},
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_layers_are_refused_with_a_reason(tmp_path, case):
    path = tmp_path / "broken.safetensors"
    save_file({f"blocks.0.attn.to_out.{s}": v for s, v in BROKEN[case].items()}, str(path), metadata={"comfy_config": "{"})
    with open_checkpoint(str(path)) as ckpt:
        claim = detect(ckpt).claim("nunchaku")
        tr = claim.layers["blocks.0.attn.to_out"]
        assert tr.verdict == REFUSED and tr.why and not tr.moves, (case, tr.why)
        assert DIALECTS["nunchaku"].settle(ckpt, claim) is not None
        for target in ("comfyui", "sglang", "comfy-kitchen"):
            assert claim_violations(ckpt, claim, target)
        assert any("comfy_config" in n and "not JSON" in n for n in claim.notes)


def test_svdq_int4_decoder_equals_comfy_codec_on_the_writers_numbers(tmp_path):
    """dequantize of the nunchaku layer == Comfy's svdquant_w4a4 codec on the tensors the writer packed."""
    from comfyquant.formats.registry import FORMATS

    path, natural = flux_file(tmp_path)
    for prefix in ("transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.ff.net.2"):
        with open_checkpoint(str(path)) as ckpt:
            tr = detect(ckpt).claim("nunchaku").layers[prefix]
            raw = _stored(ckpt, [e.name for e in tr.inputs.values()])
        got = tr.decoder({s: _tensor(raw[e.name], e) for s, e in tr.inputs.items()})
        nat = {s: v for s, v in natural[prefix].items() if s != "bias"}
        want = FORMATS["svdquant_w4a4"].codec().decode(nat, tr.marker, dtype=torch.float32)
        assert got.dtype == torch.float32 and torch.equal(got, want)
        # the low-rank branch is in it: zeroing proj_up changes the weight
        nat["weight_proj_up"] = torch.zeros_like(nat["weight_proj_up"])
        assert not torch.equal(FORMATS["svdquant_w4a4"].codec().decode(nat, tr.marker, dtype=torch.float32), got)


# -- end to end through the commands ---------------


def written(path) -> tuple[dict, dict, dict]:
    """(markers by layer, tensors, metadata) of a written file."""
    from safetensors import safe_open

    markers, tensors = {}, {}
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            if k.endswith(".comfy_quant"):
                markers[k[: -len(".comfy_quant")]] = json.loads(bytes(f.get_tensor(k).tolist()).decode())
            else:
                tensors[k] = f.get_tensor(k)
    return markers, tensors, meta


def test_inspect_json_names_nunchaku_and_each_layers_verdict(tmp_path, capsys):
    path, _ = flux_file(tmp_path)
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dialect"] == "nunchaku"
    rows = {r["layer"]: r for r in doc["layers"]}
    qkv = rows["transformer_blocks.0.attn.to_qkv"]
    assert qkv["dialect"] == "nunchaku (svdq int4)" and qkv["verdict"] == PERMUTATION
    assert rows["transformer_blocks.0.norm1.linear"]["dialect"] == "nunchaku (awq w4a16)"
    assert rows["transformer_blocks.0.norm1.linear"]["verdict"] == PERMUTATION
    assert rows["x_embedder"]["dialect"] == "dense"


def test_check_verdicts_and_deep(tmp_path, capsys):
    path, _ = flux_file(tmp_path)
    report = comfyquant.check(str(path), target="comfyui")
    assert report.to_dict()["dialect"] == "nunchaku"
    verdict = report.verdicts["comfyui"]
    assert not verdict.loads and "no nunchaku loader" in verdict.first.message
    f001 = [f for f in report.findings if f.code == "F001"]
    assert f001 and "NunchakuFluxTransformer2dModel" in f001[0].message
    assert not any(f.code == "F002" for f in report.findings)
    assert any(f.code == "F003" and "wzeros + 8 * wscales" in f.message for f in report.findings)
    kitchen = comfyquant.check(str(path), target="comfy-kitchen")
    assert not kitchen.verdicts["comfy-kitchen"].loads
    deep = comfyquant.check(str(path), deep=True)
    assert not any(f.code == "F004" for f in deep.findings)  # every AWQ zero point shifts exactly
    assert main(["check", str(path), "--target", "comfyui"]) == 1
    assert "nunchaku" in capsys.readouterr().out


def test_migrate_writes_the_writers_numbers_in_comfy_layouts(tmp_path):
    src, natural = flux_file(tmp_path)
    out = tmp_path / "comfy.safetensors"
    result = comfyquant.migrate(str(src), str(out), target="comfy-kitchen")
    assert result.ok, result.to_dict()
    markers, tensors, meta = written(out)
    assert markers["transformer_blocks.0.attn.to_qkv"] == {"format": "svdquant_w4a4"}
    assert markers["transformer_blocks.0.ff.net.2"] == {"format": "svdquant_w4a4", "act_unsigned": True}
    assert markers["transformer_blocks.0.norm1.linear"] == {"format": "awq_w4a16", "group_size": 64}
    for prefix, nat in natural.items():
        if "codes" in nat:  # AWQ
            assert _as_bytes(tensors[f"{prefix}.weight"]) == _as_bytes(natural_int4(nat["codes"]))
            assert tensors[f"{prefix}.weight_scale"].dtype == torch.float32
            assert torch.equal(tensors[f"{prefix}.weight_scale"], nat["s"].float())
            continue
        for suffix, want in nat.items():
            assert _as_bytes(tensors[f"{prefix}.{suffix}"]) == _as_bytes(want), (prefix, suffix)
        assert f"{prefix}.smooth_factor_orig" not in tensors and f"{prefix}.qweight" not in tensors
    assert not {"quantization_config", "comfy_config", "model_class"} & set(meta)
    assert _as_bytes(tensors["x_embedder.weight"]) == _as_bytes(load_file(str(src))["x_embedder.weight"])

    # dequantized before and after migrate: the same bits
    before, after = tmp_path / "before.safetensors", tmp_path / "after.safetensors"
    comfyquant.dequantize(str(src), str(before), dtype="f32")
    comfyquant.dequantize(str(out), str(after), dtype="f32")
    a, b = load_file(str(before)), load_file(str(after))
    assert a.keys() == b.keys()
    assert all(_as_bytes(a[k]) == _as_bytes(b[k]) for k in a)
    nat = natural["transformer_blocks.0.norm1.linear"]
    u, s, z = nat["codes"].float(), nat["s"].float(), nat["z"].float()
    want = (u.view(6 * H, H // 64, 64) * s.t().unsqueeze(-1) + z.t().unsqueeze(-1)).view(6 * H, H)
    assert _as_bytes(a["transformer_blocks.0.norm1.linear.weight"]) == _as_bytes(want)


def test_migrate_refuses_nvfp4_and_inexact_awq_with_the_reason(tmp_path):
    from comfyquant.repair.migrate import MigrateError

    n, k = 256, 256
    t = {
        "qweight": torch.zeros(n, k // 2, dtype=torch.int8),
        "wscales": torch.ones(k // 16, n).to(torch.float8_e4m3fn),
        "smooth_factor": torch.ones(k, dtype=torch.bfloat16),
        "proj_down": torch.zeros(k, 32, dtype=torch.bfloat16),
        "proj_up": torch.zeros(n, 32, dtype=torch.bfloat16),
        "wcscales": torch.ones(n, dtype=torch.bfloat16),
        "wtscale": torch.ones(1, dtype=torch.bfloat16),
    }
    src, out = tmp_path / "fp4.safetensors", tmp_path / "out.safetensors"
    save_file({f"transformer_blocks.0.attn.to_out.0.{s}": v for s, v in t.items()}, str(src))
    with pytest.raises(MigrateError, match="no Comfy format holds it"):
        comfyquant.migrate(str(src), str(out), target="comfy-kitchen")
    assert not out.exists()
    st, _ = awq_layer(256, 256)
    st["wzeros"][0, 0] = torch.tensor(2.0**-40, dtype=torch.bfloat16)
    st["wscales"][0, 0] = torch.tensor(1.0, dtype=torch.bfloat16)
    src = tmp_path / "awq.safetensors"
    save_file({f"blocks.0.img_mod.1.{s}": v for s, v in st.items()}, str(src))
    with pytest.raises(MigrateError, match="not exact"):
        comfyquant.migrate(str(src), str(out), target="comfy-kitchen")
    assert not out.exists()
