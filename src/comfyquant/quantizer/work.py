"""The work on one layer: read its source weight, encode it, measure what was lost.

Runs in the main process (``--jobs 1``) or in worker processes, so a task is plain data:
file paths and byte ranges, never open handles or torch tensors.  Each worker opens the
input files itself and reads only the layer it was given, in row blocks as the encoder and
the quality measurement reach them: a job holds the encoded layer and a few blocks, never
the dense layer (peak memory per job stays within 3x the largest dense layer).

The quality numbers compare the decoded weight with the source (relative L2 error, cosine
similarity), block by block, and the layer's output on a fixed random input: the runtime's
forward (``codec.linear``, with its activation quantization) against the dense product
computed in F32.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from ..errors import InputError

QUALITY_ROWS = 16
"""Rows (tokens) of the fixed random input."""
QUALITY_SEED = 0

_SOURCES: dict[str, Any] = {}
_LOCK = threading.Lock()
"""Guards ``_SOURCES`` and the reads of virtual sources: ``--jobs 1`` reads in two threads."""


def _source(path: str):
    from ..io.source import LocalFile

    with _LOCK:
        src = _SOURCES.get(path)
        if src is None:
            src = _SOURCES[path] = LocalFile(path)
        return src


def use_sources(sources) -> None:
    """Read these byte sources by their names instead of opening the files of those names (a
    dialect file's translated view, ``comfyquant.dialects.view``: in this process only)."""
    for src in sources:
        _SOURCES[src.name] = src


def close_sources() -> None:
    """Close the files this process opened for tasks."""
    with _LOCK:
        for src in _SOURCES.values():
            src.close()
        _SOURCES.clear()


def read_spec(spec: tuple):
    """A tensor from ``(file, dtype, shape, start, nbytes)``, read straight into its own
    writable buffer (one copy in memory, not two)."""
    from ..numerics.dtypes import from_bytes

    file, dtype, shape, start, nbytes = spec
    return from_bytes(_pread(file, start, nbytes), dtype, shape)


def _pread(file: str, start: int, nbytes: int) -> bytearray:
    """``nbytes`` of ``file`` from ``start``, into a new buffer."""
    src = _source(file)
    fd = getattr(src, "_fd", None)
    if fd is None:  # a virtual source: its bytes are computed, not in a file (one read at a time)
        with _LOCK:
            data = src.pread(start, nbytes)
        if len(data) != nbytes:
            raise InputError(f"{file}: a tensor read short ({len(data)} of {nbytes} bytes)")
        return bytearray(data)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[done:]], start + done)
        if n <= 0:
            raise InputError(f"{file}: file ended early while reading a tensor (truncated?)")
        done += n
    return buf


def _file_rows(spec: tuple):
    """A 2-D tensor of the file as a ``RowSource``: each block
    is read when asked for, so the layer is never in memory whole (other shapes: the tensor)."""
    from ..numerics.dtypes import TORCH_DTYPES, from_bytes
    from ..numerics.rows import RowSource

    file, dtype, shape, start, nbytes = spec
    if len(shape) != 2 or not shape[0] or dtype not in TORCH_DTYPES:
        return read_spec(spec)  # the encoder refuses it with its own message
    row = nbytes // shape[0]

    def read(r0: int, r1: int):
        return from_bytes(_pread(file, start + r0 * row, (r1 - r0) * row), dtype, (r1 - r0, shape[1]))

    return RowSource(shape, TORCH_DTYPES[dtype], read)


def prefetch(task: dict) -> None:
    """Ask the kernel to start reading the layer's source bytes now (``POSIX_FADV_WILLNEED``):
    called when a layer is queued, so its weight comes from disk while the layers before it
    are encoded, and the encoder's passes find it in the page cache.  Only a hint: nothing
    is read into this process, and where the platform has no such call nothing happens."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    specs = [task["weight"]] if task["source"] == "dense" else list(task["src"].values())
    if task.get("reference"):
        specs.append(task["reference"])
    for file, _dtype, _shape, start, nbytes in specs:
        fd = getattr(_source(file), "_fd", None)
        if fd is not None and nbytes:
            try:
                advise(fd, start, nbytes, os.POSIX_FADV_WILLNEED)
            except OSError:
                return


def entry_spec(e) -> tuple:
    """The picklable read spec of a header entry."""
    return (e.file, e.dtype, tuple(e.shape), e.start, e.nbytes)


def task_for(lp, quality: bool = True, reference: tuple | None = None) -> dict:
    """Everything a worker needs for one planned layer (``reference``: the read spec of the
    original dense weight the quality is also measured against, ``--reference``)."""
    task = {
        "name": lp.name,
        "format": lp.format,
        "params": lp.params,
        "marker": lp.marker,
        "planned": lp.planned,
        "source": lp.source,
        "dtype": lp.dtype,
        "quality": quality,
        "reference": reference,
    }
    if lp.source == "dense":
        task["weight"] = entry_spec(lp.entries["weight"])
    else:
        task["src"] = {s: entry_spec(e) for s, e in lp.entries.items() if s != "comfy_quant"}
        task["src_format"] = lp.src_format
        task["src_marker"] = lp.src_marker
    return task


def load_source(task: dict):
    """The dense source weight: rows read from the file block by block as the encoder asks
    (every pass reads again: the page cache serves it), or the input's quantized layer
    decoded once, in row blocks, into one dense tensor."""
    if task["source"] == "dense":
        return _file_rows(task["weight"])
    from .. import codecs
    from ..formats.codec import CodecError
    from ..numerics.rows import materialize

    tensors = {s: read_spec(spec) for s, spec in task["src"].items()}
    try:
        source = codecs.get(task["src_format"]).row_source(
            tensors, task["src_marker"], dtype=task["dtype"].lower(), layer=task["name"]
        )
        # Decoded once and held (one dense layer, within the per-job memory budget): the
        # encoders make several passes over their source (W4A8's least squares: six or more),
        # and decoding the input again for each pass made convert 5x slower than quantize.
        return materialize(source)
    except CodecError as exc:
        raise InputError(f"cannot decode: {exc}") from None


def find_nonfinite(task: dict) -> str | None:
    """A description of the first NaN/Inf of the layer's source weight, or None (row blocks)."""
    from ..formats.codec import scan_nonfinite

    found = scan_nonfinite(load_source(task))
    if found is None:
        return None
    count, (r, c), _value = found
    return f"{count} NaN/Inf value(s), first at [{r}, {c}]"


def run_task(task: dict) -> dict:
    """Encode one layer and measure it: tensors (torch, as planned), the quality numbers and the
    time taken (a worker process's whole task; ``--jobs 1`` runs the two halves in threads)."""
    from ..numerics.rows import release_memory

    started = time.perf_counter()
    tensors, codec, source = encode_task(task)
    quality = measure_task(task, codec, source, tensors)
    release_memory()
    return {"tensors": tensors, "quality": quality, "seconds": time.perf_counter() - started}


def encode_task(task: dict) -> tuple[dict, Any, Any]:
    """The encoding half of ``run_task``: (tensors as planned, the codec, the source the
    measurement compares with)."""
    import torch

    from .. import codecs
    from ..formats.codec import CodecError
    from ..formats.planned import PlanError
    from ..numerics.dtypes import TORCH_DTYPES, dtype_name
    from ..numerics.rows import release_memory

    name, fmt = task["name"], task["format"]
    source = load_source(task)
    codec = codecs.get(fmt)
    try:
        enc = codec.encode(source, layer=name, **task["params"].encode_kwargs())
    except CodecError as exc:
        text = str(exc)
        if "NaN/Inf" in text:
            text += " (--keep-bad keeps such layers as they are)"
        raise InputError(text) from None
    planned = task["planned"]
    if set(enc) != set(planned):
        raise PlanError(f"{name}: the {fmt} encoder wrote {sorted(enc)}, the plan expected {sorted(planned)}")
    tensors = {}
    for suffix, (dtype, shape) in planned.items():
        t = enc[suffix]
        have = dtype_name(t.dtype)
        if have != dtype:
            if not (t.is_floating_point() and TORCH_DTYPES[dtype] == torch.float32 and t.dtype.itemsize < 4):
                raise PlanError(f"{name}: {suffix} came out {have}, the plan says {dtype}")
            t = t.to(torch.float32)  # exact upcast, e.g. comfy-kitchen's BF16 correction -> F32 (SGLang)
        if tuple(t.shape) != tuple(shape):
            raise PlanError(f"{name}: {suffix} came out {tuple(t.shape)}, the plan says {tuple(shape)}")
        tensors[suffix] = t.contiguous()
    for key, value in enc.marker.items():
        if task["marker"].get(key) != value:
            raise PlanError(f"{name}: the encoder's marker says {key}={value!r}, the planned marker {task['marker']}")
    del enc  # tensors upcast above are new: the encoder's originals go now
    release_memory()  # the encoder's freed blocks, before the measurement's
    return tensors, codec, source


def measure_task(task: dict, codec, source, tensors: dict) -> dict | None:
    """The measuring half of ``run_task`` (None without ``task["quality"]``)."""
    if not task["quality"]:
        return None
    reference = _file_rows(task["reference"]) if task.get("reference") else None
    return measure(codec, source, tensors, task["marker"], task["name"], reference)


def measure(codec, source, tensors: dict, marker: dict, name: str, reference=None) -> dict:
    """Relative L2 error and cosine similarity of the decoded weight and of the layer output.

    ``reference``: the original dense weight (``--reference``; a row source of the model's
    shape): the decoded weight and the layer output are measured against it as well, under
    ``"reference"`` -- for ``convert`` the error against the original, not the decoded input.

    One pass in the encoders' row blocks (``encode_block_elements``, ``Codec.measure_blocks``):
    each block of the decoded weight is compared with the same rows of ``source`` (a tensor
    or a row source, read once more), which also give their columns of the F32 reference
    product, and the quantized forward gives the same output features (work the decode and
    the forward share is done once).  Float GEMMs over fewer output features may differ from
    the runtime's single GEMM in the last bit, far below the digits reported."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from ..numerics.closeness import error_sums
    from ..numerics.rows import as_source, encode_block_elements

    source = as_source(source)
    block_elements = encode_block_elements()
    n, k = source.shape
    gen = torch.Generator().manual_seed(QUALITY_SEED)
    x = torch.randn(QUALITY_ROWS, k, generator=gen).to(source.dtype)
    xf = x.to(torch.float32)
    y_ref = torch.empty((QUALITY_ROWS, n), dtype=torch.float32)
    acc = torch.zeros(4, dtype=torch.float64)  # sum e^2, sum w^2, sum d*w, sum d^2
    ref_acc = torch.zeros(4, dtype=torch.float64)
    y_orig = torch.empty((QUALITY_ROWS, n), dtype=torch.float32) if reference is not None else None
    y = torch.empty((QUALITY_ROWS, n), dtype=torch.float32)
    # Decoded as iter_decode(exact=False): rotated layers too are decoded block by block
    # (comfy-kitchen's whole-layer un-rotation GEMM would hold two F32 copies of the layer; a
    # last bit cannot show here).
    for r0, r1, block, y_block in codec.measure_blocks(
        tensors, x, marker, dtype=source.dtype, layer=name, block_elements=block_elements
    ):
        # Formats that pad (NVFP4 to 16, MXFP8 to 32) decode the padding too when the encoded
        # tensors alone cannot tell the model's size: only the model's [n, k] is compared.
        if r0 >= n:
            break
        r1 = min(r1, n)
        block = block[: r1 - r0, :k].to(torch.float32)
        y[:, r0:r1] = y_block[:, : r1 - r0]
        w = source.rows(r0, r1).to(torch.float32)
        acc += error_sums(block, w)
        y_ref[:, r0:r1] = F.linear(xf, w)
        if reference is not None and y_orig is not None:
            o = reference.rows(r0, r1).to(torch.float32)
            ref_acc += error_sums(block, o)
            y_orig[:, r0:r1] = F.linear(xf, o)
    out = {"weight": _metrics(*(float(v) for v in acc)), "output": _metrics(*(float(v) for v in error_sums(y, y_ref)))}
    if reference is not None and y_orig is not None:
        out["reference"] = {
            "weight": _metrics(*(float(v) for v in ref_acc)),
            "output": _metrics(*(float(v) for v in error_sums(y, y_orig))),
        }
    return out


def _metrics(e2: float, r2: float, dot: float, d2: float) -> dict:
    from ..numerics.closeness import cosine, relative_l2

    return {"rel_l2": relative_l2(e2, r2), "cosine": cosine(r2, dot, d2)}


# -- worker processes -------------------------------------------------------------------------


def init_worker(threads: int) -> None:
    """Worker start: torch threads for this job's share of the cores, and exit when the parent
    dies (a killed ``quantize`` must not leave workers computing for nobody).

    Ctrl-C reaches the whole process group.  The main process reports the interruption in one
    line; a worker interrupted while it starts (importing torch) or while it waits for a task
    printed a ``KeyboardInterrupt`` traceback beside it.  So a worker starts with SIGINT
    blocked (``spawn``), and here takes it up with a handler that raises nothing between
    tasks (the worker then ends with the pool, its queued layers skipped) -- and during a task
    stops the task as before (its spill file is removed and the main process gets the
    interruption)."""
    import atexit
    import multiprocessing
    import signal
    import threading

    signal.signal(signal.SIGINT, _interrupted)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    import torch

    torch.set_num_threads(max(1, threads))
    # Registered after torch's own handlers, so it runs first: a worker whose tasks are done
    # leaves at once instead of tearing the interpreter down (torch, the heap: 0.7 s the
    # whole run waited for at its end).  Its spill files are closed after every task and its
    # results are written to the pipe when sent; only Python's own streams may hold output.
    atexit.register(_leave_now)
    parent = multiprocessing.parent_process()
    if parent is not None:

        def watch() -> None:
            from multiprocessing.connection import wait

            wait([parent.sentinel])
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()


_IN_TASK = False
"""Whether this worker is computing a task (``run_task_spilled``)."""
_STOPPING = False
"""Set by an interruption: the tasks already queued to this worker end at once."""
_RAISED = False
"""Whether this task's interruption was raised (its clean-up may be under way)."""
_CREATING = False
"""Whether this task is creating its spill file: an interruption then waits until the file's
name is known (raised inside the creation, it would leave a file nobody can name)."""
_DEFERRED = False
"""Whether an interruption came while the spill file was being created."""
_SENT_SPILL: str | None = None
"""The spill file of this worker's last result, until its next task starts (the pool sends a
result back before it hands the worker another task)."""


def _interrupted(signum, frame) -> None:
    global _STOPPING, _RAISED, _DEFERRED
    _STOPPING = True
    if _SENT_SPILL is not None:
        # Interrupted once a result was complete (returned, or about to be, and not yet
        # delivered): the run is being abandoned (Ctrl-C, or the pool closed after an error),
        # so nobody will write it.  The main process removes it too if it got it; whichever
        # comes second finds nothing.
        with contextlib.suppress(OSError):
            os.unlink(_SENT_SPILL)
    if _IN_TASK:
        # A second SIGINT (Ctrl-C reaches the process group, then the main process interrupts
        # its workers) must not cut short the clean-up of the first one's KeyboardInterrupt:
        # raised inside it, it left the task's spill file behind.
        if _RAISED:
            return
        if _CREATING:
            _DEFERRED = True
            return
        _RAISED = True
        raise KeyboardInterrupt
    # Between tasks the worker waits in the pool's call queue, holding that queue's lock (a
    # semaphore shared by every worker). Ending the process here would leave the lock held:
    # the other workers would wait for it forever, and so would the pool's shutdown. So the
    # worker goes on waiting: the layers queued to it end at once (_STOPPING), and the pool's
    # shutdown ends it as usual.


def _leave_now() -> None:
    """End a worker process at its exit without tearing the interpreter down."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


def worker_ready() -> None:
    """A task that does nothing: submitted once per worker when the pool is made, so that
    every worker process is started then rather than at its first layer."""


def run_task_spilled(task: dict, spill_dir: str) -> dict:
    """``run_task`` for a worker: the encoded tensors go to a spill file next to the output,
    and the result names (dtype, shape, offset, length) in it.  Passing bytes back through the
    pool would hold every tensor twice in the main process while it is unpickled; the main
    process instead streams the file into the output in small chunks."""
    from ..io.tempfiles import make_temp
    from ..numerics.dtypes import dtype_name

    global _IN_TASK, _SENT_SPILL, _RAISED, _CREATING, _DEFERRED
    _SENT_SPILL = None  # the previous result was delivered before this task was handed over
    _RAISED = _DEFERRED = False
    if _STOPPING:  # interrupted: the layers queued to this worker are not computed
        raise KeyboardInterrupt
    _IN_TASK = True
    path = None
    try:
        out = run_task(task)
        tensors = out["tensors"]
        out["tensors"] = {}
        _CREATING = True
        try:
            fd, path = make_temp(spill_dir, ".spill")  # named for this worker: a killed run's spill is removable
        finally:
            _CREATING = False
        if _DEFERRED and not _RAISED:  # interrupted while the file was made: now it can be removed
            _RAISED = True
            os.close(fd)
            raise KeyboardInterrupt
        with os.fdopen(fd, "wb") as fh:
            for suffix in list(tensors):
                t = tensors.pop(suffix)
                data = t.reshape(-1).view(_u8()).numpy()  # a view: written without a copy
                out["tensors"][suffix] = (dtype_name(t.dtype), tuple(t.shape), fh.tell(), data.nbytes)
                fh.write(memoryview(data))
                del t, data
        out["spill"] = _SENT_SPILL = path
        return out
    except BaseException:
        # interrupted (or failed) at any point once the spill file exists, also after its
        # result was complete: nobody will read it
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    finally:
        _IN_TASK = False


def _u8():
    import torch

    return torch.uint8
