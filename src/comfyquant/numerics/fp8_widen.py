"""Per-tensor E4M3 -> BF16 decoding with the per-layer work done once per layer.

``fp8_decode_scaled`` checks every block for NaN codes
(two passes and a synchronisation) and moves the bits in four integer passes.  For a
per-tensor scale both can be cheaper: the NaN codes (0x7F, 0xFF) are looked for once per
layer, as the largest int8 (127) and the largest uint8 (255) byte, two read-only
reductions without temporaries; and the byte, read as int8, is sign-extended into the
int16 by the copy itself, so one shift left by 4 puts the sign in bit 15 (through the
extension) and the seven exponent-and-mantissa bits at bits 4-10, and a mask keeps those:
three passes (copy, shift, mask) instead of four, the same bits as
``e4m3_bf16_shifted`` (``value * 2^-120``).  Then one
multiply by ``2^120 * scale`` (exact scaling folded into the BF16 scale, one rounding)
gives ``q.to(bf16) * scale.to(bf16)`` bit for bit.  Every elementwise pass is a parallel
region whose barrier costs most when the cores are shared; per block this makes four
instead of seven, and no synchronisation.
"""

from __future__ import annotations

import torch

from .floats import E4M3, E4M3_BF16_SHIFT

_SIGN_AND_BITS = -30736  # 0x87F0 as int16: bit 15 and bits 4-10


def folded_scale(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, scan: bool = True) -> torch.Tensor | None:
    """The BF16 factor ``2^120 * bf16(scale)`` for ``widen_e4m3_scaled``, or None where
    that path does not apply: not E4M3 -> BF16, the folded factor overflows BF16, or (with
    ``scan``) ``q`` has NaN codes (their BF16 pattern differs).  Without ``scan`` the caller
    asks ``has_nan_codes`` of each block it widens instead."""
    if q.dtype != E4M3 or dtype != torch.bfloat16:
        return None
    folded = (scale.to(dtype).float() * E4M3_BF16_SHIFT).to(dtype)
    if not bool(torch.isfinite(folded).all()):
        return None
    if scan and has_nan_codes(q):
        return None
    return folded


def has_nan_codes(q: torch.Tensor) -> bool:
    """Whether E4M3 ``q`` holds a NaN code (0x7F, 0xFF): the largest int8 (127) or the largest
    uint8 (255) byte, two read-only reductions without temporaries.  Asked per row block
    right before the block is widened, the block is read from cache; asked once for the
    whole layer beforehand, a large layer was read from memory twice more before decoding
    (2 x 70 MB at 5120x13824) -- a cost per byte that a small layer, whose codes stay in
    cache, does not pay."""
    return bool(q.numel()) and (int(q.view(torch.int8).amax()) == 0x7F or int(q.view(torch.uint8).amax()) == 0xFF)


def widen_e4m3_scaled(q: torch.Tensor, folded: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``q.to(bf16) * scale.to(bf16)`` of E4M3 rows without NaN codes, ``folded`` from
    ``folded_scale``, written into ``out`` (BF16, ``q``'s shape) when given."""
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16)
    bits = out.view(torch.int16)
    bits.copy_(q.view(torch.int8))
    bits.bitwise_left_shift_(4).bitwise_and_(_SIGN_AND_BITS)
    return out.mul_(folded)
