"""One bounded parse for every JSON text a file carries (a marker, the header's marker map, a
dialect's metadata, an index, a version stamp).

Python's ``json`` parses nesting by recursion: a ``_quantization_metadata`` nested tens of
thousands deep raises ``RecursionError``, and one just under the interpreter's limit parses but
breaks whatever walks or re-serializes it later.  No format comfyquant reads nests deeper than
a handful of levels, so ``parse`` refuses more than ``MAX_DEPTH`` as it refuses text
that is not JSON: with a ``ValueError`` (``TooDeep``), which every caller already handles.
"""

from __future__ import annotations

import json
from collections.abc import Callable

MAX_DEPTH = 64
"""Deepest nesting accepted (a marker map is 3 levels, an index 2)."""


class TooDeep(ValueError):
    """JSON text nested deeper than ``MAX_DEPTH``."""


def deeper_than(obj, limit: int) -> bool:
    """Whether a parsed value nests containers more than ``limit`` levels (walked with a
    stack of its own, never by recursion)."""
    stack = [(obj, 1)]
    while stack:
        value, level = stack.pop()
        if level > limit:
            return True
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, level + 1) for v in items if isinstance(v, (dict, list)))
    return False


def parse(text: str | bytes, decode: Callable[[str], object] = json.loads, limit: int = MAX_DEPTH):
    """``decode(text)`` (``json.loads`` by default, or a configured decoder's ``decode``), or
    ``ValueError`` for text that is not JSON or nests deeper than ``limit``.  The parsed value
    is walked only when the text has more brackets than ``limit`` (a marker has a few)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        obj = decode(text)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {limit} levels") from None
    if isinstance(obj, (dict, list)) and text.count("[") + text.count("{") > limit and deeper_than(obj, limit):
        raise TooDeep(f"JSON nested deeper than {limit} levels")
    return obj
