"""A progress line on stderr for long runs: layers and bytes done, rate, time left.

Plain text with ``\\r`` (no dependency): shown only when stderr is a terminal unless asked
for, redrawn at most a few times a second, erased at the end.
"""

from __future__ import annotations

import sys
import time

from ..units import human_size


class Progress:
    """``add(bytes, layers)`` as work completes; ``done()`` erases the line."""

    def __init__(self, layers: int, nbytes: int, enabled: bool | None = None, label: str = "quantize",
                 stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
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
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= 0.2 or self.layers >= self.total_layers:
                self._last = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        width = 24
        fill = int(width * min(frac, 1.0))
        rate = self.bytes / elapsed
        left = (self.total_bytes - self.bytes) / rate if rate > 0 and frac < 1 else 0.0
        line = (f"{self.label} [{'#' * fill}{'.' * (width - fill)}] layers {self.layers}/{self.total_layers}  "
                f"{human_size(self.bytes)}/{human_size(self.total_bytes)}  {human_size(rate)}/s  {left:.0f} s left")
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
