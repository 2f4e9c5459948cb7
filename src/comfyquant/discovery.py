"""The subpackages of a package, found on disk: how the format and dialect registries learn
what exists, so adding one means adding a folder and nothing else (base layer: imports nothing
from the package)."""

from __future__ import annotations

import os
from importlib import import_module
from types import ModuleType


def subpackages(package: str, init_file: str) -> list[ModuleType]:
    """Each subpackage of ``package`` (whose ``__init__.py`` is ``init_file``), imported, in
    name order; folders starting with ``_`` or ``.`` are skipped."""
    here = os.path.dirname(init_file)
    with os.scandir(here) as entries:
        names = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith(("_", "."))
                       and os.path.isfile(os.path.join(e.path, "__init__.py")))
    return [import_module(f"{package}.{name}") for name in names]
