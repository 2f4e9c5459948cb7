"""float8_e5m2, the format added by following docs/design.md's "How to add a format": one
package (``formats/float8_e5m2/``), these tests and the docs.  Every command handles it, from
files comfy-kitchen writes and from files comfyquant writes, bit-exact with comfy-kitchen."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torch
from comfy_kitchen.tensor import QuantizedTensor
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant import codecs
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.formats import registry
from kitchen_fixtures import make_layer, make_weight, write_layers

NAME = "float8_e5m2"
PREFIX = "blocks.0.attn.qkv"
SRC = Path(comfyquant.__file__).resolve().parent


def _kitchen_file(tmp_path, marker="comfyui") -> tuple[str, object]:
    layer = make_layer("fp8_e5m2", prefix=PREFIX, n=64, k=256, marker=marker)
    return write_layers(tmp_path / "e5m2.safetensors", [layer]), layer


def test_the_format_lives_in_its_own_package():
    fmt = registry.FORMATS[NAME]
    assert fmt.codec_module == "comfyquant.formats.float8_e5m2.codec"
    assert fmt.params_module.startswith("comfyquant.formats.float8_e5m2")
    assert registry.lookup("e5m2") is fmt
    # Outside its package the name is written only in the runtime profiles (what each runtime
    # says about it): no command, rule or registry names it (``torch.float8_e5m2``, the
    # element type numerics use, is an attribute, not the format's name).
    hits = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("formats/float8_e5m2/", "targets/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME in node.value:
                hits.append(f"{rel}:{node.lineno}")
    assert hits == []


def test_check_and_inspect_a_kitchen_file(tmp_path, capsys):
    path, _ = _kitchen_file(tmp_path)
    report = comfyquant.check(path)
    assert [f.code for f in report.findings if f.severity == "error" and "sglang" not in (f.targets or ())] == []
    assert report.verdicts["comfyui"].loads and report.verdicts["comfy-kitchen"].loads
    # SGLang has no float8_e5m2 (0.5.23 resolve_comfy_checkpoint_quantization, R0): its verdict is the runtime's own message
    assert "float8_e5m2" in report.verdicts["sglang"].first.message
    inv = comfyquant.inspect(path)
    [row] = [r for r in inv.rows if r.name == PREFIX]
    assert row.format == NAME and (row.n, row.k) == (64, 256)
    assert main(["inspect", path]) == 0
    assert NAME in capsys.readouterr().out


def test_dequantize_is_bit_exact_with_kitchen(tmp_path):
    path, layer = _kitchen_file(tmp_path)
    out = str(tmp_path / "dense.safetensors")
    comfyquant.dequantize(path, out, dtype="bf16", progress=False)
    got = load_file(out)[f"{PREFIX}.weight"]
    t = layer.tensors
    q = QuantizedTensor.from_float(make_weight(64, 256), "TensorCoreFP8Layout", dtype=torch.float8_e5m2)
    assert torch.equal(t["weight"].view(torch.uint8), q.state_dict("weight")["weight"].view(torch.uint8))
    ref = q.dequantize()
    assert got.dtype == ref.dtype and torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_quantize_writes_what_kitchen_writes(tmp_path):
    w = make_weight(64, 256)
    src = str(tmp_path / "dense.safetensors")
    save_file({f"{PREFIX}.weight": w, f"{PREFIX}.bias": torch.zeros(64, dtype=torch.bfloat16)}, src)
    out = str(tmp_path / "q.safetensors")
    result = comfyquant.quantize(src, out, "e5m2", target="comfyui", progress=False)
    assert result.ok
    sd = load_file(out)
    assert json.loads(bytes(sd[f"{PREFIX}.comfy_quant"].tolist()))["format"] == NAME
    ref = QuantizedTensor.from_float(w, "TensorCoreFP8Layout", dtype=torch.float8_e5m2).state_dict("weight")
    assert torch.equal(sd[f"{PREFIX}.weight"].view(torch.uint8), ref["weight"].view(torch.uint8))
    assert torch.equal(sd[f"{PREFIX}.weight_scale"], ref["weight_scale"].reshape(sd[f"{PREFIX}.weight_scale"].shape))
    # SGLang cannot load it: quantize for --target sglang refuses the format outright
    with pytest.raises(InputError, match="float8_e5m2"):
        comfyquant.quantize(src, str(tmp_path / "s.safetensors"), "e5m2", target="sglang", progress=False)
    assert not os.path.exists(tmp_path / "s.safetensors")


def test_convert_both_ways_through_e4m3(tmp_path):
    path, layer = _kitchen_file(tmp_path)
    e4 = str(tmp_path / "e4m3.safetensors")
    assert comfyquant.convert(path, e4, "fp8", target="comfyui", progress=False).ok
    back = str(tmp_path / "back.safetensors")
    assert comfyquant.convert(e4, back, "e5m2", target="comfyui", progress=False).ok
    sd = load_file(back)
    assert sd[f"{PREFIX}.weight"].dtype == torch.float8_e5m2
    # codec round trip: what convert decoded is what the codec decodes
    dense = codecs.get(NAME).decode(
        {k.split(".")[-1]: v for k, v in sd.items() if k.startswith(PREFIX)}, {"format": NAME}, dtype=torch.float32
    )
    assert dense.shape == (64, 256) and torch.isfinite(dense).all()


def test_fix_repairs_a_downcast_scale(tmp_path):
    """A BF16 weight_scale (a common writer slip) is upcast exactly by fix."""
    path, layer = _kitchen_file(tmp_path)
    sd = load_file(path)
    sd[f"{PREFIX}.weight_scale"] = sd[f"{PREFIX}.weight_scale"].to(torch.bfloat16)
    broken = str(tmp_path / "broken.safetensors")
    save_file(sd, broken)
    assert [f.code for f in comfyquant.check(broken).findings if f.tensor == f"{PREFIX}.weight_scale"] == ["L002"]
    fixed = str(tmp_path / "fixed.safetensors")
    result = comfyquant.fix(broken, out=fixed, target="comfy-kitchen")
    assert result.after.ok and not [f for f in result.after.findings if f.tensor == f"{PREFIX}.weight_scale"]
    assert load_file(fixed)[f"{PREFIX}.weight_scale"].dtype == torch.float32
