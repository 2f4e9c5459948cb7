"""Name -> Format for every format package, and the inference of a format for unmarked layers.

Each subpackage of ``formats/`` describes its formats in a ``FORMATS`` tuple; this module
finds the subpackages on disk, so a new format package registers with no other edit.  Where
the formats stand against each other (listing, inference, what ``quantize`` offers first) is
the one table in ``formats/ordering.py``: this module writes each format's ``order`` and
``infer_rank`` from it.  Listing order is each format's ``order``; inference tries
``infer_rank`` ascending.  The short names of the writing commands (``w4a8``) are each
description's ``aliases``.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..discovery import subpackages
from .base import UNPLACED, Format
from .ordering import Orders, orders


def _place(found: list[Format], table: Orders) -> None:
    """Each format's ``order`` and ``infer_rank`` from its positions in the table.  A format
    the table places must not declare its own numbers (one home for the order), each sequence
    names a described format at most once, an inferred format has a ``recognize`` and a
    writing one a ``Params``; any of these mistakes stops the import."""
    described = set(found)  # a Format compares by identity
    for column in Orders.__slots__:
        sequence = getattr(table, column)
        if len(set(sequence)) != len(sequence):
            raise RuntimeError(f"formats/ordering.py: the {column} order names a format twice")
        stray = [f for f in sequence if f not in described]
        if stray:
            raise RuntimeError(f"formats/ordering.py: the {column} order names {stray!r}, which no package describes")
    for position, fmt in enumerate(table.listing):
        if fmt.order != UNPLACED:
            raise RuntimeError(f"{fmt!r} declares order={fmt.order}; its place is in formats/ordering.py")
        fmt.order = position
    for position, fmt in enumerate(table.inference):
        if fmt.infer_rank is not None:
            raise RuntimeError(f"{fmt!r} declares infer_rank={fmt.infer_rank}; its place is in formats/ordering.py")
        if fmt.recognize is None:
            raise RuntimeError(f"formats/ordering.py: {fmt!r} is in the inference order but has no recognize")
        fmt.infer_rank = position
    for fmt in table.writing:
        if not fmt.writable:
            raise RuntimeError(f"formats/ordering.py: {fmt!r} is in the writing order but quantize does not write it")


def _discover() -> tuple[dict[str, Format], Orders]:
    packages = subpackages(__package__, __file__)
    found: list[Format] = [f for module in packages for f in getattr(module, "FORMATS", ())]
    table = orders(SimpleNamespace(**{module.__name__.rpartition(".")[2]: module for module in packages}))
    _place(found, table)
    found.sort(key=lambda f: (f.order, f.name))
    out: dict[str, Format] = {}
    for f in found:
        if f.name in out:
            raise RuntimeError(f"format {f.name!r} is described twice ({out[f.name]!r} and {f!r})")
        out[f.name] = f
    return out, table


FORMATS: dict[str, Format]
_TABLE: Orders
FORMATS, _TABLE = _discover()


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for f in FORMATS.values():
        for alias in f.aliases:
            if alias in out or alias in FORMATS:
                raise RuntimeError(f"alias {alias!r} of {f!r} is already a name of {out.get(alias, alias)!r}")
            out[alias] = f.name
    return out


ALIASES: dict[str, str] = _aliases()
"""Short name -> format name, from every description's ``aliases``."""

_INFERENCE_ORDER: tuple[Format, ...] = tuple(
    sorted((f for f in FORMATS.values() if f.infer_rank is not None and f.recognize is not None), key=lambda f: f.infer_rank or 0)
)
"""The more specific tensor signatures are tried first."""

WRITING_ORDER: tuple[Format, ...] = _TABLE.writing + tuple(f for f in FORMATS.values() if f.writable and f not in _TABLE.writing)
"""The formats ``quantize`` writes, in the order it offers them (the recommended first): the
table's writing order, then any other writable format in listing order."""

LAYER_SUFFIXES: frozenset[str] = frozenset(
    {s.suffix for f in FORMATS.values() for s in f.slots}
    | {old for f in FORMATS.values() for old in f.legacy_renames}
    | {"comfy_quant"}
)
"""Every tensor suffix that belongs to a layer (which grouping tensors into layers reads): each
format's slots, the legacy names its ``legacy_renames`` replaces (scaled FP8, as ComfyUI 0.33.0
``convert_old_quants`` renames them) and the marker tensor."""


def get(name: str) -> Format | None:
    return FORMATS.get(name)


def lookup(name: str) -> Format | None:
    """The format a name or short name (``w4a8``) stands for, or None."""
    return FORMATS.get(ALIASES.get(name, name))


def infer_format(tensors: dict) -> Format | None:
    """The format an unmarked layer's tensors look like, or None.  ConvRot sizes are not recoverable."""
    for fmt in _INFERENCE_ORDER:
        if fmt.recognize is not None and fmt.recognize(tensors):
            return fmt
    return None
