"""``compare A B``: how far one checkpoint's weights are from another's, layer by layer.

``B`` is the reference: for every layer whose ``weight`` both files hold, the relative L2
error ``||a - b|| / ||b||``, the cosine similarity and the largest absolute difference.  Either
file may be dense or quantized (any Comfy format, or any dialect: both are read through
``comfyquant.dialects.view.viewed``, as ``dequantize`` reads them), so the same command
answers "how far is this quantized file from its original" and "how far apart are two
quantizations".

A quantized layer is decoded with its codec (``comfyquant.dequantizer.plan_layers``, the
decode ``dequantize`` writes) to its model dtype, or to ``dtype`` when given; a dense weight is
read from the file.  Both are walked in row blocks side by side and only the sums are kept
(F32 products summed in F64, ``comfyquant.numerics.closeness``, the arithmetic of
``quantize``'s quality report), so memory is a block of each -- at most a whole layer of each,
for the formats whose decode is one GEMM over the layer.  Layers are listed in model order
(``comfyquant.naming.natural_key``); layers only one file has are listed, and a layer whose
shapes differ is not compared, with the reason.

The module also holds what the ``--max-error`` quality gate of ``quantize``, ``convert`` and
``fix`` shares: the layers over the limit, worst first, and where an output over it is kept
(``over_outputs``: never at the requested path).  torch is imported only when layers are
compared.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .dtypes import MODEL_FLOAT_DTYPES
from .errors import InputError, option
from .naming import natural_key, printable

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

OVER_TAG = "over-max-error"
"""The word an output over ``--max-error`` is kept under (``<stem>.over-max-error.safetensors``)."""
DENSE_BLOCK_ELEMENTS = 1 << 20
"""Elements per row block read from a dense weight (4 MiB in F32)."""


class CompareError(InputError):
    """An input ``compare`` cannot read or decode; the message names the file or layer."""


@dataclass
class LayerComparison:
    """One layer of both files: the figures, or why it was not compared."""

    layer: str
    index: int
    """Position in model order among the layers both files hold."""
    shape: list[int]
    a: str
    """What A stores: its format, or ``dense <dtype>``."""
    b: str
    rel_l2: float | None = None
    cosine: float | None = None
    max_abs: float | None = None
    nonfinite: int = 0
    """NaN/Inf values in A's or B's weight (the figures are then not finite)."""
    note: str | None = None
    refused: str | None = None
    """Why the layer was not compared (the figures are then None)."""

    @property
    def compared(self) -> bool:
        return self.refused is None

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "index": self.index,
            "shape": self.shape,
            "a": self.a,
            "b": self.b,
            "rel_l2": _finite(self.rel_l2),
            "cosine": _finite(self.cosine),
            "max_abs": _finite(self.max_abs),
            "nonfinite": self.nonfinite,
            "note": self.note,
            "refused": self.refused,
        }


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite figure is null (``nonfinite`` says why)."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Comparison:
    """What ``compare`` found: every layer both files hold (model order), and the rest."""

    a: list[str]
    b: list[str]
    dtype: str | None
    layers: list[LayerComparison] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    selected: list[str] | None = None
    seconds: float = 0.0

    @property
    def compared(self) -> list[LayerComparison]:
        return [r for r in self.layers if r.compared]

    def __repr__(self) -> str:
        s = self.summary()
        worst = self.worst()
        top = f" ({worst[0].layer})" if worst else ""
        return (
            f"Comparison({self.a} vs {self.b}: {s['compared']} layers compared, relative L2 mean "
            f"{_num(s['rel_l2_mean'], 4)}, max {_num(s['rel_l2_max'], 4)}{top}; {s['refused']} refused, "
            f"{s['only_a']} only in A, {s['only_b']} only in B)"
        )

    @property
    def refused(self) -> list[LayerComparison]:
        return [r for r in self.layers if not r.compared]

    def worst(self) -> list[LayerComparison]:
        """Compared layers by relative L2 error, largest (or not finite) first."""
        return sorted(self.compared, key=lambda r: (-_sort_value(r.rel_l2), r.index))

    def summary(self) -> dict:
        done = self.compared
        finite = [r.rel_l2 for r in done if r.rel_l2 is not None and math.isfinite(r.rel_l2)]
        worst = self.worst()
        top_abs = max(done, key=lambda r: _sort_value(r.max_abs), default=None)
        low_cos = min(
            done, key=lambda r: r.cosine if r.cosine is not None and math.isfinite(r.cosine) else -math.inf, default=None
        )
        return {
            "compared": len(done),
            "refused": len(self.refused),
            "only_a": len(self.only_a),
            "only_b": len(self.only_b),
            "nonfinite_layers": sum(1 for r in done if r.nonfinite),
            "rel_l2_mean": sum(finite) / len(finite) if finite else None,
            "rel_l2_max": _finite(worst[0].rel_l2) if worst else None,
            "rel_l2_max_layer": worst[0].layer if worst else None,
            "cosine_min": _finite(low_cos.cosine) if low_cos else None,
            "cosine_min_layer": low_cos.layer if low_cos else None,
            "max_abs": _finite(top_abs.max_abs) if top_abs else None,
            "max_abs_layer": top_abs.layer if top_abs else None,
        }

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "tool": "comfyquant",
            "command": "compare",
            "a": self.a,
            "b": self.b,
            "reference": "b",
            "dtype": self.dtype,
            "layers_selected": self.selected,
            "summary": self.summary(),
            "layers": [r.to_dict() for r in self.layers],
            "only_a": self.only_a,
            "only_b": self.only_b,
            "seconds": round(self.seconds, 3),
        }

    def render(self, sort: str = "model") -> str:
        """The table (model order, or ``sort="error"``: worst first), the summary and the
        layers not compared."""
        from .render import table

        def name(paths: list[str]) -> str:
            return paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} files)"

        lines = [f"compare A: {name(self.a)}", f"   with B: {name(self.b)} (the reference: relative L2 = ||A-B|| / ||B||)"]
        rows = self.worst() if sort == "error" else self.compared
        if rows:
            cells = [
                [r.layer, "x".join(map(str, r.shape)), r.a, r.b, _num(r.rel_l2, 5), _num(r.cosine, 6), _num(r.max_abs, 4, "g")]
                for r in rows
            ]
            lines += ["  " + x for x in table(["layer", "shape", "A", "B", "rel L2", "cosine", "max abs"], cells, {4, 5, 6})]
        s = self.summary()
        if s["compared"]:
            lines.append(
                f"{s['compared']} layer{'s' * (s['compared'] != 1)} compared: relative L2 mean "
                f"{_num(s['rel_l2_mean'], 5)}, max {_num(s['rel_l2_max'], 5)} ({s['rel_l2_max_layer']}); "
                f"cosine min {_num(s['cosine_min'], 6)} ({s['cosine_min_layer']}); "
                f"max abs error {_num(s['max_abs'], 4, 'g')} ({s['max_abs_layer']})"
            )
        else:
            lines.append("no layer compared")
        bad = [r for r in self.compared if r.nonfinite]
        if bad:
            lines.append(
                f"warning: {len(bad)} layer{'s' * (len(bad) != 1)} hold NaN/Inf values (figures not finite): "
                + _names([r.layer for r in bad])
            )
        for r in self.refused:
            lines.append(f"not compared: {r.layer}: {r.refused}")
        if self.only_a:
            lines.append(f"only in A ({len(self.only_a)}): {_names(self.only_a)}")
        if self.only_b:
            lines.append(f"only in B ({len(self.only_b)}): {_names(self.only_b)}")
        return "\n".join(printable(line) for line in lines)  # lines quote names from the file


def _sort_value(x: float | None) -> float:
    """A figure for sorting: not finite (NaN/Inf) sorts as the largest."""
    if x is None:
        return -math.inf
    return math.inf if not math.isfinite(x) else x


def _num(x: float | None, digits: int, kind: str = "f") -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}{kind}}"


def _names(names: list[str], shown: int = 8) -> str:
    more = f", ... ({len(names)} layers)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


# -- the API ----------------------------------------------------------------------------------


def compare(
    a, b, *, layers: str | Iterable[str] | None = None, dtype: str | None = None, progress: bool | None = None
) -> Comparison:
    """Compare the checkpoint ``a`` with the reference ``b`` (each a file, shards, a folder or
    an index; any Comfy format, dense, or a dialect) layer by layer.

    ``layers``: glob(s) of layer names to compare (``blocks.1*``); ``dtype``: decode quantized
    layers to ``bf16``/``f16``/``f32`` instead of their model dtype; ``progress``: a progress
    line on stderr (default: when it is a terminal, periodic lines otherwise)."""
    from .gate import open_input
    from .io.progress import Progress

    if dtype is not None and dtype not in ("bf16", "f16", "f32"):
        raise CompareError(f"{option('--dtype', 'dtype')} must be one of bf16, f16, f32, got {dtype!r}")
    globs = [layers] if isinstance(layers, str) else list(layers) if layers is not None else None
    started = time.perf_counter()
    # Each input passes the gate every decoding command shares (its stored file first, then the
    # Comfy file it reads as): what check finds broken is refused here too, naming the input.
    with (
        open_input(a, "compare", CompareError, check=False) as (_, ca),
        open_input(b, "compare", CompareError, check=False) as (_, cb),
    ):
        side_a, side_b = _Side(ca, "A", dtype), _Side(cb, "B", dtype)
        result = Comparison(list(ca.paths), list(cb.paths), dtype, selected=globs)
        names_a = {p for p in side_a.weights if _selected(p, globs)}
        names_b = {p for p in side_b.weights if _selected(p, globs)}
        result.only_a = sorted(names_a - names_b, key=natural_key)
        result.only_b = sorted(names_b - names_a, key=natural_key)
        common = sorted(names_a & names_b, key=natural_key)
        bar = Progress(len(common), sum(side_a.nbytes(p) + side_b.nbytes(p) for p in common), progress, label="compare")
        try:
            with _reused_outputs():  # layer after layer: large temporaries reuse the last ones' memory
                for i, prefix in enumerate(common):
                    result.layers.append(_compare_layer(i, prefix, side_a, side_b))
                    bar.add(side_a.nbytes(prefix) + side_b.nbytes(prefix), 1)
        finally:
            bar.done()
    result.seconds = time.perf_counter() - started
    return result


def _reused_outputs():
    from .numerics.pages import reused_outputs  # torch: imported when a comparison runs

    return reused_outputs()


def _selected(name: str, globs: list[str] | None) -> bool:
    return globs is None or any(fnmatch.fnmatchcase(name, g) for g in globs)


class _Weight:
    """One file's weight of a layer as row blocks of a 2-D ``[rows, cols]`` view: the decoded
    weight of a quantized layer (a MoE bank expert after expert) or the stored dense one."""

    def __init__(self, kind: str, shape: tuple[int, ...], blocks, pad: tuple[int, int] = (1, 1)) -> None:
        self.kind = kind
        self.shape = tuple(int(d) for d in shape)
        self.blocks = blocks
        """A function returning the iterator of blocks (each used before the next is asked for)."""
        self.pad = pad
        """The multiples the format pads a stored weight to (rows, columns)."""


class _Side:
    """One input: its weights by layer, quantized ones with their decode plans."""

    def __init__(self, ckpt: Checkpoint, label: str, dtype: str | None) -> None:
        from .gate import check_input
        from .markers import file_level_markers

        self.ckpt = ckpt
        self.label = label
        self.path = ckpt.paths[0] if len(ckpt.paths) == 1 else ckpt.files[0]
        check_input(ckpt, f"compare {self.path}", CompareError)
        self.weights = {p: layer for p, layer in ckpt.layers.items() if layer.stored.get("weight") is not None}
        from .dequantizer import plan_layers

        planned = plan_layers(ckpt, dtype, file_level_markers(ckpt), f"compare {self.path}", CompareError)
        self.decoded = {d.name: d for d in planned.values()}

    def nbytes(self, prefix: str) -> int:
        return sum(e.nbytes for e in self.weights[prefix].stored.values())

    def weight(self, prefix: str) -> _Weight | str:
        """The layer's weight, or why it cannot be compared."""
        decoded = self.decoded.get(prefix)
        if decoded is not None:
            from .formats.registry import FORMATS

            fmt = decoded.plan.marker.get("format")
            return _Weight(str(fmt), decoded.shape, lambda: self._decode(decoded), FORMATS[fmt].pad)
        entry = self.weights[prefix].stored["weight"]
        from .numerics.dtypes import TORCH_DTYPES

        dtype = TORCH_DTYPES.get(entry.dtype)
        if dtype is None or not dtype.is_floating_point or dtype.itemsize < 2:
            return f"{self.label}'s weight is {entry.dtype}, neither a float weight nor a quantized layer"
        return _Weight(f"dense {entry.dtype}", tuple(entry.shape), lambda: self._dense(entry))

    def _decode(self, layer) -> Iterator:
        from .dequantizer import mapped_entries, packed_entries
        from .formats.codec import CodecError
        from .numerics.dtypes import from_bytes

        for entries in layer.per_expert or (layer.entries,):
            needed = packed_entries(layer, entries)
            # large tensors mapped from the page cache (copy-on-write), the rest read and copied
            # into writable memory
            raw = mapped_entries(self.ckpt, needed, CompareError)
            rest = [e for e in needed if e.name not in raw]
            raw.update((name, bytearray(data)) for name, data in self.ckpt.read_many(rest).items())
            tensors = {s: from_bytes(raw[e.name], e.dtype, e.shape) for s, e in entries.items() if e.name in raw}
            try:
                yield from layer.codec.iter_decode(tensors, layer.plan.marker, dtype=layer.dtype, plan=layer.plan)
            except CodecError as exc:
                raise CompareError(f"{self.path}: cannot decode: {exc}") from None

    def _dense(self, entry) -> Iterator:
        from .numerics.rows import row_ranges

        rows = file_rows(self.ckpt.source(entry.file), entry, CompareError)
        for r0, r1 in row_ranges(rows.shape[0], rows.shape[1], DENSE_BLOCK_ELEMENTS, join_tail=False):
            yield rows.rows(r0, r1)


def reference_weight(
    ref, label: str, layer: str, shape: tuple[int, ...], error: type[Exception], role: str = "layer", verb: str = "is"
):
    """The header entry of ``layer``'s original weight in the reference checkpoint ``ref``,
    refused with ``error`` (naming ``label`` and the ``role`` of the layer) unless it is a dense
    float weight of ``shape``: ``quantize --reference`` and ``fix --reference`` take the
    original the same way."""
    name = f"{layer}.weight"
    entry = ref.tensors.get(name)
    if entry is None:
        raise error(f"{label}: has no tensor {name!r} (the original of {role} {layer!r})")
    if entry.dtype not in MODEL_FLOAT_DTYPES:
        raise error(
            f"{label}: {name!r} is {entry.dtype}, not a dense float weight (F32, BF16 or F16): "
            f"{option('--reference', 'reference=')} takes the original, unquantized checkpoint"
        )
    if tuple(entry.shape) != tuple(shape):
        raise error(
            f"{label}: {name!r} has shape {list(entry.shape)}, but {role} {layer!r} {verb} "
            f"{list(shape)}: not the original of this layer"
        )
    return entry


def file_rows(source, entry, error: type[Exception] = CompareError):
    """A stored dense tensor as a ``RowSource`` of ``[rows,
    last dimension]`` (a 1-D tensor is one row), each block read from ``source`` when asked
    for: what ``compare`` and ``fix --reference`` read a dense weight with."""
    from .numerics.dtypes import TORCH_DTYPES, from_bytes
    from .numerics.rows import RowSource

    cols = int(entry.shape[-1]) if len(entry.shape) else 1
    n = math.prod(entry.shape) // cols if cols else 0
    row_bytes = entry.nbytes // n if n else 0

    def read(r0: int, r1: int):
        size = (r1 - r0) * row_bytes
        data = source.pread(entry.start + r0 * row_bytes, size)
        if len(data) != size:
            raise error(f"{entry.file}: file ended early while reading {entry.name!r} (truncated?)")
        return from_bytes(bytearray(data), entry.dtype, (r1 - r0, cols))

    return RowSource((n, cols), TORCH_DTYPES[entry.dtype], read)


def _compare_layer(index: int, prefix: str, side_a: _Side, side_b: _Side) -> LayerComparison:
    wa, wb = side_a.weight(prefix), side_b.weight(prefix)
    kinds = [w.kind if isinstance(w, _Weight) else "-" for w in (wa, wb)]
    shape = next((list(w.shape) for w in (wb, wa) if isinstance(w, _Weight)), [])
    row = LayerComparison(prefix, index, shape, kinds[0], kinds[1])
    if isinstance(wa, str) or isinstance(wb, str):
        row.refused = wa if isinstance(wa, str) else str(wb)
        return row
    crop = _crop(wa, wb)
    if isinstance(crop, str):
        row.refused = crop
        return row
    blocks_a, blocks_b = wa.blocks(), wb.blocks()
    if crop is not None:
        (which, rows, cols), note = crop
        row.note = note
        if which == "a":
            blocks_a = _cropped(blocks_a, rows, cols)
        else:
            blocks_b = _cropped(blocks_b, rows, cols)
    _measure(row, blocks_a, blocks_b)
    return row


def _crop(wa: _Weight, wb: _Weight):
    """None when the shapes agree; ((side, rows, cols), note) when one side is the other padded
    to its format's multiples (a quantized layer whose file does not record the model's
    size): only the model's part is compared; else the reason the layer is not compared."""
    if wa.shape == wb.shape:
        return None
    for which, big, small in (("a", wa, wb), ("b", wb, wa)):
        if len(big.shape) == len(small.shape) == 2:
            padded = tuple(-(-s // m) * m for s, m in zip(small.shape, big.pad))
            if big.shape == padded:
                side = which.upper()
                return (which, small.shape[0], small.shape[1]), (
                    f"{side} ({big.kind}) decodes to the padded shape {list(big.shape)}: its first "
                    f"{small.shape[0]} rows and {small.shape[1]} columns are compared"
                )
    return f"shapes differ: A ({wa.kind}) is {list(wa.shape)}, B ({wb.kind}) is {list(wb.shape)}"


def _cropped(blocks: Iterator, rows: int, cols: int) -> Iterator:
    """The first ``rows`` rows and ``cols`` columns of a stream of row blocks."""
    seen = 0
    for block in blocks:
        if seen >= rows:
            break
        take = min(block.shape[0], rows - seen)
        yield block[:take, :cols]
        seen += take


def _aligned(xs: Iterator, ys: Iterator) -> Iterator[tuple]:
    """Pairs of equally many rows from two streams of row blocks whose block boundaries may
    differ (a decoder's blocks, another decoder's or a file's): each block is used up before
    the next is asked for (decoders reuse one buffer)."""
    x = y = None
    while True:
        while x is None or x.shape[0] == 0:
            x = next(xs, None)
            if x is None:
                break
        while y is None or y.shape[0] == 0:
            y = next(ys, None)
            if y is None:
                break
        if x is None or y is None:
            if x is not None or y is not None:
                raise CompareError("internal: the two weights have different row counts (please report this)")
            return
        n = min(x.shape[0], y.shape[0])
        yield x[:n], y[:n]
        x, y = x[n:], y[n:]


def _measure(row: LayerComparison, blocks_a: Iterator, blocks_b: Iterator) -> None:
    """The figures of ``row`` from the two weights' row blocks: F32 differences, F64 sums."""
    import torch

    from .numerics.closeness import cosine, error_sums, relative_l2

    acc = torch.zeros(4, dtype=torch.float64)  # sum (a-b)^2, sum b^2, sum a*b, sum a^2
    top = torch.zeros((), dtype=torch.float32)
    nonfinite = 0
    for x, y in _aligned(blocks_a, blocks_b):
        x = x.to(torch.float32).reshape(x.shape[0], -1)
        y = y.to(torch.float32).reshape(y.shape[0], -1)
        sums = error_sums(x, y)
        if not bool(torch.isfinite(sums).all()):
            nonfinite += int((~torch.isfinite(x)).sum()) + int((~torch.isfinite(y)).sum())
        acc += sums
        if x.numel():
            top = torch.maximum(top, (x - y).abs_().max())  # NaN propagates
    e2, r2, dot, d2 = (float(v) for v in acc)
    row.nonfinite = nonfinite
    row.max_abs = float(top)
    if not all(math.isfinite(v) for v in (e2, r2, dot, d2)):
        row.rel_l2 = row.cosine = math.nan if nonfinite else math.inf
        return
    row.rel_l2 = relative_l2(e2, r2)
    row.cosine = cosine(r2, dot, d2)


# -- the plot ---------------------------------------------------------------------------------


def write_png(result: Comparison, path: str) -> None:
    """``figure`` written to ``path`` by the one writer (temporary file, fsync, rename)."""
    from .io.plots import stage_figure
    from .io.writer import commit_file, discard

    tmp = stage_figure(figure(result), path)
    try:
        commit_file(tmp, path)
    except OSError as exc:
        discard(tmp)
        raise InputError(f"{path}: cannot write the plot ({exc.strerror or exc}); nothing was written") from None


def figure(result: Comparison):
    """Relative L2 error per compared layer, bars in model order coloured by what A stores
    (format or dense dtype); the legend right of the plot, never over the bars."""
    import os

    from .io.plots import pyplot, title_figure

    plt = pyplot()
    rows = [r for r in result.compared if r.rel_l2 is not None]
    fig, ax = plt.subplots(figsize=(max(8.0, min(24.0, 0.12 * len(rows) + 6)), 4.5))
    kinds = list(dict.fromkeys(r.a for r in rows))
    colors = plt.get_cmap("tab10")
    for i, kind in enumerate(kinds):
        pts = [(j, l2 if math.isfinite(l2) else 0.0) for j, r in enumerate(rows) if r.a == kind and (l2 := r.rel_l2) is not None]
        ax.bar([p[0] for p in pts], [p[1] for p in pts], width=0.8, color=colors(i % 10), label=kind)
    ax.set_ylabel("relative L2 error ||A-B|| / ||B||")
    ax.grid(axis="y", alpha=0.3)
    if kinds:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    if len(rows) <= 60:
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r.layer for r in rows], rotation=90, fontsize=6)
    else:
        ax.set_xlabel("layer (model order)")
    s = result.summary()
    a = os.path.basename(result.a[0].rstrip("/")) if result.a else "A"
    b = os.path.basename(result.b[0].rstrip("/")) if result.b else "B"
    title_figure(
        fig,
        f"comfyquant compare: {a} vs {b}\n{len(rows)} layers, relative L2 error mean {_num(s['rel_l2_mean'], 4)}, "
        f"max {_num(s['rel_l2_max'], 4)}",
    )
    return fig


# -- the --max-error gate ---------------------------------------------------------------------


def over_limit(errors: dict[str, float], limit: float) -> list[tuple[str, float]]:
    """``(layer, error)`` of every layer above ``limit`` (a NaN error is above any), worst first."""
    over = [(name, e) for name, e in errors.items() if not (e <= limit)]
    return sorted(over, key=lambda item: -_sort_value(item[1]))


def check_limit(value) -> float:
    """``--max-error X``: a finite number >= 0, or a one-line refusal."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(
            f"{option('--max-error', 'max_error')} takes a number (a relative L2 error such as 0.05), got {value!r}"
        ) from None
    if not math.isfinite(x) or x < 0:
        raise InputError(f"{option('--max-error', 'max_error')} must be a finite number >= 0, got {value!r}")
    return x


def over_name(path: str) -> str:
    """``model.safetensors`` -> ``model.over-max-error.safetensors``; a folder ``OUT`` (or any
    other name) -> ``OUT.over-max-error``."""
    from .io.outputs import SUFFIX

    stripped = path.rstrip("/\\") or path
    if stripped.endswith(SUFFIX):
        return f"{stripped[: -len(SUFFIX)]}.{OVER_TAG}{SUFFIX}"
    return f"{stripped}.{OVER_TAG}"


def over_outputs(files: list[str], index: str | None, primary, overwrite: bool, error: type[Exception] = InputError):
    """Where a run over ``--max-error`` keeps its output instead of ``primary`` (the claimed
    ``Outputs``), claimed by the same rules before any work: one
    output file ``D`` -> ``<D stem>.over-max-error.safetensors`` next to it; an output folder
    (shards) -> ``<folder>.over-max-error`` beside it, same file names inside.  The requested
    path is never written by such a run."""
    import os

    from .io.outputs import claim

    single = primary.files is not None and len(primary.files) == 1 and not primary.index
    if single:
        out = over_name(primary.files[0])
    else:
        anchor = primary.files[0] if primary.files else primary.merged
        out = over_name(os.path.dirname(os.path.abspath(anchor)))
    try:
        return claim(files, index, out, overwrite=overwrite, tag=OVER_TAG, error=error)
    except error as exc:
        raise error(f"{exc} (that is where --max-error keeps an output over the limit)") from None
