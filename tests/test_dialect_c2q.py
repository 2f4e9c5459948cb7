"""convert_to_quant's own formats (dialect ``convert-to-quant``).

Files are built as silveroxides/convert_to_quant builds them: the quantize/dequantize pairs
below restate ``convert_to_quant/comfy/quant_ops.py`` (``RowWiseFP8Layout``,
``BlockWiseFP8Layout``, ``BlockWiseINT8Layout`` with ``is_weight=True``), ``block3d`` is the
``[N, K/B, 1]`` layout ``formats/format_migration.py`` names ``float8_e4m3fn_block3d``, and
``hybrid`` restates ``formats/hybrid_mxfp8_conversion.py::convert_to_hybrid_mxfp8`` on an
``mxfp8`` layer comfy-kitchen wrote.  Markers are written as ctq writes them (tensor markers with
``group_size`` for the block formats, ``orig_dtype``).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects import registry
from comfyquant.dialects.base import EXACT, LOSSY, REFUSED
from kitchen_fixtures import make_layer

NAME = "convert-to-quant"
FP8_MAX = 448.0


def marker(d: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(d).encode("utf-8")), dtype=torch.uint8)


def weight(n=128, k=256, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:7] *= 30
    return w


def rowwise(w):
    quant = FP8_MAX / w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    q = torch.clamp(w * quant, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, (1.0 / quant).squeeze(1).to(torch.float32)


def rowwise_dequant(q, scale):
    return q.to(torch.float32) * scale.unsqueeze(1)


def tiles(w, bs):
    m, n = w.shape
    blocked = w.reshape(m // bs, bs, n // bs, bs).permute(0, 2, 1, 3)
    quant = FP8_MAX / blocked.abs().amax(dim=(2, 3)).clamp_min(1e-12)
    q = torch.clamp(blocked * quant.unsqueeze(-1).unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.permute(0, 2, 1, 3).reshape(m, n), (1.0 / quant).to(torch.float32)


def int8_tiles(w, bs):
    m, n = w.shape
    blocked = w.reshape(m // bs, bs, n // bs, bs).permute(0, 2, 1, 3)
    scale = torch.maximum(blocked.abs().amax(dim=(2, 3)) / 127.0, torch.tensor(1e-8))
    q = torch.clamp(blocked / scale.unsqueeze(-1).unsqueeze(-1), -127.0, 127.0).round().to(torch.int8)
    return q.permute(0, 2, 1, 3).reshape(m, n), scale.to(torch.float32)


def tiles_dequant(q, scale, bs):
    m, n = q.shape
    blocked = q.reshape(m // bs, bs, n // bs, bs).permute(0, 2, 1, 3)
    out = blocked.to(torch.float32) * scale.unsqueeze(-1).unsqueeze(-1)
    return out.permute(0, 2, 1, 3).reshape(m, n)


def block3d(w, bs):
    m, n = w.shape
    blocked = w.view(m, n // bs, bs)
    scale = (blocked.abs().amax(dim=2, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (blocked / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, n), scale


def block3d_dequant(q, scale):
    m, nb, _ = scale.shape
    return (q.to(torch.float32).view(m, nb, -1) * scale).view(q.shape)


def hybrid(layer_tensors: dict, m: dict) -> tuple[dict, dict]:
    """``convert_to_hybrid_mxfp8`` on one mxfp8 layer: the largest E8M0 block scale as F32 []."""
    e8m0 = layer_tensors["weight_scale"].view(torch.uint8).to(torch.int32)
    scalar = torch.pow(torch.tensor(2.0), (e8m0 - 127).float()).max().to(torch.float32).reshape(())
    return dict(layer_tensors, weight_scalar=scalar), dict(m, format="hybrid_mxfp8")


def save(path, layers: dict) -> str:
    sd = {}
    for prefix, (tensors, m) in layers.items():
        for s, t in tensors.items():
            sd[f"{prefix}.{s}"] = t.contiguous()
        sd[f"{prefix}.comfy_quant"] = marker(m)
    save_file(sd, str(path))
    return str(path)


def detect(path):
    with open_checkpoint(path) as ck:
        return registry.detect(ck)


def test_every_extra_format_is_detected_and_named(tmp_path):
    w = weight()
    q1, s1 = rowwise(w)
    q2, s2 = tiles(w, 64)
    q3, s3 = int8_tiles(w, 128)
    q4, s4 = block3d(w, 64)
    mx = make_layer("mxfp8", prefix="e", n=128, k=256, marker="comfyui", bias=False)
    t5, m5 = hybrid(mx.tensors, mx.marker)
    path = save(
        tmp_path / "c2q.safetensors",
        {
            "a": ({"weight": q1, "weight_scale": s1}, {"format": "float8_e4m3fn_rowwise", "orig_dtype": "float32"}),
            "b": ({"weight": q2, "weight_scale": s2}, {"format": "float8_e4m3fn_blockwise", "group_size": 64}),
            "c": (
                {"weight": q3, "weight_scale": s3, "input_scale": torch.tensor(1.0)},
                {"format": "int8_blockwise", "group_size": 128},
            ),
            "d": ({"weight": q4, "weight_scale": s4}, {"format": "float8_e4m3fn_block3d"}),
            "e": (t5, m5),
        },
    )
    det = detect(path)
    assert det.name == NAME
    got = {p: (t.variant, t.verdict, t.format) for p, t in det.layers.items()}
    assert got == {
        "a": ("float8_e4m3fn_rowwise", LOSSY, None),
        "b": ("float8_e4m3fn_blockwise 64x64", LOSSY, None),
        "c": ("int8_blockwise 128x128", LOSSY, None),
        "d": ("float8_e4m3fn_block3d", LOSSY, None),
        "e": ("hybrid_mxfp8", EXACT, "mxfp8"),
    }
    assert det.layers["c"].lossy.format == "int8_tensorwise" and det.layers["a"].lossy.format == "float8_e4m3fn"
    assert "1 hybrid_mxfp8" in det.to_dict()["notes"][0]


@pytest.mark.parametrize("kind", ["rowwise", "blockwise", "int8_blockwise", "block3d"])
def test_decoders_are_ctqs_dequantize_bit_for_bit(tmp_path, kind):
    w = weight()
    if kind == "rowwise":
        q, s = rowwise(w)
        m, ref = {"format": "float8_e4m3fn_rowwise"}, rowwise_dequant(q, s)
    elif kind == "blockwise":
        q, s = tiles(w, 64)
        m, ref = {"format": "float8_e4m3fn_blockwise", "group_size": 64}, tiles_dequant(q, s, 64)
    elif kind == "int8_blockwise":
        q, s = int8_tiles(w, 64)
        m, ref = {"format": "int8_blockwise", "group_size": 64}, tiles_dequant(q, s, 64)
    else:
        q, s = block3d(w, 32)
        m, ref = {"format": "float8_e4m3fn_block3d"}, block3d_dequant(q, s)
    tr = detect(save(tmp_path / "c.safetensors", {"x": ({"weight": q, "weight_scale": s}, m)})).layers["x"]
    dense = tr.decoder({"weight": q, "weight_scale": s})
    assert dense.dtype == torch.float32 and torch.equal(dense, ref)
    assert (dense - w).abs().max() < 0.1 * w.abs().max()  # a faithful decode, not just a self-consistent one


def test_the_block_size_comes_from_the_marker_or_ctqs_default(tmp_path):
    w = weight()
    q, s = int8_tiles(w, 128)  # ctq's fallback group_size for int8_blockwise
    tr = detect(save(tmp_path / "c.safetensors", {"x": ({"weight": q, "weight_scale": s}, {"format": "int8_blockwise"})}))
    assert tr.layers["x"].variant == "int8_blockwise 128x128"
    q, s = tiles(w, 32)  # a marker that disagrees with the scale's shape: the canonical rules say what is wrong
    path = save(
        tmp_path / "d.safetensors",
        {"x": ({"weight": q, "weight_scale": s}, {"format": "float8_e4m3fn_blockwise", "group_size": 64})},
    )
    assert "x" not in detect(path).layers
    assert any(
        f.layer == "x" and f.tensor == "x.weight_scale" and "group_size=32" in f.message for f in comfyquant.check(path).findings
    )


def test_hybrid_mxfp8_is_mxfp8_with_the_scalar_dropped(tmp_path):
    mx = make_layer("mxfp8", prefix="x", n=128, k=256, marker="comfyui")
    t, m = hybrid(mx.tensors, mx.marker)
    path = save(tmp_path / "h.safetensors", {"x": (t, m)})
    tr = detect(path).layers["x"]
    assert (tr.verdict, tr.format, tr.marker) == (EXACT, "mxfp8", dict(mx.marker, format="mxfp8"))
    assert tr.drops == ["x.weight_scalar"]
    with open_checkpoint(path) as ck:
        for mv in tr.moves:  # every other tensor is carried over byte for byte
            assert mv.transform is None and mv.source == f"x.{mv.suffix}"
            assert (mv.dtype, mv.shape) == (ck.tensors[mv.source].dtype, ck.tensors[mv.source].shape)
    assert sorted(mv.suffix for mv in tr.moves) == sorted(mx.tensors)


def test_wrong_tensors_are_refused_or_left_to_the_canonical_rules(tmp_path):
    """Tensors that fit none of ctq's layouts: a format the registry describes is diagnosed by
    the canonical rules (expected vs stored shapes); one it does not know is a refused layer."""
    q, s = rowwise(weight())
    path = save(
        tmp_path / "c.safetensors",
        {
            "a": ({"weight": q, "weight_scale": s[:5].clone()}, {"format": "float8_e4m3fn_rowwise"}),
            "b": ({"weight": q.view(torch.uint8).clone(), "weight_scale": s.clone()}, {"format": "float8_e4m3fn_rowwise"}),
            "c": ({"weight": q.clone()}, {"format": "hybrid_mxfp8"}),
            "d": ({"weight": q.clone(), "weight_scale": torch.rand(128, 5, 1)}, {"format": "float8_e4m3fn_block3d"}),
        },
    )
    det = detect(path)
    assert {p: t.verdict for p, t in det.layers.items()} == {"c": REFUSED, "d": REFUSED}
    assert "without weight_scale" in det.layers["c"].why and "is not [128, K/B, 1]" in det.layers["d"].why
    errors = {f.layer for f in comfyquant.check(path).findings if f.severity == "error"}
    assert {"a", "b"} <= errors


@pytest.mark.parametrize("value", [[], {}, None, 3, "float8_e4m3fn"])
def test_odd_format_values_are_not_claimed(tmp_path, value):
    """A format that is no name (a list: unhashable) is the canonical rules' to report."""
    q, s = rowwise(weight())
    path = save(tmp_path / "c.safetensors", {"x": ({"weight": q, "weight_scale": s}, {"format": value})})
    assert NAME not in detect(path).names


def test_canonical_layers_are_not_claimed(tmp_path):
    mx = make_layer("mxfp8", prefix="x", n=128, k=256, marker="comfyui")
    assert NAME not in detect(save(tmp_path / "m.safetensors", {"x": (mx.tensors, mx.marker)})).names


# -- end to end (the commands, once main wires the dialects) -------------------------------

wired = pytest.mark.skipif(not hasattr(comfyquant, "migrate"), reason="the commands' dialect wiring is on main")


def dense(path) -> dict[str, torch.Tensor]:
    out = str(path) + ".dense.safetensors"
    comfyquant.dequantize(str(path), out, "f32", overwrite=True)
    return load_file(out)


@wired
def test_inspect_json_names_the_dialect(tmp_path, capsys):
    q, s = rowwise(weight())
    path = save(tmp_path / "c.safetensors", {"a": ({"weight": q, "weight_scale": s}, {"format": "float8_e4m3fn_rowwise"})})
    assert main(["inspect", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dialect"] == NAME
    assert {r["layer"]: (r["dialect"], r["verdict"]) for r in out["layers"]} == {
        "a": ("convert-to-quant (float8_e4m3fn_rowwise)", LOSSY)
    }


@wired
def test_hybrid_migrates_to_the_mxfp8_it_was(tmp_path):
    mx = make_layer("mxfp8", prefix="x", n=128, k=256, marker="comfyui")
    original = save(tmp_path / "mx.safetensors", {"x": (mx.tensors, mx.marker)})
    t, m = hybrid(mx.tensors, mx.marker)
    src = save(tmp_path / "h.safetensors", {"x": (t, m)})
    out = str(tmp_path / "comfy.safetensors")
    result = comfyquant.migrate(src, out)
    assert result.ok, result.to_dict()
    with open_checkpoint(out) as ck:
        assert ck.layers["x"].marker["format"] == "mxfp8" and "x.weight_scalar" not in ck.tensors
    reference, before, after = dense(original), dense(src), dense(out)
    assert torch.equal(after["x.weight"], reference["x.weight"])
    assert torch.equal(before["x.weight"], after["x.weight"])


@wired
def test_dequantize_uses_ctqs_formula(tmp_path):
    w = weight()
    q, s = tiles(w, 64)
    path = save(
        tmp_path / "c.safetensors",
        {"x": ({"weight": q, "weight_scale": s}, {"format": "float8_e4m3fn_blockwise", "group_size": 64})},
    )
    assert torch.equal(dense(path)["x.weight"], tiles_dequant(q, s, 64))


@wired
def test_check_reports_what_each_runtime_does(tmp_path):
    q, s = rowwise(weight())
    mx = make_layer("mxfp8", prefix="h", n=128, k=256, marker="comfyui")
    t, m = hybrid(mx.tensors, mx.marker)
    path = save(
        tmp_path / "c.safetensors", {"a": ({"weight": q, "weight_scale": s}, {"format": "float8_e4m3fn_rowwise"}), "h": (t, m)}
    )
    report = comfyquant.check(path)
    comfy = report.verdicts["comfyui"].first
    assert (comfy.exception, comfy.message) == ("KeyError", "'float8_e4m3fn_rowwise'")
    assert "hybrid_mxfp8" in report.verdicts["sglang"].first.message
    assert not report.verdicts["comfy-kitchen"].loads
