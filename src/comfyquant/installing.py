"""How a message tells the reader to install comfyquant or one of its extras.

comfyquant is installed from its source (it is not on the package index), so a hint names the
source folder this copy runs from when it runs from one (an editable install), and a
placeholder for it otherwise; torch is pinned so pip takes the CPU wheel.
"""

from __future__ import annotations

from pathlib import Path

PLACEHOLDER = "<comfyquant's source folder>"


def source_folder() -> str | None:
    """The project folder this copy of comfyquant runs from, None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent.parent
    return str(root) if (root / "pyproject.toml").is_file() else None


def extra_command(extra: str) -> str:
    """The command that adds ``extra``'s packages to this installation."""
    src = source_folder()
    pin = " torch==2.13.0" if extra in ("torch", "dev") else ""
    if src is None:
        return f"pip install '{PLACEHOLDER}[{extra}]'{pin}"
    return f"pip install -e '{src}[{extra}]'{pin}"


def install_command(python: str) -> str:
    """The command that installs comfyquant into another Python (ComfyUI's)."""
    return f"{python} -m pip install '{source_folder() or PLACEHOLDER}'"
