"""ComfyUI's own Python for the tests that run a real ComfyUI server.

The server needs packages the main environment must not hold (transformers, torchvision,
torchaudio, av, ComfyUI's frontend), so it gets a virtual environment of its own in the test
cache, made once (locked; marked ready only when complete). It sees the packages of the
environment running this module -- a virtual environment, a conda environment or the system
Python alike -- through a ``.pth`` file naming that environment's site folders (a venv's
``--system-site-packages`` would name its *base* interpreter's instead, where a reader's
virtual environment keeps neither torch nor comfy-kitchen). So it uses the main environment's
comfy-kitchen (the release comfyquant is bit-exact with), and ``pip`` installs the rest of
ComfyUI's ``requirements.txt`` into it, without the torch lines and comfy-kitchen. ``pip``
does not count what the ``.pth`` file lends as installed, so the dependencies of those
requirements land in the new environment too, torch among them: it is pinned to the main
environment's release. The cache key includes the lent folders, so each environment gets its
own. The environment is ready only once torch (the main environment's release), comfy-kitchen
(the main environment's own files) and this tree's comfyquant import in it.

ComfyUI 0.33.0 imports torchvision and torchaudio while starting (its model classes:
comfy/ldm/cosmos/model.py, comfy/ldm/lightricks/vae/audio_vae.py ...). The index's wheels that pair with the CPU torch are CUDA builds whose
compiled operators do not load; ComfyUI only needs their Python parts. So the environment
installs them resolved against the main environment's torch (``torch==X torchvision
torchaudio``, X its release), guards torchvision's two fake-kernel registrations for operators
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
import site
import subprocess
import sys
import sysconfig
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


def _torch_pin() -> str:
    """The main environment's torch release, asked for with ComfyUI's requirements: their
    dependencies (torchsde, kornia, spandrel) would otherwise resolve torch to the newest
    release the index has, a CUDA build that brings several GB of CUDA libraries along, and
    replacing it afterwards leaves those behind."""
    from importlib.metadata import version

    return f"torch=={version('torch').split('+')[0]}"


def _torch_companions() -> list[str]:
    """torchvision and torchaudio resolved against the installed torch, which pip keeps."""
    return [_torch_pin(), "torchvision", "torchaudio"]


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


def environment_sites() -> list[str]:
    """The site folders of the environment running this module, in its own order: its
    ``purelib`` and ``platlib``, then the other folders ``site`` added (a conda or system
    Python's extra site folders, the user site when it is enabled)."""
    paths = sysconfig.get_paths()
    found = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    out: list[str] = []
    for folder in found:
        if folder not in out and os.path.isdir(folder):
            out.append(folder)
    return out


def _see_environment(python: Path, sites: list[str]) -> None:
    """A ``.pth`` file in the new environment's own site folder that adds ``sites`` with
    ``site.addsitedir`` (their own ``.pth`` files, editable installs among them, apply too);
    they come after the new environment's folder, so what it installs wins."""
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({folder!r})" for folder in sites]
    (Path(own) / "zz_comfyquant_environment.pth").write_text("\n".join(lines) + "\n")


PROBE = (
    "import sys, torch, torchvision, torchaudio, comfy_kitchen, aiohttp, transformers, comfyquant; "
    "print(torch.__version__, comfy_kitchen.__file__, comfyquant.__file__, sep='\\n')"
)
"""What ComfyUI's server imports, and this tree's comfyquant (the tests put ``src`` first on
``PYTHONPATH``); prints torch's release and where comfy-kitchen and comfyquant were found."""


def _probe(python: Path, sites: list[str]) -> str:
    """Why ComfyUI's environment is not usable: it does not import what it needs, or imports
    it from elsewhere than this environment and this tree; empty when it is."""
    from importlib.metadata import version

    paths = [str(runtime_sources.ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, env=env)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"ComfyUI's environment does not import its packages: {last}"
    torch_v, kitchen_file, comfyquant_file = proc.stdout.split("\n")[:3]
    if torch_v != version("torch"):
        return f"ComfyUI's environment imports torch {torch_v}, not this environment's {version('torch')}"
    if not any(Path(kitchen_file).resolve().is_relative_to(Path(folder).resolve()) for folder in sites):
        return f"ComfyUI's environment imports comfy-kitchen from {kitchen_file}, not from this environment's {sites}"
    src = runtime_sources.ROOT / "src"
    if not Path(comfyquant_file).resolve().is_relative_to(src.resolve()):
        return f"ComfyUI's environment imports comfyquant from {comfyquant_file}, not from {src}"
    return ""


def _environment_missing() -> str:
    """Why the running environment cannot lend ComfyUI's its torch and comfy-kitchen, or ""."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("torch", "comfy-kitchen"):
        try:
            version(name)
        except PackageNotFoundError:
            return f"{name} is not installed in {sys.prefix} (pip install -e '.[dev]'), so ComfyUI's environment cannot use it"
    return ""


def comfyui_python() -> Path | None:
    """The interpreter of ComfyUI's environment, made on first use; None (with ``MISSING``
    set to a one-line reason) when ComfyUI's source or its packages cannot be had."""
    global MISSING
    source = runtime_sources.comfyui_source()
    if source is None:
        MISSING = runtime_sources.COMFYUI_MISSING
        return None
    MISSING = _environment_missing()
    if MISSING:
        return None
    requirements = _requirements(source)
    sites = environment_sites()
    key = hashlib.sha256("\n".join([sys.executable, sys.version, *sites, *requirements]).encode()).hexdigest()[:12]
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
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode:
            last = (made.stderr.strip().splitlines() or ["no message"])[-1]
            MISSING = f"ComfyUI's environment could not be made ({sys.executable} -m venv): {last}"
            return None
        _see_environment(python, sites)
        steps = [
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements, _torch_pin()],
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
        MISSING = _probe(python, sites)
        if MISSING:
            return None
        ready.write_text(f"{source}\n")
        SECONDS["venv"] = time.monotonic() - started
    return python


if __name__ == "__main__":
    found = comfyui_python()
    if found is None:
        print(MISSING, file=sys.stderr)
        # no ComfyUI source here: its tests skip with this line, locally; under CI, and for a
        # failed set-up, it is an error
        sys.exit(0 if MISSING == runtime_sources.COMFYUI_MISSING and not runtime_sources.in_ci() else 1)
    print(found)
    if "venv" in SECONDS:
        print(f"made in {SECONDS['venv']:.0f} s", file=sys.stderr)
    sys.exit(0)
