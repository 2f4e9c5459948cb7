"""Bit-exactness that does not depend on the CPU's GEMM kernels.

BLAS picks its kernel -- and with it the summation order -- by the operand shapes, the ISA and
the thread count: on an AVX-512/AMX CPU an F32 un-rotation over an 8-row tail block rounded
differently from comfy-kitchen's one GEMM over the layer.  So every rotated format is compared
with comfy-kitchen's own eager functions (the ``QuantizedTensor`` layouts ComfyUI uses) here:

* at 1 and 2 torch threads (both sides under the same setting, restored afterwards);
* for row counts with short tails: 1, 3, 15, 17 rows, 200 (64-row blocks leave 8), 1031;
* encode (tensor and row-source input, with forced small blocks) and decode (whole, streamed
  in blocks with tails under 16 rows, and row-source spans), and the forward;
* in BF16, F16 and F32 (the output dtype is the weight's dtype, as comfy-kitchen decodes).

Run on AVX2-only CPUs too: ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2`` restricts torch, MKL and oneDNN to AVX2 on a larger CPU (the last
test here does that in a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.svdquant_w4a4 import TensorCoreSVDQuantW4A4Layout

from comfyquant import codecs
from comfyquant.formats.w4a8 import codec as w4a8
from comfyquant.numerics.hadamard import hadamard, rotate_weight
from comfyquant.numerics.rows import RowSource
from kitchen_fixtures import VARIANTS, markers_for, same_bits
from test_codecs_vs_kitchen import ENCODE_ARGS, kitchen_qtensor, weight

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
ROTATED = ["int8_convrot", "w4a4", "w4a4_int8", "w4a8_codebook", "w4a8_uniform", "w4a8_asym", "w6a8"]
"""Every ConvRot variant comfy-kitchen writes (``w4a8_asym`` has the correction)."""
SHAPES = [(1, 1024), (3, 1024), (15, 1024), (17, 1024), (200, 256), (1031, 256)]
"""Row counts with short tails; K = 1024 allows 16-row blocks (17 rows: a 1-row tail), K = 256
64-row ones (200 rows: the 8-row tail of the original failure; 1031 rows: a 7-row tail)."""


def block_rows(k: int) -> int:
    return 16 if k >= 1024 else 64


def _source(w: torch.Tensor, reads: list[int]) -> RowSource:
    def read(r0: int, r1: int) -> torch.Tensor:
        reads.append(r1 - r0)
        return w[r0:r1].clone()

    return RowSource(tuple(w.shape), w.dtype, read)


def _layer(variant: str, n: int, k: int, dtype: torch.dtype, seed: int):
    w = weight("gauss", n, k, dtype, seed=seed)  # the heavy-tailed codebook fit has no GEMM
    q = kitchen_qtensor(variant, w)
    return w, q, {s: t for s, t in q.state_dict("weight").items()}


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("variant", ROTATED)
def test_rotated_formats_decode_like_kitchen_at_any_row_count(threads, variant, n, k):
    """Decode whole, streamed in blocks of 16 or 64 rows (tails of 1 to 15 rows, and layers
    smaller than one block) and as row-source spans: comfy-kitchen's bits."""
    for name, dtype in DTYPES.items():
        w, q, ref = _layer(variant, n, k, dtype, seed=n + len(name))
        codec = codecs.get(VARIANTS[variant].format)
        marker = markers_for(variant)[1]
        expected = q.dequantize()
        assert expected.dtype == dtype
        assert same_bits(codec.decode(ref, marker, dtype=dtype), expected), (name, "whole")
        rows = block_rows(k)
        blocks = [b.clone() for b in codec.iter_decode(ref, marker, dtype=dtype, block_elements=rows * k)]
        assert [b.shape[0] for b in blocks] == [rows] * (n // rows) + [n % rows] * (n % rows > 0)
        assert same_bits(torch.cat(blocks), expected), (name, rows)
        source = codec.row_source(ref, marker, dtype=dtype)
        cut = min(n, 5)
        assert same_bits(torch.cat([source.rows(0, cut), source.rows(cut, n)]), expected), (name, "source")


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("variant", ROTATED)
def test_rotated_formats_encode_like_kitchen_at_any_row_count(threads, monkeypatch, variant, n, k):
    """Encode from a tensor with the default blocks and from a row source read in small
    blocks: every tensor comfy-kitchen's bits, in BF16, F16 and F32."""
    import comfyquant.numerics.rows as rows

    codec = codecs.get(VARIANTS[variant].format)
    for name, dtype in DTYPES.items():
        w, _q, ref = _layer(variant, n, k, dtype, seed=2 * n + len(name))
        enc = codec.encode(w, **ENCODE_ARGS[variant])
        assert set(enc) == set(ref)
        for suffix in ref:
            assert same_bits(enc[suffix], ref[suffix]), (name, suffix)
        with monkeypatch.context() as m:
            m.setattr(rows, "encode_block_elements", lambda: block_rows(k) * k)
            m.setattr(rows, "rotation_encode_block_elements", lambda: block_rows(k) * k)
            reads: list[int] = []
            blocked = codec.encode(_source(w, reads), **ENCODE_ARGS[variant])
        for suffix in ref:
            assert same_bits(blocked[suffix], ref[suffix]), (name, suffix, "row source")
        if variant != "w4a8_codebook":  # (whose codebook sample, the whole layer here, is read whole)
            assert max(reads) < 2 * block_rows(k)  # a short tail joins the block before it


@pytest.mark.parametrize("n", [3, 17, 200])
@pytest.mark.parametrize("variant", ROTATED)
def test_rotated_formats_run_like_kitchen(threads, variant, n):
    """The forward, whole: comfy-kitchen's ``F.linear`` on the quantized tensor (W4A8 with a
    correction is a dequantize and a float GEMM there, with the decoded layer's shape)."""
    k = 512
    for name in ("bf16", "f16"):
        dtype = DTYPES[name]
        w, q, ref = _layer(variant, n, k, dtype, seed=3 * n)
        codec = codecs.get(VARIANTS[variant].format)
        marker = markers_for(variant)[1]
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(2, 7, k, generator=gen).to(dtype)
        bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
        assert same_bits(codec.linear(x, ref, marker, bias), F.linear(x, q, bias)), name


def test_large_w4a8_encode_uses_kitchens_row_chunks(threads):
    """2^22 // K rows per rotation GEMM, the last chunk short (here 64-row chunks of K = 2^16
    and a 3-row last chunk), whatever the quantizer's own row blocks."""
    w = weight("gauss", 67, 1 << 16, torch.float32, seed=4)
    q = kitchen_qtensor("w4a8_uniform", w)
    enc = codecs.get("asym_w4a8_int8").encode(w, **ENCODE_ARGS["w4a8_uniform"])
    ref = q.state_dict("weight")
    assert all(same_bits(enc[s], ref[s]) for s in ref)


def test_int8_convrot_decode_of_the_original_failure(threads):
    """The reported case: INT8 ConvRot, 200 x 256 BF16, 64-row blocks (an 8-row tail) -- the
    streamed blocks and the whole decode are comfy-kitchen's bits."""
    w, q, ref = _layer("int8_convrot", 200, 256, torch.bfloat16, seed=0)
    codec = codecs.get("int8_tensorwise")
    marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
    blocks = [b.clone() for b in codec.iter_decode(ref, marker, block_elements=64 * 256)]
    assert [b.shape[0] for b in blocks] == [64, 64, 64, 8]
    assert same_bits(torch.cat(blocks), q.dequantize())


@pytest.mark.parametrize("n,k", [(3, 192), (130, 320), (200, 512)])
def test_svdquant_decode_like_kitchen_at_any_row_count(threads, n, k):
    """The low-rank term is comfy-kitchen's one F32 GEMM over the padded identity rows (K not
    a multiple of 256 here, so the padding matters) and all output features."""
    gen = torch.Generator().manual_seed(n + k)
    rank = 32
    q = torch.randint(-128, 128, (n, k // 2), generator=gen, dtype=torch.int8)
    scale = (torch.rand(k // 64, n, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16)
    smooth = (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16)
    down = (torch.randn(k, rank, generator=gen) * 0.1).to(torch.bfloat16)
    up = (torch.randn(n, rank, generator=gen) * 0.1).to(torch.bfloat16)
    tensors = {"weight": q, "weight_scale": scale, "weight_smooth_factor": smooth, "weight_proj_down": down, "weight_proj_up": up}
    params = TensorCoreSVDQuantW4A4Layout.Params(
        scale=scale, orig_dtype=torch.bfloat16, orig_shape=(n, k), smooth_factor=smooth, proj_down=down, proj_up=up
    )
    expected = QuantizedTensor(q, "TensorCoreSVDQuantW4A4Layout", params).dequantize()
    codec = codecs.get("svdquant_w4a4")
    marker = {"format": "svdquant_w4a4"}
    assert same_bits(codec.decode(tensors, marker, dtype=torch.bfloat16), expected)
    blocks = [b.clone() for b in codec.iter_decode(tensors, marker, dtype=torch.bfloat16, block_elements=16 * k)]
    assert same_bits(torch.cat(blocks), expected)


# -- the W4A8 exactness argument (codecs/w4a8.py) ---------------------------------------------


def _adversarial_rows(rows: int, k: int, seed: int) -> torch.Tensor:
    """``bf16(f32(g * s))`` as the decoder builds it, with the extremes of the argument: grid
    values +-127 and +-1 mixed with small ones and zeros, row scales at both edges of their
    binade, from the smallest (2^-100) to the largest (just below 2^100) the argument allows."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(-127, 128, (rows, k), generator=gen).float()
    g[:, ::7] = 127.0
    g[:, 1::7] = -127.0
    g[:, 2::11] = 1.0
    g[:, 3::13] = 0.0
    g[::5] = torch.where(torch.rand(g[::5].shape, generator=gen) < 0.5, 127.0, -127.0)  # all extreme
    exps = torch.randint(-100, 100, (rows, 1), generator=gen).float()
    top = torch.nextafter(torch.tensor(2.0), torch.tensor(0.0))  # just below the next binade
    mant = torch.where(torch.rand(rows, 1, generator=gen) < 0.5, torch.tensor(1.0), top)
    s = mant * torch.pow(2.0, exps)
    s[0] = w4a8._EXACT_MIN_SCALE
    s[1] = torch.nextafter(torch.tensor(w4a8._EXACT_MAX_SCALE), torch.tensor(0.0))
    return (g * s).to(torch.bfloat16), s


@pytest.mark.parametrize("size", [4, 16, 64, 256])
def test_w4a8_bf16_unrotation_sums_are_exact_in_f32(threads, size):
    """The F32 GEMM over any rows gives the exact product (checked against F64, where the
    same sums are exact too), so rounding it to BF16 is independent of blocks, kernel and
    threads -- and equals the BF16 GEMM over the whole layer (comfy-kitchen's call)."""
    k = 1024
    w, s = _adversarial_rows(96, k, seed=size)
    assert bool(((s.abs() < w4a8._EXACT_MAX_SCALE) & (s.abs() >= w4a8._EXACT_MIN_SCALE)).all())
    exact = rotate_weight(w.double(), size)
    for r0, r1 in ((0, 96), (0, 1), (1, 4), (4, 19), (19, 90), (90, 96)):
        f32 = rotate_weight(w[r0:r1].float(), size)
        assert torch.equal(f32.double(), exact[r0:r1]), (r0, r1)  # no rounding at all in F32
    whole_bf16 = rotate_weight(w, size)  # comfy-kitchen: the BF16 GEMM of the whole layer
    assert same_bits(whole_bf16, exact.float().to(torch.bfloat16))
    assert same_bits(rotate_weight(w.float(), size).to(torch.bfloat16), whole_bf16)


def test_w4a8_decodes_whole_where_the_argument_does_not_hold():
    """Correction, F16/F32 output, ConvRot blocks over 256, scales from 2^100 or NaN: the
    decode takes comfy-kitchen's whole-layer GEMM; the exact case streams in blocks."""
    codec = codecs.get("asym_w4a8_int8")
    w = weight("gauss", 8, 1024, torch.bfloat16)
    plain = codec.encode(w, codebook=False)
    env = codec.plan(plain, plain.marker).env
    assert not codec._whole_layer(env, torch.bfloat16, plain)
    assert codec._whole_layer(env, torch.float16, plain)
    assert codec._whole_layer(env, torch.float32, plain)
    asym = codec.encode(w, codebook=False, symmetric=False)
    assert codec._whole_layer(codec.plan(asym, asym.marker).env, torch.bfloat16, asym)
    big = codec.encode(w, codebook=False, convrot_groupsize=1024)
    assert codec._whole_layer(codec.plan(big, big.marker).env, torch.bfloat16, big)
    for bad in (2.0**100, float("inf"), float("nan"), 2.0**-101, 2.0**-130, 0.0):
        s = plain["weight_s_channel"].clone()
        s[3] = bad
        assert codec._whole_layer(env, torch.bfloat16, dict(plain, weight_s_channel=s)), bad


@pytest.mark.parametrize("scale", [2.0**110, 2.0**-135, 2.0**-120])
def test_extreme_scales_decode_like_kitchen(threads, scale):
    """A W4A8 layer whose row scales reach 2^100 and more (where a partial sum could overflow)
    or are tiny (subnormal values, which BF16 GEMMs flush) still decodes to comfy-kitchen's
    bits: it takes the whole-layer GEMM."""
    from comfy_kitchen.tensor.w4a8_int8 import dequantize_w4a8_int8_weight

    _w, _q, ref = _layer("w4a8_uniform", 40, 512, torch.bfloat16, seed=9)
    s = ref["weight_s_channel"].clone()
    s[::3] = scale
    ref = dict(ref, weight_s_channel=s)
    expected = dequantize_w4a8_int8_weight(
        ref["weight"], ref["weight_s_rel"], s, group_size=16, convrot_groupsize=256, output_dtype=torch.bfloat16
    )
    marker = markers_for("w4a8_uniform")[1]
    assert same_bits(codecs.get("asym_w4a8_int8").decode(ref, marker, dtype=torch.bfloat16), expected)


def test_hadamard_is_kitchens_operand():
    """The same values and the same transposed-view strides as comfy-kitchen's ``h.T``."""
    from comfy_kitchen.tensor.int8_utils import _build_hadamard

    for dtype in DTYPES.values():
        ours, theirs = hadamard(256, dtype).t(), _build_hadamard(256, dtype=dtype).T
        assert same_bits(ours.contiguous(), theirs.contiguous()) and ours.stride() == theirs.stride()


# -- AVX2-only ----------------------------------------------------------------------------------

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_the_same_on_an_avx2_only_cpu():
    """This file's decode, encode and forward tests for the tail shapes, and the INT8 GEMM
    tests of other files, with torch, MKL and oneDNN restricted to AVX2 (what an AVX2-only
    CPU runs) in a fresh process."""
    here = os.path.dirname(__file__)
    env = dict(os.environ, **AVX2_ENV)
    check = "import torch; assert torch.backends.cpu.get_cpu_capability() == 'AVX2', torch.backends.cpu.get_cpu_capability()"
    subprocess.run([sys.executable, "-c", check], env=env, check=True)
    me = os.path.join(here, os.path.basename(__file__))
    chosen = [
        "test_int8_convrot_decode_of_the_original_failure",
        "test_w4a8_bf16_unrotation_sums_are_exact_in_f32",
        "test_svdquant_decode_like_kitchen_at_any_row_count",
        "test_extreme_scales_decode_like_kitchen",
    ]
    chosen += [
        f"{test}[{threads}-{variant}-{shape}]"
        for test in (
            "test_rotated_formats_decode_like_kitchen_at_any_row_count",
            "test_rotated_formats_encode_like_kitchen_at_any_row_count",
        )
        for threads in ("1thread", "2threads")
        for variant, shape in (
            ("int8_convrot", "200-256"),
            ("w4a4", "17-1024"),
            ("w4a8_asym", "15-1024"),
            ("w4a8_uniform", "1031-256"),
            ("w6a8", "3-1024"),
        )
    ]
    chosen += [f"test_rotated_formats_run_like_kitchen[1thread-{variant}-17]" for variant in ROTATED]
    # The INT8 GEMMs: oneDNN's AVX2 kernel saturates pair sums in int16, so the runtime's
    # product is not the exact one there; the forward is comfy-kitchen's call all the same, in
    # any row blocks, and the quality report's products stay exact.
    others = [f"test_numerics.py::test_runtime_int8_matmul_is_kitchens_call[{shape}]" for shape in ("5-512-48", "17-250-333")]
    others += [
        f"test_numerics.py::test_int8_product_of_any_weight_rows_gives_those_columns_bit_for_bit[{r}]" for r in ("False", "True")
    ]
    others += [
        f"test_codecs_vs_kitchen.py::test_encode_decode_linear_bit_exact[{variant}-bf16-heavy]"
        for variant in ("int8_scalar", "int8_rowwise", "int8_convrot", "w4a8_codebook", "w6a8")
    ]
    others += [f"test_codecs_vs_kitchen.py::test_row_blocked_linear[{variant}]" for variant in ("int8_scalar", "w4a8_uniform")]
    others += [
        f"test_measure_blocks.py::test_measure_blocks_are_the_decode_and_the_forward[{variant}-bf16]"
        for variant in ("int8_rowwise", "w4a8_codebook")
    ]
    others += ["test_codecs_vs_kitchen.py::test_convrot_int8_of_a_finite_weight_whose_rotation_overflows_matches_kitchen"]
    tests = [f"{me}::{c}" for c in chosen] + [os.path.join(here, c) for c in others]
    args = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", *tests]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    expected = 2 * (1 + 4 + 3 + 3) + len(chosen) - 4 + len(others)  # the first four expand to 2 threads x their cases
    assert f"{expected} passed" in done.stdout, done.stdout[-500:]
    # On a CPU above AVX2 the restriction must reach oneDNN's int8 kernel, or this proves
    # nothing: its AVX2 kernel saturates pair sums, which the VNNI kernels never do. A CPU whose
    # own capability is AVX2 runs its own kernels in both processes: there is nothing to restrict
    # (on one such CPU, torch's INT8 GEMM was exact).
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        probe = (
            f"import sys; sys.path.insert(0, {here!r}); from kitchen_fixtures import int_mm_is_exact; print(int_mm_is_exact())"
        )
        exact = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert exact.stdout.strip() == "False"


@pytest.mark.parametrize("variant", ROTATED)
def test_inexact_decode_streams_every_layer_in_blocks(monkeypatch, variant):
    """``exact=False`` (quantize's error report) decodes rotated layers block by block too --
    no whole-layer GEMM, memory follows a block -- within one rounding step of the exact
    decode; the default stays comfy-kitchen's bits."""
    from comfyquant.formats.codec import Codec
    from comfyquant.numerics.floats import ulp_distance

    _w, q, ref = _layer(variant, 200, 256, torch.float16, seed=12)
    codec = codecs.get(VARIANTS[variant].format)
    marker = markers_for(variant)[1]
    exact = codec.decode(ref, marker, dtype=torch.float16)
    assert same_bits(exact, q.dequantize())

    def refuse(*args, **kwargs):
        raise AssertionError("decoded whole")

    monkeypatch.setattr(type(codec), "_decode_whole", refuse)
    monkeypatch.setattr(Codec, "_decode_whole", refuse)
    blocks = [b.clone() for b in codec.iter_decode(ref, marker, dtype=torch.float16, block_elements=64 * 256, exact=False)]
    assert [b.shape[0] for b in blocks] == [64, 64, 64, 8]
    assert ulp_distance(torch.cat(blocks), exact).max() <= 1
    with pytest.raises(AssertionError, match="decoded whole"):
        codec.decode(ref, marker, dtype=torch.float16)
