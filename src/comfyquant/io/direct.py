"""Stream a file's bytes to disk with ``O_DIRECT`` (Linux, local filesystems): no page cache.

Why: a buffered ``write`` of 8 MiB measured 6.5 ms of CPU on this project's machine (ext4 on
a virtio disk: page-cache allocation, delayed allocation per 4 KiB page, the copy) -- as much
as decoding those bytes from FP8 -- while an ``O_DIRECT`` ``pwrite`` of the same bytes takes
0.2 ms of CPU.  The disk also works from the first block on (no dirty pages waiting for
write-back, no final ``fsync`` that writes half the file), and a 40 GB output does not push
everything else out of the page cache.

``O_DIRECT`` wants memory, file offsets and lengths aligned to the device's block size.  The
bytes handed in (at any offset, in chunks of any size) are copied -- a ``memcpy``, 0.8 ms per
8 MiB -- into page-aligned staging buffers whose file offsets are multiples of ``ALIGN``;
a background thread writes each full buffer with ``O_DIRECT`` while the next one fills.  A
large chunk whose memory already sits at its file offset's place within a page (a decoder
told where its blocks go puts them so) skips the copy: its whole pages are written from where
they are.  The
unaligned bytes before and after a run of staged bytes go through the ordinary descriptor,
into pages the direct writes never touch (the page cache and the direct writes never share a
page).  A filesystem that refuses an aligned direct write (``EINVAL``) gets that buffer and
every later one through the ordinary descriptor: slower, same bytes.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import threading

ALIGN = 4096
"""File offset, length and memory alignment of every direct write (any block size up to 4 KiB)."""
STAGE = 8 << 20
"""Bytes per staging buffer (one direct write)."""
BUFFERS = 3
"""Staging buffers: one filling, up to two queued or being written."""
IN_PLACE_MIN = 1 << 20
"""Chunks from this size are written from their own memory when it is placed for it (see
``DirectStream.write``); smaller ones are staged."""
FILESYSTEMS = frozenset({"ext4", "ext3", "xfs", "btrfs", "f2fs", "bcachefs"})
"""Local block filesystems whose ``O_DIRECT`` is plain and fast.  Elsewhere (tmpfs, network
and FUSE filesystems, ZFS) ``O_DIRECT`` is refused, ignored or slower: buffered writes."""


def supported(folder: str) -> bool:
    """Whether files in ``folder`` are written with ``O_DIRECT``: Linux, a filesystem of
    ``FILESYSTEMS`` (from ``/proc/self/mountinfo``, matched by device number), and
    ``COMFYQUANT_NO_DIRECT_IO`` unset."""
    if os.environ.get("COMFYQUANT_NO_DIRECT_IO") or not hasattr(os, "O_DIRECT"):
        return False
    return filesystem(folder) in FILESYSTEMS


def filesystem(folder: str) -> str | None:
    """The type of the filesystem ``folder`` is on (``ext4``, ``tmpfs``, ...), or None."""
    try:
        dev = os.stat(folder).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = None
    for line in lines:  # the last mount of a device is the one that is visible
        fields = line.split()
        if len(fields) > 2 and fields[2] == want and " - " in line:
            found = line.split(" - ", 1)[1].split()[0]
    return found


def _address(view: memoryview) -> int:
    """The memory address of ``view``'s first byte (read-only views too)."""
    import numpy as np

    return np.frombuffer(view, np.uint8).ctypes.data if len(view) else 0


def _copy(buf: mmap.mmap, at: int, data: memoryview) -> None:
    """``buf[at:at + len(data)] = data`` without holding the GIL: copying a block of up to
    8 MiB takes a millisecond or two, during which a slice assignment keeps every other thread
    (the decode thread, between two of its torch operations) from running Python; NumPy
    releases the GIL for a plain byte copy."""
    import numpy as np

    np.frombuffer(buf, np.uint8, len(data), at)[...] = np.frombuffer(data, np.uint8)


class DirectStream:
    """Sequential bytes of one file from offset ``pos`` on: ``write`` copies them into
    staging buffers written with ``O_DIRECT`` in a thread.  ``fd`` is the file's ordinary
    descriptor (for the unaligned edges).  ``flush`` hands the partly filled buffer over
    (before bytes arrive by another route, e.g. a kernel copy at ``pos``); ``close``
    waits for every write and raises the first error (an ``OSError``, as a buffered write
    would have).  Opening raises ``OSError`` when the filesystem has no ``O_DIRECT``."""

    def __init__(self, fd: int, path: str, pos: int) -> None:
        self.fd = fd
        self.dfd = os.open(path, os.O_WRONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
        self.pos = pos
        self.direct = True
        """False once the filesystem refused a direct write: the rest goes buffered."""
        self.error: OSError | None = None
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._made = 0
        self._work: queue.Queue = queue.Queue()
        self._buf: mmap.mmap | None = None
        self._base = 0
        self._fill = 0
        self._thread = threading.Thread(target=self._run, name="comfyquant-direct-write", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------
    def write(self, data) -> None:
        """Append ``data`` (any bytes-like object; copied or written before this returns).

        Bytes whose memory lies at the same offset within a page as their place in the file
        (a decoder that knows where its blocks go puts them so: ``iter_decode(phase=...)``)
        are written with ``O_DIRECT`` from where they are, in this thread, their whole pages
        at least: no copy into a staging buffer.  The others are staged."""
        view = memoryview(data)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        if self.direct and len(view) >= IN_PLACE_MIN:
            view = self._write_in_place(view)
        self._stage(view)

    def _write_in_place(self, view: memoryview) -> memoryview:
        """Write the whole pages of ``view`` straight from its memory when memory and file
        offsets share their place within a page; returns what is left to stage (its last
        partial page, or everything when they do not or the filesystem refuses)."""
        head = -self.pos % ALIGN
        if (_address(view) + head) % ALIGN or len(view) - head < ALIGN:
            return view
        self._stage(view[:head])  # completes the staged bytes up to a page boundary
        self.flush()  # ... which go to the writer thread; the pages below never overlap them
        pages = (len(view) - head) // ALIGN * ALIGN
        done = self._direct_pages(view[head : head + pages], self.pos)
        self.pos += done
        return view[head + done :]  # after a refusal or a short write: staged

    def _stage(self, view: memoryview) -> None:
        """Copy ``view`` into staging buffers, each written by the thread once full."""
        while view:
            if self._buf is None:
                head = -self.pos % ALIGN
                if head:  # up to the next aligned offset: the ordinary descriptor
                    n = min(head, len(view))
                    _pwrite_all(self.fd, view[:n], self.pos)
                    self.pos += n
                    view = view[n:]
                    continue
                self._buf, self._base, self._fill = self._take(), self.pos, 0
            n = min(STAGE - self._fill, len(view))
            _copy(self._buf, self._fill, view[:n])
            self._fill += n
            self.pos += n
            view = view[n:]
            if self._fill == STAGE:
                self._submit()

    def read_from(self, fd: int, offset: int, length: int) -> bool:
        """Append ``length`` bytes of file ``fd`` at ``offset``, read straight into the staging
        buffers (small copied tensors: no kernel copy, so no flush of a partial buffer).
        False if the source ended early (nothing is then known about what was appended)."""
        while length:
            if self._buf is None:  # the unaligned head and a new buffer: through write()
                chunk = os.pread(fd, min(length, ALIGN), offset)
                if not chunk:
                    return False
                self.write(chunk)
                offset += len(chunk)
                length -= len(chunk)
                continue
            n = min(STAGE - self._fill, length)
            got = os.preadv(fd, [memoryview(self._buf)[self._fill : self._fill + n]], offset)
            if got <= 0:
                return False
            self._fill += got
            self.pos += got
            offset += got
            length -= got
            if self._fill == STAGE:
                self._submit()
        return True

    def flush(self) -> None:
        """Hand the partly filled buffer to the writer thread (its bytes up to ``pos``)."""
        if self._buf is not None:
            if self._fill:
                self._submit()
            else:
                self._free.put(self._buf)
                self._buf = None

    def wait(self) -> None:
        """Flush, then wait until every byte so far is written; raise the first error."""
        self.flush()
        self._work.join()
        self._raise()

    def close(self) -> None:
        """Write everything, stop the thread and close the direct descriptor."""
        try:
            self.wait()
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop at once (on an error elsewhere): queued buffers are dropped, the thread joined."""
        if self._thread.is_alive():
            self.error = self.error or OSError(errno.ECANCELED, "stopped")
            self._work.put(None)
            self._thread.join()
        if self.dfd >= 0:
            os.close(self.dfd)
            self.dfd = -1

    def _take(self) -> mmap.mmap:
        self._raise()
        if self._made < BUFFERS:
            try:
                return self._free.get_nowait()
            except queue.Empty:
                self._made += 1
                return mmap.mmap(-1, STAGE)  # anonymous: page-aligned
        buf = self._free.get()
        self._raise()
        return buf

    def _submit(self) -> None:
        self._work.put((self._buf, self._base, self._fill))
        self._buf = None

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    # -- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._work.get()
            try:
                if item is None:
                    return
                buf, base, length = item
                if self.error is None:
                    try:
                        self._write(memoryview(buf)[:length], base)
                    except OSError as exc:
                        self.error = exc
                self._free.put(buf)
            finally:
                self._work.task_done()

    def _write(self, view: memoryview, base: int) -> None:
        done = self._direct_pages(view[: len(view) - len(view) % ALIGN], base)
        if done < len(view):  # the last partial page, or the rest after a refusal: buffered
            _pwrite_all(self.fd, view[done:], base + done)

    def _direct_pages(self, view: memoryview, offset: int) -> int:
        """Write ``view`` (whole pages, at an aligned ``offset`` and address) with ``O_DIRECT``
        until it is done, the filesystem refuses (``EINVAL``: ``direct`` goes False, every
        later byte goes through the ordinary descriptor) or a write ends off a page boundary;
        returns the bytes written.  Shared by the writer thread and in-place writes."""
        done = 0
        while self.direct and done < len(view):
            try:
                n = os.pwrite(self.dfd, view[done:], offset + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False  # this filesystem wants other alignments
                break
            if n <= 0:
                raise OSError(errno.EIO, "direct write wrote nothing")
            done += n
            if done % ALIGN:  # a short write off the page boundary
                break
        return done


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[n:]
        offset += n
