"""The per-layer rules (``formats/validation.py``) hold no format knowledge: every word a
finding says about one format comes from that format's description ("one home per
format").  A source scan keeps names out of the generic modules; each data attribute is shown
to reach its finding by a made-up format that sets other words; the words of the current
formats are pinned byte for byte."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from builders import W4A8_MARKER, codebook, int8_layer, marker_tensor, nvfp4_layer, ones, w4a8_layer, write, zeros
from comfyquant import check
from comfyquant.cli import main
from comfyquant.formats.base import Constraint, Format, MarkerKey, Meta, Slot
from comfyquant.formats.common import FORMAT_KEY, dense_geometry
from comfyquant.formats.registry import FORMATS, LAYER_SUFFIXES
from comfyquant.formats.validation import check_layer

P = "blocks.0.attn.qkv"
FORMATS_DIR = Path(__file__).resolve().parent.parent / "src" / "comfyquant" / "formats"
GENERIC = ("validation.py", "diagnose.py", "base.py", "common.py", "registry.py")
KEY_FREE = ("validation.py", "base.py", "registry.py")
"""Generic modules with no marker key name in their code at all (common.py defines the shared
keys; diagnose.py still searches other ``group_size`` values by name)."""


def _code_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are code, not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs.add(id(node.value))  # attribute docstrings after an assignment
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _key_names() -> set[str]:
    return {k.name for f in FORMATS.values() for k in f.keys}


@pytest.mark.parametrize("module", GENERIC)
def test_generic_modules_name_no_format(module):
    tree = ast.parse((FORMATS_DIR / module).read_text())
    names = {n for f in FORMATS.values() for n in (f.name, *f.aliases)}
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?!\w)")
    hits = [(line, s) for line, s in _code_strings(tree) if pattern.search(s)]
    assert not hits, f"{module} names formats in code: {hits}"


@pytest.mark.parametrize("module", GENERIC)
def test_generic_modules_compare_no_key_name(module):
    """No ``k.name == "convrot"`` (or ``!=``, ``in``) against a format's key name."""
    tree = ast.parse((FORMATS_DIR / module).read_text())
    keys = _key_names()
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            reads_name = any(isinstance(o, ast.Attribute) and o.attr == "name" for o in operands)
            literals = [o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)]
            literals += [
                e.value
                for o in operands
                if isinstance(o, (ast.Tuple, ast.List, ast.Set))
                for e in o.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            if reads_name and any(v in keys for v in literals):
                hits.append((node.lineno, ast.unparse(node)))
    assert not hits, f"{module} branches on key names: {hits}"


@pytest.mark.parametrize("module", KEY_FREE)
def test_rule_modules_hold_no_key_name(module):
    keys = _key_names()
    hits = [(line, s) for line, s in _code_strings(ast.parse((FORMATS_DIR / module).read_text())) if s in keys]
    assert not hits, f"{module} names marker keys in code: {hits}"


def test_layer_suffixes_take_the_legacy_names_from_the_formats():
    legacy = {old for f in FORMATS.values() for old in f.legacy_renames}
    assert {"scale_weight", "scale_input"} <= legacy  # scaled FP8 (ComfyUI's convert_old_quants) is described by its package
    slots = {s.suffix for f in FORMATS.values() for s in f.slots}
    assert LAYER_SUFFIXES == slots | legacy | {"comfy_quant"}
    code = {s for _, s in _code_strings(ast.parse((FORMATS_DIR / "registry.py").read_text()))}
    assert not code & legacy, "registry.py restates the legacy names"


# -- each attribute reaches its finding ---------------------------------------------------------


def _fmt(slots=(), keys=(), constraints=()) -> Format:
    return Format(
        name="made_up",
        title="a format only this test knows",
        keys=(FORMAT_KEY, *keys),
        slots=(Slot("weight", "I8", "(N, K)", kind="weight"), *slots),
        geometry=lambda t, p: dict(dense_geometry(t, p), has_extra="extra" in t),
        constraints=constraints,
    )


def _findings(fmt: Format, marker: dict | None, **tensors) -> list:
    tensors = {"weight": Meta("I8", (8, 16)), **tensors}
    return check_layer(fmt, marker, tensors)[0]


def _one(findings, code):
    got = [f for f in findings if f.code == code]
    assert len(got) == 1, [(f.code, f.message) for f in findings]
    return got[0]


@pytest.mark.parametrize(
    "forbidden_cause, env_extra, expected",
    [
        ("", {}, "not allowed in this variant"),
        ("the made-up format stores no extra", {}, "the made-up format stores no extra"),
        ((("N == 99", "never"), ("has_extra", "second reason")), {}, "second reason"),
        ((("N == 99", "never"),), {}, "not allowed in this variant"),
    ],
)
def test_forbidden_cause_comes_from_the_slot(forbidden_cause, env_extra, expected):
    fmt = _fmt(slots=(Slot("extra", "F32", "(N,)", required=False, forbidden="has_extra", forbidden_cause=forbidden_cause),))
    f = _one(_findings(fmt, {"format": "made_up"}, extra=Meta("F32", (8,))), "L006")
    assert f.cause == expected and f.tensor == "extra"


def test_missing_text_and_suggested_come_from_the_key():
    plain = MarkerKey("flag", (bool,), explicit=True, why_explicit="readers disagree")
    worded = MarkerKey(
        "flag",
        (bool,),
        explicit=True,
        why_explicit="readers disagree",
        missing_text="the made-up flag is missing",
        suggested="false",
    )
    f = _one(_findings(_fmt(keys=(plain,)), {"format": "made_up"}), "M036")
    assert f.message.endswith("marker has no flag: flag left to its default (None)")
    assert f.fix == "add flag: a value (comfyquant fix)"
    f = _one(_findings(_fmt(keys=(worded,)), {"format": "made_up"}), "M036")
    assert f.message.endswith("marker has no flag: the made-up flag is missing")
    assert f.fix == "add flag: false (comfyquant fix)" and f.cause == "readers disagree"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("A", "the made-up mode is lower case"),
        ("b", "mode must be 'a'"),
        (7, "any mode but 'a' is refused"),
    ],
)
def test_invalid_cause_comes_from_the_key(value, expected):
    key = MarkerKey(
        "mode",
        (str,),
        allowed="v == 'a'",
        allowed_text="'a'",
        invalid_cause=(("v == 'A'", "the made-up mode is lower case"), ("v + 1 == 8", "any mode but 'a' is refused")),
    )
    f = _one(_findings(_fmt(keys=(key,)), {"format": "made_up", "mode": value}), "M035")
    assert f.cause == expected


def test_invalid_cause_may_be_one_text():
    key = MarkerKey("mode", (str,), allowed="v == 'a'", allowed_text="'a'", invalid_cause="only 'a' exists")
    assert _one(_findings(_fmt(keys=(key,)), {"format": "made_up", "mode": "b"}), "M035").cause == "only 'a' exists"


def test_constraint_finding_shows_the_formats_numeric_keys():
    key = MarkerKey("block", (int,), default=3)
    fmt = _fmt(
        keys=(key, MarkerKey("note", (str,), default="x")),
        constraints=(Constraint("K % block == 0", "K={K} is not a multiple of block={block}"),),
    )
    f = _one(_findings(fmt, {"format": "made_up", "block": 3}), "L005")
    assert f.actual == "N=8, K=16, bits=8, block=3"


def test_nested_params_cause_lists_every_nested_key():
    """The M033 words for the current formats (ComfyUI's fallback keys of a nested ``params``), pinned."""
    f = _one(_findings(FORMATS["int8_tensorwise"], {"format": "int8_tensorwise", "params": {"convrot": True}}), "M033")
    assert f.cause == (
        "ComfyUI reads convrot, convrot_groupsize, group_size and linear_dtype from params; "
        "SGLang ignores them (a ConvRot flag there is silently lost)"
    )
    nested = sorted({k.name for fmt in FORMATS.values() for k in fmt.keys if k.nested_ok})
    assert nested == ["convrot", "convrot_groupsize", "group_size", "linear_dtype"]


# -- the current formats' words, byte for byte, on real files ---------------------------------


def _put(d: dict, suffix: str, value) -> dict:
    return {**d, f"{P}.{suffix}": value}


def _only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert found, (code, [(f.code, f.message) for f in report.findings])
    return found


def test_w4a8_forbidden_words(tmp_path):
    both = _put(w4a8_layer(P, correction=zeros("F32", (16, 32))), "weight_codebook", codebook())
    f = _only(check(write(tmp_path / "cc.safetensors", both)), "L006")[0]
    assert f.cause == (
        "a codebook and a correction on one layer: comfy-kitchen's writer never stores both "
        "(comfy-kitchen 0.2.40 decodes the levels plus the correction; ComfyUI drops the correction)"
    )
    six = _put(_put(w4a8_layer(P, bits=6), "weight_codebook", codebook()), "weight_correction", zeros("F32", (16, 32)))
    causes = {f.tensor.rsplit(".", 1)[-1]: f.cause for f in _only(check(write(tmp_path / "six.safetensors", six)), "L006")}
    assert causes == {
        "weight_codebook": "6-bit storage is uniform and symmetric: no codebook or correction",
        "weight_correction": "6-bit storage is uniform and symmetric: no codebook or correction",
    }


def test_convrot_words(tmp_path):
    marker = {k: v for k, v in W4A8_MARKER.items() if k != "convrot"}
    f = _only(check(write(tmp_path / "m.safetensors", w4a8_layer(P, marker=marker))), "M036")[0]
    assert f.message == f"layer {P} (asym_w4a8_int8): marker has no convrot: missing ConvRot flag"
    assert f.fix == "add convrot: true (comfyquant fix)"
    for i, value in enumerate((1, "true")):
        w4a8 = write(tmp_path / f"w{i}.safetensors", w4a8_layer(P, marker=dict(W4A8_MARKER, convrot=value)))
        int8 = write(
            tmp_path / f"i{i}.safetensors",
            int8_layer(P, marker={"format": "int8_tensorwise", "convrot": value, "convrot_groupsize": 256}),
        )
        for path in (w4a8, int8):
            assert _only(check(path), "M035")[0].cause == "convrot must be JSON true: SGLang tests identity with True"


@pytest.mark.parametrize("value", [1, "true", True])
def test_nvfp4_convrot_is_not_told_to_be_json_true(tmp_path, value):
    """NVFP4 is never rotated: a truthy convrot must be absent or false, never "JSON true"
    (the old rule matched the key name on every format)."""
    path = write(tmp_path / "n.safetensors", nvfp4_layer(P, marker={"format": "nvfp4", "convrot": value}))
    assert _only(check(path), "M035")[0].cause == "convrot must be absent or false: NVFP4 is never rotated"


# -- marker parameters the shapes cannot use ----------------------------------------------------


@pytest.mark.parametrize(
    "fmt, value", [("int8_blockwise", 0), ("int8_blockwise", "x"), ("float8_e4m3fn_blockwise", 0), ("awq_w4a16", 0)]
)
def test_group_size_the_shapes_cannot_use_is_a_finding_not_a_crash(tmp_path, capsys, fmt, value):
    """``group_size: 0`` under ``K // group_size`` is no internal error (exit 3) of ``check`` or
    ``fix``: the geometry refuses it, naming the tensor and the value."""
    dtype = "F8_E4M3" if fmt.startswith("float8") else "I8"
    tensors = {
        f"{P}.weight": zeros(dtype, (128, 128)),
        f"{P}.weight_scale": ones("F32", (1, 1)),
        f"{P}.comfy_quant": marker_tensor({"format": fmt, "group_size": value}),
    }
    path = write(tmp_path / "g.safetensors", tensors)
    assert main(["check", path]) == 1
    out = capsys.readouterr().out
    assert "L008" in out and "weight_scale has no valid shape" in out and f"group_size={value!r}" in out
    assert main(["fix", path, "-o", str(tmp_path / "fixed.safetensors")]) in (0, 1, 2)
    assert "internal error" not in capsys.readouterr().err


# -- one module judges, the other words ----------------------------------------------------------

JUDGING = {"geometry", "params", "slots_for", "is_forbidden", "expected_shape", "applies", "accepts", "holds", "valid"}
JUDGING |= {"must_be_explicit", "why_forbidden", "why_invalid", "other_shapes"}


def test_validation_only_words_the_reading():
    """``Format.interpret`` evaluates the description against a layer; ``validation.py`` calls
    nothing that judges, so the two modules meet once per layer, in one direction."""
    tree = ast.parse((FORMATS_DIR / "validation.py").read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "interpret" in calls
    assert calls & JUDGING == set()


def test_interpret_reads_a_layer_as_data():
    from comfyquant.formats.base import FORBIDDEN, IMPLICIT, INVALID, MISMATCH, MISSING, UNDERSCORED

    key = MarkerKey("group_size", (int,), 16, allowed="v in (16, 32)", allowed_text="16 or 32", explicit=True)
    fmt = _fmt(
        slots=(
            Slot("scale", "F32", "(N,)"),
            Slot("bias", "float", "(N,)", required=False),
            Slot("extra", "F32", "(N,)", required=False, forbidden="has_extra", forbidden_cause="no extra here"),
        ),
        keys=(key, MarkerKey("mode", (str,), "a", explicit=True)),
        constraints=(Constraint("K % 32 == 0", "K={K} is not a multiple of 32"),),
    )
    tensors = {
        "weight": Meta("I8", (8, 16)),
        "bias": Meta("F16", (16, 8)),
        "extra": Meta("F32", (8,)),
        "stray": Meta("F32", (1,)),
    }
    reading = fmt.interpret({"format": "made_up", "group_size": 7, "_x": 1}, tensors)
    assert reading.params["group_size"] == 7 and reading.env is not None and reading.env["N"] == 8
    assert [p[0] for p in reading.keys] == [UNDERSCORED, INVALID, IMPLICIT]
    assert [(state, slot.suffix) for state, slot, _e, _d in reading.slots] == [
        (MISSING, "scale"),
        (MISMATCH, "bias"),
        (FORBIDDEN, "extra"),
    ]
    assert reading.slots[0][3] == (8,)  # the missing tensor's expected shape
    assert reading.slots[1][3] == ((8,), True, False)  # F16 is a float; the shape is off
    assert reading.slots[2][3] == "no extra here"
    assert [s for s, _e in reading.unknown] == ["stray"]
    assert [c.expr for c in reading.failed] == ["K % 32 == 0"]
    unmarked = fmt.interpret(None, {"bias": Meta("F16", (8,))})
    assert unmarked.keys == [] and unmarked.env is None and unmarked.geometry_error
