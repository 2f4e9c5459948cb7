"""``fix``: values the file cannot confirm are assumptions, and ``--reference`` measures them.

A ConvRot size given with ``--convrot-groupsize`` (or a reader's default written for a
missing key, or one side of a conflict the tensors fit equally) is not in the file and not
in the tensors' shapes: the plan and the summary say "assumed", never "verified".  With the
original dense weights (``--reference``) every repaired layer is decoded and measured: a
wrong value (a layer made with ConvRot 256, repaired with 64) decodes to garbage and the
repair is refused, a right one passes with its error printed.  Layers are quantized by
comfy-kitchen from seeded weights, which are also written as the dense reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from comfyquant import check, open_checkpoint
from comfyquant.cli import main
from comfyquant.errors import ComfyQuantError
from comfyquant.installing import extra_command
from comfyquant.render import render_fix
from comfyquant.repair.reference import ReferenceError
from comfyquant.repair.run import ReferenceRefused, fix
from kitchen_fixtures import make_layer, make_weight, write_layers

P = "blocks.0.attn.qkv"


def _without(layer, *keys):
    return layer.with_marker({k: v for k, v in layer.marker.items() if k not in keys})


def _reference(path, layers, dtype=torch.bfloat16) -> str:
    """The dense original of each kitchen layer (make_layer's seeded weight) and its bias."""
    out = {}
    for i, layer in enumerate(layers):
        out[f"{layer.prefix}.weight"] = make_weight(layer.n, layer.k, dtype, seed=i)
        out[f"{layer.prefix}.bias"] = layer.tensors["bias"]
    save_file(out, str(path))
    return str(path)


def _int8(seed=0, prefix=P, n=64, k=256):
    return make_layer("int8_convrot", prefix=prefix, n=n, k=k, seed=seed, convrot_groupsize=256)


def test_a_user_supplied_convrot_size_is_an_assumption(tmp_path):
    src = write_layers(tmp_path / "in.safetensors", [_without(_int8(), "convrot_groupsize")])
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest, convrot_groupsize=64)
    assert [(a.layer, a.key, a.value) for a in result.plan.assumptions] == [(P, "convrot_groupsize", 64)]
    text = render_fix(result)
    assert "assumed: convrot_groupsize=64 (given by --convrot-groupsize; the file cannot confirm it)" in text
    assert "verified" not in text.replace("not verified", "")
    with safe_open(dest, framework="pt") as f:
        stamp = json.loads(f.metadata()["comfyquant"])
    assert stamp["assumed"] == [f"{P}: convrot_groupsize=64 (given by --convrot-groupsize)"]


def test_unmarked_layer_rotation_and_size_are_assumptions(tmp_path):
    src = write_layers(tmp_path / "in.safetensors", [_int8().with_marker(None)])
    result = fix(src, out=str(tmp_path / "out.safetensors"), convrot_groupsize=256)
    assert {a.key: a.value for a in result.plan.assumptions} == {"convrot": True, "convrot_groupsize": 256}


def test_values_the_shapes_single_out_are_not_assumptions(tmp_path):
    """A W4A8 marker without sizes: group_size 16 is the only one weight_s_rel's shape fits;
    the ConvRot size is the readers' default, which the file cannot confirm."""
    layer = _without(make_layer("w4a8_codebook"), "group_size", "convrot_groupsize")
    src = write_layers(tmp_path / "in.safetensors", [layer])
    result = fix(src, out=str(tmp_path / "out.safetensors"))
    assert result.ok
    assert [(a.key, a.value, a.source) for a in result.plan.assumptions] == [
        ("convrot_groupsize", 256, "the readers' default for a missing key")
    ]


def test_a_stated_marker_assumes_nothing(tmp_path):
    layer = _int8().with_tensor("weight_scale", _int8().tensors["weight_scale"].reshape(-1))  # [N]: fixable
    src = write_layers(tmp_path / "in.safetensors", [layer])
    result = fix(src, out=str(tmp_path / "out.safetensors"))
    assert result.ok and not result.plan.assumptions
    assert "(verified: re-checked" in render_fix(result)


def test_prefer_between_values_the_tensors_both_fit_is_an_assumption(tmp_path):
    layer = _int8()
    meta = {
        "_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {P: dict(layer.marker, convrot_groupsize=64)}})
    }
    src = write_layers(tmp_path / "in.safetensors", [layer], metadata=meta)
    result = fix(src, out=str(tmp_path / "out.safetensors"), prefer="header")
    [a] = result.plan.assumptions
    assert (a.key, a.value) == ("convrot_groupsize", 64) and "--prefer header over 256" in a.source


def test_reference_refuses_a_wrong_convrot_size(tmp_path):
    layer = _int8()
    src = write_layers(tmp_path / "in.safetensors", [_without(layer, "convrot_groupsize")])
    ref = _reference(tmp_path / "dense.safetensors", [layer])
    dest = tmp_path / "out.safetensors"
    with pytest.raises(ReferenceRefused) as exc:
        fix(src, out=str(dest), convrot_groupsize=64, reference=ref)
    message = str(exc.value)
    assert P in message and "relative error 1.0" in message and "convrot_groupsize=64" in message
    assert "\n" not in message and not dest.exists()
    code = main(["fix", src, "-o", str(dest), "--convrot-groupsize", "64", "--reference", ref])
    assert code == 2 and not dest.exists()


def test_reference_passes_the_right_convrot_size_and_prints_the_error(tmp_path, capsys):
    layer = _int8()
    src = write_layers(tmp_path / "in.safetensors", [_without(layer, "convrot_groupsize")])
    ref = _reference(tmp_path / "dense.safetensors", [layer])
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest, convrot_groupsize=256, reference=ref)
    [m] = result.plan.measured
    assert result.ok and m.ok and m.layer == P
    assert 0 < m.error < 0.05 and m.error == pytest.approx(m.fresh, rel=1e-6)  # comfy-kitchen wrote it: same bits
    text = render_fix(result)
    assert f"{P}: relative error {m.error:.4f}" in text and "measured against the original weights" in text
    assert check(dest).ok


def test_reference_measures_a_lossy_repair(tmp_path):
    """6-bit rows re-quantized to 4-bit for SGLang: the error is that of 4-bit W4A8 (plus the
    6-bit rounding), within the format's bound."""
    layer = make_layer("w6a8", n=64, k=256)
    src = write_layers(tmp_path / "in.safetensors", [layer])
    ref = _reference(tmp_path / "dense.safetensors", [layer])
    result = fix(src, out=str(tmp_path / "out.safetensors"), target="sglang", allow_lossy=True, reference=ref)
    [m] = result.plan.measured
    assert result.ok and m.ok and m.fresh < m.error < 2 * m.fresh
    assert result.plan.requant[P].error is not None


def test_reference_problems_are_one_line_errors(tmp_path):
    layer = _int8()
    src = write_layers(tmp_path / "in.safetensors", [_without(layer, "convrot_groupsize")])
    other = _reference(tmp_path / "other.safetensors", [make_layer("int8_convrot", prefix="blocks.9.ff", n=64)])
    wrong = _reference(tmp_path / "wrong.safetensors", [make_layer("int8_convrot", n=32, k=256)])
    dest = tmp_path / "out.safetensors"
    cases = [
        (other, f"has no tensor '{P}.weight'"),
        (wrong, "has shape [32, 256]"),
        (src, "is I8, not a dense float"),
        (str(tmp_path / "missing.safetensors"), "missing.safetensors"),
    ]
    for ref, text in cases:
        with pytest.raises(ComfyQuantError) as exc:
            fix(src, out=str(dest), convrot_groupsize=256, reference=ref)
        assert text in str(exc.value) and "\n" not in str(exc.value)
        assert main(["fix", src, "-o", str(dest), "--convrot-groupsize", "256", "--reference", ref]) == 2
        assert not dest.exists()


def test_reference_needs_torch_on_a_light_install(tmp_path):
    layer = _int8()
    src = write_layers(tmp_path / "in.safetensors", [_without(layer, "convrot_groupsize")])
    ref = _reference(tmp_path / "dense.safetensors", [layer])
    code = "import sys; sys.modules['torch'] = None\nfrom comfyquant.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "fix",
            src,
            "-o",
            str(tmp_path / "o.safetensors"),
            "--convrot-groupsize",
            "256",
            "--reference",
            ref,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2
    assert r.stderr == f"comfyquant fix: needs torch, which is not installed ({extra_command('torch')})\n"
    assert not (tmp_path / "o.safetensors").exists()


def test_a_refused_conflict_keeps_its_markers_as_found(tmp_path):
    """Other repairs are written; the layer whose conflict fix cannot settle keeps both of its
    markers unchanged (losing them would leave an unmarked INT8 weight)."""
    layer = _int8()
    fp8 = make_layer("fp8", prefix="blocks.1.ff", seed=3)
    fp8 = fp8.with_tensor("weight_scale", fp8.tensors["weight_scale"].reshape(1))
    header = dict(layer.marker, convrot_groupsize=64)
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {P: header}})}
    src = write_layers(tmp_path / "in.safetensors", [layer, fp8], metadata=meta)
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert [r[0] for r in result.plan.refused] == [P]
    with open_checkpoint(dest) as ck:
        kinds = {r.kind: r.obj for r in ck.markers.sources[P]}
        assert kinds == {"header": header, "tensor": layer.marker}
        assert ck.tensors["blocks.1.ff.weight_scale"].shape == ()
    assert not any(f.code == "M023" for f in check(dest).findings)


def test_reference_errors_are_reference_errors(tmp_path):
    layer = _int8()
    src = write_layers(tmp_path / "in.safetensors", [_without(layer, "convrot_groupsize")])
    other = _reference(tmp_path / "other.safetensors", [make_layer("int8_convrot", prefix="blocks.9.ff", n=64)])
    with pytest.raises(ReferenceError):
        fix(src, out=str(tmp_path / "out.safetensors"), convrot_groupsize=256, reference=other)
