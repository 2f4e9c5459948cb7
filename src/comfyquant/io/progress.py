"""Progress of long runs on stderr: layers and bytes done, rate, time left.

On a terminal, one line redrawn with ``\\r`` a few times a second and erased at the end; on
anything else (a CI log, a file), a plain line every ``LOG_EVERY`` seconds, so a log is
never silent for minutes and never fills with redraws.  ``enabled=False`` shows neither.
"""

from __future__ import annotations

import math
import os
import sys
import time

from ..units import human_size


def _every() -> float:
    """``COMFYQUANT_PROGRESS_EVERY`` in seconds; the default 10 for anything that is not a
    finite number (``nan`` would print a line at every step, ``inf`` never one)."""
    try:
        value = float(os.environ.get("COMFYQUANT_PROGRESS_EVERY", "10"))
    except ValueError:
        return 10.0
    return max(0.0, value) if math.isfinite(value) else 10.0


LOG_EVERY = _every()
"""Seconds between progress lines when stderr is not a terminal (``COMFYQUANT_PROGRESS_EVERY``,
default 10)."""


class Progress:
    """``add(bytes, layers)`` as work completes; ``done()`` erases the line (on a terminal).

    ``enabled``: None shows the redrawn line on a terminal and periodic lines elsewhere; True
    the redrawn line always; False nothing."""

    def __init__(
        self,
        layers: int,
        nbytes: int,
        enabled: bool | None = None,
        label: str = "quantize",
        stream=None,
        every: float = LOG_EVERY,
    ) -> None:
        self.stream = stream or sys.stderr
        tty = _isatty(self.stream)
        self.enabled = enabled is not False
        self.lines = enabled is None and not tty
        """Plain periodic lines instead of a redrawn one (stderr is not a terminal)."""
        self.every = every
        self.total_layers = layers
        self.total_bytes = nbytes
        self.layers = 0
        self.bytes = 0
        self.label = label
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False

    def add(self, nbytes: int, layers: int = 0) -> None:
        self.bytes += nbytes
        self.layers += layers
        if not self.enabled:
            return
        now = time.monotonic()
        if self.lines:
            if now - max(self._last, self.started) >= self.every and self.bytes < self.total_bytes:
                self._last = now
                self.stream.write(self._text(now) + "\n")
                self.stream.flush()
            return
        if now - self._last >= 0.2 or (self.total_layers and self.layers >= self.total_layers):
            self._last = now
            self._draw(now)

    def _text(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.bytes / elapsed
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        left = (self.total_bytes - self.bytes) / rate if rate > 0 and frac < 1 else 0.0
        layers = f" layers {self.layers}/{self.total_layers}," if self.total_layers else ""
        return (
            f"{self.label}: {frac:4.0%}{layers} "
            f"{human_size(self.bytes)} of {human_size(self.total_bytes)}, {rate / 1e6:.1f} MB/s, "
            f"{elapsed:.0f} s elapsed, {left:.0f} s left"
        )

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        width = 24
        fill = int(width * min(frac, 1.0))
        rate = self.bytes / elapsed
        left = (self.total_bytes - self.bytes) / rate if rate > 0 and frac < 1 else 0.0
        layers = f" layers {self.layers}/{self.total_layers} " if self.total_layers else ""
        line = (
            f"{self.label} [{'#' * fill}{'.' * (width - fill)}]{layers} "
            f"{human_size(self.bytes)}/{human_size(self.total_bytes)}  {rate / 1e6:.1f} MB/s  {left:.0f} s left"
        )
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
