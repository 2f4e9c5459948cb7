"""Header map vs tensor marker conflicts where the tensors settle the question.

When exactly one side's values make the layer's tensors fit the format description, ``fix``
takes that side without ``--prefer`` and says so, and ``check`` names that side in the
conflict (M020) and in the layer's shape findings.  When both sides fit (a ConvRot size the
shapes cannot confirm) or neither does, ``fix`` still refuses without ``--prefer``.  Layers
are quantized by comfy-kitchen and written by ``safetensors``.
"""

from __future__ import annotations

import json

import torch

from comfyquant import check, codecs, open_checkpoint
from comfyquant.repair.run import fix
from kitchen_fixtures import decoded_layer, make_layer, write_layers

P = "blocks.0.attn.qkv"


def _write(path, layer, header_marker: dict) -> str:
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {layer.prefix: header_marker}})}
    return write_layers(path, [layer], metadata=meta)


def test_tensor_marker_fits_the_tensors(tmp_path):
    layer = make_layer("w4a8_codebook", group_size=16)
    src = _write(tmp_path / "in.safetensors", layer, dict(layer.marker, group_size=32))
    report = check(src)
    m020 = next(f for f in report.findings if f.code == "M020")
    assert "group_size=16 from the tensor marker" in m020.cause and "header map's 32 does not" in m020.cause
    l003 = next(f for f in report.findings if f.code == "L003")
    assert "tensor marker" in l003.cause and "tensor marker" in l003.fix and "re-export" not in l003.fix
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert result.ok and not result.plan.refused
    line = next(c for c in result.plan.changes if "conflict" in c.what)
    assert "took group_size=16 from the tensor marker: the tensors fit it; the header map's 32 does not" in line.what
    with open_checkpoint(dest) as ck:
        assert ck.layers[P].marker["group_size"] == 16
        assert ck.markers.headers and all(r.obj == ck.layers[P].marker for r in ck.markers.sources[P])
    want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker)
    assert torch.equal(decoded_layer(dest, P), want)


def test_header_map_fits_the_tensors(tmp_path):
    layer = make_layer("w4a8_uniform", group_size=32)
    src = _write(tmp_path / "in.safetensors", layer.with_marker(dict(layer.marker, group_size=16)), layer.marker)
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert result.ok
    assert any("took group_size=32 from the header map" in c.what for c in result.plan.changes)
    with open_checkpoint(dest) as ck:
        assert ck.layers[P].marker["group_size"] == 32


def test_conflicting_format_key_resolved_by_the_tensors(tmp_path):
    layer = make_layer("fp8")
    src = _write(tmp_path / "in.safetensors", layer, {"format": "nvfp4"})
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert result.ok
    assert any("took format='float8_e4m3fn' from the tensor marker" in c.what for c in result.plan.changes)
    assert check(dest).ok


def test_key_value_only_one_side_allows(tmp_path):
    """MXFP8's group_size is 32 or absent: a header 16 does not fit the format description."""
    layer = make_layer("mxfp8", n=128, k=128)
    layer = layer.with_marker({"format": "mxfp8", "group_size": 32})
    src = _write(tmp_path / "in.safetensors", layer, {"format": "mxfp8", "group_size": 16})
    result = fix(src, out=str(tmp_path / "out.safetensors"))
    assert result.ok
    assert any("took group_size=32 from the tensor marker" in c.what for c in result.plan.changes)


def test_both_sides_fit_still_needs_prefer(tmp_path):
    """A ConvRot size is not in the shapes: 64 and 256 both fit K=256."""
    layer = make_layer("int8_convrot")
    src = _write(tmp_path / "in.safetensors", layer, dict(layer.marker, convrot_groupsize=64))
    result = fix(src, out=str(tmp_path / "out.safetensors"))
    assert result.plan.refused and "--prefer" in result.plan.refused[0][1]
    assert not (tmp_path / "out.safetensors").exists()
    m020 = next(f for f in check(src).findings if f.code == "M020")
    assert "--prefer" in m020.fix


def test_neither_side_fits_still_needs_prefer(tmp_path):
    layer = make_layer("w4a8_codebook", group_size=16)
    src = _write(
        tmp_path / "in.safetensors", layer.with_marker(dict(layer.marker, group_size=64)), dict(layer.marker, group_size=32)
    )
    result = fix(src, out=str(tmp_path / "out.safetensors"))
    assert result.plan.refused and "--prefer" in result.plan.refused[0][1]
    l003 = next(f for f in check(src).findings if f.code == "L003")
    assert "re-export" in l003.fix


def test_explicit_prefer_still_wins(tmp_path):
    layer = make_layer("w4a8_codebook", group_size=16)
    src = _write(tmp_path / "in.safetensors", layer, dict(layer.marker, group_size=32))
    result = fix(src, out=str(tmp_path / "out.safetensors"), prefer="header")
    assert any("--prefer header" in c.what for c in result.plan.changes)
    assert not result.ok  # the header's 32 does not fit: the re-check says so
