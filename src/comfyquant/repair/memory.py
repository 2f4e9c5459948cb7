"""A checkpoint read as ``fix`` would write it, without writing it.

A loader inside a runtime (the ComfyUI node) wants what ``fix`` and ``migrate`` would produce
-- other writers' layouts translated exactly, lossless repairs applied, with ``allow_lossy``
the re-encodes too -- but as tensors in memory, with nothing written to disk.  The plan is
``fix``'s own (``plan_repairs``) and the output tensors are ``fix``'s own
(``build_shards``); instead of streaming them into files they become virtual
files (``VirtualSource``: copied tensors read through to the
input, edited ones computed when read), and the result is checked exactly as ``fix``
re-checks what it wrote.  A checkpoint the runtime still could not load is refused with the
check's own words.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..checker.run import check_checkpoint
from ..checkpoint import Checkpoint, Paths, open_checkpoint
from ..dialects.containers import open_any
from ..errors import InputError
from ..findings import ERROR
from ..io.shards import ShardSet
from ..io.source import ByteSource
from ..io.virtual import Range, VirtualSource
from ..io.writer import CopyRange
from ..markers import MARKER_MAP, read_marker_map
from .execute import build_shards
from .plan import STORAGE, Options, Plan, plan_repairs


class RepairRefused(InputError):
    """The checkpoint cannot be made loadable for the runtime (exactly, or at all)."""


class Repaired:
    """The repaired checkpoint (``view``, open while the context lasts), the plan that made
    it and the check's reports before and after, for the selected runtime."""

    __slots__ = ("view", "plan", "before", "after", "source")

    def __init__(self, view: Checkpoint, plan: Plan, before, after, source: Checkpoint) -> None:
        self.view = view
        self.plan = plan
        self.before = before
        self.after = after
        self.source = source

    @property
    def changed(self) -> bool:
        return self.view is not self.source

    def notes(self) -> list[str]:
        """One line per thing done to the file in memory (translations, repairs, re-encodes)."""
        lines = []
        for c in self.plan.changes:
            if c.what == STORAGE:
                continue
            where = c.layer or c.tensor or "file"
            lines.append(f"{where}: {c.what}: {c.before} -> {c.after}")
        return lines

    def quant_map(self) -> dict[str, dict]:
        """Every layer's marker from the header maps of the view's files (one map for the
        runtime, whatever the number of shards)."""
        layers: dict[str, dict] = {}
        for h in self.view.headers:
            text = h.metadata.get(MARKER_MAP)
            if not text:
                continue
            doc = read_marker_map(text)
            if doc is not None:
                layers.update(doc["layers"])
        return layers


def _readable(source, data):
    """A writer's tensor data as data a virtual file reads: a kernel copy becomes a range of
    the input, a chunk producer the bytes it yields."""
    if isinstance(data, CopyRange):
        return Range(source, data.offset, data.length)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return lambda: b"".join(data())


def _view(ckpt: Checkpoint, plan: Plan) -> Checkpoint:
    sources: list[ByteSource] = []
    for (tensors, metadata, _copied), header in zip(build_shards(ckpt, plan), ckpt.headers):
        source = ckpt.source(header.file)
        readable = {n: (d, s, _readable(source, data)) for n, (d, s, data) in tensors.items()}
        sources.append(VirtualSource(header.file, readable, metadata))
    names = [s.name for s in sources]
    return open_checkpoint(names, sources=sources, shardset=ShardSet(files=names))


def _first_error(report) -> str | None:
    for f in report.findings:
        if f.severity == ERROR:
            return f"{f.message} [{f.code}]"
    return None


@contextmanager
def repaired(paths: Paths, target: str = "comfyui", allow_lossy: bool = False) -> Iterator[Repaired]:
    """The checkpoint at ``paths`` as ``fix`` would write it for ``target``, in memory.

    Raises ``RepairRefused`` (one line naming the file and layer) when a layer has no
    exact translation or repair and ``allow_lossy`` is false, or when the result would still
    fail ``target``'s check."""
    with open_any(paths) as ckpt:
        label = ckpt.files[0] if len(ckpt.files) == 1 else f"{ckpt.files[0]} (and {len(ckpt.files) - 1} more files)"
        before = check_checkpoint(ckpt, target=target)
        plan = plan_repairs(ckpt, Options(target, allow_lossy=allow_lossy))
        if plan.refused:
            layer, why = plan.refused[0]
            where = f"layer {layer!r}: " if layer is not None else ""
            found = _first_error(before)
            said = found is None or found.rsplit(" [", 1)[0] in why  # the refusal quotes the check already
            check = "" if said else f" (comfyquant check: {found})"
            raise RepairRefused(f"refusing to load {label}: {where}{why}{check}")
        if plan.empty and not plan.translations:
            view = ckpt
            after = before
        else:
            view = _view(ckpt, plan)
            after = check_checkpoint(view, target=target)
        try:
            verdict = after.verdicts.get(target)
            if verdict is not None and not verdict.loads:
                found = _first_error(after) or (verdict.first.message if verdict.first is not None else "it fails")
                raise RepairRefused(f"refusing to load {label}: {found}; comfyquant check {label} says what is wrong")
            yield Repaired(view, plan, before, after, ckpt)
        finally:
            if view is not ckpt:
                view.close()
