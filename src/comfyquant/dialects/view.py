"""A dialect checkpoint read as the Comfy checkpoint it translates to, without writing it.

``dequantize`` and ``convert`` read Comfy files; a file of another layout reaches them through
this view: every claimed layer's exact or byte-permutation translation (renames, transforms
done when the tensor is read, markers as tensors and in the header map), and every lossy
layer as its exact dense decode in F32 (the dialect's decoder).  Unclaimed tensors read
through to the input.  Nothing is materialised beyond the tensor being read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from ..checkpoint import Checkpoint, open_checkpoint
from ..errors import InputError
from ..io.shards import ShardSet
from ..io.virtual import Range, VirtualSource
from ..markers import MARKER_MAP, marker_map_text, marker_tensor, read_marker_map
from .base import EXACT, LOSSY, PERMUTATION, Translation
from .registry import detect
from .report import settle


class DialectError(InputError):
    """A dialect's layer that neither migrates nor decodes."""


def comfy_view(ckpt: Checkpoint, verb: str) -> Checkpoint:
    """``ckpt`` itself when no dialect claims a layer; else a new checkpoint over virtual
    files (the input's names) holding the translation.  ``ckpt`` must stay open while the
    view is used.  Raises ``DialectError`` for a layer that cannot be read ("refusing to
    <verb>: ...")."""
    detection = detect(ckpt)
    if not detection.claims:
        return ckpt
    settle(ckpt, detection)
    for claim in detection.claims:
        for tr in claim.layers.values():
            if tr.verdict not in (EXACT, PERMUTATION) and not (tr.verdict == LOSSY and tr.decoder is not None):
                raise DialectError(
                    f"refusing to {verb}: {ckpt.files[0]}: layer {tr.prefix!r} ({tr.label}) cannot be read: {tr.why}"
                )
    sources = [_virtual_file(ckpt, h, detection) for h in ckpt.headers]
    names = [s.name for s in sources]
    view = open_checkpoint(names, sources=sources, shardset=ShardSet(files=names))
    view.decoded = {tr.out_prefix for c in detection.claims for tr in c.layers.values() if tr.verdict == LOSSY}
    return view


@contextmanager
def viewed(ckpt: Checkpoint, verb: str) -> Iterator[Checkpoint]:
    """``comfy_view`` as a context: the view is closed after use (``ckpt`` stays the
    caller's to close)."""
    view = comfy_view(ckpt, verb)
    try:
        yield view
    finally:
        if view is not ckpt:
            view.close()


def _virtual_file(ckpt: Checkpoint, header, detection) -> VirtualSource:
    by_source: dict[str, tuple[Translation, object]] = {}
    lossy: dict[str, Translation] = {}
    dropped: set[str] = set()
    for claim in detection.claims:
        dropped.update(claim.drop)
        for tr in claim.layers.values():
            if tr.verdict == LOSSY:
                for e in tr.inputs.values():
                    lossy[e.name] = tr
                continue
            for m in tr.moves:
                by_source[m.source] = (tr, m)
            dropped.update(tr.drops)
            if tr.marker is not None or tr.out_prefix != tr.prefix:
                marker = tr.inputs.get("comfy_quant")
                if marker is not None:
                    dropped.add(marker.name)
    source = ckpt.source(header.file)
    tensors: dict = {}
    markers: dict[str, dict] = {}
    for entry in sorted(header.tensors.values(), key=lambda e: e.start):
        name = entry.name
        if name in dropped or ckpt.tensors.get(name) is not entry:
            continue
        if name in lossy:
            tr = lossy[name]
            w = tr.inputs.get("weight")
            if w is not None and name == w.name:
                tensors[f"{tr.out_prefix}.weight"] = ("F32", tuple(entry.shape), _decoded(ckpt, tr))
            elif name.endswith(".bias"):
                tensors[f"{tr.out_prefix}.bias"] = (entry.dtype, tuple(entry.shape), Range(source, entry.start, entry.nbytes))
            continue
        moved = by_source.get(name)
        if moved is None:
            tensors[name] = (entry.dtype, tuple(entry.shape), Range(source, entry.start, entry.nbytes))
            continue
        tr, m = moved
        out = f"{tr.out_prefix}.{m.suffix}"
        if m.transform is None:
            tensors[out] = (m.dtype, tuple(m.shape), Range(source, entry.start, entry.nbytes))
        else:
            tensors[out] = (m.dtype, tuple(m.shape), _transformed(source, entry, m.transform))
        if tr.marker is not None and m.suffix == "weight":
            name, spec = marker_tensor(tr.out_prefix, tr.marker)
            tensors[name] = spec
            markers[tr.out_prefix] = tr.marker
    metadata = _metadata(header.metadata, detection, markers)
    return VirtualSource(header.file, tensors, metadata)


def _transformed(source, entry, transform):
    return lambda: transform(source.pread(entry.start, entry.nbytes))


def _decoded(ckpt: Checkpoint, tr: Translation):
    def produce() -> bytes:
        from ..numerics.dtypes import from_bytes, to_bytes

        stored = {s: from_bytes(ckpt.read_bytes(e), e.dtype, e.shape) for s, e in tr.inputs.items()}
        return bytes(to_bytes(tr.decoder(stored).contiguous()))

    return produce


def _metadata(metadata: dict[str, str], detection, markers: dict[str, dict]) -> dict[str, str]:
    out = dict(metadata)
    claimed = set(detection.layers)
    for claim in detection.claims:
        for key in claim.metadata_drop:
            out.pop(key, None)
        out.update(claim.metadata_set)
    text = out.get(MARKER_MAP)
    if text is not None:
        doc = read_marker_map(text)
        if doc is not None:
            kept = {p: m for p, m in doc["layers"].items() if p not in claimed}
            doc["layers"] = {**kept, **markers}
            out[MARKER_MAP] = json.dumps(doc)
    elif markers:
        out[MARKER_MAP] = marker_map_text(markers)
    return out
