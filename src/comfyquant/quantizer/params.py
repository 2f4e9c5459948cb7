"""Format names as ``quantize``/``convert`` take them, and their parameters.

Everything about one format (short names, parameters and defaults, validation, the marker it
writes) is in the format's package: the description's ``aliases`` and the frozen ``Params``
class of its ``params`` module (``comfyquant.formats.params``).  This module only looks
them up by name, with the one-line refusals that list what is allowed.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..formats import registry
from ..formats.params import Params

KEEP = "keep"
"""The pseudo-format of rules that keep layers as they are (dense for quantize)."""
DECODE = "dense"
"""The pseudo-format of rules that make layers dense: for ``convert``, a quantized layer is
decoded (its model dtype) and written without a marker; for ``quantize`` it is ``keep``."""


def writable() -> list[str]:
    """The formats quantize writes, the recommended first (the registry's ``WRITING_ORDER``)."""
    return [f.name for f in registry.WRITING_ORDER]


def format_names() -> str:
    """``asym_w4a8_int8 (w4a8), ...`` for messages."""
    out = []
    for name in writable():
        aliases = registry.FORMATS[name].aliases
        out.append(f"{name} ({aliases[0]})" if aliases else name)
    return ", ".join(out)


def resolve_format(name: str, where: str = "--format", allow_keep: bool = False) -> str:
    """The canonical name of a format the quantizer can write, or ``keep``; refuses others."""
    if not isinstance(name, str):
        raise InputError(f"{where}: format must be a string, got {name!r}")
    key = name.strip().lower()
    if allow_keep and key == KEEP:
        return KEEP
    if allow_keep and key == DECODE:
        return DECODE
    fmt = registry.lookup(key)
    if fmt is not None and fmt.writable:
        return fmt.name
    if fmt is not None and fmt.converter_only:
        why = "a converter-only format no runtime loads"
    elif fmt is not None:
        why = "not written by quantize (offline calibration only, no quantizer in comfy-kitchen)"
    else:
        why = "an unknown format"
    extra = f", or {KEEP}" if allow_keep else ""
    raise InputError(f"{where}: {name!r} is {why}; choose from {format_names()}{extra}")


def validate(fmt_name: str, given: dict[str, Any], where: str = "--format") -> Params:
    """``given`` checked against the format (see ``Params.validate``): the frozen
    parameters with every default filled in."""
    return registry.FORMATS[fmt_name].params_class().validate(given, where)
