"""The blocked ("swizzled", cuBLAS SWIZZLE_32_4_4) scale layout and its inverse (spec 2.4).

A logical scale matrix ``S[R, Cs]`` (one byte per block) is zero-padded to
``Rp = 128*ceil(R/128)`` rows and ``Cp = 4*ceil(Cs/4)`` columns and stored as 512-byte tiles
of 128 rows x 4 columns, tile-row-major; inside a tile, row ``32*i + j`` and column ``c`` sit
at byte ``16*j + 4*i + c``.  The stored 2-D shape ``[Rp, Cp]`` is only that byte sequence
reshaped.  NVFP4 (FP8 scales per 1x16 block) and MXFP8 (E8M0 per 1x32) both use it.
"""

from __future__ import annotations

import torch


def ceil_to(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m``."""
    return -(-x // m) * m


def padded_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int, int]:
    """``x`` zero-padded to multiples of ``block`` in both axes and viewed as 1 x ``block``
    groups: ``([Rp, Cp/block, block], Rp, Cp)`` (NVFP4 and MXFP8 quantize this way)."""
    rows, cols = x.shape
    rp, cp = ceil_to(rows, block), ceil_to(cols, block)
    if (rp, cp) != (rows, cols):
        x = torch.nn.functional.pad(x, (0, cp - cols, 0, rp - rows))
    return x.reshape(rp, cp // block, block), rp, cp


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """Stored shape of a blocked ``[rows, cols]`` scale matrix (padding included)."""
    return ceil_to(rows, 128), ceil_to(cols, 4)


def blocked_offset(r: int, c: int, cp: int) -> int:
    """Flat byte offset of logical entry ``(r, c)`` when the padded column count is ``cp``."""
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Logical ``[R, Cs]`` scales -> stored ``[Rp, Cp]`` blocked layout (zero padded)."""
    rows, cols = scales.shape
    rp, cp = blocked_shape(rows, cols)
    padded = scales
    if (rp, cp) != (rows, cols):
        padded = scales.new_zeros((rp, cp))
        padded[:rows, :cols] = scales
    # [tile_r, 4 (i), 32 (j), tile_c, 4 (c)] -> [tile_r, tile_c, j, i, c]
    tiles = padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, cp)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Stored blocked scales -> logical ``[rows, cols]`` (padding dropped)."""
    rp, cp = blocked_shape(rows, cols)
    if blocked.numel() != rp * cp:
        raise ValueError(f"blocked scales hold {blocked.numel()} entries, [{rows}, {cols}] needs {rp * cp}")
    tiles = blocked.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, cp)[:rows, :cols]
