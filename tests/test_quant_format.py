"""File-level ``quant_format=mxfp8`` (SGLang 0.5.23 ``inspect_comfy_quant_markers``): SGLang gives every unmarked F8/I8/U8 weight an
``{"format": "mxfp8"}`` marker; ComfyUI and comfy-kitchen never read the key.

``dequantize``, ``convert`` and ``fix`` read such files as SGLang does: the layers decode
exactly as the same layers with per-layer markers, and ``fix`` writes those markers.  Files
are written by ``safetensors`` from comfy-kitchen layers.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

import comfyquant
from comfyquant import check
from comfyquant.dequantizer import DequantizeError
from comfyquant.errors import InputError
from comfyquant.repair.run import fix
from kitchen_fixtures import dense_layer, make_layer, write_layers, write_sharded


def _u8_scales(layer):
    """The scale bytes relabelled U8, as SGLang's quant_format path requires."""
    return layer.with_tensor("weight_scale", layer.tensors["weight_scale"].view(torch.uint8))


def _layers(marked: bool):
    """Two MXFP8 layers whose blocked scales are exactly SGLang's U8 [N, K/32], one stored as
    comfy-kitchen writes it (F8_E8M0 blocked, N=32: X1 for SGLang but still MXFP8), a dense
    layer and a norm."""
    out = [
        _u8_scales(make_layer("mxfp8", prefix="blocks.0.attn.qkv", n=128, k=128, seed=1)),
        _u8_scales(make_layer("mxfp8", prefix="blocks.1.ff", n=256, k=256, seed=2, dtype=torch.float16)),
        make_layer("mxfp8", prefix="blocks.2.out", n=32, k=256, seed=3),
        dense_layer("blocks.2.norm", (256,), dtype=torch.float32),
        dense_layer("head", (64, 256), bias=True),
    ]
    return [x if marked or x.marker is None else x.with_marker(None) for x in out]


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same_tensors(a: str, b: str) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].shape == tb[name].shape, name
        assert _bits(ta[name]) == _bits(tb[name]), name


@pytest.mark.parametrize("value", ["mxfp8", "MXFP8"])
@pytest.mark.parametrize("dtype", [None, "f32"])
def test_dequantize_reads_quant_format_as_sglang(tmp_path, value, dtype):
    qf = write_layers(tmp_path / "qf.safetensors", _layers(marked=False), metadata={"quant_format": value})
    marked = write_layers(tmp_path / "marked.safetensors", _layers(marked=True))
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    summary = comfyquant.dequantize(qf, a, dtype=dtype, progress=False)
    assert summary.layers == {"mxfp8": 3}
    comfyquant.dequantize(marked, b, dtype=dtype, progress=False)
    _same_tensors(a, b)
    with safe_open(a, framework="pt") as f:
        assert "quant_format" not in (f.metadata() or {})  # it described tensors that no longer exist


def test_dequantize_quant_format_over_shards(tmp_path):
    layers = _layers(marked=False)
    write_sharded(tmp_path / "qf", [layers[:2], layers[2:]], metadata={"quant_format": "mxfp8"})
    marked = _layers(marked=True)
    write_sharded(tmp_path / "marked", [marked[:2], marked[2:]])
    comfyquant.dequantize(str(tmp_path / "qf"), str(tmp_path / "a"), progress=False)
    comfyquant.dequantize(str(tmp_path / "marked"), str(tmp_path / "b"), progress=False)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        _same_tensors(str(tmp_path / "a" / name), str(tmp_path / "b" / name))


def test_quant_format_ignored_when_shards_disagree(tmp_path):
    """SGLang applies quant_format only when every file that sets it sets mxfp8."""
    layers = _layers(marked=False)
    paths = write_sharded(tmp_path / "qf", [layers[:2]], metadata={"quant_format": "mxfp8"})
    write_layers(tmp_path / "qf" / "extra.safetensors", layers[2:], metadata={"quant_format": "fp8"})
    with pytest.raises(DequantizeError, match=r"M023"):
        comfyquant.dequantize(
            [*paths, str(tmp_path / "qf" / "extra.safetensors")], str(tmp_path / "a.safetensors"), progress=False
        )


def test_dequantize_refuses_a_quant_format_layer_that_is_not_mxfp8(tmp_path):
    """SGLang makes an unmarked INT8 weight MXFP8 too (and then refuses it: X1)."""
    layers = _layers(marked=False) + [make_layer("int8_convrot", prefix="blocks.3.mlp", seed=4).with_marker(None)]
    qf = write_layers(tmp_path / "qf.safetensors", layers, metadata={"quant_format": "mxfp8"})
    with pytest.raises(DequantizeError) as exc:
        comfyquant.dequantize(qf, str(tmp_path / "a.safetensors"), progress=False)
    assert "blocks.3.mlp" in str(exc.value) and "quant_format" in str(exc.value)
    assert not (tmp_path / "a.safetensors").exists()


def test_convert_reads_quant_format_as_sglang(tmp_path):
    qf = write_layers(tmp_path / "qf.safetensors", _layers(marked=False), metadata={"quant_format": "mxfp8"})
    marked = write_layers(tmp_path / "marked.safetensors", _layers(marked=True))
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    assert comfyquant.convert(qf, a, "nvfp4", target="comfyui", progress=False).ok
    assert comfyquant.convert(marked, b, "nvfp4", target="comfyui", progress=False).ok
    _same_tensors(a, b)


def test_convert_copies_a_quant_format_layer_with_its_marker(tmp_path):
    """A layer convert keeps (excluded) needs its own marker: the output drops quant_format."""
    qf = write_layers(tmp_path / "qf.safetensors", _layers(marked=False), metadata={"quant_format": "mxfp8"})
    out = str(tmp_path / "a.safetensors")
    assert comfyquant.convert(qf, out, "nvfp4", exclude=["blocks.0"], target="comfyui", progress=False).ok
    with comfyquant.open_checkpoint(out) as ck:
        assert ck.layers["blocks.0.attn.qkv"].marker == {"format": "mxfp8"}
        assert ck.layers["blocks.1.ff"].marker["format"] == "nvfp4"
    assert check(out, target="comfyui").ok


@pytest.mark.parametrize("target", ["comfyui", "all"])
def test_fix_writes_the_markers_quant_format_implies(tmp_path, target):
    qf = write_layers(
        tmp_path / "qf.safetensors", _layers(marked=False)[:2] + _layers(False)[3:], metadata={"quant_format": "mxfp8"}
    )
    assert not check(qf, target="comfyui").ok  # ComfyUI does not read quant_format
    dest = str(tmp_path / "fixed.safetensors")
    result = fix(qf, out=dest, target=target)
    if target == "all":
        # SGLang needs these scales labelled U8 in a quant_format file, comfy-kitchen itself takes
        # only F8_E8M0 (ComfyUI views either): no labelling satisfies both, and fix says so
        remaining = [f for f in result.after.findings if f.severity == "error"]
        assert remaining and all(f.code == "L002" and f.targets == ["comfy-kitchen"] for f in remaining)
    else:
        assert result.ok
    assert any("quant_format=mxfp8 implies" in c.what for c in result.plan.changes)
    assert check(dest, target="comfyui").ok and check(dest, target="sglang").ok
    with comfyquant.open_checkpoint(dest) as ck:
        assert ck.layers["blocks.0.attn.qkv"].marker == {"format": "mxfp8"}
        assert ck.layers["head"].marker is None
        assert ck.metadata().get("quant_format") == "mxfp8"  # kept: SGLang loads the file as before
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    comfyquant.dequantize(dest, a, progress=False)
    comfyquant.dequantize(qf, b, progress=False)
    _same_tensors(a, b)


def test_fix_refuses_a_quant_format_layer_that_is_not_mxfp8(tmp_path):
    layers = _layers(marked=False)[:1] + [make_layer("int8_convrot", prefix="blocks.3.mlp", seed=4).with_marker(None)]
    qf = write_layers(tmp_path / "qf.safetensors", layers, metadata={"quant_format": "mxfp8"})
    result = fix(qf, out=str(tmp_path / "fixed.safetensors"), target="comfyui", convrot_groupsize=256)
    refused = dict(result.plan.refused)
    assert "quant_format=mxfp8" in refused["blocks.3.mlp"] and "int8_tensorwise" in refused["blocks.3.mlp"]


def test_convert_refuses_a_quant_format_layer_that_is_not_mxfp8(tmp_path):
    layers = _layers(marked=False)[:1] + [make_layer("int8_convrot", prefix="blocks.3.mlp", seed=4).with_marker(None)]
    qf = write_layers(tmp_path / "qf.safetensors", layers, metadata={"quant_format": "mxfp8"})
    with pytest.raises(InputError, match=r"blocks\.3\.mlp.*quant_format"):
        comfyquant.convert(qf, str(tmp_path / "a.safetensors"), "nvfp4", target="comfyui", progress=False)


def test_quant_format_file_from_comfyquant_quantize(tmp_path):
    """A file ``comfyquant quantize`` wrote, re-saved the way SGLang-only exporters store it:
    markers dropped, ``quant_format=mxfp8`` set, scales relabelled U8."""
    from safetensors.torch import save_file

    dense = {
        "blocks.0.ff.weight": (torch.randn(256, 128, generator=torch.Generator().manual_seed(7)) * 0.02).to(torch.bfloat16),
        "blocks.0.ff.bias": torch.zeros(256, dtype=torch.bfloat16),
        "blocks.1.ff.weight": (torch.randn(128, 256, generator=torch.Generator().manual_seed(8)) * 0.02).to(torch.bfloat16),
        "blocks.1.ff.bias": torch.zeros(128, dtype=torch.bfloat16),
    }
    save_file(dense, str(tmp_path / "dense.safetensors"))
    marked = str(tmp_path / "marked.safetensors")
    assert comfyquant.quantize(str(tmp_path / "dense.safetensors"), marked, "mxfp8", progress=False).ok
    t = {
        n: (v.view(torch.uint8) if n.endswith("weight_scale") else v)
        for n, v in _tensors(marked).items()
        if not n.endswith(".comfy_quant")
    }
    qf = str(tmp_path / "qf.safetensors")
    save_file(t, qf, metadata={"quant_format": "mxfp8"})
    assert check(qf, target="sglang").ok
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    comfyquant.dequantize(qf, a, progress=False)
    comfyquant.dequantize(marked, b, progress=False)
    _same_tensors(a, b)
