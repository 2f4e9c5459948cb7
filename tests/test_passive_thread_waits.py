"""The command line makes torch's OpenMP threads wait passively (numerics/waits.py): on a
shared machine spinning threads made two-thread decoding ten times slower than one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = r"""
import os, sys
{before}
from comfyquant.cli import main
main(["--version"])
print(os.environ.get("OMP_WAIT_POLICY", "unset"))
"""


def _policy(env_value: str | None, before: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_command_line_sets_passive_waits_before_torch_loads():
    assert _policy(None) == "PASSIVE"


def test_a_users_wait_policy_is_kept():
    assert _policy("ACTIVE") == "ACTIVE"


@pytest.mark.needs_torch
def test_no_policy_is_set_once_torch_is_loaded():
    # libgomp has read its environment by then: setting it would only mislead
    assert _policy(None, before="import torch") == "unset"
