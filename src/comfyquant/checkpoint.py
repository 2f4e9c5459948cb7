"""The merged view of a checkpoint: shards, tensors, layers and markers.

``open_checkpoint`` reads every shard's header (one read each) and every ``.comfy_quant``
marker (one positioned read each) and nothing else.  Tensors are grouped into layers by
their prefix (the name up to the last known layer suffix); each layer gets its effective
marker (see ``comfyquant.markers``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .dtypes import QUANTIZED_WEIGHT_DTYPES
from .errors import InputError
from .findings import Finding
from .formats.registry import LAYER_SUFFIXES
from .io.header import Header, TensorEntry, read_header
from .io.shards import ShardSet, is_url, resolve_local
from .io.source import ByteSource, LocalFile
from .markers import MarkerSet
from .memo import Memo

if TYPE_CHECKING:
    from .io.remote import RemoteOptions

NameMapper = Callable[[str], str]
Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""What names a checkpoint: a file, folder, index.json or URL, or several (its shards)."""


class Bank:
    """A MoE expert bank (marker with ``num_experts``, weight ``[E, out, ...]``; ComfyUI 0.33.0
    ``comfy/ops.py`` ``MoEExperts``).

    ``layout`` says how its layer's ``tensors`` view it: ``"rows"``, flattened to
    ``[E*out, ...]`` as ComfyUI reads W4A8 and INT8 banks (the same bytes: one 2-D layer);
    ``"experts"``, as expert 0's layer (``[E, ...]`` tensors without their leading dimension,
    ``[E]`` per-tensor scales as scalars; ``expert_entry`` gives any expert's byte
    ranges); None when the format is unknown (no view)."""

    __slots__ = ("experts", "layout")

    def __init__(self, experts: int, layout: str | None) -> None:
        self.experts = experts
        self.layout = layout


class Layer:
    """A layer: its tensors by suffix and the marker that applies to it (if any)."""

    __slots__ = (
        "prefix",
        "name",
        "tensors",
        "stored",
        "marker",
        "sources",
        "format_name",
        "inferred",
        "bank",
        "class_ids",
        "_sig",
    )

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.name = prefix
        self.tensors: dict[str, TensorEntry] = {}
        self.marker: dict | None = None
        self.sources: list = []
        self.format_name: str | None = None
        self.inferred = False
        self.bank: Bank | None = None
        """Set for a MoE expert bank (ComfyUI 0.33.0 ``MoEExperts``); ``tensors`` is then its
        2-D view."""
        self.stored = self.tensors
        """The tensors as stored in the file: ``tensors`` itself, except for a bank (SGLang,
        which has no banks, and value checks over every expert read these)."""
        self.class_ids: dict[int, tuple[object, int]] | None = None
        """The layer's class per marker, kept by ``comfyquant.memo.Memo`` (marker id ->
        (marker, class id); None until first asked): every rule set asks for the same layer's
        class, with one to three marker objects, several times per check."""
        self._sig: tuple | None = None

    @property
    def signature(self) -> tuple:
        """(suffix, dtype, shape) of every stored tensor: with the marker, all per-layer rules
        depend on nothing else (a bank's flattened view follows from it)."""
        sig = self._sig
        if sig is None:
            sig = self._sig = tuple([(s, e[1], e[2]) for s, e in self.stored.items()])
        return sig

    @property
    def weight(self) -> TensorEntry | None:
        return self.tensors.get("weight")

    def __repr__(self) -> str:
        return f"Layer({self.prefix!r}, {sorted(self.tensors)}, {self.format_name})"


class Checkpoint:
    """All shards of one checkpoint, merged.  Close it (or use ``with``) to release files."""

    def __init__(self, paths: list[str], shardset: ShardSet, sources: Sequence[ByteSource], headers: list[Header]) -> None:
        self.paths = paths
        self.shardset = shardset
        self.sources = sources
        self.headers = headers
        self.files = [h.file for h in headers]
        self.tensors: dict[str, TensorEntry] = {}
        self.findings: list[Finding] = []
        self.layers: dict[str, Layer] = {}
        self.other_tensors: list[str] = []
        self.marker_entries: list[TensorEntry] = []
        """Every ``.comfy_quant`` tensor of the merged view (duplicates across shards left out)."""
        self.duplicates = False
        self.markers = MarkerSet()
        """Every marker of the checkpoint (``open_checkpoint`` collects them; empty until then)."""
        self.memo = Memo()
        self.detection: object | None = None
        """The checkpoint's dialects, a ``dialects.registry.Detection`` (``detect`` fills it on
        first use; typed there, as the dialects sit above this module)."""
        self.foreign: dict[str, str] = {}
        """Layer prefix -> dialect, for layers a foreign layout claims (set with ``detection``):
        the runtime profiles leave those layers to their dialect's own runtime model."""
        self.decoded: set[str] = set()
        """Layer prefixes whose dense weight is a dialect's exact decode of a quantized layer
        (a lossy translation read through ``dialects/view``): ``convert`` re-encodes them as
        the quantized layers they were, and copies the layers that were dense."""
        self.shared: dict[str, object] = {}
        """What several runtime models read of the checkpoint alike, made once per check by the
        first that asks (``targets.releases.marker_reading``, ``layer_classes``)."""
        self._source_by_file = {s.name: s for s in sources}

    # -- reading ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Checkpoint({self.files}, {len(self.layers)} layers, {len(self.tensors)} tensors)"

    def source(self, file: str) -> ByteSource:
        return self._source_by_file[file]

    def read_bytes(self, entry: TensorEntry) -> bytes:
        """The raw bytes of one tensor (one positioned read)."""
        return self.source(entry.file).pread(entry.start, entry.nbytes)

    def read_many(self, entries: list[TensorEntry]) -> dict[str, bytes]:
        """Raw bytes of several tensors, grouped per file so remote sources can coalesce."""
        out: dict[str, bytes] = {}
        by_file: dict[str, list[TensorEntry]] = {}
        for e in entries:
            by_file.setdefault(e.file, []).append(e)
        for file, group in by_file.items():
            group.sort(key=lambda e: e.start)
            datas = self.source(file).pread_many([(e.start, e.nbytes) for e in group])
            for e, d in zip(group, datas):
                out[e.name] = d
        return out

    def metadata(self, file: str | None = None) -> dict[str, str]:
        if file is None:
            merged: dict[str, str] = {}
            for h in self.headers:
                merged.update(h.metadata)
            return merged
        for h in self.headers:
            if h.file == file:
                return h.metadata
        raise KeyError(file)

    def io_stats(self) -> dict[str, dict[str, int]]:
        stats = dict(self.shardset.index_io)  # a remote index.json costs a request too
        stats.update({s.name: {"requests": getattr(s, "reads", 0), "bytes": getattr(s, "bytes_read", 0)} for s in self.sources})
        return stats

    def close(self) -> None:
        for s in self.sources:
            s.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(
    paths: Paths,
    name_mapper: NameMapper | None = None,
    sources: Sequence[ByteSource] | None = None,
    shardset: ShardSet | None = None,
    remote: RemoteOptions | None = None,
    damaged_ok: bool = False,
) -> Checkpoint:
    """Open a checkpoint from files, shards, a folder or an index.json (header reads only).

    A file whose header cannot be read is refused (``InputError``), unless ``damaged_ok``
    (``check``, which reports what each runtime raises on it): it is then a shard with no
    tensors and a C009 finding.

    ``name_mapper`` maps a raw tensor name (``prefix + ".weight"``) to the runtime's name, like
    SGLang's ``param_names_mapping``; layers keep their raw prefix and get the mapped ``name``.
    URLs (``https://``, ``s3://``, ...) are opened by ``comfyquant.io.remote`` with ``remote``
    (a ``RemoteOptions``; defaults when None).
    """
    from .markers import collect_markers

    names = [str(paths)] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
    if sources is None and any(is_url(p) for p in names):
        from .io.remote import open_remote  # urllib/fsspec load only for URLs

        shardset, sources = open_remote(names, remote)
    elif sources is None:
        if shardset is None:
            shardset = resolve_local(names)
        sources = []
        try:
            for f in shardset.files:
                sources.append(LocalFile(f))
        except InputError:
            for s in sources:
                s.close()
            raise
    elif shardset is None:
        shardset = ShardSet(files=[s.name for s in sources])
    try:
        headers = [read_header(s, damaged_ok) for s in sources]
    except InputError:
        for s in sources:
            s.close()
        raise
    ckpt = Checkpoint(names, shardset, sources, headers)
    _merge(ckpt)
    if ckpt.duplicates and shardset.explicit:  # files named by the user that repeat tensor names
        from .io.shards import separate_repeats

        separate = separate_repeats(shardset, [h.tensors for h in headers])
        if separate is not None:
            ckpt.close()
            raise separate
    _group_layers(ckpt)
    ckpt.markers = collect_markers(ckpt)
    _apply_markers(ckpt, name_mapper)
    return ckpt


def _merge(ckpt: Checkpoint) -> None:
    findings = ckpt.findings
    tensors = ckpt.tensors
    for h in ckpt.headers:
        findings.extend(h.findings)
    if len(ckpt.headers) == 1:
        tensors.update(ckpt.headers[0].tensors)
    else:
        for h in ckpt.headers:
            tensors.update(h.tensors)
        if len(tensors) != sum(len(h.tensors) for h in ckpt.headers):
            ckpt.duplicates = True
            _duplicates(ckpt)
    ss = ckpt.shardset
    for missing in ss.missing:
        message, actual = ss.missing_message(missing)
        findings.append(
            Finding(
                "C011",
                message,
                expected=missing,
                actual=actual,
                cause="incomplete download" if missing not in ss.why else "a broken link or a wrong file in the folder",
                fix="download the missing shard" if missing not in ss.why else "replace the entry by the shard file",
                file=ss.index_path or missing,
            )
        )
    for file, note in ss.notes:
        findings.append(Finding("C015", note, file=file))
    if ss.weight_map:
        _check_index(ckpt, ss, findings)


def _duplicates(ckpt: Checkpoint) -> None:
    """Names in several shards (rare): report each, keep the first shard's tensor."""
    tensors = ckpt.tensors
    tensors.clear()
    for h in ckpt.headers:
        for name in sorted(tensors.keys() & h.tensors.keys()):
            ckpt.findings.append(
                Finding(
                    "C010",
                    f"tensor {name!r} is in both {tensors[name].file} and {h.file}",
                    tensor=name,
                    cause="shards from two exports mixed in one folder, or a shard copied twice",
                    fix="remove the stale shard (the index says which file each tensor belongs to)",
                    file=h.file,
                )
            )
        for name, entry in h.tensors.items():
            tensors.setdefault(name, entry)


def _check_index(ckpt: Checkpoint, ss: ShardSet, findings: list[Finding]) -> None:
    """Index vs shards.  Fast path: the whole mapping compared at once (C speed)."""
    tensors = ckpt.tensors
    actual: dict[str, str] = {}
    shard_name: dict[str, str] = {}
    for h in ckpt.headers:
        rel = os.path.relpath(h.file, ss.index_dir or ".")
        shard_name[h.file] = rel
        actual.update(dict.fromkeys(h.tensors, rel))
    wm = ss.weight_map
    missing_set = {os.path.relpath(m, ss.index_dir or ".") for m in ss.missing}
    if actual == wm and not missing_set:
        return
    for name, shard in wm.items():
        entry = tensors.get(name)
        if entry is None:
            if shard not in missing_set:
                findings.append(
                    Finding(
                        "C014",
                        f"index maps {name!r} to {shard}, but no shard contains it",
                        tensor=name,
                        expected=shard,
                        actual="absent",
                        fix="regenerate the index from the shards",
                        file=ss.index_path,
                    )
                )
        elif shard_name.get(entry.file) != shard and _norm(shard_name.get(entry.file, "")) != _norm(shard):
            findings.append(
                Finding(
                    "C012",
                    f"index maps {name!r} to {shard}, but it is in {entry.file}",
                    tensor=name,
                    expected=shard,
                    actual=entry.file,
                    fix="regenerate the index from the shards",
                    file=ss.index_path,
                )
            )
    for name, entry in tensors.items():
        if name not in wm:
            findings.append(
                Finding(
                    "C013",
                    f"tensor {name!r} in {entry.file} is not listed in the index",
                    tensor=name,
                    fix="regenerate the index from the shards",
                    file=ss.index_path,
                )
            )


def _norm(path: str) -> str:
    return os.path.normpath(path)


def _group_layers(ckpt: Checkpoint) -> None:
    """Tensors into layers by prefix; marker tensors are also listed on the side (the marker
    reader then needs no second scan of every name)."""
    layers = ckpt.layers
    suffixes = LAYER_SUFFIXES
    other = ckpt.other_tensors
    markers = ckpt.marker_entries
    for name, entry in ckpt.tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix and suffix in suffixes:
            layer = layers.get(prefix)
            if layer is None:
                layer = layers[prefix] = Layer(prefix)
            layer.tensors[suffix] = entry
            if suffix == "comfy_quant":
                markers.append(entry)
        else:
            other.append(name)
            if name == ".comfy_quant":  # a marker with an empty prefix (read, then reported)
                markers.append(entry)


def _apply_markers(ckpt: Checkpoint, name_mapper: NameMapper | None) -> None:
    from .formats.registry import infer_format

    markers = ckpt.markers
    layers = ckpt.layers
    for prefix, merged in markers.effective.items():
        layer = layers.get(prefix)
        if layer is None:
            continue  # a header entry for a layer without tensors: reported by the checker
        layer.marker = merged
        layer.sources = markers.sources.get(prefix, [])
        fmt = merged.get("format")
        layer.format_name = fmt if isinstance(fmt, str) else None
    for layer in layers.values():
        if layer.marker is None:
            w = layer.tensors.get("weight")
            if w is not None and w.dtype in QUANTIZED_WEIGHT_DTYPES:
                fmt = infer_format(layer.tensors)
                if fmt is not None:
                    layer.format_name = fmt.name
                    layer.inferred = True
        elif (
            "num_experts" in layer.marker
            and (w := layer.tensors.get("weight")) is not None
            and len(w.shape) == 3
            and w.shape[0] > 0
        ):
            _as_bank(layer)
        if name_mapper is not None:
            mapped = name_mapper(layer.prefix + ".weight")
            layer.name = mapped[: -len(".weight")] if mapped.endswith(".weight") else mapped


def _as_bank(layer: Layer) -> None:
    """A layer whose marker has ``num_experts`` and whose weight is 3-D is a MoE expert bank of
    E = weight.shape[0] experts (without the key a 3-D weight is just a wrong shape: L008).
    Where the format description gives ComfyUI's flattening rule, the layer's tensors become
    views ``[E*out, ...]`` of the same bytes; otherwise the view of expert 0 (see
    ``Bank``).  ``layer.stored`` and ``ckpt.tensors`` keep the stored entries."""
    from .formats.registry import FORMATS

    experts = layer.tensors["weight"].shape[0]
    fmt = FORMATS.get(layer.format_name) if layer.format_name else None
    layer.bank = Bank(experts, None)
    if fmt is None:
        return
    views = {}
    if fmt.flattens_bank(layer.tensors, experts):
        for suffix, e in layer.tensors.items():
            shape = e[2]
            if suffix in fmt.bank_rows and len(shape) >= 2 and shape[0] == experts:
                e = TensorEntry(e[0], e[1], (experts * shape[1], *shape[2:]), e[3], e[4], e[5])
            views[suffix] = e
        layer.bank.layout = "rows"
    else:
        for suffix, e in layer.tensors.items():
            views[suffix] = expert_entry(e, experts, 0)
        layer.bank.layout = "experts"
    layer.tensors = views  # layer.stored keeps the stored entries


def expert_entry(e: TensorEntry, experts: int, index: int) -> TensorEntry:
    """Expert ``index``'s part of a stacked bank tensor (ComfyUI 0.33.0 ``MoEExperts``:
    quantized tensors get a leading expert dimension, per-tensor scales are ``[E]`` or one
    scalar for all): an ``[E, ...]`` tensor's slice, an ``[E]`` tensor's element; anything else
    is shared."""
    shape = e[2]
    if len(shape) >= 2 and shape[0] == experts:
        part, shape = e.nbytes // experts, shape[1:]
    elif shape == (experts,) and not e[0].endswith(".comfy_quant"):
        part, shape = e.nbytes // experts, ()
    else:
        return e
    start = e[3] + index * part
    return TensorEntry(e[0], e[1], shape, start, start + part, e[5])
