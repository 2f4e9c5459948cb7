"""The Params each format package declares for quantize: defaults, validation, the marker and
its round trip through the format description, aliases, and that the quantizer and inspect
know no format by name.  Parametrized over the registry, so a new format package is covered
without editing this file."""

from __future__ import annotations

import ast
import dataclasses
import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from comfyquant.errors import InputError
from comfyquant.formats import registry
from comfyquant.formats.base import Meta
from comfyquant.formats.params import Params
from comfyquant.formats.planned import planned_tensors
from comfyquant.formats.validation import check_layer
from comfyquant.quantizer.layout import format_findings
from comfyquant.quantizer.params import format_names, resolve_format, validate

SRC = Path(__file__).resolve().parent.parent / "src" / "comfyquant"
WRITABLE = [f for f in registry.FORMATS.values() if f.writable]
IDS = [f.name for f in WRITABLE]


def _other_values(fmt, spec) -> list:
    """Valid-looking values of a parameter other than its default (from its choices, the
    description's marker key, or its type)."""
    kind = {"bool": bool, "int": int, "str": str}.get(spec.type, spec.type)
    if spec.metadata.get("choices"):
        return [c for c in spec.metadata["choices"] if c != spec.default]
    if kind is bool:
        return [not spec.default]
    key = fmt.key(spec.name)
    if kind is int and key is not None:
        return [v for v in (4, 8, 16, 32, 64, 128, 256) if v != spec.default and key.valid(v)][:3]
    return []


def variants(fmt) -> list[Params]:
    """The defaults, then every single non-default value the format accepts."""
    cls = fmt.params_class()
    out = [validate(fmt.name, {})]
    for spec in dataclasses.fields(cls):
        for value in _other_values(fmt, spec):
            try:
                out.append(validate(fmt.name, {spec.name: value}))
            except InputError as exc:
                assert "is not allowed" not in str(exc), exc  # only combination rules may refuse it
    return out


def fitting_k(p: Params) -> int:
    return math.lcm(1024, int(p.get("group_size") or 1), int(p.get("convrot_groupsize") or 1))


def test_every_writable_format_has_params():
    assert len(WRITABLE) >= 7
    for fmt in WRITABLE:
        cls = fmt.params_class()
        assert issubclass(cls, Params) and cls.FORMAT == fmt.name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert fmt.params_module.startswith(fmt.codec_module.rsplit(".", 1)[0] + "."), "Params live in the format's package"


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_defaults_are_valid_and_frozen(fmt):
    cls = fmt.params_class()
    p = validate(fmt.name, {})
    assert p == cls() and p.as_dict() == {f.name: f.default for f in dataclasses.fields(cls)}
    assert list(p.as_dict()) == cls.names() and set(cls.names()) == {f.name for f in dataclasses.fields(cls)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.full_precision_matrix_mult = True
    assert pickle.loads(pickle.dumps(p)) == p  # --jobs hands Params to worker processes
    assert hash(p) == hash(cls())
    for name in cls.names():
        assert p[name] == getattr(p, name) == p.get(name)
    with pytest.raises(KeyError):
        p["no_such_parameter"]
    # every default that is a marker key is a value the description allows
    for spec in dataclasses.fields(cls):
        key = fmt.key(spec.name)
        if key is not None:
            assert key.valid(spec.default), (spec.name, spec.default)


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_refusals_are_one_line_and_list_what_is_allowed(fmt):
    cls = fmt.params_class()
    with pytest.raises(
        InputError,
        match=rf"^-f: {fmt.name} has no parameter 'nope'; its parameters: "
        rf"{re.escape(', '.join(cls.names()))}$",
    ):
        validate(fmt.name, {"nope": 1}, "-f")
    wrong = {"bool": 1, "int": True, "str": 3}
    for spec in dataclasses.fields(cls):
        with pytest.raises(InputError) as info:
            validate(fmt.name, {spec.name: wrong[spec.type]}, "r.toml: rules[0]")
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"r.toml: rules[0]: {fmt.name} {spec.name}=") and "is not allowed: " in text


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_marker_round_trip_through_the_description(fmt):
    """The marker a Params writes is valid for the description, reads back (through the
    description, as runtimes read it) as the same parameters, and the planned tensors of a
    layer every rule accepts pass the format's own validation."""
    for p in variants(fmt):
        marker = p.marker()
        assert marker["format"] == fmt.name and p.describe().split()[0] == fmt.name
        read = fmt.params(marker)  # what every reader takes from it, defaults filled in
        as_read = {k: read[k] for k in p.names() if fmt.key(k) is not None}
        defaults = p.defaults()
        knobs = {k: p[k] for k in p.names() if fmt.key(k) is None and p[k] != defaults[k]}  # encode-only
        again = validate(fmt.name, {**as_read, **knobs})
        assert again == p and again.marker() == marker, (p, marker)
        for key in fmt.keys:
            if key.name in p.names() and key.must_be_explicit(p.as_dict()):
                assert key.name in marker, (key.name, p)
        n, k = 256, fitting_k(p)
        planned = planned_tensors(p, n, k)
        assert planned["weight"][1][0] == n
        findings, env = check_layer(fmt, marker, {s: Meta(d, sh) for s, (d, sh) in planned.items()})
        assert env is not None and env["K"] == k and env["N"] == n
        assert [f.message for f in findings if f.severity == "error"] == [], (p, planned)
        # a warning only where the parameters choose a slot's alternative dtype (also_dtypes)
        assert {f.tensor for f in findings if f.severity == "warning"} <= set(p.stored_dtypes()), findings
        with_bias = format_findings(p, planned, ("BF16", (n,)))
        assert [f.message for f in with_bias] == [f.message for f in findings]


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_format_findings_catch_a_plan_the_format_forbids(fmt):
    """A plan that contradicts the format (a required tensor left out) is an error of the
    format package itself, found without any runtime; the complete plan has none."""
    p = validate(fmt.name, {})
    planned = planned_tensors(p, 32, fitting_k(p))
    assert not [f for f in format_findings(p, planned) if f.severity == "error"]
    scale = next(s for s in planned if s != "weight")
    bad = {s: v for s, v in planned.items() if s != scale}
    errors = [f for f in format_findings(p, bad) if f.severity == "error"]
    assert errors and errors[0].tensor == scale


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_encode_kwargs_reproduce_the_plan(fmt):
    """The codec takes the Params' keyword arguments and writes exactly the planned tensors
    and the Params' marker."""
    torch = pytest.importorskip("torch")
    from comfyquant.numerics.dtypes import dtype_name

    for p in variants(fmt)[:3]:
        n, k = 32, fitting_k(p)
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        enc = fmt.codec().encode(w, layer="x", **p.encode_kwargs())
        planned = planned_tensors(p, n, k)
        assert set(enc) == set(planned)
        for suffix, (dtype, shape) in planned.items():
            t = enc[suffix]
            assert tuple(t.shape) == shape
            assert dtype_name(t.dtype) == dtype or (dtype == "F32" and t.is_floating_point())
        for key, value in enc.marker.items():
            assert p.marker().get(key) == value


def test_aliases_come_from_the_packages():
    declared = {a: f.name for f in registry.FORMATS.values() for a in f.aliases}
    assert registry.ALIASES == declared and declared
    for alias, name in declared.items():
        assert resolve_format(alias) == name == resolve_format(alias.upper())
        assert registry.lookup(alias) is registry.FORMATS[name]
    # the short names the CLI documents
    for alias, name in {
        "w4a8": "asym_w4a8_int8",
        "w4a4": "convrot_w4a4",
        "int8": "int8_tensorwise",
        "fp8": "float8_e4m3fn",
        "fp8_e5m2": "float8_e5m2",
        "e5m2": "float8_e5m2",
    }.items():
        assert resolve_format(alias) == name
    listed = format_names()
    for fmt in WRITABLE:
        assert (f"{fmt.name} ({fmt.aliases[0]})" if fmt.aliases else fmt.name) in listed
    for fmt in registry.FORMATS.values():
        if not fmt.writable:
            with pytest.raises(InputError, match="choose from"):
                resolve_format(fmt.name)


def _string_constants(tree: ast.AST):
    """(line, text) of every string constant that is not a docstring (f-string parts too)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def format_name_literals(path: Path, base: Path = SRC) -> list[str]:
    names = set(registry.FORMATS) | set(registry.ALIASES)
    words = re.compile(r"(?<![\w.])(" + "|".join(sorted(map(re.escape, registry.FORMATS), key=len, reverse=True)) + r")(?![\w])")
    found = []
    for line, text in _string_constants(ast.parse(path.read_text(), str(path))):
        if text in names or words.search(text):
            found.append(f"{path.relative_to(base)}:{line}: {text!r}")
    return found


def test_no_format_names_in_the_quantizer_or_inspect():
    """Format knowledge lives in formats/ (and the runtime profiles' own messages in targets/):
    the quantizer and inspect name no format."""
    scanned = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in ("formats", "targets")]
    assert len(scanned) > 20
    strict = [p for p in scanned if p.relative_to(SRC).parts[0] == "quantizer" or p.name == "inspection.py"]
    assert len(strict) >= 8
    offending = [hit for p in strict for hit in format_name_literals(p)]
    assert offending == []


def test_the_scan_sees_format_names(tmp_path):
    """The scan above is not vacuous: it finds a format name in a literal, an alias and an
    f-string, and skips docstrings."""
    import textwrap

    code = textwrap.dedent('''
        """asym_w4a8_int8 in a docstring is documentation."""
        def f(fmt):
            """nvfp4 here too."""
            if fmt.name == "nvfp4":
                return "w4a8"
            return f"{fmt} is not int8_tensorwise"
    ''')
    probe = tmp_path / "probe.py"
    probe.write_text(code)
    hits = format_name_literals(probe, tmp_path)
    assert [h.split(": ", 1)[1] for h in hits] == ["'nvfp4'", "'w4a8'", "' is not int8_tensorwise'"]


def test_check_and_inspect_do_not_import_params():
    """Params are dataclasses, imported lazily: ``check`` never loads them (nor dataclasses),
    ``inspect`` never loads them."""
    example = str(SRC.parent.parent / "examples" / "w4a8_sglang.safetensors")
    for command, dataclasses_ok in (("check", False), ("inspect", True)):
        code = (
            "import runpy, sys\n"
            f"sys.argv = ['comfyquant', {command!r}, {example!r}]\n"
            "try:\n    runpy.run_module('comfyquant', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "loaded = [m for m in sys.modules if m.endswith('.params') or m == 'torch']\n"
            "if 'dataclasses' in sys.modules:\n    loaded.append('dataclasses')\n"
            "print(loaded, file=sys.stderr)\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        loaded = eval(r.stderr.strip().splitlines()[-1])
        if dataclasses_ok:
            loaded = [m for m in loaded if m != "dataclasses"]
        assert loaded == [], (command, loaded, r.stderr[-500:])


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_inspect_shows_what_quantize_wrote(tmp_path, fmt):
    """inspect's per-format text (the description's ``inspect_text``) shows the labelled
    parameters the Params wrote (``G=16 C=256``), for a file quantize wrote in that format."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    import comfyquant
    from comfyquant.inspection import inspect

    src, out = str(tmp_path / "in.safetensors"), str(tmp_path / "q.safetensors")
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file({"blocks.0.fc.weight": w, "blocks.0.fc.bias": torch.zeros(128, dtype=torch.bfloat16)}, src)
    p = validate(fmt.name, {})
    target = "comfyui" if "sglang" not in fmt.loaders else "all" if "comfyui" in fmt.loaders else "sglang"
    r = comfyquant.quantize(src, out, fmt.name, target=target, progress=False)
    assert r.ok and [lp.params for lp in r.plan.quantized] == [p]
    row = next(x for x in inspect(out).rows if x.name == "blocks.0.fc")
    assert row.format == fmt.name and row.marked
    labelled = [x for x in p.describe().split() if x.split("=")[0] in p.LABELS.values()]
    assert len(labelled) == len(p.LABELS)  # defaults: every labelled parameter is in the marker
    for part in labelled:
        assert part in row.params.split(), (row.params, part)


@pytest.mark.parametrize("g", [-16, 0, 1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48])
def test_w4a8_group_rule_is_one_rule(g):
    """The description's marker key, quantize's Params and the encoder take the same group
    sizes (the rule is stated once, in formats/w4a8)."""
    torch = pytest.importorskip("torch")
    from comfyquant.formats.codec import CodecError
    from comfyquant.formats.w4a8 import ASYM_W4A8_INT8, group_size_ok

    ok = group_size_ok(g)
    assert ASYM_W4A8_INT8.key("group_size").valid(g) == ok
    try:
        validate(ASYM_W4A8_INT8.name, {"group_size": g})
        taken = True
    except InputError:
        taken = False
    assert taken == ok
    k = math.lcm(256, abs(g) or 1)
    try:
        ASYM_W4A8_INT8.codec().encode(torch.ones(16, k, dtype=torch.bfloat16), group_size=g, codebook=False)
        encoded = True
    except CodecError as exc:
        assert "group_size" in str(exc)
        encoded = False
    assert encoded == ok


def test_w4a8_encoder_refuses_a_zero_convrot_size_in_one_line():
    """convrot_groupsize=0 is refused in one line, not a ZeroDivisionError inside the encoder's
    validation."""
    torch = pytest.importorskip("torch")
    from comfyquant.formats.codec import CodecError
    from comfyquant.formats.w4a8 import ASYM_W4A8_INT8

    with pytest.raises(CodecError, match="convrot_groupsize=0"):
        ASYM_W4A8_INT8.codec().encode(torch.ones(16, 256, dtype=torch.bfloat16), convrot_groupsize=0)


def test_cli_flags_come_from_the_params_classes():
    """quantize/convert build their format-parameter flags from each Params class's FLAGS: every
    flag names a field of its class, and a parsed flag reaches the parameters by that name."""
    import argparse
    from dataclasses import fields

    from comfyquant.commands.quantize import add_common_arguments, param_flags, params_of

    declared = {}
    for fmt in registry.FORMATS.values():
        cls = fmt.params_class()
        if cls is None:
            continue
        names = {f.name for f in fields(cls)}
        for flag, dest, _kw in cls.FLAGS:
            assert dest in names, f"{cls.__name__}: {flag} sets {dest!r}, which is not a parameter"
            declared.setdefault(flag, dest)
    assert {f: d for f, d, _k in param_flags()} == declared
    p = argparse.ArgumentParser()
    p.add_argument("paths", nargs="*")
    add_common_arguments(p, "--format")
    args = p.parse_args(["in.safetensors", "--group-size", "32", "--no-convrot", "--scale-dtype", "f32"])
    assert params_of(args) == {"group_size": 32, "convrot": False, "scale_dtype": "f32"}
    helps = {f: kw["help"] for f, _d, kw in param_flags()}
    assert "{default}" not in " ".join(helps.values())


@pytest.mark.parametrize("fmt", WRITABLE, ids=IDS)
def test_any_shape_is_planned_or_refused_with_a_constraint(fmt):
    """For every parameter variant and awkward shapes (odd, prime, small, not a multiple of any
    group), the plan is either complete and clean, or a one-line ShapeRefused naming the rule
    the shape breaks -- never a PlanError (6-bit rows of K=682 must not raise one: `quantize --bits 6` keeps
    the layer dense instead of exiting with an internal error)."""
    from comfyquant.formats.planned import PlanError, ShapeRefused

    for p in variants(fmt):
        for n, k in [(256, 682), (256, 130), (7, 33), (1, 1), (3, 4096 + 8), (64, 2), (17, 250), (1000, 96)]:
            try:
                planned = planned_tensors(p, n, k)
            except ShapeRefused as exc:
                assert str(exc) and "\n" not in str(exc) and "?" not in str(exc), (p, n, k, str(exc))
                continue
            except PlanError as exc:  # pragma: no cover - the defect this test guards against
                pytest.fail(f"{p} [{n}, {k}]: {exc}")
            assert planned["weight"][1][0] >= n, (p, n, k)


def test_six_bit_layer_of_an_odd_width_is_kept_dense(tmp_path):
    """End to end: the layer W6A8 cannot hold stays dense with the reason, the others quantize."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    import comfyquant
    from comfyquant.checkpoint import open_checkpoint

    src = tmp_path / "m.safetensors"
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "odd.weight": torch.randn(256, 682, generator=g).bfloat16(),
            "fine.weight": torch.randn(64, 256, generator=g).bfloat16(),
        },
        str(src),
    )
    out = tmp_path / "q.safetensors"
    result = comfyquant.quantize(str(src), str(out), format="w4a8", params={"bits": 6, "codebook": False}, target="comfy-kitchen")
    with open_checkpoint(str(out)) as ck:
        assert ck.layers["odd"].format_name is None and ck.tensors["odd.weight"].dtype == "BF16"
        assert ck.layers["fine"].format_name == "asym_w4a8_int8"
    odd = next(lp for lp in result.plan.layers if lp.name == "odd")
    assert odd.action == "dense" and "K=682" in odd.reason, odd.reason
