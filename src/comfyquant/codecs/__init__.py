"""Per-format codecs: encode, decode and run every Comfy quantized format (spec section 3).

``get(format_name)`` returns a codec with

* ``encode(weight, **params) -> Encoded`` (a dict of tensors by suffix, plus ``.marker``),
* ``decode(tensors, marker, dtype=None) -> weight`` and ``iter_decode`` (row blocks),
* ``linear(x, tensors, marker, bias=None)`` (the reference forward),

all bit-exact with comfy-kitchen 0.2.40's CPU eager backend (see the README for the few
documented exceptions).  Importing this package is light; torch loads with the first codec.
"""

from __future__ import annotations

_MODULES = {
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8_tensorwise": "int8",
    "asym_w4a8_int8": "w4a8",
    "convrot_w4a4": "w4a4",
    "nvfp4": "nvfp4",
    "mxfp8": "mxfp8",
    "awq_w4a16": "awq",
    "svdquant_w4a4": "svdquant",
}

NAMES: tuple[str, ...] = tuple(_MODULES)
"""Formats with a codec (converter-only formats have none)."""


def has(format_name: str) -> bool:
    """True when ``format_name`` has a codec (no import of torch)."""
    return format_name in _MODULES


def get(format_name: str):
    """The codec of ``format_name``; raises :class:`~comfyquant.codecs.base.CodecError` if none."""
    import importlib

    module = _MODULES.get(format_name)
    if module is None:
        from .base import CodecError

        raise CodecError(f"no codec for format {format_name!r}; codecs exist for {', '.join(NAMES)}")
    return importlib.import_module(f".{module}", __name__).CODECS[format_name]


def __getattr__(name: str):
    if name in ("CodecError", "Encoded", "Codec"):
        from . import base

        return getattr(base, name)
    raise AttributeError(name)
