"""Model order of tensor and layer names, shared by every command that lists layers.

A base module (imports nothing of the package): ``quantize``'s plan, ``compare``'s table and
every report list layers in the same order."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """``blocks.2`` before ``blocks.10``: the order a model lists its layers."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))
