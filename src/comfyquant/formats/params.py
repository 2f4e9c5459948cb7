"""What ``quantize``/``convert`` write for a format: the shared half of every format's ``Params``.

Each format package that ``quantize`` writes has a ``params`` module with a frozen dataclass
derived from ``Params``: its fields are the parameters with their profile defaults
(stated there once), and it adds only what is particular to the format (the combinations
comfy-kitchen refuses, the encoder's own argument names, the slots a parameter stores in
another dtype).  Everything else is read from the format's description: which parameters are
marker keys, their allowed values and whether they must be written explicitly.

These modules are imported on first use (``Format.params_class``), never by ``check`` or
``inspect``: ``import dataclasses`` alone costs about 7 ms of start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..errors import InputError

KINDS = {"bool": bool, "int": int, "str": str}
"""Field annotations (strings under postponed evaluation) -> the Python type a value must have."""


CONVROT_SIZE_FLAG = (
    "--convrot-groupsize",
    "convrot_groupsize",
    {"type": int, "metavar": "C", "help": "ConvRot block size (default {default}; SGLang: 16, 64 or 256)"},
)
FULL_PRECISION_FLAG = (
    "--full-precision-matmul",
    "full_precision_matrix_mult",
    {"action": "store_const", "const": True, "help": "marker flag: runtimes dequantize and run a float matmul"},
)


@dataclass(frozen=True, slots=True)
class Params:
    """Validated parameters of one format; frozen, so a choice can be shared and hashed.

    Field metadata: ``choices`` (allowed values of an encode-only knob), ``help`` (its text).
    ``FORMAT`` is the format's name, ``LABELS`` the short labels ``describe`` gives
    parameters it always shows when they are in the marker (``G=16``).  Where quantize lists
    the format among the others is the writing order of ``comfyquant.formats.ordering``."""

    full_precision_matrix_mult: bool = False

    FORMAT: ClassVar[str] = ""
    LABELS: ClassVar[dict[str, str]] = {}
    FLAGS: ClassVar[tuple[tuple[str, str, dict], ...]] = (FULL_PRECISION_FLAG,)
    """The command-line flags of ``quantize``/``convert`` that set this format's parameters:
    ``(flag, parameter, argparse keywords)``; a ``{default}`` in the help is the field's default.
    Formats that share a parameter share its flag (the command lists each flag once)."""

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        """Parameter names: the format's own first, then the ones every format has."""
        shared = {f.name for f in fields(Params)}
        own = [f.name for f in fields(cls)]
        return [n for n in own if n not in shared] + [n for n in own if n in shared]

    @classmethod
    def validate(cls, given: dict[str, Any], where: str = "--format") -> Params:
        """``given`` checked one by one (the description's allowed values for marker keys, the
        field's choices for encode-only knobs), then as a combination; the rest defaults.
        Every refusal is one line naming ``where`` and the allowed values."""
        from .registry import FORMATS

        fmt = FORMATS[cls.FORMAT]
        specs = {f.name: f for f in fields(cls)}
        for name, value in given.items():
            spec = specs.get(name)
            if spec is None:
                allowed = ", ".join(cls.names()) or "none"
                raise InputError(f"{where}: {cls.FORMAT} has no parameter {name!r}; its parameters: {allowed}")
            _coerce(fmt, spec, value, where, cls.FORMAT)
        params = cls(**given)
        params.check(given, where)
        return params

    def check(self, given: dict[str, Any], where: str) -> None:
        """Refuse combinations the format's quantizer does not write (``given``: what the user
        set, so an explicit contradiction can be told from a default)."""

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        if name not in self.names():
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self.names() else default

    def as_dict(self) -> dict[str, Any]:
        """Every parameter (report JSON, plans)."""
        return {n: getattr(self, n) for n in self.names()}

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in fields(self)}

    # -- what is written -------------------------------------------------------------------
    def marker(self) -> dict[str, Any]:
        """The marker to write: ``format``, then every marker key the description says must be
        explicit or whose value differs from its default, in the description's key order."""
        from .registry import FORMATS

        values = self.as_dict()
        marker: dict[str, Any] = {"format": self.FORMAT}
        for key in FORMATS[self.FORMAT].keys:
            if key.name == "format" or key.name not in values:
                continue
            if key.must_be_explicit(values) or values[key.name] != key.default:
                marker[key.name] = values[key.name]
        return marker

    def encode_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the format codec's ``encode`` for these parameters."""
        return {k: v for k, v in self.as_dict().items() if v is not None}

    def stored_dtypes(self) -> dict[str, str]:
        """Suffix -> dtype of slots these parameters store in one of their alternative dtypes
        (the description's ``also_dtypes``); empty when every slot has its own dtype."""
        return {}

    def layout(self) -> dict[str, Any]:
        """Geometry names the planned tensors depend on before any exist (bit depth, which
        optional slots are produced: ``has_codebook``, ``has_correction`` ...)."""
        return {}

    def describe(self) -> str:
        """Short text of the format and its parameters, e.g. ``asym_w4a8_int8 G=16 C=256``: the
        labelled parameters the marker holds, then every other one that is not the default."""
        marker = self.marker()
        defaults = self.defaults()
        parts = [self.FORMAT]
        parts += [f"{label}={marker[name]}" for name, label in self.LABELS.items() if name in marker]
        for name in self.names():
            value = getattr(self, name)
            if name not in self.LABELS and value != defaults[name]:
                parts.append(f"{name}={str(value).lower() if isinstance(value, bool) else value}")
        return " ".join(parts)


def _coerce(fmt, spec, value: Any, where: str, name: str) -> None:
    kind = spec.type if isinstance(spec.type, type) else KINDS[spec.type]
    choices = spec.metadata.get("choices", ())
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if ok and choices and value not in choices:
        ok = False
    key = fmt.key(spec.name)
    if ok and key is not None and not key.valid(value):
        ok = False
    if not ok:
        if key is not None and key.allowed_text:
            allowed = key.allowed_text
        elif choices:
            allowed = " or ".join(str(c) for c in choices)
        else:
            allowed = "true or false" if kind is bool else f"a {kind.__name__}"
        raise InputError(f"{where}: {name} {spec.name}={value!r} is not allowed: {allowed}")


def collect(*classes: type[Params]) -> dict[str, type[Params]]:
    """A package's ``PARAMS``: format name -> Params class."""
    return {c.FORMAT: c for c in classes}
