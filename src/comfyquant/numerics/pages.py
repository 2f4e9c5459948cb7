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

import torch

HUGE_PAGE = 2 << 20
LARGE_BYTES = 32 << 20
"""glibc's largest mmap threshold: buffers above it are always fresh mappings (smaller
ones may be reused heap memory, already mapped, where the advice would buy nothing)."""
MADV_HUGEPAGE = 14

_MADVISE = None
"""libc's ``madvise`` once looked up, or False where there is none."""


def _madvise():
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
    (default :data:`LARGE_BYTES`) are left alone."""
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


def empty_output(shape: tuple[int, ...], dtype: torch.dtype, least: int | None = None) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, on huge pages when over ``least`` bytes (see the
    module doc)."""
    t = torch.empty(shape, dtype=dtype)
    advise_huge(t, least)
    return t


def byte_buffer(nbytes: int):
    """A writable anonymous buffer of ``nbytes``: a page-aligned ``mmap`` on huge pages when
    over :data:`LARGE_BYTES`, or a ``bytearray`` where there is no ``madvise`` (not Linux).
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
