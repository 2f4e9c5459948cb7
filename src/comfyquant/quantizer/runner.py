"""Stream a plan into the output files: compute layers in order, write, check, then commit.

The header of every output file is known from the plan, so each file is written front to
back by ``comfyquant.io.writer.write_safetensors`` into a temporary file next to its
destination: dense tensors are copied by the kernel, quantized tensors are produced when the
writer reaches them -- computed ahead, so reading, encoding, measuring and writing overlap.
The layers are computed in this process (``_InProcess``: ``--jobs 1`` on one core, or
``auto`` with every core and the measurement in a thread of its own) or by worker processes
that compute up to 2N layers ahead, handing each over in a spill file (``_Pool``);
``jobs`` decides which.  Results are consumed in file order, and memory stays bounded by a
few layers (see each class).

After the last byte, the temporary files are opened again and checked with
``comfyquant check --target``; only an output that passes is renamed into place (and its
index written last).  A crash, a kill or a failed check leaves nothing at the output paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..errors import InputError
from ..formats.planned import PlanError
from ..io.copying import copy_range, read_chunks
from ..io.index import write_index
from ..io.jsontext import parse as parse_json
from ..io.outputs import claim
from ..io.progress import Progress
from ..io.shards import ShardSet
from ..io.source import LocalFile
from ..io.writer import commit_file, discard, write_safetensors
from ..markers import DROP_METADATA
from ..version import __version__
from .jobs import Jobs
from .layout import marker_entries
from .plan import DECODE, DENSE, QUANTIZE, LayerPlan, Plan, new_problems, output_files
from .work import prefetch, run_task_spilled, task_for

if TYPE_CHECKING:
    from ..checker.report import Report
    from ..checkpoint import Checkpoint
    from ..io.outputs import Outputs

STAMP_KEY = "comfyquant"
"""The metadata key ``fix`` stamps as well: tool, version and the history of what was done."""


def output_paths(ckpt: Checkpoint, out: str | None, overwrite: bool, tag: str, also: Sequence[str] = ()) -> Outputs:
    """The run's ``Outputs`` (refused before any work): one input
    file gives one output file (``OUT``, or ``OUT/<name>.<tag>.safetensors`` when OUT is a
    folder, default ``<name>.<tag>.safetensors``); shards give a folder ``OUT`` with the same shard names and
    the index rewritten.  ``also``: the report files."""
    return claim(list(ckpt.files), ckpt.shardset.index_path, out, overwrite=overwrite, tag=tag, also=tuple(also))


class _InProcess:
    """Layers computed in this process, beside the writer (``--jobs 1``, or ``auto``).

    The encoder thread encodes the layers in file order, at most ``AHEAD`` layer ahead of
    the one the writer waits for, so writing layer i and encoding layer i+1 overlap (torch and
    the writer's system calls release the GIL).  With ``overlap`` (``auto``: every core) a
    measurement thread measures each encoded layer while the encoder goes on with the next,
    so the encoder's single-threaded steps leave the other cores to the measurement; without
    it (``--jobs 1``: one core, one torch thread) the encoder thread measures each layer
    itself.  The bytes written do not depend on the threads: each layer is encoded by one
    thread.

    Memory: the encoder waits, before layer j, until layer j-2 is measured, so at most the
    layer being written, one encoded layer waiting and the one being encoded are held, plus
    the blocks of one encode and one measurement.  A layer decoded from a quantized input
    (``convert``) holds its dense source until it is measured; it is measured in the encoder
    thread, so no two decoded sources are held at once."""

    AHEAD = 1

    def __init__(self, quality: bool, references: dict | None = None, threads: int | None = None, overlap: bool = True) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.restore = _use_threads(threads)  # before the threads below start: they inherit it
        self.overlap = overlap
        self.quality = quality
        self.references = references or {}
        self.encoder = ThreadPoolExecutor(1, thread_name_prefix="comfyquant-encode")
        self.measurer = ThreadPoolExecutor(1, thread_name_prefix="comfyquant-measure")
        self.order: list[LayerPlan] = []
        self.index: dict[str, int] = {}
        self.futures: dict[str, Future] = {}
        self.measured: dict[int, Future] = {}  # by position in the order (encoder thread only)
        self.next = 0
        self.tasks: dict[int, dict] = {}  # announced (read ahead), not yet submitted

    def start(self, order: list[LayerPlan]) -> None:
        self.order = order
        self.index = {lp.name: i for i, lp in enumerate(order)}
        self._submit(self.AHEAD)

    def _submit(self, last: int) -> None:
        """Submit the layers up to ``last``, and announce the layer after them to the kernel:
        its weight is read while the submitted ones are encoded (and measured: ``--jobs 1``
        does both in one thread before it takes the next layer)."""
        while self.next <= min(last, len(self.order) - 1):
            task = self._task(self.next)
            del self.tasks[self.next]
            self.futures[task["name"]] = self.encoder.submit(self._encode, task, self.next)
            self.next += 1
        if self.next < len(self.order):
            self._task(self.next)

    def _task(self, index: int) -> dict:
        """The task of the layer at ``index``, made and announced (read ahead) once."""
        task = self.tasks.get(index)
        if task is None:
            lp = self.order[index]
            task = self.tasks[index] = task_for(lp, self.quality, self.references.get(lp.name))
            prefetch(task)
        return task

    def _encode(self, task: dict, index: int) -> tuple[dict, Future, float]:
        """Encode the layer at ``index`` of the order (in the encoder thread, one at a time)."""
        from concurrent.futures import wait

        from .work import encode_task, measure_task

        before = self.measured.pop(index - 2, None)
        if before is not None:
            wait([before])  # layer j-2's measurement: bounds the layers held
        started = time.perf_counter()
        tensors, codec, source = encode_task(task)
        seconds = time.perf_counter() - started
        if task["source"] == "dense" and self.overlap:
            quality = self.measurer.submit(_timed, measure_task, task, codec, source, tensors)
        else:
            quality = _done(_timed(measure_task, task, codec, source, tensors))
        self.measured[index] = quality
        return tensors, quality, seconds

    def result(self, lp: LayerPlan) -> dict:
        self._submit(self.index[lp.name] + self.AHEAD)
        tensors, quality, seconds = self.futures.pop(lp.name).result()
        return {"tensors": tensors, "quality": quality, "seconds": seconds}

    def written(self, lp: LayerPlan) -> None:
        pass

    def close(self) -> None:
        from .work import close_sources

        self.encoder.shutdown(wait=True, cancel_futures=True)
        self.measurer.shutdown(wait=True, cancel_futures=True)
        self.futures.clear()
        close_sources()
        if self.restore is not None:
            _use_threads(self.restore)
            self.restore = None


def _use_threads(threads: int | None) -> int | None:
    """Set torch's threads for this process; returns the previous count (None: unchanged).
    Threads started later take the new count on their first parallel operation."""
    if threads is None:
        return None
    import torch

    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(threads)
    return before


def _timed(fn: Callable, *args) -> tuple[object, float]:
    started = time.perf_counter()
    return fn(*args), time.perf_counter() - started


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class _Pool:
    """``--jobs N``: worker processes compute layers ahead of the writer, in file order.

    Up to ``WINDOW`` ``* N`` layers are submitted and not yet written: a worker that
    finished a short layer takes the next one at once instead of waiting for the writer to
    reach it (the finished layers wait in their spill files, on disk, not in memory)."""

    WINDOW = 2

    def __init__(self, jobs: int, threads: int, quality: bool, spill_dir: str, references: dict | None = None) -> None:
        from concurrent.futures import ProcessPoolExecutor

        from .spawn import worker_context
        from .work import init_worker, worker_ready

        self.jobs = jobs
        self.quality = quality
        self.references = references or {}
        self.spill_dir = spill_dir
        self.pool = ProcessPoolExecutor(
            max_workers=jobs, mp_context=worker_context(), initializer=init_worker, initargs=(threads,)
        )
        for _ in range(jobs):  # every worker starts now (interpreter, torch import), not at its first layer
            self.pool.submit(worker_ready)
        self.order: list[LayerPlan] = []
        self.futures: dict[str, Future] = {}
        self.next = 0

    def start(self, order: list[LayerPlan]) -> None:
        self.order = order
        self._fill()

    def _fill(self) -> None:
        while self.next < len(self.order) and len(self.futures) < self.WINDOW * self.jobs:
            lp = self.order[self.next]
            task = task_for(lp, self.quality, self.references.get(lp.name))
            prefetch(task)  # the page cache is shared: the worker finds the bytes read
            self.futures[lp.name] = self.pool.submit(run_task_spilled, task, self.spill_dir)
            self.next += 1

    def result(self, lp: LayerPlan) -> dict:
        from concurrent.futures.process import BrokenProcessPool

        future = self.futures.pop(lp.name)
        try:
            self._fill()  # the next layers are queued while this one is awaited
            out = future.result()
            spill = _open_spill(out["spill"])
        except BrokenProcessPool:
            raise InputError("a worker process died (out of memory?); try fewer --jobs") from None
        except BaseException:
            # Interrupted while queueing the next layers or waiting (Ctrl-C): the layer may
            # still be computed and spilled, or be spilled and not yet taken over; back among
            # the futures, ``close`` waits for it and removes its spill file.  (Its worker may
            # have started another layer by then, so it no longer removes this one itself.)
            self.futures[lp.name] = future
            raise
        del out["spill"]  # taken over (the future is no longer among those close() cleans up)
        out["tensors"] = {
            s: (dtype, shape, (spill, offset, length)) for s, (dtype, shape, offset, length) in out["tensors"].items()
        }
        out["quality"] = _done((out["quality"], 0.0))
        return out

    def written(self, lp: LayerPlan) -> None:
        pass

    def close(self) -> None:
        unfinished = [f for f in self.futures.values() if not f.done()]
        for f in self.futures.values():
            f.cancel()
        if unfinished:  # an error or an interruption: stop the workers' queued layers too
            self._interrupt_workers()
        self.pool.shutdown(wait=True, cancel_futures=True)
        for f in self.futures.values():  # computed but never written: remove their spill files
            if not f.cancelled() and f.exception() is None:
                with contextlib.suppress(FileNotFoundError):  # an interrupted worker may have removed it
                    os.unlink(f.result()["spill"])
        self.futures.clear()
        from .work import close_sources

        close_sources()  # the files opened here for the read-ahead hints

    def _interrupt_workers(self) -> None:
        """SIGINT to every worker (``work.init_worker`` handles it): the layer being
        computed stops and removes its spill file, and the layers already queued to a worker
        are not computed.  Without this, closing the pool after an error waited for up to
        2N layers that nobody would write (2-5 s after a Ctrl-C, measured)."""
        import signal

        if not hasattr(os, "killpg"):  # POSIX signals only
            return
        processes = getattr(self.pool, "_processes", None) or {}  # the executor's pid -> process
        for process in list(processes.values()):
            try:
                os.kill(process.pid, signal.SIGINT)
            except (ProcessLookupError, AttributeError):
                pass


def _open_spill(path: str) -> LocalFile:
    """A worker's spill file, opened and unlinked at once: nothing is left behind even if this
    process dies later; the open descriptor keeps the data until it is closed."""
    spill = LocalFile(path)
    os.unlink(path)
    return spill


class Runner:
    """Builds the writer's tensor tables with lazily computed layers and records results.

    Progress is counted in write order: the copies written before a quantized layer are
    counted when that layer's first tensor is requested (kernel copies cannot report as
    they go), the rest when the file ends."""

    def __init__(
        self,
        ckpt: Checkpoint,
        plan: Plan,
        jobs: Jobs,
        quality: bool,
        progress: Progress,
        on_layer: Callable[[LayerPlan, dict], None] | None = None,
        spill_dir: str = ".",
        references: dict | None = None,
    ) -> None:
        self.ckpt = ckpt
        self.plan = plan
        self.compute = (
            _InProcess(quality, references, jobs.threads, jobs.overlap)
            if not jobs.workers
            else _Pool(jobs.workers, jobs.threads or 1, quality, spill_dir, references)
        )
        self.progress = progress
        self.on_layer = on_layer
        self.results: dict[str, dict] = {}
        self.tables: list[tuple[str, dict, dict]] = []
        self._pending: dict[str, dict] = {}
        self._copied = [0, 0]  # bytes and layers copied since the last computed layer
        self._tails: list[list[int]] = []  # per file: the copies after its last computed layer
        self._closed = False
        self._measuring: list[tuple[LayerPlan, Future, float]] = []  # in order; quality may still be computed

    def settle(self, wait: bool = True) -> None:
        """Record the layers whose quality is known, in file order (``wait``: all of them),
        and tell ``on_layer``.  A measurement's failure is raised here."""
        while self._measuring and (wait or self._measuring[0][1].done()):
            lp, future, seconds = self._measuring.pop(0)
            quality, measured = future.result()
            self.results[lp.name] = {"quality": quality, "seconds": seconds + measured}
            if self.on_layer is not None:
                self.on_layer(lp, self.results[lp.name])

    def files(self) -> list[tuple[str, dict, dict]]:
        """Per input file: (input file, tensor table for the writer, metadata)."""
        order: list[LayerPlan] = []
        for file, items in output_files(self.ckpt, self.plan):
            tensors: dict = {}
            markers: dict[str, dict] = {}
            for lp in items:
                if not isinstance(lp, LayerPlan):  # a tensor of no layer
                    tensors[lp.name] = (lp.dtype, lp.shape, self._copy(lp))
                    continue
                if lp.action == QUANTIZE:
                    order.append(lp)
                    tensors.update(self._quantized(lp))
                elif lp.action == DECODE:
                    tensors.update(self._decoded(lp))
                else:
                    for suffix, e in lp.entries.items():
                        if suffix != "comfy_quant":
                            tensors[e.name] = (e.dtype, e.shape, self._copy(e))
                    self._copied[1] += 1
                if lp.marker is not None and lp.action != DENSE:
                    markers[lp.name] = lp.marker
            mt, meta = marker_entries(markers)
            tensors.update(mt)
            self._tails.append(self._copied)
            self._copied = [0, 0]
            self.tables.append((file, tensors, self._metadata(file, meta)))
        self.compute.start(order)
        return self.tables

    def flush(self, file_index: int) -> None:
        """Count the copies written after the last computed layer of output file ``file_index``."""
        nbytes, layers = self._tails[file_index]
        self.progress.add(nbytes, layers)

    def _copy(self, entry):
        self._copied[0] += entry.nbytes
        return copy_range(self.ckpt.source(entry.file), entry.start, entry.nbytes)

    def _quantized(self, lp: LayerPlan) -> dict:
        """The layer's planned tensors (computed when the writer reaches the first), its bias."""
        out: dict[str, tuple] = {}
        before, self._copied = self._copied, [0, 0]

        def producer(suffix: str) -> Callable[[], Iterator[bytes | memoryview]]:
            def chunks() -> Iterator[bytes | memoryview]:
                state = self._pending.get(lp.name)
                if state is None:
                    self.progress.add(before[0], before[1])
                    result = self.compute.result(lp)
                    state = self._pending[lp.name] = dict(result["tensors"])
                    self._measuring.append((lp, result["quality"], result["seconds"]))
                    self.progress.add(lp.bytes_in, 1)
                    self.settle(wait=False)
                t = state.pop(suffix)
                last = not state
                if last:
                    del self._pending[lp.name]
                if isinstance(t, tuple):  # from a worker's spill file (this process never imports torch)
                    spill, offset, length = t[2]
                    yield from read_chunks(spill, offset, length)()
                    if last:
                        spill.close()
                else:
                    from ..numerics.dtypes import to_bytes

                    yield to_bytes(t)
                del t
                if last:
                    self.compute.written(lp)

            return chunks

        for suffix, (dtype, shape) in lp.planned.items():
            out[f"{lp.name}.{suffix}"] = (dtype, shape, producer(suffix))
        bias = lp.entries.get("bias")
        if bias is not None:
            out[bias.name] = (bias.dtype, bias.shape, copy_range(self.ckpt.source(bias.file), bias.start, bias.nbytes))
        return out

    def _decoded(self, lp: LayerPlan) -> dict:
        """A quantized layer written as its dense weight (computed here, when the writer reaches
        it; one layer in memory), and its bias."""

        fmt, dtype = lp.src_format, lp.dtype
        if fmt is None or dtype is None:
            raise PlanError(f"{lp.name}: planned to decode without its source format and model dtype")

        def chunks() -> Iterator[bytes | memoryview]:
            from .. import codecs
            from ..numerics.dtypes import TORCH_DTYPES, to_bytes
            from .work import entry_spec, read_spec

            stored = {s: read_spec(entry_spec(e)) for s, e in lp.entries.items() if s not in ("comfy_quant", "bias")}
            weight = codecs.get(fmt).decode(stored, lp.src_marker, dtype=TORCH_DTYPES[dtype], layer=lp.name)
            if tuple(weight.shape) != (lp.n, lp.k):
                weight = weight[: lp.n, : lp.k]
            self.progress.add(lp.bytes_in, 1)
            yield to_bytes(weight.to(TORCH_DTYPES[dtype]).contiguous())
            del weight

        out: dict[str, tuple] = {f"{lp.name}.weight": (dtype, (lp.n, lp.k), chunks)}
        bias = lp.entries.get("bias")
        if bias is not None:
            out[bias.name] = (bias.dtype, bias.shape, copy_range(self.ckpt.source(bias.file), bias.start, bias.nbytes))
        return out

    def _metadata(self, file: str, marker_meta: dict) -> dict[str, str]:
        """The input file's metadata, its marker map replaced, and the version stamp."""
        meta = {k: v for k, v in self.ckpt.metadata(file).items() if k not in DROP_METADATA}
        meta.update(marker_meta)
        history = []
        previous = meta.get(STAMP_KEY)
        if previous:
            try:
                history = list(parse_json(previous).get("history", []))
            except (ValueError, AttributeError, TypeError):
                history = []
        entry = {
            "version": __version__,
            "command": self.plan.mode,
            "target": self.plan.target,
            "formats": self.plan.formats(),
            "quantized": len(self.plan.quantized),
        }
        meta[STAMP_KEY] = json.dumps(
            {
                "tool": "comfyquant",
                "version": __version__,
                "command": self.plan.mode,
                "formats": self.plan.formats(),
                "history": history + [entry],
            }
        )
        return meta

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.compute.close()


def execute(
    ckpt: Checkpoint,
    plan: Plan,
    dests: list[str],
    index_dest: str | None,
    *,
    jobs: Jobs,
    quality: bool = True,
    progress: Progress | None = None,
    on_layer=None,
    references: dict | None = None,
    redirect: Callable | None = None,
    also: Callable | None = None,
) -> tuple[dict[str, dict], Report]:
    """Write, check and commit; returns (per-layer results, the check report of the output).

    ``references``: layer -> read spec of its original dense weight (``--reference``), measured
    too.  ``redirect(results, dests, index_dest)``: called once the output passed its check,
    before anything is renamed into place; returns the destinations to commit to (the
    ``--max-error`` gate keeps an output over the limit under another name).
    ``also(results, report, dests, index_dest)``: more files of the run (``--report``), staged
    by the caller as ``(temporary file, destination)`` pairs and committed with the output, after
    the model files and the index: a failure before the first rename leaves nothing."""
    from ..checker.run import check_checkpoint
    from ..checkpoint import open_checkpoint

    progress = progress or Progress(0, 0, enabled=False)
    runner = Runner(
        ckpt, plan, jobs, quality, progress, on_layer, spill_dir=os.path.dirname(os.path.abspath(dests[0])), references=references
    )
    temps: list[str] = []
    try:
        tables = runner.files()
        for i, ((_file, tensors, meta), dest) in enumerate(zip(tables, dests)):
            try:
                temps.append(write_safetensors(dest, tensors, meta, commit=False))
            except OSError as exc:
                raise InputError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was written") from None
            runner.flush(i)
        runner.settle()
        runner.close()
        progress.done()
        with open_checkpoint(temps, shardset=ShardSet(files=list(temps))) as out:
            report = check_checkpoint(out, target=plan.target)
        found = [] if report.ok else new_problems(report, ckpt, plan.target, warnings=False)
        if found:
            raise InputError(
                f"the written output fails check --target {plan.target}: {found[0]}; nothing was written (please report this)"
            )
        if redirect is not None:
            dests, index_dest = redirect(runner.results, dests, index_dest)
        staged = list(zip(temps, dests))
        if index_dest:
            weight_map = {name: os.path.basename(dest) for (_f, tensors, _m), dest in zip(tables, dests) for name in tensors}
            staged.append((write_index(weight_map, index_dest, ckpt.shardset.index_path, commit=False), index_dest))
            temps.append(staged[-1][0])
        if also is not None:
            extra = also(runner.results, report, dests, index_dest)
            staged += extra
            temps += [t for t, _ in extra]
        for temp, dest in staged:
            commit_file(temp, dest)  # also gives the private temporary file normal permissions
            temps.remove(temp)
        return runner.results, report
    finally:
        runner.close()
        progress.done()
        for t in temps:
            discard(t)
