"""Exceptions that carry a one-line, user-facing message.

Every command turns an ``InputError`` into a single line on stderr and exit code 2, so
the message must name the file (and tensor or layer) and say what is wrong.
"""

from __future__ import annotations

import contextlib

_COMMAND_LINE = False
"""True while the command line runs a command (``command_line``): messages then name its
options; otherwise the caller is the Python API and they name its keywords."""


def option(flag: str, keyword: str) -> str:
    """How a message names a setting: ``flag`` (``--overwrite``) to a command-line user,
    ``keyword`` (``overwrite=True``) to a Python caller, who has no such flag."""
    return flag if _COMMAND_LINE else keyword


@contextlib.contextmanager
def command_line():
    """Inside the block, ``option`` speaks of command-line options."""
    global _COMMAND_LINE
    before = _COMMAND_LINE
    _COMMAND_LINE = True
    try:
        yield
    finally:
        _COMMAND_LINE = before


class ComfyQuantError(Exception):
    """Base class of every error comfyquant raises on purpose."""


class InputError(ComfyQuantError):
    """The input cannot be read at all (missing file, broken container, bad usage)."""
