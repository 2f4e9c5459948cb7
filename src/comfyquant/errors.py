"""Exceptions that carry a one-line, user-facing message.

Every command turns an :class:`InputError` into a single line on stderr and exit code 2, so
the message must name the file (and tensor or layer) and say what is wrong.
"""

from __future__ import annotations


class ComfyQuantError(Exception):
    """Base class of every error comfyquant raises on purpose."""


class InputError(ComfyQuantError):
    """The input cannot be read at all (missing file, broken container, bad usage)."""
