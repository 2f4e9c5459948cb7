"""``comfyquant comfyui install COMFYUI_DIR``: put comfyquant's nodes into a ComfyUI.

It writes ``custom_nodes/comfyquant/__init__.py``, a shim that imports
``comfyquant.comfyui`` from the Python ComfyUI runs on, so the nodes are the installed
package's and upgrade with it.  The folder must be a ComfyUI (``main.py``, ``nodes.py`` and
``comfy/``); a ``custom_nodes/comfyquant`` that this command did not write is never
replaced.  ComfyUI's Python (``--python``, default: this one) is asked whether it can import
comfyquant, and the command says so when it cannot.
"""

from __future__ import annotations

import os
import subprocess
import sys

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
        default=sys.executable,
        help="the Python ComfyUI runs on, asked whether it imports comfyquant (default: this one)",
    )


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
    found, why = _importable(args.python)
    if found is None:
        print(
            f"comfyquant is not importable from {args.python} ({why}): ComfyUI will not load the nodes until it is; "
            f"install it there: {args.python} -m pip install comfyquant",
            file=sys.stderr,
        )
        return 1
    print(f"{args.python} imports comfyquant from {found}: restart ComfyUI to load the nodes")
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
