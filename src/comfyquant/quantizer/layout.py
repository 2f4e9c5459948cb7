"""What a planned output looks like before anything is computed, and whether it will load.

* ``planned_tensors`` (re-exported here) derives every tensor
  an encode will produce; the runner checks each encoded layer against it.
* ``format_findings`` validates a planned layer (its marker and its planned tensors)
  against the format package directly: the description's marker keys, slots and constraints
  (``comfyquant.formats.validation.check_layer``).  A layer whose plan contradicts its
  own format is never written.
* ``check_files`` and ``layer_problems`` judge what the format rules cannot: whether
  the selected runtimes load it.  The runtime profiles read a checkpoint, so they run on a
  *virtual* one: the planned header and marker bytes, served by ``SkeletonSource``;
  every other byte reads as zero and is never needed.  That is how quantize knows, before
  computing, which layers a target cannot take and which format combinations it refuses,
  with the runtime's own message.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from ..formats import registry
from ..formats.base import Meta
from ..formats.params import Params
from ..formats.planned import ShapeRefused, planned_tensors
from ..formats.validation import check_layer
from ..io.header import FIRST_READ
from ..io.shards import ShardSet
from ..io.writer import build_header
from ..markers import MARKER_MAP, marker_map_text, marker_tensor

if TYPE_CHECKING:
    from ..checker.report import Report
    from ..checker.run import Targets
    from ..io.source import ByteSource

PROBE = "comfyquant_probe.linear"
"""Layer name used when one layer is checked on its own; replaced by the real name in messages."""


def format_findings(params: Params, planned: dict[str, tuple[str, tuple]], bias: tuple | None = None) -> list:
    """Findings of the format package on a planned layer: its marker against the description's
    keys, its (suffix, dtype, shape) against the slots and constraints.  Layer-relative (the
    message holds ``{layer}``), with the format's own severities."""
    metas = {s: Meta(d, sh) for s, (d, sh) in planned.items()}
    if bias is not None:
        metas["bias"] = Meta(bias[0], bias[1])
    findings, _env = check_layer(registry.FORMATS[params.FORMAT], params.marker(), metas)
    return findings


# -- virtual checkpoints ----------------------------------------------------------------------


class SkeletonSource:
    """A byte source holding a header and a few blobs (marker bytes); all else reads as zeros.

    The checker only ever reads headers and markers, so it cannot tell this from the file
    that will be written."""

    first_read = FIRST_READ

    def __init__(self, name: str, header: bytes, blobs: list[tuple[int, bytes]], size: int) -> None:
        self.name = name
        self.size = size
        self._parts = [(0, header)] + sorted(blobs)

    def pread(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        out = bytearray(max(0, end - offset))
        for start, data in self._parts:
            lo, hi = max(offset, start), min(end, start + len(data))
            if lo < hi:
                out[lo - offset : hi - offset] = data[lo - start : hi - start]
        return bytes(out)

    def pread_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.pread(o, n) for o, n in ranges]

    def close(self) -> None:
        pass


def skeleton(name: str, tensors: dict[str, tuple[str, tuple, Any]], metadata: dict[str, str] | None) -> SkeletonSource:
    """The source of a file with these tensors (data: bytes for markers, None for the rest)."""
    from ..dtypes import DTYPE_BITS

    header = build_header(tensors, metadata)
    blobs = []
    offset = len(header)
    for dtype, shape, data in tensors.values():
        if isinstance(data, (bytes, bytearray)):
            blobs.append((offset, bytes(data)))
        offset += math.prod(shape) * DTYPE_BITS[dtype] // 8
    return SkeletonSource(name, header, blobs, offset)


def check_files(files: list[tuple[str, dict, dict | None]], target: Targets) -> Report:
    """``check_checkpoint`` of the virtual checkpoint ``[(file name, tensors, metadata)]``."""
    from ..checker.run import check_checkpoint
    from ..checkpoint import open_checkpoint

    sources: list[ByteSource] = [skeleton(name, tensors, meta) for name, tensors, meta in files]
    names = [s.name for s in sources]
    with open_checkpoint(names, sources=sources, shardset=ShardSet(files=list(names))) as ckpt:
        return check_checkpoint(ckpt, target=target)


def marker_entries(layers: dict[str, dict]) -> tuple[dict[str, tuple], dict[str, str]]:
    """Marker tensors and the identical header map for ``{prefix: marker}`` (what ComfyUI 0.33.0
    ``comfy/utils.py`` ``convert_old_quants`` and SGLang 0.5.23 ``inspect_comfy_quant_markers``
    read). A file whose layers are all of a format with a header map of its own
    (``Format.serialized_map``) gets that map and no marker tensors."""
    own = _serialized_map(layers)
    if own is not None:
        return {}, {MARKER_MAP: marker_map_text(*own)}
    tensors = dict(marker_tensor(prefix, marker) for prefix, marker in layers.items())
    meta = {MARKER_MAP: marker_map_text(layers)} if layers else {}
    return tensors, meta


def _serialized_map(layers: dict[str, dict]) -> tuple[dict, str, dict] | None:
    """The format's own header map when every layer is of one format that has one."""
    if not layers:
        return None
    from ..formats.registry import FORMATS

    names = {str(m.get("format")) for m in layers.values()}
    fmt = FORMATS.get(next(iter(names))) if len(names) == 1 else None
    if fmt is None or fmt.serialized_map is None:
        return None
    return fmt.serialized_map(sorted(layers))


_LAYER_MEMO: dict[tuple, list] = {}


def layer_problems(name: str, params: Params, n: int, k: int, bias: tuple | None, target) -> list[str]:
    """Why this one layer cannot be written in this format, or the selected targets cannot
    take it (empty: they can).

    First the format package's own rules on the planned layer (``format_findings``: an
    error there is a plan the format forbids, whatever the target); then the runtimes, on a
    file holding only this layer.  Results depend on the shape, parameters and bias, not on
    the name (except SGLang's embedding test), so they are cached."""
    key = (params, n, k, bias, str(target), "embed" in name.rsplit(".", 1)[-1])
    found = _LAYER_MEMO.get(key)
    if found is None:
        probe = PROBE + ("_embed" if key[-1] else "")
        try:
            planned = planned_tensors(params, n, k)
        except ShapeRefused as exc:
            _LAYER_MEMO[key] = [(probe, str(exc))]
            return [str(exc)]
        found = _finding_lines(format_findings(params, planned, bias), probe)
        if not found:
            tensors = {f"{probe}.{s}": (d, sh, None) for s, (d, sh) in planned.items()}
            if bias is not None:
                tensors[f"{probe}.bias"] = (bias[0], bias[1], None)
            mt, meta = marker_entries({probe: params.marker()})
            tensors.update(mt)
            found = problems(check_files([("probe.safetensors", tensors, meta)], target))
        found = _LAYER_MEMO[key] = [(probe, text) for text in found]
    return [text.replace(probe, name) for probe, text in found]


def _finding_lines(findings: list, layer: str) -> list[str]:
    """The format's errors on a planned layer, one line each as ``problems`` words them."""
    return [_LAYER_LEAD.sub("", f.message.replace("{layer}", repr(layer))) for f in findings if f.severity == "error"]


_LAYER_LEAD = re.compile(r"^layer \S+ \([^)]*\): ")


def problems(report, warnings: bool = True) -> list[str]:
    """One line per error (and warning) of a report: the runtimes it breaks (when not all of
    them), then the message."""
    from ..targets.select import TARGETS

    out = []
    for f in report.findings:
        if f.severity == "error" or (warnings and f.severity == "warning"):
            msg = f.message.replace("{layer}", repr(f.layer)) if f.layer else f.message
            msg = _LAYER_LEAD.sub("", msg)
            if "." in f.code and f.cause and f.cause not in msg:
                # a runtime's own words (its exception text) say what it checked, not why the
                # planned layer fails it: the profile's cause says that in terms of the layer
                msg = f"{msg} (why: {f.cause})"
            who = ", ".join(f.targets) if f.targets and set(f.targets) != set(TARGETS) else ""
            out.append(f"{who}: {msg}" if who else msg)
    return out


def format_problems(params: Params, target, name: str) -> list[str]:
    """Problems of the format and parameters themselves: a layer of a shape every rule
    accepts (K a multiple of every group and rotation size) still fails.  Such a choice is
    refused outright instead of leaving every layer dense."""
    k = math.lcm(1024, int(params.get("group_size") or 1), int(params.get("convrot_groupsize") or 1))
    return layer_problems(name, params, 256, k, None, target)
