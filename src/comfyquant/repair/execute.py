"""Apply a repair plan: stream every shard into a temporary file next to its destination,
re-check the result, confirm untouched tensors are byte-identical, then rename into place.

Untouched tensors are copied in bounded chunks (hashing as they go); edited tensors are
small (scales, corrections, markers) or only relabelled.  Nothing appears at an output path
until every shard is written, synced and verified; ``--in-place`` renames over the input
only then.  On any failure the temporary files are removed and the input is untouched.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import TYPE_CHECKING

from ..checkpoint import open_checkpoint
from ..errors import InputError
from ..io.copying import copy_range as _copy
from ..io.index import write_index
from ..io.jsontext import parse as parse_json
from ..io.outputs import claim
from ..io.shards import ShardSet
from ..io.source import LocalFile
from ..io.writer import CHUNK, BackgroundSync, commit_file, discard, write_safetensors
from ..markers import HEADER, MARKER_MAP, TENSOR, marker_tensor, set_marker_map
from ..version import __version__
from .lossy import requantize
from .plan import Plan

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from .lossy import Requant

STAMP_KEY = "comfyquant"


class FixError(InputError):
    """The repaired output did not verify, or could not be written; nothing was replaced."""


def output_paths(ckpt: Checkpoint, out: str | None, in_place: bool, overwrite: bool) -> tuple[list[str], str | None]:
    """Destination of each shard (in input order) and of the index (if the input had one):
    ``comfyquant.io.outputs.claim``'s rule, default ``<name>.fixed.safetensors``."""
    dest = claim(list(ckpt.files), ckpt.shardset.index_path, out, overwrite=overwrite, tag="fixed", in_place=in_place)
    dest.make_folder()
    return dest.per_file, dest.index


def _requant_tensors(ckpt: Checkpoint, op: Requant) -> dict:
    """The re-quantized layer's tensors, computed when the writer reaches the first of them."""
    state: dict[str, bytes] = {}

    def producer(suffix: str):
        def chunks():
            if not state:
                state.update(requantize(ckpt, op))
            yield state.pop(suffix)

        return chunks

    return {f"{op.out_prefix}.{s}": (dtype, shape, producer(s)) for s, (dtype, shape) in op.specs.items()}


def _edited(ckpt: Checkpoint, entry, transform):
    """An edited tensor's bytes, computed when the writer reaches it (one tensor in memory at
    a time, whatever the number of edits: a migration edits every weight)."""

    def chunks():
        yield transform(ckpt.read_bytes(entry))

    return chunks


def _stamp(metadata: dict[str, str], plan: Plan) -> dict[str, str]:
    done = [c.what for c in plan.changes]
    summary = sorted(set(done))
    previous = metadata.get(STAMP_KEY)
    history = []
    if previous:
        try:
            history = parse_json(previous).get("history", [])
        except (ValueError, AttributeError):
            history = []
    entry: dict[str, object] = {"version": __version__, "repaired": summary}
    if plan.assumptions:  # values the file could not confirm stay on record in the file itself
        entry["assumed"] = [f"{a.layer}: {a.key}={json.dumps(a.value)} ({a.source})" for a in plan.assumptions]
    if plan.measured:
        entry["measured"] = {m.layer: round(m.error, 6) for m in plan.measured}
    stamp: dict[str, object] = {"tool": "comfyquant", "version": __version__, "repaired": summary, "history": history + [entry]}
    if "assumed" in entry:
        stamp["assumed"] = entry["assumed"]
    return {**metadata, STAMP_KEY: json.dumps(stamp)}


def build_shards(ckpt: Checkpoint, plan: Plan) -> list[tuple[dict, dict[str, str], dict[str, object]]]:
    """Per input file: (tensors to write, metadata, input entry of each copied tensor by output name)."""
    layer_file = {
        p: (lay.weight.file if lay.weight is not None else next(iter(lay.tensors.values())).file)
        for p, lay in ckpt.layers.items()
        if lay.tensors
    }
    layer_file.update(plan.homes)
    out = []
    for h in ckpt.headers:
        source = ckpt.source(h.file)
        tensors: dict = {}
        copied: dict[str, object] = {}
        for entry in sorted(h.tensors.values(), key=lambda e: e.start):
            name = entry.name
            if name in plan.drop or name.endswith(".comfy_quant"):
                continue
            prefix, _, suffix = name.rpartition(".")
            op = plan.requant.get(prefix)
            if op is not None and suffix in op.replaces:
                if suffix == "weight":
                    tensors.update(_requant_tensors(ckpt, op))
                continue
            edit = plan.edits.get(name)
            new_name = plan.renames.get(name, name)
            if edit is not None and edit.transform is not None:
                tensors[edit.name] = (edit.dtype, edit.shape, _edited(ckpt, entry, edit.transform))
            elif edit is not None:
                tensors[edit.name] = (edit.dtype, edit.shape, _copy(source, entry.start, entry.nbytes))
                copied[edit.name] = entry
            else:
                tensors[new_name] = (entry.dtype, entry.shape, _copy(source, entry.start, entry.nbytes))
                copied[new_name] = entry
        layers_here = {p: m for p, m in plan.markers.items() if layer_file.get(p) == h.file}
        for prefix, marker in layers_here.items():
            if prefix in plan.header_only:
                continue
            name, spec = marker_tensor(prefix, marker)
            tensors[name] = spec
        for prefix, kinds in plan.kept.items():  # refused marker conflicts: both sides as found
            if layer_file.get(prefix) != h.file:
                continue
            if TENSOR in kinds:
                name, spec = marker_tensor(prefix, kinds[TENSOR])
                tensors[name] = spec
            if HEADER in kinds:
                layers_here[prefix] = kinds[HEADER]
        metadata = {k: v for k, v in h.metadata.items() if k not in plan.metadata_drop}
        metadata.update(plan.metadata_text.get(h.file, {}))
        metadata.update(plan.metadata_set)
        if layers_here or MARKER_MAP not in plan.metadata_set:  # a layout's own map (migrate --to) stays
            set_marker_map(metadata, layers_here)
        out.append((tensors, _stamp(metadata, plan), copied))
    return out


def write_and_verify(ckpt: Checkpoint, plan: Plan, dests: list[str], index_dest: str | None, target, check_fn) -> tuple:
    """Write every shard to a temporary file, re-check, verify copies; commit only if all pass.

    Returns (report after, list of written paths)."""
    shards = build_shards(ckpt, plan)
    temps: list[str] = []
    syncs: list[BackgroundSync] = []
    early = _EarlyComparison(ckpt) if all(isinstance(ckpt.source(f), LocalFile) for f in ckpt.files) else None
    try:
        for (tensors, metadata, copied), dest in zip(shards, dests):
            on_tensor = early.watch(copied) if early is not None else None
            try:
                temps.append(write_safetensors(dest, tensors, metadata, commit=False, sync=False, on_tensor=on_tensor))
            except OSError as exc:
                raise FixError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was replaced") from None
            syncs.append(BackgroundSync(temps[-1]))
        compared = early.finish() if early is not None else {}
        # The disk writes the files back while they are re-checked and compared with the input.
        with open_checkpoint(temps, shardset=ShardSet(files=list(temps)), sources=None) as out:
            report = check_fn(out, target)
            _verify_copies(ckpt, out, shards, temps, dests, compared)
        for sync, dest in zip(syncs, dests):
            try:
                sync.wait()
            except OSError as exc:
                raise FixError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was replaced") from None
        syncs = []
        staged = list(zip(temps, dests))
        if index_dest:  # staged too, and committed with the shards: all of them or none
            staged.append((_stage_index(ckpt, shards, dests, index_dest), index_dest))
            temps.append(staged[-1][0])
        for temp, dest in staged:
            commit_file(temp, dest)
            temps.remove(temp)
        return report, list(dests)
    finally:
        if early is not None:
            early.stop()
        for sync in syncs:
            sync.thread.join()  # never unlink a file a sync thread still holds
        for t in temps:
            discard(t)


class _EarlyComparison:
    """Compares each copied tensor with its input in a thread as soon as the writer reports it
    written, so the comparison (two page-cache reads and a memcmp per chunk) overlaps the
    kernel's copying of the tensors after it instead of following the whole write.

    Only an accelerator: it records the (offset, length) in the temporary file at which a
    tensor was found equal, and ``_verify_copies`` accepts that only where the re-read
    output header puts the tensor at exactly that place; anything not confirmed here (a
    difference, a read error, a comparison not reached) is compared again there, in the main
    thread, which reports it."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.equal: dict[tuple[str, str], tuple[int, int]] = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def watch(self, copied: dict):
        """The writer's ``on_tensor`` callback for a shard whose copied tensors are ``copied``."""

        def written(temp: str, name: str, offset: int, length: int) -> None:
            entry = copied.get(name)
            if entry is not None:
                self.queue.put((temp, name, offset, length, entry))

        return written

    def _run(self) -> None:
        bufs = (bytearray(CHUNK), bytearray(CHUNK))
        outputs: dict[str, LocalFile] = {}
        try:
            while (item := self.queue.get()) is not None:
                temp, name, offset, length, entry = item
                if self.stopping or length != entry.nbytes:
                    continue
                try:
                    dst = outputs.get(temp) or outputs.setdefault(temp, LocalFile(temp))
                    if _same_bytes(self.ckpt.source(entry.file), entry.start, dst, offset, length, bufs):
                        self.equal[(temp, name)] = (offset, length)
                except Exception:  # left for the main thread's comparison, which reports it
                    pass
        finally:
            for f in outputs.values():
                f.close()

    def finish(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Wait for the comparisons queued so far; (temp path, name) -> (offset, length) found equal."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        return self.equal

    def stop(self) -> None:
        self.stopping = True
        self.finish()


def _verify_copies(ckpt: Checkpoint, out, shards, temps: list[str], dests: list[str], compared: dict | None = None) -> None:
    """Every copied tensor compared byte for byte with its input (stronger than a hash, and
    faster: both sides are still in the page cache).  Two reused buffers: no allocation per
    chunk, and ``bytearray ==`` is a memcmp.  ``compared`` holds the tensors that
    ``_EarlyComparison`` already found equal, with the place it compared: they are
    skipped only where the re-read header has them at that very place."""
    bufs = (bytearray(CHUNK), bytearray(CHUNK))
    compared = compared or {}
    for (_tensors, _meta, copied), temp, dest in zip(shards, temps, dests):
        header = next(h for h in out.headers if h.file == temp)
        dst = out.source(temp)
        for name, src_entry in copied.items():
            e = header.tensors.get(name)
            if e is None or e.nbytes != src_entry.nbytes:
                raise FixError(f"{dest}: verification failed: tensor {name!r} is missing or resized in the output")
            if compared.get((temp, name)) == (e.start, e.nbytes):
                continue
            if not _same_bytes(ckpt.source(src_entry.file), src_entry.start, dst, e.start, e.nbytes, bufs):
                raise FixError(f"{dest}: verification failed: tensor {name!r} differs from the input after copying")


def _same_bytes(a, a_start: int, b, b_start: int, length: int, bufs: tuple[bytearray, bytearray]) -> bool:
    """Whether two byte ranges are equal, read chunk by chunk (into ``bufs`` when both sources
    can fill a buffer, as local files can)."""
    done = 0
    fill = hasattr(a, "readinto") and hasattr(b, "readinto")
    while done < length:
        n = min(CHUNK, length - done)
        if fill:
            x, y = bufs if n == CHUNK else (bytearray(n), bytearray(n))
            if a.readinto(a_start + done, x) != n or b.readinto(b_start + done, y) != n or x != y:
                return False
        elif a.pread(a_start + done, n) != b.pread(b_start + done, n):
            return False
        done += n
    return True


def _stage_index(ckpt: Checkpoint, shards, dests: list[str], index_dest: str) -> str:
    weight_map = {}
    for (tensors, _m, _h), dest in zip(shards, dests):
        for name in tensors:
            weight_map[name] = os.path.basename(dest)
    return write_index(weight_map, index_dest, ckpt.shardset.index_path, commit=False)
