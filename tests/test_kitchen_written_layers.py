"""Real comfy-kitchen 0.2.40 layers, written with safetensors, checked as the runtimes read them.

Every format/variant comfy-kitchen can write is quantized on CPU (``kitchen_fixtures``), saved
with ``safetensors.torch.save_file`` and run through ``comfyquant.check`` and the SGLang
drop-in.  Expectations are what comfy-kitchen 0.2.40 writes (its layouts in
``comfy_kitchen/tensor/``), what SGLang 0.5.23 raises (``inspect_comfy_quant_markers``,
``resolve_comfy_checkpoint_quantization``, its linear methods) and where ComfyUI 0.33.0
(``comfy/ops.py``, ``comfy/utils.py``) reads the same file differently.
"""

from __future__ import annotations

import json
import os
import struct
import sys

import pytest
import torch

import comfyquant
from comfyquant.compat.sglang import inspect_comfy_quant_markers
from kitchen_fixtures import (
    DTYPES,
    PREFIX,
    VARIANTS,
    dense_layer,
    make_layer,
    marker_tensor,
    markers_for,
    seed_defect,
    state_dict,
    write_layers,
    write_sharded,
)

ALL = ("sglang", "comfyui", "comfy-kitchen")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


# -- helpers -----------------------------------------------------------------------------------


def read_header(path) -> dict:
    """The raw safetensors header (independent of comfyquant's reader)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def layout(path) -> dict[str, tuple[str, tuple]]:
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in read_header(path).items() if k != "__metadata__"}


def errors(report) -> list:
    return [f for f in report.findings if f.severity == "error"]


def describe(findings) -> list[str]:
    return [f"{f.severity} {f.code} {f.tensor}: {f.message}" for f in findings]


def assert_clean_for(path, target: str) -> None:
    """``target`` loads the file and no finding is an error when only ``target`` is selected."""
    report = comfyquant.check(path, target=target)
    verdict = report.verdicts[target]
    assert verdict.loads, f"{target}: {verdict.first}"
    assert not errors(report), describe(errors(report))
    assert report.ok


PINNED_SIX_BIT = "comfyui.w4a8"
"""The rule of what the comfy-kitchen ComfyUI 0.33.0 pins raises on a 6-bit W4A8 layer."""


def assert_pinned_six_bit(path) -> None:
    """A 6-bit W4A8 file in ComfyUI 0.33.0: its pinned comfy-kitchen (0.2.31) reads 4-bit rows
    only and fails the first forward; with comfy-kitchen 0.2.40 it loads, and the only error is
    that one."""
    report = comfyquant.check(path, target="comfyui")
    verdict = report.verdicts["comfyui"]
    assert verdict.first.rule == PINNED_SIX_BIT and "0.2.31" in verdict.first.cause, verdict.first
    assert verdict.with_newer_kitchen.loads
    assert {f.code for f in errors(report)} == {PINNED_SIX_BIT}, describe(errors(report))


def sglang_message(path, mapper=None) -> str:
    with pytest.raises(ValueError) as exc:
        inspect_comfy_quant_markers([str(path)], mapper)
    return str(exc.value)


@pytest.fixture
def write(tmp_path):
    """write(layers, name=..., marker_mode=..., metadata=...) -> path of a real safetensors file."""
    counter = iter(range(10_000))

    def _write(layers, name=None, marker_mode="tensor", metadata=None):
        path = tmp_path / (name or f"ckpt{next(counter)}.safetensors")
        return write_layers(path, layers if isinstance(layers, list) else [layers], marker_mode, metadata)

    return _write


# -- the fixtures produce what comfy-kitchen 0.2.40 writes --------------------------------------

BIAS = {f"{PREFIX}.bias": ("BF16", (32,))}
KITCHEN_WRITES = {
    "fp8": {"weight": ("F8_E4M3", (32, 256)), "weight_scale": ("F32", ())},
    "fp8_static": {"weight": ("F8_E4M3", (32, 256)), "weight_scale": ("F32", ()), "input_scale": ("F32", ())},
    "fp8_e5m2": {"weight": ("F8_E5M2", (32, 256)), "weight_scale": ("F32", ())},
    "int8_scalar": {"weight": ("I8", (32, 256)), "weight_scale": ("F32", ())},
    "int8_rowwise": {"weight": ("I8", (32, 256)), "weight_scale": ("F32", (32, 1))},
    "int8_convrot": {"weight": ("I8", (32, 256)), "weight_scale": ("F32", (32, 1))},
    "w4a8_codebook": {
        "weight": ("I8", (32, 128)),
        "weight_s_rel": ("F8_E4M3", (32, 16)),
        "weight_s_channel": ("F32", (32,)),
        "weight_codebook": ("F32", (16,)),
    },
    "w4a8_uniform": {"weight": ("I8", (32, 128)), "weight_s_rel": ("F8_E4M3", (32, 16)), "weight_s_channel": ("F32", (32,))},
    "w4a8_asym": {
        "weight": ("I8", (32, 128)),
        "weight_s_rel": ("F8_E4M3", (32, 16)),
        "weight_s_channel": ("F32", (32,)),
        "weight_correction": ("BF16", (16, 32)),
    },
    "w6a8": {"weight": ("I8", (32, 192)), "weight_s_rel": ("F8_E4M3", (32, 16)), "weight_s_channel": ("F32", (32,))},
    "w4a4": {"weight": ("I8", (32, 128)), "weight_scale": ("F32", (32,))},
    "w4a4_int8": {"weight": ("I8", (32, 128)), "weight_scale": ("F32", (32,))},
    "nvfp4": {"weight": ("U8", (32, 128)), "weight_scale": ("F8_E4M3", (128, 16)), "weight_scale_2": ("F32", ())},
    "mxfp8": {"weight": ("F8_E4M3", (32, 256)), "weight_scale": ("F8_E8M0", (128, 8))},
}
# Marker byte lengths (json.dumps default spacing, as the writers dump them); W4A8 is the
# SGLang-compatible one.
MARKER_BYTES = {
    "fp8": 27,
    "fp8_static": 27,
    "int8_scalar": 29,
    "int8_rowwise": 29,
    "int8_convrot": 72,
    "w4a8_codebook": 89,
    "w4a8_uniform": 89,
    "w4a8_asym": 89,
    "w6a8": 89,
    "w4a4": 52,
    "nvfp4": 19,
    "mxfp8": 19,
}


def test_every_variant_is_covered():
    assert set(KITCHEN_WRITES) == set(VARIANTS)


@pytest.mark.parametrize("variant", sorted(KITCHEN_WRITES))
def test_fixture_tensors_match_spec_section_7(write, variant):
    path = write(make_layer(variant))
    got = layout(path)
    want = {f"{PREFIX}.{s}": v for s, v in KITCHEN_WRITES[variant].items()} | BIAS
    marker = got.pop(f"{PREFIX}.comfy_quant")
    assert got == want
    assert marker[0] == "U8" and len(marker[1]) == 1
    if variant in MARKER_BYTES:
        assert marker[1] == (MARKER_BYTES[variant],)


def test_marker_tensor_is_the_writers_bytes():
    marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
    t = marker_tensor(marker)
    assert t.dtype == torch.uint8 and t.dim() == 1
    assert t.numpy().tobytes() == b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}'


def test_marker_styles():
    """ComfyUI writes W4A8 markers without convrot; SGLang 0.5.23 requires it, so the SGLang
    profile adds it."""
    comfy, sglang = markers_for("w4a8_codebook")
    assert comfy == {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}
    assert json.dumps(sglang) == '{"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": true}'
    comfy, sglang = markers_for("int8_convrot", convrot_groupsize=64)
    assert comfy == sglang == {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}
    assert markers_for("w4a4_int8")[0] == {"format": "convrot_w4a4", "convrot_groupsize": 256, "linear_dtype": "int8"}
    assert markers_for("nvfp4") == ({"format": "nvfp4"}, {"format": "nvfp4"})


def test_header_marker_map(write):
    layer = make_layer("w4a8_codebook")
    meta = read_header(write(layer, marker_mode="header"))["__metadata__"]
    assert json.loads(meta["_quantization_metadata"]) == {"format_version": "1.0", "layers": {PREFIX: layer.marker}}
    assert f"{PREFIX}.comfy_quant" not in layout(write(layer, marker_mode="header"))
    both = write(layer, marker_mode="both")
    assert f"{PREFIX}.comfy_quant" in layout(both) and "_quantization_metadata" in read_header(both)["__metadata__"]


def test_quantization_is_deterministic():
    a, b = make_layer("w4a8_codebook", seed=3), make_layer("w4a8_codebook", seed=3)
    assert a.tensors.keys() == b.tensors.keys()
    for s in a.tensors:
        assert torch.equal(a.tensors[s].view(torch.uint8), b.tensors[s].view(torch.uint8)), s
    c = make_layer("w4a8_codebook", seed=4)
    assert not torch.equal(a.tensors["weight"], c.tensors["weight"])


# -- verdicts per variant ----------------------------------------------------------------------

# Which runtimes load a single ck layer `blocks.0.attn.qkv` [32, 256] (BF16, SGLang-style
# marker) and, for SGLang, the rule and exact message it fails with.
QKV = repr(PREFIX)
EXPECTED = {
    "fp8": (ALL, None),
    "fp8_static": (ALL, None),
    # SGLang 0.5.23 resolve_comfy_checkpoint_quantization (R0): no float8_e5m2
    "fp8_e5m2": (("comfyui", "comfy-kitchen"), ("R0", "Unsupported Comfy quantization format(s): float8_e5m2")),
    # plain INT8 markers are embedding-only in SGLang 0.5.23; a linear cannot load them
    "int8_scalar": (("comfyui", "comfy-kitchen"), ("B4", None)),
    "int8_rowwise": (("comfyui", "comfy-kitchen"), ("B4", None)),
    "int8_convrot": (ALL, None),
    "w4a8_codebook": (ALL, None),
    "w4a8_uniform": (ALL, None),
    # comfy-kitchen writes the correction in BF16; SGLang needs F32 (W7)
    "w4a8_asym": (("comfyui", "comfy-kitchen"), ("W7", f"Comfy W4A8 layer {QKV} has an incompatible correction tensor")),
    # SGLang's W5 assumes 4-bit rows, and so does the comfy-kitchen ComfyUI 0.33.0 pins (0.2.31;
    # ComfyUI loads the layer with comfy-kitchen 0.2.40: ``assert_pinned_six_bit``)
    "w6a8": (
        ("comfy-kitchen",),
        ("W5", f"Comfy W4A8 layer {QKV} has incompatible weight/scale shapes: (32, 192), (32, 16), and (32,)"),
    ),
    "w4a4": (ALL, None),
    "w4a4_int8": (ALL, None),
    # the blocked, padded scale fails SGLang's F4 unless N % 128 == 0 and K % 64 == 0
    "nvfp4": (
        ("comfyui", "comfy-kitchen"),
        ("F4", f"Comfy NVFP4 layer {QKV} has incompatible weight/scale shapes: (32, 128) and (128, 16)"),
    ),
    # SGLang does not validate the tensors of marker-only MXFP8 files
    "mxfp8": (ALL, None),
}


def test_expectations_cover_every_variant():
    assert set(EXPECTED) == set(VARIANTS)


@pytest.mark.parametrize("marker_mode", ["tensor", "header", "both"])
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_target_verdicts(write, variant, marker_mode):
    path = write(make_layer(variant), marker_mode=marker_mode)
    loaders, failure = EXPECTED[variant]
    report = comfyquant.check(path)
    assert {t for t, v in report.verdicts.items() if v.loads} == set(loaders)
    for target in loaders:
        assert_clean_for(path, target)
    if variant == "w6a8":
        assert_pinned_six_bit(path)
    if failure is not None:
        rule, message = failure
        first = report.verdicts["sglang"].first
        assert first.rule == f"sglang.{rule}"
        if message is not None:
            assert first.message == message
        sglang_only = comfyquant.check(path, target="sglang")
        assert not sglang_only.ok and not sglang_only.verdicts["sglang"].loads
    json.dumps(report.to_dict())  # the JSON report is serializable


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_weight_dtypes_and_larger_shapes(write, variant, dtype):
    """[128, 512] layers from BF16/F16/F32 weights: same verdicts (NVFP4 passes F4 at N=128)."""
    path = write(make_layer(variant, n=128, k=512, dtype=DTYPES[dtype]))
    loaders, failure = EXPECTED[variant]
    loaders = set(loaders)
    if variant == "nvfp4":
        loaders = set(ALL)
    if variant == "w4a8_asym" and dtype == "f32":
        loaders = set(ALL)  # an F32 correction passes SGLang
    report = comfyquant.check(path)
    assert {t for t, v in report.verdicts.items() if v.loads} == loaders
    for target in loaders:
        assert_clean_for(path, target)
    if variant == "w6a8":
        assert_pinned_six_bit(path)


@pytest.mark.parametrize(
    ("variant", "group_size", "convrot_groupsize"),
    [
        ("w4a8_codebook", 4, 16),
        ("w4a8_codebook", 8, 64),
        ("w4a8_uniform", 32, 64),
        ("w4a8_uniform", 64, 256),
        ("int8_convrot", 16, 16),
        ("int8_convrot", 16, 64),
        ("w4a4", 16, 16),
        ("w4a4", 16, 64),
    ],
)
def test_group_and_rotation_sizes(write, variant, group_size, convrot_groupsize):
    """Group sizes comfy-kitchen allows (``AsymW4A8Int8Layout``) and ConvRot sizes 16/64/256 load
    everywhere."""
    layer = make_layer(variant, n=64, k=256, group_size=group_size, convrot_groupsize=convrot_groupsize)
    path = write(layer)
    for target in ALL:
        assert_clean_for(path, target)
    marker = inspect_comfy_quant_markers([path])[PREFIX]
    assert marker["convrot_groupsize"] == convrot_groupsize
    if variant.startswith("w4a8"):
        assert marker["group_size"] == group_size
        assert ("weight_s_rel", (64, 256 // group_size)) == ("weight_s_rel", tuple(layer.tensors["weight_s_rel"].shape))


# -- the known disagreements, one by one --------------------------------------------------------


def test_nvfp4_f4_depends_on_n(write):
    """N=32, K=256 fails SGLang F4; the same layer with N=128 passes."""
    small = write(make_layer("nvfp4", n=32, k=256))
    msg = "Comfy NVFP4 layer 'blocks.0.attn.qkv' has incompatible weight/scale shapes: (32, 128) and (128, 16)"
    assert sglang_message(small) == msg
    report = comfyquant.check(small)
    assert report.verdicts["sglang"].first.rule == "sglang.F4"
    assert report.verdicts["sglang"].first.message == msg
    assert report.verdicts["comfyui"].loads and report.verdicts["comfy-kitchen"].loads

    large = write(make_layer("nvfp4", n=128, k=256))
    for target in ALL:
        assert_clean_for(large, target)
    assert inspect_comfy_quant_markers([large]) == {PREFIX: {"format": "nvfp4", "_has_pre_quant_scale": False}}


def test_nvfp4_k32_fails_f4(write):
    """N=128, K=32 (scale [128, 4] vs (128, 2)) fails F4."""
    path = write(make_layer("nvfp4", n=128, k=32))
    assert sglang_message(path) == f"Comfy NVFP4 layer {QKV} has incompatible weight/scale shapes: (128, 16) and (128, 4)"
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)


def test_nvfp4_pre_quant_scale(write):
    layer = make_layer("nvfp4", n=128, k=256)
    layer = layer.with_tensor("pre_quant_scale", torch.ones(256, dtype=torch.bfloat16))
    path = write(layer)
    for target in ALL:
        assert_clean_for(path, target)
    assert inspect_comfy_quant_markers([path]) == {PREFIX: {"format": "nvfp4", "_has_pre_quant_scale": True}}


@pytest.mark.parametrize(("variant", "n", "k"), [("nvfp4", 20, 40), ("nvfp4", 120, 256), ("mxfp8", 20, 40), ("mxfp8", 48, 80)])
def test_padded_storage_with_model_sized_bias(write, variant, n, k):
    """comfy-kitchen pads NVFP4 (16) and MXFP8 (32) storage; the bias keeps the model's
    [N] (ComfyUI slices storage back to the model shape).  A valid ComfyUI/ck layer."""
    layer = make_layer(variant, n=n, k=k)
    assert layer.tensors["weight"].shape[0] > n and layer.tensors["bias"].shape == (n,)
    path = write(layer)
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)
    report = comfyquant.check(path)
    assert not [f for f in report.findings if f.tensor == f"{PREFIX}.bias"], describe(report.findings)


def test_runtime_violation_stays_on_its_tensor(write):
    """The SGLang failure of a padded NVFP4 layer (N=20, K=40), which names weight_scale, must
    be reported on weight_scale with SGLang's message, not folded into a finding about another
    tensor of the layer."""
    path = write(make_layer("nvfp4", n=20, k=40))
    msg = f"Comfy NVFP4 layer {QKV} has incompatible weight/scale shapes: (32, 24) and (128, 4)"
    assert sglang_message(path) == msg
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.message == msg
    blamed = [f for f in report.findings if "sglang" in f.targets]
    assert blamed, describe(report.findings)
    assert all(f.tensor == f"{PREFIX}.weight_scale" for f in blamed), describe(blamed)
    assert any(f.message == msg for f in blamed), describe(blamed)


@pytest.mark.parametrize("variant", ["w4a8_codebook", "w4a8_uniform", "w4a8_asym", "w6a8"])
def test_comfyui_w4a8_marker_without_convrot(write, variant):
    """ComfyUI writes no convrot key; SGLang refuses the marker (R3) when the tensors pass."""
    path = write(make_layer(variant, marker="comfyui", dtype=torch.float32))
    report = comfyquant.check(path)
    first = report.verdicts["sglang"].first
    if variant == "w6a8":  # inspect runs before resolve: W5 comes first
        assert first.rule == "sglang.W5"
    else:
        assert first.rule == "sglang.R3"
        assert first.message == f"Serialized W4A8 layer {QKV} must set convrot=true"
    for target in ("comfy-kitchen",) if variant == "w6a8" else ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)
    if variant == "w6a8":
        assert_pinned_six_bit(path)
    # inspect itself passes (the convrot check is resolve's): the drop-in returns the marker
    if variant != "w6a8":
        marker = inspect_comfy_quant_markers([path])[PREFIX]
        assert "convrot" not in marker and marker["format"] == "asym_w4a8_int8"
    # a finding says what is missing, and it is an error only when SGLang is selected
    findings = [f for f in report.findings if f.layer == PREFIX and "convrot" in f.message and f.code != PINNED_SIX_BIT]
    assert findings and any(f.severity == "error" for f in findings)
    assert not [f for f in errors(comfyquant.check(path, target="comfyui")) if f.code != PINNED_SIX_BIT]


def test_w6a8_sglang(write):
    """SGLang W5; comfy-kitchen loads 6-bit rows (ComfyUI with comfy-kitchen 0.2.40)."""
    path = write(make_layer("w6a8"))
    msg = f"Comfy W4A8 layer {QKV} has incompatible weight/scale shapes: (32, 192), (32, 16), and (32,)"
    assert sglang_message(path) == msg
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.message == msg
    # The model's in_features is 256: no finding may claim the layer's input size is 384
    # (SGLang's layer building checks the model's K; 2 x 192 is only W5's 4-bit misreading, and
    # the message of ComfyUI 0.33.0's comfy-kitchen 0.2.31, which reads the rows so, its own).
    claims = [f for f in report.findings if "384" in f.message and f.code != PINNED_SIX_BIT]
    assert not claims, describe(report.findings)
    assert_pinned_six_bit(path)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_w4a8_asym_correction(write, dtype):
    """comfy-kitchen's BF16/F16 correction fails SGLang W7; ComfyUI silently drops the correction."""
    path = write(make_layer("w4a8_asym", dtype=DTYPES[dtype]))
    assert sglang_message(path) == f"Comfy W4A8 layer {QKV} has an incompatible correction tensor"
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.rule == "sglang.W7"
    comfy = report.verdicts["comfyui"]
    assert comfy.loads
    assert any("weight_correction" in w for w in comfy.to_dict()["warnings"])
    dropped = [f for f in report.findings if f.severity == "warning" and "comfyui" in f.targets]
    assert any(f.tensor == f"{PREFIX}.weight_correction" for f in dropped), describe(report.findings)
    # the dtype is the SGLang error, on the correction, naming the slot's F32 (16, 32)
    corr = [f for f in errors(report) if f.tensor == f"{PREFIX}.weight_correction"]
    assert len(corr) == 1 and "sglang" in corr[0].targets
    assert corr[0].expected == "F32 (16, 32)"
    assert corr[0].actual == f"{dtype.upper()} (16, 32)"
    assert_clean_for(path, "comfy-kitchen")
    only_comfy = comfyquant.check(path, target="comfyui")
    assert only_comfy.ok and any(f.severity == "warning" and "weight_correction" in (f.tensor or "") for f in only_comfy.findings)


def test_w4a8_asym_f32_passes_sglang(write):
    path = write(make_layer("w4a8_asym", dtype=torch.float32))
    assert layout(path)[f"{PREFIX}.weight_correction"] == ("F32", (16, 32))
    assert inspect_comfy_quant_markers([path]) == {
        PREFIX: {
            "format": "asym_w4a8_int8",
            "group_size": 16,
            "convrot_groupsize": 256,
            "convrot": True,
            "_has_codebook": False,
            "_has_correction": True,
        }
    }
    assert_clean_for(path, "sglang")
    assert_clean_for(path, "comfy-kitchen")
    assert comfyquant.check(path).verdicts["comfyui"].loads


def test_seed_defect_one_finding(write):
    """The seed record: ck asymmetric W4A8 whose correction is stored transposed (N, K//G) in BF16."""
    layer = seed_defect(make_layer("w4a8_asym"))
    path = write(layer)
    assert layout(path)[f"{PREFIX}.weight_correction"] == ("BF16", (32, 16))
    assert sglang_message(path) == f"Comfy W4A8 layer {QKV} has an incompatible correction tensor"

    report = comfyquant.check(path)
    on_corr = [f for f in report.findings if (f.tensor or "").endswith("weight_correction") and f.severity == "error"]
    assert len(on_corr) == 1, describe(report.findings)
    f = on_corr[0]
    assert "transposed" in f.cause and "BF16, needs F32" in f.cause
    assert f.expected == "F32 (16, 32)"
    assert f.actual == "BF16 (32, 16)"
    assert {"sglang", "comfy-kitchen"} <= set(f.targets)
    # one defect, one canonical finding (dtype and shape are not reported twice)
    canonical = [x for x in report.findings if (x.tensor or "").endswith("weight_correction") and "." not in x.code]
    assert canonical == [f]
    assert report.verdicts["sglang"].first.rule == "sglang.W7"
    assert not report.verdicts["comfy-kitchen"].loads  # correction must have shape (16, 32)
    assert report.verdicts["comfyui"].loads  # ComfyUI never reads the correction


def test_plain_int8_on_linear_and_embedding(write):
    """Plain INT8 is embedding-only in SGLang."""
    for variant, derived in (("int8_scalar", "_is_tensorwise_scalar"), ("int8_rowwise", "_is_rowwise")):
        linear = write(make_layer(variant))
        # inspect and resolve succeed ...
        assert inspect_comfy_quant_markers([linear]) == {PREFIX: {"format": "int8_tensorwise", derived: True}}
        report = comfyquant.check(linear)
        # ... but the linear layer cannot load its I8 weight
        assert not report.verdicts["sglang"].loads
        assert report.verdicts["sglang"].first.rule == "sglang.B4"
        for target in ("comfyui", "comfy-kitchen"):
            assert_clean_for(linear, target)
        embedding = write(make_layer(variant, prefix="text_encoder.embed_tokens", n=64, k=128, bias=False))
        for target in ALL:
            assert_clean_for(embedding, target)


def test_plain_int8_linear_next_to_w4a8_raises(write):
    """Under KitchenW4A8Config a plain INT8 marker on a linear raises at layer build."""
    path = write([make_layer("w4a8_codebook"), make_layer("int8_rowwise", prefix="blocks.0.mlp.fc1", seed=1)])
    first = comfyquant.check(path).verdicts["sglang"].first
    assert first.message == "Unsupported quantized linear marker for 'blocks.0.mlp.fc1'"


@pytest.mark.parametrize("main", ["w4a8_codebook", "nvfp4"])
def test_int8_embedding_companion(write, main):
    """W4A8 and NVFP4 configs accept INT8 embedding markers."""
    path = write([make_layer(main, n=128), make_layer("int8_rowwise", prefix="txt.embed", n=64, k=128, bias=False)])
    for target in ALL:
        assert_clean_for(path, target)


def test_convrot_int8_next_to_w4a8_is_r4(write):
    """A ConvRot INT8 linear is not a W4A8 companion."""
    path = write([make_layer("w4a8_codebook"), make_layer("int8_convrot", prefix="blocks.0.mlp.fc1", seed=1)])
    first = comfyquant.check(path).verdicts["sglang"].first
    assert first.rule == "sglang.R4"
    assert first.message == "Unsupported Comfy W4A8 format for 'blocks.0.mlp.fc1': 'int8_tensorwise'"


def test_mxfp8_marker_only_loads_everywhere(write):
    path = write(make_layer("mxfp8"))
    assert layout(path)[f"{PREFIX}.weight_scale"] == ("F8_E8M0", (128, 8))
    for target in ALL:
        assert_clean_for(path, target)
    assert inspect_comfy_quant_markers([path]) == {PREFIX: {"format": "mxfp8"}}


def test_mxfp8_quant_format_with_ck_scales_fails_x1(write):
    """With quant_format=mxfp8 SGLang needs U8 [N, K/32]; ck writes F8_E8M0 blocked."""
    path = write(make_layer("mxfp8"), metadata={"quant_format": "mxfp8"})
    msg = (
        "MXFP8 layer 'blocks.0.attn.qkv' has incompatible weight/scale metadata: ('F8_E4M3', (32, 256)) and ('F8_E8M0', (128, 8))"
    )
    assert sglang_message(path) == msg
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.rule == "sglang.X1"
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)


def test_mxfp8_quant_format_u8_scales_without_marker(write):
    """N, K multiples of 128 and the scale relabelled U8: SGLang creates the marker."""
    layer = make_layer("mxfp8", n=128, k=128)
    layer = layer.with_tensor("weight_scale", layer.tensors["weight_scale"].view(torch.uint8)).with_marker(None)
    path = write(layer, metadata={"quant_format": "MXFP8"})
    assert inspect_comfy_quant_markers([path]) == {PREFIX: {"format": "mxfp8"}}
    assert_clean_for(path, "sglang")
    # ComfyUI needs the marker: without one the FP8 weight is cast by value
    assert not comfyquant.check(path, target="comfyui").ok


def test_mixed_formats_comfyui_only(write):
    """ComfyUI loads any per-layer mix; SGLang only the sets its config resolution accepts
    (0.5.23 ``resolve_comfy_checkpoint_quantization``)."""
    variants = ["fp8", "int8_convrot", "w4a8_codebook", "w4a4", "nvfp4", "mxfp8"]
    layers = [make_layer(v, prefix=f"blocks.{i}.ff", n=128, k=256, seed=i, marker="comfyui") for i, v in enumerate(variants)]
    path = write(layers)
    report = comfyquant.check(path)
    first = report.verdicts["sglang"].first
    assert first.rule == "sglang.R0" and first.exception == "NotImplementedError"
    assert first.message == (
        "Unsupported Comfy quantization format(s): asym_w4a8_int8, convrot_w4a4, float8_e4m3fn, int8_tensorwise, mxfp8, nvfp4"
    )
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)


@pytest.mark.parametrize(
    ("a", "b"), [("fp8", "int8_convrot"), ("fp8", "nvfp4"), ("w4a8_codebook", "w4a4"), ("mxfp8", "int8_convrot")]
)
def test_rejected_pairs(write, a, b):
    path = write([make_layer(a, n=128), make_layer(b, prefix="blocks.1.ff", n=128, seed=1)])
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.rule == "sglang.R0"
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)


# -- the SGLang drop-in --------------------------------------------------------------------------

W4A8_SGLANG = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True}
INSPECT = {
    "fp8": {"format": "float8_e4m3fn", "_activation_scheme": "dynamic"},
    "fp8_static": {"format": "float8_e4m3fn", "_activation_scheme": "static"},
    "fp8_e5m2": {"format": "float8_e5m2"},  # not validated by inspect; resolve rejects it
    "int8_scalar": {"format": "int8_tensorwise", "_is_tensorwise_scalar": True},
    "int8_rowwise": {"format": "int8_tensorwise", "_is_rowwise": True},
    "int8_convrot": {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256, "_is_rowwise": True},
    "w4a8_codebook": W4A8_SGLANG | {"_has_codebook": True, "_has_correction": False},
    "w4a8_uniform": W4A8_SGLANG | {"_has_codebook": False, "_has_correction": False},
    "w4a4": {"format": "convrot_w4a4", "convrot_groupsize": 256},
    "w4a4_int8": {"format": "convrot_w4a4", "convrot_groupsize": 256, "linear_dtype": "int8"},
    "mxfp8": {"format": "mxfp8"},
}
INSPECT_RAISES = {
    "w4a8_asym": f"Comfy W4A8 layer {QKV} has an incompatible correction tensor",
    "w6a8": f"Comfy W4A8 layer {QKV} has incompatible weight/scale shapes: (32, 192), (32, 16), and (32,)",
    "nvfp4": f"Comfy NVFP4 layer {QKV} has incompatible weight/scale shapes: (32, 128) and (128, 16)",
}


def test_inspect_expectations_cover_every_variant():
    assert set(INSPECT) | set(INSPECT_RAISES) == set(VARIANTS)


@pytest.mark.parametrize("marker_mode", ["tensor", "header", "both"])
@pytest.mark.parametrize("variant", sorted(INSPECT))
def test_dropin_returns_derived_keys(write, variant, marker_mode):
    path = write(make_layer(variant), marker_mode=marker_mode)
    assert inspect_comfy_quant_markers([path]) == {PREFIX: INSPECT[variant]}


@pytest.mark.parametrize("marker_mode", ["tensor", "header", "both"])
@pytest.mark.parametrize("variant", sorted(INSPECT_RAISES))
def test_dropin_raises_sglang_message(write, variant, marker_mode):
    path = write(make_layer(variant), marker_mode=marker_mode)
    assert sglang_message(path) == INSPECT_RAISES[variant]


def test_dropin_header_subset_merges_with_tensor_marker(write, tmp_path):
    """SGLang merges header and tensor markers per prefix as a union of keys."""
    from safetensors.torch import save_file

    layer = make_layer("w4a8_uniform")
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {PREFIX: {"format": "asym_w4a8_int8"}}})}
    path = str(tmp_path / "subset.safetensors")
    save_file(state_dict([layer]), path, metadata=meta)
    assert inspect_comfy_quant_markers([path]) == {PREFIX: INSPECT["w4a8_uniform"]}
    for target in ALL:
        assert_clean_for(path, target)


def test_dropin_conflicting_markers(tmp_path):
    """The same key with two values in header and tensor markers."""
    from safetensors.torch import save_file

    layer = make_layer("w4a8_uniform")
    header = dict(layer.marker, convrot_groupsize=64)
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {PREFIX: header}})}
    path = str(tmp_path / "conflict.safetensors")
    save_file(state_dict([layer]), path, metadata=meta)
    assert sglang_message(path) == f"Conflicting Comfy quantization markers for {QKV}"
    assert comfyquant.check(path).verdicts["sglang"].first.rule == "sglang.P1"


def test_dropin_mapper_and_collision(write):
    root = "model.diffusion_model."
    mapper = lambda name: name[len(root) :] if name.startswith(root) else name  # noqa: E731
    path = write(
        [make_layer("w4a8_codebook", prefix=root + PREFIX), make_layer("w4a8_uniform", prefix=root + "blocks.1.ff", seed=1)]
    )
    assert inspect_comfy_quant_markers([path], mapper) == {
        PREFIX: INSPECT["w4a8_codebook"],
        "blocks.1.ff": INSPECT["w4a8_uniform"],
    }
    both = write([make_layer("w4a8_codebook", prefix=root + PREFIX), make_layer("w4a8_uniform", seed=1)])
    assert sglang_message(both, mapper) == f"Comfy markers collide after parameter mapping at {QKV}"


def test_dropin_missing_marker(write):
    """An I8 weight without a marker."""
    path = write([make_layer("w4a8_codebook"), make_layer("int8_convrot", prefix="blocks.1.ff", seed=1).with_marker(None)])
    assert sglang_message(path) == "Quantized weights are missing comfy_quant metadata: ['blocks.1.ff']"


# -- shards ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("marker_mode", ["tensor", "header", "both"])
def test_sharded_checkpoint(tmp_path, marker_mode):
    root = "model.diffusion_model."
    shards = [
        [make_layer("int8_convrot", prefix=root + "blocks.0.attn.qkv", n=64, seed=1)],
        [
            make_layer("int8_convrot", prefix=root + "blocks.1.attn.qkv", n=64, seed=2),
            dense_layer(root + "norm", (256,), bias=True),
        ],
    ]
    folder = tmp_path / "ckpt"
    files = write_sharded(folder, shards, marker_mode=marker_mode)
    index = folder / "model.safetensors.index.json"
    for source in (str(folder), str(index), files):
        report = comfyquant.check(source)
        assert report.files and len(report.files) == 2
        for target in ALL:
            assert_clean_for(source, target)
    mapper = lambda name: name[len(root) :] if name.startswith(root) else name  # noqa: E731
    got = inspect_comfy_quant_markers(files, mapper)
    assert got == {f"blocks.{i}.attn.qkv": INSPECT["int8_convrot"] for i in (0, 1)}
    weight_map = json.loads(index.read_text())["weight_map"]
    assert weight_map[root + "norm.weight"] == os.path.basename(files[1])


def test_deep_check_on_every_variant(write):
    """--deep reads scales, codebooks and corrections: ck's real values raise no value errors."""
    for variant in sorted(VARIANTS):
        path = write(make_layer(variant, n=128, k=256))
        report = comfyquant.check(path, deep=True)
        assert not [f for f in report.findings if f.code.startswith("D")], (variant, describe(report.findings))


# -- examples/ -----------------------------------------------------------------------------------


def _load_make_examples():
    sys.path.insert(0, EXAMPLES)
    try:
        import make_examples
    finally:
        sys.path.remove(EXAMPLES)
    return make_examples


def test_examples_are_up_to_date(tmp_path):
    """The committed example files are exactly what examples/make_examples.py writes."""
    mk = _load_make_examples()
    written = mk.build(str(tmp_path))
    assert written
    for path in written:
        rel = os.path.relpath(path, tmp_path)
        committed = os.path.join(EXAMPLES, rel)
        assert os.path.exists(committed), f"{rel} missing: run python examples/make_examples.py"
        with open(path, "rb") as a, open(committed, "rb") as b:
            assert a.read() == b.read(), f"{rel} is stale: run python examples/make_examples.py"
        if path.endswith(".safetensors"):
            assert os.path.getsize(path) < 300_000


def test_example_seed_broken():
    path = os.path.join(EXAMPLES, "seed_broken_w4a8.safetensors")
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.message == "Comfy W4A8 layer 'blocks.0.mlp.fc1' has an incompatible correction tensor"
    assert not report.verdicts["comfy-kitchen"].loads
    assert report.verdicts["comfyui"].loads
    bad = [f for f in errors(report) if f.tensor == "blocks.0.mlp.fc1.weight_correction"]
    assert len(bad) == 1 and "transposed" in bad[0].cause and "BF16, needs F32" in bad[0].cause
    assert {f.layer for f in errors(report)} == {"blocks.0.mlp.fc1"}
    assert sglang_message(path) == "Comfy W4A8 layer 'blocks.0.mlp.fc1' has an incompatible correction tensor"
    from comfyquant.cli import main

    assert main(["check", path]) == 1


def test_example_w4a8_sglang():
    path = os.path.join(EXAMPLES, "w4a8_sglang.safetensors")
    for target in ALL:
        assert_clean_for(path, target)
    markers = inspect_comfy_quant_markers([path])
    assert sorted(markers) == ["blocks.0.attn.out", "blocks.0.attn.qkv", "blocks.0.mlp.fc1"]
    assert all(m["convrot"] is True and not m["_has_correction"] for m in markers.values())
    names = layout(path)
    assert names["blocks.0.norm1.weight"] == ("BF16", (256,)) and "blocks.0.attn.qkv.bias" in names
    meta = read_header(path)["__metadata__"]
    assert json.loads(meta["_quantization_metadata"])["format_version"] == "1.0"
    from comfyquant.cli import main

    assert main(["check", path]) == 0


def test_example_mixed_comfyui():
    path = os.path.join(EXAMPLES, "mixed_comfyui.safetensors")
    report = comfyquant.check(path)
    assert report.verdicts["sglang"].first.rule == "sglang.R0"
    formats = {m["format"] for m in inspect_comfy_quant_markers([path]).values()}
    assert formats == {"float8_e4m3fn", "float8_e5m2", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4", "mxfp8"}
    for target in ("comfyui", "comfy-kitchen"):
        assert_clean_for(path, target)


def test_example_sharded():
    folder = os.path.join(EXAMPLES, "sharded")
    for target in ALL:
        assert_clean_for(folder, target)
    report = comfyquant.check(os.path.join(folder, "model.safetensors.index.json"))
    assert len(report.files) == 2 and all(v.loads for v in report.verdicts.values())
    strip = comfyquant.check(folder, strip_prefix="model.diffusion_model.")
    assert strip.ok
