"""A small fuzz campaign over every command: a valid checkpoint whose header (dtypes, shapes,
offsets, names, metadata) and markers (any key, any JSON value: NaN, Infinity, 1e400, huge,
negative, boolean, string, list, object) are mutated.  Every command must end with exit 0, 1
or 2 — never an internal error (3) — in bounded time, leave the input as it was, and leave no
output when it refuses and no temporary file at all.  Sized to run in a few seconds."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import dense_layer, fp8_layer, int8_layer, mxfp8_layer, nvfp4_layer, w4a4_layer, w4a8_layer
from comfyquant.cli import main

SPECIAL_NUMBERS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "-0",
    "0",
    "-1",
    "-16",
    "16.0",
    "16.5",
    "true",
    "false",
    "null",
    "1" + "0" * 40,
    "9" * 400,
    "4294967296",
    "18446744073709551617",
]

json_literals = st.sampled_from(SPECIAL_NUMBERS)
json_strings = st.text(st.characters(codec=None, blacklist_categories=()), max_size=6).map(
    lambda s: json.dumps(s, ensure_ascii=True)
)
surrogate_strings = st.sampled_from(['"\\ud800"', '"a\\udfffb"', '"\\ud83d\\ude00"', '"16"', '""', '"nvfp4"'])
scalars = st.one_of(json_literals, json_strings, surrogate_strings, st.integers(-300, 70000).map(str))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.dictionaries(st.sampled_from(['"a"', '"group_size"', '"format"']), inner, max_size=2).map(
            lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=4,
)


def base_tensors() -> dict:
    t = {}
    t.update(w4a8_layer("blocks.0.w"))
    t.update(int8_layer("blocks.0.i"))
    t.update(fp8_layer("blocks.0.f"))
    t.update(w4a4_layer("blocks.0.a"))
    t.update(nvfp4_layer("blocks.0.n", n=128, k=64))
    t.update(mxfp8_layer("blocks.0.m", n=128, k=64))
    t.update(dense_layer("norm", n=8, k=16))
    return t


BASE = base_tensors()
NAMES = list(BASE)
MARKERS = [n for n in NAMES if n.endswith(".comfy_quant")]
MARKER_KEYS = [
    '"format"',
    '"group_size"',
    '"convrot_groupsize"',
    '"convrot"',
    '"orig_dtype"',
    '"full_precision_matrix_mult"',
    '"params"',
    '"_x"',
    '"bits"',
]

mutation = st.one_of(
    st.tuples(st.just("marker"), st.sampled_from(MARKERS), st.sampled_from(MARKER_KEYS), json_values),
    st.tuples(st.just("map"), st.sampled_from(MARKERS), st.sampled_from(MARKER_KEYS), json_values),
    st.tuples(
        st.just("dtype"),
        st.sampled_from(NAMES),
        json_values | st.sampled_from(['"F32"', '"U8"', '"I8"', '"F8_E4M3"', '"BF16"', '"X"']),
    ),
    st.tuples(st.just("shape"), st.sampled_from(NAMES), json_values),
    st.tuples(st.just("dim"), st.sampled_from(NAMES), st.integers(0, 2), json_values),
    st.tuples(st.just("offsets"), st.sampled_from(NAMES), json_values, json_values),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), surrogate_strings | json_strings),
    st.tuples(st.just("metadata"), json_strings | surrogate_strings, json_values),
    st.tuples(st.just("trailing"), st.integers(1, 9)),
)


def build(path: str, mutations) -> None:
    """The base checkpoint with ``mutations`` applied; the header is JSON *text* assembled by
    hand so literals Python's json would never write (1e400, lone surrogates) reach the file.
    Offsets and marker shapes follow the (re-laid-out) data unless a mutation sets them."""
    rows = {}  # original name -> [name JSON, dtype JSON, shape JSON or None, offsets JSON or None, bytes]
    for name, (dtype, _shape, blob) in BASE.items():
        rows[name] = [json.dumps(name), json.dumps(dtype), None, None, blob]
    markers = {n: json.loads(BASE[n][2]) for n in MARKERS}
    marker_text: dict[str, str] = {}
    header_map: dict[str, str] = {}
    metadata: dict[str, str] = {}
    tail = b""
    for m in mutations:
        kind = m[0]
        if kind in ("marker", "map"):
            _, name, key, value = m
            fields = {json.dumps(k): json.dumps(v) for k, v in markers[name].items()}
            fields[key] = value
            text = "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"
            if kind == "marker":
                marker_text[name] = text
            else:
                header_map[json.dumps(name[: -len(".comfy_quant")])] = text
        elif kind == "dtype":
            rows[m[1]][1] = m[2]
        elif kind == "shape":
            rows[m[1]][2] = m[2]
        elif kind == "dim":
            parts = [json.dumps(d) for d in (list(BASE[m[1]][1]) or [1])]
            parts[min(m[2], len(parts) - 1)] = m[3]
            rows[m[1]][2] = "[" + ", ".join(parts) + "]"
        elif kind == "offsets":
            rows[m[1]][3] = f"[{m[2]}, {m[3]}]"
        elif kind == "rename":
            rows[m[1]][0] = m[2]
        elif kind == "metadata":
            metadata[m[1]] = m[2]
        elif kind == "trailing":
            tail = b"\x00" * m[1]
    for name, text in marker_text.items():
        rows[name][4] = text.encode("utf-8", "surrogatepass")
    data = b""
    parts = []
    for name, (key, dtype, shape, offsets, blob) in rows.items():
        if shape is None:
            shape = json.dumps([len(blob)] if name in MARKERS else list(BASE[name][1]))
        if offsets is None:
            offsets = json.dumps([len(data), len(data) + len(blob)])
        data += blob
        parts.append(f'{key}: {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}')
    meta = dict(metadata)
    if header_map:
        meta['"_quantization_metadata"'] = json.dumps(
            '{"format_version": "1.0", "layers": {' + ", ".join(f"{k}: {v}" for k, v in header_map.items()) + "}}"
        )
    if meta:
        parts.insert(0, '"__metadata__": {' + ", ".join(f"{k}: {v}" for k, v in meta.items()) + "}")
    text = ("{" + ", ".join(parts) + "}").encode("utf-8", "surrogatepass")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data + tail)


def digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


COMMANDS = [
    ["check"],
    ["check", "--json", "--deep"],
    ["inspect", "--json"],
    ["inspect"],
    ["fix", "-o", "{out}"],
    ["dequantize", "{out}"],
    ["convert", "{out}", "-t", "fp8", "--no-progress"],
    ["migrate", "-o", "{out}", "--allow-lossy"],
    ["compare", "{src}", "--no-progress"],
    ["recipe"],
    ["quantize", "-f", "int8", "-o", "{out}", "--no-progress"],
]


EXAMPLES = int(os.environ.get("COMFYQUANT_FUZZ_EXAMPLES", "30"))
"""A few seconds in CI; set COMFYQUANT_FUZZ_EXAMPLES=2000 for a real campaign."""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(mutation, min_size=1, max_size=3), st.sampled_from(COMMANDS))
def test_mutated_checkpoints_never_crash_any_command(capsys, mutations, command):
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "in.safetensors")
        build(src, mutations)
        before = digest(src)
        out = os.path.join(folder, "out.safetensors")
        args = [command[0], src] + [a.replace("{out}", out).replace("{src}", src) for a in command[1:]]
        t0 = time.monotonic()
        rc = main(args)
        took = time.monotonic() - t0
        _stdout, err = capsys.readouterr()
        assert rc in (0, 1, 2), f"{args}: exit {rc}: {err} ({mutations})"
        assert "internal error" not in err, err
        assert took < 60, f"{args} took {took:.1f} s"  # a hang would be minutes; the machine may be busy
        if rc == 2:
            assert err.count("\n") == 1, err
            assert not os.path.exists(out), f"{args} refused but wrote {out}"
        assert digest(src) == before
        assert sorted(os.listdir(folder)) in (["in.safetensors"], ["in.safetensors", "out.safetensors"])


ODD_NUMBERS = ["9" * 400, "18446744073709551617", "9223372036854775808", "1e400", "NaN", "-1", "1.5", "true", "null", "[]", '"x"']


@pytest.mark.parametrize("value", ODD_NUMBERS)
def test_odd_numbers_in_every_header_field(tmp_path, capsys, value):
    """Each odd number in a dimension, an offset and a dtype of a weight, a scale and a marker
    tensor (the systematic complement of the random campaign above)."""
    for target in ("blocks.0.w.weight", "blocks.0.i.weight_scale", "blocks.0.f.comfy_quant", "norm.bias"):
        for mutations in (
            [("dim", target, 0, value)],
            [("dim", target, 1, value)],
            [("offsets", target, "0", value)],
            [("offsets", target, value, "8")],
            [("shape", target, value)],
            [("dtype", target, value)],
        ):
            src = str(tmp_path / "in.safetensors")
            build(src, mutations)
            before = digest(src)
            for command in (["check", "--json", "--deep"], ["inspect"], ["fix", "-o", "{out}"], ["dequantize", "{out}"]):
                out = str(tmp_path / "out.safetensors")
                args = [command[0], src] + [a.replace("{out}", out).replace("{src}", src) for a in command[1:]]
                rc = main(args)
                _stdout, err = capsys.readouterr()
                assert rc in (0, 1, 2) and "internal error" not in err, f"{args} {mutations}: exit {rc}: {err}"
                if rc == 2:
                    assert not os.path.exists(out)
                if os.path.exists(out):
                    os.unlink(out)
            assert digest(src) == before
