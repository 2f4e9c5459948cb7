"""Model order of tensor and layer names, and their printable form, shared by every command that lists layers.

A base module (imports nothing of the package): ``quantize``'s plan, ``compare``'s table and
every report list layers in the same order."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """``blocks.2`` before ``blocks.10``: the order a model lists its layers."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What a terminal acts on instead of showing: C0 and C1 controls (ESC starts the sequences
that set the window title or clear the screen), DEL, the Unicode line separators and the
bidirectional overrides (they reorder what the eye reads)."""


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` safe to print on a terminal: every control character written as its escape
    (``\\x1b``, ``\\u202e``), except those in ``keep`` (a renderer's own ``\\n``).  Names come
    from files anyone can write; every text renderer and error line passes them through here,
    as ``--json`` does through JSON's escapes."""
    if not CONTROLS.search(text):
        return text
    if not keep:
        return CONTROLS.sub(_escaped, text)
    return CONTROLS.sub(lambda m: m.group() if m.group() in keep else _escaped(m), text)
