"""The package's structure: the import-layer contract, and formats as self-registering packages.

Adding a format means adding one package under ``formats/``: these tests prove the registry
finds such a package with no other edit (on a copy of the sources), and that every format a
package declares is complete enough for the commands that read the registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import comfyquant
from builders import marker_tensor, ones
from comfyquant.formats import registry
from comfyquant.io.writer import write_safetensors

SRC = Path(comfyquant.__file__).resolve().parent.parent
ROOT = SRC.parent


def test_import_layer_contract_is_kept():
    """`lint-imports` (import-linter, a dev dependency) reads pyproject.toml's contract."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (light environment)")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_every_format_package_is_registered():
    pkgs = [p for p in (SRC / "comfyquant" / "formats").iterdir() if (p / "__init__.py").is_file()]
    assert pkgs, "no format packages found"
    import importlib

    for p in pkgs:
        module = importlib.import_module(f"comfyquant.formats.{p.name}")
        declared = getattr(module, "FORMATS", ())
        assert declared, f"formats/{p.name} declares no FORMATS"
        for fmt in declared:
            assert registry.FORMATS[fmt.name] is fmt
    assert list(registry.FORMATS) == [f.name for f in sorted(registry.FORMATS.values(), key=lambda f: (f.order, f.name))]


def test_inference_order_is_the_formats_rank():
    ranked = [f for f in registry.FORMATS.values() if f.infer_rank is not None]
    assert list(registry._INFERENCE_ORDER) == sorted(ranked, key=lambda f: f.infer_rank)
    assert len({f.infer_rank for f in ranked}) == len(ranked), "two formats share an inference rank"


_NEW_PACKAGE = '''
"""A test-only format: per-tensor FP8 E4M3 under another name."""
from ..base import WEIGHT, Format, Slot
from ..common import BIAS_SLOT, FORMAT_KEY, dense_geometry

ZZ = Format(
    name="zz_test_fp8",
    title="test format",
    slots=(Slot("weight", "F8_E4M3", "(N, K)", kind=WEIGHT), Slot("weight_scale", "F32", "()", positive=True), BIAS_SLOT),
    keys=(FORMAT_KEY,),
    geometry=dense_geometry,
    bits_text="8",
    loaders=frozenset({"comfyui"}),
    order=50,
)
FORMATS = (ZZ,)
'''


def test_a_new_format_package_is_found_with_no_other_edit(tmp_path):
    """Copy the sources, add one package, and check a file of the new format."""
    src = tmp_path / "src"
    shutil.copytree(SRC / "comfyquant", src / "comfyquant", ignore=shutil.ignore_patterns("__pycache__"))
    pkg = src / "comfyquant" / "formats" / "zz_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_NEW_PACKAGE)
    f = tmp_path / "m.safetensors"
    write_safetensors(
        str(f),
        {
            "l.weight": ones("F8_E4M3", (4, 8)),
            "l.weight_scale": ones("F32", ()),
            "l.comfy_quant": marker_tensor({"format": "zz_test_fp8"}),
        },
    )
    code = textwrap.dedent(f"""
        import json, comfyquant
        from comfyquant.formats import registry
        r = comfyquant.check([{str(f)!r}], target="comfyui", deep=True)
        with comfyquant.open_checkpoint({str(f)!r}) as ckpt:
            fmt = ckpt.layers["l"].format_name
        print(json.dumps({{"names": list(registry.FORMATS), "codes": [x.code for x in r.findings], "format": fmt,
                           "loads": r.verdicts["comfyui"].loads}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "zz_test_fp8" in got["names"]
    assert got["format"] == "zz_test_fp8"
    # The canonical rules accept the layer from its description alone; the runtime profiles model
    # what the real runtimes know, and none of them knows this format.
    assert [c for c in got["codes"] if "." not in c] == [], got
    assert "comfyui.format" in got["codes"] and not got["loads"], got
