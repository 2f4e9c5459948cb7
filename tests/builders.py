"""Build small checkpoints byte by byte (no torch) for rule and container tests.

Each ``*_layer`` function returns ``{name: (dtype, shape, bytes)}`` for one layer with the
right dtypes and shapes for its format; tests then break exactly one thing.  Scale values are
1.0 (or FP8 0x38 = 1.0) so ``--deep`` sees healthy values unless a test changes them.
"""

from __future__ import annotations

import json
import struct

from comfyquant.dtypes import DTYPE_BITS
from comfyquant.io.writer import write_safetensors

FP8_ONE = 0x38
W4A8_MARKER = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True}
INT8_CONVROT_MARKER = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}


def nbytes(dtype: str, shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BITS[dtype] // 8


def zeros(dtype: str, shape) -> tuple:
    return (dtype, tuple(shape), bytes(nbytes(dtype, shape)))


def ones(dtype: str, shape) -> tuple:
    n = nbytes(dtype, shape) // max(1, DTYPE_BITS[dtype] // 8)
    if dtype == "F32":
        data = struct.pack(f"<{n}f", *([1.0] * n))
    elif dtype == "BF16":
        data = b"\x80\x3f" * n
    elif dtype == "F16":
        data = b"\x00\x3c" * n
    elif dtype in ("F8_E4M3", "U8"):
        data = bytes([FP8_ONE]) * n
    elif dtype == "F8_E8M0":
        data = bytes([127]) * n
    else:
        data = bytes(n)
    return (dtype, tuple(shape), data)


def marker_tensor(marker) -> tuple:
    raw = json.dumps(marker).encode() if not isinstance(marker, bytes) else marker
    return ("U8", (len(raw),), raw)


def codebook() -> tuple:
    levels = [-0.98, -0.79, -0.64, -0.5, -0.38, -0.26, -0.16, -0.05, 0.05, 0.16, 0.27, 0.38, 0.5, 0.64, 0.79, 0.98]
    return ("F32", (16,), struct.pack("<16f", *levels))


def w4a8_layer(p: str, n=32, k=256, g=16, marker=None, bits=4, codebook_=True, correction=None, bias=True) -> dict:
    t = {
        f"{p}.weight": zeros("I8", (n, k * bits // 8)),
        f"{p}.weight_s_rel": ones("F8_E4M3", (n, k // g)),
        f"{p}.weight_s_channel": ones("F32", (n,)),
    }
    if codebook_ and bits == 4 and correction is None:
        t[f"{p}.weight_codebook"] = codebook()
    if correction is not None:
        t[f"{p}.weight_correction"] = correction
    if bias:
        t[f"{p}.bias"] = zeros("BF16", (n,))
    m = dict(W4A8_MARKER, group_size=g) if marker is None else marker
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def int8_layer(p: str, n=32, k=256, marker=None, scale_shape=None) -> dict:
    m = INT8_CONVROT_MARKER if marker is None else marker
    t = {f"{p}.weight": zeros("I8", (n, k)), f"{p}.weight_scale": ones("F32", scale_shape if scale_shape is not None else (n, 1))}
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def fp8_layer(p: str, n=32, k=256, marker=None, input_scale=False) -> dict:
    t = {f"{p}.weight": zeros("F8_E4M3", (n, k)), f"{p}.weight_scale": ones("F32", ())}
    if input_scale:
        t[f"{p}.input_scale"] = ones("F32", ())
    m = {"format": "float8_e4m3fn"} if marker is None else marker
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def w4a4_layer(p: str, n=32, k=256, marker=None) -> dict:
    m = {"format": "convrot_w4a4", "convrot_groupsize": 256} if marker is None else marker
    t = {f"{p}.weight": zeros("I8", (n, k // 2)), f"{p}.weight_scale": ones("F32", (n,))}
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def _pad(x: int, m: int) -> int:
    return -(-x // m) * m


def nvfp4_layer(p: str, n=128, k=256, marker=None, scale_shape=None) -> dict:
    m = {"format": "nvfp4"} if marker is None else marker
    shape = scale_shape or (_pad(n, 128), _pad(k // 16, 4))
    t = {
        f"{p}.weight": zeros("U8", (n, k // 2)),
        f"{p}.weight_scale": ones("F8_E4M3", shape),
        f"{p}.weight_scale_2": ones("F32", ()),
    }
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def mxfp8_layer(p: str, n=128, k=256, marker=None, scale=None) -> dict:
    m = {"format": "mxfp8"} if marker is None else marker
    t = {
        f"{p}.weight": zeros("F8_E4M3", (n, k)),
        f"{p}.weight_scale": scale or ones("F8_E8M0", (_pad(n, 128), _pad(k // 32, 4))),
    }
    if m is not False:
        t[f"{p}.comfy_quant"] = marker_tensor(m)
    return t


def dense_layer(p: str, n=32, k=256) -> dict:
    return {f"{p}.weight": zeros("BF16", (n, k)), f"{p}.bias": zeros("BF16", (n,))}


def header_markers(layers: dict, version=True) -> dict:
    obj = {"layers": layers}
    if version:
        obj = {"format_version": "1.0", **obj}
    return {"_quantization_metadata": json.dumps(obj)}


def write(path, *parts: dict, metadata=None) -> str:
    tensors: dict = {}
    for part in parts:
        tensors.update(part)
    write_safetensors(str(path), tensors, metadata)
    return str(path)


def raw_file(path, header: bytes | str, data: bytes = b"", length: int | None = None) -> str:
    """A file with an arbitrary header (for container-damage tests)."""
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if length is None else length
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", n) + header + data)
    return str(path)
