"""The public API: what ``import comfyquant`` offers, that it stays light, and that it is typed."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import comfyquant

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(comfyquant.__file__).resolve().parent
FUNCTIONS = [n for n in comfyquant.__all__ if not n.startswith("__")]
HEAVY = ("torch", "numpy", "safetensors", "rich")


def test_dir_lists_the_public_api_and_the_module_dunders():
    import comfyquant.checker.run  # noqa: F401  (submodules imported: still not listed)

    listed = dir(comfyquant)
    assert listed == sorted(listed)
    assert {n for n in listed if not n.startswith("__")} == set(FUNCTIONS)
    assert set(comfyquant.__all__) <= set(listed)
    assert {"__version__", "__doc__", "__name__", "__path__"} <= set(listed)


@pytest.mark.parametrize("name", comfyquant.__all__)
def test_every_name_in_all_resolves(name):
    value = getattr(comfyquant, name)
    if name == "__version__":
        assert isinstance(value, str) and value
    else:
        assert callable(value) and value.__name__ == name
        assert value.__module__.startswith("comfyquant.")
        exec(f"from comfyquant import {name}", {})


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="'comfyquant' has no attribute 'nothing_here'"):
        comfyquant.nothing_here  # noqa: B018
    with pytest.raises(ImportError):
        exec("from comfyquant import nothing_here", {})


def test_type_checkers_see_the_same_functions_the_lazy_import_gives():
    """The ``TYPE_CHECKING`` imports (what a type checker reads) name each API function from
    the module ``__getattr__`` imports it from."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    static = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                for alias in imp.names:
                    static[alias.asname or alias.name] = imp.module
    assert static == comfyquant._API
    for name, module in static.items():
        assert getattr(comfyquant, name).__module__ == f"comfyquant.{module}"


def _imported_after(code: str) -> list[str]:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.splitlines()[-1])


def _roots(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_import_and_check_stay_light():
    """``import comfyquant`` and a whole ``check`` of a real file import neither torch, numpy,
    safetensors, rich nor ``dataclasses`` (start-up time of the check CLI and API)."""
    mods = _imported_after("import comfyquant")
    assert not _roots(mods) & {*HEAVY, "dataclasses"}
    assert not [m for m in mods if m.startswith("comfyquant.") and m != "comfyquant.version"]
    mods = _imported_after(
        "import comfyquant\ncomfyquant.open_checkpoint\nr = comfyquant.check('examples/w4a8_sglang.safetensors')\nassert r.layers"
    )
    assert not _roots(mods) & {*HEAVY, "dataclasses"}


def test_inspect_stays_torch_free():
    mods = _imported_after("import comfyquant\ncomfyquant.inspect('examples/w4a8_sglang.safetensors')")
    assert not _roots(mods) & set(HEAVY)


def test_the_package_ships_its_type_hints():
    """PEP 561: ``py.typed`` is in the package and in the package data the build installs."""
    assert (PACKAGE / "py.typed").is_file()
    with open(ROOT / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["comfyquant"]


def _unannotated(func) -> list[str]:
    sig = inspect.signature(func)
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("name", ["check", "open_checkpoint"])
def test_api_functions_are_annotated(name):
    assert _unannotated(getattr(comfyquant, name)) == []


@pytest.mark.parametrize("name", ["inspect", "fix", "quantize", "convert", "dequantize"])
def test_the_writing_and_inspecting_functions_are_annotated(name):
    assert _unannotated(getattr(comfyquant, name)) == []


def _private_imports(path: Path) -> list[str]:
    """``from x import _name``, ``module._name`` of another comfyquant module, and ``obj._name``
    where no class of this module sets ``self._name`` (another module's private attribute)."""
    tree = ast.parse(path.read_text())
    modules, external, found = set(), {"self", "cls"}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            own = node.level > 0 or (node.module or "").startswith("comfyquant")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {alias.name}")
                else:
                    (modules if own else external).add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            external.update((a.asname or a.name).split(".")[0] for a in node.names)  # os._exit is public
    own_attrs = {
        t.attr
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            continue
        if node.value.id in modules:
            found.append(f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}")
        elif node.value.id not in external and node.attr not in own_attrs:
            # a private attribute of an object of a class this module does not define
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = [x for p in sorted(PACKAGE.rglob("*.py")) for x in _private_imports(p)]
    assert found == []
