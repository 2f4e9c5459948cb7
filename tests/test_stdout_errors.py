"""A standard output that cannot be written (a full disk, ``> /dev/full``) is one line on
stderr and exit 2 for every command, text and ``--json``; a closed pipe is not an error."""

import os
import subprocess
import sys

import pytest

import builders as b

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def _files(tmp_path):
    good = b.write(tmp_path / "good.safetensors", b.fp8_layer("blk.0.a"), b.dense_layer("blk.0.d"))
    broken = b.write(tmp_path / "broken.safetensors", b.int8_layer("blk.1.a", scale_shape=(1, 32)))
    return good, broken


def _to_full(*args) -> subprocess.CompletedProcess:
    """The console script's entry with stdout on /dev/full."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    code = "import sys; from comfyquant.cli import run; sys.argv[0] = 'comfyquant'; run()"
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-c", code, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=env)


def _header_only_commands(good, broken, tmp_path):
    return [
        ["check", good],
        ["check", "--json", broken],
        ["check", "-v", broken],
        ["inspect", good],
        ["inspect", "--json", "--tensors", good],
        ["fix", "--dry-run", broken],
        ["fix", "--dry-run", "--json", broken],
        ["recipe", good],
        ["recipe", "--json", good],
        ["migrate", "--dry-run", good],
        ["migrate", "--dry-run", "--json", good],
        ["--help"],
        ["check", "--help"],
        ["--version"],
    ]


def test_every_header_only_command_reports_a_full_stdout_in_one_line(tmp_path):
    good, broken = _files(tmp_path)
    for args in _header_only_commands(good, broken, tmp_path):
        r = _to_full(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert lines == ["comfyquant: cannot write to standard output: No space left on device"], (args, r.stderr)


@pytest.mark.needs_torch
def test_decoding_commands_report_a_full_stdout_in_one_line(tmp_path):
    good, _broken = _files(tmp_path)
    dense = str(tmp_path / "dense.safetensors")
    for args in (
        ["dequantize", good, dense],
        ["compare", good, dense],
        ["compare", "--json", good, dense],
        ["quantize", dense, str(tmp_path / "q.safetensors"), "--format", "float8_e4m3fn", "--json"],
    ):
        r = _to_full(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert r.stderr.strip().splitlines()[-1] == "comfyquant: cannot write to standard output: No space left on device"
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr


def test_a_closed_pipe_is_not_an_error(tmp_path):
    good, _broken = _files(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    code = "import sys; from comfyquant.cli import run; sys.argv[0] = 'comfyquant'; run()"
    p = subprocess.Popen(
        [sys.executable, "-c", code, "inspect", "--tensors", good], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    p.stdout.close()  # the reader went away before reading anything
    err = p.stderr.read().decode()
    assert p.wait() == 0
    assert err == ""


def test_python_m_reports_a_full_stdout_without_a_second_complaint(tmp_path):
    """``python -m comfyquant`` tears the interpreter down (flushing stdout again): the
    buffered rest must not fail a second time with "Exception ignored"."""
    good, _broken = _files(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "comfyquant", "inspect", good], stdout=full, stderr=subprocess.PIPE, text=True, env=env
        )
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["comfyquant: cannot write to standard output: No space left on device"]
