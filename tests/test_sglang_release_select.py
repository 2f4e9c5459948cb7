"""``check --target sglang==X`` / ``sglang>=X`` / ``sglang<X``: the verdict of the newest selected
SGLang release, every selected release group in ``--json``, and by default the first SGLang
release that loads the file (``targets.sglang_releases``; the releases' outcomes are proven
against their wheels in tests/test_sglang_releases.py)."""

from __future__ import annotations

import json

import pytest

from builders import fp8_layer, header_markers, int8_layer, nvfp4_layer, ones, w4a8_layer, write, zeros
from comfyquant.checker.run import parse_targets
from comfyquant.cli import main
from comfyquant.targets.releases import summary

LAYER = "blocks.0.attn.qkv"
OLD_READER = (
    "(no SGLang message) SGLang 0.5.16-0.5.18 reads no Comfy markers: no quantization config: "
    "the layer is built unquantized and its quantized weights do not fit it"
)


def run(capsys, *args) -> tuple[int, str]:
    code = main(["check", *args])
    return code, capsys.readouterr().out


def sglang_lines(out: str) -> list[str]:
    """The SGLang verdict's line and the lines under it in the text report."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  sglang "))
    end = next((i for i in range(at + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return [line.strip() for line in lines[at:end]]


@pytest.fixture
def w4a8(tmp_path):
    return write(tmp_path / "w4a8.safetensors", w4a8_layer(LAYER))


@pytest.fixture
def nvfp4(tmp_path):
    """NVFP4 without ``full_precision_matrix_mult``: the older readers' ModelOpt config serves it,
    0.5.19 refuses it, 0.5.20 on read it."""
    return write(tmp_path / "nvfp4.safetensors", nvfp4_layer(LAYER))


def test_default_names_the_first_release_that_loads(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "sglang")
    assert code == 0
    assert sglang_lines(out) == ["sglang         loads", f"loads from SGLang 0.5.19 on; fails before: {OLD_READER}"]


def test_where_a_file_stopped_loading_before(capsys, nvfp4):
    _, out = run(capsys, nvfp4, "--target", "sglang")
    assert sglang_lines(out)[1:] == [
        "loads from SGLang 0.5.20 on; fails before: ValueError: Comfy NVFP4 layer 'blocks.0.attn.qkv' "
        "must request full_precision_matrix_mult",
        "stops loading at SGLang 0.5.19",
    ]


def test_every_release_loads_or_none_does(capsys, tmp_path):
    mapped = write(
        tmp_path / "fp8.safetensors",
        fp8_layer(LAYER, marker=False),
        metadata=header_markers({LAYER: {"format": "float8_e4m3fn"}}),
    )
    _, out = run(capsys, mapped, "--target", "sglang")
    assert sglang_lines(out)[1:] == ["loads on every SGLang release 0.5.14 .. 0.5.23"]
    plain = write(tmp_path / "int8.safetensors", int8_layer(LAYER, marker={"format": "int8_tensorwise", "convrot": 1}))
    code, out = run(capsys, plain, "--target", "sglang")
    assert code == 1
    assert sglang_lines(out)[1:] == ["fails on every SGLang release 0.5.14 .. 0.5.23"]


def test_a_file_the_newest_releases_refuse(capsys, tmp_path):
    """A row-wise FP8 map without its layout descriptor: the readers before 0.5.19 take its
    ``float8`` format for their FP8 config; every marker reader refuses it."""
    marker = {"format_version": "1.1", "layers": {LAYER: {"format": "rowwise-float8_e4m3fn"}}}
    path = write(
        tmp_path / "rowwise.safetensors",
        {f"{LAYER}.weight": zeros("F8_E4M3", (64, 256)), f"{LAYER}.weight_scale": ones("F32", (64,))},
        metadata={"_quantization_metadata": json.dumps(marker)},
    )
    _, out = run(capsys, path, "--target", "sglang")
    assert sglang_lines(out)[1:] == ["fails from SGLang 0.5.19 on; last loads on 0.5.18"]


def test_one_release_is_its_verdict(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "sglang==0.5.18")
    assert code == 1
    assert sglang_lines(out) == [
        f"sglang         FAILS  {OLD_READER}",
        "verdict of SGLang 0.5.18; releases checked: 0.5.18",
        f"loads from SGLang 0.5.19 on; fails before: {OLD_READER}",
    ]
    assert "fix      load it with SGLang 0.5.19 or newer" in out
    code, out = run(capsys, w4a8, "--target", "sglang==0.5.21")
    assert code == 0
    assert sglang_lines(out)[:2] == ["sglang         loads", "verdict of SGLang 0.5.21; releases checked: 0.5.21"]


def test_a_release_fails_in_its_own_words(capsys, tmp_path, nvfp4):
    code, out = run(capsys, nvfp4, "--target", "sglang==0.5.19")
    assert code == 1
    assert sglang_lines(out)[0] == (
        "sglang         FAILS  ValueError: Comfy NVFP4 layer 'blocks.0.attn.qkv' must request full_precision_matrix_mult"
    )
    assert "fix      load it with SGLang 0.5.20 or newer" in out
    # 0.5.23's refusal, as 0.5.19-0.5.21 name the same check
    odd = write(tmp_path / "odd.safetensors", int8_layer(LAYER, marker={"format": "int8_tensorwise", "convrot": "true"}))
    _, out = run(capsys, odd, "--target", "sglang")
    assert "Serialized convrot_int8 layer 'blocks.0.attn.qkv' must set convrot=true" in sglang_lines(out)[0]
    _, out = run(capsys, odd, "--target", "sglang==0.5.20")
    assert "Serialized kitchen_int8 layer 'blocks.0.attn.qkv' must set convrot=true" in sglang_lines(out)[0]


def test_ranges_list_each_selected_release_group_in_json(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "sglang<0.5.20", "--json")
    target = json.loads(out)["targets"]["sglang"]
    assert code == 0 and target["loads"]  # 0.5.19's verdict
    releases = target["releases"]
    assert [r for g in releases["releases"] for r in g["releases"]] == [
        "0.5.14",
        "0.5.15",
        "0.5.16",
        "0.5.17",
        "0.5.18",
        "0.5.19",
    ]
    assert releases["first_loading"] == "0.5.19"
    assert releases["summary"][0] == "verdict of SGLang 0.5.19; releases checked: 0.5.14 .. 0.5.19"
    code, out = run(capsys, w4a8, "--target", "sglang>=0.5.19", "--json")
    groups = json.loads(out)["targets"]["sglang"]["releases"]["releases"]
    assert [g["releases"] for g in groups] == [["0.5.19"], ["0.5.20", "0.5.21"], ["0.5.22"], ["0.5.23"]]
    assert all(g["loads"] and g["reader"] == "markers" and g["error"] is None for g in groups)


def test_json_by_default_lists_every_group(capsys, w4a8):
    _, out = run(capsys, w4a8, "--json")
    releases = json.loads(out)["targets"]["sglang"]["releases"]
    assert releases["first_loading"] == "0.5.19"
    assert releases["summary"] == [f"loads from SGLang 0.5.19 on; fails before: {OLD_READER}"]
    first = releases["releases"][0]
    assert set(first) == {"releases", "reader", "loads", "error", "exception", "rule", "layer", "how"}
    assert (first["releases"], first["reader"], first["loads"], first["rule"]) == (["0.5.14"], "metadata", False, "sglang.legacy")
    assert [g["loads"] for g in releases["releases"]] == [False] * 3 + [True] * 4


def test_specs_of_both_runtimes_in_one_list(capsys, w4a8):
    code, out = run(capsys, w4a8, "--target", "sglang==0.5.18,comfyui==0.31.0")
    assert code == 1
    assert "verdict of SGLang 0.5.18; releases checked: 0.5.18" in out
    assert "verdict of ComfyUI 0.31.0 (comfy-kitchen 0.2.28); releases checked: 0.31.0" in out
    assert "comfyui        loads" in out


@pytest.mark.parametrize(
    "target, words",
    [
        (
            "sglang==0.5.2",
            "no SGLang release ==0.5.2 is modelled: choose from 0.5.14 .. 0.5.23 (0.5.14, 0.5.15, 0.5.16, 0.5.17, "
            "0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23)",
        ),
        ("sglang>0.5.23", "no SGLang release >0.5.23 is modelled"),
        ("sglang>=0.5.x", "'0.5.x' is not a release number (e.g. sglang==0.5.21)"),
    ],
)
def test_bad_release_specs_are_refused_in_one_line(capsys, w4a8, target, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_targets(target)
    assert main(["check", w4a8, "--target", target]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def _runs(*loads: bool) -> list:
    releases = ("1.0", "1.1", "1.2", "1.3")
    return [((r,), ok, f"error of {r}") for r, ok in zip(releases, loads, strict=True)]


@pytest.mark.parametrize(
    "loads, lines",
    [
        ((True, True, True, True), ["loads on every X release 1.0 .. 1.3"]),
        ((False, False, False, False), ["fails on every X release 1.0 .. 1.3 (note)"]),
        ((True, True, False, False), ["fails from X 1.2 on; last loads on 1.1"]),
        (
            (False, True, False, True),
            ["loads from X 1.3 on; fails before: error of 1.2", "starts loading at X 1.1", "stops loading at X 1.2"],
        ),
    ],
)
def test_the_summary_both_runtimes_share(loads, lines):
    assert summary("X", _runs(*loads), ("1.0", "1.1", "1.2", "1.3"), str, "", " (note)") == lines
    assert summary("X", _runs(*loads), ("1.1", "1.2"), str, " (how)")[0] == "verdict of X 1.2 (how); releases checked: 1.1 .. 1.2"
