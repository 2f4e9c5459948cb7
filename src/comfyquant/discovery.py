"""The subpackages of a package, found on disk: how the format and dialect registries learn
what exists, so adding one means adding a folder and nothing else (base layer: imports nothing
from the package)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import import_module
from types import ModuleType


def subpackages(package: str, init_file: str) -> list[ModuleType]:
    """Each subpackage of ``package`` (whose ``__init__.py`` is ``init_file``), imported, in
    name order; folders starting with ``_`` or ``.`` are skipped."""
    here = os.path.dirname(init_file)
    with os.scandir(here) as entries:
        names = sorted(
            e.name
            for e in entries
            if e.is_dir() and not e.name.startswith(("_", ".")) and os.path.isfile(os.path.join(e.path, "__init__.py"))
        )
    return [import_module(f"{package}.{name}") for name in names]


def lazy_exports(
    package: str, where: dict[str, str], public: list[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose public names live in its submodules
    (``where``: name -> module, relative to the package): each is imported on first access, so
    importing the package costs nothing (start-up time is a product feature; torch and
    diffusers load only when their names are used).  A resolved name is stored in the package,
    so later lookups skip the hook; ``__dir__`` lists the public names and the dunders."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(public) | {n for n in namespace if n.startswith("__") and n.endswith("__")})

    return __getattr__, __dir__
