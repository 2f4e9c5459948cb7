"""Copy tensor bytes from an input checkpoint into a file being written.

Shared by every command that rewrites checkpoints (``fix``, ``quantize``, ``convert``):
untouched tensors go through the kernel (``copy_file_range``) for local files, so they never
pass through Python; remote sources are streamed in bounded chunks instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import InputError
from .writer import CHUNK, CopyRange

if TYPE_CHECKING:
    from .source import ByteSource


def copy_range(source: ByteSource, start: int, length: int) -> CopyRange | Callable[[], Iterator[bytes]]:
    """Writer data for ``length`` bytes at ``start`` of ``source``: a kernel copy for local
    files (with a streamed fallback), streamed reads otherwise (remote sources)."""
    fd = getattr(source, "_fd", None)
    if isinstance(fd, int) and fd >= 0:
        return CopyRange(fd, start, length, read_chunks(source, start, length))
    return read_chunks(source, start, length)


def read_chunks(source: ByteSource, start: int, length: int) -> Callable[[], Iterator[bytes]]:
    """A callable yielding the range in chunks of at most ``CHUNK`` bytes (bounded memory)."""

    def chunks() -> Iterator[bytes]:
        pos, end = start, start + length
        while pos < end:
            n = min(CHUNK, end - pos)
            data = source.pread(pos, n)
            if len(data) != n:
                raise InputError(f"{source.name}: file ended early while copying (truncated?)")
            yield data
            pos += n

    return chunks
