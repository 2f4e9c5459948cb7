"""The declarative description of a quantization format.

A :class:`Format` lists its tensor slots (suffix, dtype, shape as an expression of the layer
geometry), its marker keys (type, default, allowed values), the constraints its geometry must
meet, and a function that infers that geometry (N, K, bit depth, variant) from the stored
tensors.  The checker, inspector, fixer, quantizer and loader all read these descriptions;
adding a format means adding one module under ``formats/``.

Shape and constraint expressions are small Python expressions over the geometry names
``N`` (out features), ``K`` (in features), ``bits``, the marker parameters (``group_size``,
``convrot_groupsize`` ...) and the helpers ``pad(x, m)`` (round up to a multiple) and
``is_pow4(x)``.  They are compiled once; their text doubles as documentation, e.g. the
expected correction shape is shown as ``(K // group_size, N)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def pad(x: int, m: int) -> int:
    """Round ``x`` up to a multiple of ``m``."""
    return -(-x // m) * m


def is_pow4(x: Any) -> bool:
    """True for 4, 16, 64, 256, ... (the ConvRot sizes comfy-kitchen can build)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 4 and (x & (x - 1)) == 0 and (x.bit_length() - 1) % 2 == 0


_GLOBALS: dict[str, Any] = {"__builtins__": {}, "pad": pad, "is_pow4": is_pow4, "len": len, "int": int}


class Expr:
    """A compiled expression with its source text (``str(expr)`` is the text)."""

    __slots__ = ("text", "code")

    def __init__(self, text: str) -> None:
        self.text = text
        self.code = compile(text, f"<format expr {text!r}>", "eval")

    def __call__(self, env: dict) -> Any:
        return eval(self.code, _GLOBALS, env)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


# Tensor kinds: drive --deep value checks, the inspector's byte accounting and the loader.
WEIGHT = "weight"
SCALE = "scale"
CODEBOOK = "codebook"
CORRECTION = "correction"
AUX = "aux"
BIAS = "bias"


@dataclass(frozen=True)
class Slot:
    """One tensor of a layer: ``<prefix>.<suffix>``."""

    suffix: str
    dtype: str
    shape: str
    kind: str = SCALE
    required: bool = True
    meaning: str = ""
    when: str | None = None
    """Condition on the geometry for this slot description to apply (None = always)."""
    forbidden: str | None = None
    """Condition under which this tensor must not be present at all."""
    also_dtypes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Dtypes some tool writes or accepts instead of ``dtype``: dtype -> (who and why, severity).

    ``dtype`` may be ``"float"``: any dense float dtype (F16, BF16, F32)."""
    alt_shapes: tuple[tuple[str, ...], ...] = ()
    """Known other shapes ``(expression, cause[, severity])`` that identify how a file went wrong."""
    positive: bool = False
    """Values must be finite and > 0 (checked with --deep)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_shape", Expr(self.shape))
        object.__setattr__(self, "_when", Expr(self.when) if self.when else None)
        object.__setattr__(self, "_forbidden", Expr(self.forbidden) if self.forbidden else None)
        object.__setattr__(
            self, "_alts", tuple((Expr(a[0]), a[1], a[2] if len(a) > 2 else "error") for a in self.alt_shapes)
        )

    def applies(self, env: dict) -> bool:
        return self._when is None or bool(self._when(env))

    def is_forbidden(self, env: dict) -> bool:
        return self._forbidden is not None and bool(self._forbidden(env))

    def expected_shape(self, env: dict) -> tuple:
        return tuple(self._shape(env))


@dataclass(frozen=True)
class MarkerKey:
    """A marker key: JSON types, default, allowed values and whether writers must be explicit."""

    name: str
    types: tuple[type, ...]
    default: Any = None
    allowed: str | None = None
    """Expression over ``v`` (the value) that must hold."""
    allowed_text: str = ""
    explicit: str | bool = False
    """Writers must store this key (True, or an expression over the parameters)."""
    why_explicit: str = ""
    nested_ok: bool = False
    """ComfyUI also reads this key from a nested ``params`` object."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allowed", Expr(self.allowed) if self.allowed else None)
        object.__setattr__(self, "_explicit", Expr(self.explicit) if isinstance(self.explicit, str) else None)

    def valid(self, value: Any) -> bool:
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            return False
        return self._allowed is None or bool(self._allowed({"v": value}))

    def must_be_explicit(self, params: dict) -> bool:
        if self._explicit is not None:
            return bool(self._explicit(params))
        return bool(self.explicit)


@dataclass(frozen=True)
class Constraint:
    """A property of the geometry that must hold, e.g. ``K % convrot_groupsize == 0``."""

    expr: str
    message: str
    """Formatted with the geometry, e.g. ``"K={K} is not divisible by ..."``."""
    cause: str = ""
    fix: str = ""
    who: str = "comfy-kitchen"
    """Which tool enforces it (for the message)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_expr", Expr(self.expr))

    def holds(self, env: dict) -> bool:
        try:
            return bool(self._expr(env))
        except (ZeroDivisionError, TypeError, KeyError, NameError):
            return False


class GeometryError(Exception):
    """The tensors do not determine N and K; the message says why."""


@dataclass(frozen=True)
class Format:
    """One quantization format, described once for every command."""

    name: str
    title: str
    slots: tuple[Slot, ...]
    keys: tuple[MarkerKey, ...]
    geometry: Callable[[dict, dict], dict]
    """(tensors by suffix, resolved params) -> env with N, K, bits, variant ...; may raise GeometryError."""
    constraints: tuple[Constraint, ...] = ()
    bits_text: str = ""
    rotation: str = "none"
    """"none", "always", or "convrot key"."""
    loaders: frozenset[str] = frozenset()
    """Runtimes that load this format: subset of {"comfyui", "sglang", "comfy-kitchen"}."""
    converter_only: bool = False
    recognize: Callable[[dict], bool] | None = None
    """For unmarked layers: do these tensors (by suffix) look like this format? (spec 6.6)"""
    aliases: tuple[str, ...] = ()
    notes: str = ""

    @property
    def suffixes(self) -> frozenset[str]:
        return frozenset(s.suffix for s in self.slots)

    def key(self, name: str) -> MarkerKey | None:
        for k in self.keys:
            if k.name == name:
                return k
        return None

    def params(self, marker: dict) -> dict:
        """Marker parameters with defaults; a nested ``params`` object is a fallback (ComfyUI)."""
        nested = marker.get("params") if isinstance(marker.get("params"), dict) else {}
        out = {}
        for k in self.keys:
            if k.name in marker:
                out[k.name] = marker[k.name]
            elif k.nested_ok and k.name in nested:
                out[k.name] = nested[k.name]
            else:
                out[k.name] = k.default
        return out

    def slots_for(self, env: dict) -> dict[str, Slot]:
        """The slot description that applies to each suffix for this geometry."""
        out: dict[str, Slot] = {}
        for s in self.slots:
            if s.suffix not in out and s.applies(env):
                out[s.suffix] = s
        return out
