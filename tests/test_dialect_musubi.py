"""musubi-tuner ``fp8_scaled`` files (dialect ``musubi-fp8``).

The files are built the way the writer builds them: ``musubi_quantize`` restates
kohya-ss/musubi-tuner ``src/musubi_tuner/modules/fp8_optimization_utils.py::quantize_weight``
(main branch: modes tensor / channel / block, the scale saved in the original weight dtype by
``load_safetensors_with_fp8_optimization``; branch ``exp-nvfp4-support-for-torch-2-10``, commit
0c9905b: two-level block scales with ``scale_weight_tensor`` saved as F32), and
``musubi_dequantize`` restates the dequantize branch of ``fp8_linear_forward_patch``
(block factor first, then ``scale_weight_tensor``).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects import registry
from comfyquant.dialects.base import EXACT, LOSSY, REFUSED
from comfyquant.dialects.report import claim_violations
from comfyquant.errors import InputError

NAME = "musubi-fp8"
PREFIX = "blocks.0.attn.qkv"
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def musubi_quantize(w: torch.Tensor, mode: str, block_size: int = 64, fp8=torch.float8_e4m3fn, two_level: bool = False):
    """(q, scale_weight, scale_weight_tensor or None) as musubi's ``quantize_weight`` returns them
    (``two_level``: the exp branch, which also falls back to per-tensor instead of per-channel)."""
    m = FP8_MAX[fp8]
    n, k = w.shape
    x = w.to(torch.float32)
    tensor_scale = None
    if mode == "block" and k % block_size:
        mode = "tensor" if two_level else "channel"
    if mode == "block":
        x = x.contiguous().view(n, k // block_size, block_size)
    if mode in ("channel", "block"):
        scale = x.abs().amax(dim=1 if mode == "channel" else 2, keepdim=True) / m
        total = scale
        if mode == "block" and two_level:
            tensor_scale = torch.clamp(torch.max(scale), min=1e-8).to(torch.float32)
            scale = torch.clamp(scale / tensor_scale, min=1e-8)
            total = scale * tensor_scale
    else:
        scale = torch.max(torch.abs(x).view(-1)) / m
        total = scale
    scale = torch.clamp(scale, min=1e-8).to(torch.float32)
    total = torch.clamp(total, min=1e-8).to(torch.float32)
    q = torch.div(x, total).nan_to_num_(0.0).clamp_(-m, m).to(fp8)
    return q.view(n, k), scale, tensor_scale


def musubi_dequantize(q: torch.Tensor, scale: torch.Tensor, tensor_scale: torch.Tensor | None, dtype=torch.float32):
    """``fp8_linear_forward_patch``'s dequantize branch, computed in ``dtype``."""
    if scale.ndim < 3:
        return q.to(dtype) * scale.to(dtype)
    n, nb, _ = scale.shape
    out = q.to(dtype).contiguous().view(n, nb, -1) * scale.to(dtype)
    if tensor_scale is not None:
        out = out * tensor_scale.to(dtype)
    return out.view(q.shape)


def weight(n=64, k=256, seed=0, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, :8] *= 40  # outlier columns make the block scales differ from the row scales
    return w.to(dtype)


def write(path, layers: dict, extra: dict | None = None) -> str:
    """``layers``: prefix -> (q, scale_weight, scale_weight_tensor or None); scales saved as
    musubi saves them (``extra`` adds tensors as they are)."""
    sd = {}
    for prefix, (q, s, t) in layers.items():
        sd[f"{prefix}.weight"] = q
        sd[f"{prefix}.scale_weight"] = s
        if t is not None:
            sd[f"{prefix}.scale_weight_tensor"] = t
        sd[f"{prefix}.bias"] = torch.zeros(q.shape[0], dtype=torch.bfloat16)
    sd.update(extra or {})
    save_file(sd, str(path))
    return str(path)


def detected(path):
    with open_checkpoint(path) as ck:
        return registry.detect(ck), ck


def translation(path, prefix=PREFIX):
    det, _ = detected(path)
    assert det.name == NAME, det.to_dict()
    return det.layers[prefix]


def stored(path, tr) -> dict:
    with safe_open(path, framework="pt") as f:
        return {s: f.get_tensor(e.name) for s, e in tr.inputs.items()}


def apply_moves(path, tr) -> dict[str, tuple[str, tuple, bytes]]:
    """The translated layer's tensors (suffix -> dtype, shape, bytes) from its moves."""
    out = {}
    with open_checkpoint(path) as ck:
        for m in tr.moves:
            data = ck.read_bytes(ck.tensors[m.source])
            out[m.suffix] = (m.dtype, m.shape, m.transform(data) if m.transform else data)
    return out


# -- tensor mode: exact ------------------------------------------------------------------


@pytest.mark.parametrize("shape1", [True, False], ids=["first-writer-[1]", "scalar-[]"])
def test_tensor_mode_is_exact_float8_e4m3fn(tmp_path, shape1):
    w = weight()
    q, s, _ = musubi_quantize(w.float(), "tensor")
    s = s.to(torch.bfloat16)  # load_safetensors_with_fp8_optimization saves it in the weight's dtype
    if shape1:
        s = s.reshape(1)  # the first writer: torch.tensor([scale], dtype=original_dtype)
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, None)})
    tr = translation(path)
    assert (tr.variant, tr.verdict, tr.format, tr.marker) == ("tensor", EXACT, "float8_e4m3fn", {"format": "float8_e4m3fn"})
    out = apply_moves(path, tr)
    assert sorted(out) == ["bias", "weight", "weight_scale"]
    dtype, shape, data = out["weight_scale"]
    assert (dtype, shape) == ("F32", ())
    assert torch.frombuffer(bytearray(data), dtype=torch.float32).item() == s.float().item()
    assert out["weight"][2] == q.view(torch.uint8).numpy().tobytes()  # the FP8 bytes, untouched


def test_tensor_mode_e5m2_is_exact_float8_e5m2(tmp_path):
    q, s, _ = musubi_quantize(weight().float(), "tensor", fp8=torch.float8_e5m2)
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, None)})
    tr = translation(path)
    assert (tr.variant, tr.verdict, tr.format) == ("tensor, e5m2", EXACT, "float8_e5m2")


# -- channel and block: lossy, decoded by the writer's formula ---------------------------


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_channel_mode_is_lossy_and_decodes_like_musubi(tmp_path, scale_dtype):
    q, s, _ = musubi_quantize(weight().float(), "channel")
    s = s.to(scale_dtype)
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, None)})
    tr = translation(path)
    assert (tr.variant, tr.verdict, tr.format, tr.marker) == ("channel", LOSSY, None, None)
    assert tr.lossy.format == "float8_e4m3fn" and tr.decoder is not None
    dense = tr.decoder(stored(path, tr))
    assert dense.dtype == torch.float32
    assert torch.equal(dense, musubi_dequantize(q, s, None, torch.float32))
    # musubi computes in the scale's dtype; the F32 decode holds the exact product, so rounding
    # it once gives musubi's own result bit for bit
    assert torch.equal(dense.to(scale_dtype), musubi_dequantize(q, s, None, scale_dtype))


def test_old_single_level_block_files_decode_like_musubi(tmp_path):
    q, s, t = musubi_quantize(weight().float(), "block", block_size=64)
    assert t is None and s.shape == (64, 4, 1)
    s = s.to(torch.bfloat16)  # the main branch saves block scales in the weight's dtype
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, None)})
    tr = translation(path)
    assert (tr.variant, tr.verdict, tr.format) == ("block", LOSSY, None)
    dense = tr.decoder(stored(path, tr))
    assert torch.equal(dense, musubi_dequantize(q, s, None, torch.float32))
    assert torch.equal(dense.to(torch.bfloat16), musubi_dequantize(q, s, None, torch.bfloat16))


@pytest.mark.parametrize("block_size", [64, 16])
def test_two_level_block_decodes_in_the_writers_order(tmp_path, block_size):
    q, s, t = musubi_quantize(weight().float(), "block", block_size=block_size, two_level=True)
    assert t is not None and t.shape == () and s.shape == (64, 256 // block_size, 1)
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, t)})
    tr = translation(path)
    assert (tr.variant, tr.verdict, tr.format) == ("block, two-level", LOSSY, None)
    assert "scale_weight_tensor" in tr.inputs  # grouped although the registry does not know the suffix
    dense = tr.decoder(stored(path, tr))
    writer = musubi_dequantize(q, s, t, torch.float32)
    assert torch.equal(dense, writer)  # bit for bit: (q * scale_weight) * scale_weight_tensor
    # the order decides bits: multiplying the two scales first gives other F32 values here, so
    # the equality above is a statement about the order
    folded = (q.float().view(64, -1, block_size) * (s * t)).view(64, 256)
    assert not torch.equal(writer, folded)
    # and the tensor factor matters: without it the decode is off by orders of magnitude
    assert not torch.allclose(writer, musubi_dequantize(q, s, None, torch.float32))


def test_block_falls_back_per_writer_when_k_is_not_a_multiple(tmp_path):
    w = weight(k=200)
    q1, s1, _ = musubi_quantize(w.float(), "block", block_size=64)  # main: per-channel
    q2, s2, t2 = musubi_quantize(w.float(), "block", block_size=64, two_level=True)  # exp: per-tensor
    path = write(tmp_path / "m.safetensors", {"a": (q1, s1, None), "b": (q2, s2, t2)})
    det, _ = detected(path)
    assert det.layers["a"].variant == "channel" and det.layers["b"].variant == "tensor"
    assert det.layers["b"].verdict == EXACT


def test_mixed_file_and_notes(tmp_path):
    w = weight().float()
    layers = {
        f"blocks.{i}.x": musubi_quantize(w, mode, two_level=two)
        for i, (mode, two) in enumerate([("tensor", False), ("channel", False), ("block", False), ("block", True)])
    }
    path = write(tmp_path / "m.safetensors", layers)
    det, _ = detected(path)
    assert det.name == NAME
    assert [t.variant for t in det.layers.values()] == ["tensor", "channel", "block", "block, two-level"]
    assert [t.verdict for t in det.layers.values()] == [EXACT, LOSSY, LOSSY, LOSSY]
    assert det.quantized == 4 and det.marked == 0


# -- what is not musubi's ----------------------------------------------------------------


def test_a_file_with_the_legacy_sentinel_is_not_claimed(tmp_path):
    q, s, _ = musubi_quantize(weight().float(), "tensor")
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, None)}, {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)})
    det, _ = detected(path)
    assert det.names == ["comfy-legacy-fp8"]


def test_two_level_layers_beside_the_legacy_sentinel_are_musubis(tmp_path):
    """A file with the legacy sentinel and a two-level block layer: the legacy reading (one scale)
    would drop ``scale_weight_tensor`` and decode garbage, so musubi claims that layer (the
    legacy dialect keeps the rest) and dequantize gives musubi's own numbers for both."""
    w = weight().float()
    qt, st, _ = musubi_quantize(w, "tensor")
    qb, sb, tb = musubi_quantize(w, "block", two_level=True)
    path = write(
        tmp_path / "m.safetensors",
        {"plain": (qt, st, None), "two": (qb, sb, tb)},
        {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)},
    )
    det, _ = detected(path)
    assert sorted(det.names) == sorted(["comfy-legacy-fp8", NAME])
    assert det.layers["two"].dialect == NAME and det.layers["two"].variant == "block, two-level"
    assert det.layers["plain"].dialect == "comfy-legacy-fp8"
    out = dense(path)
    assert torch.equal(out["two.weight"], musubi_dequantize(qb, sb, tb, torch.float32))
    assert torch.equal(out["plain.weight"], musubi_dequantize(qt, st, None, torch.float32))
    assert "two.scale_weight_tensor" not in out and "scaled_fp8" not in out


def test_shapes_that_fit_no_mode_are_refused(tmp_path):
    q, _, _ = musubi_quantize(weight().float(), "tensor")
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, torch.ones(3, 2), None)})
    tr = translation(path)
    assert tr.verdict == REFUSED and "fits none of musubi's modes" in tr.why


def test_a_non_scalar_tensor_factor_is_refused(tmp_path):
    q, s, _ = musubi_quantize(weight().float(), "block", two_level=True)
    path = write(tmp_path / "m.safetensors", {PREFIX: (q, s, torch.ones(2))})
    assert translation(path).verdict == REFUSED


def test_marked_and_dense_layers_are_left_alone(tmp_path):
    q, s, _ = musubi_quantize(weight().float(), "tensor")
    marker = torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
    save_file(
        {"a.weight": q, "a.weight_scale": s, "a.comfy_quant": marker, "b.weight": weight(), "b.scale_weight": torch.ones(())},
        str(tmp_path / "c.safetensors"),
    )
    det, _ = detected(str(tmp_path / "c.safetensors"))
    assert NAME not in det.names


# -- settle and runtimes -----------------------------------------------------------------


def test_settle_drops_a_unit_scale_input_and_refuses_a_broken_scale(tmp_path):
    q, s, _ = musubi_quantize(weight().float(), "tensor")
    path = write(
        tmp_path / "m.safetensors",
        {"a": (q, s, None), "b": (q.clone(), torch.tensor(-1.0), None)},
        {"a.scale_input": torch.tensor(1.0)},
    )
    with open_checkpoint(path) as ck:
        det = registry.detect(ck)
        a, b = det.layers["a"], det.layers["b"]
        assert "input_scale" in [m.suffix for m in a.moves] and a.unsettled
        findings = registry.DIALECTS[NAME].settle(ck, det.claim(NAME))
    assert "input_scale" not in [m.suffix for m in a.moves] and "a.scale_input" in a.drops
    assert b.verdict == REFUSED and b.format is None and "-1.0" in b.why
    assert any(f.severity == "error" and f.layer == "b" for f in findings)
    assert a.verdict == EXACT and not a.unsettled


def test_runtime_models(tmp_path):
    w = weight().float()
    path = write(
        tmp_path / "m.safetensors",
        {"a": musubi_quantize(w, "block", two_level=True), "b": musubi_quantize(w, "tensor", fp8=torch.float8_e5m2)},
    )
    with open_checkpoint(path) as ck:
        det = registry.detect(ck)
        claim = det.claim(NAME)
        comfy = claim_violations(ck, claim, "comfyui")
        sglang = claim_violations(ck, claim, "sglang")
        kitchen = claim_violations(ck, claim, "comfy-kitchen")
    # ComfyUI: no sentinel, so no legacy translation: cast by value, silently
    assert {v.layer for v in comfy} == {"a", "b"}
    assert all(v.fails and not v.blocking and "by value" in v.message for v in comfy)
    assert "#10491" in next(v for v in comfy if v.layer == "a").cause
    # SGLang's profile refuses the unmarked E4M3 weight itself; the E5M2 one it loads by value
    assert [(v.layer, v.fails, v.blocking) for v in sglang] == [("b", True, False)]
    assert kitchen == []


# -- end to end (the commands, once main wires the dialects) -------------------------------

wired = pytest.mark.skipif(not hasattr(comfyquant, "migrate"), reason="the commands' dialect wiring is on main")


def cli_json(capsys, *args) -> tuple[int, dict]:
    rc = main(list(args))
    return rc, json.loads(capsys.readouterr().out)


def dense(path) -> dict[str, torch.Tensor]:
    """``comfyquant dequantize --dtype f32`` of ``path``, read back."""
    from safetensors.torch import load_file

    out = str(path) + ".dense.safetensors"
    comfyquant.dequantize(str(path), out, "f32", overwrite=True)
    return load_file(out)


def mixed_file(tmp_path) -> str:
    w = weight().float()
    return write(
        tmp_path / "m.safetensors",
        {"t": musubi_quantize(w, "tensor"), "c": musubi_quantize(w, "channel"), "b": musubi_quantize(w, "block", two_level=True)},
    )


@wired
def test_inspect_json_names_the_dialect(tmp_path, capsys):
    rc, out = cli_json(capsys, "inspect", mixed_file(tmp_path), "--json")
    assert rc == 0 and out["dialect"] == NAME and out["dialects"] == [NAME]
    rows = {r["layer"]: r for r in out["layers"]}
    assert {p: (rows[p]["dialect"], rows[p]["verdict"]) for p in "tcb"} == {
        "t": ("musubi-fp8 (tensor)", EXACT),
        "c": ("musubi-fp8 (channel)", LOSSY),
        "b": ("musubi-fp8 (block, two-level)", LOSSY),
    }


@wired
def test_check_says_comfyui_computes_garbage_and_sglang_refuses(tmp_path):
    report = comfyquant.check(mixed_file(tmp_path))
    assert not report.verdicts["comfyui"].loads
    assert "by value" in report.verdicts["comfyui"].first.message
    assert "missing comfy_quant metadata" in report.verdicts["sglang"].first.message


@wired
def test_migrate_tensor_mode_is_an_exact_round_trip(tmp_path):
    w = weight().float()
    q, s, _ = musubi_quantize(w, "tensor")
    src = write(
        tmp_path / "m.safetensors",
        {"a": (q, s.to(torch.bfloat16).reshape(1), None), "b": musubi_quantize(w, "tensor", fp8=torch.float8_e5m2)},
    )
    out = str(tmp_path / "comfy.safetensors")
    with pytest.raises(InputError, match="sglang"):  # SGLang has no float8_e5m2: the default target refuses
        comfyquant.migrate(src, out)
    result = comfyquant.migrate(src, out, target="comfyui")
    assert result.ok, result.to_dict()
    assert {r["layer"]: (r["verdict"], r["format"]) for r in result.to_dict()["layers"]} == {
        "a": (EXACT, "float8_e4m3fn"),
        "b": (EXACT, "float8_e5m2"),
    }
    with open_checkpoint(out) as ck:
        assert registry.detect(ck).names == ["comfy"]
        assert ck.layers["a"].marker == {"format": "float8_e4m3fn"}
    before, after = dense(src), dense(out)
    for p in ("a", "b"):
        assert torch.equal(before[f"{p}.weight"], after[f"{p}.weight"])
    assert torch.equal(after["a.weight"], musubi_dequantize(q, s.to(torch.bfloat16), None, torch.float32))
    assert comfyquant.check(out).verdicts["comfyui"].loads


@wired
def test_migrate_refuses_lossy_layers_without_allow_lossy(tmp_path):
    src = mixed_file(tmp_path)
    out = tmp_path / "comfy.safetensors"
    try:
        result = comfyquant.migrate(src, str(out))
    except InputError as exc:
        assert "allow-lossy" in str(exc) or "lossy" in str(exc)
    else:
        assert not result.ok
    assert not out.exists()


@wired
def test_migrate_allow_lossy_then_loads(tmp_path):
    src = mixed_file(tmp_path)
    out = str(tmp_path / "comfy.safetensors")
    result = comfyquant.migrate(src, out, allow_lossy=True)
    assert result.ok, result.to_dict()
    with open_checkpoint(out) as ck:
        assert all(ck.layers[p].marker == {"format": "float8_e4m3fn"} for p in "tcb")
        assert not any(n.endswith("scale_weight_tensor") for n in ck.tensors)
    assert comfyquant.check(out).verdicts["comfyui"].loads
    decoded = dense(out)["b.weight"]
    reference = dense(src)["b.weight"]
    assert (decoded - reference).abs().max() < 0.1 * reference.abs().max()


@wired
def test_dequantize_two_level_block_is_the_writers_decode(tmp_path):
    q, s, t = musubi_quantize(weight().float(), "block", two_level=True)
    src = write(tmp_path / "m.safetensors", {PREFIX: (q, s, t)})
    assert torch.equal(dense(src)[f"{PREFIX}.weight"], musubi_dequantize(q, s, t, torch.float32))


@wired
def test_convert_reads_a_musubi_file(tmp_path):
    w = weight().float()
    src = write(tmp_path / "m.safetensors", {"a": musubi_quantize(w, "tensor"), "b": musubi_quantize(w * 2, "tensor")})
    out = str(tmp_path / "int8.safetensors")
    comfyquant.convert(src, out, to="int8")
    with open_checkpoint(out) as ck:
        assert {ck.layers[p].marker["format"] for p in "ab"} == {"int8_tensorwise"}
        assert not any(n.endswith("scale_weight") for n in ck.tensors)
    assert comfyquant.check(out).ok
