"""The one writer of every file a command emits: safetensors files (header first, data
streamed) and the small files beside them (an index, a JSON report, a PNG plot), each through a
temporary file named for its owner, fsync, and an atomic rename made durable.

Tensors are given as ``(dtype, shape, data)`` where ``data`` is ``bytes`` or a callable that
yields byte chunks (so large tensors can be copied or computed piecewise without holding the
whole file in memory).  Nothing appears at ``path`` until the file is complete and synced; a
temporary file a killed run left behind is removed by the next write into its folder
(``comfyquant.io.tempfiles``).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, BinaryIO

from ..dtypes import DTYPE_BITS
from .tempfiles import sweep_stale, temp_prefix

if TYPE_CHECKING:
    from .direct import DirectStream


class CopyRange:
    """Tensor data to copy from an open file: done in the kernel (``copy_file_range``) when the
    platform allows, so untouched tensors never pass through Python."""

    __slots__ = ("fd", "offset", "length", "fallback")

    def __init__(self, fd: int, offset: int, length: int, fallback: Callable[[], Iterable[bytes]]) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length
        self.fallback = fallback


Data = bytes | bytearray | memoryview | CopyRange | Callable[[], Iterable[bytes]]
OnTensor = Callable[[str, str, int, int], None]
"""Called once a tensor is in the file: (temporary path, tensor name, offset, byte count)."""
Layout = Mapping[str, tuple[str, tuple, object]]
"""Tensors as the header sees them: name -> (dtype, shape, anything); the data is not read."""


def _nbytes(dtype: str, shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BITS[dtype] // 8


def _layout(tensors: Layout) -> Iterator[tuple[str, int, int]]:
    """``(name, start, stop)`` of each tensor's bytes in the data section, in file order."""
    offset = 0
    for name, (dtype, shape, _data) in tensors.items():
        n = _nbytes(dtype, shape)
        yield name, offset, offset + n
        offset += n


def build_header(tensors: Layout, metadata: dict[str, str] | None) -> bytes:
    """Header bytes (length prefix included), 8-byte aligned like the safetensors library."""
    obj: dict = {}
    if metadata:
        obj["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, start, stop in _layout(tensors):
        dtype, shape, _data = tensors[name]
        obj[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [start, stop]}
    text = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def data_offsets(tensors: Layout, metadata: dict[str, str] | None) -> dict[str, int]:
    """Where each tensor's bytes will start in the file ``write_safetensors`` writes for
    ``tensors`` and ``metadata`` (from the file's first byte)."""
    header = len(build_header(tensors, metadata))
    return {name: header + start for name, start, _stop in _layout(tensors)}


def _fault(stage: str) -> None:
    """Test hook: ``COMFYQUANT_FAULT=<stage>`` kills the process at that point of a write
    (stages: ``after-header``, ``after-tensor:N``, ``before-rename``).  Crash tests use it to
    prove that no partial file ever appears at the output path."""
    want = os.environ.get("COMFYQUANT_FAULT")
    if want and want == stage:
        os.kill(os.getpid(), signal.SIGKILL)


CHUNK = 8 << 20
"""Bytes per write: big enough for throughput, small enough to bound memory."""
FLUSH_EVERY = 256 << 20


class _Flusher:
    """Write-back in the background: every FLUSH_EVERY bytes a thread calls ``fdatasync`` so
    the disk works while we keep writing, and the final ``fsync`` has little left to do.
    (``fdatasync`` releases the GIL; durability still comes from the final ``fsync``.)"""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = 0
        self.thread: threading.Thread | None = None
        self.error: OSError | None = None

    def wrote(self, n: int) -> None:
        self.pending += n
        if self.pending >= FLUSH_EVERY and (self.thread is None or not self.thread.is_alive()):
            self.pending = 0
            self.thread = threading.Thread(target=self._sync, daemon=True)
            self.thread.start()

    def _sync(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:  # reported by the final fsync as well
            self.error = exc

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.join()


class NoSpace(OSError):
    """Too little free space for an output: raised before anything of it is written."""


def free_bytes(folder: str) -> int | None:
    """Bytes this process may still write on ``folder``'s filesystem (root may use the
    reserved blocks too), or None where the platform or filesystem cannot tell (and when
    ``COMFYQUANT_NO_SPACE_CHECK`` is set, for filesystems that report wrong numbers)."""
    if os.environ.get("COMFYQUANT_NO_SPACE_CHECK"):
        return None
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    if st.f_blocks == 0:  # some FUSE and network filesystems report no sizes at all
        return None
    blocks = st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def ensure_space(needs: Iterable[tuple[str, int]]) -> None:
    """Raise ``NoSpace`` (ENOSPC, with a message saying how much is needed and free) if
    the ``(folder, bytes)`` outputs cannot fit, summed per filesystem.  A 40 GB output then
    fails at once instead of after writing 12 GB of it."""
    per_fs: dict[int, list] = {}
    for folder, n in needs:
        try:
            dev = os.stat(folder).st_dev
        except OSError:
            continue  # the write itself reports a missing folder
        per_fs.setdefault(dev, [folder, 0])[1] += n
    for folder, n in per_fs.values():
        free = free_bytes(folder)
        if free is not None and n > free:
            from ..units import human_size

            need, have = human_size(n), human_size(free)
            if need == have:  # too close for the rounded sizes to show the difference
                need, have = f"{n:,} bytes", f"{free:,} bytes"
            raise NoSpace(errno.ENOSPC, f"needs {need}, only {have} free on {folder}")


def write_safetensors(
    path: str,
    tensors: dict[str, tuple[str, tuple, Data]],
    metadata: dict[str, str] | None = None,
    *,
    commit: bool = True,
    sync: bool = True,
    on_tensor: OnTensor | None = None,
    direct: bool = False,
) -> str:
    """Write ``tensors`` (in the given order) next to ``path`` in a temporary file, fsync it and
    rename it to ``path``.  With ``commit=False`` the temporary file's path is returned and the
    caller renames it with ``commit_file`` (after verifying it, for instance).  With
    ``sync=False`` as well, the caller makes it durable first (``BackgroundSync`` lets the
    disk catch up while the caller verifies the file).  ``on_tensor(temp path, name, offset,
    length)`` is called once each tensor's bytes are in the file, so a caller can verify them
    while later tensors are still being written.  ``direct=True`` writes a large file's
    tensor bytes with ``O_DIRECT`` where the filesystem allows (``comfyquant.io.direct``:
    a fraction of the CPU, no page cache; the same bytes): for outputs nothing re-reads soon
    (``dequantize``), not for ones a caller verifies by reading them back."""
    if commit and not sync:
        raise ValueError("an uncommitted file needs sync before commit: use commit=False with sync=False")
    header = build_header(tensors, metadata)
    folder = os.path.dirname(os.path.abspath(path))
    size = len(header) + sum(_nbytes(d, shape) for d, shape, _ in tensors.values())
    ensure_space([(folder, size)])
    sweep_stale(folder)  # temporary files of killed runs (named for their owner process)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb", buffering=0) as fh:
            stream = _direct_stream(fh.fileno(), tmp, folder, len(header), size) if direct else None
            if stream is not None:
                _write_direct(stream, fh.fileno(), tmp, path, header, tensors, on_tensor)
            else:
                _write_buffered(fh, tmp, path, header, tensors, on_tensor)
            if sync:
                os.fsync(fh.fileno())
        if commit:
            commit_file(tmp, path)
            return path
        return tmp
    except BaseException:
        discard(tmp)
        raise


DIRECT_MIN = 64 << 20
"""Files smaller than this are written buffered even with ``direct=True`` (the staging
buffers and a thread are not worth it)."""


def _direct_stream(fd: int, tmp: str, folder: str, start: int, size: int):
    """A ``DirectStream`` from offset ``start`` of the temporary
    file, or None (a small file, a filesystem without plain ``O_DIRECT``, or the open refused).
    The file gets its final size first, so no direct write extends it."""
    if size < DIRECT_MIN:
        return None
    from . import direct

    if not direct.supported(folder):
        return None
    try:
        stream = direct.DirectStream(fd, tmp, start)
    except OSError:
        return None
    try:
        os.ftruncate(fd, size)
    except OSError:
        stream.abort()
        return None
    return stream


def _write_buffered(fh: BinaryIO, tmp: str, path: str, header: bytes, tensors: dict, on_tensor: OnTensor | None) -> None:
    """Every byte through ``write`` (the kernel copies untouched tensors), write-back started
    in the background as the file grows."""
    flusher = _Flusher(fh.fileno())
    try:
        fh.write(header)
        offset = len(header)
        _fault("after-header")
        for i, (name, (dtype, shape, data)) in enumerate(tensors.items()):
            want = _nbytes(dtype, shape)
            got = 0
            if isinstance(data, CopyRange):
                got = _kernel_copy(data, fh.fileno(), flusher)
                data = data.fallback if got < data.length else None
            chunks = () if data is None else data() if callable(data) else (data,)
            for chunk in chunks:
                view: memoryview | None = memoryview(chunk)
                while view:
                    written = fh.write(view)
                    view = view[written:]
                got += len(chunk)
                flusher.wrote(len(chunk))
            chunk = view = None  # see _write_direct
            _check_size(path, name, dtype, shape, got, want)
            if on_tensor is not None:
                on_tensor(tmp, name, offset, want)
            offset += want
            _fault(f"after-tensor:{i}")
    finally:
        flusher.stop()


def _write_direct(
    stream: DirectStream, fd: int, tmp: str, path: str, header: bytes, tensors: dict, on_tensor: OnTensor | None
) -> None:
    """The same bytes as ``_write_buffered``, tensor data through ``stream`` (O_DIRECT);
    the header, and large untouched tensors (copied by the kernel), through ``fd``."""
    try:
        _pwrite(fd, header, 0)
        _fault("after-header")
        for i, (name, (dtype, shape, data)) in enumerate(tensors.items()):
            want = _nbytes(dtype, shape)
            offset = stream.pos
            got = 0
            if isinstance(data, CopyRange):
                if data.length < CHUNK:  # a bias, a norm: read into the staging buffer
                    got = data.length if stream.read_from(data.fd, data.offset, data.length) else -1
                else:
                    stream.flush()  # the kernel copy writes at stream.pos, after every staged byte
                    got = _kernel_copy(data, fd, None, stream.pos)
                    stream.pos += got
                if got < 0:
                    raise OSError(errno.EIO, f"{path}: the input ended early while copying tensor {name!r} (truncated?)")
                data = data.fallback if got < data.length else None
            chunks = () if data is None else data() if callable(data) else (data,)
            for chunk in chunks:
                stream.write(chunk)
                got += len(chunk)
            # The loop variable would keep the last chunk -- a view of the producer's memory --
            # alive until the next tensor's first chunk; a producer that reuses freed memory
            # (numerics.pages.reused_outputs) would see it still taken.
            chunk = None
            _check_size(path, name, dtype, shape, got, want)
            if on_tensor is not None:
                stream.wait()  # "in the file": the caller may read it back now
                on_tensor(tmp, name, offset, want)
            _fault(f"after-tensor:{i}")
        stream.close()
    finally:
        stream.abort()


def _check_size(path: str, name: str, dtype: str, shape, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{path}: tensor {name!r} produced {got} bytes, {dtype} {list(shape)} needs {want}")


def _pwrite(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class BackgroundSync:
    """``fsync`` of a finished file in a thread, so the write-back (the slowest part of a
    rewrite on most disks) overlaps whatever the caller does next, e.g. verifying the file.
    ``wait`` must return before the file is renamed into place; it re-raises a failure."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.error: OSError | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _kernel_copy(src: CopyRange, dst_fd: int, flusher: _Flusher | None, at: int | None = None) -> int:
    """Copy as much of ``src`` as the kernel will, at the file position or at offset ``at``;
    returns the bytes copied (0 if unsupported)."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return 0
    done = 0
    try:
        while done < src.length:
            n = min(CHUNK * 8, src.length - done)
            if at is None:
                n = copy(src.fd, dst_fd, n, src.offset + done)
            else:
                n = copy(src.fd, dst_fd, n, src.offset + done, at + done)
            if n == 0:
                break
            done += n
            if flusher is not None:
                flusher.wrote(n)
    except OSError as exc:
        if done == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
            return 0
        raise
    if 0 < done < src.length:
        raise OSError(errno.EIO, f"short copy: {done} of {src.length} bytes")
    return done


def commit_file(tmp: str, path: str) -> None:
    """Atomically move a finished temporary file into place and make the rename durable.

    Temporary files are private (0600); the result gets the permissions of the file it
    replaces, or those of a new file (0666 less the umask)."""
    _fault("before-rename")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    try:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is atomic


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stage_file(path: str, fill: Callable[[BinaryIO], None]) -> str:
    """Write a small output (an index, a JSON report, a PNG) the way every output is written:
    ``fill(binary file)`` into a private temporary file beside ``path`` named for this process
    (``tempfiles``, so a killed run's leftover is swept), fsynced; returns
    its path, for ``commit_file`` once everything the run writes is ready, or
    ``discard``."""
    folder = os.path.dirname(os.path.abspath(path))
    sweep_stale(folder)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        discard(tmp)
        raise
    return tmp


def write_file(path: str, fill: Callable[[BinaryIO], None]) -> None:
    """``stage_file`` and ``commit_file``: ``path`` holds the complete file or what it
    held before, never a part."""
    tmp = stage_file(path, fill)
    try:
        commit_file(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def json_filler(doc, indent: int = 1) -> Callable[[BinaryIO], None]:
    """What ``stage_file`` writes for a JSON document (UTF-8, a final newline)."""
    data = (json.dumps(doc, indent=indent) + "\n").encode("utf-8")

    def fill(fh: BinaryIO) -> None:
        fh.write(data)

    return fill


def discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
