"""check names the runtime versions its verdicts are proven for (text and --json), the same
versions the agreement tests drive, and says when an SGLang verdict is modelled from SGLang's
source instead of proven by running it."""

from __future__ import annotations

import json

import runtime_sources
from builders import W4A8_MARKER, w4a8_layer, write
from comfyquant.cli import main
from comfyquant.targets.comfyui_releases import NEWEST
from comfyquant.targets.proven import PROVEN

P = "blocks.0.attn.qkv"


def run(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_versions_are_the_ones_the_oracles_run():
    """One home in src, and it names what tests/runtime_sources.py fetches and runs."""
    by_name = {r.name: r for rs in PROVEN.values() for r in rs}
    assert by_name["SGLang"].version == runtime_sources.SGLANG_VERSION
    assert by_name["ComfyUI"].version == runtime_sources.COMFYUI_VERSION
    assert runtime_sources.COMFYUI_COMMIT.startswith(by_name["ComfyUI"].commit)
    assert [r.version for r in PROVEN["comfy-kitchen"]] == [runtime_sources.KITCHEN_VERSION]
    # ComfyUI's verdict: with the comfy-kitchen its newest release pins (the pinned agreement
    # test drives it) and with the one the main agreement tests install
    assert [(r.name, r.version) for r in PROVEN["comfyui"]] == [
        ("ComfyUI", runtime_sources.COMFYUI_VERSION),
        ("comfy-kitchen", NEWEST.kitchen),
        ("comfy-kitchen", runtime_sources.KITCHEN_VERSION),
    ]
    assert NEWEST.pinned and NEWEST.releases[-1] == runtime_sources.COMFYUI_VERSION


def test_check_names_the_versions(tmp_path, capsys):
    path = write(tmp_path / "ok.safetensors", w4a8_layer(P))
    rc, out, _ = run(capsys, "check", path)
    assert rc == 0
    assert (
        "verdicts proven for SGLang 0.5.23; ComfyUI 0.33.0 at 783545f with comfy-kitchen 0.2.31 and 0.2.40; comfy-kitchen 0.2.40"
        in out
    )
    rc, out, _ = run(capsys, "check", path, "--target", "comfy-kitchen")
    assert out.splitlines()[-3] == "verdicts proven for comfy-kitchen 0.2.40"
    rc, out, _ = run(capsys, "check", path, "--json")
    targets = json.loads(out)["targets"]
    assert targets["sglang"]["proven_for"] == [{"runtime": "SGLang", "version": "0.5.23", "commit": None}]
    assert targets["comfyui"]["proven_for"] == [
        {"runtime": "ComfyUI", "version": "0.33.0", "commit": "783545f"},
        {"runtime": "comfy-kitchen", "version": "0.2.31", "commit": None},
        {"runtime": "comfy-kitchen", "version": "0.2.40", "commit": None},
    ]
    assert targets["comfy-kitchen"]["proven_for"] == [{"runtime": "comfy-kitchen", "version": "0.2.40", "commit": None}]
    assert all(t["modelled"] is None for t in targets.values())


def test_sglang_layer_building_is_said_to_be_modelled(tmp_path, capsys):
    """A W4A8 K that its group size does not divide passes SGLang's marker functions and fails
    when SGLang builds the layer: that verdict is modelled from SGLang's source, and says so; a
    failure inside the marker functions (proven by running them) does not."""
    built = write(tmp_path / "k.safetensors", w4a8_layer(P, k=200, g=8, marker=dict(W4A8_MARKER, group_size=8)))
    rc, out, _ = run(capsys, "check", built, "--target", "sglang", "--json")
    sglang = json.loads(out)["targets"]["sglang"]
    assert rc == 1 and sglang["rule"] == "sglang.B1" and "modelled from SGLang's source" in sglang["modelled"]
    rc, out, _ = run(capsys, "check", built, "--target", "sglang")
    assert "incompatible with group_size=8 and convrot_groupsize=256 (modelled from SGLang's source" in out
    marker = write(tmp_path / "m.safetensors", w4a8_layer(P, marker=dict(W4A8_MARKER, convrot=False)))
    rc, out, _ = run(capsys, "check", marker, "--target", "sglang", "--json")
    sglang = json.loads(out)["targets"]["sglang"]
    assert rc == 1 and sglang["rule"] == "sglang.R3" and sglang["modelled"] is None


def test_recursive_check_names_the_versions(tmp_path, capsys):
    write(tmp_path / "a.safetensors", w4a8_layer(P))
    rc, out, _ = run(capsys, "check", tmp_path, "-r", "--target", "sglang,comfyui")
    lines = out.splitlines()
    assert (
        rc == 0
        and lines[-2] == "verdicts proven for SGLang 0.5.23; ComfyUI 0.33.0 at 783545f with comfy-kitchen 0.2.31 and 0.2.40"
    )
    rc, out, _ = run(capsys, "check", tmp_path, "-r", "--json")
    summary = json.loads(out)["summary"]["targets"]
    assert summary["comfy-kitchen"]["proven_for"] == [{"runtime": "comfy-kitchen", "version": "0.2.40", "commit": None}]
