"""``check --target comfyui==X`` / ``comfyui>=X`` / ``comfyui<X``: the verdict of the newest
selected ComfyUI release, the file's verdict on each selected release in ``--json``, and by
default the first release that loads the file (``targets.comfyui_releases``)."""

from __future__ import annotations

import json

import pytest

from builders import fp8_layer, header_markers, w4a8_layer, write, zeros
from comfyquant.checker.run import parse_targets
from comfyquant.cli import main

LAYER = "blocks.0.attn.qkv"


def run(capsys, *args) -> tuple[int, str]:
    code = main(["check", *args])
    return code, capsys.readouterr().out


@pytest.fixture
def w4a8(tmp_path):
    return write(tmp_path / "w4a8.safetensors", w4a8_layer(LAYER))


def test_default_names_the_first_release_that_loads(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "comfyui")
    assert code == 0
    assert "loads from ComfyUI 0.31.0 on; fails before: KeyError: 'asym_w4a8_int8'" in out


def test_one_release_is_its_verdict(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "comfyui==0.30.0")
    assert code == 1
    assert "comfyui        FAILS  KeyError: 'asym_w4a8_int8'" in out
    assert "fix      load it with ComfyUI 0.31.0 or newer" in out
    code, out = run(capsys, w4a8, "--target", "comfyui==0.31.0")
    assert code == 0 and "comfyui        loads" in out


def test_ranges_list_each_selected_release_in_json(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "comfyui<0.31", "--json")
    target = json.loads(out)["targets"]["comfyui"]
    assert code == 1 and target["exception"] == "KeyError"
    listed = [r for g in target["releases"]["releases"] for r in g["releases"]]
    assert listed[0] == "0.3.68" and listed[-1] == "0.30.0"
    assert target["releases"]["first_loading"] == "0.31.0"
    code, out = run(capsys, w4a8, "--target", "comfyui>=0.27", "--json")
    groups = json.loads(out)["targets"]["comfyui"]["releases"]["releases"]
    assert [g["releases"][0] for g in groups] == ["0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]
    assert [g["loads"] for g in groups] == [False] * 4 + [True] * 3
    assert groups[-1]["comfy_kitchen"] == "0.2.31" and groups[-1]["comfy_kitchen_pinned"]


def test_tensor_markers_load_from_the_release_that_reads_them(capsys, tmp_path):
    """FP8 marked by a tensor alone: releases before 0.4.0 read only the header map; with the
    header map as well, every release loads it."""
    tensor_only = write(tmp_path / "t.safetensors", fp8_layer(LAYER))
    _, out = run(capsys, tensor_only, "--target", "comfyui")
    assert "loads from ComfyUI 0.4.0 on; fails before: layer 'blocks.0.attn.qkv': ComfyUI before 0.4.0 reads only" in out
    both = write(tmp_path / "h.safetensors", fp8_layer(LAYER), metadata=header_markers({LAYER: {"format": "float8_e4m3fn"}}))
    _, out = run(capsys, both, "--target", "comfyui")
    assert "loads on every ComfyUI release 0.3.68 .. 0.33.0" in out


@pytest.mark.parametrize(
    "target, words",
    [
        ("comfyui==9.9", "no ComfyUI release ==9.9 is modelled"),
        ("comfyui>=0.x", "'0.x' is not a release number"),
        ("vllm==0.1", "releases are modelled for ComfyUI, SGLang and comfy-kitchen only"),
    ],
)
def test_bad_release_specs_are_refused_in_one_line(target, words):
    with pytest.raises(ValueError, match=words):
        parse_targets(target)


@pytest.mark.parametrize("odd", [["int8_tensorwise"], {"f": 1}, 7, None])
def test_a_format_of_any_json_value_beside_an_unknown_one(capsys, tmp_path, odd):
    """The release verdicts read each layer's format as the file has it: a list, object, number
    or null beside a format older releases do not know is judged, never a crash."""
    other = "blocks.1.attn.qkv"
    path = write(
        tmp_path / "odd.safetensors",
        fp8_layer(LAYER, marker=None),
        fp8_layer(other, marker=None),
        metadata=header_markers({LAYER: {"format": odd}, other: {"format": "float8"}}),
    )
    code, out = run(capsys, path, "--target", "comfyui==0.30.0")
    assert code == 1 and "comfyui        FAILS" in out, out


def test_the_default_is_comfyui_0_33_0_with_the_comfy_kitchen_it_pins(capsys, tmp_path, w4a8):
    """A 6-bit W4A8 layer: ComfyUI 0.33.0's pinned comfy-kitchen (0.2.31) reads its rows as
    4-bit codes and fails the first forward, 0.2.40 loads it: the report says so in one line,
    and ``--json`` carries the 0.2.40 verdict as ``newer_kitchen`` (null where both agree)."""
    six = write(tmp_path / "w6.safetensors", w4a8_layer(LAYER, bits=6))
    code, out = run(capsys, six, "--target", "comfyui")
    assert code == 1
    assert "comfyui        FAILS  ValueError: K=384 must be divisible by 16, group_size=16, and convrot_groupsize=256" in out
    assert "with comfy-kitchen 0.2.40 instead of the pinned 0.2.31: loads" in out
    code, out = run(capsys, six, "--target", "comfyui", "--json")
    target = json.loads(out)["targets"]["comfyui"]
    assert target["newer_kitchen"] == {
        "comfy_kitchen": "0.2.40",
        "loads": True,
        "error": None,
        "exception": None,
        "rule": None,
        "layer": None,
    }
    code, pinned = run(capsys, six, "--target", "comfyui==0.33.0")
    assert code == 1 and "with comfy-kitchen 0.2.40 instead of the pinned 0.2.31: loads" in pinned
    code, out = run(capsys, w4a8, "--target", "comfyui", "--json")
    assert code == 0 and json.loads(out)["targets"]["comfyui"]["newer_kitchen"] is None


def test_a_packed_row_of_another_width_is_read_in_the_pinned_comfy_kitchen_s_words(capsys, tmp_path):
    """A transposed 4-bit weight fails with both comfy-kitchens, each in its own words."""
    t = w4a8_layer(LAYER, n=64, k=256)
    t[f"{LAYER}.weight"] = zeros("I8", (128, 64))  # [K/2, N] instead of [N, K/2]
    path = write(tmp_path / "t.safetensors", t)
    code, out = run(capsys, path, "--target", "comfyui", "--json")
    target = json.loads(out)["targets"]["comfyui"]
    assert code == 1 and target["error"].startswith("K=128 must be divisible by 16, group_size=16, and convrot_groupsize=256")
    assert target["newer_kitchen"]["error"] == "packed row width 64 does not match K=256 at 4 or 6 bits"


def test_a_value_deep_reads_breaks_every_release_that_reads_it(capsys, tmp_path):
    """A NaN weight scale (what ``--deep`` reads) makes every release compute garbage: the
    release lines and JSON of each runtime say the file fails on every release, as its reported
    verdict does, and not that some release loads it."""
    import struct

    layer = fp8_layer(LAYER)
    layer[f"{LAYER}.weight_scale"] = ("F32", (), struct.pack("<f", float("nan")))
    path = write(tmp_path / "nan-scale.safetensors", layer, metadata=header_markers({LAYER: {"format": "float8_e4m3fn"}}))
    code, out = run(capsys, path, "--deep")
    assert code != 0
    assert "fails on every ComfyUI release 0.3.68 .. 0.33.0" in out, out
    assert "fails on every comfy-kitchen release" in out and "fails on every SGLang release" in out, out
    _, out = run(capsys, path, "--deep", "--json")
    targets = json.loads(out)["targets"]
    for name in ("comfyui", "comfy-kitchen", "sglang"):
        assert not targets[name]["loads"] and targets[name]["releases"]["first_loading"] is None, name
    code, out = run(capsys, path)  # the header alone cannot show it
    assert code == 0 and "loads on every ComfyUI release" in out, out
