"""nunchaku's MMA tile layouts, undone: the byte permutations to Comfy's row-major layouts.

nunchaku (and deepcompressor, whose packer it copies: ``nunchaku/lora/flux/packer.py``,
``deepcompressor/backend/nunchaku/utils.py``) stores every SVDQuant tensor in the order its
CUDA kernels read it: the 4-bit weight in 128 x 64 tiles of 32-bit words per MMA lane, the
group scales, bias and smoothing factors per warp lane, the low-rank factors in 16 x 16 packs.
AWQ W4A16 layers use TinyChat's ``pack_w4`` (four rows interleaved, 32 k per 16-bit word).
Each function here takes the raw little-endian bytes of one stored tensor and returns the
bytes of the same numbers in Comfy's natural layout (comfy-kitchen ``svdquant_w4a4`` /
``awq_w4a16``: row-major, two 4-bit codes per byte, the even column in the low nibble).
They move elements only (AWQ also re-pairs nibbles): nothing is rounded.

The axis bookkeeping is derived from the published packers' reshapes and permutes; the
tests re-state those packers in torch and check the round trip bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

TILE_N = 128
"""Rows per weight tile (``warp_n``); scales, bias and smoothing are permuted per 128 too."""
TILE_K = 64
"""Columns per weight tile (``mem_k`` for 4 bits); the packer asserts K % 128 (two unrolled tiles)."""
PACK = 16
"""Rows and columns of one low-rank pack (``n_pack_size * num_n_lanes``, ``k_pack_size * num_k_lanes * 2``)."""


def svdq_weight_fits(n: int, k: int) -> str:
    """Why a qweight of ``n`` rows and ``k`` columns is not one nunchaku's packer writes ("" if it is)."""
    if n % TILE_N:
        return f"N={n} is not a multiple of {TILE_N} (nunchaku pads N to whole 128-row tiles)"
    if k % (2 * TILE_K):
        return f"K={k} is not a multiple of {2 * TILE_K} (nunchaku pads K to two 64-column tiles)"
    return ""


def svdq_weight(data: bytes, n: int, k: int) -> bytes:
    """qweight I8 ``[N, K/2]`` in MMA tile order -> row-major int4 pairs (low nibble = even k).

    The packer views the codes as ``n = ((t*8 + p)*2 + s)*8 + l`` and ``k = kt*64 + kp*32 +
    kl*8 + r`` and stores 32-bit words (r = 0..7 in nibble r, so byte j holds r = 2j low and
    2j+1 high: already Comfy's nibble order) in the order (t, kt, p, l, kl, s, kp).  So the
    words only move: back to (t, p, s, l | kt, kp, kl)."""
    import numpy as np

    words = np.frombuffer(data, dtype="<u4").reshape(n // TILE_N, k // TILE_K, 8, 8, 4, 2, 2)
    return np.ascontiguousarray(words.transpose(0, 2, 5, 3, 1, 6, 4)).tobytes()


def svdq_scales(data: bytes, groups: int, n: int, itemsize: int = 2) -> bytes:
    """wscales ``[G, N]`` (G = K/64 groups) in lane order -> Comfy's ``[G, N]``, group-major.

    ``pack_scale`` splits n as ``t*128 + a*16 + b*8 + c*2 + d`` and stores (t, g, a, c, b, d):
    tile-major, then the group, then the 128 channels of the tile in lane order."""
    import numpy as np

    arr = _items(data, itemsize).reshape(n // TILE_N, groups, 8, 4, 2, 2, -1)
    return np.ascontiguousarray(arr.transpose(1, 0, 2, 4, 3, 5, 6)).tobytes()


def svdq_vector(data: bytes, n: int, itemsize: int = 2) -> bytes:
    """bias ``[N]`` or smooth_factor ``[K]``: ``pack_scale`` with one group (the same lane order)."""
    return svdq_scales(data, 1, n, itemsize)


def lowrank_fits(rows: int, rank: int) -> str:
    if rows % PACK or rank % PACK:
        return f"[{rows}, {rank}] is not made of {PACK}x{PACK} packs (nunchaku pads both to {PACK})"
    return ""


def lowrank_down(data: bytes, k: int, rank: int, itemsize: int = 2) -> bytes:
    """proj_down ``[K, R]`` packed -> Comfy's ``[K, R]`` (``x @ proj_down``: the transposed
    ``[R, K]`` down weight the packer was given).

    ``pack_lowrank_weight(down=True)`` stores (cp, rp, nl, kl, ns, ks, rk) with
    ``r = rp*16 + ns*8 + nl`` and ``k = cp*16 + ks*8 + kl*2 + rk``."""
    import numpy as np

    arr = _items(data, itemsize).reshape(k // PACK, rank // PACK, 8, 4, 2, 2, 2, -1)
    return np.ascontiguousarray(arr.transpose(0, 5, 3, 6, 1, 4, 2, 7)).tobytes()


def lowrank_up(data: bytes, n: int, rank: int, itemsize: int = 2) -> bytes:
    """proj_up ``[N, R]`` packed -> Comfy's ``[N, R]``.

    ``pack_lowrank_weight(down=False)`` stores (cp, rp, nl, kl, ns, ks, rk) with
    ``n = cp*16 + ns*8 + nl`` and ``r = rp*16 + ks*8 + kl*2 + rk``."""
    import numpy as np

    arr = _items(data, itemsize).reshape(n // PACK, rank // PACK, 8, 4, 2, 2, 2, -1)
    return np.ascontiguousarray(arr.transpose(0, 4, 2, 1, 5, 3, 6, 7)).tobytes()


def awq_fits(n: int, k: int) -> str:
    if n % 4:
        return f"N={n} is not a multiple of 4 (TinyChat interleaves four rows)"
    if k % 64:
        return f"K={k} is not a multiple of 64 (TinyChat packs 64 columns per row chunk)"
    return ""


def awq_codes(data: bytes, n: int, k: int) -> np.ndarray:
    """qweight I32 ``[N/4, K/2]`` (TinyChat ``pack_w4``) -> the unsigned codes ``[N, K]`` (uint8).

    ``pack_w4`` puts k = 32j + 8a + b of a row in nibble a of 16-bit word 8j + b, then
    interleaves four rows per 64 columns: 16-bit words in the order (q, m, i, e) with
    ``n = 4q + i`` and word ``8j + b = 16m + e``."""
    import numpy as np

    words = np.frombuffer(data, dtype="<u2").reshape(n // 4, k // 64, 4, 2, 8)  # q, m, i, h, b
    nibbles = np.stack([(words >> (4 * a)) & 0xF for a in range(4)], axis=-1).astype(np.uint8)  # ..., b, a
    return np.ascontiguousarray(nibbles.transpose(0, 2, 1, 3, 5, 4)).reshape(n, k)  # q, i | m, h, a, b


def awq_weight(data: bytes, n: int, k: int) -> bytes:
    """qweight I32 ``[N/4, K/2]`` -> Comfy ``awq_w4a16`` I8 ``[N, K/2]`` (same unsigned codes,
    even column in the low nibble)."""
    codes = awq_codes(data, n, k)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).tobytes()


def _items(data: bytes, itemsize: int):
    import numpy as np

    return np.frombuffer(data, dtype={1: "u1", 2: "<u2", 4: "<u4"}[itemsize])
