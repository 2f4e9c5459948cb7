"""The docstrings the Python API page renders are Markdown.

mkdocstrings renders each ``::: dotted.path`` of the documentation as the object's docstring,
read as Markdown: a Sphinx role (``:func:`x```) would be printed as it is written, so code is
quoted with backticks alone and no role is left.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = os.path.join(ROOT, "docs")
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const|ref):`")


def _rendered() -> list[str]:
    """Every dotted path a page hands to mkdocstrings."""
    paths = []
    for folder, _, files in os.walk(DOCS):
        for name in sorted(files):
            if name.endswith(".md"):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                paths += re.findall(r"^::: ([\w.]+)", text, re.MULTILINE)
    return paths


def _resolve(path: str):
    """The object at ``path``; skipped when it needs a library that is not installed (the
    light install has no torch: ``comfyquant.torch`` resolves its names on first use)."""
    try:
        return _lookup(path)
    except ModuleNotFoundError as exc:
        named = re.search(r"No module named '([\w.]+)'", str(exc))
        missing = exc.name or (named.group(1) if named else "")
        if missing.startswith("comfyquant"):
            raise
        pytest.skip(f"{path} needs {missing}, which is not installed")


def _lookup(path: str):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # not a module: an attribute of a shorter one
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"{path} does not resolve")


def test_the_api_page_renders_objects():
    assert len(_rendered()) > 10


@pytest.mark.parametrize("path", _rendered())
def test_a_rendered_docstring_has_no_sphinx_role(path):
    doc = inspect.getdoc(_resolve(path)) or ""
    assert doc, f"{path} has no docstring"
    assert not ROLE.search(doc), f"{path}: {ROLE.findall(doc)}"
