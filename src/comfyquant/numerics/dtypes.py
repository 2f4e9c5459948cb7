"""Safetensors dtype strings <-> torch dtypes, and tensors built from (or turned into) raw bytes.

The checkpoint reader hands out raw little-endian bytes; codecs want torch tensors and the
writer wants bytes again.  Conversions here never copy when they do not have to: a tensor
is a view of the bytes read, and bytes for the writer are a view of the tensor's storage.
"""

from __future__ import annotations

import warnings

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
"""Header dtype string -> torch dtype (the dtypes the codecs can meet)."""

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

FLOAT_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "BF16": torch.bfloat16,
    "f16": torch.float16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "F16": torch.float16,
    "f32": torch.float32,
    "fp32": torch.float32,
    "float32": torch.float32,
    "F32": torch.float32,
}
"""Names users and markers (``orig_dtype``) give the dense output dtypes."""

DENSE = (torch.bfloat16, torch.float16, torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors header string of a torch dtype (``torch.bfloat16`` -> ``"BF16"``)."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no safetensors name") from None


def parse_float_dtype(value) -> torch.dtype:
    """``"bf16"``/``"f16"``/``"f32"`` (and their long names) or a dense torch dtype."""
    if isinstance(value, torch.dtype):
        if value not in DENSE:
            raise ValueError(f"output dtype must be bf16, f16 or f32, got {value}")
        return value
    try:
        return FLOAT_DTYPES[str(value)]
    except KeyError:
        raise ValueError(f"output dtype must be bf16, f16 or f32, got {value!r}") from None


def from_bytes(data, dtype: str, shape) -> torch.Tensor:
    """A tensor viewing ``data`` (bytes, bytearray or memoryview) as ``dtype`` x ``shape``.

    Read-only buffers give read-only tensors in all but name: the codecs never write into
    their inputs, so the copy torch would otherwise ask for is skipped (and its warning
    silenced).
    """
    tdtype = TORCH_DTYPES.get(dtype)
    if tdtype is None:
        raise ValueError(f"unsupported dtype {dtype}")
    shape = tuple(shape)
    if len(data) == 0:
        return torch.empty(shape, dtype=tdtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(tdtype).view(shape)


def to_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes (row-major, little-endian) without a copy when it is contiguous."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    flat = t.reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())
