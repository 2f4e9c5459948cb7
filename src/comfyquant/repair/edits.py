"""What a repair plan holds: its lines (``Change``), the values it assumes, the tensor
edits, and the options it was made with.

The planner (``plan``) and the dialect migrations (``migrate``) both fill a
``Plan``; keeping the data model below both lets the planner call the migrations
without either importing the other back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..checker.run import Targets
    from .lossy import Requant

LOSSLESS = "lossless"
STORAGE = "write markers as tensors and header map, identical"


class Change:
    """One line of the plan: what changes on which layer/tensor, before -> after.  ``assumed``
    lists the values this line writes that the file cannot confirm (``Assumption``)."""

    __slots__ = ("layer", "tensor", "what", "before", "after", "kind", "assumed")

    def __init__(self, layer: str | None, tensor: str | None, what: str, before: str, after: str, kind: str = LOSSLESS):
        self.layer = layer
        self.tensor = tensor
        self.what = what
        self.before = before
        self.after = after
        self.kind = kind
        self.assumed: list[Assumption] = []

    def __repr__(self) -> str:
        tensor = (
            self.tensor.rsplit(".", 1)[-1] if self.tensor and self.layer and self.tensor.startswith(self.layer) else self.tensor
        )
        where = " · ".join(x for x in (self.layer, tensor) if x) or "(checkpoint)"
        return f"Change({where}: {self.what}: {self.before} -> {self.after} [{self.kind}])"

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "tensor": self.tensor,
            "what": self.what,
            "before": self.before,
            "after": self.after,
            "kind": self.kind,
            "assumed": [a.text for a in self.assumed],
        }


class Assumption:
    """A marker value ``fix`` writes that neither the file's markers state nor the tensors'
    shapes confirm: given by an option, a reader's default, or one side of a conflict the
    tensors fit equally.  The repaired layer decodes with it, but nothing in the file says it
    is right: only a comparison with the original weights (``--reference``) can."""

    __slots__ = ("layer", "key", "value", "source")

    def __init__(self, layer: str, key: str, value, source: str) -> None:
        self.layer = layer
        self.key = key
        self.value = value
        self.source = source

    @property
    def text(self) -> str:
        return f"assumed: {self.key}={json.dumps(self.value)} ({self.source}; the file cannot confirm it)"

    def __repr__(self) -> str:
        return f"Assumption({self.layer}: {self.key}={json.dumps(self.value)} ({self.source}))"

    def to_dict(self) -> dict:
        return {"layer": self.layer, "key": self.key, "value": self.value, "source": self.source, "text": self.text}


class TensorEdit:
    """How one output tensor differs from its input: new dtype/shape and a byte transform."""

    __slots__ = ("name", "dtype", "shape", "transform")

    def __init__(self, name: str, dtype: str, shape: tuple, transform: Callable[[bytes], bytes] | None):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.transform = transform


class Plan:
    """Everything ``fix`` will do: plan lines, tensor edits, final markers, removals, refusals."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.edits: dict[str, TensorEdit] = {}
        self.renames: dict[str, str] = {}
        self.markers: dict[str, dict] = {}
        """Final marker per layer prefix (written as tensor marker and in the header map)."""
        self.drop: set[str] = set()
        self.requant: dict[str, Requant] = {}
        """Layers re-quantized by a lossy repair (``repair.lossy.Requant`` by prefix)."""
        self.refused: list[tuple[str | None, str]] = []
        """(layer, why) for defects the plan cannot repair."""
        self.markers_changed = False
        self.options = Options()
        """What the plan was made with (``plan_repairs`` sets the caller's)."""
        self.metadata_text: dict[str, dict[str, str]] = {}
        """Per input file: ``__metadata__`` values that were not strings, as their JSON text."""
        self.stated: dict[str, list[dict]] = {}
        """Per layer prefix: the marker objects the file states for it (header, tensor, and
        the marker its ``quant_format`` implies), against which written values are judged."""
        self.kept: dict[str, dict[str, dict]] = {}
        """Layers whose marker conflict is refused: their markers by kind (header, tensor),
        written back as found."""
        self.assumptions: list[Assumption] = []
        self.measured: list = []
        """``repair.reference.Measurement`` per repaired layer (``--reference``)."""
        self.homes: dict[str, str] = {}
        """Marker prefix -> the input file its layer's tensors are in, where that prefix is not
        a layer of the input (a dialect's layer renamed or grouped by its dialect)."""
        self.header_only: set[str] = set()
        """Marker prefixes written to the header map only (a dialect's ``Translation.header_only``)."""
        self.metadata_drop: set[str] = set()
        self.metadata_set: dict[str, str] = {}
        """``__metadata__`` keys a migration removes or sets (every output file)."""
        self.translations: list = []
        """``dialects.base.Translation`` of every dialect layer, with what was done to it."""

    def summary(self) -> str:
        """How many changes of each kind, refusals and assumptions: the plan in one clause."""
        lossy = sum(1 for c in self.changes if c.kind != LOSSLESS)
        text = f"{len(self.changes)} changes ({len(self.changes) - lossy} lossless, {lossy} lossy), {len(self.refused)} refused"
        return text + (f", {len(self.assumptions)} assumed" if self.assumptions else "")

    def __repr__(self) -> str:
        return f"Plan({self.summary()})"

    @property
    def empty(self) -> bool:
        """Nothing to repair.  Rewriting how markers are stored is a normalisation done along
        with real repairs, never a reason to write a file on its own."""
        return all(c.what == STORAGE for c in self.changes)

    def touches(self, layer: str | None, tensor: str | None) -> bool:
        """Does a planned change act on this layer's tensor (or on its marker)?"""
        for c in self.changes:
            if c.layer is not None and c.layer == layer and (c.tensor is None or tensor is None or c.tensor == tensor):
                return True
        return False

    def to_dict(self) -> dict:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "refused": [{"layer": layer, "why": why} for layer, why in self.refused],
            "assumed": [a.to_dict() for a in self.assumptions],
            "measured": [m.to_dict() for m in self.measured],
        }

    @property
    def repaired_layers(self) -> list[str]:
        """Layers whose marker or tensors a planned change writes anew, in plan order."""
        return list(dict.fromkeys(c.layer for c in self.changes if c.layer is not None))


class Options:
    """What the planner decides with: a part of a run's ``RewriteOptions`` (``options.planner``)."""

    __slots__ = ("target", "prefer", "convrot_groupsize", "allow_lossy", "to")

    def __init__(
        self,
        target: Targets = "all",
        prefer: str | None = None,
        convrot_groupsize: int | None = None,
        allow_lossy: bool = False,
        to: str | None = None,
    ) -> None:
        self.target = target
        self.prefer = prefer
        self.convrot_groupsize = convrot_groupsize
        self.allow_lossy = allow_lossy
        self.to = to
        """``migrate --to``: the dialect to translate Comfy layers into (None: into Comfy)."""
