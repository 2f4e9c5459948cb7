"""How many cores a quantize run computes on, and in which shape: ``--jobs``.

``--jobs N`` is a promise about cores: the run computes on N of them.  One job is this
process computing one layer at a time with one torch thread (encode, then measure), beside
the writer; N jobs are N worker processes, each with its share of the cores.  That makes
``--jobs`` a dial the user can trust -- ``--jobs 1`` leaves the other cores to other work,
and each added job adds a core -- instead of a count of processes whose threads already
take every core.

Without ``--jobs`` (``auto``) the run uses every core in the shape that suits the plan:

* worker processes, one per core, when most of the work is in encoders that are compute
  bound far below disk speed (the format's ``heavy_encoder``, ``comfyquant.formats.base.Format``:
  several least-squares passes, a whole-layer GEMM) and there is enough of it to pay for starting
  the workers: separate processes then run the encoders' Python-driven steps side by side;
* otherwise this process alone with all its torch threads, the measurement of each layer in
  a second thread beside the next layer's encode: for the fast encoders the cost is reading
  and writing, and workers would only add their start-up and their spill files.

The number of workers never exceeds the quantized layers, nor what the machine's available
memory holds at the per-job budget (three dense copies of the largest layer plus the
interpreter), so ``auto`` cannot start more workers than the machine can feed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import InputError, option

AUTO = "auto"
POOL_MIN_BYTES = 512 << 20
"""Dense bytes of heavy-encoder layers from which ``auto`` starts worker processes: below it
their start-up (a fresh interpreter and torch import each) is not won back."""
JOB_OVERHEAD = 300 << 20
"""A job's memory besides its layers: the interpreter, torch and allocator slack."""


@dataclass(frozen=True)
class Jobs:
    """The resolved compute shape of a run."""

    workers: int
    """Worker processes; 0: the layers are computed in this process."""
    threads: int | None
    """Torch threads per job (None: this process keeps torch's setting)."""
    overlap: bool
    """In this process: the quality measurement runs in its own thread beside the encoder."""
    requested: str
    """What was asked for (``auto`` or the number), for the report."""

    def to_dict(self) -> dict:
        return {"requested": self.requested, "workers": self.workers, "threads": self.threads, "overlap": self.overlap}


def parse(jobs) -> int | None:
    """``--jobs`` as given (an int, a numeric string, ``"auto"`` or None) -> N, or None for auto."""
    if jobs is None or (isinstance(jobs, str) and jobs.strip().lower() == AUTO):
        return None
    if isinstance(jobs, bool):
        raise InputError(f"{option('--jobs', 'jobs')} must be a number of cores or 'auto', got {jobs!r}")
    try:
        n = int(jobs)
    except (TypeError, ValueError):
        raise InputError(f"{option('--jobs', 'jobs')} must be a number of cores or 'auto', got {jobs!r}") from None
    if n < 1:
        raise InputError(f"{option('--jobs', 'jobs')} must be at least 1, got {n}")
    return n


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve(jobs, plan, in_process_only: bool = False) -> Jobs:
    """The compute shape for ``jobs`` (see the module docstring).  ``in_process_only``: the
    layers can only be read in this process (a dialect file's translated view), so workers
    are not possible; the run then takes the cores asked for with threads."""
    n = parse(jobs)
    have = cores()
    if n is None:
        return _auto(plan, have, in_process_only)
    if n == 1:
        return Jobs(0, 1, False, "1")
    if in_process_only:
        return Jobs(0, min(n, have), True, str(n))
    # No more workers than layers to compute: each one costs a start-up (interpreter, torch)
    # and its memory, and the pool starts them all at once.
    return Jobs(max(1, min(n, len(plan.quantized))), max(1, have // n), False, str(n))


def _auto(plan, have: int, in_process_only: bool) -> Jobs:
    """Decided from the plan and the torch-free format descriptions: with workers, this
    process only writes and never imports torch."""
    from ..formats.registry import FORMATS

    heavy = [lp for lp in plan.quantized if FORMATS[lp.format].heavy_encoder]
    heavy_bytes = sum(_dense_bytes(lp) for lp in heavy)
    if have < 2 or in_process_only or heavy_bytes < POOL_MIN_BYTES:
        return Jobs(0, None, True, AUTO)
    largest = max(_dense_bytes(lp) for lp in plan.quantized)
    workers = min(have, len(heavy), _memory_cap(largest))
    if workers < 2:
        return Jobs(0, None, True, AUTO)
    return Jobs(workers, max(1, have // workers), False, AUTO)


def _dense_bytes(lp) -> int:
    """The layer's weight in its model dtype (a quantized source is decoded to it)."""
    from ..dtypes import DTYPE_BITS

    bits = DTYPE_BITS.get(lp.dtype or "BF16", 16)
    return lp.n * lp.k * bits // 8


def _memory_cap(largest: int) -> int:
    """Jobs that the available memory holds at the per-job budget (large if unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    return max(1, available // (3 * largest + JOB_OVERHEAD))
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 16
