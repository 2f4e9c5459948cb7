"""``comfyquant comfyui install``: the shim it writes, what it refuses, what it says.

A ComfyUI folder is only its three landmarks here (``main.py``, ``nodes.py``, ``comfy/``);
``tests/test_comfyui.py`` installs into a real one and runs the nodes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from comfyquant.cli import main
from comfyquant.commands.comfyui import SHIM_MARK
from comfyquant.installing import install_command


@pytest.fixture
def comfyui(tmp_path):
    root = tmp_path / "ComfyUI"
    (root / "comfy").mkdir(parents=True)
    (root / "main.py").write_text("")
    (root / "nodes.py").write_text("")
    (root / "custom_nodes").mkdir()
    return root


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_writes_a_shim_that_imports_the_node_pack(comfyui, capsys):
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    shim = comfyui / "custom_nodes" / "comfyquant" / "__init__.py"
    assert rc == 0 and f"wrote {shim}" in out and "imports comfyquant from" in out and err == ""
    assert shim.read_text().startswith(SHIM_MARK)
    # the shim, imported as ComfyUI imports a custom node, gives the three names
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('comfyquant_shim', {str(shim)!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "import os; print(sorted(m.NODE_CLASS_MAPPINGS), os.path.isfile(os.path.join(m.WEB_DIRECTORY, 'comfyquant.js')), "
        "'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "['ComfyQuantCheck', 'ComfyQuantLoader', 'ComfyQuantQuantizeSave'] True False", proc.stderr
    # installing again replaces its own shim
    assert run(capsys, "comfyui", "install", str(comfyui))[0] == 0


@pytest.mark.parametrize("missing", ["main.py", "nodes.py", "comfy"])
def test_refuses_a_folder_that_is_not_a_comfyui(comfyui, capsys, missing):
    target = comfyui / missing
    target.rmdir() if target.is_dir() else target.unlink()
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 2 and out == ""
    assert (
        err.strip()
        == f"comfyquant: {comfyui}: not a ComfyUI folder (no {missing + '/' if missing == 'comfy' else missing}); nothing was written"
    )
    assert not (comfyui / "custom_nodes" / "comfyquant").exists()


@pytest.mark.parametrize("foreign", ["other shim", "extra file", "a file"])
def test_never_replaces_what_it_did_not_write(comfyui, capsys, foreign):
    target = comfyui / "custom_nodes" / "comfyquant"
    if foreign == "a file":
        target.write_text("someone's")
    else:
        target.mkdir()
        (target / "__init__.py").write_text("# someone else's node pack\n")
        if foreign == "extra file":
            (target / "__init__.py").write_text(f"{SHIM_MARK}\n")
            (target / "nodes.py").write_text("")
    before = {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()}
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 2 and out == "" and "nothing was replaced" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()} == before


def test_says_so_when_comfyuis_python_cannot_import_comfyquant(comfyui, capsys, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'comfyquant'\" >&2\nexit 1\n")
    python.chmod(0o755)
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui), "--python", str(python))
    assert rc == 1 and "wrote" in out
    assert err.strip() == (
        f"comfyquant is not importable from {python} (ModuleNotFoundError: No module named 'comfyquant'): "
        f"ComfyUI will not load the nodes until it is; install it there: {install_command(str(python))}"
    )
    rc, _out, err = run(capsys, "comfyui", "install", str(comfyui), "--python", str(tmp_path / "nope"))
    assert rc == 1 and "cannot run it" in err


def test_an_unwritable_custom_nodes_is_one_line(comfyui, capsys):
    (comfyui / "custom_nodes").rmdir()
    (comfyui / "custom_nodes").write_text("not a folder")
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"comfyquant: {comfyui / 'custom_nodes' / 'comfyquant'}: cannot write (")
    assert (comfyui / "custom_nodes").read_text() == "not a folder"


def _interpreter(path, importable: bool):
    """An executable standing for an environment's Python: this one (which imports comfyquant),
    or one whose import of comfyquant fails as a bare environment's does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if importable:
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    else:
        path.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'comfyquant'\" >&2\nexit 1\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "where, how",
    [
        ("ComfyUI/venv/bin/python3", "found in COMFYUI_DIR/venv"),
        ("ComfyUI/.venv/bin/python", "found in COMFYUI_DIR/.venv"),
        ("python_embeded/python.exe", "found in python_embeded"),  # the Windows portable build's layout
    ],
)
def test_without_python_it_checks_comfyuis_own_interpreter(comfyui, capsys, tmp_path, where, how):
    """Without --python the command finds ComfyUI's Python by the documented rule and asks it,
    not the Python running the command."""
    python = _interpreter(tmp_path / where, importable=True)
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 0 and err == "", err
    assert f"ComfyUI's Python: {python} ({how})" in out and f"{python} imports comfyquant from" in out


def test_says_how_to_fix_it_when_comfyuis_venv_cannot_import_comfyquant(comfyui, capsys):
    python = _interpreter(comfyui / "venv" / "bin" / "python3", importable=False)
    rc, out, err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 1 and f"ComfyUI's Python: {python} (found in COMFYUI_DIR/venv)" in out
    assert err.strip() == (
        f"comfyquant is not importable from {python} (ModuleNotFoundError: No module named 'comfyquant'): "
        f"ComfyUI will not load the nodes until it is; install it there: {install_command(str(python))}; "
        "if ComfyUI runs on another Python, pass it with --python PATH"
    )


def test_without_an_environment_it_says_which_python_it_asked(comfyui, capsys):
    rc, out, _err = run(capsys, "comfyui", "install", str(comfyui))
    assert rc == 0
    assert (
        f"ComfyUI's Python: {sys.executable} (no venv/, .venv/ or python_embeded/ found with the ComfyUI folder: "
        "the Python running this command)" in out
    )


def test_python_given_wins_over_the_venv(comfyui, capsys, tmp_path):
    _interpreter(comfyui / "venv" / "bin" / "python3", importable=False)
    rc, out, _err = run(capsys, "comfyui", "install", str(comfyui), "--python", sys.executable)
    assert rc == 0 and f"ComfyUI's Python: {sys.executable} (given with --python)" in out
