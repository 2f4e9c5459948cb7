"""Large output tensors backed by huge pages where the kernel offers them.

A decoded layer is written once into fresh memory.  glibc serves allocations above its
mmap threshold (at most 32 MiB) with a fresh ``mmap``, so every 4 KiB page of a large
output is faulted in (trapped, zeroed, mapped) by the decoder's first write: for a
5120x13824 BF16 layer (141 MB) that cost about as much as the FP8 decode itself
(measured: writing 141 MB into fresh pages took 3x the time of writing it into warm ones),
while a 3072x3072 layer (19 MB) is served from memory glibc keeps for reuse.  Decoders
were therefore slower per byte on large layers.  Asking for transparent huge pages on the
buffer before anything touches it (``madvise(MADV_HUGEPAGE)``, honoured when
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``) makes one
fault per 2 MiB instead of per 4 KiB.  Where there is no ``madvise`` (not Linux, or THP
off), the tensor is the same ``torch.empty`` and nothing else changes.  Values are never
affected: this is only about how the memory is mapped.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from typing import Literal

import torch

HUGE_PAGE = 2 << 20
PAGE = 4096
"""The memory page (and the ``O_DIRECT`` alignment) that ``empty_output``'s ``phase`` is
within."""
LARGE_BYTES = 32 << 20
"""glibc's largest mmap threshold: buffers above it are always fresh mappings (smaller
ones may be reused heap memory, already mapped, where the advice would buy nothing)."""
MADV_HUGEPAGE = 14

_MADVISE: Callable[[int, int, int], int] | Literal[False] | None = None
"""libc's ``madvise`` once looked up, or False where there is none."""
_REUSE: _Pool | None = None
"""The pool of the active ``reused_outputs`` scope, if any."""


def _madvise() -> Callable[[int, int, int], int] | Literal[False] | None:
    global _MADVISE
    if _MADVISE is None:
        import ctypes
        import sys

        _MADVISE = False
        if sys.platform.startswith("linux"):
            try:  # the process's own symbols: no library search
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _MADVISE = fn
            except (OSError, AttributeError):
                pass
    return _MADVISE


def advise_huge(t: torch.Tensor, least: int | None = None) -> bool:
    """Ask for huge pages on the 2 MiB-aligned interior of ``t``'s memory (before it is
    touched); True when the kernel accepted the advice.  Tensors of ``least`` bytes or fewer
    (default ``LARGE_BYTES``) are left alone."""
    if t.nbytes <= (LARGE_BYTES if least is None else least):
        return False
    return _advise_range(t.data_ptr(), t.nbytes)


def _advise_range(address: int, nbytes: int) -> bool:
    """``madvise(MADV_HUGEPAGE)`` on the 2 MiB-aligned interior of ``[address, address +
    nbytes)``; True when the kernel accepted it (False: no madvise, or no whole huge page)."""
    fn = _madvise()
    if not fn:
        return False
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    stop = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return stop > start and fn(start, stop - start, MADV_HUGEPAGE) == 0


def empty_output(shape: tuple[int, ...], dtype: torch.dtype, least: int | None = None, phase: int | None = None) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, on huge pages when over ``least`` bytes (see the
    module doc) -- or, inside ``reused_outputs``, memory an earlier output of the scope
    no longer uses.

    ``phase``: where the tensor's first byte falls within a ``PAGE`` of memory (a
    multiple of the dtype's size).  A writer that puts this tensor's bytes at a file offset
    with the same remainder can hand them to ``O_DIRECT`` writes from where they are
    (``comfyquant.io.direct``), since the page boundaries of memory and file then meet."""
    nbytes = math.prod(shape) * dtype.itemsize
    if phase is not None and phase % dtype.itemsize:
        raise ValueError(f"phase {phase} is not a multiple of {dtype}'s {dtype.itemsize} bytes")
    extra = 0 if phase is None else PAGE

    def placed(buf: torch.Tensor) -> torch.Tensor:  # buf: flat bytes
        flat = buf[: nbytes + extra]
        if phase is not None:
            at = (phase - flat.data_ptr()) % PAGE
            flat = flat[at : at + nbytes]
        return flat.view(dtype).view(shape)

    pool = _REUSE
    if pool is not None and nbytes > (LARGE_BYTES if least is None else least):
        return pool.take(nbytes + extra, placed)
    t = torch.empty(nbytes + extra, dtype=torch.uint8)
    advise_huge(t, least)
    return placed(t)


def byte_buffer(nbytes: int):
    """A writable anonymous buffer of ``nbytes``: a page-aligned ``mmap`` on huge pages when
    over ``LARGE_BYTES``, or a ``bytearray`` where there is no ``madvise`` (not Linux).
    A read buffer for packed tensors, filled by ``readinto``: a ``bytearray`` of a layer's
    100 MB was faulted in 4 KiB pages by its first read."""
    import ctypes
    import mmap

    if not _madvise() or not hasattr(mmap, "MAP_PRIVATE"):  # no madvise (not Linux), or no such flags (Windows)
        return bytearray(nbytes)
    # private: a shared anonymous mapping is shmem, which gets no transparent huge pages
    try:
        buf = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:  # an anonymous mapping fails only for want of memory (as a bytearray would)
        raise MemoryError(f"cannot allocate {nbytes} bytes: {exc.strerror or exc}") from None
    if nbytes > LARGE_BYTES:
        _advise_range(ctypes.addressof(ctypes.c_char.from_buffer(buf)), nbytes)
    return buf


# -- memory reused from one layer to the next ------------------------------------------------
# Every large output above is a fresh mapping, and fresh memory is paid for at its first
# touch: the kernel faults it in and zeroes it.  Where that is slow (a virtual machine whose
# host backs guest memory on first use), a whole-layer decode spent as long zeroing its F32
# operand and product as multiplying them.  A command that decodes layer after layer
# (dequantize) needs the same few sizes again and again, so within ``reused_outputs``
# a large output is cut from the memory of an earlier one that nothing references any more.


@contextlib.contextmanager
def reused_outputs() -> Iterator[None]:
    """Within this scope (any thread of the process), ``empty_output`` reuses the memory
    of the scope's earlier large outputs once no tensor uses it (torch's own count of the
    memory's users says so: a view, a NumPy array or a memoryview of one keeps it taken).  The
    memory held for reuse never exceeds the most the scope's outputs used at once; it is
    released when the scope ends.  Values are unaffected (``empty_output`` never promised
    zeroed memory).  Without torch's count (another torch version) nothing is reused."""
    global _REUSE
    if _REUSE is not None or not _counts_users():
        yield  # nested: the outer scope's pool serves
        return
    _REUSE = _Pool()
    try:
        yield
    finally:
        _REUSE = None


# -- the memory of the last large result, kept for the next one ----------------------------
# A caller that decodes layer after layer with ``decode()`` and drops each result before the
# next call gets the memory glibc keeps for reuse when layers are small (under its mmap
# threshold) and a fresh mapping, faulted in and zeroed by the kernel, every time they are
# large: on a virtual machine that zeroing cost a 5120x13824 FP8 decode more time than its
# arithmetic.  So the memory of the last large result is kept (one buffer: no more than the
# caller held already) and a later large result that fits it reuses it once the caller has let
# it go; ``release_spare`` gives it back.


def empty_result(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``empty_output`` for a tensor handed to the caller as a result (a decoded layer):
    a large one (over ``LARGE_BYTES``) reuses the memory of the previous large result
    when no tensor uses it any more (torch's count of its users) and its size fits (up to a
    quarter larger), else it is new memory, which is then kept for the next result in its
    place.  Inside ``reused_outputs`` the scope's pool serves instead."""
    nbytes = math.prod(shape) * dtype.itemsize
    if _REUSE is not None or nbytes <= LARGE_BYTES or not _user_count_known():
        return empty_output(shape, dtype)
    size = _huge_pages(nbytes)
    with _SPARE_LOCK:  # the view is made under the lock: until it exists the buffer looks free
        if _SPARE:
            buf, idle = _SPARE[0]
            if _users(buf) == idle and _serves(buf, size):
                return buf[:nbytes].view(dtype).view(shape)
            _SPARE.clear()  # an idle buffer that does not fit is freed before the new one exists
        _SPARE.append(_held_buffer(size))
        return _SPARE[0][0][:nbytes].view(dtype).view(shape)


def release_spare() -> int:
    """Let go of the memory kept for the next large result (``empty_result``); the bytes
    it held (0 when there was none).  A result still in use stays valid: only this module's
    reference to its memory is dropped."""
    with _SPARE_LOCK:
        held = sum(buf.numel() for buf, _ in _SPARE)
        _SPARE.clear()
    return held


_SPARE: list[tuple[torch.Tensor, int]] = []
"""At most one ``(buffer, its storage's use count when free)``: the last large result's memory."""
_SPARE_LOCK = threading.Lock()
_USER_COUNT: list[bool] = []
"""Whether torch tells a storage's user count (``_counts_users``), asked once."""


def _user_count_known() -> bool:
    if not _USER_COUNT:
        _USER_COUNT.append(_counts_users())
    return _USER_COUNT[0]


SLACK = 4
"""A free buffer serves a request up to a quarter (or a huge page) smaller than itself."""


def _huge_pages(nbytes: int) -> int:
    """``nbytes`` rounded up to whole huge pages: the unit of the buffers kept for reuse."""
    return -(-nbytes // HUGE_PAGE) * HUGE_PAGE


def _serves(buf: torch.Tensor, size: int) -> bool:
    """Whether a kept buffer fits a request of ``size`` (``_huge_pages``) bytes without
    wasting more than ``SLACK`` allows."""
    return size <= buf.numel() <= size + max(size // SLACK, HUGE_PAGE)


def _held_buffer(size: int) -> tuple[torch.Tensor, int]:
    """A new flat byte buffer of ``size`` on huge pages, kept for reuse, with its storage's
    use count when only the keeper holds it."""
    buf = torch.empty(size, dtype=torch.uint8)
    advise_huge(buf, 0)
    return buf, _users(buf)


def _users(buf: torch.Tensor) -> int:
    """How many tensors (and other holders) use ``buf``'s storage, by torch's count."""
    return torch._C._storage_Use_Count(buf.untyped_storage()._cdata)


def _counts_users() -> bool:
    """Whether this torch tells how many tensors use a storage (private API: checked, not
    assumed)."""
    try:
        return isinstance(_users(torch.empty(1)), int)
    except (AttributeError, RuntimeError, TypeError):
        return False


class _Pool:
    """The memory of one ``reused_outputs`` scope: flat byte tensors on huge pages, each
    free when torch counts no user of its storage besides the pool's own reference."""

    def __init__(self) -> None:
        self._held: list[tuple[torch.Tensor, int]] = []  # (buffer, its storage's use count when free)
        self._lock = threading.Lock()
        self._peak = 0
        self.reused = 0
        """Bytes handed out from memory already held (for tests and benches)."""

    def take(self, nbytes: int, view: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``view(buf)`` of a flat byte buffer of at least ``nbytes``: the smallest free one
        that fits, else a new one (then free ones are let go, smallest first, while the
        memory held exceeds the most the scope's buffers were ever in use at once).  The
        view is made under the lock: until it exists the buffer looks free to other threads."""
        size = _huge_pages(nbytes)
        with self._lock:
            free = [buf for buf, idle in self._held if _users(buf) == idle]
            fits = [buf for buf in free if _serves(buf, size)]
            if fits:
                self.reused += nbytes
                return view(min(fits, key=torch.Tensor.numel))
            self._held.append(_held_buffer(size))
            buf = self._held[-1][0]
            held = sum(b.numel() for b, _ in self._held)
            self._peak = max(self._peak, held - sum(b.numel() for b in free))
            for old in sorted(free, key=torch.Tensor.numel):
                if held <= self._peak:
                    break
                self._held = [(b, idle) for b, idle in self._held if b is not old]
                held -= old.numel()
            return view(buf)
