"""Byte-level tensor transforms used by repairs and dialect migrations: exact and independent of torch.

Each takes the raw little-endian bytes of a tensor and returns the new bytes.  They are all
lossless: a transpose moves elements, an upcast from BF16/F16 to F32 is exact, relabels and
reshapes keep the bytes, and the blocked scale layout (comfy-kitchen 0.2.40
``float_utils.to_blocked``, implemented once in ``numerics.blocked``) is a permutation plus
zero padding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import NUMPY_NAMES

if TYPE_CHECKING:  # numpy loads with the first transform: marker-only repairs never need it (~60 ms)
    import numpy as np


def as_array(data: bytes, dtype: str, shape: tuple) -> np.ndarray:
    import numpy as np

    return np.frombuffer(data, dtype=NUMPY_NAMES[dtype]).reshape(shape)


def transpose(data: bytes, dtype: str, shape: tuple) -> bytes:
    """A 2-D tensor stored ``shape`` becomes its transpose, row-major."""
    import numpy as np

    return np.ascontiguousarray(as_array(data, dtype, shape).T).tobytes()


def to_f32(data: bytes, dtype: str) -> bytes:
    """Exact upcast of BF16/F16 (or F32) bytes to F32 bytes."""
    import numpy as np

    if dtype == "F32":
        return bytes(data)
    if dtype == "F16":
        return np.frombuffer(data, dtype="<f2").astype("<f4").tobytes()
    if dtype == "BF16":
        return (np.frombuffer(data, dtype="<u2").astype("<u4") << 16).tobytes()
    raise ValueError(f"cannot upcast {dtype} to F32 exactly")


def to_blocked(data: bytes, rows: int, cols: int) -> tuple[bytes, tuple[int, int]]:
    """Logical per-block scales ``[rows, cols]`` (1 byte each) -> blocked, zero-padded bytes
    and the stored shape (the layout of ``numerics.blocked``, on a numpy array)."""
    import numpy as np

    from . import blocked

    out = blocked.to_blocked(np.frombuffer(data, dtype="u1").reshape(rows, cols))
    return np.ascontiguousarray(out).tobytes(), out.shape


def from_blocked(data: bytes, rows: int, cols: int) -> bytes:
    """Blocked bytes -> logical ``[rows, cols]`` scales (the inverse of ``to_blocked``)."""
    import numpy as np

    from . import blocked

    return np.ascontiguousarray(blocked.from_blocked(np.frombuffer(data, dtype="u1"), rows, cols)).tobytes()
