"""``diagnose``: a slot mismatch explained as a structured cause, and the fix chosen by its kind."""

from __future__ import annotations

import pytest

from builders import w4a8_layer, write, zeros
from comfyquant import check
from comfyquant.formats import diagnose as dg
from comfyquant.formats.base import Format, Meta, Slot
from comfyquant.formats.common import FORMAT_KEY
from comfyquant.formats.registry import FORMATS
from comfyquant.formats.validation import check_layer

P = "blocks.0.attn.qkv"
W4A8 = FORMATS["asym_w4a8_int8"]
ENV = {"N": 32, "K": 256, "group_size": 16, "bits": 4}


def slot(fmt: Format, suffix: str) -> Slot:
    return next(s for s in fmt.slots if s.suffix == suffix)


@pytest.mark.parametrize(
    ("suffix", "actual", "kind", "step"),
    [
        ("weight_correction", (32, 16), dg.TRANSPOSED, "transpose to (16, 32)"),
        ("weight_correction", (8, 32), dg.OTHER_GROUP_SIZE, ""),
        ("weight_correction", (32, 8), dg.OTHER_GROUP_SIZE, ""),
        ("weight_correction", (5, 7), dg.OTHER_SHAPE, ""),
        ("weight_s_rel", (32, 32), dg.OTHER_GROUP_SIZE, ""),
    ],
)
def test_shape_cause_kinds(suffix, actual, kind, step):
    s = slot(W4A8, suffix)
    cause = dg.shape_cause(s, ENV, actual, s.expected_shape(ENV))
    assert cause.kind == kind and cause.step == step and cause.severity == "error"
    assert (kind in dg.REEXPORT) == (step == "")


def test_other_layout_is_the_slots_known_shape():
    nvfp4 = FORMATS["nvfp4"]
    s = slot(nvfp4, "weight_scale")
    env = {"N": 64, "K": 256}
    cause = dg.shape_cause(s, env, (64, 16), s.expected_shape(env))
    assert cause.kind == dg.OTHER_LAYOUT and "unblocked" in cause.text
    assert cause.step == "convert to (128, 16)"  # the shape itself, never its formula


@pytest.mark.parametrize(
    ("suffix", "actual", "kind", "severity"),
    [
        ("weight_correction", "BF16", dg.DOWNCAST, "warning"),  # a known dtype: its note and severity
        ("weight_s_channel", "F16", dg.DOWNCAST, "error"),
        ("weight_s_rel", "U8", dg.RELABELLED, "warning"),
        ("weight", "U8", dg.RELABELLED, "error"),
        ("weight_s_rel", "F32", dg.OTHER_DTYPE, "warning"),
        ("weight_s_channel", "I32", dg.OTHER_DTYPE, "error"),
    ],
)
def test_dtype_cause_kinds(suffix, actual, kind, severity):
    cause = dg.dtype_cause(slot(W4A8, suffix), actual)
    assert (cause.kind, cause.severity) == (kind, severity)


def test_other_shapes_evaluates_the_known_shapes():
    s = Slot(
        "weight_scale",
        "F32",
        "(N, 1)",
        alt_shapes=(("(N,)", "flat", "info"), ("(K // missing,)", "unknown name"), ("(K // 0,)", "division by zero")),
    )
    assert list(s.other_shapes({"N": 4, "K": 8})) == [((4,), "flat", "info")]


def _geometry(tensors: dict, params: dict) -> dict:
    n, k = tensors["weight"].shape
    return dict(params, N=n, K=k)


# Causes worded with words a fix text could be picked by: the fix must follow the kind, not the words.
TRICKY = Format(
    name="tricky_test_format",
    title="a test format whose causes use misleading words",
    slots=(
        Slot("weight", "I8", "(N, K)", kind="weight"),
        Slot(
            "weight_scale",
            "F8_E4M3",
            "(N, 1)",
            alt_shapes=(("(N,)", "stored transposed by an exporter that made for group_size=8 files"),),
            also_dtypes={"F32": ("a downcast-free copy labelled F32 and made for scale_dtype=float32", "warning")},
        ),
    ),
    keys=(FORMAT_KEY,),
    geometry=_geometry,
)


@pytest.mark.parametrize(
    ("scale", "fix"),
    [
        (Meta("F8_E4M3", (4,)), "convert to (4, 1): comfyquant fix"),
        (Meta("F32", (4, 1)), "convert to F8_E4M3: comfyquant fix"),
        (Meta("F32", (4,)), "convert to (4, 1) and convert to F8_E4M3: comfyquant fix"),
    ],
)
def test_fix_follows_the_kind_not_the_words(scale, fix):
    findings, _env = check_layer(TRICKY, {"format": TRICKY.name}, {"weight": Meta("I8", (4, 8)), "weight_scale": scale})
    (f,) = findings
    assert f.fix == fix


def test_seed_file_finding_renders_the_causes(tmp_path):
    """The finding on a real file shows each cause's text, joined, and each cause's fix step."""
    p = write(tmp_path / "seed.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))
    (f,) = [f for f in check(p).findings if f.tensor == f"{P}.weight_correction" and "." not in f.code]
    s = slot(W4A8, "weight_correction")
    causes = [dg.shape_cause(s, ENV, (32, 16), (16, 32)), dg.dtype_cause(s, "BF16")]
    assert [c.kind for c in causes] == [dg.TRANSPOSED, dg.DOWNCAST]
    assert f.cause == "; ".join(c.text for c in causes)
    assert f.fix == "transpose to (16, 32) and upcast to F32 (exact): comfyquant fix"
