"""Explain a slot mismatch: transposed, downcast, another group size, another layout ...

Given the slot description, the layer geometry and what was found, return the most likely
cause as a ``Cause``: its *kind* (what the fix step and any other reader branch on), the
words a finding shows, the severity and the fix step.  The candidates come from the description
itself (alternative shapes and dtypes, the parameters its shape expression uses), not from
per-format code.
"""

from __future__ import annotations

from ..dtypes import MODEL_FLOAT_DTYPES
from ..shapes import fmt_shape
from .base import Slot

GROUP_CANDIDATES = (4, 8, 16, 32, 48, 64, 96, 128, 256, 512)
FLOATS = MODEL_FLOAT_DTYPES
RELABELS = {("F8_E4M3", "U8"), ("F8_E8M0", "U8"), ("I8", "U8")}
"""(slot dtype, stored dtype) pairs whose bytes are the slot's own under another label."""

# Kinds of shape causes.
TRANSPOSED = "transposed"
"""The expected 2-D shape with its axes swapped: a transpose repairs it."""
OTHER_LAYOUT = "other-layout"
"""One of the slot's known other shapes (``Slot.alt_shapes``: another scale layout ...)."""
OTHER_GROUP_SIZE = "other-group-size"
"""The shape the slot has for another group size than the marker's: made for that size."""
OTHER_SHAPE = "other-shape"
"""A shape nothing explains."""
# Kinds of dtype causes.
DOWNCAST = "downcast"
"""An F32 slot stored in BF16/F16: upcasting back is exact."""
RELABELLED = "relabelled"
"""The slot's bytes under another one-byte label (U8 for FP8, E8M0 or I8)."""
OTHER_DTYPE = "other-dtype"
"""Any other dtype (one a tool is known to write, ``Slot.also_dtypes``, or not)."""

REEXPORT = frozenset({OTHER_GROUP_SIZE, OTHER_SHAPE})
"""Kinds no edit of the stored tensor repairs: the layer must be made again."""
REEXPORT_FIX = "re-export from the original weights with one consistent group size (comfyquant quantize)"


class Cause:
    """Why one tensor is not what its slot says.

    ``kind`` is one of the kinds above; ``text`` the words a finding shows; ``severity`` how
    much it matters ("error", "warning", "info"); ``step`` the edit that repairs it (e.g.
    ``transpose to (K // group_size, N)``), empty for a kind in ``REEXPORT``."""

    __slots__ = ("kind", "text", "severity", "step")

    def __init__(self, kind: str, text: str, severity: str = "error", step: str = "") -> None:
        self.kind = kind
        self.text = text
        self.severity = severity
        self.step = step

    def __repr__(self) -> str:
        return f"Cause({self.kind!r}, {self.text!r}, {self.severity!r})"


def dtype_matches(slot: Slot, dtype: str) -> bool:
    return slot.accepts(dtype)


def dtype_cause(slot: Slot, actual: str) -> Cause:
    """The cause of a dtype that is not the slot's dtype."""
    downcast = slot.dtype == "F32" and actual in ("BF16", "F16")
    if downcast:
        kind, step = DOWNCAST, "upcast to F32 (exact)"
    elif (slot.dtype, actual) in RELABELS:
        kind, step = RELABELLED, f"relabel as {slot.dtype} (same bytes)"
    else:
        kind, step = OTHER_DTYPE, f"convert to {slot.dtype}"
    known = slot.also_dtypes.get(actual)
    if known is not None:
        note, severity = known
        if downcast:
            note = f"{actual}, needs F32 (downcast; upcasting back is exact): {note}"
        return Cause(kind, note, severity, step)
    if downcast:
        text = f"{actual}, needs F32 (downcast; upcasting back is exact)"
    elif kind == RELABELLED:
        text = (
            "packed bytes labelled U8 instead of I8 (same bytes: relabel)"
            if slot.dtype == "I8"
            else f"{slot.dtype} bytes labelled U8 (same bytes: relabel)"
        )
    else:
        text = f"stored as {actual}, the format needs {slot.dtype}"
    return Cause(kind, text, "error", step)


def shape_cause(slot: Slot, env: dict, actual: tuple, expected: tuple) -> Cause:
    """The cause of a shape that is not the slot's expected shape."""
    want = fmt_shape(expected, as_tuple=True)
    if len(actual) == 2 and len(expected) == 2 and actual == expected[::-1] and expected[0] != expected[1]:
        return Cause(
            TRANSPOSED,
            f"stored transposed: {fmt_shape(actual, as_tuple=True)} instead of {want}",
            "error",
            f"transpose to {want}",
        )
    for alt, cause, severity in slot.other_shapes(env):
        if alt == actual and alt != expected:
            return Cause(OTHER_LAYOUT, cause, severity, f"convert to {want}")
    for key in ("group_size",):
        if key in slot.shape and key in env:
            for g in GROUP_CANDIDATES:
                if g == env[key]:
                    continue
                try:
                    alt = slot.expected_shape(dict(env, **{key: g}))
                except Exception:
                    continue
                if alt == actual:
                    return Cause(OTHER_GROUP_SIZE, f"made for {key}={g} (the marker says {env[key]})")
                if len(alt) == 2 and alt[::-1] == actual:
                    return Cause(OTHER_GROUP_SIZE, f"made for {key}={g} (the marker says {env[key]}) and stored transposed")
    return Cause(OTHER_SHAPE, f"shape {fmt_shape(actual, as_tuple=True)} instead of {want}")


def fix_text(causes: list[Cause]) -> str:
    """The fix a finding shows for these causes (shape first, then dtype)."""
    if any(c.kind in REEXPORT for c in causes):
        return REEXPORT_FIX
    return " and ".join(c.step for c in causes) + ": comfyquant fix"
