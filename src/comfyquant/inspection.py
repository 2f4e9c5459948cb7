"""``inspect``: what is in a checkpoint, per layer and in total, from the header alone."""

from __future__ import annotations

from .checkpoint import Checkpoint, NameMapper, Paths
from .dialects.containers import open_any
from .dialects.registry import detect
from .dtypes import MODEL_FLOAT_DTYPES
from .formats.base import GeometryError
from .formats.registry import FORMATS
from .io.header import TensorEntry
from .targets.comfyui_model import architecture_of

DENSE = "dense"
SCHEMA = 2
"""Version of ``inspect --json``: 2 made ``params`` an object and ``dtypes`` a list (1: text)."""


class LayerRow:
    """One layer of the inventory.  (Hand-written rather than a dataclass: ``inspect`` is a
    start-up-bound command and ``import dataclasses`` would be a tenth of its instructions.)"""

    __slots__ = (
        "name",
        "format",
        "n",
        "k",
        "params",
        "dtypes",
        "bytes",
        "bits_per_weight",
        "marked",
        "dialect",
        "verdict",
        "marker",
        "stored",
    )

    def __init__(
        self,
        name: str,
        format: str,
        n: int | None,
        k: int | None,
        params: str,
        dtypes: str,
        bytes: int,
        bits_per_weight: float | None,
        marked: bool = True,
        dialect: str = "comfy",
        verdict: str | None = None,
    ) -> None:
        self.name = name
        self.format = format
        self.n = n
        self.k = k
        self.params = params
        self.dtypes = dtypes
        self.bytes = bytes
        self.bits_per_weight = bits_per_weight
        self.marked = marked
        self.dialect = dialect
        """The layout the layer is written in: ``comfy``, ``dense`` or a dialect's label."""
        self.verdict = verdict
        """For a dialect's layer, what ``migrate`` makes of it (exact, byte-permutation, ...)."""
        self.marker: dict | None = None
        """The layer's marker as stored (the JSON's structured twin of ``params``)."""
        self.stored: dict[str, dict] = {}
        """Suffix -> {"dtype", "shape"} of each stored tensor (the structured twin of ``dtypes``)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LayerRow) and all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return f"LayerRow({self.name!r}, {self.format!r}, N={self.n}, K={self.k})"

    def to_dict(self) -> dict:
        return {
            "layer": self.name,
            "format": self.format,
            "N": self.n,
            "K": self.k,
            "params": {k: v for k, v in (self.marker or {}).items() if k != "format"},
            "params_text": self.params,
            "dtypes": [{"tensor": suffix, **t} for suffix, t in self.stored.items()],
            "bytes": self.bytes,
            "bits_per_weight": self.bits_per_weight,
            "marked": self.marked,
            "dialect": self.dialect,
            "verdict": self.verdict,
            "marker": self.marker,
        }


class Inventory:
    """Every layer's row and the checkpoint's totals (hand-written for start-up, as LayerRow)."""

    __slots__ = (
        "paths",
        "files",
        "rows",
        "other_bytes",
        "other_tensors",
        "file_bytes",
        "bf16_bytes",
        "dialects",
        "notes",
        "metadata",
        "tensors",
        "damage",
        "architecture",
    )

    def __init__(
        self,
        paths: list[str],
        files: list[str],
        rows: list[LayerRow] | None = None,
        other_bytes: int = 0,
        other_tensors: int = 0,
        file_bytes: int = 0,
        bf16_bytes: int = 0,
    ) -> None:
        self.paths = paths
        self.files = files
        self.rows = rows if rows is not None else []
        self.other_bytes = other_bytes
        self.other_tensors = other_tensors
        self.file_bytes = file_bytes
        self.bf16_bytes = bf16_bytes
        self.dialects: list[str] = ["dense"]
        self.notes: list[str] = []
        """What the dialects say about the whole file, and what only its data can tell."""
        self.metadata: dict[str, dict[str, str]] = {}
        """Each file's ``__metadata__``."""
        self.tensors: list[dict] = []
        """Every tensor: name, dtype, shape, bytes, file and the layer it belongs to (or None)."""
        self.architecture: dict | None = None
        """The whole model ComfyUI builds from the file (``targets.comfyui_model``)."""
        self.damage: list[dict] = []
        """The container's errors (a truncated file, overlapping data, a missing shard ...):
        code, message, file and tensor of each.  A damaged file's table is what its header
        claims, not what it holds: ``inspect`` says so and exits 1, as ``check`` does."""

    @property
    def dialect(self) -> str:
        return "+".join(self.dialects)

    def __repr__(self) -> str:
        formats = ", ".join(f"{f} x{t['layers']}" for f, t in self.totals().items())
        damaged = f", {len(self.damage)} damage" if self.damage else ""
        return (
            f"Inventory({self.paths}, {len(self.rows)} layers ({formats or 'none'}), layout {self.dialect}, "
            f"{self.file_bytes} bytes{damaged})"
        )

    def totals(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for r in self.rows:
            t = out.setdefault(r.format, {"layers": 0, "weights": 0, "bytes": 0})
            t["layers"] += 1
            t["weights"] += (r.n or 0) * (r.k or 0)
            t["bytes"] += r.bytes
        for t in out.values():
            t["bits_per_weight"] = round(8 * t["bytes"] / t["weights"], 3) if t["weights"] else None
        return out

    def to_dict(self, metadata: bool = False, tensors: bool = False) -> dict:
        extra: dict = {}
        if metadata:
            extra["metadata"] = self.metadata
        if tensors:
            extra["tensors"] = self.tensors
        return {
            "schema": SCHEMA,
            "paths": self.paths,
            "files": self.files,
            "dialect": self.dialect,
            "dialects": self.dialects,
            "notes": self.notes,
            "layers": [r.to_dict() for r in self.rows],
            "totals": self.totals(),
            "other_tensors": {"count": self.other_tensors, "bytes": self.other_bytes},
            "file_bytes": self.file_bytes,
            "bf16_bytes": self.bf16_bytes,
            "compression_vs_bf16": round(self.bf16_bytes / self.file_bytes, 3) if self.file_bytes and not self.damage else None,
            "damage": self.damage,
            "architecture": self.architecture,
            **extra,
        }


def _params_text(fmt, env: dict, marker: dict | None) -> str:
    """The format's own text for the layer's variant and parameters (``Format.inspect_text``;
    without one, the variant if the geometry names one), then what every format shares."""
    text = fmt.inspect_text(env) if fmt.inspect_text is not None else str(env.get("variant", ""))
    parts = [text] if text else []
    if marker and marker.get("full_precision_matrix_mult"):
        parts.append("full-precision mm")
    return " ".join(parts)


class _AsStored:
    """A tensor's dtype and bytes as its file stores them.  A container read through a view
    (GGUF: quantized tensors viewed as their F32 decode) says what each is in the file."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.map: dict[str, tuple[str, int]] = {}
        for s in ckpt.sources:
            self.map.update(getattr(s, "stored_as", None) or {})

    def nbytes(self, e) -> int:
        got = self.map.get(e.name)
        return e.nbytes if got is None else got[1]

    def dtype(self, e) -> str:
        got = self.map.get(e.name)
        return e.dtype if got is None else got[0]


def _translated_row(tr, name: str, counted: set[str], kept: _AsStored) -> LayerRow:
    """A dialect's layer: the Comfy format it becomes (its geometry read from the translated
    tensors), or the stored weight's shape when it becomes none."""
    stored = tr.inputs
    counted.update(e.name for e in stored.values())
    size = sum(kept.nbytes(e) for s, e in stored.items() if s != "bias")
    dtypes = " ".join(f"{s}:{kept.dtype(e)}" for s, e in stored.items() if s != "bias")
    fmt = FORMATS.get(tr.format) if tr.format else None
    n = k = None
    params = tr.variant
    if fmt is not None:
        moved = {m.suffix: TensorEntry(m.source, m.dtype, m.shape, 0, 0, "") for m in tr.moves}
        try:
            env = fmt.geometry(moved, fmt.params(tr.marker or {}))
            n, k = env.get("N"), env.get("K")
        except GeometryError:
            pass
    else:
        w = stored.get("weight")
        if w is not None and len(w.shape) == 2:
            n, k = w.shape
    label = tr.format or ("dense" if tr.verdict in ("exact", "byte-permutation") else tr.verdict)
    if tr.declared is not None:  # the file's own map names the format: shown as stored
        label, params = tr.declared, ""
        w = stored.get("weight")
        n, k = w.shape if w is not None and len(w.shape) == 2 else (n, k)
    bpw = round(8 * size / (n * k), 3) if n and k else None
    return LayerRow(name, label, n, k, params, dtypes, size, bpw, tr.declared is not None, tr.label, tr.verdict)


def _structured(row: LayerRow, marker: dict | None, stored: dict, kept: _AsStored | None = None) -> LayerRow:
    row.marker = marker
    row.stored = {
        s: {"dtype": kept.dtype(e) if kept else e.dtype, "shape": list(e.shape)} for s, e in stored.items() if s != "comfy_quant"
    }
    return row


def _add_translated(inv: Inventory, row: LayerRow, tr, kept: _AsStored) -> None:
    inv.rows.append(_structured(row, tr.marker, tr.inputs, kept))
    bias = tr.inputs.get("bias")
    inv.bf16_bytes += 2 * (row.n or 0) * (row.k or 0) + (kept.nbytes(bias) if bias else 0)


def inventory(ckpt: Checkpoint) -> Inventory:
    inv = Inventory(ckpt.paths, ckpt.files)
    inv.damage = [
        {"code": f.code, "message": f.message, "file": f.file, "tensor": f.tensor} for f in ckpt.findings if f.severity == "error"
    ]
    sizes = {s.name: getattr(s, "stored_size", None) for s in ckpt.sources}
    inv.file_bytes = sum(sizes.get(h.file) or h.size for h in ckpt.headers)
    inv.architecture = architecture_of(ckpt)
    kept = _AsStored(ckpt)
    counted: set[str] = set()
    detection = detect(ckpt)
    inv.dialects = detection.names
    inv.notes = [n for c in detection.claims for n in (*c.notes, *(f"only the data can tell: {u}" for u in c.unsettled))]
    claimed = detection.layers
    for prefix, tr in claimed.items():
        if prefix not in ckpt.layers:
            _add_translated(inv, _translated_row(tr, prefix, counted, kept), tr, kept)
    for prefix, layer in ckpt.layers.items():
        if prefix in claimed:
            _add_translated(inv, _translated_row(claimed[prefix], layer.name, counted, kept), claimed[prefix], kept)
            continue
        t = layer.tensors
        w = t.get("weight")
        if w is None:
            continue
        size = sum(e.nbytes for s, e in layer.stored.items() if s not in ("bias", "comfy_quant"))  # every expert
        counted.update(e.name for e in t.values())
        fmt = FORMATS.get(layer.format_name) if layer.format_name else None
        bias = layer.stored.get("bias")
        dtypes = " ".join(f"{s}:{e.dtype}" for s, e in t.items() if s not in ("comfy_quant", "bias"))
        if fmt is None:
            name = DENSE if w.dtype in ("F32", "F16", "BF16", "F64") else f"unknown ({w.dtype})"
            n, k = (w.shape[0], w.numel // w.shape[0]) if len(w.shape) >= 2 and w.shape[0] else (None, None)
            numel = w.numel
            inv.rows.append(
                _structured(
                    LayerRow(
                        layer.name,
                        name,
                        n,
                        k,
                        "x".join(map(str, w.shape)),
                        dtypes,
                        size,
                        round(8 * size / numel, 3) if numel else None,
                        layer.marker is not None,
                        "comfy" if layer.marker is not None else "dense",
                    ),
                    layer.marker,
                    layer.stored,
                )
            )
            inv.bf16_bytes += 2 * numel + (bias.nbytes if bias else 0)
            continue
        try:
            env = fmt.geometry(t, fmt.params(layer.marker or {}))
        except GeometryError:
            env = {}
        n, k = env.get("N"), env.get("K")
        if layer.bank is not None and layer.bank.layout == "experts" and n:
            n *= layer.bank.experts  # N counts the rows of every expert, as for a flattened bank
        label = fmt.name + (" (unmarked)" if layer.inferred else "")
        bpw = round(8 * size / (n * k), 3) if n and k else None
        params = _params_text(fmt, env, layer.marker) if env else "?"
        if layer.bank is not None:
            params = f"E={layer.bank.experts} bank" + ("" if params == "?" else f" {params}")
        inv.rows.append(
            _structured(
                LayerRow(layer.name, label, n, k, params, dtypes, size, bpw, not layer.inferred), layer.marker, layer.stored
            )
        )
        inv.bf16_bytes += 2 * (n or 0) * (k or 0) + (bias.nbytes if bias else 0)
    inv.metadata = {h.file: dict(h.metadata) for h in ckpt.headers}
    owner = {e.name: p for p, lay in ckpt.layers.items() for e in lay.stored.values()}
    owner.update({e.name: p for p, tr in claimed.items() for e in tr.inputs.values()})
    inv.tensors = [
        {
            "name": n,
            "dtype": kept.dtype(e),
            "shape": list(e.shape),
            "bytes": kept.nbytes(e),
            "file": e.file,
            "layer": owner.get(n),
        }
        for n, e in ckpt.tensors.items()
    ]
    for name, e in ckpt.tensors.items():
        if name not in counted:
            inv.other_tensors += 1
            inv.other_bytes += kept.nbytes(e)
            inv.bf16_bytes += e.nbytes if e.dtype in MODEL_FLOAT_DTYPES and not name.endswith("comfy_quant") else 0
    return inv


def inspect(paths: Paths, name_mapper: NameMapper | None = None) -> Inventory:
    """Inventory of a checkpoint (file, shards, folder or index.json) from its headers."""
    with open_any(paths, name_mapper=name_mapper) as ckpt:
        return inventory(ckpt)
