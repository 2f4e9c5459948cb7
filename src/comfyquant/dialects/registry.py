"""Every dialect package, and the detection that asks each of them which layers are its own.

Each subpackage of ``dialects/`` lists its dialects in a ``DIALECTS`` tuple; this module finds
them on disk.  ``detect`` runs them in ``order`` over the header view of a checkpoint
(first claim of a layer wins) and keeps the result on the checkpoint, so ``check``,
``inspect`` and the writers ask once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..discovery import subpackages
from ..dtypes import QUANTIZED_WEIGHT_DTYPES
from .base import Claim, Container, Dialect, Translation

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

COMFY = "comfy"
"""Layers with a comfy_quant marker (the native layout)."""
DENSE = "dense"
"""A file with no quantized layer at all."""


CONTAINERS: list[Container] = []
"""Every file format besides safetensors a dialect reads (a package's ``CONTAINERS``)."""


def _discover() -> dict[str, Dialect]:
    found: list[Dialect] = []
    for module in subpackages(__package__, __file__):
        found.extend(getattr(module, "DIALECTS", ()))
        CONTAINERS.extend(getattr(module, "CONTAINERS", ()))
    found.sort(key=lambda d: (d.order, d.name))
    out: dict[str, Dialect] = {}
    for d in found:
        if d.name in out or d.name in (COMFY, DENSE):
            raise RuntimeError(f"dialect {d.name!r} is described twice")
        out[d.name] = d
    return out


DIALECTS: dict[str, Dialect] = _discover()


class Detection:
    """The dialects of one checkpoint: each dialect's claim, every claimed layer's translation,
    and how many layers are native Comfy (marked) or dense."""

    __slots__ = ("claims", "layers", "marked", "quantized")

    def __init__(self, claims: list[Claim], marked: int, quantized: int) -> None:
        self.claims = claims
        self.layers: dict[str, Translation] = {p: t for c in claims for p, t in c.layers.items()}
        self.marked = marked
        self.quantized = quantized
        """Layers that are quantized in any layout (marked, claimed, or an unmarked quantized weight)."""

    @property
    def names(self) -> list[str]:
        """The dialects present: claimed dialects in detection order, ``comfy`` when some layer
        has a marker, ``dense`` when nothing is quantized."""
        out = [c.dialect for c in self.claims]
        if self.marked:
            out.insert(0, COMFY)
        return out or [DENSE]

    @property
    def name(self) -> str:
        """One word for the file: its dialect, or the dialects joined by ``+``."""
        return "+".join(self.names)

    @property
    def foreign(self) -> bool:
        return bool(self.claims)

    def claim(self, dialect: str) -> Claim | None:
        return next((c for c in self.claims if c.dialect == dialect), None)

    def to_dict(self) -> dict:
        return {
            "dialect": self.name,
            "dialects": self.names,
            "notes": [n for c in self.claims for n in c.notes],
            "unsettled": [u for c in self.claims for u in c.unsettled],
            "layers": {p: t.to_dict() for p, t in self.layers.items()},
        }


def detect(ckpt: Checkpoint) -> Detection:
    """The checkpoint's dialects (header only; computed once per checkpoint)."""
    found = ckpt.detection
    if isinstance(found, Detection):
        return found
    claims: list[Claim] = []
    claimed: set[str] = set()
    for dialect in DIALECTS.values():
        claim = dialect.detect(ckpt, claimed)
        if claim is not None and (claim.layers or claim.drop or claim.notes):
            claims.append(claim)
            claimed.update(claim.layers)
    marked = 0
    quantized = 0
    for prefix, layer in ckpt.layers.items():
        if layer.marker is not None and prefix not in claimed:
            marked += 1
            quantized += 1
        elif prefix in claimed:
            quantized += 1
        else:
            w = layer.tensors.get("weight")
            if w is not None and w.dtype in QUANTIZED_WEIGHT_DTYPES:
                quantized += 1
    found = ckpt.detection = Detection(claims, marked, quantized)
    ckpt.foreign = {p: t.dialect for p, t in found.layers.items()}
    return found
