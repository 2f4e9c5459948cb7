"""Nibble packing in both orders and the 6-bit high-bit plane (comfy-kitchen 0.2.40
``float_utils.pack_uint4``, ``AsymW4A8Int8Layout``).

* LNF (low nibble first): byte j of a row holds column 2j in bits 0-3 and 2j+1 in bits 4-7
  (``asym_w4a8_int8``, ``convrot_w4a4``, ``awq_w4a16``, ``svdquant_w4a4``).
* HNF (high nibble first): column 2j in bits 4-7 (``nvfp4``).
* 6-bit rows: K/2 bytes of LNF low nibbles, then K/4 bytes whose byte b holds the top two
  bits of columns 4b..4b+3 at bit positions 0, 2, 4 and 6.

Packed tensors stored as I8 are reinterpreted as bytes first (``as_bytes``): sign extension
would corrupt the high nibble.
"""

from __future__ import annotations

import torch

LNF = "lnf"
HNF = "hnf"


def as_bytes(packed: torch.Tensor) -> torch.Tensor:
    """The same storage as uint8 (I8 and U8 packed tensors alike)."""
    return packed if packed.dtype == torch.uint8 else packed.view(torch.uint8)


def pack_nibbles(codes: torch.Tensor, order: str = LNF) -> torch.Tensor:
    """Codes ``[..., K]`` (any integer dtype; the low 4 bits are kept) -> uint8 ``[..., K/2]``."""
    if codes.shape[-1] % 2:
        raise ValueError(f"nibble packing needs an even number of columns, got {codes.shape[-1]}")
    c = codes.to(torch.uint8) & 0xF
    first, second = c[..., 0::2], c[..., 1::2]
    if order == LNF:
        return first | (second << 4)
    if order == HNF:
        return (first << 4) | second
    raise ValueError(f"nibble order must be 'lnf' or 'hnf', got {order!r}")


def unpack_nibbles(packed: torch.Tensor, order: str = LNF) -> torch.Tensor:
    """uint8 (or I8) ``[..., C]`` -> codes uint8 ``[..., 2C]`` in column order."""
    b = as_bytes(packed)
    lo, hi = b & 0xF, b >> 4
    pair = (lo, hi) if order == LNF else (hi, lo)
    return torch.stack(pair, dim=-1).view(*b.shape[:-1], 2 * b.shape[-1])


def to_signed(codes: torch.Tensor) -> torch.Tensor:
    """Two's-complement nibbles (0..15) -> int8 in [-8, 7]."""
    c = codes.to(torch.int8)
    return torch.where(c >= 8, c - 16, c)


def pack_6bit(codes: torch.Tensor) -> torch.Tensor:
    """6-bit codes ``[N, K]`` (0..63) -> uint8 rows of 3K/4 bytes (low plane, then high plane)."""
    n, k = codes.shape
    if k % 4:
        raise ValueError(f"6-bit packing needs K divisible by 4, got {k}")
    c = codes.to(torch.uint8)
    low = pack_nibbles(c, LNF)
    top = c >> 4
    high = top[:, 0::4] | (top[:, 1::4] << 2) | (top[:, 2::4] << 4) | (top[:, 3::4] << 6)
    return torch.cat([low, high], dim=1)


def unpack_6bit(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 (or I8) rows of 3K/4 bytes -> 6-bit codes uint8 ``[N, K]``."""
    b = as_bytes(packed)
    n = b.shape[0]
    low = unpack_nibbles(b[:, : k // 2], LNF)
    high = b[:, k // 2 :]
    top = torch.stack([high & 3, (high >> 2) & 3, (high >> 4) & 3, high >> 6], dim=-1).view(n, k)
    return low | (top << 4)


def pair_table(values: torch.Tensor, order: str = LNF) -> torch.Tensor:
    """``[256, 2]`` table: for each byte, the values of its two columns in column order.

    With ``values`` the 16 decoded values of the nibble codes, ``lookup_pairs`` decodes a
    packed row in one gather instead of unpack + index."""
    b = torch.arange(256, dtype=torch.int64)
    lo, hi = values[b & 0xF], values[b >> 4]
    return torch.stack((lo, hi) if order == LNF else (hi, lo), dim=-1).contiguous()


def lookup_pairs(packed: torch.Tensor, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode packed bytes ``[..., C]`` through a ``pair_table`` -> values ``[..., 2C]``,
    written into ``out`` (contiguous, the table's dtype) when given.  Either way a gather
    of table rows: the values are copies, the same bits."""
    b = as_bytes(packed)
    if out is None:
        found = torch.nn.functional.embedding(b.to(torch.int32), table)
        return found.view(*b.shape[:-1], 2 * b.shape[-1])
    torch.index_select(table, 0, b.reshape(-1).to(torch.int32), out=out.view(-1, 2))
    return out
