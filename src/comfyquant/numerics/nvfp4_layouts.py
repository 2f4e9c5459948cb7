"""NVFP4 as other writers store it, and the byte permutations to and from Comfy's layout.

The same NVFP4 numbers (E2M1 codes, one E4M3 scale per 1x16 block, an F32 tensor scale) are
stored three ways by the writers comfyquant meets:

* Comfy (comfy-kitchen ``quantize_nvfp4``): codes packed **high nibble first**, the weight
  zero-padded to 16x16, the block scales in the blocked 128x4 layout (``blocked``).
* diffusers' BFL quantizer (``quantizers/bfl/utils.py::quantize_nvfp4``) and NVIDIA ModelOpt
  (``qtensor/nvfp4_tensor.py``, ``(q[..., 1::2] << 4) | q[..., 0::2]``): **low nibble first**
  (the even element in bits 0-3), scales **linear** ``[N, K/16]``, nothing padded.
* ModelOpt's ComfyUI post-processing (``export/diffusers_utils.py``) may then pad rows to 16
  (``padding_strategy="row"``), also the packed columns and the scale columns to 16
  (``"row_col"``), and swizzle the scales into the blocked layout (``swizzle_nvfp4_scales``).

Every conversion between them is a permutation of bytes plus zero padding: nibbles swap
inside a byte, scales move between the linear and blocked arrangements, zero rows or columns
appear or go.  The functions here do exactly that on raw bytes (numpy, no torch), and refuse
(``PaddingNotZero``) to drop bytes that are not zero, so a conversion never loses a number.
``decode`` is the dense decode of any of these layouts (torch, for the dialect decoders).
"""

from __future__ import annotations

from typing import Any

from .blocked import blocked_shape, ceil_to, from_blocked, to_blocked

LINEAR = "linear"
"""Scales stored ``[rows, cols]`` row-major (ModelOpt, diffusers' BFL quantizer)."""
BLOCKED = "blocked"
"""Scales stored in the 128x4 tile layout (Comfy, ModelOpt with ``enable_swizzle_layout``)."""
HIGH_FIRST = "high-first"
LOW_FIRST = "low-first"
BLOCK = 16


class PaddingNotZero(ValueError):
    """Bytes a conversion would drop as padding are not zero: they are not padding."""


def _array(data: bytes, shape: tuple[int, int]):
    import numpy as np

    rows, cols = shape
    if len(data) != rows * cols:
        raise ValueError(f"{len(data)} bytes do not make a [{rows}, {cols}] byte matrix")
    return np.frombuffer(data, dtype="u1").reshape(rows, cols)


def swap_nibbles(data: bytes) -> bytes:
    """Every byte's two nibbles exchanged (``0xAB`` -> ``0xBA``): low-first <-> high-first
    packing of the same codes (comfy-kitchen ``float_utils.swap_nibbles``)."""
    import numpy as np

    a = np.frombuffer(data, dtype="u1")
    return ((a << 4) | (a >> 4)).astype("u1").tobytes()


def resize(data: bytes, shape: tuple[int, int], new_shape: tuple[int, int], what: str = "tensor") -> bytes:
    """A row-major byte matrix cut or zero-padded at its end to ``new_shape`` (rows and columns
    independently); the bytes cut away must be zero (``PaddingNotZero`` names them)."""
    import numpy as np

    if tuple(shape) == tuple(new_shape):
        return bytes(data)
    a = _array(data, shape)
    rows, cols = new_shape
    keep_r, keep_c = min(rows, a.shape[0]), min(cols, a.shape[1])
    if a.shape[0] > rows and a[rows:].any():
        raise PaddingNotZero(f"{what}: rows {rows}..{a.shape[0] - 1} would be dropped as padding but are not zero")
    if a.shape[1] > cols and a[:, cols:].any():
        raise PaddingNotZero(f"{what}: columns {cols}..{a.shape[1] - 1} would be dropped as padding but are not zero")
    out = np.zeros((rows, cols), dtype="u1")
    out[:keep_r, :keep_c] = a[:keep_r, :keep_c]
    return out.tobytes()


def block(data: bytes, rows: int, cols: int) -> bytes:
    """Linear ``[rows, cols]`` scale bytes -> the blocked layout, zero padded to
    ``[pad(rows, 128), pad(cols, 4)]`` (``blocked.to_blocked``)."""
    import numpy as np

    return np.ascontiguousarray(to_blocked(_array(data, (rows, cols)))).tobytes()


def unblock(data: bytes, rows: int, cols: int, what: str = "scales") -> bytes:
    """Blocked scale bytes -> linear ``[rows, cols]``; the layout's padding must be zero (else
    the linear form would not give the same bytes back: ``PaddingNotZero``)."""
    import numpy as np

    rp, cp = blocked_shape(rows, cols)
    a = _array(data, (rp, cp))
    out = np.ascontiguousarray(from_blocked(a, rows, cols))
    if (rp, cp) != (rows, cols) and np.ascontiguousarray(to_blocked(out)).tobytes() != bytes(data):
        raise PaddingNotZero(f"{what}: the blocked layout's padding (beyond [{rows}, {cols}]) is not zero")
    return out.tobytes()


def scale_layouts(rows: int, kblocks: int, scale_shape: tuple) -> dict[str, int]:
    """Which scale layouts a stored ``weight_scale`` shape fits, for a weight of ``rows`` rows
    and ``kblocks`` 16-blocks per row: layout -> the number of logical scale columns it holds
    (``kblocks``, or ``pad(kblocks, 16)`` after ModelOpt's ``row_col`` padding).  Both layouts
    fit exactly when ``rows % 128 == 0`` and the column count is a multiple of 4: then only the
    producer (or the data) tells them apart."""
    if len(scale_shape) != 2 or rows <= 0 or kblocks <= 0:
        return {}
    sr, sc = scale_shape
    out: dict[str, int] = {}
    for cols in dict.fromkeys((kblocks, ceil_to(kblocks, 16))):
        if (sr, sc) == (rows, cols):
            out.setdefault(LINEAR, cols)
        if (sr, sc) == blocked_shape(rows, cols):
            out.setdefault(BLOCKED, sc)
    return out


def weight_to_comfy(data: bytes, rows: int, cols: int, out_rows: int, out_cols: int, nibbles: str) -> bytes:
    """Packed codes ``[rows, cols]`` -> Comfy's ``[out_rows, out_cols]`` high-first bytes."""
    data = swap_nibbles(data) if nibbles == LOW_FIRST else bytes(data)
    return resize(data, (rows, cols), (out_rows, out_cols), "weight")


def weight_from_comfy(data: bytes, rows: int, cols: int, out_rows: int, out_cols: int, nibbles: str) -> bytes:
    """Comfy's packed codes ``[rows, cols]`` -> ``[out_rows, out_cols]`` in ``nibbles`` order
    (dropped rows or columns must be zero)."""
    data = resize(data, (rows, cols), (out_rows, out_cols), "weight")
    return swap_nibbles(data) if nibbles == LOW_FIRST else data


def scales_to_comfy(data: bytes, layout: str, rows: int, cols: int, kblocks: int) -> bytes:
    """Block scales of ``rows`` rows and ``cols`` logical columns, stored in ``layout`` ->
    Comfy's blocked scales of ``[rows, kblocks]`` (columns beyond ``kblocks`` must be zero)."""
    linear = bytes(data) if layout == LINEAR else unblock(data, rows, cols)
    return block(resize(linear, (rows, cols), (rows, kblocks), "weight_scale"), rows, kblocks)


def scales_from_comfy(data: bytes, rows: int, kblocks: int, out_rows: int, out_cols: int, layout: str) -> bytes:
    """Comfy's blocked scales of ``[rows, kblocks]`` -> ``[out_rows, out_cols]`` logical
    scales stored in ``layout`` (dropped rows must be zero; added columns are zero)."""
    linear = resize(unblock(data, rows, kblocks), (rows, kblocks), (out_rows, out_cols), "weight_scale")
    return linear if layout == LINEAR else block(linear, out_rows, out_cols)


def broadcast_rows(data: bytes, rows: int) -> bytes:
    """One F32 scalar's bytes repeated ``rows`` times: a per-tensor scale as per-row scales
    (the same number for every row: exact)."""
    if len(data) != 4:
        raise ValueError(f"expected one F32 scalar (4 bytes), got {len(data)} bytes")
    return bytes(data) * rows


def decode(
    weight: Any,
    scale: Any,
    scale_2: Any,
    *,
    nibbles: str,
    layout: str,
    scale_cols: int,
    rows: int | None = None,
    cols: int | None = None,
    pre_quant_scale: Any = None,
):
    """Dense F32 weight of packed NVFP4 codes ``weight`` [R, Cb] (torch uint8), block scales
    ``scale`` (E4M3 or their bytes, ``layout``, ``scale_cols`` logical columns) and the tensor
    scale ``scale_2``: ``E2M1(code) * (block_scale * scale_2)``, F32, the formula of
    diffusers' ``dequantize_nvfp4`` and comfy-kitchen's ``dequantize_nvfp4`` (both one F32
    product per factor, so all three agree bit for bit).  ``rows``/``cols``: the model's size
    (the padding cut off); ``pre_quant_scale`` multiplies the columns (as Comfy's codec does)."""
    import torch

    from .floats import E4M3, e2m1_table

    r, cb = weight.shape
    kblocks = 2 * cb // BLOCK
    w = weight.contiguous().view(torch.uint8)
    lo, hi = w & 0x0F, w >> 4
    pairs = (lo, hi) if nibbles == LOW_FIRST else (hi, lo)
    codes = torch.stack(pairs, dim=-1).reshape(r, 2 * cb)
    s = scale.contiguous()
    s = s.view(E4M3) if s.dtype == torch.uint8 else s
    if layout == BLOCKED:
        s = from_blocked(s, r, scale_cols)
    s = s.reshape(r, scale_cols)[:, :kblocks]
    total = s.to(torch.float32) * scale_2.to(torch.float32).reshape(())
    values = e2m1_table(torch.float32)[codes.long()].view(r, kblocks, BLOCK)
    out = (values * total.unsqueeze(-1)).view(r, 2 * cb)
    out = out[: r if rows is None else rows, : 2 * cb if cols is None else cols]
    if pre_quant_scale is not None:
        out = out * pre_quant_scale.to(torch.float32).reshape(1, -1)
    return out.contiguous()
