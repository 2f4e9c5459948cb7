"""Write safetensors files: header first, data streamed, temporary file + fsync + atomic rename.

Tensors are given as ``(dtype, shape, data)`` where ``data`` is ``bytes`` or a callable that
yields byte chunks (so large tensors can be copied or computed piecewise without holding the
whole file in memory).  Nothing appears at ``path`` until the file is complete and synced.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable

from .dtypes import DTYPE_BITS

Data = bytes | bytearray | memoryview | Callable[[], Iterable[bytes]]


def _nbytes(dtype: str, shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BITS[dtype] // 8


def build_header(tensors: dict[str, tuple[str, tuple, Data]], metadata: dict[str, str] | None) -> bytes:
    """Header bytes (length prefix included), 8-byte aligned like the safetensors library."""
    obj: dict = {}
    if metadata:
        obj["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, (dtype, shape, _data) in tensors.items():
        n = _nbytes(dtype, shape)
        obj[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_safetensors(path: str, tensors: dict[str, tuple[str, tuple, Data]], metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (in the given order) to ``path`` atomically."""
    header = build_header(tensors, metadata)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".comfyquant-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(header)
            for name, (dtype, shape, data) in tensors.items():
                want = _nbytes(dtype, shape)
                got = 0
                chunks = data() if callable(data) else (data,)
                for chunk in chunks:
                    fh.write(chunk)
                    got += len(chunk)
                if got != want:
                    raise ValueError(f"{path}: tensor {name!r} produced {got} bytes, {dtype} {list(shape)} needs {want}")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
