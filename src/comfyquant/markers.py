"""Marker discovery and merging, as ComfyUI 0.33.0 (``comfy/utils.py`` ``convert_old_quants``) and
SGLang 0.5.23 (``inspect_comfy_quant_markers``) read markers.

Sources, per file and in the order SGLang reads them: the header's
``__metadata__._quantization_metadata`` (``{"format_version", "layers": {prefix: marker}}``),
then the ``<prefix>.comfy_quant`` U8 tensors (sorted by name), plus the file-level
``quant_format``.  Markers for one prefix are merged as a union of keys; a key with two
different values is a conflict (SGLang raises, ComfyUI lets the header win: so does the
effective marker here, and the conflict is reported).  ``MarkerMerge`` is the one merge:
the SGLang profile and ``fix`` run it with their own precedence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from operator import methodcaller
from typing import TYPE_CHECKING, Any, Protocol

from .findings import Finding, json_kind
from .io.jsontext import parse as parse_json

if TYPE_CHECKING:
    from .io.header import Header, TensorEntry
    from .io.source import ByteSource

HEADER = "header"
TENSOR = "tensor"

MARKER_MAP = "_quantization_metadata"
"""The ``__metadata__`` key of the header marker map (the name ComfyUI and SGLang read)."""
QUANT_FORMAT = "quant_format"
"""The ``__metadata__`` key of SGLang's file-level format (``file_level_format``)."""
DROP_METADATA = (MARKER_MAP, QUANT_FORMAT)
"""The metadata keys that describe the stored tensors' quantization: a writer that stores other
tensors (``quantize``, ``dequantize``) drops them, or they would describe tensors that no
longer exist."""
MARKER_SUFFIX = ".comfy_quant"
"""The suffix of a layer's marker tensor: ``<prefix>.comfy_quant``."""

FORMAT_VERSION = "1.0"
"""The ``format_version`` a marker map is written with unless its writer names another
(``marker_map_text``); the reader records each file's (``HeaderMarkers.format_version``)."""


VERSION_KEY = "format_version"
"""The map document's version key: ``FORMAT_VERSION`` in Comfy's map; SGLang's rowwise FP8 map
(``formats.rowwise_fp8``) states its own."""


def marker_map_text(layers: dict, version: str = FORMAT_VERSION, more: dict | None = None) -> str:
    """The header marker map of ``{prefix: marker}`` as the JSON text stored under
    ``MARKER_MAP``: the one place the document is built, so every writer states the same
    version and shape (``more``: further top-level keys of a map that has them, such as
    SGLang's rowwise ``quant_configs``; its ``layers`` values are then format names)."""
    return json.dumps({VERSION_KEY: version, "layers": layers, **(more or {})})


def set_marker_map(metadata: dict[str, str], layers: dict[str, dict]) -> dict[str, str]:
    """``metadata`` with the marker map of ``layers``, or without a map when there are none
    (changed in place and returned)."""
    if layers:
        metadata[MARKER_MAP] = marker_map_text(layers)
    else:
        metadata.pop(MARKER_MAP, None)
    return metadata


def read_marker_map(text: str) -> dict | None:
    """The parsed map document when ``text`` is an object with a ``layers`` object, else None:
    for callers that rewrite or merge maps the checker already judged (a broken map stays as
    it is; its findings are the reader's, ``collect_markers``)."""
    try:
        doc = parse_json(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("layers"), dict) else None


def marker_tensor(prefix: str, marker: dict) -> tuple[str, tuple[str, tuple[int], bytes]]:
    """(name, (dtype, shape, bytes)) of the marker tensor writers store for ``marker``: the
    JSON's UTF-8 bytes as a 1-D U8 tensor."""
    raw = json.dumps(marker).encode("utf-8")
    return prefix + MARKER_SUFFIX, ("U8", (len(raw),), raw)


class MarkerRecord:
    """One marker as found: where, and either the parsed object or why it failed.

    ``key`` is the tensor name (tensor markers) or the prefix (header entries); ``error`` the
    finding code of an unreadable marker (M001/M002/M013)."""

    __slots__ = ("kind", "file", "prefix", "key", "obj", "error")

    def __init__(self, kind: str, file: str, prefix: str, key: str, obj: Any = None, error: str | None = None):
        self.kind = kind
        self.file = file
        self.prefix = prefix
        self.key = key
        self.obj = obj
        self.error = error


class HeaderMarkers:
    """The ``_quantization_metadata`` of one file, and what was wrong with it (``error``: M010
    not JSON, M011 not an object, M012 no layers object)."""

    __slots__ = ("file", "raw", "error", "format_version")

    def __init__(self, file: str, raw: str) -> None:
        self.file = file
        self.raw = raw
        self.error: str | None = None
        self.format_version: Any = None


class MarkerSet:
    """Every marker of a checkpoint: records in reading order, header maps, ``quant_format`` per
    file, the effective marker per prefix and its sources, findings, and the raw marker bytes
    by (file, tensor name)."""

    __slots__ = ("records", "headers", "quant_formats", "effective", "sources", "findings", "marker_bytes")

    def __init__(self) -> None:
        self.records: list[MarkerRecord] = []
        self.headers: list[HeaderMarkers] = []
        self.quant_formats: dict[str, str] = {}
        self.effective: dict[str, dict] = {}
        self.sources: dict[str, list[MarkerRecord]] = {}
        self.findings: list[Finding] = []
        self.marker_bytes: dict[tuple[str, str], bytes] = {}


class StoredMarkers(Protocol):
    """What ``collect_markers`` reads of an open checkpoint (``comfyquant.checkpoint.Checkpoint``,
    which sits above this module and collects its markers with it)."""

    @property
    def duplicates(self) -> bool: ...

    @property
    def marker_entries(self) -> Sequence[TensorEntry]: ...

    @property
    def headers(self) -> Sequence[Header]: ...

    def source(self, file: str) -> ByteSource: ...


class MarkedLayer(Protocol):
    """What ``file_level_markers`` reads of a checkpoint's layer."""

    @property
    def stored(self) -> Mapping[str, TensorEntry]: ...

    @property
    def marker(self) -> dict | None: ...


class MarkedCheckpoint(Protocol):
    """What ``file_level_markers`` reads of a checkpoint whose markers are collected."""

    @property
    def markers(self) -> MarkerSet: ...

    @property
    def layers(self) -> Mapping[str, MarkedLayer]: ...


def collect_markers(ckpt: StoredMarkers) -> MarkerSet:
    ms = MarkerSet()
    by_file: dict[str, list] = {}
    if not ckpt.duplicates:  # the grouping listed them; with duplicates every shard is scanned
        for e in ckpt.marker_entries:
            by_file.setdefault(e[5], []).append(e)
    for h in ckpt.headers:
        qf = h.metadata.get(QUANT_FORMAT)
        if qf is not None:
            ms.quant_formats[h.file] = qf
        raw = h.metadata.get(MARKER_MAP)
        if raw is not None:
            _read_header_markers(ms, h.file, raw)
        # Every shard's markers, duplicates included (SGLang reads them all), sorted by name.
        if ckpt.duplicates:
            entries = [h.tensors[n] for n in sorted(filter(_IS_MARKER, h.tensors))]
        else:
            entries = sorted(by_file.get(h.file, ()))  # entries are tuples led by their name
        if not entries:
            continue
        datas = ckpt.source(h.file).pread_many([(e.start, e.nbytes) for e in entries])
        for e, data in zip(entries, datas):
            ms.marker_bytes[(h.file, e.name)] = data
            _read_tensor_marker(ms, e, data)
    _merge(ms)
    lowered = {v.lower() for v in ms.quant_formats.values()}
    if len(lowered) > 1:
        ms.findings.append(
            Finding(
                "M024",
                f"files disagree on quant_format: {sorted(lowered)}",
                cause="shards from different exports",
                fix="make every shard's quant_format agree (or remove it)",
            )
        )
    return ms


FILE_LEVEL_DTYPES = ("F8_E4M3", "I8", "U8")
"""Weight dtypes SGLang requires a marker for, and the ones a file-level ``quant_format`` gives
one to (SGLang 0.5.23 ``inspect_comfy_quant_markers``)."""


def file_level_format(ms: MarkerSet):
    """The ``Format`` that the files' ``quant_format`` gives every
    unmarked quantized weight, as SGLang 0.5.23 ``inspect_comfy_quant_markers`` reads it: every
    file that sets a non-empty ``quant_format`` sets the same value (compared in lower case),
    and a format description names that value as its ``quant_format``.  None otherwise (SGLang
    then ignores the key)."""
    lowered = {v.lower() for v in ms.quant_formats.values() if v}
    if len(lowered) != 1:
        return None
    from .formats.registry import FORMATS

    value = next(iter(lowered))
    return next((f for f in FORMATS.values() if f.quant_format == value), None)


def file_level_markers(ckpt: MarkedCheckpoint) -> dict[str, dict]:
    """Prefix -> the marker SGLang creates from ``quant_format`` (``setdefault`` in
    ``inspect_comfy_quant_markers``) for each layer without a marker of its own whose stored
    weight is ``F8_E4M3``, ``I8`` or ``U8``.

    ComfyUI and comfy-kitchen never read ``quant_format``: ``dequantize``, ``convert`` and
    ``fix`` use these markers to read such files as SGLang does (and ``fix`` writes them)."""
    fmt = file_level_format(ckpt.markers)
    if fmt is None:
        return {}
    out = {}
    for prefix, layer in ckpt.layers.items():
        w = layer.stored.get("weight")
        if layer.marker is None and w is not None and w.dtype in FILE_LEVEL_DTYPES:
            out[prefix] = {"format": fmt.name}
    return out


def _not_json_constant(name: str):
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259), although Python's
    ``json`` accepts them; the runtimes then fail on them (``int(inf)`` raises)."""
    raise ValueError(f"holds {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one beyond the float range (``1e400``) would
    silently become ``inf``, which no marker key can hold."""
    value = float(text)
    if value in _NON_FINITE:
        raise ValueError(f"holds the number {text[:40]}, which overflows to {value}")
    return value


_NON_FINITE = (math.inf, -math.inf)
_DECODER = json.JSONDecoder(parse_constant=_not_json_constant, parse_float=_finite_float)
parse_marker_json = _DECODER.decode
"""Parse marker JSON (a tensor marker or the header map): a non-finite number is an error
(``ValueError``), like any other text that is not JSON, so no NaN or inf ever reaches a rule,
a runtime profile or a writer as a marker value."""


SIZE_KEYS = ("group_size", "convrot_groupsize")
"""Marker keys the runtimes convert with ``int()`` when they build a layer."""


def lenient_nonfinite_sizes(raw: str) -> list[tuple[str, str, float]] | None:
    """For a header map the strict parser refused: None when Python's own ``json`` (what the
    runtimes use) refuses it too; else the ``(layer, key, value)`` whose non-finite value sits
    in a size key the runtimes ``int()`` (``int(nan)`` raises ``ValueError``, ``int(inf)``
    ``OverflowError``).  A non-finite value anywhere else is parsed and never used."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return nonfinite_sizes(obj)


def nonfinite_sizes(obj) -> list[tuple[str, str, float]]:
    """``(layer, key, value)`` of a parsed header map whose size key holds a non-finite float."""
    layers = obj.get("layers") if isinstance(obj, dict) else None
    out = []
    for prefix, marker in layers.items() if isinstance(layers, dict) else ():
        if isinstance(marker, dict):
            for key in SIZE_KEYS:
                v = marker.get(key)
                if isinstance(v, float) and not math.isfinite(v):
                    out.append((prefix, key, v))
    return out


def int_error(value: float) -> tuple[str, str]:
    """(exception, message) of Python's ``int()`` of a non-finite float."""
    if math.isnan(value):
        return "ValueError", "cannot convert float NaN to integer"
    return "OverflowError", "cannot convert float infinity to integer"


def _read_header_markers(ms: MarkerSet, file: str, raw: str) -> None:
    hm = HeaderMarkers(file, raw)
    ms.headers.append(hm)
    try:
        obj = parse_marker_json(raw)
    except (ValueError, RecursionError) as exc:
        hm.error = "M010"
        ms.findings.append(
            Finding(
                "M010",
                f"{file}: _quantization_metadata is not valid JSON ({exc})",
                file=file,
                fix="rewrite the header markers (comfyquant fix)",
            )
        )
        return
    if not isinstance(obj, dict):
        hm.error = "M011"
        ms.findings.append(
            Finding(
                "M011",
                f"{file}: _quantization_metadata is a JSON {json_kind(obj)}, expected an object",
                file=file,
                fix="rewrite the header markers (comfyquant fix)",
            )
        )
        return
    hm.format_version = obj.get("format_version")
    layers = obj.get("layers")
    if not isinstance(layers, dict):
        hm.error = "M012"
        ms.findings.append(
            Finding(
                "M012",
                f"{file}: _quantization_metadata has no 'layers' object",
                file=file,
                expected=f'{{"format_version": "{FORMAT_VERSION}", "layers": {{...}}}}',
                fix="rewrite the header markers (comfyquant fix)",
            )
        )
        return
    if "format_version" not in obj:
        ms.findings.append(
            Finding(
                "M014",
                f"{file}: _quantization_metadata has no format_version",
                file=file,
                expected=f'"format_version": "{FORMAT_VERSION}"',
                fix="comfyquant fix writes it",
            )
        )
    rowwise = _declares_rowwise(obj)
    for prefix, marker in layers.items():
        rec = MarkerRecord(HEADER, file, prefix, prefix, marker)
        if not isinstance(marker, dict):
            rec.error = "M013"
            what = f"a JSON {json_kind(marker)}"
            if rowwise:  # SGLang's rowwise FP8 map: right for SGLang, no marker for ComfyUI
                what = f"SGLang's rowwise FP8 declaration {json.dumps(marker)[:40]}"
            ms.findings.append(
                Finding(
                    "M013",
                    f"{file}: _quantization_metadata entry for {prefix!r} is {what}, expected an object",
                    layer=prefix,
                    actual=json.dumps(marker)[:80],
                    expected='{"format": ...}',
                    file=file,
                    cause="SGLang's rowwise FP8 map (format_version 1.1): SGLang reads it, ComfyUI takes the entry for a marker"
                    if rowwise
                    else None,
                    fix="comfyquant migrate (the Comfy layout; exact for layers whose rows share one scale)"
                    if rowwise
                    else "rewrite the header markers (comfyquant fix)",
                )
            )
        ms.records.append(rec)


def _declares_rowwise(obj: dict) -> bool:
    """Whether the map is SGLang's rowwise FP8 map (``formats.rowwise_fp8.declares_rowwise``)."""
    from .formats.rowwise_fp8 import declares_rowwise

    return declares_rowwise(obj)


def _bytes_text(data: bytes) -> str:
    """An unreadable marker's bytes as a reader sees them: how many, and the start as text."""
    if not data:
        return "empty (0 bytes)"
    shown = data[:60].decode("utf-8", "replace")
    return f"{len(data)} bytes: {shown!r}" + (" ..." if len(data) > 60 else "")


def _read_tensor_marker(ms: MarkerSet, entry, data: bytes) -> None:
    name, dtype, shape, _start, _end, file = entry
    prefix = name[: -len(MARKER_SUFFIX)]
    rec = MarkerRecord(TENSOR, file, prefix, name)
    ms.records.append(rec)
    if dtype != "U8" or len(shape) != 1:
        ms.findings.append(
            Finding(
                "M003",
                f"marker {entry.name!r} is stored as {entry.dtype} {list(entry.shape)}; writers use 1-D U8",
                layer=prefix,
                tensor=entry.name,
                expected="U8, one dimension (the JSON's bytes)",
                actual=f"{entry.dtype} {list(entry.shape)}",
                file=entry.file,
                fix="rewrite the marker as U8 (comfyquant fix)",
            )
        )
    obj = _PARSED.get(data)
    try:
        if obj is None:
            obj = parse_marker_json(data.decode("utf-8"))
            if isinstance(obj, dict) and len(_PARSED) < 10_000:
                _PARSED[data] = obj  # identical markers share one (never mutated) object
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        rec.error = "M001"
        hint = " (trailing NUL byte)" if data.endswith(b"\0") else ""
        ms.findings.append(
            Finding(
                "M001",
                f"marker {entry.name!r} is not UTF-8 JSON{hint}: {exc}",
                layer=prefix,
                tensor=entry.name,
                actual=_bytes_text(data),
                file=entry.file,
                fix="rewrite the marker (comfyquant fix)",
            )
        )
        return
    rec.obj = obj
    if not isinstance(obj, dict):
        rec.error = "M002"
        ms.findings.append(
            Finding(
                "M002",
                f"marker {entry.name!r} holds a JSON {json_kind(obj)}, expected an object",
                layer=prefix,
                tensor=entry.name,
                actual=json.dumps(obj)[:80],
                file=entry.file,
                fix="rewrite the marker (comfyquant fix)",
            )
        )


def same_marker(a: dict, b: dict) -> bool:
    """Equal keys and values of equal types (``1 == True`` in Python, not in a marker)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    for key, value in a.items():
        other = b.get(key, _ABSENT)
        if type(other) is not type(value) or other != value:
            return False
        if isinstance(value, (list, dict)) and repr(other) != repr(value):
            return False
    return True


_ABSENT = object()
_PARSED: dict[bytes, dict] = {}
_IS_MARKER = methodcaller("endswith", MARKER_SUFFIX)


class MarkerMerge:
    """The union of marker records, prefix by prefix, in the order they are added: the one
    marker merge of the package.

    ``merged[prefix]`` is a key's first value read, unless ``wins`` names a kind (HEADER) and a
    later record of that kind disagrees with a value another kind set: it replaces it (ComfyUI
    lets the header win).  With ``skip_conflicting`` (SGLang's merge), a record that disagrees
    with the union so far adds nothing (SGLang raises on it; a collecting run goes on without
    it), and a later value equal to an earlier one of another type (``1``, ``true``) replaces it,
    as SGLang's ``dict.update`` does.  ``add``
    returns each record's conflicts, so every caller words them its own way: the checker's
    findings, SGLang's messages, fix's plan.  The first record's object is kept as is (shared,
    never mutated) until another one adds a key: most layers have identical header and tensor
    markers, and merging them costs one comparison."""

    __slots__ = ("wins", "skip_conflicting", "merged", "sources", "_origin")

    def __init__(self, wins: str | None = None, skip_conflicting: bool = False) -> None:
        self.wins = wins
        self.skip_conflicting = skip_conflicting
        self.merged: dict[str, dict] = {}
        self.sources: dict[str, list[MarkerRecord]] = {}
        self._origin: dict[tuple[str, str], MarkerRecord] = {}

    def add(self, rec: MarkerRecord) -> Sequence[tuple[str, Any, MarkerRecord]]:
        """Merge one parsed record (``rec.obj`` a dict); returns its conflicts as
        ``(key, value so far, record that set it)`` in the record's key order (with
        ``skip_conflicting``: the first one only, and the record is not merged)."""
        prefix = rec.prefix
        merged = self.merged.get(prefix)
        if merged is None:
            self.merged[prefix] = rec.obj
            self.sources[prefix] = [rec]
            return _NO_CONFLICTS
        return self._add_more(rec, merged)

    def add_all(self, records) -> list[tuple[MarkerRecord, Sequence[tuple[str, Any, MarkerRecord]]]]:
        """``add`` for every parsed record (``error`` None) of ``records``; returns
        (record, its conflicts) for those that have any.  One loop, for the checker's merge
        of every marker of a checkpoint (most prefixes have one record)."""
        merged_map, sources_map, more = self.merged, self.sources, self._add_more
        out = []
        for rec in records:
            if rec.error is not None:
                continue
            prefix = rec.prefix
            merged = merged_map.get(prefix)
            if merged is None:
                merged_map[prefix] = rec.obj
                sources_map[prefix] = [rec]
            elif conflicts := more(rec, merged):
                out.append((rec, conflicts))
        return out

    def _add_more(self, rec: MarkerRecord, merged: dict) -> Sequence[tuple[str, Any, MarkerRecord]]:
        """``add`` for a prefix that has a marker already (``merged``)."""
        prefix = rec.prefix
        obj = rec.obj
        sources = self.sources[prefix]
        sources.append(rec)
        if obj == merged:
            # Nothing to add and no conflict (header and tensor markers written identical): the
            # comparison is the one conflicts are found with (Python's ==, 1 == True), in C.
            if self.skip_conflicting:
                # SGLang update()s its dict: the later record's values are the ones it keeps
                # (true rather than an equal 1); the same keys, so its object is the union
                self.merged[prefix] = obj
            return _NO_CONFLICTS
        origin = self._origin
        if self.skip_conflicting:
            for key, value in obj.items():
                if key in merged and merged[key] != value:
                    return [(key, merged[key], origin.get((prefix, key), sources[0]))]
        if merged is sources[0].obj:  # the first difference: merge into a copy, never the shared object
            self.merged[prefix] = merged = dict(merged)
            first = sources[0]
            for key in merged:
                origin[(prefix, key)] = first
        conflicts: list[tuple[str, Any, MarkerRecord]] | None = None
        wins = self.wins
        for key, value in obj.items():
            if key not in merged:
                merged[key] = value
                origin[(prefix, key)] = rec
                continue
            if merged[key] != value:
                setter = origin[(prefix, key)]
                if conflicts is None:
                    conflicts = []
                conflicts.append((key, merged[key], setter))
                if wins is not None and rec.kind == wins and setter.kind != wins:
                    merged[key] = value
                    origin[(prefix, key)] = rec
            elif self.skip_conflicting and type(merged[key]) is not type(value):
                merged[key] = value  # an equal value of another type: SGLang keeps the later one
        return _NO_CONFLICTS if conflicts is None else conflicts


_NO_CONFLICTS: tuple = ()


def _merge(ms: MarkerSet) -> None:
    """Union per prefix; header values win on conflicts (ComfyUI); conflicts become findings."""
    merge = MarkerMerge(wins=HEADER)
    ms.effective = merge.merged
    ms.sources = merge.sources
    reported: set[tuple[str, str]] = set()
    for rec, conflicts in merge.add_all(ms.records):
        for key, old, first in conflicts:
            if (rec.prefix, key) in reported:
                continue
            reported.add((rec.prefix, key))
            value = rec.obj[key]
            cross = first.kind != rec.kind
            code = "M020" if cross else "M021"
            what = "header and tensor markers" if cross else f"markers in {first.file} and {rec.file}"
            ms.findings.append(
                Finding(
                    code,
                    f"{what} disagree on {key!r} for layer {rec.prefix!r}: {old!r} vs {value!r}",
                    layer=rec.prefix,
                    expected=f"{key}={old!r} ({first.kind} in {first.file})",
                    actual=f"{key}={value!r} ({rec.kind} in {rec.file})",
                    cause="the header marker map was edited or regenerated without the tensor markers"
                    if cross
                    else "shards from different exports",
                    fix="synchronise the markers: comfyquant fix --prefer header|tensor",
                    file=rec.file,
                )
            )
