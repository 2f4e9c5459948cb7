"""Standard output as the command line writes it: printable, and a failed write a one-line error.

Every command prints through ``sys.stdout``; ``guarded_stdout`` puts ``GuardedOutput``
there for the length of a command.  Two things then hold for every command and every renderer
without each having to remember them:

* a control character that reaches the terminal (from a tensor name, a metadata value, a
  marker string) is written escaped (``comfyquant.naming.printable``), except the
  renderers' own line breaks, tabs and colours;
* a write that fails (a full disk, ``> /dev/full``, an I/O error) raises ``OutputError``,
  which the command line reports in one line with exit code 2.  A closed pipe stays a
  ``BrokenPipeError``: the reader has all it wanted, which is not an error.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

from ..errors import ComfyQuantError
from ..naming import CONTROLS, printable

RENDERER_SEQUENCES = ("\033[0m", "\033[2m", "\033[31m", "\033[33m", "\033[36m")
"""The terminal sequences comfyquant's own renderers write (``render.py``'s colours): the
only ones that reach standard output unescaped."""

_KEPT = re.compile("|".join(re.escape(s) for s in RENDERER_SEQUENCES) + "|[\n\t]")


class OutputError(ComfyQuantError):
    """Standard output could not be written (not a closed pipe)."""


def escape_foreign(text: str) -> str:
    """``text`` with every control character escaped except the renderers' own sequences
    (``RENDERER_SEQUENCES``), line breaks and tabs."""
    if not CONTROLS.search(text):
        return text
    out = []
    pos = 0
    for kept in _KEPT.finditer(text):
        out.append(printable(text[pos : kept.start()]))
        out.append(kept.group())
        pos = kept.end()
    out.append(printable(text[pos:]))
    return "".join(out)


class GuardedOutput:
    """A text stream over ``stream`` (standard output) that escapes foreign control
    characters and turns a failed write into ``OutputError``; everything else
    (``isatty``, ``encoding``, ``fileno`` ...) is the wrapped stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        with self._reported():
            self._stream.write(escape_foreign(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._reported():
            self._stream.flush()

    @contextlib.contextmanager
    def _reported(self):
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = True
            _drain(self._stream)
            reason = exc.strerror or type(exc).__name__
            raise OutputError(f"cannot write to standard output: {reason}") from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _drain(stream) -> None:
    """Point the failed stream's descriptor at the null device, so what is still buffered
    goes nowhere at exit instead of failing a second time with a traceback."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


@contextlib.contextmanager
def guarded_stdout():
    """``sys.stdout`` is a ``GuardedOutput`` inside the block and flushed at its end
    (so a write error surfaces while the command can still report it), then restored."""
    original = sys.stdout
    guard = GuardedOutput(original)
    sys.stdout = guard
    try:
        yield guard
        guard.flush()
    finally:
        sys.stdout = original


def say(line: str) -> None:
    """One line on stderr (an error, a warning), its control characters escaped: a message
    may quote a name from a file.  A stderr that cannot be written leaves nothing to tell."""
    try:
        sys.stderr.write(printable(line) + "\n")
    except OSError:
        pass
