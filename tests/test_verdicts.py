"""Runtime verdicts are exact, and severity agrees with them.

* A damaged container: every runtime opens files through safetensors, so each target must
  FAIL with the exception type and message the installed safetensors raises for that very
  file (``safe_open`` and ``load_file`` agree); a defect safetensors accepts is not an error.
* The rule of severity: an error names a selected runtime whose verdict FAILS on it, and every
  FAILS verdict has an error finding that names it, for many broken files and every selection
  of targets.
* BF16/F16 scales: what comfy-kitchen 0.2.40's eager backend and ComfyUI's layout Params do
  with them, run for real and compared with the profiles.
"""

from __future__ import annotations

import json
import os
import re
import struct
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import (
    fp8_layer,
    header_markers,
    int8_layer,
    marker_tensor,
    mxfp8_layer,
    nvfp4_layer,
    ones,
    raw_file,
    w4a4_layer,
    w4a8_layer,
    write,
)
from comfyquant import check
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.header import read_header
from comfyquant.io.source import LocalFile
from comfyquant.targets.container import open_error, rust_float
from comfyquant.targets.select import TARGETS

pytest.importorskip("safetensors")
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402

P = "blocks.0.attn.qkv"


# -- the installed safetensors is the reference ----------------------------------------------


def real_error(path: str) -> tuple[str, str] | None:
    """(exception type name, message) safetensors raises opening ``path``, or None.  Both entry
    points the runtimes use are asked and must agree (up to the one thing the library leaves
    to chance, see ``same``)."""
    outcomes = []
    for opener in (lambda: safetensors.safe_open(path, "pt").keys(), lambda: safetensors.torch.load_file(path)):
        try:
            opener()
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001 -- whatever the library raises is the reference
            outcomes.append((type(exc).__name__, str(exc)))
    assert same(outcomes[0], outcomes[1], path), outcomes
    return outcomes[0]


def same(a, b, path: str) -> bool:
    """Equal, except where safetensors leaves the outcome to chance: it sorts tensors by
    (begin, end) with a HashMap's order among equal spans, so with several tensors on one span
    the error may name any of them, or be another error altogether.  Then both must be one of
    the outcomes of some order of the tied tensors."""
    if a == b:
        return True
    if not (a and b and a[0] == b[0] == "SafetensorError"):
        return False
    outcomes = tie_outcomes(path)
    return a[1] in outcomes and b[1] in outcomes


def tie_outcomes(path: str) -> set[str]:
    """Every message validation gives over all orders of tensors with identical spans."""
    from itertools import permutations, product

    from comfyquant.targets.container import PREFIX, serde_header, validate

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        tensors = serde_header(fh.read(n))
        data_len = os.fstat(fh.fileno()).st_size - 8 - n
    if isinstance(tensors, str):
        return set()
    groups: dict[tuple, list] = {}
    for t in tensors:
        groups.setdefault((t[3], t[4]), []).append(t)
    orders = [list(permutations(g)) for g in groups.values()]
    out = set()
    for choice in list(product(*orders))[:5000]:
        message = validate([t for group in choice for t in group], data_len)
        if message is not None:
            out.add(PREFIX + message)
    return out


def rewrite(path: str, mutate=None, data=None) -> str:
    """Rewrite a file's header through ``mutate(header) -> header or str`` and/or its data."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        body = fh.read()
    if mutate is not None:
        header = mutate(header)
    text = header if isinstance(header, str) else json.dumps(header)
    body = data(body) if data is not None else body
    return raw_file(path, text, body)


def assert_fails_like_safetensors(path: str, selected=TARGETS):
    expected = real_error(path)
    assert expected is not None, "safetensors accepts this file: not a damage case"
    report = check(path, target=list(selected))
    for name in selected:
        first = report.verdicts[name].first
        assert first is not None, (name, expected)
        assert same((first.exception, first.message), expected, path), (name, first.exception, first.message, expected)
    errors = [f for f in report.findings if f.severity == "error"]
    container = [f for f in errors if f.code.startswith("C0")]
    assert container and all(set(selected) <= set(f.targets) for f in container), [(f.code, f.targets) for f in errors]
    return report


# -- a damaged container fails every runtime with safetensors' own error -----------------


def _base(tmp_path) -> str:
    return write(tmp_path / "m.safetensors", w4a8_layer(P), fp8_layer("blocks.1.ff"))


def _entry(name):
    return lambda h: h[name]


def _set(name, key, value):
    def mutate(h):
        h[name][key] = value
        return h

    return mutate


DAMAGE = {
    # C001: span does not match dtype x shape
    "span_short": lambda p: rewrite(p, _set(f"{P}.weight_s_channel", "shape", [31])),
    "span_long": lambda p: rewrite(p, _set(f"{P}.weight_s_channel", "shape", [33])),
    "dtype_width": lambda p: rewrite(p, _set(f"{P}.weight_s_channel", "dtype", "F16")),
    # C002: past the end of the file: a truncated download, at several places
    "truncated_in_last": lambda p: rewrite(p, data=lambda b: b[:-3]),
    "truncated_half": lambda p: rewrite(p, data=lambda b: b[: len(b) // 2]),
    "truncated_to_header": lambda p: rewrite(p, data=lambda b: b""),
    # C003: overlapping spans (one shifted onto its neighbour; two identical spans)
    "overlap": lambda p: rewrite(p, lambda h: _shift(h, f"{P}.weight_s_channel", -4)),
    "identical_spans": lambda p: rewrite(p, lambda h: _copy_offsets(h, "blocks.1.ff.weight_scale", "blocks.1.ff.weight")),
    "empty_inside_span": lambda p: rewrite(p, lambda h: _empty_inside(h, f"{P}.weight")),
    # C004: gaps and trailing bytes
    "trailing_bytes": lambda p: rewrite(p, data=lambda b: b + b"\0" * 7),
    "gap": lambda p: rewrite(p, _gap, data=lambda b: b + b"\0\0"),
    "leading_gap": lambda p: rewrite(p, lambda h: _shift_all(h, 3), data=lambda b: b"\0" * 3 + b),
    # C005 / C006: entries serde cannot read
    "unknown_dtype": lambda p: rewrite(p, _set(f"{P}.weight", "dtype", "Q4")),
    "lowercase_dtype": lambda p: rewrite(p, _set(f"{P}.weight", "dtype", "i8")),
    "dtype_number": lambda p: rewrite(p, _set(f"{P}.weight", "dtype", 3)),
    "missing_shape": lambda p: rewrite(p, lambda h: (h[f"{P}.bias"].pop("shape"), h)[1]),
    "missing_offsets": lambda p: rewrite(p, lambda h: (h[f"{P}.bias"].pop("data_offsets"), h)[1]),
    "negative_dim": lambda p: rewrite(p, _set(f"{P}.bias", "shape", [-32])),
    "float_dim": lambda p: rewrite(p, _set(f"{P}.bias", "shape", [32.0])),
    "bool_dim": lambda p: rewrite(p, _set(f"{P}.bias", "shape", [True, 32])),
    "string_dim": lambda p: rewrite(p, _set(f"{P}.bias", "shape", ["32"])),
    "shape_object": lambda p: rewrite(p, _set(f"{P}.bias", "shape", {})),
    "three_offsets": lambda p: rewrite(p, lambda h: _offsets(h, f"{P}.bias", lambda o: o + [0])),
    "one_offset": lambda p: rewrite(p, lambda h: _offsets(h, f"{P}.bias", lambda o: o[:1])),
    "reversed_offsets": lambda p: rewrite(p, lambda h: _offsets(h, f"{P}.bias", lambda o: o[::-1])),
    "huge_offset": lambda p: rewrite(p, lambda h: _offsets(h, f"{P}.bias", lambda o: [o[0], 2**64 + 5])),
    "entry_not_object": lambda p: rewrite(p, lambda h: {**h, "extra": "x"}),
    "entry_null": lambda p: rewrite(p, lambda h: {**h, "extra": None}),
    "entry_empty": lambda p: rewrite(p, lambda h: {**h, "extra": {}}),
    "nan_dim": lambda p: rewrite(p, lambda h: json.dumps(h).replace('"shape": [32]', '"shape": [NaN]', 1)),
    "overflow": lambda p: rewrite(p, _set(f"{P}.bias", "shape", [2**40, 2**40])),
    "sub_byte": lambda p: rewrite(p, lambda h: _sub_byte(h)),
    # C007: __metadata__ values that are not strings, at their own position in the header
    "meta_int": lambda p: rewrite(p, lambda h: _meta(h, 1)),
    "meta_negative": lambda p: rewrite(p, lambda h: _meta(h, -7)),
    "meta_float": lambda p: rewrite(p, lambda h: _meta(h, 1.5e-7)),
    "meta_big": lambda p: rewrite(p, lambda h: _meta(h, 12345678901234567890123)),
    "meta_null": lambda p: rewrite(p, lambda h: _meta(h, None)),
    "meta_bool": lambda p: rewrite(p, lambda h: _meta(h, False)),
    "meta_list": lambda p: rewrite(p, lambda h: _meta(h, [1])),
    "meta_object": lambda p: rewrite(p, lambda h: _meta(h, {"a": "b"})),
    # several defects: safetensors reports the first in its own order
    "meta_after_bad_entry": lambda p: rewrite(p, lambda h: _meta(_set(f"{P}.weight", "dtype", "Q4")(h), 1, last=True)),
    "bad_entry_and_gap": lambda p: rewrite(p, lambda h: _set(f"{P}.weight", "dtype", "Q4")(_gap(h)), data=lambda b: b + b"\0\0"),
    "multiline_header": lambda p: rewrite(p, lambda h: json.dumps(_set(f"{P}.bias", "shape", [-1])(h), indent=2)),
    "unicode_names": lambda p: rewrite(
        p, lambda h: {("é" + k if k != "__metadata__" else k): v for k, v in _set(f"{P}.bias", "dtype", "Q")(h).items()}
    ),
}


def _shift(h, name, by):
    a, b = h[name]["data_offsets"]
    h[name]["data_offsets"] = [a + by, b + by]
    return h


def _copy_offsets(h, dst, src):
    n = h[src]["data_offsets"][1] - h[src]["data_offsets"][0]
    h[dst]["shape"], h[dst]["dtype"], h[dst]["data_offsets"] = [n], "U8", list(h[src]["data_offsets"])
    return h


def _empty_inside(h, name):
    a, _b = h[name]["data_offsets"]
    h["empty"] = {"dtype": "F32", "shape": [0], "data_offsets": [a + 4, a + 4]}
    return h


def _gap(h):
    """Two unused bytes before the last tensor (the caller appends two bytes of data)."""
    last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    return _shift(h, last, 2)


def _shift_all(h, by):
    for k in h:
        if k != "__metadata__":
            _shift(h, k, by)
    return h


def _offsets(h, name, change):
    h[name]["data_offsets"] = change(h[name]["data_offsets"])
    return h


def _sub_byte(h):
    a, _b = h[f"{P}.bias"]["data_offsets"]
    h[f"{P}.bias"].update(dtype="F4", shape=[3])
    return h


def _meta(h, value, last=False):
    meta = dict(h.pop("__metadata__", {}) or {})
    meta["note"] = value
    if last:
        return {**h, "__metadata__": meta}
    return {"__metadata__": meta, **h}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_container_fails_every_target_like_safetensors(tmp_path, kind):
    path = DAMAGE[kind](_base(tmp_path))
    assert_fails_like_safetensors(path)
    # and with a subset of targets, the selected ones fail the same way
    assert_fails_like_safetensors(path, ("comfyui",))


def test_truncated_download_cli(tmp_path, capsys):
    """A truncated file: all three targets FAIL with safetensors' message (no target says
    it loads while an error finding stands), and check exits 1."""
    path = DAMAGE["truncated_half"](_base(tmp_path))
    expected = real_error(path)
    assert main(["check", path, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    for name in TARGETS:
        verdict = out["targets"][name]
        assert not verdict["loads"] and (verdict["exception"], verdict["error"]) == expected
    c002 = [f for f in out["findings"] if f["code"] == "C002"]
    assert c002 and all(f["severity"] == "error" and sorted(f["targets"]) == sorted(TARGETS) for f in c002)
    assert main(["check", path]) == 1
    text = capsys.readouterr().out
    assert f"comfyui        FAILS  SafetensorError: {expected[1]}" in text


def test_header_above_safetensors_limit(tmp_path):
    """safetensors refuses a header over 100,000,000 bytes (comfyquant's reader allows 100
    MiB): C008, and every target fails with ``header too large``."""
    header = json.dumps(
        {"__metadata__": {"pad": "x" * 100_000_000}, "a.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}
    )
    assert 100_000_000 < len(header) < 100 * 1024 * 1024
    path = raw_file(tmp_path / "big.safetensors", header, b"\0" * 4)
    try:
        report = assert_fails_like_safetensors(path)
        assert [f.code for f in report.findings if f.severity == "error"] == ["C008"]
    finally:
        os.remove(path)


def test_second_shard_damaged_sglang_order(tmp_path):
    """SGLang opens shards in order, reading each one's markers before opening the next: a
    marker error in shard 1 comes before a damaged shard 2, a damaged shard 1 before all."""
    from comfyquant.compat.sglang import inspect_comfy_quant_markers

    bad_marker = w4a8_layer("blocks.0.a")
    bad_marker["blocks.0.a.comfy_quant"] = marker_tensor(b"{not json")
    s1 = write(tmp_path / "s1.safetensors", bad_marker)
    s2 = DAMAGE["truncated_in_last"](write(tmp_path / "s2.safetensors", w4a8_layer("blocks.1.a")))
    report = check([s1, s2])
    assert report.verdicts["sglang"].first.rule == "sglang.P2"
    assert report.verdicts["comfyui"].first.exception == "SafetensorError"
    report = check([s2, s1])
    assert (report.verdicts["sglang"].first.exception, report.verdicts["sglang"].first.message) == real_error(s2)
    with pytest.raises(safetensors.SafetensorError) as exc:
        inspect_comfy_quant_markers([s2, s1])
    assert (type(exc.value).__name__, str(exc.value)) == real_error(s2)


@pytest.mark.parametrize("entry", [["U8", [4], [0, 4]], {"dtype": {"U8": None}, "shape": [4], "data_offsets": [0, 4]}])
def test_container_safetensors_accepts_is_not_an_error(tmp_path, entry):
    """Forms serde reads but comfyquant's reader calls malformed (C006, and the bytes it then
    leaves unaccounted for, C004): safetensors opens the file, so every target loads and the
    findings are warnings, not errors."""
    path = raw_file(tmp_path / "odd.safetensors", json.dumps({"a": entry}), b"\0" * 4)
    assert real_error(path) is None
    report = check(path)
    assert all(v.loads for v in report.verdicts.values())
    container = {(f.code, f.severity) for f in report.findings if f.code.startswith("C0")}
    assert ("C006", "warning") in container and {sev for _code, sev in container} == {"warning"}
    assert report.ok


# -- the container model against safetensors on fuzzed headers --------------------------------

_DTYPES = {"F32": 4, "BF16": 2, "U8": 1, "I8": 1, "F8_E4M3": 1}
_TEXT = st.text(st.sampled_from('ab"\\\n\t\x01\x7fé\u0301\u200b ~'), max_size=3)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
    st.lists(st.integers(-1, 9), max_size=3),
    st.builds(dict),
)


@st.composite
def damaged_headers(draw):
    """A valid tiling of a few tensors, then up to three damages of any kind."""
    n = draw(st.integers(0, 6))
    obj, pos = {}, 0
    for i in range(n):
        dtype = draw(st.sampled_from(sorted(_DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=2))
        size = _DTYPES[dtype]
        for d in shape:
            size *= d
        obj[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    data_len = pos
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["field", "drop", "offsets", "len", "meta", "entry", "empty"]))
        names = sorted(obj)
        if kind == "len":
            data_len = max(0, data_len + draw(st.integers(-3, 3)))
        elif kind == "meta":
            obj["__metadata__"] = {"k": draw(st.one_of(_TEXT, _VALUES))}
        elif kind == "entry":
            obj[f"x{len(obj)}"] = draw(_VALUES)
        elif kind == "empty":
            at = draw(st.integers(0, data_len + 1))
            obj[f"e{len(obj)}"] = {"dtype": "U8", "shape": [0], "data_offsets": [at, at]}
        elif names:
            victim = obj[draw(st.sampled_from(names))]
            if not isinstance(victim, dict) or "dtype" not in victim:
                continue
            if kind == "field":
                victim[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(
                    st.one_of(_VALUES, st.sampled_from(["Q7", "F4", "U8", "F8_E8M0"]))
                )
            elif kind == "drop":
                victim.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
            elif (
                isinstance(victim.get("data_offsets"), list)
                and len(victim["data_offsets"]) == 2
                and all(type(x) is int for x in victim["data_offsets"])
            ):
                a, b = victim["data_offsets"]
                victim["data_offsets"] = [max(0, a + draw(st.integers(-2, 2))), max(0, b + draw(st.integers(-2, 2)))]
    return obj, data_len, draw(st.sampled_from([None, 1, 2]))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(damaged_headers())
def test_container_model_matches_safetensors_on_fuzzed_headers(tmp_path_factory, case):
    obj, data_len, indent = case
    raw = json.dumps(obj, indent=indent).encode()
    path = str(tmp_path_factory.mktemp("f") / "m.safetensors")
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw + bytes(data_len))
    expected = real_error(path)
    source = LocalFile(path)
    try:
        try:
            hdr = read_header(source)
        except InputError:
            return  # unreadable for comfyquant too: exit 2, no verdicts
        got = open_error(hdr, lambda: source.pread(8, hdr.header_len))
    finally:
        source.close()
    got = None if got is None else ("SafetensorError", got)
    assert same(got, expected, path), (raw, data_len, got, expected)
    if expected is not None:  # a refused file always has a container finding to explain it
        assert hdr.findings


@pytest.mark.parametrize(
    "value",
    [
        "1e-6",
        "2e-6",
        "9.99e-6",
        "1e-5",
        "1.0",
        "123.456",
        "1e15",
        "9.999e15",
        "1e16",
        "1.5e16",
        "1e100",
        "5e-324",
        "1.7976931348623157e308",
        "0.1",
        "-1e16",
        "-1e-7",
        "12345.678e3",
        "0.000015",
        "1.25e-5",
        "-0.0",
        "18446744073709551616",
    ],
)
def test_float_rendering_matches_serde(tmp_path, value):
    """serde prints floats its own way (``0.00001``, ``1.5e-7``, ``1e+16``): the message says
    exactly what safetensors says."""
    path = raw_file(tmp_path / "f.safetensors", '{"__metadata__": {"k": ' + value + "}}")
    expected = real_error(path)
    assert f"floating point `{rust_float(float(value))}`" in expected[1]


# -- severity and verdicts agree, over many broken files ---------------------------------


def _cast(layer: dict, suffix: str, dtype: str) -> dict:
    layer = dict(layer)
    key = next(k for k in layer if k.endswith("." + suffix))
    layer[key] = ones(dtype, layer[key][1])
    return layer


def _reshape(layer: dict, suffix: str, shape) -> dict:
    layer = dict(layer)
    key = next(k for k in layer if k.endswith("." + suffix))
    layer[key] = ones(layer[key][0], shape)
    return layer


def _drop(layer: dict, suffix: str) -> dict:
    return {k: v for k, v in layer.items() if not k.endswith("." + suffix)}


def _remark(layer: dict, marker) -> dict:
    layer = dict(layer)
    key = next(k for k in layer if k.endswith(".comfy_quant"))
    layer[key] = marker_tensor(marker)
    return layer


LAYERS = {
    "w4a8": lambda: w4a8_layer("blocks.0.w"),
    "int8": lambda: int8_layer("blocks.1.i"),
    "fp8": lambda: fp8_layer("blocks.2.f", input_scale=True),
    "w4a4": lambda: w4a4_layer("blocks.3.a"),
    "nvfp4": lambda: nvfp4_layer("blocks.4.n"),
    "mxfp8": lambda: mxfp8_layer("blocks.5.m"),
}


def _broken_files(tmp_path):
    """(label, path) for many broken checkpoints: every tensor of every format cast to other
    dtypes, reshaped, dropped; markers damaged; unmarked weights; mixed formats; shards with a
    missing shard; every container damage above."""
    n = 0

    def out(label, *parts, metadata=None):
        nonlocal n
        n += 1
        return label, write(tmp_path / f"b{n}.safetensors", *parts, metadata=metadata)

    files = []
    for name, make in LAYERS.items():
        layer = make()
        files.append(out(f"{name} ok", layer))
        for key, (dtype, shape, _data) in layer.items():
            suffix = key.rsplit(".", 1)[1]
            if suffix == "comfy_quant":
                continue
            for other in ("BF16", "F16", "F32", "U8", "I8", "F8_E4M3"):
                if other != dtype:
                    files.append(out(f"{name} {suffix} as {other}", _cast(layer, suffix, other)))
            if len(shape) == 2:
                files.append(out(f"{name} {suffix} transposed", _reshape(layer, suffix, shape[::-1])))
            files.append(out(f"{name} {suffix} flat", _reshape(layer, suffix, (max(1, shape[0] if shape else 1),))))
            files.append(out(f"{name} without {suffix}", _drop(layer, suffix)))
        marker = json.loads(layer[next(k for k in layer if k.endswith(".comfy_quant"))][2])
        for bad in (
            {},
            {"format": "nope"},
            {**marker, "convrot": False},
            {**marker, "group_size": 12},
            {**marker, "convrot_groupsize": 128},
            {**marker, "convrot_groupsize": "x"},
            [1, 2],
            b"\xff{",
        ):
            files.append(out(f"{name} marker {bad!r}", _remark(layer, bad)))
        files.append(out(f"{name} unmarked", {k: v for k, v in layer.items() if not k.endswith(".comfy_quant")}))
        prefix = next(k for k in layer if k.endswith(".comfy_quant"))[: -len(".comfy_quant")]
        files.append(
            out(f"{name} header disagrees", layer, metadata=header_markers({prefix: {**marker, "format": "int8_tensorwise"}}))
        )
        files.append(out(f"{name} header names no layer", layer, metadata=header_markers({"nowhere.x": marker})))
    files.append(out("mixed formats", *(make() for make in LAYERS.values())))
    files.append(out("fp8 scale bf16 x3", *(_cast(fp8_layer(f"b.{i}"), "weight_scale", "BF16") for i in range(3))))
    for kind, damage in sorted(DAMAGE.items()):
        files.append(
            (f"container {kind}", damage(write(tmp_path / f"c_{kind}.safetensors", w4a8_layer(P), fp8_layer("blocks.1.ff"))))
        )
    # a sharded checkpoint whose index names a missing shard and a tensor no shard holds
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    write(shard_dir / "m-00001-of-00002.safetensors", w4a8_layer("blocks.0.w"))
    index = {
        "metadata": {},
        "weight_map": {
            **{k: "m-00001-of-00002.safetensors" for k in w4a8_layer("blocks.0.w")},
            "blocks.9.x.weight": "m-00002-of-00002.safetensors",
            "blocks.8.x.weight": "m-00001-of-00002.safetensors",
        },
    }
    (shard_dir / "m.safetensors.index.json").write_text(json.dumps(index))
    files.append(("missing shard", str(shard_dir)))
    return files


SELECTIONS = [TARGETS] + [(t,) for t in TARGETS] + list(combinations(TARGETS, 2))


def test_severity_and_verdicts_agree_on_many_broken_files(tmp_path):
    """Severity follows the verdicts, for every file and every selection of targets: each error
    names a selected runtime whose verdict FAILS, and each FAILS verdict has an error finding
    that names it; the exit code says errors exactly when a selected runtime fails."""
    files = _broken_files(tmp_path)
    assert len(files) > 200
    failing = 0
    for label, path in files:
        for selected in SELECTIONS:
            report = check(path, target=list(selected))
            fails = {t for t, v in report.verdicts.items() if v.first is not None}
            assert set(report.verdicts) == set(selected)
            for f in report.findings:
                if f.severity == "error":
                    assert set(f.targets) & fails, (label, selected, f.code, f.targets, f.message)
            for t in fails:
                assert any(f.severity == "error" and t in f.targets for f in report.findings), (label, selected, t)
            assert report.ok == (not fails), (label, selected)
            failing += bool(fails)
    assert failing > len(files)  # the corpus is mostly broken for someone


def test_fp8_bf16_scales_are_not_errors(tmp_path, capsys):
    """An FP8 weight_scale cast to BF16 must not be 12 errors and exit 1 while every target
    loads.  All three runtimes upcast it exactly (comfy-kitchen's FP8 Params
    casts the scale to F32; ComfyUI builds those Params; SGLang copies it into its F32
    parameter), so it is a warning, and check passes."""
    layers = [_cast(fp8_layer(f"blocks.{i}.fc"), "weight_scale", "BF16") for i in range(12)]
    path = write(tmp_path / "fp8.safetensors", *layers)
    assert main(["check", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(v["loads"] for v in out["targets"].values())
    assert [f["severity"] for f in out["findings"] if f["code"] == "L002"] == ["warning"] * 12
    assert out["counts"]["error"] == 0


@pytest.mark.parametrize("selected", [("sglang",), ("comfyui",), ("comfy-kitchen",), ("comfyui", "comfy-kitchen")])
def test_error_of_an_unselected_runtime_is_info(tmp_path, selected):
    """An INT8 BF16 scale stops only SGLang (comfy-kitchen computes with it exactly): an error
    with SGLang selected, info otherwise (README: findings for runtimes not selected)."""
    path = write(tmp_path / "i.safetensors", _cast(int8_layer("b.0"), "weight_scale", "BF16"))
    report = check(path, target=list(selected))
    (f,) = [f for f in report.findings if f.code == "L002"]
    assert f.targets == ["sglang"]
    assert f.severity == ("error" if "sglang" in selected else "info")


# -- BF16/F16 scales in comfy-kitchen 0.2.40 and ComfyUI, run for real ------------------

torch = pytest.importorskip("torch")


def _kitchen_outcome(variant: str, layer, comfyui: bool):
    """Build the layer as comfy-kitchen (or ComfyUI's ``_load_quantized_module``: its
    ``pop_scale`` views, the model's shape, ``Params(**scales)``) and run one forward on CPU:
    ((exception type, message), None) when it raises, else (None, the output)."""
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.base import get_layout_class

    from kitchen_fixtures import VARIANTS

    v = VARIANTS[variant]
    t = dict(layer.tensors)
    marker = layer.marker
    storage = {
        "float8_e4m3fn": torch.float8_e4m3fn,
        "nvfp4": torch.uint8,
        "mxfp8": torch.float8_e4m3fn,
        "int8_tensorwise": torch.int8,
        "convrot_w4a4": torch.int8,
        "asym_w4a8_int8": torch.int8,
    }[v.format]

    def scale(name, view=None):
        x = t.get(name)
        if x is not None and view is not None and comfyui:
            x = x.view(dtype=view)
        return x

    try:
        if v.format == "float8_e4m3fn":
            sc = {"scale": scale("weight_scale")}
        elif v.format == "mxfp8":
            sc = {"scale": scale("weight_scale", torch.float8_e8m0fnu)}
        elif v.format == "nvfp4":
            sc = {"scale": scale("weight_scale_2"), "block_scale": scale("weight_scale", torch.float8_e4m3fn)}
        elif v.format == "int8_tensorwise":
            sc = {"scale": scale("weight_scale")}
            if marker.get("convrot"):
                sc.update(convrot=True, convrot_groupsize=int(marker.get("convrot_groupsize", 256)))
        elif v.format == "convrot_w4a4":
            sc = {
                "scale": scale("weight_scale"),
                "convrot_groupsize": int(marker.get("convrot_groupsize", 256)),
                "quant_group_size": 64,
                "linear_dtype": marker.get("linear_dtype", "int4"),
            }
        else:
            s_rel = t["weight_s_rel"]
            if comfyui and s_rel.dtype == torch.uint8:
                s_rel = s_rel.view(torch.float8_e4m3fn)
            sc = {
                "scale": s_rel,
                "s_channel": t.get("weight_s_channel"),
                "codebook": t.get("weight_codebook"),
                "group_size": int(marker.get("group_size", 16)),
                "convrot_groupsize": int(marker.get("convrot_groupsize", 256)),
            }
            if not comfyui and "weight_correction" in t:
                sc["correction"] = t["weight_correction"]
        params = get_layout_class(v.layout).Params(**sc, orig_dtype=torch.bfloat16, orig_shape=(layer.n, layer.k))
        qt = QuantizedTensor(t["weight"].to(storage), v.layout, params)
        x = torch.randn(2, layer.k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        y = torch.nn.functional.linear(x, qt, t.get("bias"))
    except Exception as exc:  # noqa: BLE001 -- the library's own failure is the reference
        return (type(exc).__name__, str(exc)), None
    return None, y


_SET = re.compile(r"\{(torch\.[^}]*)\}")


def _sets_sorted(message: str) -> str:
    """comfy-kitchen prints a Python set of torch dtypes, whose order changes from process to
    process (dtype hashes are ids): compare it as a set."""
    return _SET.sub(lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", message)


SCALES = [
    (variant, suffix)
    for variant, suffixes in {
        "fp8": ("weight_scale",),
        "fp8_static": ("weight_scale", "input_scale"),
        "int8_scalar": ("weight_scale",),
        "int8_rowwise": ("weight_scale",),
        "int8_convrot": ("weight_scale",),
        "w4a8_codebook": ("weight_s_rel", "weight_s_channel", "weight_codebook"),
        "w4a8_uniform": ("weight_s_channel",),
        "w4a8_asym": ("weight_s_channel", "weight_correction"),
        "w6a8": ("weight_s_rel", "weight_s_channel"),
        "w4a4": ("weight_scale",),
        "nvfp4": ("weight_scale", "weight_scale_2"),
        "mxfp8": ("weight_scale",),
    }.items()
    for suffix in suffixes
]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "u8"])
@pytest.mark.parametrize("variant, suffix", SCALES)
def test_scale_dtype_verdicts_match_comfy_kitchen(tmp_path, variant, suffix, dtype):
    """Each scale of each format stored as BF16/F16 (the values it holds, cast), and each
    one-byte scale relabelled U8 (the same bytes, as c2q writes MXFP8 scales): comfy-kitchen
    0.2.40 (eager, CPU) and ComfyUI's way of building its layouts either compute exactly what
    the original file computes, or raise; the comfy-kitchen and ComfyUI verdicts say the same."""
    pytest.importorskip("comfy_kitchen")
    from kitchen_fixtures import DTYPES, make_layer, write_layers

    base = make_layer(variant, n=128, k=256, marker="comfyui")
    original = base.tensors[suffix]
    if dtype == "u8":
        if original.dtype.itemsize != 1:
            pytest.skip("relabelling keeps the bytes: one-byte scales only")
        cast = original.view(torch.uint8)
    else:
        cast = original.float().to(DTYPES[dtype])
    layer = base.with_tensor(suffix, cast)
    # the reference keeps the original dtype and holds the cast values
    ref = base.with_tensor(
        suffix,
        cast.to(original.dtype)
        if original.dtype.is_floating_point and original.dtype.itemsize >= 2 and dtype != "u8"
        else original,
    )
    path = write_layers(tmp_path / "m.safetensors", [layer])
    report = check(path)
    for name, comfyui in (("comfy-kitchen", False), ("comfyui", True)):
        outcome, y = _kitchen_outcome(variant, layer, comfyui)
        verdict = report.verdicts[name]
        first = (verdict.with_newer_kitchen if comfyui else verdict).first  # ComfyUI 0.33.0 run with comfy-kitchen 0.2.40
        if outcome is None:
            assert first is None, (name, first)
            # and it computes exactly what the file with the original scale dtype computes
            ref_outcome, y_ref = _kitchen_outcome(variant, ref, comfyui)
            assert ref_outcome is None and torch.equal(y, y_ref), name
        else:
            assert first is not None, (name, outcome)
            assert (first.exception, _sets_sorted(first.message)) == (outcome[0], _sets_sorted(outcome[1])), name
    # severity agrees: an error exactly when some runtime fails
    l002 = [f for f in report.findings if f.tensor and f.tensor.endswith("." + suffix) and f.code.startswith("L")]
    fails = {t for t, v in report.verdicts.items() if v.first is not None}
    for f in l002:
        assert (f.severity == "error") == bool(set(f.targets) & fails)


@pytest.mark.parametrize("variant, dtype", [("nvfp4", torch.bfloat16), ("mxfp8", torch.float32)])
def test_comfyui_views_a_scalar_block_scale(tmp_path, variant, dtype):
    """ComfyUI views the NVFP4/MXFP8 block scale as a one-byte float when it pops it: a 0-d
    scale of another width fails right there with torch's own view error."""
    from kitchen_fixtures import make_layer, write_layers

    base = make_layer(variant, n=128, k=256, marker="comfyui")
    scale = torch.ones((), dtype=dtype)
    target = torch.float8_e4m3fn if variant == "nvfp4" else torch.float8_e8m0fnu
    with pytest.raises(RuntimeError) as exc:
        scale.view(dtype=target)
    report = check(write_layers(tmp_path / "m.safetensors", [base.with_tensor("weight_scale", scale)]))
    first = report.verdicts["comfyui"].first
    assert (first.exception, first.message) == ("RuntimeError", str(exc.value))
    assert any(f.severity == "error" and "comfyui" in f.targets for f in report.findings)


SURROGATE_NAMES = [
    r"\ud800x",
    r"\ud800",
    r"\ud800\n",
    r"\ud800\u0041",
    r"\ud800\ud800",
    r"\udc80",
    r"ab\udfff",
    r"\ud800\"q",
    r"\ud800\\q",
]


@pytest.mark.parametrize("where", ["name", "metadata key", "metadata value"])
@pytest.mark.parametrize("escape", SURROGATE_NAMES)
def test_lone_surrogates_fail_every_target_like_safetensors(tmp_path, escape, where):
    """Python's json decodes a lone surrogate escape into a string that is not text; serde_json
    refuses the header at its own position: every target FAILS with that exact message."""
    entry = '{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
    text = {
        "name": '{"a' + escape + '":' + entry + "}",
        "metadata key": '{"__metadata__":{"k' + escape + '":"v"},"a":' + entry + "}",
        "metadata value": '{"__metadata__":{"k":"v' + escape + '"},"a":' + entry + "}",
    }[where]
    path = raw_file(tmp_path / "s.safetensors", text, bytes(4))
    report = assert_fails_like_safetensors(path)
    assert not report.ok


@pytest.mark.parametrize("pair", [r"\ud83d\ude00", r"\uD83D\uDE00", r"\\ud800"])
def test_surrogate_pairs_and_escaped_backslashes_load(tmp_path, pair):
    entry = '{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
    path = raw_file(tmp_path / "s.safetensors", '{"a' + pair + '":' + entry + "}", bytes(4))
    assert real_error(path) is None
    assert all(v.loads for v in check(path).verdicts.values())


OUT_OF_RANGE = [
    '"shape":1e400,"data_offsets":[0,4]',
    '"shape":[1e400],"data_offsets":[0,4]',
    '"shape":[4],"data_offsets":[0,1e400]',
    '"shape":[4],"data_offsets":[0,-1e400]',
    '"shape":[' + "9" * 400 + '],"data_offsets":[0,4]',
]


@pytest.mark.parametrize("fields", OUT_OF_RANGE)
def test_numbers_out_of_range_fail_like_safetensors(tmp_path, fields):
    """Python's json reads 1e400 (or a 400-digit integer) as inf; serde_json refuses it with
    "number out of range" where the number ends (found by the fuzz campaign: this crashed)."""
    path = raw_file(tmp_path / "o.safetensors", '{"a":{"dtype":"U8",' + fields + "}}", bytes(4))
    assert_fails_like_safetensors(path)


def test_number_out_of_range_in_metadata_fails_like_safetensors(tmp_path):
    path = raw_file(
        tmp_path / "o.safetensors", '{"__metadata__":{"k":1e400},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', bytes(4)
    )
    assert_fails_like_safetensors(path)
