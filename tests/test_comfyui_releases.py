"""The product's ComfyUI release groups (``comfyquant.targets.comfyui_releases``) are the
releases' own: recomputed from the releases tarball, each group's releases share byte-identical
deciding code (``tests/runtimes/releases.py``) and comfy-kitchen requirement, and the formats,
marker forms and comfy-kitchen the product records per group are what each release's source
says.  No torch: the sources are read, not run (``test_comfyui_releases_run.py`` runs them)."""

from __future__ import annotations

import ast

import pytest

from comfyquant.targets import comfyui_releases as product
from runtimes import releases
from runtimes.comfyui_release_driver import folds_before_prefix


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


def _formats(source) -> tuple[str, ...]:
    """The formats a release's ``QUANT_ALGOS`` (or ``QUANT_FORMAT_MIXINS``, 0.3.68's ops)
    defines: its dict literal's keys and the keys assigned into it after."""
    found: list[str] = []
    for rel, name in (("comfy/quant_ops.py", "QUANT_ALGOS"), ("comfy/ops.py", "QUANT_FORMAT_MIXINS")):
        path = source / rel
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == name and isinstance(node.value, ast.Dict):
                    found.extend(ast.literal_eval(k) for k in node.value.keys if k is not None)
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == name:
                    found.append(ast.literal_eval(t.slice))
        if found:
            break
    return tuple(found)


def _markers(source) -> tuple[str, ...]:
    """Tensor markers are read where ``convert_old_quants`` folds ``.comfy_quant`` tensors into
    the layers' configuration; before it, only the header map."""
    utils = (source / "comfy" / "utils.py").read_text()
    reads_tensors = "def convert_old_quants" in utils and "comfy_quant" in utils
    return (product.HEADER, product.TENSOR) if reads_tensors else (product.HEADER,)


def test_groups_are_the_releases_with_identical_deciding_code(root):
    """Every release of the tarball is in the product's groups, in order, and the groups are
    exactly the runs of identical fingerprints; each shared group is printed."""
    found = releases.groups(root)
    assert [list(g.releases) for g in product.GROUPS] == found
    assert list(product.RELEASES) == releases.versions(root)
    for group in product.GROUPS:
        for release in group.releases:
            assert releases.fingerprint(root / f"comfyui-{release}") == group.fingerprint, release
        if len(group.releases) > 1:
            print(f"ComfyUI {', '.join(group.releases)}: byte-identical deciding code ({group.fingerprint}), one group")
    print(f"{len(product.RELEASES)} releases in {len(product.GROUPS)} groups")


@pytest.mark.parametrize("group", product.GROUPS, ids=lambda g: g.first)
def test_group_facts_are_the_release_source(root, group):
    """The comfy-kitchen requirement (pin or minimum), the marker forms and the formats the
    product records are those of every release in the group."""
    for release in group.releases:
        source = root / f"comfyui-{release}"
        req = releases.kitchen_requirement(source)
        assert (req[1] if req else None) == group.kitchen, release
        assert (req is not None and req[0] == "==") == group.pinned, release
        assert _markers(source) == group.markers, release
        assert set(_formats(source)) == set(group.formats), release
        if product.TENSOR in group.markers:  # where the header map is folded in, as its loader does it
            assert folds_before_prefix(source / "comfy" / "sd.py") != product.map_after_prefix(group), release


def test_own_fp8_layout_multiplies_as_recorded(root):
    """The groups without comfy-kitchen are the ones ``SCALE_MULTIPLIED`` lists, and the message
    it records for a missing weight scale is the one of the operator each release's own FP8
    layout dequantizes with: Python's for ``plain * scale``, torch's for ``plain.mul_(scale)``."""
    assert set(product.SCALE_MULTIPLIED) == {g.first for g in product.GROUPS if g.kitchen is None}
    for group in product.GROUPS:
        if group.first not in product.SCALE_MULTIPLIED:
            continue
        message = product.SCALE_MULTIPLIED[group.first]
        for release in group.releases:
            ops = (root / f"comfyui-{release}" / "comfy" / "quant_ops.py").read_text()
            dequantize = ops[ops.index("class TensorCoreFP8Layout") :]
            dequantize = dequantize[dequantize.index("def dequantize") :].split("\n    @", 1)[0]
            if "plain_tensor.mul_(scale)" in dequantize:
                assert message == "mul_(): argument 'other' (position 1) must be Tensor, not NoneType", release
            else:
                assert "plain_tensor * scale" in dequantize, release
                assert message == "unsupported operand type(s) for *: 'Tensor' and 'NoneType'", release


def test_stored_fp8_kept_as_recorded(root):
    """``STORED_FP8_KEPT`` lists exactly the groups without comfy-kitchen whose loader wraps a
    quantized layer's stored weight without casting it to the format's dtype (every other one
    casts it to ``mixin["dtype"]`` or the format's ``storage_t``)."""
    kept = set()
    for group in product.GROUPS:
        if group.kitchen is not None:
            continue
        found = set()
        for release in group.releases:
            ops = (root / f"comfyui-{release}" / "comfy" / "ops.py").read_text()
            wraps = [line.strip() for line in ops.splitlines() if "QuantizedTensor(weight.to(" in line]
            assert wraps, release
            found.add(all("dtype=" not in line for line in wraps))
        assert len(found) == 1, group.first
        if found.pop():
            kept.add(group.first)
    assert kept == set(product.STORED_FP8_KEPT)
