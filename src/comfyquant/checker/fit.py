"""Which side of a header/tensor marker conflict the layer's tensors fit.

The header map and a tensor marker may disagree on a key (M020): SGLang refuses the file,
ComfyUI lets the header win.  The tensors were written with one set of parameters; when
exactly one side's marker makes them fit the format description (it leaves no shape, dtype,
geometry or key error that the other side's marker does not also leave, and the other side
leaves more), that side is the one they were written with.  ``check`` names it in its
findings and ``fix`` takes it without ``--prefer``.  When both sides fit equally (a key the
shapes cannot confirm, such as a ConvRot size) or neither does, nothing is decided.
"""

from __future__ import annotations

from ..formats.registry import FORMATS
from ..formats.validation import check_layer
from ..markers import HEADER, TENSOR, same_marker

SIDE_TEXT = {HEADER: "the header map", TENSOR: "the tensor marker"}


def side_markers(sources) -> dict[str, dict] | None:
    """The layer's marker as each side reads it (that side's values first, the other's keys
    added), or None when the layer does not have readable markers of both kinds."""
    headers = [r.obj for r in sources if r.kind == HEADER and r.error is None]
    tensors = [r.obj for r in sources if r.kind == TENSOR and r.error is None]
    if not headers or not tensors:
        return None
    out = {}
    for kind, first, second in ((HEADER, headers, tensors), (TENSOR, tensors, headers)):
        merged: dict = {}
        for obj in first + second:
            for key, value in obj.items():
                merged.setdefault(key, value)
        out[kind] = merged
    return out


def layer_errors(marker: dict, tensors: dict) -> frozenset | None:
    """(code, tensor) of every error the layer check finds under ``marker``; None when the
    marker names no known format (nothing fits it)."""
    name = marker.get("format")
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        return None
    findings, _env = check_layer(fmt, marker, tensors)
    return frozenset((f.code, f.tensor) for f in findings if f.severity == "error")


def fitting_side(sources, tensors: dict) -> tuple[str, dict, dict] | None:
    """(side, its marker, the other side's marker) when exactly one side's marker fits the
    tensors; None when the sides agree, both fit, or neither does."""
    sides = side_markers(sources)
    if sides is None or same_marker(sides[HEADER], sides[TENSOR]):
        return None
    errors = {kind: layer_errors(marker, tensors) for kind, marker in sides.items()}
    h, t = errors[HEADER], errors[TENSOR]
    if h is None and t is None:
        return None
    if h is None or t is None:
        side = TENSOR if h is None else HEADER
        if errors[side]:
            return None  # the known format does not fit either
    elif h < t:
        side = HEADER
    elif t < h:
        side = TENSOR
    else:
        return None
    other = TENSOR if side == HEADER else HEADER
    return side, sides[side], sides[other]


def differing_keys(a: dict, b: dict) -> list[str]:
    return [k for k in a if k in b and (type(a[k]) is not type(b[k]) or a[k] != b[k])]


def explain(side: str, chosen: dict, other: dict, took: bool = False) -> str:
    """``the tensors fit group_size=16 from the tensor marker; the header map's 32 does not``
    (``took``: ``took group_size=16 from the tensor marker: the tensors fit it; ...``)."""
    keys = differing_keys(chosen, other)
    other_side = TENSOR if side == HEADER else HEADER
    ours = ", ".join(f"{k}={chosen[k]!r}" for k in keys)
    theirs = ", ".join(repr(other[k]) for k in keys)
    rest = f"{SIDE_TEXT[other_side]}'s {theirs} {'does' if len(keys) == 1 else 'do'} not"
    if took:
        return f"took {ours} from {SIDE_TEXT[side]}: the tensors fit it; {rest}"
    return f"the tensors fit {ours} from {SIDE_TEXT[side]}; {rest}"
