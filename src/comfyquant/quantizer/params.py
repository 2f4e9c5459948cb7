"""Format names and the parameters ``quantize``/``convert`` accept for each format.

What a parameter *means* on disk (marker keys, their allowed values and which must be written
explicitly) comes from the format descriptions (:mod:`comfyquant.formats`); this module only
adds the user-facing layer: short names (``w4a8``), the encode-only knobs of each codec
(``bits``, ``symmetric`` ...), the defaults of the "writes with comfy-kitchen, loads in every
runtime" profile (spec section 5: INT8 always ConvRot), and the one-line refusals that list
the allowed values.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..formats import registry
from ..formats.base import Format

ALIASES: dict[str, str] = {
    "w4a8": "asym_w4a8_int8",
    "w4a4": "convrot_w4a4",
    "int8": "int8_tensorwise",
    "fp8": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
}
"""Short names accepted wherever a format name is (CLI and rules files)."""

KEEP = "keep"
"""The pseudo-format of rules that keep layers as they are (dense for quantize)."""


class Param:
    """One parameter: Python type, profile default (None: the codec's), allowed values text."""

    __slots__ = ("name", "kind", "default", "choices", "help")

    def __init__(self, name: str, kind: type, default: Any = None, choices: tuple = (), help: str = "") -> None:
        self.name = name
        self.kind = kind
        self.default = default
        self.choices = choices
        self.help = help


_FULL = Param("full_precision_matrix_mult", bool, False, help="marker flag: runtimes dequantize and use a float matmul")
_CONVROT_SIZE = Param("convrot_groupsize", int, 256, help="ConvRot block size (16, 64 or 256 for SGLang)")

PARAMS: dict[str, tuple[Param, ...]] = {
    "asym_w4a8_int8": (
        Param("group_size", int, 16),
        _CONVROT_SIZE,
        Param("bits", int, 4, (4, 6), "4, or 6 (W6A8: ComfyUI and comfy-kitchen only)"),
        Param("symmetric", bool, True, help="false: asymmetric with an F32 correction (ComfyUI drops it)"),
        Param("codebook", bool, True, help="4-bit symmetric: code -> level table (false: uniform levels)"),
        Param("scale_dtype", str, "fp8", ("fp8", "f32"), "group scales: fp8 (every runtime) or f32 (not SGLang)"),
        Param("convrot", bool, True, (True,), "always true: W4A8 always rotates (SGLang requires the key)"),
        _FULL,
    ),
    "int8_tensorwise": (
        Param("convrot", bool, True, help="ConvRot rotation (SGLang needs it on linear layers)"),
        _CONVROT_SIZE,
        Param("per_channel", bool, True, help="row-wise [N, 1] scales (false: one scalar scale)"),
        _FULL,
    ),
    "convrot_w4a4": (_CONVROT_SIZE, Param("linear_dtype", str, "int4", ("int4", "int8")), _FULL),
    "nvfp4": (_FULL,),
    "mxfp8": (_FULL,),
    "float8_e4m3fn": (_FULL,),
    "float8_e5m2": (_FULL,),
}
"""Parameters per format that ``quantize`` can write, in marker order."""

_SCALE_DTYPES = {"fp8": "float8_e4m3fn", "f32": "float32"}

DTYPE_CHOICES: dict[tuple[str, str, Any], dict[str, str]] = {
    ("asym_w4a8_int8", "scale_dtype", "f32"): {"weight_s_rel": "F32"},
}
"""Parameters that store a slot in one of its alternative dtypes (the description's
``also_dtypes``): (format, parameter, value) -> {suffix: dtype}."""


def dtype_choices(fmt_name: str, params: dict) -> dict[str, str]:
    """Suffix -> stored dtype for slots whose dtype these parameters change."""
    out: dict[str, str] = {}
    for (name, param, value), slots in DTYPE_CHOICES.items():
        if name == fmt_name and params.get(param) == value:
            out.update(slots)
    return out


def format_names() -> str:
    """``asym_w4a8_int8 (w4a8), ...`` for messages."""
    short = {v: k for k, v in reversed(ALIASES.items())}
    return ", ".join(f"{n} ({short[n]})" if n in short else n for n in PARAMS)


def resolve_format(name: str, where: str = "--format", allow_keep: bool = False) -> str:
    """The canonical name of a format the quantizer can write, or ``keep``; refuses others."""
    if not isinstance(name, str):
        raise InputError(f"{where}: format must be a string, got {name!r}")
    key = name.strip().lower()
    if allow_keep and key in (KEEP, "dense"):
        return KEEP
    key = ALIASES.get(key, key)
    if key in PARAMS:
        return key
    fmt = registry.get(key)
    if fmt is not None and fmt.converter_only:
        why = "a converter-only format no runtime loads"
    elif fmt is not None:
        why = "not written by quantize (offline calibration only, no quantizer in comfy-kitchen)"
    else:
        why = "an unknown format"
    extra = f", or {KEEP}" if allow_keep else ""
    raise InputError(f"{where}: {name!r} is {why}; choose from {format_names()}{extra}")


def validate(fmt_name: str, given: dict[str, Any], where: str = "--format") -> dict[str, Any]:
    """Check ``given`` against the format; returns every parameter with its profile default.

    Marker keys are checked with the format description's allowed values; encode-only knobs
    with their choices.  Unknown or forbidden parameters are refused with the allowed list."""
    specs = {p.name: p for p in PARAMS[fmt_name]}
    fmt = registry.FORMATS[fmt_name]
    out: dict[str, Any] = {}
    for name, value in given.items():
        spec = specs.get(name)
        if spec is None:
            allowed = ", ".join(specs) or "none"
            raise InputError(f"{where}: {fmt_name} has no parameter {name!r}; its parameters: {allowed}")
        out[name] = _coerce(fmt, spec, value, where, fmt_name)
    for spec in specs.values():
        out.setdefault(spec.name, spec.default)
    _combination(fmt_name, out, given, where)
    return out


def _coerce(fmt: Format, spec: Param, value: Any, where: str, fmt_name: str) -> Any:
    ok = isinstance(value, spec.kind) and not (spec.kind is int and isinstance(value, bool))
    if ok and spec.choices and value not in spec.choices:
        ok = False
    key = fmt.key(spec.name)
    if ok and key is not None and not key.valid(value):
        ok = False
    if not ok:
        if key is not None and key.allowed_text:
            allowed = key.allowed_text
        elif spec.choices:
            allowed = " or ".join(str(c) for c in spec.choices)
        else:
            allowed = "true or false" if spec.kind is bool else f"a {spec.kind.__name__}"
        raise InputError(f"{where}: {fmt_name} {spec.name}={value!r} is not allowed: {allowed}")
    return value


def _combination(fmt_name: str, p: dict, given: dict, where: str) -> None:
    """Parameter combinations the quantizer refuses before any work (comfy-kitchen's rules)."""
    if fmt_name == "asym_w4a8_int8" and p["bits"] == 6:
        if not p["symmetric"]:
            raise InputError(f"{where}: asym_w4a8_int8 bits=6 is symmetric only (drop symmetric=false)")
        if given.get("codebook") is True:
            raise InputError(f"{where}: asym_w4a8_int8 bits=6 is uniform: no codebook (drop codebook=true)")
        if p["group_size"] % 16:
            raise InputError(f"{where}: asym_w4a8_int8 bits=6 needs group_size a multiple of 16, got {p['group_size']}")
    if fmt_name == "asym_w4a8_int8" and not p["symmetric"] and given.get("codebook") is True:
        raise InputError(f"{where}: asym_w4a8_int8 symmetric=false has no codebook (drop codebook=true)")
    if fmt_name == "int8_tensorwise" and p["convrot"] and not p["per_channel"]:
        raise InputError(f"{where}: int8_tensorwise convrot=true needs per_channel=true (ConvRot scales are row-wise)")


def encode_params(fmt_name: str, params: dict) -> dict:
    """The keyword arguments of ``codecs.get(fmt).encode`` for validated ``params``."""
    p = dict(params)
    if fmt_name == "asym_w4a8_int8":
        p.pop("convrot")  # a marker flag only: the codec always rotates
        p["scale_dtype"] = _SCALE_DTYPES[p["scale_dtype"]]
        if p["bits"] == 6 or not p["symmetric"]:
            p["codebook"] = False
    if fmt_name == "int8_tensorwise" and not p["convrot"]:
        p.pop("convrot_groupsize")
    return {k: v for k, v in p.items() if v is not None}


def marker_for(fmt_name: str, params: dict) -> dict:
    """The marker to write: ``format``, then every marker key the format description says
    must be explicit or whose value differs from its default, in the description's order."""
    fmt = registry.FORMATS[fmt_name]
    marker: dict[str, Any] = {"format": fmt_name}
    for key in fmt.keys:
        if key.name == "format" or key.name not in params:
            continue
        value = params[key.name]
        if key.name == "convrot_groupsize" and fmt_name == "int8_tensorwise" and not params.get("convrot"):
            continue
        if key.must_be_explicit(params) or value != key.default:
            marker[key.name] = value
    return marker


def describe(fmt_name: str, params: dict) -> str:
    """Short text of a format and its non-default parameters, e.g. ``asym_w4a8_int8 G=16 C=256``."""
    bits = []
    if "group_size" in params:
        bits.append(f"G={params['group_size']}")
    if fmt_name != "int8_tensorwise" or params.get("convrot"):
        if "convrot_groupsize" in params:
            bits.append(f"C={params['convrot_groupsize']}")
    defaults = {p.name: p.default for p in PARAMS[fmt_name]}
    for name in ("bits", "symmetric", "codebook", "scale_dtype", "linear_dtype", "per_channel", "convrot",
                 "full_precision_matrix_mult"):
        if name in params and params[name] != defaults.get(name):
            value = params[name]
            bits.append(f"{name}={str(value).lower() if isinstance(value, bool) else value}")
    return " ".join([fmt_name, *bits])
