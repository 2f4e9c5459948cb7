"""Where the tests find the real runtimes they check comfyquant against.

Each runtime is an oracle, never part of the package: ComfyUI's source is unpacked from its
release tarball into a cache folder at test time, SGLang's wheel is downloaded with
``pip download --no-deps`` into the same cache. A function returns ``None`` with a one-line
reason when its runtime cannot be had here, so the tests that need it skip with that reason
(``skip_missing``): locally a missing runtime is a skip, but under ``CI=true`` the skip is a
failure (``tests/conftest.py``), so CI never passes with the runtime tests left out.

- ``COMFYQUANT_COMFYUI_TARBALL``: the ComfyUI source tarball (default: the one beside the
  project, ``../shared/runtimes/comfyui-783545f.tar.xz`` from the project's root).
- ``COMFYQUANT_TEST_CACHE``: the cache folder (default ``~/.cache/comfyquant-tests``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
COMFYUI_COMMIT = "783545f689a0af730065994b46b382ae24844c99"
COMFYUI_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
KITCHEN_VERSION = "0.2.40"


MISSING_PREFIX = "runtime missing: "
"""How a skip for a missing runtime starts (``skip_missing``); ``tests/conftest.py`` fails such
skips under CI."""


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``, as CI services set it): there every runtime the
    tests need must be present."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def skip_missing(reason: str) -> NoReturn:
    """Skip the running test because a runtime it needs is missing (``reason``: one line saying
    which and how to get it); a failure under CI (see ``in_ci``)."""
    import pytest

    pytest.skip(MISSING_PREFIX + reason)


def cache_dir() -> Path:
    path = Path(os.environ.get("COMFYQUANT_TEST_CACHE") or Path.home() / ".cache" / "comfyquant-tests")
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Locked:
    """An exclusive lock on a file in the cache: test processes running side by side unpack or
    download a runtime once."""

    def __init__(self, name: str) -> None:
        self.path = cache_dir() / f".{name}.lock"

    def __enter__(self) -> _Locked:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def comfyui_tarball() -> Path:
    env = os.environ.get("COMFYQUANT_COMFYUI_TARBALL")
    return Path(env) if env else ROOT.parent / "shared" / "runtimes" / f"comfyui-{COMFYUI_COMMIT[:7]}.tar.xz"


COMFYUI_MISSING = ""
"""Why ComfyUI's source is not available (set by ``comfyui_source``)."""


def comfyui_source() -> Path | None:
    """The folder holding ComfyUI's ``main.py`` and ``comfy/`` package, unpacked once into the
    cache (atomically: a half-unpacked tree is never used); None when the tarball is absent."""
    global COMFYUI_MISSING
    tarball = comfyui_tarball()
    target = cache_dir() / f"comfyui-{COMFYUI_COMMIT[:7]}"
    src = target / "comfyui-src"
    if (src / "main.py").is_file():
        return src
    if not tarball.is_file():
        COMFYUI_MISSING = f"ComfyUI {COMFYUI_VERSION} source not found at {tarball} (set COMFYQUANT_COMFYUI_TARBALL)"
        return None
    unpack_once(tarball, target, src / "main.py", "comfyui")
    return src


def unpack_once(tarball: Path, target: Path, ready: Path, name: str) -> None:
    """Unpack ``tarball`` into ``target`` in the cache, once and atomically: under the lock
    ``name``, into a temporary folder renamed into place, unless ``ready`` (a file or folder
    the unpacked tree holds) already exists; a half-unpacked tree is never used."""
    with _Locked(name):
        if ready.exists():
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir()))
        try:
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp, filter="data")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


SGLANG_MISSING = ""
"""Why SGLang's wheel is not available (set by ``sglang_wheel``)."""


def sglang_wheel() -> Path | None:
    """SGLang's wheel in the cache, downloaded once with ``pip download --no-deps``; None when
    the package index cannot be reached."""
    global SGLANG_MISSING
    folder = cache_dir() / f"sglang-{SGLANG_VERSION}"
    found = sorted(folder.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    with _Locked("sglang"):
        found = sorted(folder.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if found:
            return found[0]
        tmp = Path(tempfile.mkdtemp(prefix=".sglang-", dir=cache_dir()))
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--disable-pip-version-check",
                    f"sglang=={SGLANG_VERSION}",
                    "-d",
                    str(tmp),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wheels = sorted(tmp.glob("sglang-*.whl"))
            if proc.returncode or not wheels:
                last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                SGLANG_MISSING = f"SGLang {SGLANG_VERSION} wheel could not be downloaded: {last}"
                return None
            folder.mkdir(parents=True, exist_ok=True)
            final = folder / wheels[0].name
            os.replace(wheels[0], final)
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
