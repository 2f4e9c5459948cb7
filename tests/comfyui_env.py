"""ComfyUI's own Python for the tests that run a real ComfyUI server.

The server needs packages the main environment must not hold (transformers, torchvision,
torchaudio, av, ComfyUI's frontend), so it gets a virtual environment of its own in the test
cache, made once (locked; marked ready only when complete) with ``--system-site-packages``:
it sees the main environment's CPU torch and comfy-kitchen, and ``pip`` installs the rest of
ComfyUI's ``requirements.txt`` into it, without the torch lines and comfy-kitchen (the
environment's own release is the one comfyquant is bit-exact with).

ComfyUI 0.33.0 imports torchvision and torchaudio while starting (its model classes:
comfy/ldm/cosmos/model.py, comfy/ldm/lightricks/vae/audio_vae.py ...). The index's wheels that pair with the CPU torch are CUDA builds whose
compiled operators do not load; ComfyUI only needs their Python parts. So the environment
installs them resolved against the installed torch (``torch==X torchvision torchaudio``:
pip keeps that torch), guards torchvision's two fake-kernel registrations for operators
its library did not register (``_meta_registrations.py``: ``torchvision::nms`` and
``qnms``, which raise "operator does not exist" otherwise) and moves torchaudio's shared
libraries aside (torchaudio then imports without its compiled extension). comfyquant is not
installed into it: the tests put their tree's ``src`` first on ``PYTHONPATH``, so one
environment serves every checkout.

Run as a script (``python tests/comfyui_env.py``) it makes the environment and prints its
interpreter, for ``.ci/run``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import runtime_sources  # noqa: E402

LEFT_OUT = {"torch", "torchvision", "torchaudio", "comfy-kitchen"}
"""Requirement names the environment does not install (see the module docstring)."""

MISSING = ""
"""Why ComfyUI's environment could not be made (set by ``comfyui_python``)."""

SECONDS = {}
"""How long the last call took to make the environment (``"venv"``), for the reports."""


def _requirement_name(line: str) -> str:
    for sep in "<>=~!;[ ":
        line = line.split(sep, 1)[0]
    return line.strip().lower()


def _requirements(source: Path) -> list[str]:
    kept = []
    for raw in (source / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and _requirement_name(line) not in LEFT_OUT:
            kept.append(line)
    return kept


def _torch_companions() -> list[str]:
    """torchvision and torchaudio resolved against the installed torch, which pip keeps."""
    from importlib.metadata import version

    return [f"torch=={version('torch').split('+')[0]}", "torchvision", "torchaudio"]


GUARDED_FAKES = ("torchvision::nms", "torchvision::qnms")


def _python_parts_only(python: Path) -> None:
    """torchvision and torchaudio without their compiled operators (see the module docstring)."""
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    meta = site / "torchvision" / "_meta_registrations.py"
    text = meta.read_text()
    for op in GUARDED_FAKES:
        plain = f'@torch.library.register_fake("{op}")'
        guarded = f'@(torch.library.register_fake("{op}") if torchvision.extension._has_ops() else (lambda fn: fn))'
        if guarded not in text:
            if plain not in text:
                raise ValueError(f"{meta} has no {plain} to guard")
            text = text.replace(plain, guarded)
    meta.write_text(text)
    libs = site / "torchaudio" / "lib"
    aside = site / "torchaudio" / "lib.unloadable"
    aside.mkdir(exist_ok=True)
    for lib in libs.glob("*.so"):
        os.replace(lib, aside / lib.name)


def comfyui_python() -> Path | None:
    """The interpreter of ComfyUI's environment, made on first use; None (with ``MISSING``
    set to a one-line reason) when ComfyUI's source or its packages cannot be had."""
    global MISSING
    source = runtime_sources.comfyui_source()
    if source is None:
        MISSING = runtime_sources.COMFYUI_MISSING
        return None
    requirements = _requirements(source)
    key = hashlib.sha256("\n".join([sys.executable, sys.version, *requirements]).encode()).hexdigest()[:12]
    venv = runtime_sources.cache_dir() / f"comfyui-{runtime_sources.COMFYUI_COMMIT[:7]}-venv-{key}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.is_file():
        return python
    with runtime_sources._Locked("comfyui-venv"):
        if ready.is_file():
            return python
        started = time.monotonic()
        if venv.exists():
            shutil.rmtree(venv)  # an earlier run stopped half-way
        steps = [
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *_torch_companions()],
        ]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
            if proc.returncode:
                said = [line for line in proc.stderr.strip().splitlines() if not line.startswith("WARNING:")]
                last = (said or ["no message"])[-1]
                MISSING = f"ComfyUI's environment could not be made ({' '.join(step[:4])}): {last}"
                shutil.rmtree(venv, ignore_errors=True)
                return None
        try:
            _python_parts_only(python)
        except (OSError, ValueError) as exc:
            MISSING = f"ComfyUI's environment could not be made (torchvision/torchaudio): {exc}"
            return None
        probe = subprocess.run(
            [str(python), "-c", "import torch, torchvision, torchaudio, comfy_kitchen, aiohttp, transformers"],
            capture_output=True,
            text=True,
        )
        if probe.returncode:
            last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
            MISSING = f"ComfyUI's environment does not import its packages: {last}"
            return None
        ready.write_text(f"{source}\n")
        SECONDS["venv"] = time.monotonic() - started
    return python


if __name__ == "__main__":
    found = comfyui_python()
    if found is None:
        print(MISSING, file=sys.stderr)
        # no ComfyUI source here: its tests skip with this line; a failed set-up is an error
        sys.exit(0 if MISSING == runtime_sources.COMFYUI_MISSING else 1)
    print(found)
    if "venv" in SECONDS:
        print(f"made in {SECONDS['venv']:.0f} s", file=sys.stderr)
    sys.exit(0)
