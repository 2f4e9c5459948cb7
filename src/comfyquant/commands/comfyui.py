"""``comfyquant comfyui install COMFYUI_DIR``: put comfyquant's nodes into a ComfyUI.

It writes ``custom_nodes/comfyquant/__init__.py``, a shim that imports
``comfyquant.comfyui`` from the Python ComfyUI runs on, so the nodes are the installed
package's and upgrade with it.  The folder must be a ComfyUI (``main.py``, ``nodes.py`` and
``comfy/``); a ``custom_nodes/comfyquant`` that this command did not write is never
replaced.  ComfyUI's Python (``--python``, else the one ``comfyui_python`` finds beside the
folder) is asked whether it can import comfyquant, and the command says so when it cannot.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ..installing import install_command

HELP = "install comfyquant's nodes into a ComfyUI (comfyui install COMFYUI_DIR)"
SHIM_MARK = "# Written by `comfyquant comfyui install`"
SHIM = f"""{SHIM_MARK}: ComfyUI loads comfyquant's nodes from the comfyquant
# package installed in its Python. Remove this folder to uninstall them.
from comfyquant.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, WEB_DIRECTORY

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
"""
SHIM_FILES = {"__init__.py", "__pycache__"}
"""What a folder this command wrote may hold (Python adds ``__pycache__``)."""


def add_parser(sub) -> None:
    c = sub.add_parser("comfyui", help=HELP, description="comfyquant's nodes in ComfyUI")
    actions = c.add_subparsers(dest="action", metavar="ACTION", required=True)
    i = actions.add_parser(
        "install",
        help="write custom_nodes/comfyquant/ (a shim importing comfyquant.comfyui) into a ComfyUI folder",
        description="write custom_nodes/comfyquant/ (a shim importing comfyquant.comfyui) into a ComfyUI folder",
    )
    i.add_argument("comfyui_dir", metavar="COMFYUI_DIR", help="the ComfyUI folder (holding main.py, nodes.py and comfy/)")
    i.add_argument(
        "--python",
        metavar="PATH",
        help="the Python ComfyUI runs on, asked whether it imports comfyquant (default: COMFYUI_DIR's venv/ or "
        ".venv/, else the portable build's python_embeded/, else the Python running this command)",
    )
    from .common import add_exit_codes

    add_exit_codes(i)


VENVS = ("venv", ".venv")
"""Virtual environments inside the ComfyUI folder, as its install guide makes them."""
EMBEDDED = "python_embeded"
"""The Windows portable build's Python, beside the ComfyUI folder (spelled so by ComfyUI)."""
INTERPRETERS = (("bin", "python3"), ("bin", "python"), ("Scripts", "python.exe"), ("python.exe",), ("python3",))
"""Where an environment folder keeps its interpreter (POSIX venv, Windows venv, embedded)."""


def comfyui_python(root: str) -> tuple[str, str]:
    """(ComfyUI's Python, how it was found).  The rule: ``COMFYUI_DIR/venv`` or ``/.venv``;
    else ``python_embeded`` beside or inside the folder (the portable build); else the Python
    running this command (the one ComfyUI runs on when both are installed in one
    environment, which is then said)."""
    parent = os.path.dirname(os.path.abspath(root))
    places = [(os.path.join(root, v), f"COMFYUI_DIR/{v}") for v in VENVS]
    places += [(os.path.join(parent, EMBEDDED), EMBEDDED), (os.path.join(root, EMBEDDED), f"COMFYUI_DIR/{EMBEDDED}")]
    for folder, name in places:
        for parts in INTERPRETERS:
            path = os.path.join(folder, *parts)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path, f"found in {name}"
    return sys.executable, f"no venv/, .venv/ or {EMBEDDED}/ found with the ComfyUI folder: the Python running this command"


def run(args) -> int:
    from ..errors import InputError

    root = args.comfyui_dir
    missing = [n for n, ok in (("main.py", _file), ("nodes.py", _file), ("comfy/", _folder)) if not ok(root, n)]
    if missing:
        raise InputError(f"{root}: not a ComfyUI folder (no {', '.join(missing)}); nothing was written")
    target = os.path.join(root, "custom_nodes", "comfyquant")
    try:
        _refuse_foreign(target)
        os.makedirs(target, exist_ok=True)
        shim = os.path.join(target, "__init__.py")
        temp = f"{shim}.{os.getpid()}.tmp"
        with open(temp, "w", encoding="utf-8") as fh:
            fh.write(SHIM)
        os.replace(temp, shim)
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    print(f"wrote {shim}")
    python, how = (args.python, "given with --python") if args.python else comfyui_python(root)
    print(f"ComfyUI's Python: {python} ({how})")
    found, why = _importable(python)
    if found is None:
        other = "" if args.python else "; if ComfyUI runs on another Python, pass it with --python PATH"
        print(
            f"comfyquant is not importable from {python} ({why}): ComfyUI will not load the nodes until it is; "
            f"install it there: {install_command(python)}{other}",
            file=sys.stderr,
        )
        return 1
    print(f"{python} imports comfyquant from {found}: restart ComfyUI to load the nodes")
    return 0


def _file(root: str, name: str) -> bool:
    return os.path.isfile(os.path.join(root, name))


def _folder(root: str, name: str) -> bool:
    return os.path.isdir(os.path.join(root, name))


def _refuse_foreign(target: str) -> None:
    """A ``custom_nodes/comfyquant`` this command did not write stays as it is."""
    from ..errors import InputError

    if not os.path.lexists(target):
        return
    if os.path.islink(target) or not os.path.isdir(target):
        raise InputError(f"{target}: exists and is not a folder comfyquant wrote; nothing was replaced")
    others = sorted(set(os.listdir(target)) - SHIM_FILES)
    shim = os.path.join(target, "__init__.py")
    if others:
        raise InputError(f"{target}: holds files comfyquant did not write ({', '.join(others[:4])}); nothing was replaced")
    if os.path.lexists(shim):
        try:
            with open(shim, encoding="utf-8", errors="replace") as fh:
                ours = fh.read(len(SHIM_MARK)) == SHIM_MARK
        except OSError:
            ours = False
        if not ours or os.path.islink(shim):
            raise InputError(f"{shim}: exists and was not written by comfyquant; nothing was replaced")


def _importable(python: str) -> tuple[str | None, str]:
    """(where ``python`` imports comfyquant.comfyui from, None and why when it cannot)."""
    code = "import comfyquant.comfyui, os; print(os.path.dirname(comfyquant.__file__))"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot run it: {getattr(exc, 'strerror', None) or exc}"
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return None, last
    return proc.stdout.strip(), ""
