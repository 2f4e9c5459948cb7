"""Safetensors dtype strings <-> torch dtypes, and tensors built from (or turned into) raw bytes.

The checkpoint reader hands out raw little-endian bytes; codecs want torch tensors and the
writer wants bytes again.  Conversions here never copy when they do not have to: a tensor
is a view of the bytes read, and bytes for the writer are a view of the tensor's storage.
"""

from __future__ import annotations

import warnings

import torch

from ..dtypes import COMPLEX_KIND, DTYPE_KINDS, FNUZ_KIND, SCALAR_TYPES

_NOT_CODEC_KINDS = (COMPLEX_KIND, FNUZ_KIND)
"""Dtypes no codec reads or writes: a dense tensor of one is copied, never decoded."""


def _by_scalar_type() -> dict[str, torch.dtype]:
    """torch's dtypes by ScalarType name, read from torch itself: a tensor's legacy type name
    is ``torch.<ScalarType>Tensor``.  So the dtype table (``comfyquant.dtypes``) states each
    dtype's torch name once, as the ScalarType its messages print."""
    found: dict[str, torch.dtype] = {}
    with warnings.catch_warnings():  # experimental and deprecated dtypes warn when made
        warnings.simplefilter("ignore")
        for value in vars(torch).values():
            if isinstance(value, torch.dtype):
                try:
                    legacy = torch.empty(0, dtype=value).type()
                except (RuntimeError, TypeError):  # dtypes without a plain tensor type
                    continue
                found.setdefault(legacy.removeprefix("torch.").removesuffix("Tensor"), value)
    return found


_TORCH_BY_SCALAR = _by_scalar_type()

TORCH_DTYPES: dict[str, torch.dtype] = {
    name: _TORCH_BY_SCALAR[scalar]
    for name, scalar in SCALAR_TYPES.items()
    if DTYPE_KINDS[name] not in _NOT_CODEC_KINDS and scalar in _TORCH_BY_SCALAR
}
"""Header dtype string -> torch dtype (the dtypes the codecs can meet)."""

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

OUTPUT_DTYPE_NAMES: dict[str, torch.dtype] = {
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
        return OUTPUT_DTYPE_NAMES[str(value)]
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
    return flat.numpy().data
