"""Explain a slot mismatch: transposed, downcast, another group size, another layout ...

Given the slot description, the layer geometry and what was found, return the most likely
cause in words.  The candidates come from the description itself (alternative shapes and
dtypes, the parameters its shape expression uses), not from per-format code.
"""

from __future__ import annotations

from .base import Slot

GROUP_CANDIDATES = (4, 8, 16, 32, 48, 64, 96, 128, 256, 512)
FLOATS = ("F32", "BF16", "F16")


def fmt_shape(shape: tuple) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def dtype_matches(slot: Slot, dtype: str) -> bool:
    return dtype in FLOATS if slot.dtype == "float" else dtype == slot.dtype


def dtype_cause(slot: Slot, actual: str) -> tuple[str, str]:
    """(cause, severity) of a dtype that is not the slot's dtype."""
    if actual in slot.also_dtypes:
        note, severity = slot.also_dtypes[actual]
        if slot.dtype == "F32" and actual in ("BF16", "F16"):
            note = f"{actual}, needs F32 (downcast; upcasting back is exact): {note}"
        return note, severity
    if slot.dtype == "F32" and actual in ("BF16", "F16"):
        return f"{actual}, needs F32 (downcast; upcasting back is exact)", "error"
    if slot.dtype in ("F8_E4M3", "F8_E8M0") and actual == "U8":
        return f"{slot.dtype} bytes labelled U8 (same bytes: relabel)", "error"
    if slot.dtype == "I8" and actual == "U8":
        return "packed bytes labelled U8 instead of I8 (same bytes: relabel)", "error"
    return f"stored as {actual}, the format needs {slot.dtype}", "error"


def shape_cause(slot: Slot, env: dict, actual: tuple, expected: tuple) -> tuple[str, str]:
    """(cause, severity) of a shape that is not the slot's expected shape."""
    if len(actual) == 2 and len(expected) == 2 and actual == expected[::-1] and expected[0] != expected[1]:
        inner = slot.shape.strip("()")
        parts = [p.strip() for p in inner.split(",")]
        rev = f"({parts[1]}, {parts[0]})" if len(parts) == 2 else "reversed"
        return f"stored transposed: {rev} instead of {slot.shape}", "error"
    for expr, cause, severity in slot._alts:
        try:
            alt = tuple(expr(env))
        except Exception:
            continue
        if alt == actual and alt != expected:
            return cause, severity
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
                    return f"made for {key}={g} (the marker says {env[key]})", "error"
                if len(alt) == 2 and alt[::-1] == actual:
                    return f"made for {key}={g} (the marker says {env[key]}) and stored transposed", "error"
    return f"shape {fmt_shape(actual)} does not match {slot.shape} = {fmt_shape(expected)}", "error"
