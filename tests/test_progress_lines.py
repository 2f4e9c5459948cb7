"""Progress on stderr: a redrawn line on a terminal, plain periodic lines in a log (a CI job is
never silent for minutes), nothing when switched off."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys

import pytest

from builders import dense_layer, write
from comfyquant.io.progress import Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """The progress module's clock, moved by the test: what the lines say follows from the
    seconds the test lets pass, not from how fast the machine runs it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import comfyquant.io.progress as progress

    c = Clock()
    monkeypatch.setattr(progress, "time", c)
    return c


def feed(p: Progress, clock: Clock, steps: int = 6, seconds: float = 0.25) -> None:
    for _ in range(steps):
        clock.now += seconds
        p.add(100, 1)
    p.done()


def test_log_gets_plain_lines_a_terminal_a_redrawn_one(clock):
    log = io.StringIO()
    feed(Progress(6, 600, None, label="quantize", stream=log, every=0.01), clock)
    lines = log.getvalue().splitlines()
    assert lines and "\r" not in log.getvalue()
    assert all(line.startswith("quantize: ") and "MB/s" in line and "s left" in line for line in lines)
    tty = Tty()
    feed(Progress(6, 600, None, label="quantize", stream=tty), clock)
    assert tty.getvalue().startswith("\r") and tty.getvalue().endswith("\r\x1b[K")


def test_off_means_nothing_and_logs_wait_for_the_interval(clock):
    log = io.StringIO()
    feed(Progress(6, 600, False, stream=log, every=0.0), clock)
    assert log.getvalue() == ""
    log = io.StringIO()
    feed(Progress(6, 600, None, stream=log, every=60.0), clock)  # a 1.5 s run: no line at all
    assert log.getvalue() == ""
    log = io.StringIO()
    feed(Progress(6, 600, None, stream=log, every=60.0), clock, seconds=25.0)  # 25 s a layer
    # the first line once a minute has passed (at 75 s), none at the end (the run is done)
    assert log.getvalue().splitlines() == ["quantize:  50% layers 3/6, 300 B of 600 B, 0.0 MB/s, 75 s elapsed, 75 s left"]


@pytest.mark.needs_torch
def test_dequantize_writes_progress_lines_into_a_log(tmp_path):
    pytest.importorskip("torch")
    from builders import fp8_layer

    src = write(tmp_path / "m.safetensors", *[fp8_layer(f"b{i}", n=256, k=1024) for i in range(4)], dense_layer("n"))
    env = dict(os.environ, COMFYQUANT_PROGRESS_EVERY="0")
    out = subprocess.run(
        [sys.executable, "-m", "comfyquant", "dequantize", src, "-o", str(tmp_path / "d.safetensors")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "dequantize: " in out.stderr and "\r" not in out.stderr


@pytest.mark.needs_torch
def test_dequantize_on_a_terminal_draws_the_shared_progress_line(tmp_path):
    """Every long command draws io.progress's line: dequantize's bar on a terminal is the same
    redrawn line as quantize's (over bytes), erased at the end, and rich is never imported."""
    pytest.importorskip("torch")
    from builders import fp8_layer

    src = write(tmp_path / "m.safetensors", *[fp8_layer(f"b{i}", n=256, k=1024) for i in range(4)], dense_layer("n"))
    code = (
        "import io, sys, comfyquant\n"
        "class Tty(io.StringIO):\n"
        "    def isatty(self): return True\n"
        "sys.stderr = Tty()\n"
        f"comfyquant.dequantize({src!r}, {str(tmp_path / 'd.safetensors')!r}, progress=True)\n"
        "text = sys.stderr.getvalue()\n"
        "sys.__stdout__.write(repr(text) + '\\n' + str('rich' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    drawn, rich_loaded = out.stdout.rsplit("\n", 1)
    text = ast.literal_eval(drawn)
    assert text.startswith("\rdequantize [") and "MB/s" in text and "s left" in text
    assert text.endswith("\r\x1b[K")
    assert rich_loaded == "False"


@pytest.mark.parametrize("value, every", [("nan", 10.0), ("inf", 10.0), ("-5", 0.0), ("abc", 10.0), ("2.5", 2.5)])
def test_the_interval_setting_takes_a_finite_number_of_seconds(monkeypatch, value, every):
    import comfyquant.io.progress as progress

    monkeypatch.setenv("COMFYQUANT_PROGRESS_EVERY", value)
    assert progress._every() == every
