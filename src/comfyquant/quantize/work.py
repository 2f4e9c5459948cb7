"""The work on one layer: read its source weight, encode it, measure what was lost.

Runs in the main process (``--jobs 1``) or in worker processes, so a task is plain data:
file paths and byte ranges, never open handles or torch tensors.  Each worker opens the
input files itself and reads only the layer it was given, which keeps memory at one layer
per job.

The quality numbers compare the decoded weight with the source (relative L2 error, cosine
similarity), block by block so no second dense copy of the layer is made, and the layer's
output on a fixed random input: the runtime's forward (``codec.linear``, with its activation
quantization) against the dense product computed in F32.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..errors import InputError

QUALITY_ROWS = 16
"""Rows (tokens) of the fixed random input."""
QUALITY_SEED = 0
REFERENCE_BLOCK = 1 << 22
"""Weight elements per block of the F32 reference product (bounded temporaries)."""

_SOURCES: dict[str, Any] = {}


def _source(path: str):
    from ..io.source import LocalFile

    src = _SOURCES.get(path)
    if src is None:
        src = _SOURCES[path] = LocalFile(path)
    return src


def close_sources() -> None:
    """Close the files this process opened for tasks."""
    for src in _SOURCES.values():
        src.close()
    _SOURCES.clear()


def _read(spec: tuple):
    """A tensor from ``(file, dtype, shape, start, nbytes)``, read straight into its own
    writable buffer (one copy of the layer in memory, not two)."""
    from ..numerics.dtypes import from_bytes

    file, dtype, shape, start, nbytes = spec
    buf = bytearray(nbytes)
    view = memoryview(buf)
    fd = _source(file)._fd
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[done:]], start + done)
        if n <= 0:
            raise InputError(f"{file}: file ended early while reading a tensor (truncated?)")
        done += n
    return from_bytes(buf, dtype, shape)


def entry_spec(e) -> tuple:
    """The picklable read spec of a header entry."""
    return (e.file, e.dtype, tuple(e.shape), e.start, e.nbytes)


def task_for(lp, quality: bool = True) -> dict:
    """Everything a worker needs for one planned layer."""
    task = {"name": lp.name, "format": lp.format, "params": lp.params, "marker": lp.marker, "planned": lp.planned,
            "source": lp.source, "dtype": lp.dtype, "quality": quality}
    if lp.source == "dense":
        task["weight"] = entry_spec(lp.entries["weight"])
    else:
        task["src"] = {s: entry_spec(e) for s, e in lp.entries.items() if s != "comfy_quant"}
        task["src_format"] = lp.src_format
        task["src_marker"] = lp.src_marker
    return task


def load_weight(task: dict):
    """The dense source weight: read as stored, or decoded from the input's quantized layer."""
    if task["source"] == "dense":
        return _read(task["weight"])
    from .. import codecs
    from ..codecs.base import CodecError

    tensors = {s: _read(spec) for s, spec in task["src"].items()}
    try:
        return codecs.get(task["src_format"]).decode(tensors, task["src_marker"], dtype=task["dtype"].lower(),
                                                      layer=task["name"])
    except CodecError as exc:
        raise InputError(f"cannot decode: {exc}") from None


def find_nonfinite(task: dict) -> str | None:
    """A description of the first NaN/Inf of the layer's source weight, or None (row blocks)."""
    import torch

    w = load_weight(task)
    rows = max(1, REFERENCE_BLOCK // max(1, w.shape[1]))
    for r0 in range(0, w.shape[0], rows):
        bad = ~torch.isfinite(w[r0:r0 + rows])
        if bad.any():
            r, c = (int(v) for v in bad.nonzero()[0])
            count = int((~torch.isfinite(w)).sum())
            return f"{count} NaN/Inf value(s), first at [{r0 + r}, {c}]"
    return None


def run_task(task: dict) -> dict:
    """Encode one layer: tensors (torch, as planned), the quality numbers and the time taken."""
    import torch

    from .. import codecs
    from ..codecs.base import CodecError
    from ..numerics.dtypes import TORCH_DTYPES, dtype_name
    from .layout import PlanError
    from .params import encode_params

    started = time.perf_counter()
    name, fmt = task["name"], task["format"]
    weight = load_weight(task)
    codec = codecs.get(fmt)
    try:
        enc = codec.encode(weight, layer=name, **encode_params(fmt, task["params"]))
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
    held = [weight]
    del weight  # measure() drops the source before running the layer: one dense copy at a time
    quality = measure(codec, held, tensors, task["marker"], name) if task["quality"] else None
    return {"tensors": tensors, "quality": quality, "seconds": time.perf_counter() - started}


def measure(codec, held: list, tensors: dict, marker: dict, name: str) -> dict:
    """Relative L2 error and cosine similarity of the decoded weight and of the layer output.

    ``held`` is a one-element list with the source weight; it is emptied before the
    quantized forward runs, so the source and the forward's temporaries never coexist."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    weight = held.pop()
    n, k = weight.shape
    acc = torch.zeros(4, dtype=torch.float64)  # sum e^2, sum w^2, sum d*w, sum d^2
    r0 = 0
    for block in codec.iter_decode(tensors, marker, dtype=weight.dtype, layer=name):
        rows = block.shape[0]
        w = weight[r0:r0 + rows].to(torch.float32)
        d = block.to(torch.float32)
        acc += torch.stack([(d - w).pow_(2).sum(dtype=torch.float64), w.pow(2).sum(dtype=torch.float64),
                            (d * w).sum(dtype=torch.float64), d.pow(2).sum(dtype=torch.float64)])
        r0 += rows
    gen = torch.Generator().manual_seed(QUALITY_SEED)
    x = torch.randn(QUALITY_ROWS, k, generator=gen).to(weight.dtype)
    xf = x.to(torch.float32)
    rows = max(1, REFERENCE_BLOCK // max(1, k))
    y_ref = torch.cat([F.linear(xf, weight[r:r + rows].to(torch.float32)) for r in range(0, n, rows)], dim=1)
    del weight
    y = codec.linear(x, tensors, marker, layer=name).to(torch.float32)
    e2, w2, dw, d2 = (float(v) for v in acc)
    return {"weight": _metrics(e2, w2, dw, d2), "output": _metrics(
        float((y - y_ref).pow(2).sum(dtype=torch.float64)), float(y_ref.pow(2).sum(dtype=torch.float64)),
        float((y * y_ref).sum(dtype=torch.float64)), float(y.pow(2).sum(dtype=torch.float64)))}


def _metrics(e2: float, r2: float, dot: float, d2: float) -> dict:
    rel = (e2 / r2) ** 0.5 if r2 > 0 else (0.0 if e2 == 0 else float("inf"))
    cos = dot / (r2 * d2) ** 0.5 if r2 > 0 and d2 > 0 else (1.0 if r2 == d2 == 0 else 0.0)
    return {"rel_l2": rel, "cosine": cos}


# -- worker processes -------------------------------------------------------------------------

def init_worker(threads: int) -> None:
    """Worker start: torch threads for this job's share of the cores, and exit when the parent
    dies (a killed ``quantize`` must not leave workers computing for nobody)."""
    import multiprocessing
    import threading

    import torch

    torch.set_num_threads(max(1, threads))
    parent = multiprocessing.parent_process()
    if parent is not None:
        def watch() -> None:
            from multiprocessing.connection import wait

            wait([parent.sentinel])
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()


def run_task_bytes(task: dict) -> dict:
    """``run_task`` for a worker: tensors as (dtype, shape, bytes), which pickle cheaply."""
    from ..numerics.dtypes import dtype_name

    out = run_task(task)
    out["tensors"] = {s: (dtype_name(t.dtype), tuple(t.shape), t.reshape(-1).view(_u8()).numpy().tobytes())
                      for s, t in out["tensors"].items()}
    return out


def _u8():
    import torch

    return torch.uint8
