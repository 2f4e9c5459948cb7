"""ComfyUI's test environment is made right from the README's virtual environment.

The README installs comfyquant into a fresh virtual environment; the ComfyUI tests run from
there must find torch and comfy-kitchen in ComfyUI's environment -- the reader's venv's, not
the base interpreter's (which a venv's ``--system-site-packages`` would name). This test makes
the README's environment in a fresh copy of the project with the README's own first command,
then runs ``tests/comfyui_env.py`` from it into an empty cache, and asks ComfyUI's environment
where its torch, comfy-kitchen and comfyquant come from.

It installs two environments (about five minutes), so it runs under CI (``CI=true``) or when
``COMFYQUANT_SLOW_TESTS=1`` asks for it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import doc_blocks
import runtime_sources

pytestmark = [
    pytest.mark.needs_torch,
    pytest.mark.skipif(
        not (runtime_sources.in_ci() or os.environ.get("COMFYQUANT_SLOW_TESTS") == "1"),
        reason="makes two environments: runs under CI=true or COMFYQUANT_SLOW_TESTS=1",
    ),
]


def _readme_install() -> doc_blocks.Command:
    """The README's first command: make the venv, install the clone, check the seed example."""
    first = doc_blocks.commands(doc_blocks.blocks(doc_blocks.ROOT / "README.md")[0])[0]
    assert "python -m venv .venv" in first.text and "pip install" in first.text, first.text
    return first


def test_comfyui_environment_from_the_readme_venv(tmp_path):
    tarball = runtime_sources.comfyui_tarball()
    if not tarball.is_file():
        runtime_sources.skip_missing(f"ComfyUI's source tarball is not at {tarball}")
    clone = tmp_path / "clone"
    doc_blocks.fresh_copy(clone)
    install = _readme_install()
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    made = subprocess.run(["bash", "-c", install.text], cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
    assert made.returncode == install.exit_code, made.stdout[-2000:] + made.stderr[-2000:]
    venv_python = clone / ".venv" / "bin" / "python"
    site = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    cache = tmp_path / "cache"
    env_made = subprocess.run(
        [str(venv_python), "tests/comfyui_env.py"],
        cwd=clone,
        env=dict(env, COMFYQUANT_TEST_CACHE=str(cache), COMFYQUANT_COMFYUI_TARBALL=str(tarball)),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert env_made.returncode == 0, env_made.stderr[-3000:]
    comfy_python = Path(env_made.stdout.strip().splitlines()[-1])
    assert comfy_python.is_relative_to(cache), env_made.stdout

    where = subprocess.run(
        [
            str(comfy_python),
            "-c",
            "import torch, comfy_kitchen, comfyquant, transformers, torchvision; "
            "print(torch.__version__, comfy_kitchen.__file__, comfyquant.__file__, sep='\\n')",
        ],
        env=dict(env, PYTHONPATH=str(clone / "src")),
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    torch_version, kitchen_file, comfyquant_file = where.stdout.split()
    readme_torch = subprocess.run(
        [str(venv_python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert torch_version == readme_torch
    assert Path(kitchen_file).is_relative_to(site), (kitchen_file, site)  # the README venv's, not the base's
    assert Path(comfyquant_file).is_relative_to(clone / "src"), comfyquant_file
