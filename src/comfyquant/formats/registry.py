"""Name -> Format for every format package, and the inference of a format for unmarked layers.

Each subpackage of ``formats/`` describes its formats in a ``FORMATS`` tuple; this module
finds the subpackages on disk, so adding a format means adding a package and nothing else.
Listing order is each format's ``order``; inference tries ``infer_rank`` ascending.  The
short names of the writing commands (``w4a8``) are each description's ``aliases``.
"""

from __future__ import annotations

from ..discovery import subpackages
from .base import Format


def _discover() -> dict[str, Format]:
    found: list[Format] = []
    for module in subpackages(__package__, __file__):
        found.extend(getattr(module, "FORMATS", ()))
    found.sort(key=lambda f: (f.order, f.name))
    out: dict[str, Format] = {}
    for f in found:
        if f.name in out:
            raise RuntimeError(f"format {f.name!r} is described twice ({out[f.name]!r} and {f!r})")
        out[f.name] = f
    return out


FORMATS: dict[str, Format] = _discover()


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
