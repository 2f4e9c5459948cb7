"""Helpers shared by several commands."""

from __future__ import annotations


def name_mapper(prefix: str | None):
    """The ``--strip-prefix`` mapping, or None."""
    if not prefix:
        return None
    from ..checker.run import strip_prefix_mapper

    return strip_prefix_mapper(prefix)
