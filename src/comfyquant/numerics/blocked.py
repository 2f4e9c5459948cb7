"""The blocked ("swizzled", cuBLAS SWIZZLE_32_4_4) scale layout and its inverse (comfy-kitchen
0.2.40 ``float_utils.to_blocked``, ``from_blocked``).

A logical scale matrix ``S[R, Cs]`` (one byte per block) is zero-padded to
``Rp = 128*ceil(R/128)`` rows and ``Cp = 4*ceil(Cs/4)`` columns and stored as 512-byte tiles
of 128 rows x 4 columns, tile-row-major; inside a tile, row ``32*i + j`` and column ``c`` sit
at byte ``16*j + 4*i + c``.  The stored 2-D shape ``[Rp, Cp]`` is only that byte sequence
reshaped.  NVFP4 (FP8 scales per 1x16 block) and MXFP8 (E8M0 per 1x32) both use it.

This is the one implementation of the layout.  ``to_blocked`` and ``from_blocked``
take a torch tensor (the codecs) or a numpy array (``fix``, which runs without torch): both
are the same reshape and axis permutation (``TILE_PERM`` over the tile views below), so
the two cannot drift apart.  torch is imported only by ``padded_blocks``, which only the
codecs call.
"""

from __future__ import annotations

from typing import Any

TILE_PERM = (0, 3, 2, 1, 4)
"""Logical tile view ``[Rp/128, 4 (i), 32 (j), Cp/4, 4 (c)]`` <-> stored tile view
``[Rp/128, Cp/4, 32 (j), 4 (i), 4 (c)]``: axes 1 and 3 swap, so the permutation is its own
inverse and serves both directions."""


def ceil_to(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m``."""
    return -(-x // m) * m


def padded_blocks(x, block: int) -> tuple[Any, int, int]:
    """``x`` (a torch tensor) zero-padded to multiples of ``block`` in both axes and viewed as
    1 x ``block`` groups: ``([Rp, Cp/block, block], Rp, Cp)`` (NVFP4 and MXFP8 quantize this way)."""
    rows, cols = x.shape
    rp, cp = ceil_to(rows, block), ceil_to(cols, block)
    if (rp, cp) != (rows, cols):
        import torch

        x = torch.nn.functional.pad(x, (0, cp - cols, 0, rp - rows))
    return x.reshape(rp, cp // block, block), rp, cp


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """Stored shape of a blocked ``[rows, cols]`` scale matrix (padding included)."""
    return ceil_to(rows, 128), ceil_to(cols, 4)


def blocked_offset(r: int, c: int, cp: int) -> int:
    """Flat byte offset of logical entry ``(r, c)`` when the padded column count is ``cp``."""
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def _tiles(x, view: tuple[int, ...]):
    """``x`` viewed as ``view`` with ``TILE_PERM`` applied (torch ``permute`` or numpy ``transpose``)."""
    x = x.reshape(view)
    return x.permute(*TILE_PERM) if hasattr(x, "permute") else x.transpose(TILE_PERM)


def _zeros(like, shape: tuple[int, int]):
    if hasattr(like, "new_zeros"):
        return like.new_zeros(shape)
    import numpy as np

    return np.zeros(shape, dtype=like.dtype)


def to_blocked(scales):
    """Logical ``[R, Cs]`` scales -> stored ``[Rp, Cp]`` blocked layout (zero padded); a torch
    tensor or a numpy array, returned as the same kind."""
    rows, cols = scales.shape
    rp, cp = blocked_shape(rows, cols)
    padded = scales
    if (rp, cp) != (rows, cols):
        padded = _zeros(scales, (rp, cp))
        padded[:rows, :cols] = scales
    return _tiles(padded, (rp // 128, 4, 32, cp // 4, 4)).reshape(rp, cp)


def from_blocked(blocked, rows: int, cols: int):
    """Stored blocked scales -> logical ``[rows, cols]`` (padding dropped); a torch tensor or a
    numpy array (of ``Rp * Cp`` entries in any shape), returned as the same kind."""
    rp, cp = blocked_shape(rows, cols)
    numel = blocked.numel() if callable(getattr(blocked, "numel", None)) else blocked.size
    if numel != rp * cp:
        raise ValueError(f"blocked scales hold {numel} entries, [{rows}, {cols}] needs {rp * cp}")
    return _tiles(blocked, (rp // 128, cp // 4, 32, 4, 4)).reshape(rp, cp)[:rows, :cols]
