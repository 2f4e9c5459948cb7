"""The numeric building blocks against worked byte examples and comfy-kitchen 0.2.40.

Every block is checked twice: against the formats' definitions (bit layouts, worked byte
examples, tie rules) and, bit for bit, against comfy-kitchen 0.2.40's own helpers on random and edge
inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from comfy_kitchen.backends.eager import quantization as ck_q
from comfy_kitchen.backends.eager.w4a8_int8 import _FIXED_LUT, _assign_codes, _assign_grid, _grid_levels
from comfy_kitchen.float_utils import _f32_to_floatx_unpacked, e8m0_to_f32
from comfy_kitchen.float_utils import from_blocked as ck_from_blocked
from comfy_kitchen.float_utils import to_blocked as ck_to_blocked
from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_activation, _rotate_weight
from comfy_kitchen.tensor.w4a8_packed import _pack_codes, _unpack_codes

from comfyquant.numerics import blocked, floats, hadamard, int8, nearest, packing, rows
from comfyquant.numerics.dtypes import from_bytes, parse_float_dtype, to_bytes

DENSE = [torch.bfloat16, torch.float16, torch.float32]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# -- FP8 E4M3 / E5M2 -------------------------------------------------------------------------------


def e4m3_value(code: int) -> float:
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 15 and m == 7:
        return math.nan
    mag = 2.0**-6 * m / 8 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)
    return -mag if s else mag


def test_e4m3_decode_matches_bit_layout_for_all_256_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    got = floats.fp8_decode(codes, torch.float32).tolist()
    for c, v in enumerate(got):
        want = e4m3_value(c)
        assert (math.isnan(v) and math.isnan(want)) or v == want, hex(c)
    assert e4m3_value(0x7E) == 448.0 and e4m3_value(1) == 2.0**-9


@pytest.mark.parametrize("fp8", [floats.E4M3, floats.E5M2])
@pytest.mark.parametrize("dtype", DENSE)
def test_fp8_decode_equals_torch_cast_bit_for_bit(fp8, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[(codes & 0x7F) < (0x7F if fp8 == floats.E4M3 else 0x7C)].view(fp8)
    for q in (finite, codes.view(fp8), finite.repeat(1000).view(125, -1)):  # NaN codes use torch's cast
        assert bits_equal(floats.fp8_decode(q, dtype), q.to(dtype))
        out = torch.empty(q.shape, dtype=dtype)
        assert floats.fp8_decode(q, dtype, out) is out and bits_equal(out, q.to(dtype))


@pytest.mark.parametrize("scale", [3.7e-4, 1.0, 300.0, 2.0**-120, 0.0])
def test_fp8_decode_scaled_equals_cast_then_multiply(scale):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[(codes & 0x7F) != 0x7F].view(floats.E4M3)
    s = torch.tensor(scale)
    for q in (finite, codes.view(floats.E4M3)):
        want = q.to(torch.bfloat16) * s.to(torch.bfloat16)
        assert bits_equal(floats.fp8_decode_scaled(q, s, torch.bfloat16), want)
    blocks = finite.view(2, 127)
    per_row = torch.tensor([[2.0**-3], [2.0**9]])
    assert bits_equal(
        floats.fp8_decode_scaled(blocks, per_row, torch.bfloat16), blocks.to(torch.bfloat16) * per_row.to(torch.bfloat16)
    )


@pytest.mark.parametrize("fp8,limit", [(floats.E4M3, 448.0), (floats.E5M2, 57344.0)])
def test_fp8_encode_saturates_and_rounds_to_nearest_even(fp8, limit):
    x = torch.tensor([1e6, -1e6, limit, 2.0**-10 if fp8 == floats.E4M3 else 2.0**-17, 1.0625, 1.1875])
    q = floats.fp8_encode(x, fp8).float()
    assert q[0] == limit and q[1] == -limit and q[2] == limit
    assert q[3] == 0.0  # at or below half the smallest subnormal
    if fp8 == floats.E4M3:
        assert q[4] == 1.0 and q[5] == 1.25  # ties to the even mantissa


def test_fp8_neighbours_are_bit_pattern_steps_clamped_like_the_reference():
    q = torch.tensor([1, 0x38, 0x7E], dtype=torch.uint8).view(floats.E4M3)
    lower, upper = floats.fp8_neighbours(q)
    assert lower.view(torch.uint8).tolist() == [1, 0x37, 0x7D]
    assert upper.view(torch.uint8).tolist() == [2, 0x39, 0x7E]


# -- FP4 E2M1 --------------------------------------------------------------------------------------


def test_e2m1_ties_follow_the_spec_table():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, 6.0, -6.0, 0.0, -0.0, 0.2500001])
    got = floats.e2m1_encode(x).tolist()
    assert got == [0, 2, 2, 4, 4, 6, 6, 0x8, 7, 0xF, 0, 0x8, 1]
    assert floats.e2m1_decode(torch.tensor([9, 1, 7, 15])).tolist() == [-0.5, 0.5, 6.0, -6.0]


def test_e2m1_encode_is_bit_exact_with_kitchen_on_a_dense_sweep():
    x = torch.cat([torch.linspace(-6, 6, 120001), torch.tensor(floats.E2M1_VALUES)])
    x = torch.cat([x, torch.nextafter(x, torch.full_like(x, 9)), torch.nextafter(x, torch.full_like(x, -9))])
    x = x.clamp(-6, 6).contiguous()
    assert torch.equal(floats.e2m1_encode(x), _f32_to_floatx_unpacked(x, 2, 1))


def test_e2m1_encode_counts_decision_points_for_every_value():
    """The comparison-count encoder equals a binary search over the decision points
    (``torch.bucketize``) for every BF16 value, for 10,000 F32 neighbours of each decision
    point, for values past the saturation point, and for NaN of either sign (code 7 | sign)."""
    bounds = floats._E2M1_BOUNDS

    def reference(x):
        return torch.bucketize(x.abs(), bounds).to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)

    every_bf16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    near = [
        (b.view(torch.int32) + torch.arange(-5000, 5000, dtype=torch.int32)).view(torch.float32) for b in bounds.reshape(-1, 1)
    ]
    x = torch.cat([every_bf16, *near, -torch.cat(near), torch.tensor([float("nan"), -float("nan"), 7.5, -1e30])])
    assert torch.equal(floats.e2m1_encode(x), reference(x))
    assert floats.e2m1_encode(torch.tensor([float("nan"), -float("nan")])).tolist() == [7, 15]


# -- E8M0 ------------------------------------------------------------------------------------------


def test_e8m0_decode_special_cases_and_kitchen():
    e = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = floats.e8m0_decode(e)
    assert got[0] == 0.0 and got[127] == 1.0 and got[128] == 2.0 and math.isinf(got[255])
    assert got[1] == 2.0**-126
    assert bits_equal(got, e8m0_to_f32(e))
    assert bits_equal(floats.e8m0_decode(e.view(torch.float8_e8m0fnu)), got)


def test_e8m0_exponent_fits_the_block_and_matches_kitchen():
    torch.manual_seed(0)
    x = torch.cat([torch.randn(64, 256) * 10.0 ** torch.randint(-30, 6, (64, 1)), torch.zeros(1, 256)]).to(torch.bfloat16)
    amax = x.view(65, 8, 32).abs().amax(-1)
    e = floats.e8m0_from_amax(amax)
    nonzero = amax.float() > 0
    assert (floats.e8m0_decode(e)[nonzero] * 448.0 >= amax.float()[nonzero]).all()
    assert (e[~nonzero] == 0).all()
    _, ck_scales = ck_q.quantize_mxfp8(x, pad_32x=True)
    assert torch.equal(blocked.from_blocked(ck_scales.view(torch.uint8), 96, 8)[:65], e)


# -- BF16 / F16 ------------------------------------------------------------------------------------


def bf16_rne_bits(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even F32 -> BF16 on the raw bits (finite inputs)."""
    b = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (b >> 16) & 1
    return ((b + 0x7FFF + lsb) >> 16).to(torch.int32).to(torch.int16)


def test_bf16_rounding_is_round_to_nearest_even():
    torch.manual_seed(0)
    x = torch.randn(100000) * 10.0 ** torch.randint(-20, 20, (100000,))
    halfway = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8)])  # exact ties
    x = torch.cat([x, halfway])
    assert torch.equal(floats.float_bits(floats.round_to(x, torch.bfloat16)), bf16_rne_bits(x))
    assert floats.round_to(halfway, torch.bfloat16).tolist() == [1.0, 1.015625, -1.0]


def test_float_bits_round_trip_and_ulp_distance():
    x = torch.tensor([1.0, -2.5, 0.0, -0.0], dtype=torch.float16)
    assert bits_equal(floats.from_bits(floats.float_bits(x), torch.float16), x)
    a = torch.tensor([1.0, 0.0, -0.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, 0.0, 0.0, 1.0], dtype=torch.bfloat16)  # 1 + 2^-7 is the next BF16
    assert floats.ulp_distance(a, b).tolist() == [1, 0, 0, 0]
    tiny = torch.tensor([2.0**-133], dtype=torch.bfloat16)
    assert floats.ulp_distance(tiny, -tiny).item() == 2


def test_bytes_round_trip_without_copy():
    t = torch.randn(3, 5).to(torch.bfloat16)
    data = bytes(to_bytes(t))
    back = from_bytes(data, "BF16", (3, 5))
    assert bits_equal(back, t)
    assert from_bytes(b"", "F32", (0, 4)).shape == (0, 4)
    assert parse_float_dtype("f16") == torch.float16
    with pytest.raises(ValueError, match="bf16, f16 or f32"):
        parse_float_dtype("int8")


# -- packing ---------------------------------------------------------------------------------------


def test_spec_byte_examples():
    lnf = packing.pack_nibbles(torch.tensor([[3, 12, 0, 15]]), packing.LNF)
    assert lnf.tolist() == [[0xC3, 0xF0]] and lnf.view(torch.int8).tolist() == [[-61, -16]]
    hnf = packing.pack_nibbles(floats.e2m1_encode(torch.tensor([[1.0, -6.0]])), packing.HNF)
    assert hnf.tolist() == [[0x2F]]
    w4a4 = packing.pack_nibbles(torch.tensor([[-7, 3]]), packing.LNF)
    assert w4a4.tolist() == [[0x39]]
    codes = torch.tensor([[33, 1, 63, 32] + [32] * 28])
    row = packing.pack_6bit(codes)
    assert row.shape == (1, 24)
    assert row[0, :2].tolist() == [0x11, 0x0F] and row[0, 16].item() == 0xB2
    assert packing.unpack_nibbles(torch.tensor([[0x37, 0x83]], dtype=torch.uint8).view(torch.int8)).tolist() == [[7, 3, 3, 8]]


@pytest.mark.parametrize("order", [packing.LNF, packing.HNF])
def test_nibbles_round_trip_and_pair_table(order):
    torch.manual_seed(1)
    codes = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    packed = packing.pack_nibbles(codes, order)
    assert torch.equal(packing.unpack_nibbles(packed.view(torch.int8), order), codes)
    values = torch.randn(16)
    assert torch.equal(packing.lookup_pairs(packed, packing.pair_table(values, order)), values[codes.long()])
    assert packing.to_signed(torch.tensor([0, 7, 8, 15])).tolist() == [0, 7, -8, -1]


@pytest.mark.parametrize("bits", [4, 6])
def test_w4a8_packing_matches_kitchen(bits):
    torch.manual_seed(2)
    codes = torch.randint(0, 1 << bits, (5, 64), dtype=torch.int32)
    mine = packing.pack_6bit(codes) if bits == 6 else packing.pack_nibbles(codes)
    assert torch.equal(mine.view(torch.int8), _pack_codes(codes, bits))
    back = packing.unpack_6bit(mine, 64) if bits == 6 else packing.unpack_nibbles(mine)
    assert torch.equal(back.to(torch.int32), _unpack_codes(mine.view(torch.int8), 64, bits))


# -- blocked layout --------------------------------------------------------------------------------


def test_blocked_offsets_of_the_worked_example():
    cp = blocked.blocked_shape(32, 16)[1]
    assert blocked.blocked_shape(32, 16) == (128, 16)
    assert [blocked.blocked_offset(r, c, cp) for r, c in [(0, 0), (1, 0), (32, 0), (0, 1), (0, 4)]] == [0, 16, 4, 1, 512]
    assert blocked.blocked_shape(32, 3) == (128, 4)  # N=20, K=40 -> 32 rows, 3 blocks


@pytest.mark.parametrize("rows,cols", [(32, 16), (20, 3), (128, 4), (300, 13), (1, 1), (257, 64)])
def test_blocked_round_trip_padding_and_kitchen(rows, cols):
    s = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    b = blocked.to_blocked(s)
    assert b.shape == blocked.blocked_shape(rows, cols)
    assert torch.equal(b, ck_to_blocked(s, flatten=False))
    assert torch.equal(blocked.from_blocked(b, rows, cols), s)
    assert torch.equal(ck_from_blocked(b, rows, cols), s)
    flat = b.reshape(-1)
    assert all(flat[blocked.blocked_offset(r, c, b.shape[1])] == s[r, c] for r in range(0, rows, 11) for c in range(cols))
    assert int(b.sum()) == int(s.to(torch.int64).sum())  # padding is zero bytes
    with pytest.raises(ValueError, match="blocked scales"):
        blocked.from_blocked(b[:-1], rows, cols)


# -- Hadamard --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 16, 64, 256, 1024])
def test_regular_hadamard_properties(size):
    h = hadamard.hadamard(size, torch.float64)
    k = (size.bit_length() - 1) // 2
    assert torch.equal(h, h.t())
    assert torch.allclose(h @ h, torch.eye(size, dtype=torch.float64))
    assert set(h.unique().tolist()) == {-(2.0**-k), 2.0**-k}
    assert torch.allclose(h.sum(dim=1), torch.ones(size, dtype=torch.float64))
    assert h[0].min() < 0  # not the Sylvester matrix, whose first row is all ones
    i, j = 3, 12 % size
    sign = 1
    for d in range(k):
        if ((i >> 2 * d) & 3) + ((j >> 2 * d) & 3) == 3:
            sign = -sign
    assert h[i, j] == sign * 2.0**-k
    for dtype in DENSE:
        assert bits_equal(hadamard.hadamard(size, dtype), _build_hadamard(size, dtype=dtype))


@pytest.mark.parametrize("size", [2, 8, 32, 128, 512, 0, 3])
def test_non_powers_of_four_are_refused(size):
    with pytest.raises(ValueError, match=f"Regular Hadamard size must be a power of 4, got {size}"):
        hadamard.hadamard(size)


@pytest.mark.parametrize("dtype", DENSE)
@pytest.mark.parametrize("size", [16, 64, 256])
def test_rotations_are_bit_exact_with_kitchen_and_self_inverse(dtype, size):
    torch.manual_seed(3)
    w = (torch.randn(40, 512) * 0.02).to(dtype)
    h = _build_hadamard(size, dtype=dtype)
    assert bits_equal(hadamard.rotate_weight(w, size), _rotate_weight(w, h, size))
    x = torch.randn(3, 5, 512).to(dtype)
    assert bits_equal(hadamard.rotate_activation(x, size), _rotate_activation(x, h, size))
    w64 = w.double()
    assert torch.allclose(hadamard.rotate_weight(hadamard.rotate_weight(w64, size), size), w64)
    # Any row count is comfy-kitchen's call on those rows (the same GEMM, the same bits on any
    # CPU).  Row blocks of one layer need not round like the whole: on AVX2 an F32 GEMM over 8
    # rows differs from one over 40 -- which is why a decoder that must match un-rotates whole.
    parts = torch.cat([hadamard.rotate_weight(w[r : r + 8], size) for r in range(0, 40, 8)])
    assert bits_equal(parts, torch.cat([_rotate_weight(w[r : r + 8], h, size) for r in range(0, 40, 8)]))
    with pytest.raises(ValueError, match="not divisible"):
        hadamard.rotate_weight(w[:, :500], size)


# -- dynamic INT8 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DENSE)
def test_rowwise_int8_matches_kitchen(dtype):
    torch.manual_seed(4)
    x = (torch.randn(9, 256) * 3).to(dtype)
    x[2] = 0  # a zero row: scale 1e-30, which rounds to 0 in BF16/F16 -> smallest normal
    q, s = int8.quantize_rows(x)
    q_ck, s_ck = ck_q.quantize_int8_rowwise(x)
    assert torch.equal(q, q_ck) and bits_equal(s, s_ck)
    assert (q[2] == 0).all()


@pytest.mark.parametrize("dtype", DENSE)
@pytest.mark.parametrize("per_row", [False, True])
def test_int8_linear_matches_kitchen(dtype, per_row):
    torch.manual_seed(5)
    w = torch.randint(-127, 128, (24, 256), dtype=torch.int8)
    ws = torch.rand(24, 1) * 1e-3 if per_row else torch.tensor(1e-3)
    x = torch.randn(2, 7, 256).to(dtype)
    b = torch.randn(24).to(dtype)
    mine = int8.int8_linear(x, w, ws, b, dtype)
    ref = ck_q.int8_linear(x, w, ws, b, dtype)
    assert bits_equal(mine, ref)


def test_int8_matmul_is_exact_like_an_int32_accumulation():
    gen = torch.Generator().manual_seed(9)
    a = torch.randint(-128, 128, (16, 12288), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (300, 12288), generator=gen, dtype=torch.int8)
    a[0], b[0], b[1] = -128, -128, 127  # the largest sums: +-2^14 * K
    exact = (a.long() @ b.long().t()).to(torch.int32)  # (torch._int_mm is exact only on VNNI CPUs)
    assert torch.equal(int8.int8_matmul(a, b), exact)


@pytest.mark.parametrize("m,k,n", [(5, 512, 48), (1, 3, 5), (17, 250, 333), (7, 1031, 9)])
def test_runtime_int8_matmul_is_kitchens_call(m, k, n):
    """The runtime's INT8 GEMM is comfy-kitchen's CPU call (K and N padded to multiples of 8,
    ``torch._int_mm``): the same bits on any CPU -- including those whose oneDNN kernel
    saturates pair sums in int16 (AVX2 without VNNI), where it is not the exact product."""
    gen = torch.Generator().manual_seed(m * k + n)
    a = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    a[0, :2], b[0, :2] = 127, 127  # a pair sum beyond int16 (saturates where the kernel does)
    assert torch.equal(int8.runtime_int8_matmul(a, b), ck_q.mm_int8(a, b.T.contiguous()))
    assert int8.runtime_int8_matmul(a, b).dtype == torch.int32


@pytest.mark.parametrize("runtime", [False, True])
def test_int8_product_of_any_weight_rows_gives_those_columns_bit_for_bit(runtime):
    """Exact products, and the runtime's call (shown here, and on AVX2 in a subprocess by
    test_bit_exact_on_every_cpu: its saturation depends on the operands, not on the rows asked)."""
    torch.manual_seed(8)
    w = torch.randint(-127, 128, (200, 256), dtype=torch.int8)
    ws = torch.rand(200, 1) * 1e-3
    x = torch.randn(5, 256).to(torch.bfloat16)
    b = torch.randn(200).to(torch.bfloat16)
    whole = int8.int8_linear(x, w, ws, b, torch.bfloat16, runtime=runtime)
    q_x, s_x = int8.quantize_rows(x)
    for r0, r1 in rows.row_ranges(200, 256, 64 * 256):
        part = int8.int8_product(q_x, s_x, w[r0:r1], ws[r0:r1], b[r0:r1], torch.bfloat16, runtime)
        assert bits_equal(part, whole[:, r0:r1])


# -- row blocking ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,k,block,multiple",
    [
        (200, 256, 64 * 256, 1),
        (1000, 768, 1 << 20, 1),
        (97, 1024, 1 << 16, 1),
        (65, 1 << 16, 1 << 20, 1),
        (5, 256, 1 << 20, 1),
        (333, 512, 100 * 512, 32),
        (130, 512, 64 * 512, 16),
        (1, 8, 64, 1),
        (100, 12288, 1 << 18, 1),
    ],
)
def test_row_ranges_cover_every_row_once_in_blocks_never_small(n, k, block, multiple):
    ranges = rows.row_ranges(n, k, block, multiple)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(r0 % multiple == 0 for r0, _ in ranges)
    least = rows.min_rows(k)
    assert least >= rows.MIN_BLOCK_ROWS and least * k >= rows.MIN_BLOCK_ELEMENTS
    nominal = -(-max(least, block // k) // multiple) * multiple
    assert all(r1 - r0 == nominal for r0, r1 in ranges[:-1])
    last = ranges[-1][1] - ranges[-1][0]
    assert last == n if len(ranges) == 1 else least <= last < nominal + least
    plain = rows.row_ranges(n, k, block, multiple, join_tail=False)  # decoding: nominal blocks, any tail
    assert [r0 for r0, _ in plain] == list(range(0, n, nominal))


def test_gather_rows_fills_preallocated_outputs_with_a_padded_last_block():
    w = torch.arange(130 * 32, dtype=torch.float32).view(130, 32)

    def fn(block):  # padded to 16 rows like NVFP4, and a second, per-row output
        pad = -block.shape[0] % 16
        return torch.nn.functional.pad(block, (0, 0, 0, pad)) * 2, block.sum(-1)

    doubled, sums = rows.gather_rows(rows.row_blocks(w, 64 * 32, multiple=16), fn, 144)
    assert doubled.shape == (144, 32) and sums.shape == (144,)
    assert torch.equal(doubled[:130], w * 2) and not doubled[130:].any()
    assert torch.equal(sums[:130], w.sum(-1))


def test_row_source_reads_blocks_and_selected_rows():
    w = torch.randn(100, 8)
    seen = []
    source = rows.RowSource((100, 8), w.dtype, lambda r0, r1: seen.append((r0, r1)) or w[r0:r1])
    assert [(r0, r1) for r0, r1, _ in rows.row_blocks(source, 64 * 8)] == [(0, 100)]
    assert seen == [(0, 100)]
    assert torch.equal(source.select(torch.tensor([3, 97, 3])), w[[3, 97, 3]])
    assert rows.as_source(w).rows(5, 9).data_ptr() == w[5:9].data_ptr()  # a tensor's rows are views
    rows.release_memory()  # glibc's malloc_trim, or nothing elsewhere


# -- nearest-level assignment -----------------------------------------------------------------


def test_codebook_assignment_equals_kitchen_including_ties():
    torch.manual_seed(6)
    cb = torch.tensor(_FIXED_LUT)
    mids = (cb[1:] + cb[:-1]) / 2
    eps = torch.finfo(torch.float32).eps
    near = torch.cat([mids + k * eps * mids.abs() for k in range(-3, 4)])
    t = torch.cat([torch.rand(200000) * 2.4 - 1.2, near, cb, torch.tensor([0.0, -0.0, 1e-30, -5.0, 5.0])])
    assert torch.equal(nearest.nearest(cb, t), _assign_codes(t, cb).long())
    unsorted = cb.flip(0)
    assert nearest.table_thresholds(unsorted) is None  # falls back to the reference's search
    assert torch.equal(nearest.nearest(unsorted, t), _assign_codes(t, unsorted).long())


@pytest.mark.parametrize("levels", [16, 63])
def test_grid_assignment_equals_kitchen(levels):
    torch.manual_seed(7)
    table = torch.tensor(_FIXED_LUT) if levels == 16 else torch.arange(-31, 32, dtype=torch.float32)
    n, groups, g = 64, 16, 16
    gw = torch.randn(n, groups, g) * 0.02
    s_ch = gw.abs().amax(dim=(1, 2)) / 127 * (torch.rand(n) + 0.5)
    s_rel = (torch.rand(n, groups) * (2.0 if levels == 16 else 0.4) + 0.05).to(floats.E4M3)
    target = gw / s_ch.view(-1, 1, 1)
    target[:, :, 0] = 0.5
    target[:, :, 1] = -2.5
    lv = _grid_levels(table, s_rel)
    ref = _assign_grid(gw, lv, s_ch, target=target).long()
    assert torch.equal(nearest.grid_nearest(lv.reshape(n * groups, -1), target.reshape(n * groups, g)).view(n, groups, g), ref)
    _, cuts = nearest.grid_by_code(table)
    coded = nearest.grid_nearest_by_code(cuts, s_rel.view(torch.uint8), target.reshape(n * groups, g))
    assert torch.equal(coded.view(n, groups, g), ref)
