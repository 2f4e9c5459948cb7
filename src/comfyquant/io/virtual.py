"""A safetensors file that exists only as a header and a recipe per tensor.

Reads a checkpoint of another layout (a dialect, or a GGUF file) *as if* it were the
Comfy or dense safetensors file it translates to, without writing that file: every command
that reads safetensors (``dequantize``, ``convert``, the checker) then works on it unchanged.
A tensor's bytes are either a range of an underlying source (read through, never held),
produced by a callable when first read (one layer's worth, a few kept; none of it is held
for longer than the readers need it), given as bytes (markers), or None: zeros, for a file
only the header-reading checker will look at (a writer's plan, judged before it is written).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping

from ..dtypes import DTYPE_BITS
from .source import ByteSource
from .writer import build_header

Produce = Callable[[], bytes]


class Range:
    """``length`` bytes at ``start`` of another byte source."""

    __slots__ = ("source", "start", "length")

    def __init__(self, source: ByteSource, start: int, length: int) -> None:
        self.source = source
        self.start = start
        self.length = length


Span = Range | Produce | bytes | bytearray | None
"""A tensor's bytes in a virtual file: read from another source, produced on first read,
given, or zeros (None)."""


class VirtualSource:
    """A byte source whose header is built from ``tensors`` (name -> (dtype, shape, data), data
    a ``Range`` or a callable returning the bytes) and ``metadata``.  ``keep``: how many
    produced tensors stay cached (a layer is read a few tensors at a time)."""

    first_read = 1 << 16

    def __init__(
        self,
        name: str,
        tensors: Mapping[str, tuple[str, tuple, Span]],
        metadata: dict[str, str] | None = None,
        keep: int = 4,
    ) -> None:
        self.name = name
        self.path = name
        self._header = build_header(tensors, metadata)
        self._spans: list[tuple[int, int, Span, str]] = []
        offset = len(self._header)
        for tname, (dtype, shape, data) in tensors.items():
            n = math.prod(shape) * DTYPE_BITS[dtype] // 8
            self._spans.append((offset, offset + n, data, tname))
            offset += n
        self.size = offset
        self.first_read = len(self._header)
        """Opening reads the header only: a first read past it would compute the first tensor."""
        self._starts = [s[0] for s in self._spans]
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._keep = keep
        self.reads = 0
        self.bytes_read = 0
        self.stored_as: dict[str, tuple[str, int]] = {}
        """(type, bytes) of a tensor in the underlying container when the view holds it in another
        form (a GGUF Q8_0 weight viewed as F32): what ``inspect`` reports as its dtype and size."""
        self.stored_size: int | None = None
        """The underlying container's file size, when the view's is not it."""

    def _produced(self, tname: str, produce: Produce, nbytes: int) -> bytes:
        data = self._cache.get(tname)
        if data is None:
            data = bytes(produce())
            if len(data) != nbytes:
                raise ValueError(f"{self.name}: {tname} produced {len(data)} bytes, its header says {nbytes}")
            self._cache[tname] = data
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(tname)
        return data

    def pread(self, offset: int, length: int) -> bytes:
        import bisect

        self.reads += 1
        end = min(offset + length, self.size)
        out = bytearray()
        if offset < len(self._header):
            out += self._header[offset : min(end, len(self._header))]
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while i < len(self._spans) and len(out) < end - offset:
            start, stop, data, tname = self._spans[i]
            lo, hi = max(offset, start), min(end, stop)
            if lo < hi:
                if isinstance(data, Range):
                    out += data.source.pread(data.start + lo - start, hi - lo)
                elif data is None:
                    out += bytes(hi - lo)
                elif isinstance(data, (bytes, bytearray)):
                    out += data[lo - start : hi - start]
                else:
                    out += self._produced(tname, data, stop - start)[lo - start : hi - start]
            i += 1
        self.bytes_read += len(out)
        return bytes(out)

    def pread_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.pread(o, n) for o, n in ranges]

    def close(self) -> None:
        self._cache.clear()
