"""Write safetensors files: header first, data streamed, temporary file + fsync + atomic rename.

Tensors are given as ``(dtype, shape, data)`` where ``data`` is ``bytes`` or a callable that
yields byte chunks (so large tensors can be copied or computed piecewise without holding the
whole file in memory).  Nothing appears at ``path`` until the file is complete and synced.
"""

from __future__ import annotations

import json
import os
import signal
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


def _fault(stage: str) -> None:
    """Test hook: ``COMFYQUANT_FAULT=<stage>`` kills the process at that point of a write
    (stages: ``after-header``, ``after-tensor:N``, ``before-rename``).  Crash tests use it to
    prove that no partial file ever appears at the output path."""
    want = os.environ.get("COMFYQUANT_FAULT")
    if want and want == stage:
        os.kill(os.getpid(), signal.SIGKILL)


CHUNK = 8 << 20
"""Bytes per write: big enough for throughput, small enough to bound memory."""


def write_safetensors(
    path: str,
    tensors: dict[str, tuple[str, tuple, Data]],
    metadata: dict[str, str] | None = None,
    *,
    commit: bool = True,
) -> str:
    """Write ``tensors`` (in the given order) next to ``path`` in a temporary file, fsync it and
    rename it to ``path``.  With ``commit=False`` the temporary file's path is returned and the
    caller renames it with :func:`commit_file` (after verifying it, for instance)."""
    header = build_header(tensors, metadata)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".comfyquant-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb", buffering=0) as fh:
            fh.write(header)
            _fault("after-header")
            for i, (name, (dtype, shape, data)) in enumerate(tensors.items()):
                want = _nbytes(dtype, shape)
                got = 0
                chunks = data() if callable(data) else (data,)
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        written = fh.write(view)
                        view = view[written:]
                    got += len(chunk)
                if got != want:
                    raise ValueError(f"{path}: tensor {name!r} produced {got} bytes, {dtype} {list(shape)} needs {want}")
                _fault(f"after-tensor:{i}")
            os.fsync(fh.fileno())
        if commit:
            commit_file(tmp, path)
            return path
        return tmp
    except BaseException:
        discard(tmp)
        raise


def commit_file(tmp: str, path: str) -> None:
    """Atomically move a finished temporary file into place and make the rename durable."""
    _fault("before-rename")
    os.replace(tmp, path)
    try:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is atomic


def discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
