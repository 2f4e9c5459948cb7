"""Assemble a whole-layer GEMM operand block by block.

Some decoders must multiply the whole layer in one float GEMM, on comfy-kitchen's operand
(its rounding may depend on the row count; see ``comfyquant.numerics.rows``).  The
operand itself is elementwise work per row -- dequantized values rounded to the GEMM's
dtype -- and computing it for the whole layer at once in F32 before the cast would hold an
F32 copy of the layer beside the operand (W4A8 with a correction, decoded to BF16: 283 MB
of F32 for a 5120x13824 layer, on top of the 141 MB operand).  Row by row the values are
the same bits (each row's arithmetic does not look at other rows), so the operand is
filled one cache-sized row block at a time and the GEMM then runs on the whole of it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .pages import empty_output
from .rows import row_ranges

OPERAND_BLOCK_ELEMENTS = 1 << 18
"""Rows per block of about this many elements: the block's F32 temporaries (1 MB) stay in a
core's L2 cache while they are computed and rounded."""


def assemble_rows(
    shape: tuple[int, int],
    dtype: torch.dtype,
    rows: Callable[[int, int], torch.Tensor],
    block_elements: int = OPERAND_BLOCK_ELEMENTS,
) -> torch.Tensor:
    """A new ``[N, K]`` tensor of ``dtype`` whose rows ``r0:r1`` are ``rows(r0, r1)`` (any
    dtype: the copy is the rounding), filled block by block."""
    return fill_rows(shape, dtype, lambda r0, r1, dest: dest.copy_(rows(r0, r1)), block_elements)


def fill_rows(
    shape: tuple[int, int],
    dtype: torch.dtype,
    fill: Callable[[int, int, torch.Tensor], object],
    block_elements: int = OPERAND_BLOCK_ELEMENTS,
) -> torch.Tensor:
    """A new ``[N, K]`` tensor of ``dtype`` (on huge pages when large) whose rows ``r0:r1``
    ``fill(r0, r1, dest)`` writes into ``dest`` (that ``[r1 - r0, K]`` view), block by
    block: an elementwise operand computed in place, with no layer-sized temporary and
    every block's passes in cache (a whole-layer F32 operand computed at once makes each
    of its passes a trip through memory, and its 4 KiB pages fault one by one)."""
    n, k = shape
    out = empty_output((n, k), dtype)
    for r0, r1 in row_ranges(n, k, block_elements, join_tail=False):
        fill(r0, r1, out[r0:r1])
    return out
