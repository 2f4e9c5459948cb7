"""Canonical findings: every cause the checker names, on files written by the tests."""

from __future__ import annotations

import json
import os
import struct

import pytest

from builders import (
    W4A8_MARKER,
    codebook,
    dense_layer,
    fp8_layer,
    header_markers,
    int8_layer,
    marker_tensor,
    mxfp8_layer,
    nvfp4_layer,
    ones,
    w4a4_layer,
    w4a8_layer,
    write,
    zeros,
)
from comfyquant import check, open_checkpoint

P = "blocks.0.attn.qkv"


def put(d: dict, suffix: str, value) -> dict:
    return {**d, f"{P}.{suffix}": value}


def only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert found, (code, [(f.code, f.message) for f in report.findings])
    return found


def test_seed_case_one_finding_transposed_and_downcast(tmp_path):
    p = write(tmp_path / "seed.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))
    r = check(p)
    on_corr = [f for f in r.findings if f.tensor == f"{P}.weight_correction" and "." not in f.code]
    assert len(on_corr) == 1
    f = on_corr[0]
    assert f.code == "L004" and f.severity == "error"
    assert "transposed" in f.cause and "BF16, needs F32" in f.cause
    assert f.expected == "F32 (16, 32)"
    assert f.actual == "BF16 (32, 16)"
    assert "transpose" in f.fix and "upcast to F32" in f.fix
    assert set(f.targets) >= {"sglang", "comfy-kitchen"}
    assert r.verdicts["sglang"].first.message == f"Comfy W4A8 layer '{P}' has an incompatible correction tensor"


def test_downcast_only_depends_on_target(tmp_path):
    p = write(tmp_path / "m.safetensors", w4a8_layer(P, correction=zeros("BF16", (16, 32))))
    f = only(check(p, target="sglang"), "L002")[0]
    assert f.severity == "error" and "BF16, needs F32" in f.cause
    f = only(check(p, target="comfy-kitchen"), "L002")[0]
    assert f.severity == "info"  # comfy-kitchen writes and reads BF16 corrections
    assert check(p, target="comfy-kitchen").ok


def test_made_for_another_group_size(tmp_path):
    layer = w4a8_layer(P, g=32, marker=dict(W4A8_MARKER, group_size=32))
    layer[f"{P}.comfy_quant"] = marker_tensor(W4A8_MARKER)  # marker says 16, tensors made for 32
    f = only(check(write(tmp_path / "g.safetensors", layer)), "L003")[0]
    assert f.tensor == f"{P}.weight_s_rel"
    assert "group_size=32" in f.cause and "marker says 16" in f.cause


def test_correction_made_for_other_group_size_and_transposed(tmp_path):
    layer = w4a8_layer(P, correction=zeros("F32", (32, 8)))  # (N, K/32)
    f = [f for f in check(write(tmp_path / "g.safetensors", layer)).findings if f.tensor == f"{P}.weight_correction"][0]
    assert "group_size=32" in f.cause and "transposed" in f.cause


def test_six_bit_rows_read_as_four_bit_by_sglang(tmp_path):
    r = check(write(tmp_path / "w6.safetensors", w4a8_layer(P, bits=6)))
    f = only(r, "sglang.W5")[0]
    assert "6-bit rows read as 4-bit" in f.cause and f.severity == "error"
    # ComfyUI 0.33.0 reads them so too with the comfy-kitchen it pins (0.2.31), not with 0.2.40
    comfy = check(write(tmp_path / "w6b.safetensors", w4a8_layer(P, bits=6)), target="comfyui")
    assert not comfy.ok and comfy.verdicts["comfyui"].with_newer_kitchen.loads


def test_missing_convrot_flag(tmp_path):
    m = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}
    r = check(write(tmp_path / "c.safetensors", w4a8_layer(P, marker=m)))
    f = [f for f in r.findings if f.code == "M036"][0]
    assert "missing ConvRot flag" in f.message and "sglang" in f.targets and f.severity == "error"
    r = check(write(tmp_path / "c2.safetensors", w4a8_layer(P, marker=m)), target="comfyui")
    assert r.ok and [f for f in r.findings if f.code == "M036"][0].severity == "info"


def test_explicit_group_sizes(tmp_path):
    r = check(write(tmp_path / "c.safetensors", w4a8_layer(P, marker={"format": "asym_w4a8_int8", "convrot": True})))
    missing = {f.actual for f in r.findings if f.code == "M036"}
    assert [f.expected.split()[0] for f in r.findings if f.code == "M036"] == ["group_size", "convrot_groupsize"]
    assert missing == {"absent"}


def test_header_tensor_disagreement(tmp_path):
    meta = header_markers({P: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}})
    r = check(write(tmp_path / "h.safetensors", int8_layer(P), metadata=meta))
    f = only(r, "M020")[0]
    assert "convrot_groupsize" in f.message and "--prefer" in f.fix


def test_prefix_mismatch(tmp_path):
    layer = int8_layer("model.diffusion_model." + P, marker=False)
    meta = header_markers({P: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}})
    r = check(write(tmp_path / "p.safetensors", layer, metadata=meta))
    f = only(r, "M022")[0]
    assert "prefix mismatch" in f.cause and f.expected == "model.diffusion_model." + P
    assert only(r, "M023")  # and the tensors have no marker under their own name
    assert r.verdicts["sglang"].first.rule == "sglang.M0"
    assert r.verdicts["comfyui"].loads  # ComfyUI tries the name with and without the prefix


def test_nested_params_and_underscore_keys(tmp_path):
    m = {"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 256}, "_is_rowwise": True}
    r = check(write(tmp_path / "n.safetensors", int8_layer(P, marker=m)))
    assert only(r, "M033")[0].severity in ("warning", "error")
    assert only(r, "M034")
    # SGLang ignores params: the layer is a plain (embedding-only) INT8 marker there
    assert any(v.rule == "sglang.B4" for v in r.verdicts["sglang"].violations)


def test_unknown_and_converter_only_formats(tmp_path):
    r = check(write(tmp_path / "u.safetensors", int8_layer(P, marker={"format": "int8_tensorwize"})))
    f = only(r, "M031")[0]
    assert "int8_tensorwise" in f.cause
    layer = {
        f"{P}.weight": zeros("I8", (32, 256)),
        f"{P}.weight_scale": ones("F32", (1, 2)),
        f"{P}.comfy_quant": marker_tensor({"format": "int8_blockwise", "group_size": 128}),
    }
    r = check(write(tmp_path / "b.safetensors", layer))
    assert only(r, "M032") and r.verdicts["sglang"].first.rule == "sglang.R0"
    assert not r.verdicts["comfyui"].loads and r.verdicts["comfyui"].first.exception == "KeyError"


@pytest.mark.parametrize(
    "layer, fmt",
    [
        (lambda: int8_layer(P, marker=False), "int8_tensorwise"),
        (lambda: fp8_layer(P, marker=False), "float8_e4m3fn"),
        (lambda: w4a8_layer(P, marker=False), "asym_w4a8_int8"),
        (lambda: w4a4_layer(P, marker=False), "convrot_w4a4"),
        (lambda: nvfp4_layer(P, marker=False), "nvfp4"),
        (lambda: mxfp8_layer(P, marker=False), "mxfp8"),
    ],
)
def test_unmarked_quantized_weights_get_inferred_format(tmp_path, layer, fmt):
    r = check(write(tmp_path / "m.safetensors", layer()))
    f = only(r, "M023")[0]
    assert f"look like {fmt}" in f.message
    assert not r.verdicts["comfyui"].violations[0].blocking  # ComfyUI casts by value: garbage, no error
    # the ComfyUI garbage and the SGLang refusal are both attached to the one M023 finding
    assert f.severity == "error" and set(f.targets) >= {"comfyui", "sglang"}
    assert check(write(tmp_path / "n.safetensors", layer()), target="comfyui").findings[0].severity == "error"


def test_orphan_companions_and_extra_tensors(tmp_path):
    orphan = {"x.weight_scale": ones("F32", ())}
    extra = put(int8_layer(P), "weight_codebook", codebook())
    r = check(write(tmp_path / "o.safetensors", orphan, extra))
    assert only(r, "L009") and only(r, "L007")


def test_forbidden_combinations(tmp_path):
    both = put(w4a8_layer(P, correction=zeros("F32", (16, 32))), "weight_codebook", codebook())
    f = only(check(write(tmp_path / "cc.safetensors", both)), "L006")[0]
    assert "codebook and a correction" in f.cause
    six = put(w4a8_layer(P, bits=6), "weight_codebook", codebook())
    assert "6-bit" in only(check(write(tmp_path / "six.safetensors", six)), "L006")[0].cause


def test_geometry_constraints(tmp_path):
    m = dict(W4A8_MARKER, convrot_groupsize=128)
    r = check(write(tmp_path / "c.safetensors", w4a8_layer(P, marker=m)))
    msgs = [f.message for f in r.findings if f.code in ("L005", "M035")]
    assert any("not a power of 4" in x for x in msgs)
    assert r.verdicts["comfy-kitchen"].first.message == "Regular Hadamard size must be a power of 4, got 128"
    r = check(write(tmp_path / "k.safetensors", w4a8_layer(P, k=288, marker=dict(W4A8_MARKER, convrot_groupsize=64))))
    assert any(
        "K=288 must be a multiple of 64 (16, group_size=16 and convrot_groupsize=64 must all divide it)" in f.message
        for f in r.findings
        if f.code == "L005"
    )


def test_int8_scale_shapes(tmp_path):
    r = check(write(tmp_path / "a.safetensors", int8_layer(P, scale_shape=(32,))))
    f = only(r, "L003")[0]
    assert "[N] instead of [N, 1]" in f.cause
    r = check(write(tmp_path / "b.safetensors", int8_layer(P, scale_shape=(1,), marker={"format": "int8_tensorwise"})))
    assert "stored as [1] instead of []" in only(r, "L003")[0].cause
    r = check(write(tmp_path / "c.safetensors", int8_layer(P, scale_shape=())))
    assert "scalar scale on a ConvRot layer" in only(r, "L003")[0].cause


def test_padded_blocked_scale_layouts(tmp_path):
    layer = nvfp4_layer(P, n=32, k=256, scale_shape=(32, 16))
    f = only(check(write(tmp_path / "nv.safetensors", layer)), "L003")[0]
    assert "unblocked" in f.cause and f.expected.startswith("F8_E4M3 (128, 16)")
    layer = mxfp8_layer(P, n=64, k=256, scale=ones("F8_E8M0", (64, 8)))
    f = only(check(write(tmp_path / "mx.safetensors", layer)), "L003")[0]
    assert "unblocked [N, K/32]" in f.cause


def test_relabel_causes(tmp_path):
    r = check(write(tmp_path / "s.safetensors", put(w4a8_layer(P), "weight_s_rel", ones("U8", (32, 16)))))
    f = only(r, "L002")[0]
    assert "labelled U8" in f.cause and "relabel" in f.fix


def test_shards_duplicates_and_index(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    a = write(d / "model-00001-of-00002.safetensors", int8_layer("a"), dense_layer("n"))
    b = write(d / "model-00002-of-00002.safetensors", int8_layer("b"), dense_layer("n"))
    wm = {name: os.path.basename(a) for name in ("a.weight", "a.weight_scale", "a.comfy_quant", "n.weight", "n.bias")}
    wm.update({"b.weight": os.path.basename(a), "b.weight_scale": os.path.basename(b), "ghost.weight": os.path.basename(b)})
    wm["missing.weight"] = "model-00003-of-00003.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    r = check(str(d))
    got = {f.code for f in r.findings}
    assert {"C010", "C011", "C012", "C013", "C014"} <= got
    assert r.files == [a, b]
    # the index path itself works too, and a single shard alone
    assert check(str(d / "model.safetensors.index.json")).files == [a, b]
    assert check(a).ok


def test_strip_prefix_and_collision(tmp_path):
    p = write(tmp_path / "s.safetensors", int8_layer("model.diffusion_model.x"), int8_layer("x"))
    r = check(p, strip_prefix="model.diffusion_model.")
    assert only(r, "M040")
    r = check(write(tmp_path / "t.safetensors", int8_layer("model.diffusion_model.y")), strip_prefix="model.diffusion_model.")
    assert r.ok and r.layers == 1


def test_header_marker_problems(tmp_path):
    r = check(write(tmp_path / "a.safetensors", int8_layer(P), metadata={"_quantization_metadata": '{"layers": {}}'}))
    assert only(r, "M014")[0].severity == "info"
    r = check(write(tmp_path / "b.safetensors", int8_layer(P), metadata=header_markers({P: "int8_tensorwise"})))
    assert only(r, "M013") and r.verdicts["comfyui"].first.exception == "AttributeError"
    r = check(write(tmp_path / "c.safetensors", int8_layer(P), metadata={"_quantization_metadata": "nope"}))
    assert only(r, "M010") and not r.verdicts["comfyui"].loads


def test_marker_tensor_problems(tmp_path):
    bad = put(int8_layer(P, marker=False), "comfy_quant", ("I8", (2,), b"{}"))
    r = check(write(tmp_path / "a.safetensors", bad))
    assert only(r, "M003") and only(r, "M030")


def _f32(values):
    return ("F32", (len(values),), struct.pack(f"<{len(values)}f", *values))


def test_deep_value_checks(tmp_path):
    layer = w4a8_layer(P)
    layer[f"{P}.weight_s_channel"] = _f32([float("nan")] + [1.0] * 30 + [0.0])
    layer[f"{P}.weight_codebook"] = _f32(list(range(15, -1, -1)))
    layer[f"{P}.weight_s_rel"] = zeros("F8_E4M3", (32, 16))
    other = int8_layer("b")
    other["b.weight_scale"] = _f32([-1.0] * 32)[:2] and ("F32", (32, 1), struct.pack("<32f", *([-1.0] * 32)))
    p = write(tmp_path / "d.safetensors", layer, other)
    assert not {"D001", "D002", "D003", "D004", "D006"} & {f.code for f in check(p).findings}
    got = {f.code for f in check(p, deep=True).findings}
    assert {"D001", "D002", "D003", "D004", "D006"} <= got
    clean = write(tmp_path / "ok.safetensors", w4a8_layer(P), fp8_layer("c"), nvfp4_layer("n"), mxfp8_layer("m"))
    assert not [f for f in check(clean, deep=True).findings if f.code.startswith("D")]


def test_deep_on_a_truncated_file_reports_the_truncation_and_reads_only_what_is_there(tmp_path):
    """Small tensors cut off by a truncation are left to C002 (found by fuzzing: --deep must not
    read half a tensor); the ones still whole are value-checked."""
    layer = w4a8_layer(P)
    layer[f"{P}.weight_s_channel"] = _f32([float("nan")] + [1.0] * 31)  # D001, whole
    p = write(tmp_path / "t.safetensors", layer)
    with open_checkpoint(p) as ck:
        scales = ck.tensors[f"{P}.weight_s_channel"]
        codebook = ck.tensors[f"{P}.weight_codebook"]
    assert scales.end <= codebook.start
    with open(p, "rb") as fh:
        data = fh.read()
    with open(p, "wb") as fh:
        fh.write(data[: codebook.start + 3])  # three bytes of an F32 tensor
    report = check(p, deep=True)
    codes = {f.code for f in report.findings}
    assert "C002" in codes and "D001" in codes and not report.ok
    assert not [f for f in report.findings if f.tensor == codebook.name and f.code.startswith("D")]


def _scalar(dtype: str, value: float) -> tuple:
    fmt = {"F32": "<f", "F16": "<e"}[dtype]
    return (dtype, (), struct.pack(fmt, value))


@pytest.mark.parametrize(
    "value, code", [(0.0, "D002"), (-0.0, "D002"), (-2.0, "D003"), (float("nan"), "D001"), (float("inf"), "D001")]
)
@pytest.mark.parametrize(
    "layer_of, tensor",
    [
        (lambda: fp8_layer("f"), "f.weight_scale"),
        (lambda: int8_layer("i", marker={"format": "int8_tensorwise"}, scale_shape=()), "i.weight_scale"),
        (lambda: nvfp4_layer("n"), "n.weight_scale_2"),
    ],
)
def test_deep_single_element_scales_are_judged_like_many(tmp_path, layer_of, tensor, value, code):
    """A per-tensor scale of zero makes the whole layer output zeros; negative flips it, NaN
    poisons it: each is an error naming the tensor, as for a multi-element scale."""
    layer = layer_of()
    layer[tensor] = _scalar(layer[tensor][0], value)
    p = write(tmp_path / "s.safetensors", layer)
    report = check(p, deep=True)
    hits = [f for f in report.findings if f.code == code and f.tensor == tensor]
    assert hits and hits[0].severity == "error" and not report.ok
    # severity and verdicts agree: every runtime loads the file and computes garbage with it
    assert sorted(hits[0].targets) == sorted(report.verdicts)
    for verdict in report.verdicts.values():
        assert not verdict.loads
        assert [v for v in verdict.violations if v.fails and v.exception is None and tensor in v.message]
    assert not [f for f in check(p).findings if f.code.startswith("D")]  # values are read only with --deep


def test_deep_all_zero_multi_element_scale_is_an_error_not_only_a_warning(tmp_path):
    """Every row scale zero: the layer outputs zeros; that is D002 (error) as well as D006."""
    layer = int8_layer("i", marker={"format": "int8_tensorwise", "per_channel": True})
    layer["i.weight_scale"] = zeros("F32", (32, 1))
    report = check(write(tmp_path / "z.safetensors", layer), deep=True)
    assert {"D002"} <= {f.code for f in report.findings if f.severity == "error"} and not report.ok


def test_deep_value_of_a_tensor_a_runtime_drops_does_not_fail_that_runtime(tmp_path):
    """ComfyUI never loads a W4A8 weight_correction: NaNs in it stop SGLang and comfy-kitchen
    (which compute with it), not ComfyUI, whose finding is the silent loss it already has."""
    nan = ("F32", (16, 32), struct.pack("<512f", *([float("nan")] * 512)))
    p = write(tmp_path / "c.safetensors", w4a8_layer(P, correction=nan))
    report = check(p, deep=True)
    (hit,) = [f for f in report.findings if f.code == "D007"]
    assert hit.severity == "error" and sorted(hit.targets) == ["comfy-kitchen", "sglang"]
    assert report.verdicts["comfyui"].loads and not report.verdicts["comfy-kitchen"].loads
    only_comfyui = check(p, deep=True, target="comfyui")
    assert only_comfyui.ok and [f.severity for f in only_comfyui.findings if f.code == "D007"] == ["info"]
