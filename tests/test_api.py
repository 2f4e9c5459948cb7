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


# -- what the results print as ----------------------------------------------------------------------


def _assert_useful_repr(obj, *words: str) -> str:
    """Short, named for its class, saying what it holds -- never ``<... object at 0x...>``."""
    text = repr(obj)
    assert " object at 0x" not in text and text.startswith(type(obj).__name__ + "("), text
    assert len(text) <= 400 and "\n" not in text, text
    for word in words:
        assert word in text, (word, text)
    return text


@pytest.mark.needs_torch
def test_every_public_result_prints_what_it_holds(tmp_path):
    """Each API function's result (and the plans, plan lines and reports inside them) prints
    as one short line naming what it holds, as ``check``'s ``Report`` always did."""
    import torch

    from comfyquant.torch import load_quantized

    examples = ROOT / "examples"
    seed, dense = str(examples / "seed_broken_w4a8.safetensors"), str(examples / "dense_tiny.safetensors")
    called: set[str] = set()

    def api(name: str, *args, **kw):
        called.add(name)
        return getattr(comfyquant, name)(*args, **kw)

    _assert_useful_repr(api("check", seed), "seed_broken_w4a8", "ok=False")
    with api("open_checkpoint", seed) as ckpt:
        _assert_useful_repr(ckpt, "seed_broken_w4a8")
    _assert_useful_repr(api("inspect", str(examples / "w4a8_sglang.safetensors")), "4 layers", "asym_w4a8_int8 x3")
    fixed = api("fix", seed, out=str(tmp_path / "f.safetensors"), target="comfyui", allow_lossy=True)
    _assert_useful_repr(fixed, "ok=True", "3 changes (2 lossless, 1 lossy)", "f.safetensors")
    _assert_useful_repr(fixed.plan, "3 changes")
    lossy = next(c for c in fixed.plan.changes if c.kind == "lossy")
    _assert_useful_repr(lossy, "blocks.0.mlp.fc1", "[lossy]")
    assumed = api("fix", _int8_without_rotation_size(tmp_path), dry_run=True, convrot_groupsize=64)
    _assert_useful_repr(assumed.plan.assumptions[-1], "convrot_groupsize=64")
    migrated = api("migrate", str(examples / "legacy_scaled_fp8.safetensors"), str(tmp_path / "m.safetensors"))
    _assert_useful_repr(migrated, "comfy-legacy-fp8 -> comfy", "3 exact", "m.safetensors")
    q = str(tmp_path / "q.safetensors")
    quantized = api("quantize", dense, q, "nvfp4", progress=False)
    _assert_useful_repr(quantized, "ok=True", "nvfp4 x4", "q.safetensors")
    _assert_useful_repr(quantized.plan, "quantize: 4 of 10 layers")
    converted = api("convert", q, str(tmp_path / "c.safetensors"), "mxfp8", target="comfyui", progress=False)
    _assert_useful_repr(converted, "mxfp8", "c.safetensors")
    _assert_useful_repr(api("dequantize", q, str(tmp_path / "d.safetensors"), progress=False), "4 layers decoded (nvfp4 x4)")
    compared = api("compare", q, dense, progress=False)
    _assert_useful_repr(compared, "10 layers compared", "relative L2 mean")
    assert called == set(FUNCTIONS)  # every API function's result was printed
    from comfyquant.torch import quantize_, save_quantized

    model = torch.nn.Sequential(torch.nn.Linear(256, 256))
    quantize_(model, "fp8")
    path = save_quantized(model, tmp_path / "t.safetensors")
    _assert_useful_repr(load_quantized(torch.nn.Sequential(torch.nn.Linear(256, 256)), path), "1 quantized layers", "ok=True")


def _int8_without_rotation_size(tmp_path) -> str:
    """An unmarked rotated INT8 layer: ``fix --convrot-groupsize`` writes a value it assumes."""
    from builders import int8_layer, write

    return write(tmp_path / "int8.safetensors", int8_layer("blocks.0.attn.qkv", marker=False))
