"""``--target`` takes one runtime, ``all`` or a comma list, the same way on every command and in
the API (``comfyui,sglang`` is accepted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import comfyquant
from comfyquant.checker.run import parse_targets

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
W4A8 = str(EXAMPLES / "w4a8_sglang.safetensors")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "comfyquant", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("all", ("sglang", "comfyui", "comfy-kitchen")),
        ("comfyui", ("comfyui",)),
        ("comfyui,sglang", ("comfyui", "sglang")),
        (" comfyui , comfy-kitchen ", ("comfyui", "comfy-kitchen")),
        ("comfyui,comfyui", ("comfyui",)),
        ("sglang,all", ("sglang", "comfyui", "comfy-kitchen")),
        (["comfyui", "sglang"], ("comfyui", "sglang")),
    ],
)
def test_parse_targets(given, expected):
    assert parse_targets(given) == expected


@pytest.mark.parametrize("bad", ["comfyui,foo", ",", "comfyui,,", ""])
def test_bad_target_lists_are_refused(bad):
    with pytest.raises(ValueError, match="target"):
        parse_targets(bad)


def test_check_cli_takes_a_comma_list():
    out = _cli("check", W4A8, "--target", "comfyui,sglang", "--json")
    assert out.returncode == 0, out.stderr
    assert list(json.loads(out.stdout)["targets"]) == ["comfyui", "sglang"]
    assert list(comfyquant.check(W4A8, target="comfyui,sglang").verdicts) == ["comfyui", "sglang"]


@pytest.mark.parametrize("command", ["check", "fix", "quantize", "convert"])
def test_every_command_refuses_an_unknown_runtime_in_one_line(command, tmp_path):
    args = [command, W4A8]
    if command in ("quantize", "convert"):
        args += [str(tmp_path / "o.safetensors"), "--format" if command == "quantize" else "--to", "fp8"]
    out = _cli(*args, "--target", "comfyui,foo")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert any("unknown target 'foo'" in line for line in lines), out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_fix_dry_run_takes_a_comma_list():
    out = _cli("fix", W4A8, "--target", "sglang,comfy-kitchen", "--dry-run", "--json")
    assert out.returncode in (0, 1), out.stderr
    assert "Traceback" not in out.stderr
