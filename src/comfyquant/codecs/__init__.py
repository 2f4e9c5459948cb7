"""Per-format codecs: encode, decode and run every Comfy quantized format (the layouts of
comfy-kitchen 0.2.40 ``comfy_kitchen/tensor/``).

Each codec lives in its format's package (``formats/<family>/codec.py``); this module is the
public way to reach them by name.  ``get(format_name)`` returns a codec with

* ``encode(weight, **params) -> Encoded`` (a dict of tensors by suffix, plus ``.marker``),
* ``decode(tensors, marker, dtype=None) -> weight`` and ``iter_decode`` (row blocks),
* ``linear(x, tensors, marker, bias=None)`` (the reference forward),

all bit-exact with comfy-kitchen 0.2.40's CPU eager backend (see the README for the few
documented exceptions).  Importing this module is light; torch loads with the first codec.
"""

from __future__ import annotations

from ..formats.registry import FORMATS

NAMES: tuple[str, ...] = tuple(name for name, fmt in FORMATS.items() if fmt.has_codec)
"""Formats with a codec (converter-only formats have none)."""


def has(format_name: str) -> bool:
    """True when ``format_name`` has a codec (no import of torch)."""
    fmt = FORMATS.get(format_name)
    return fmt is not None and fmt.has_codec


def get(format_name: str):
    """The codec of ``format_name``; raises ``CodecError`` if none."""
    fmt = FORMATS.get(format_name)
    if fmt is None or not fmt.has_codec:
        from ..formats.codec import CodecError

        raise CodecError(f"no codec for format {format_name!r}; codecs exist for {', '.join(NAMES)}")
    return fmt.codec()


def release_memory() -> int:
    """Let go of the memory kept for the next large decoded layer: ``decode()`` keeps the
    memory of its last large result (over 32 MiB) for the next one once the caller has
    dropped it (``empty_result``).  Returns the bytes released
    (0 when nothing was kept; no import of torch)."""
    import sys

    pages = sys.modules.get("comfyquant.numerics.pages")
    return pages.release_spare() if pages is not None else 0


def __getattr__(name: str):
    if name in ("CodecError", "Encoded", "Codec"):
        from ..formats import codec

        return getattr(codec, name)
    raise AttributeError(name)
