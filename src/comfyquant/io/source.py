"""Byte sources: where a checkpoint file's bytes come from.

Every reader in comfyquant asks a source for byte ranges (``pread``) and never for a whole
file, so a 40 GB checkpoint is checked with a few hundred kilobytes of reads.  Local files use
``os.pread`` on one descriptor; remote sources (io/remote.py: HTTP range requests, fsspec
protocols) plug in behind the same interface.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Protocol, TypeGuard

from ..errors import InputError

_MADV_POPULATE_READ = 22
"""Linux's ``madvise`` advice that maps a file range's pages now and fails (EFAULT) where a
page lies past the end of the file, instead of a SIGBUS at first touch (Linux 5.14)."""

_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def not_regular(path: str, mode: int) -> InputError | None:
    """The error for a path that is not a regular file (opening a named pipe would block
    forever; a device has no size), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return InputError(f"{path}: is {kind}, not a file comfyquant can read")


def _blocking(fd: int) -> None:
    """Clear O_NONBLOCK again on a regular file: local filesystems ignore it, but a FUSE one
    may pass it on and answer a read with EAGAIN."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the flag was never set
        return
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_NONBLOCK:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)


def link_problem(path: str, exc: OSError) -> str:
    """Why ``path`` cannot be reached, in words: a dangling symbolic link names its target, a
    loop of links says so (``os.stat`` only says "no such file" or ELOOP)."""
    import errno

    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop (links that lead back to themselves)"
    if isinstance(exc, FileNotFoundError):
        try:
            return f"is a dangling symbolic link (to {os.readlink(path)}, which does not exist)"
        except OSError:
            return "no such file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return f"cannot be read ({exc.strerror or exc})"


def member_id(path: str) -> tuple[int, int] | str:
    """A readable regular file's identity, (device, inode), else what is wrong with it: a
    folder member or a shard may be a dangling link, a loop of links, a directory, a pipe.
    Two paths with one identity are one file.  Never raises."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return link_problem(path, exc)
    except ValueError:  # a NUL in the name
        return "is not a valid file name"
    error = not_regular(path, st.st_mode)
    if error is not None:
        return str(error)[len(path) + 2 :]
    return st.st_dev, st.st_ino


def require_regular(path: str) -> None:
    """Raise ``not_regular``'s error before anything opens ``path`` (missing paths pass:
    the open reports them)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL in the name (the open reports both)
        return
    error = not_regular(path, mode)
    if error is not None:
        raise error


class ByteSource(Protocol):
    """A readable, sized sequence of bytes addressed by absolute offset."""

    name: str
    size: int

    def pread(self, offset: int, length: int) -> bytes:
        """Return exactly ``length`` bytes at ``offset`` (fewer only at end of file)."""

    def pread_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Read several ``(offset, length)`` ranges; remote sources coalesce them."""

    def close(self) -> None:
        """Release the underlying handle."""


class ReadsInto(ByteSource, Protocol):
    """A byte source that reads into the caller's buffer (a local file): no copy per read."""

    def readinto(self, offset: int, buf: bytearray | memoryview) -> int:
        """Fill ``buf`` from ``offset``; the number of bytes read."""


def reads_into(source: ByteSource) -> TypeGuard[ReadsInto]:
    """Whether ``source`` reads into a given buffer."""
    return hasattr(source, "readinto")


class LocalFile:
    """A local file read with positioned reads on one open descriptor."""

    __slots__ = ("name", "path", "size", "_fd", "reads", "bytes_read")
    first_read = 1 << 16
    """Small headers arrive with the first read; larger ones cost exactly one more."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = path
        self._fd = -1
        try:
            # Non-blocking, so that a named pipe cannot hang the open; checked just below.
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError as exc:
            raise InputError(f"{path}: {link_problem(path, exc)}") from None
        except IsADirectoryError:
            raise InputError(f"{path}: is a directory, expected a .safetensors file") from None
        except PermissionError:
            raise InputError(f"{path}: permission denied") from None
        except OSError as exc:
            raise InputError(f"{path}: {link_problem(path, exc)}") from None
        except ValueError:
            raise InputError(f"{path!r}: not a valid file name (it holds a NUL character)") from None
        st = os.fstat(self._fd)
        error = not_regular(path, st.st_mode)
        if error is not None:
            self.close()  # and forget the number: __del__ must not close it again once reused
            raise error
        _blocking(self._fd)
        self.size = st.st_size
        self.reads = 0
        self.bytes_read = 0

    def pread(self, offset: int, length: int) -> bytes:
        self.reads += 1
        data = os.pread(self._fd, length, offset)
        # A single pread may return short on some filesystems; finish the range.
        while len(data) < length:
            more = os.pread(self._fd, length - len(data), offset + len(data))
            if not more:
                break
            data += more
        self.bytes_read += len(data)
        return data

    def readinto(self, offset: int, buf: bytearray | memoryview) -> int:
        """Fill ``buf`` from ``offset`` without allocating (bulk comparisons reuse one buffer);
        returns the bytes read, fewer than ``len(buf)`` only at end of file."""
        view = memoryview(buf)
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
        self.reads += 1
        self.bytes_read += done
        return done

    def mapped(self, offset: int, length: int) -> memoryview | None:
        """A view of ``length`` bytes at ``offset``, mapped from the page cache
        instead of copied out of it (a whole-file dequantize copied a third of a GB with
        ``readinto``, on the decoder's critical path), or None where the file cannot be mapped
        so (no ``mmap``, a filesystem that refuses it, a kernel without
        ``MADV_POPULATE_READ``): read it instead.  The view keeps its mapping alive; the
        mapping goes with the last view or tensor made from it.

        The pages are mapped in one system call before this returns, and a range the file no
        longer holds (truncated since it was checked) raises ``InputError`` here, as a
        short read would.  Touching an unpopulated page past the end of a file kills the
        process (SIGBUS), so a file truncated by another program between this call and the
        decoding of the range still would: the window is one layer's decoding."""
        import mmap

        if length <= 0 or not sys.platform.startswith("linux"):  # the advice below is Linux's
            return None
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            # copy-on-write: a decoder that wrote into its input would change only its own copy
            m = mmap.mmap(self._fd, offset - base + length, access=mmap.ACCESS_COPY, offset=base)
        except ValueError:  # the range runs past the end of the file
            raise InputError(f"{self.path}: file ended early (truncated since it was checked?)") from None
        except OSError:
            return None
        try:
            m.madvise(_MADV_POPULATE_READ, 0, len(m))
        except OSError as exc:
            m.close()
            if exc.errno == errno.EFAULT:  # a page past the end of the file
                raise InputError(f"{self.path}: file ended early (truncated since it was checked?)") from None
            return None  # EINVAL: a kernel older than 5.14
        self.reads += 1
        self.bytes_read += length
        return memoryview(m)[offset - base :]

    def pread_many(self, ranges: list[tuple[int, int]], gap: int = 1 << 16) -> list[bytes]:
        """Ranges sorted by offset; neighbours closer than ``gap`` bytes share one read
        (markers usually sit together at the end of a file: one read for all of them)."""
        return coalesced_reads(self.pread, ranges, gap)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def coalesced_reads(pread, ranges: list[tuple[int, int]], gap: int) -> list[bytes]:
    """Serve ``ranges`` (sorted by offset) with as few ``pread`` calls as the gap allows."""
    out: list[bytes] = []
    i, n = 0, len(ranges)
    while i < n:
        start, length = ranges[i]
        end = start + length
        j = i + 1
        while j < n and ranges[j][0] - end <= gap and ranges[j][0] >= start:
            end = max(end, ranges[j][0] + ranges[j][1])
            j += 1
        if j == i + 1:
            out.append(pread(start, length))
        else:
            block = pread(start, end - start)
            for off, ln in ranges[i:j]:
                out.append(block[off - start : off - start + ln])
        i = j
    return out
