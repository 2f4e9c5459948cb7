"""``fix`` is format-agnostic: what it knows about one format comes from that format's package
(``Format.infer_marker``, ``Format.lossy``, ``MarkerKey.drop_invalid``, ``legacy_renames``).

The marker an unmarked W4A8 layer gets is the package's inference, which reads the packed
row width for both bit depths: an unmarked 6-bit layer must not get the group size of 4-bit
rows (K = 2 x width), which misreads the layer."""

from __future__ import annotations

import ast
import os

import pytest

from comfyquant import check
from comfyquant.formats.registry import FORMATS
from comfyquant.repair.run import fix

P = "blocks.0.attn.qkv"
REPAIR = os.path.join(os.path.dirname(__file__), "..", "src", "comfyquant", "repair")


@pytest.mark.needs_torch
def test_unmarked_6bit_w4a8_layer_gets_its_own_group_size(tmp_path):
    import torch

    from kitchen_fixtures import decoded_layer, make_layer, write_layers

    layer = make_layer("w6a8", n=32, k=256, group_size=16, convrot_groupsize=64)
    marked = write_layers(tmp_path / "marked.safetensors", [layer])
    src = write_layers(tmp_path / "in.safetensors", [layer.with_marker(None)])
    dest = str(tmp_path / "out.safetensors")
    # SGLang reads no 6-bit rows, nor does the comfy-kitchen ComfyUI 0.33.0 pins (0.2.31)
    result = fix(src, out=dest, convrot_groupsize=64, target="comfy-kitchen")
    assert result.ok, [f.message for f in result.remaining] + [w for _, w in result.plan.refused]
    assert result.plan.markers[P] == {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 64, "convrot": True}
    assert check(dest, target="comfy-kitchen").ok
    assert check(dest, target="comfyui").verdicts["comfyui"].with_newer_kitchen.loads
    assert torch.equal(decoded_layer(dest, P), decoded_layer(marked, P))


@pytest.mark.needs_torch
def test_unmarked_w4a8_layer_that_both_depths_fit_reports_the_group_size_as_assumed(tmp_path):
    """6-bit rows of K=384 in groups of 32 store [N, 288] codes and 12 groups per row; 4-bit
    rows of K=576 in groups of 48 store the same shapes.  fix takes 4-bit and says so."""
    from kitchen_fixtures import make_layer, write_layers

    layer = make_layer("w6a8", n=32, k=384, group_size=32, convrot_groupsize=64)
    src = write_layers(tmp_path / "in.safetensors", [layer.with_marker(None)])
    result = fix(src, dry_run=True, convrot_groupsize=64)
    assert result.plan.markers[P]["group_size"] == 48
    assert ("group_size", 48) in [(a.key, a.value) for a in result.plan.assumptions]


@pytest.mark.needs_torch
def test_unmarked_w4a8_layer_without_usable_group_scales_is_refused(tmp_path):
    from kitchen_fixtures import make_layer, write_layers

    layer = make_layer("w4a8_codebook", n=32, k=256)
    s_rel = layer.tensors["weight_s_rel"]
    odd = layer.with_tensor("weight_s_rel", s_rel[:, :7].contiguous()).with_marker(None)
    src = write_layers(tmp_path / "in.safetensors", [odd])
    result = fix(src, dry_run=True, convrot_groupsize=256)
    assert (P, "unmarked W4A8 layer: group size cannot be told from weight_s_rel") in result.plan.refused


def test_every_lossy_recode_writes_what_its_slots_describe():
    """The lossy hook's planned tensors are the format's own slot shapes (no restated shapes)."""
    from comfyquant.formats.base import Meta
    from comfyquant.repair.lossy import readers

    fmts = [f for f in FORMATS.values() if f.lossy is not None]
    assert fmts
    for fmt in fmts:
        tensors = {
            "weight": Meta("I8", (64, 192)),
            "weight_s_rel": Meta("F8_E4M3", (64, 16)),
            "weight_s_channel": Meta("F32", (64,)),
        }
        env = fmt.geometry(tensors, fmt.params({"format": fmt.name, "group_size": 16, "convrot_groupsize": 64}))
        assert env["bits"] == 6
        recode = fmt.lossy(fmt, env, tensors, readers("sglang"))
        assert recode is not None and recode.marker["format"] == fmt.name
        new_env = fmt.geometry({s: Meta(*spec) for s, spec in recode.writes.items()}, fmt.params(recode.marker))
        for suffix, (dtype, shape) in recode.writes.items():
            slot = fmt.slots_for(new_env)[suffix]
            assert (slot.dtype, slot.expected_shape(new_env)) == (dtype, shape)
        assert fmt.lossy(fmt, env, tensors, readers("comfy-kitchen")) is None


def _string_literals(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


@pytest.mark.parametrize("module", sorted(m for m in os.listdir(REPAIR) if m.endswith(".py")))
def test_repair_names_no_format(module):
    """No format name appears as a string in repair/ (docstrings included): what fix knows
    about a format, it asks the format's package."""
    names = set(FORMATS)
    hits = [(line, text) for line, text in _string_literals(os.path.join(REPAIR, module)) if any(name in text for name in names)]
    assert not hits, f"repair/{module} names formats: {hits}"


@pytest.mark.parametrize("module", sorted(m for m in os.listdir(REPAIR) if m.endswith(".py")))
def test_repair_imports_no_format_package(module):
    """repair/ reaches formats through the registry and the shared modules, never one package."""
    import comfyquant.formats as formats

    root = os.path.dirname(formats.__file__)
    packages = {d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "__init__.py"))}
    with open(os.path.join(REPAIR, module), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in imported if set(m.split(".")) & packages], imported


def test_a_flag_the_format_always_sets_is_written_with_its_only_value(tmp_path):
    """W4A8 always rotates: ``convrot: false`` is ignored by ComfyUI and comfy-kitchen and
    refused by SGLang.  fix must not plan "set convrot to a valid value: False -> False" and
    write a file SGLang still refuses."""
    from builders import W4A8_MARKER, w4a8_layer, write

    src = write(tmp_path / "in.safetensors", w4a8_layer(P, marker=dict(W4A8_MARKER, convrot=False)))
    assert not check(src, target="sglang").ok
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert result.ok, [f.message for f in result.remaining]
    assert result.plan.markers[P]["convrot"] is True and not result.plan.assumptions
    assert [(c.before, c.after) for c in result.plan.changes if "convrot" in c.what] == [("False", "True")]
    assert check(dest, target="sglang").ok
