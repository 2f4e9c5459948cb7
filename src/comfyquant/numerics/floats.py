"""Small float formats: FP8 E4M3/E5M2, FP4 E2M1, E8M0, and BF16/F16 rounding (comfy-kitchen
0.2.40 ``float_utils.py``).

Every encoder rounds to nearest with ties to even and saturates, which is what
comfy-kitchen's quantizers do (they clamp before torch's casts).  Decoders follow
comfy-kitchen where it differs from OCP: E8M0 byte 0 decodes to 0.0, not 2^-127.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
FP8_MAX: dict[torch.dtype, float] = {E4M3: 448.0, E5M2: 57344.0}
"""Largest finite value of each FP8 format: encoders saturate to it."""
E4M3_MAX_BITS = 0x7E
"""Bit pattern of +448; 0x7F is NaN in E4M3FN, so bit-pattern neighbours stop here."""

E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitude of each 3-bit E2M1 code; bit 3 is the sign."""

E8M0_BIAS = 127


# -- FP8 --------------------------------------------------------------------------------------


def fp8_encode(x: torch.Tensor, fp8: torch.dtype = E4M3) -> torch.Tensor:
    """Saturate to the format's range in ``x``'s dtype, then round to nearest even."""
    lim = FP8_MAX[fp8]
    return x.clamp(-lim, lim).to(fp8)


E4M3_BF16_SHIFT = 2.0**120
"""``e4m3_bf16_shifted`` returns values scaled by 2^-120; multiply by this to undo it."""


def e4m3_bf16_shifted(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """E4M3 values times 2^-120 as BF16, exactly, by moving the bits: None if NaN codes occur.

    The 7 exponent-and-mantissa bits of an E4M3 code, placed at bits 4-10 of a BF16 with the
    sign at bit 15, encode ``value * 2^-120``; E4M3 subnormals become BF16 subnormals, again
    ``value * 2^-120``.  Four in-place 16-bit integer passes (shift left 8, arithmetic shift
    right 4, mask) replace torch's element-by-element FP8 cast; a following multiply by
    ``2^120 * s`` (exact scaling, one rounding) gives the same bits as ``q.to(bf16) * s``."""
    u = q.view(torch.uint8)
    if u.numel() and int((u & 0x7F).amax()) == 0x7F:
        return None
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16)
    b = out.view(torch.int16)
    b.copy_(u)
    b.bitwise_left_shift_(8).bitwise_right_shift_(4).bitwise_and_(-30736)  # 0x87F0: sign | bits 4-10
    return out


def fp8_decode(q: torch.Tensor, dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """FP8 values widened to ``dtype``: the same bits as ``q.to(dtype)``, optionally into ``out``
    (E4M3 -> BF16 through ``e4m3_bf16_shifted``, everything else by torch's cast)."""
    if q.dtype == E4M3 and dtype == torch.bfloat16:
        w = e4m3_bf16_shifted(q, out)
        if w is not None:
            return w.mul_(E4M3_BF16_SHIFT)
    return q.to(dtype) if out is None else out.copy_(q)


def fp8_decode_scaled(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``fp8(q).to(dtype) * scale.to(dtype)`` (``scale`` broadcastable), bit for bit, in one
    multiply when the shift can be folded into the scale without overflowing BF16."""
    s = scale.to(dtype)
    if q.dtype == E4M3 and dtype == torch.bfloat16:
        folded = (s.float() * E4M3_BF16_SHIFT).to(dtype)
        if bool(torch.isfinite(folded).all()):
            w = e4m3_bf16_shifted(q, out)
            if w is not None:
                return w.mul_(folded)
    return fp8_decode(q, dtype, out).mul_(s)


def fp8_neighbours(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next smaller and next larger positive E4M3 values by bit pattern (the FP8 scale
    search of comfy-kitchen 0.2.40 ``_search_group_scale``).

    ``raw - 1`` stops at 1 (the smallest subnormal) and ``raw + 1`` at 0x7E (448)."""
    raw = q.view(torch.uint8)
    lower = (raw - 1).clamp_(min=1).view(E4M3)
    upper = (raw + 1).clamp_(max=E4M3_MAX_BITS).view(E4M3)
    return lower, upper


# -- FP4 E2M1 ---------------------------------------------------------------------------------


def _e2m1_bounds() -> torch.Tensor:
    # Decision points between neighbouring magnitudes.  A tie goes to the even code: at
    # 0.25, 1.25, 2.5 and 5.0 the lower code is even (keep "> bound"); at 0.75, 1.75 and 3.5
    # the upper one is, so the bound moves one float down ("> previous float" == ">= bound").
    down = torch.tensor([0.75, 1.75, 3.5], dtype=torch.float32)
    lo = torch.nextafter(down, torch.zeros_like(down)).tolist()
    return torch.tensor([0.25, lo[0], 1.25, lo[1], 2.5, lo[2], 5.0], dtype=torch.float32)


_E2M1_BOUNDS = _e2m1_bounds()
_E2M1_POINTS = _E2M1_BOUNDS.tolist()
_E2M1_LUTS: dict[torch.dtype, torch.Tensor] = {}


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """F32 values -> E2M1 codes (uint8, 0..15), saturating at +-6.

    The sign bit is copied from the input even when the magnitude rounds to zero, so -0.25
    encodes as 0x8 (comfy-kitchen 0.2.40 ``float_utils._f32_to_floatx_unpacked``)."""
    a = x.abs()
    # The magnitude code is the number of decision points below |x| (what bucketize gives),
    # counted as 7 minus the points at or above it: seven byte-wide comparisons cost a fifth
    # of torch's binary search, and NaN, below no point, still gets code 7 as with bucketize.
    at_or_above = torch.le(a, _E2M1_POINTS[0]).view(torch.uint8)
    for point in _E2M1_POINTS[1:]:
        at_or_above.add_(torch.le(a, point).view(torch.uint8))
    return torch.sub(7, at_or_above).bitwise_or_(torch.signbit(x).view(torch.uint8) << 3)


def e2m1_table(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 decoded values of the E2M1 codes in ``dtype`` (code 8 is -0.0)."""
    lut = _E2M1_LUTS.get(dtype)
    if lut is None:
        vals = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
        lut = _E2M1_LUTS[dtype] = torch.tensor(vals, dtype=torch.float32).to(dtype)
    return lut


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E2M1 codes (any integer dtype, 0..15) -> values in ``dtype``."""
    return e2m1_table(dtype)[codes.long()]


# -- E8M0 -------------------------------------------------------------------------------------


def e8m0_from_amax(amax: torch.Tensor, fp8_max: float = 448.0) -> torch.Tensor:
    """MXFP8 block exponent (uint8) for block maxima ``amax`` (comfy-kitchen 0.2.40's rule in
    ``quantize_mxfp8``).

    ``e = clamp(ceil(log2(max(amax / 448, 2^-127))) + 127, 0, 254)``, and 0 for all-zero
    blocks.  ``log2`` is torch's F32 log2, whose rounding decides the exponent of maxima just
    above a power of two, exactly as in the reference."""
    need = (amax.float() / fp8_max).clamp(min=2.0**-127)
    e = (torch.ceil(torch.log2(need)).to(torch.int32) + E8M0_BIAS).clamp_(0, 254).to(torch.uint8)
    return torch.where(amax == 0, torch.zeros_like(e), e)


def e8m0_decode(e: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8 or float8_e8m0fnu) -> F32: 2^(e-127), 0 for e=0, +inf for e=255.

    Placing the byte in the F32 exponent field gives all three cases at once."""
    if e.dtype != torch.uint8:
        e = e.view(torch.uint8)
    return (e.to(torch.int32) << 23).view(torch.float32)


# -- BF16 / F16 -------------------------------------------------------------------------------

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to ``dtype`` with ties to even (torch's casts do exactly this)."""
    return x.to(dtype)


def float_bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a float tensor as signed integers of the same width."""
    return x.view(_BITS[x.dtype])


def from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float tensor of ``dtype`` from raw bit patterns (e.g. BF16 from int16/uint16)."""
    return bits.view(_BITS[dtype] if bits.dtype.is_signed else bits.dtype).view(dtype)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two tensors of the same float dtype (int64).

    Maps each bit pattern to a monotone integer line, so +0 and -0 are 0 apart and adjacent
    floats across zero are 1 apart.  NaN compares as its bit pattern."""
    if a.dtype != b.dtype:
        raise ValueError(f"ulp_distance needs equal dtypes, got {a.dtype} and {b.dtype}")

    def line(t: torch.Tensor) -> torch.Tensor:
        i = float_bits(t).to(torch.int64)
        width = t.element_size() * 8
        sign = torch.tensor(1 << (width - 1), dtype=torch.int64)
        mag = i & (sign - 1)
        return torch.where(i < 0, -mag, mag)

    return (line(a) - line(b)).abs()
