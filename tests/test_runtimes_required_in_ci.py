"""CI never passes with the runtime tests skipped: under ``CI=true`` a test whose runtime is
missing fails with the one-line reason (``tests/conftest.py``); without CI it skips.

Run on the real ComfyUI node tests, with the source tarball pointed at a file that does not
exist and an empty test cache, so ComfyUI's source cannot be had.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import runtime_sources

TEST = "tests/test_comfyui.py::test_nodes_register_with_their_sockets"


def _pytest(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    env["COMFYQUANT_COMFYUI_TARBALL"] = str(tmp_path / "no-such-comfyui.tar.xz")
    env["COMFYQUANT_TEST_CACHE"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", TEST],
        cwd=runtime_sources.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.needs_torch
def test_a_missing_comfyui_source_fails_under_ci(tmp_path):
    proc = _pytest(tmp_path, ci=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CI=true: a runtime this test needs is missing: ComfyUI 0.33.0 source not found at" in proc.stdout
    assert "no-such-comfyui.tar.xz (set COMFYQUANT_COMFYUI_TARBALL)" in proc.stdout
    assert "1 error" in proc.stdout, proc.stdout


@pytest.mark.needs_torch
def test_a_missing_comfyui_source_skips_outside_ci(tmp_path):
    proc = _pytest(tmp_path, ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout, proc.stdout
    assert "runtime missing: ComfyUI 0.33.0 source not found at" in proc.stdout


def test_the_environment_builder_fails_under_ci_without_the_source(tmp_path):
    """``.ci/run`` makes ComfyUI's environment first (``python tests/comfyui_env.py``): without
    the source it exits 0 locally (the tests then skip) and 1 under CI, saying why."""
    env = dict(os.environ, COMFYQUANT_COMFYUI_TARBALL=str(tmp_path / "none.tar.xz"))
    env["COMFYQUANT_TEST_CACHE"] = str(tmp_path / "cache")
    script = [sys.executable, str(runtime_sources.ROOT / "tests" / "comfyui_env.py")]
    env.pop("CI", None)
    local = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
    ci = subprocess.run(script, env=dict(env, CI="true"), capture_output=True, text=True, timeout=120)
    assert local.returncode == 0, local.stderr
    assert ci.returncode == 1, ci.stderr
    for proc in (local, ci):
        assert "ComfyUI 0.33.0 source not found at" in proc.stderr and "none.tar.xz" in proc.stderr
