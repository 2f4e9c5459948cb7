"""Differential tests: every codec against comfy-kitchen 0.2.40's CPU eager backend.

For each storage variant comfy-kitchen writes (``kitchen_fixtures.VARIANTS``), on Gaussian
and heavy-tailed weights, in BF16, F16 and F32:

* encode: every tensor bit-identical to the layout's ``state_dict`` (and the marker is the
  "writes with ck, loads in both" one of ``kitchen_fixtures``);
* decode: bit-identical to ``QuantizedTensor.dequantize()``;
* linear: bit-identical to ``F.linear(x, QuantizedTensor)`` -- for NVFP4 and MXFP8, whose
  quantized GEMM comfy-kitchen cannot run on CPU ("CPU does not support swizzle"), to the
  emulated forward composed from comfy-kitchen's own quantize/dequantize primitives.

AWQ and SVDQuant have no quantizer: random tensors are decoded and run against the layouts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from comfy_kitchen.backends.eager import quantization as ck_q
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.awq_w4a16 import TensorCoreAWQW4A16Layout
from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
from comfy_kitchen.tensor.svdquant_w4a4 import TensorCoreSVDQuantW4A4Layout

from comfyquant import codecs
from comfyquant.formats.codec import CodecError, meta_of
from comfyquant.formats.registry import FORMATS
from comfyquant.formats.validation import check_layer
from comfyquant.formats.w4a8.encoder import FIXED_CODEBOOK
from comfyquant.numerics.floats import ulp_distance
from comfyquant.numerics.hadamard import rotate_weight
from kitchen_fixtures import VARIANTS, markers_for, quantize, same_bits

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def weight(kind: str, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gaussian weights, or heavy-tailed ones (Student-t with 2 degrees of freedom in the
    ConvRot domain, so rotated formats see heavy tails and W4A8 fits its own codebook)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        return (torch.randn(n, k, generator=gen) * 0.02).to(dtype)
    z = torch.randn(n, k, generator=gen)
    chi2 = torch.randn(n, k, 2, generator=gen).pow(2).sum(-1)
    t2 = z / (chi2 / 2).sqrt()
    return rotate_weight(t2 * 0.01, 256).to(dtype)


ENCODE_ARGS = {
    "fp8": {},
    "fp8_static": {},
    "fp8_e5m2": {},
    "int8_scalar": {},
    "int8_rowwise": {"per_channel": True},
    "int8_convrot": {"convrot": True, "convrot_groupsize": 256},
    "w4a8_codebook": {"group_size": 16, "convrot_groupsize": 256},
    "w4a8_uniform": {"codebook": False, "group_size": 16, "convrot_groupsize": 256},
    "w4a8_asym": {"codebook": False, "symmetric": False, "group_size": 16, "convrot_groupsize": 256},
    "w6a8": {"codebook": False, "bits": 6, "group_size": 16, "convrot_groupsize": 256},
    "w4a4": {"convrot_groupsize": 256},
    "w4a4_int8": {"convrot_groupsize": 256, "linear_dtype": "int8"},
    "nvfp4": {},
    "mxfp8": {},
}


def kitchen_qtensor(variant: str, w: torch.Tensor) -> QuantizedTensor:
    v = VARIANTS[variant]
    kwargs = dict(v.kwargs)
    args = ENCODE_ARGS[variant]
    for key in ("group_size", "convrot_groupsize"):
        if key in args and (v.format == "asym_w4a8_int8" or key == "convrot_groupsize"):
            kwargs[key] = args[key]
    return QuantizedTensor.from_float(w, v.layout, **kwargs)


def kitchen_linear(variant: str, q: QuantizedTensor, sd: dict, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The reference forward of each format on CPU."""
    fmt = VARIANTS[variant].format
    if fmt.startswith("float8"):
        fp8 = torch.float8_e5m2 if fmt == "float8_e5m2" else torch.float8_e4m3fn
        s_x = sd.get("input_scale", torch.tensor(1.0))
        xq, params = TensorCoreFP8Layout.quantize(x, scale=s_x, dtype=fp8)
        return F.linear(QuantizedTensor(xq, "TensorCoreFP8Layout", params), q, bias)
    if fmt == "nvfp4":
        s_in = (torch.amax(x.abs()) / 2688.0).to(torch.float32)
        xq, xs = ck_q.quantize_nvfp4(x, s_in, pad_16x=True)
        xd = ck_q.dequantize_nvfp4(xq, s_in, xs, torch.float32)[: x.shape[0], : x.shape[1]]
        wd = ck_q.dequantize_nvfp4(sd["weight"], sd["weight_scale_2"], sd["weight_scale"], torch.float32)
        return F.linear(xd, wd[: q.shape[0], : q.shape[1]], bias.float()).to(x.dtype)
    if fmt == "mxfp8":
        xq, xs = ck_q.quantize_mxfp8(x, pad_32x=True)
        xd = ck_q.dequantize_mxfp8(xq, xs, torch.float32)[: x.shape[0], : x.shape[1]]
        wd = ck_q.dequantize_mxfp8(sd["weight"], sd["weight_scale"], torch.float32)
        return F.linear(xd, wd[: q.shape[0], : q.shape[1]], bias.float()).to(x.dtype)
    return F.linear(x, q, bias)


CASES = [(v, d, kind) for v in ENCODE_ARGS for d in DTYPES for kind in ("gauss", "heavy")]


@pytest.mark.parametrize("variant,dtype_name,kind", CASES)
def test_encode_decode_linear_bit_exact(variant, dtype_name, kind):
    dtype = DTYPES[dtype_name]
    fmt = VARIANTS[variant].format
    n, k = 48, 512
    w = weight(kind, n, k, dtype, seed=hash((variant, dtype_name, kind)) % 1000)
    codec = codecs.get(fmt)
    q = kitchen_qtensor(variant, w)
    ref = {s: t for s, t in q.state_dict("weight").items()}
    params = dict(ENCODE_ARGS[variant])
    if variant == "fp8_static":
        params["input_scale"] = float(w.float().abs().amax()) / 448.0
        ref["input_scale"] = torch.tensor(params["input_scale"], dtype=torch.float32)
    enc = codec.encode(w, **params)
    assert set(enc) == set(ref)
    for suffix in ref:
        assert same_bits(enc[suffix], ref[suffix]), suffix
    assert enc.marker == markers_for(variant)[1]
    findings, _ = check_layer(FORMATS[fmt], enc.marker, {s: meta_of(t) for s, t in enc.items()})
    assert [f for f in findings if f.severity == "error"] == []

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    layer = dict(ref, bias=bias)  # padded formats read the model's N from the bias
    dense = codec.decode(layer, enc.marker, dtype=dtype)
    assert same_bits(dense, q.dequantize())

    y = codec.linear(x, layer, enc.marker)
    y_ref = kitchen_linear(variant, q, ref, x, bias)
    assert y.dtype == y_ref.dtype == dtype
    assert same_bits(y, y_ref), f"max ulp {ulp_distance(y, y_ref).max().item()}"


def test_heavy_tails_select_a_fitted_codebook():
    w = weight("heavy", 64, 512, torch.bfloat16)
    enc = codecs.get("asym_w4a8_int8").encode(w)
    ref = quantize("w4a8_codebook", w)
    assert not torch.equal(enc["weight_codebook"], torch.tensor(FIXED_CODEBOOK))
    assert same_bits(enc["weight_codebook"], ref["weight_codebook"])
    gauss = codecs.get("asym_w4a8_int8").encode(weight("gauss", 64, 512, torch.bfloat16))
    assert torch.equal(gauss["weight_codebook"], torch.tensor(FIXED_CODEBOOK))


def test_large_layers_use_kitchens_row_chunks_and_codebook_sample():
    # 2^22 // K rows per chunk and rows sampled by linspace for the codebook: K = 2^16
    # gives 64-row chunks, so 65 rows take two chunks and the codebook sees 64 of them.
    w = weight("gauss", 65, 1 << 16, torch.bfloat16)
    enc = codecs.get("asym_w4a8_int8").encode(w)
    ref = quantize("w4a8_codebook", w)
    assert all(same_bits(enc[s], ref[s]) for s in ref)


@pytest.mark.parametrize("fmt,layout", [("nvfp4", "TensorCoreNVFP4Layout"), ("mxfp8", "TensorCoreMXFP8Layout")])
@pytest.mark.parametrize("n,k", [(20, 40), (130, 96)])
def test_padded_formats_slice_to_the_model_shape(fmt, layout, n, k):
    w = weight("gauss", n, k, torch.bfloat16)
    q = QuantizedTensor.from_float(w, layout)
    sd = q.state_dict("weight")
    enc = codecs.get(fmt).encode(w)
    assert all(same_bits(enc[s], sd[s]) for s in sd)
    tensors = dict(sd, bias=torch.zeros(n, dtype=torch.bfloat16))
    marker = {"format": fmt}
    if fmt == "nvfp4":
        tensors["pre_quant_scale"] = torch.ones(k, dtype=torch.bfloat16)
    else:
        marker["orig_shape"] = [n, k]
    dense = codecs.get(fmt).decode(tensors, marker)
    assert same_bits(dense, q.dequantize())


def test_nvfp4_pre_quant_scale_folds_into_the_dense_weight():
    codec = codecs.get("nvfp4")
    w = weight("gauss", 32, 64, torch.float32)
    s = torch.rand(64) + 0.5
    enc = codec.encode(w, pre_quant_scale=s)
    assert enc["pre_quant_scale"].dtype == torch.float32
    plain = dict(enc)
    del plain["pre_quant_scale"]
    stored = codec.decode(plain, dtype=torch.float32)
    folded = codec.decode(enc, dtype=torch.float32)
    assert same_bits(folded, stored * s.view(1, -1))
    x = torch.randn(3, 64)
    y, exact = codec.linear(x, enc), x @ w.t()
    assert ((y - exact).norm() / exact.norm()).item() < 0.25  # 4-bit weights and activations


def test_full_precision_matrix_mult_runs_a_float_matmul():
    codec = codecs.get("float8_e4m3fn")
    w = weight("gauss", 16, 64, torch.bfloat16)
    enc = codec.encode(w, full_precision_matrix_mult=True)
    assert enc.marker == {"format": "float8_e4m3fn", "full_precision_matrix_mult": True}
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert same_bits(codec.linear(x, enc, enc.marker), F.linear(x, codec.decode(enc, enc.marker, dtype=torch.bfloat16)))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_awq_decode_and_linear(dtype_name):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(3)
    n, k, g = 48, 256, 64
    t, q = awq_layer(dtype, n, k, g, gen)
    marker = {"format": "awq_w4a16", "group_size": g}
    codec = codecs.get("awq_w4a16")
    assert same_bits(codec.decode(t, marker), q.dequantize())
    x = torch.randn(5, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    assert same_bits(codec.linear(x, t, marker, b), F.linear(x, q, b))
    with pytest.raises(CodecError, match="offline calibration"):
        codec.encode(torch.zeros(4, 64))


def awq_layer(dtype, n: int, k: int, g: int, gen: torch.Generator) -> tuple[dict, QuantizedTensor]:
    """Random AWQ W4A16 tensors (drawn from ``gen``) and comfy-kitchen's tensor of them."""
    t = {
        "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
        "weight_scale": (torch.rand(k // g, n, generator=gen) * 0.01).to(dtype),
        "weight_zeros": (torch.randn(k // g, n, generator=gen) * 0.01).to(dtype),
    }
    params = TensorCoreAWQW4A16Layout.Params(
        scale=t["weight_scale"], orig_dtype=dtype, orig_shape=(n, k), zeros=t["weight_zeros"], group_size=g
    )
    return t, QuantizedTensor(t["weight"], "TensorCoreAWQW4A16Layout", params)


def svdquant_tensors(dtype, n=128, k=256, r=16, packed=False, seed=4):
    gen = torch.Generator().manual_seed(seed)
    t = {
        "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
        "weight_scale": (torch.rand(k // 64, n, generator=gen) * 0.01 + 0.001).to(dtype),
        "weight_proj_down": (torch.randn(k, r, generator=gen) * 0.05).to(dtype),
        "weight_proj_up": (torch.randn(n, r, generator=gen) * 0.05).to(dtype),
        "weight_smooth_factor": (torch.rand(k, generator=gen) + 0.5).to(dtype),
    }
    if packed:  # kitchen_tile_packed_w4a4, the inverse of comfy-kitchen's tile mapping
        nt, kg = n // 128, k // 64
        t["weight"] = t["weight"].view(nt, 32, 4, kg, 32).permute(0, 3, 1, 2, 4).reshape(nt, kg, 32, 128).contiguous()
        t["weight_scale"] = t["weight_scale"].view(kg, nt, 128).permute(1, 0, 2).contiguous()
        t["weight_proj_up"] = t["weight_proj_up"].view(nt, 128, r).permute(0, 2, 1).contiguous()
    return t


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_svdquant_decode_and_linear(dtype_name, unsigned, packed):
    dtype = DTYPES[dtype_name]
    n, k = 128, 256
    t = svdquant_tensors(dtype, n, k, packed=packed)
    params = TensorCoreSVDQuantW4A4Layout.Params(
        scale=t["weight_scale"],
        orig_dtype=dtype,
        orig_shape=(n, k),
        proj_down=t["weight_proj_down"],
        proj_up=t["weight_proj_up"],
        smooth_factor=t["weight_smooth_factor"],
        act_unsigned=unsigned,
    )
    q = QuantizedTensor(t["weight"], "TensorCoreSVDQuantW4A4Layout", params)
    marker = {"format": "svdquant_w4a4", "act_unsigned": unsigned}
    codec = codecs.get("svdquant_w4a4")
    assert same_bits(codec.decode(t, marker, dtype=dtype), q.dequantize())
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    assert same_bits(codec.linear(x, t, marker, b), F.linear(x, q, b))


@pytest.mark.parametrize("variant", ["w4a8_codebook", "int8_convrot", "w4a4", "nvfp4", "mxfp8", "fp8", "w4a8_asym"])
def test_row_blocks_decode_to_the_same_bits(variant):
    w = weight("gauss", 200, 256, torch.bfloat16)
    enc = codecs.get(VARIANTS[variant].format).encode(w, **ENCODE_ARGS[variant])
    codec = codecs.get(VARIANTS[variant].format)
    whole = codec.decode(enc, enc.marker, block_elements=1 << 24)
    blocks = [b.clone() for b in codec.iter_decode(enc, enc.marker, block_elements=64 * 256)]  # one shared buffer
    assert len(blocks) == 4
    assert same_bits(torch.cat(blocks), whole)
    assert same_bits(codec.decode(enc, enc.marker, block_elements=64 * 256), whole)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4", "mxfp8"])
def test_nan_or_inf_in_encode_input_names_the_layer(fmt):
    w = weight("gauss", 16, 256, torch.bfloat16)
    w[3, 7] = float("nan")
    w[5, 1] = float("inf")
    with pytest.raises(CodecError, match=r"blocks\.2\.ff: weight has 2 NaN/Inf value\(s\), first at \[3, 7\]"):
        codecs.get(fmt).encode(w, layer="blocks.2.ff")


@pytest.mark.parametrize("params", [{"per_channel": True}, {"convrot": True}, {"per_channel": True, "convrot": True}])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_row_scaled_int8_finds_nan_or_inf_from_its_row_scales(params, bad):
    """Row-wise and ConvRot INT8 skip the separate finite scan; one bad value anywhere is
    still refused with the same message (as a row source too, read block by block)."""
    w = weight("gauss", 300, 256, torch.bfloat16)
    w[250, 3] = bad
    codec = codecs.get("int8_tensorwise")
    with pytest.raises(CodecError, match=r"blocks\.2\.ff: weight has 1 NaN/Inf value\(s\), first at \[250, 3\]"):
        codec.encode(w, layer="blocks.2.ff", **params)
    with pytest.raises(CodecError, match=r"x: weight has 1 NaN/Inf value\(s\), first at \[250, 3\]"):
        codec.encode(_recording_source(w, []), layer="x", **params)


def test_convrot_int8_of_a_finite_weight_whose_rotation_overflows_matches_kitchen():
    """Finite values near the BF16 maximum overflow in the rotation: comfy-kitchen quantizes
    them anyway, and so does comfyquant (no NaN/Inf in the input, so no refusal)."""
    from comfyquant.numerics.hadamard import rotate_weight

    w = weight("gauss", 64, 256, torch.bfloat16)
    w[5, :] = torch.finfo(torch.bfloat16).max
    # The rotated row leaves BF16's range: inf from AVX-512's BF16 GEMM, clamped to the largest
    # finite value by oneDNN's AVX2 kernels -- comfy-kitchen's call gives the same either way.
    assert (rotate_weight(w, 256)[5].float().abs() >= torch.finfo(torch.bfloat16).max).any()
    enc = codecs.get("int8_tensorwise").encode(w, per_channel=True, convrot=True)
    ref = QuantizedTensor.from_float(w, "TensorWiseINT8Layout", per_channel=True, convrot=True).state_dict("weight")
    assert set(ref) == set(enc) and all(same_bits(enc[s], ref[s].contiguous()) for s in ref)


def test_tensors_that_contradict_the_marker_are_refused_with_the_checker_message():
    codec = codecs.get("asym_w4a8_int8")
    enc = codec.encode(weight("gauss", 32, 256, torch.bfloat16), symmetric=False, codebook=False)
    bad = dict(enc, weight_correction=enc["weight_correction"].t().contiguous())
    with pytest.raises(
        CodecError,
        match=r"layer 'blocks\.0\.mlp' \(asym_w4a8_int8\): weight_correction is BF16 \(32, 16\), expected F32 \(16, 32\)",
    ):
        codec.decode(bad, enc.marker, layer="blocks.0.mlp")
    with pytest.raises(CodecError, match="s_rel"):
        codec.decode(dict(enc, weight_s_rel=enc["weight_s_rel"][:, :8]), enc.marker, layer="x")
    int8 = codecs.get("int8_tensorwise")
    e8 = int8.encode(weight("gauss", 16, 64, torch.float32), per_channel=True)
    with pytest.raises(CodecError, match=r"weight_scale is F32 \(16,\)"):
        int8.decode(dict(e8, weight_scale=e8["weight_scale"].reshape(-1)), e8.marker, layer="emb")
    with pytest.raises(CodecError, match="marker format 'nvfp4'"):
        int8.decode(e8, {"format": "nvfp4"})


def test_encode_refuses_impossible_geometry_with_kitchens_messages():
    w = weight("gauss", 16, 96, torch.bfloat16)
    with pytest.raises(CodecError, match="ConvRot group size 256 does not divide input features 96"):
        codecs.get("int8_tensorwise").encode(w, convrot=True)
    with pytest.raises(CodecError, match="Regular Hadamard size must be a power of 4, got 128"):
        codecs.get("convrot_w4a4").encode(weight("gauss", 16, 256, torch.bfloat16), convrot_groupsize=128)
    with pytest.raises(CodecError, match="K=96 must be divisible by 16, group_size=16, and convrot_groupsize=256"):
        codecs.get("asym_w4a8_int8").encode(w)
    with pytest.raises(CodecError, match="6-bit storage is symmetric only"):
        codecs.get("asym_w4a8_int8").encode(weight("gauss", 16, 256, torch.bfloat16), bits=6, symmetric=False)
    with pytest.raises(CodecError, match="unknown encode parameter"):
        codecs.get("mxfp8").encode(w, group_size=32)
    with pytest.raises(CodecError, match="must be 2-D"):
        codecs.get("mxfp8").encode(w[0])
    with pytest.raises(CodecError, match="no codec for format 'int8_blockwise'"):
        codecs.get("int8_blockwise")
    with pytest.raises(CodecError, match="input has 64 features, the layer takes K=96"):
        enc = codecs.get("mxfp8").encode(w)
        codecs.get("mxfp8").linear(torch.zeros(2, 64, dtype=torch.bfloat16), enc)


def test_decode_defaults_to_the_model_dtype():
    codec = codecs.get("float8_e4m3fn")
    enc = codec.encode(weight("gauss", 8, 32, torch.float32))
    assert codec.decode(enc).dtype == torch.bfloat16
    assert codec.decode(dict(enc, bias=torch.zeros(8, dtype=torch.float16))).dtype == torch.float16
    assert codec.decode(enc, {"format": "float8_e4m3fn", "orig_dtype": "torch.float32"}).dtype == torch.float32
    assert codec.decode(enc, dtype="f32").dtype == torch.float32


def test_all_zero_weights_encode_to_zeros():
    for fmt in ("float8_e4m3fn", "nvfp4", "int8_tensorwise", "mxfp8"):
        codec = codecs.get(fmt)
        enc = codec.encode(torch.zeros(32, 64, dtype=torch.bfloat16))
        assert not codec.decode(enc, enc.marker).any(), fmt


@pytest.mark.parametrize("group_size,size", [(4, 16), (32, 64), (16, 1024), (64, 256)])
@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
@pytest.mark.parametrize("variant", ["w4a8_codebook", "w6a8"])
def test_w4a8_group_and_rotation_sizes(group_size, size, dtype_name, variant):
    if variant == "w6a8" and group_size % 16:
        pytest.skip("6-bit storage needs group sizes that are multiples of 16")
    dtype = DTYPES[dtype_name]
    w = weight("gauss", 32, 1024, dtype, seed=group_size + size)
    params = dict(ENCODE_ARGS[variant], group_size=group_size, convrot_groupsize=size)
    codec = codecs.get("asym_w4a8_int8")
    q = QuantizedTensor.from_float(w, "AsymW4A8Int8Layout", **{k: v for k, v in params.items()})
    ref = q.state_dict("weight")
    enc = codec.encode(w, **params)
    assert all(same_bits(enc[s], ref[s]) for s in ref)
    assert same_bits(codec.decode(ref, enc.marker, dtype=dtype), q.dequantize())
    x = torch.randn(3, 1024).to(dtype)
    assert same_bits(codec.linear(x, ref, enc.marker), F.linear(x, q))


# -- row-blocked encode and forward (memory per layer) -----------------------------------------

BLOCKED_SHAPES = [(200, 256), (333, 512), (97, 1024)]
"""Rows that are no multiple of the block rows (and, for 97, a tail that joins the block
before it); K from one ConvRot block to four."""


@pytest.mark.parametrize("variant", list(ENCODE_ARGS))
@pytest.mark.parametrize("n,k", BLOCKED_SHAPES)
@pytest.mark.parametrize("block_rows", [16, 64])
@pytest.mark.parametrize("dtype_name", ["bf16", "f32"])
def test_row_blocked_encode_equals_whole_and_kitchen(monkeypatch, variant, n, k, block_rows, dtype_name):
    """Blocks of 16 (raised to the minimum: 64 rows of 256, 32 of 512) or 64 rows, the last
    one longer when a short tail joins it; F32 is where small-M GEMMs would round apart."""
    import comfyquant.numerics.rows as rows

    w = weight("heavy" if variant == "w4a8_codebook" else "gauss", n, k, DTYPES[dtype_name], seed=n + k)
    codec = codecs.get(VARIANTS[variant].format)
    params = dict(ENCODE_ARGS[variant])
    if variant == "fp8_static":
        params["input_scale"] = 0.01
    whole = codec.encode(w, **params)  # default blocks: one block at these sizes
    monkeypatch.setattr(rows, "encode_block_elements", lambda: block_rows * k)
    monkeypatch.setattr(rows, "rotation_encode_block_elements", lambda: block_rows * k)
    blocked = codec.encode(w, **params)
    ref = kitchen_qtensor(variant, w).state_dict("weight")
    assert set(blocked) == set(whole)
    for suffix in whole:
        assert same_bits(blocked[suffix], whole[suffix]), suffix
        if suffix in ref:
            assert same_bits(blocked[suffix], ref[suffix]), suffix


def _recording_source(w: torch.Tensor, reads: list):
    from comfyquant.numerics.rows import RowSource

    def read(r0: int, r1: int) -> torch.Tensor:
        reads.append(r1 - r0)
        return w[r0:r1].clone()

    return RowSource(tuple(w.shape), w.dtype, read)


@pytest.mark.parametrize(
    "variant", ["w4a8_codebook", "w4a8_asym", "w6a8", "int8_convrot", "int8_scalar", "w4a4", "nvfp4", "mxfp8", "fp8"]
)
def test_row_source_encodes_like_the_tensor_and_is_never_read_whole(monkeypatch, variant):
    import comfyquant.numerics.rows as rows

    monkeypatch.setattr(rows, "encode_block_elements", lambda: 64 * 512)
    monkeypatch.setattr(rows, "rotation_encode_block_elements", lambda: 64 * 512)
    w = weight("gauss", 333, 512, torch.bfloat16, seed=3)
    codec = codecs.get(VARIANTS[variant].format)
    reads: list[int] = []
    from_source = codec.encode(_recording_source(w, reads), **ENCODE_ARGS[variant])
    from_tensor = codec.encode(w, **ENCODE_ARGS[variant])
    assert all(same_bits(from_source[s], from_tensor[s]) for s in from_tensor)
    # 64-row blocks (a 13-row tail joins the last); the W4A8 codebook sample of a layer this
    # small is the whole layer (comfy-kitchen samples 2^22 // K rows: here all 333).
    sample = [333] if variant == "w4a8_codebook" else []
    assert sorted(r for r in reads if r > 77) == sample


def test_row_source_reports_nan_like_the_tensor():
    w = weight("gauss", 300, 256, torch.bfloat16)
    w[250, 3] = float("nan")
    w[299, 0] = float("inf")
    with pytest.raises(CodecError, match=r"x: weight has 2 NaN/Inf value\(s\), first at \[250, 3\]"):
        codecs.get("nvfp4").encode(_recording_source(w, []), layer="x")


def test_heavy_tailed_codebook_from_a_sampled_layer_matches_kitchen(monkeypatch):
    # 700 x 1024 values: more than comfy-kitchen's 2^19 kurtosis sample and its 300000 fit
    # sample, so both are drawn (by position, from row blocks of the normalized groups) and
    # the Lloyd-Max fit runs over blocks of samples.
    import comfyquant.numerics.rows as rows

    monkeypatch.setattr(rows, "encode_block_elements", lambda: 64 * 1024)
    w = weight("heavy", 700, 1024, torch.bfloat16, seed=5)
    enc = codecs.get("asym_w4a8_int8").encode(w)
    ref = quantize("w4a8_codebook", w)
    assert not torch.equal(enc["weight_codebook"], torch.tensor(FIXED_CODEBOOK))
    assert all(same_bits(enc[s], ref[s]) for s in ref)


INTEGER_GEMMS = ("w4a8_codebook", "w4a8_uniform", "w6a8", "int8_convrot", "int8_rowwise", "int8_scalar", "w4a4")


@pytest.mark.parametrize("variant", list(ENCODE_ARGS))
def test_row_blocked_linear(variant):
    """Output features in row blocks: the same bits where the GEMM is integer (exact in any
    split); float GEMMs over fewer columns may round the last bit differently (MKL)."""
    w = weight("gauss", 333, 512, torch.bfloat16, seed=7)
    codec = codecs.get(VARIANTS[variant].format)
    enc = codec.encode(w, **ENCODE_ARGS[variant])
    layer = dict(enc, bias=torch.linspace(-1, 1, 333).to(torch.bfloat16))
    x = torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    whole = codec.linear(x, layer, enc.marker)
    blocked = codec.linear(x, layer, enc.marker, block_elements=64 * 512)
    assert blocked.shape == whole.shape == (2, 3, 333)
    if variant in INTEGER_GEMMS:
        assert same_bits(blocked, whole)
    else:
        assert ulp_distance(blocked, whole).max() <= 1


def test_row_source_decodes_rows_on_demand():
    w = weight("gauss", 300, 256, torch.bfloat16)
    codec = codecs.get("asym_w4a8_int8")
    enc = codec.encode(w)
    source = codec.row_source(enc, enc.marker)
    assert source.shape == (300, 256) and source.dtype == torch.bfloat16
    dense = codec.decode(enc, enc.marker)
    assert same_bits(torch.cat([source.rows(0, 100), source.rows(100, 300)]), dense)
    again = codecs.get("nvfp4").encode(source)
    assert all(same_bits(again[s], codecs.get("nvfp4").encode(dense)[s]) for s in again)


@pytest.mark.parametrize("variant", ["nvfp4", "mxfp8", "fp8", "int8_scalar", "int8_rowwise", "int8_convrot", "w4a4"])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_zero_blocks_and_negative_zeros_encode_as_kitchen(variant, dtype_name):
    """Whole 1x16 / 1x32 blocks of +0.0 and -0.0 among ordinary ones (the encoders skip the
    empty-block handling when no block is empty: it must not matter when some are), and
    single -0.0 values: the same bits as comfy-kitchen."""
    dtype = DTYPES[dtype_name]
    w = weight("gauss", 64, 512, dtype, seed=11).clone()
    w[3, 32:64] = 0.0
    w[5, 0:32] = -0.0
    w[9, 64:96] = -0.0
    w[9, 100] = -0.0
    w[20, :] = 0.0
    fmt = VARIANTS[variant].format
    ref = kitchen_qtensor(variant, w).state_dict("weight")
    enc = codecs.get(fmt).encode(w, **ENCODE_ARGS[variant])
    for suffix in ref:
        assert same_bits(enc[suffix], ref[suffix]), suffix


@pytest.mark.parametrize("gemm_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("variant", ["w4a8_codebook", "w4a8_uniform", "w6a8"])
def test_w4a8_exact_unrotation_in_either_dtype(variant, gemm_dtype):
    """BF16 output without a correction: the F32 and the BF16 un-rotation, in row blocks of
    any size, give comfy-kitchen's bits alike (the exactness argument of codecs/w4a8.py); the
    decoder uses the F32 one in row blocks, and it is comfy-kitchen's too."""
    from comfyquant.formats.w4a8 import codec as w4a8

    w = weight("heavy" if variant == "w4a8_codebook" else "gauss", 96, 1024, torch.bfloat16, seed=17)
    q = kitchen_qtensor(variant, w)
    ref = q.state_dict("weight")
    marker = markers_for(variant)[1]
    codec = codecs.get("asym_w4a8_int8")
    dense = codec.decode(ref, marker, dtype=torch.bfloat16)
    assert same_bits(dense, q.dequantize())
    plan = codec.plan(ref, marker)
    assert not codec._whole_layer(plan.env, torch.bfloat16, ref)
    table = codec._prepare(ref, plan.env, torch.bfloat16)
    gemm = DTYPES[gemm_dtype]
    blocks = [
        rotate_weight(codec._rotated(ref, plan.env, r0, r1, table, torch.bfloat16).to(gemm), 256).to(torch.bfloat16)
        for r0, r1 in ((0, 5), (5, 21), (21, 90), (90, 96))
    ]
    assert same_bits(torch.cat(blocks), q.dequantize())
    assert w4a8._EXACT_MAX_BLOCK == 256


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4", "mxfp8"])
def test_empty_weight_is_refused_with_a_message(fmt):
    for shape in ((0, 256), (16, 0)):
        with pytest.raises(CodecError, match=r"blocks\.1\.ff: weight is empty, shape \(\d+, \d+\): there is nothing to quantize"):
            codecs.get(fmt).encode(torch.zeros(shape, dtype=torch.bfloat16), layer="blocks.1.ff")
