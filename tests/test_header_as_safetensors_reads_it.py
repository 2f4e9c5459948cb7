"""The header is read as safetensors reads it: a repeated key, and the strings its messages
quote, give check the verdict safetensors itself gives (refused or loaded, the exact message),
and every command that reads the header refuses what safetensors refuses, in one line."""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import struct
import sys
from pathlib import Path

import pytest

from builders import raw_file
from comfyquant import check
from comfyquant.cli import main
from comfyquant.io.header import read_header
from comfyquant.io.source import LocalFile

safetensors = pytest.importorskip("safetensors")

ENTRY = '{"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}'
"""One valid tensor entry over a 2-byte data area."""


def _real(path: str) -> str | None:
    """What safetensors raises opening ``path`` with ``safe_open`` (None when it opens), checked
    to be what ``load_file`` raises too."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    try:
        with safe_open(path, framework="np"):
            pass
    except Exception as exc:  # the library's own SafetensorError
        opened = str(exc)
    else:
        opened = None
    try:
        load_file(path)
    except Exception as exc:  # the library's own SafetensorError, or NumPy's on BF16/F8 data
        if type(exc).__name__ == "SafetensorError":
            assert str(exc) == opened
        else:
            assert opened is None  # the header was read: NumPy has no such dtype
    else:
        assert opened is None
    return opened


def _verdict(path: str) -> str | None:
    """check's verdict for the file: the SafetensorError every runtime fails with, or None."""
    report = check(path)
    messages = set()
    for verdict in report.verdicts.values():
        first = verdict.first
        messages.add(first.message if first is not None and first.exception == "SafetensorError" else None)
    assert len(messages) == 1, messages
    return messages.pop()


REPEATED = {
    "entry field dtype": '{"a": {"dtype": "U8", "dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}',
    "entry field shape": '{"a": {"dtype": "U8", "shape": [2], "shape": [2], "data_offsets": [0, 2]}}',
    "entry field data_offsets": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "data_offsets": [0, 2]}}',
    "entry field, escaped": '{"a": {"d\\u0074ype": "U8", "dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}',
    "entry field, over lines": '{\n "a": {\n  "dtype": "U8",\n  "shape": [2],\n  "data_offsets": [0, 2],\n  "shape" : [2]\n }\n}',
    "entry field, in a later tensor": '{"a": '
    + ENTRY
    + ', "b": {"dtype": "U8", "shape": [0], "shape": [0], "data_offsets": [2, 2]}}',
    "__metadata__": '{"__metadata__": {}, "a": ' + ENTRY + ', "__metadata__": {"k": "v"}}',
    "__metadata__, null twice": '{"__metadata__": null, "__metadata__": null, "a": ' + ENTRY + "}",
    "__metadata__, whitespace before the colon": '{"__metadata__": {},\n "__metadata__" \t : {}, "a": ' + ENTRY + "}",
    "__metadata__, escaped": '{"__metadata__": {}, "__m\\u0065tadata__": {}, "a": ' + ENTRY + "}",
    "__metadata__, first not a map": '{"__metadata__": [1], "__metadata__": {}, "a": ' + ENTRY + "}",
    "tensor name, first entry invalid": '{"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}, "a": ' + ENTRY + "}",
    "tensor name, first entry not an object": '{"a": 1, "a": ' + ENTRY + "}",
    "tensor name, escaped, first entry NaN": '{"a": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 2]}, "\\u0061": '
    + ENTRY
    + "}",
    "metadata key, first value not a string": '{"__metadata__": {"k": 1, "k": "v"}, "a": ' + ENTRY + "}",
    "dtype variant": '{"a": {"dtype": {"U8": null, "U8": null}, "shape": [2], "data_offsets": [0, 2]}}',
}
"""Repeated keys safetensors refuses; Python's JSON keeps one value of each and sees nothing."""

ACCEPTED = {
    "tensor name, both entries valid": '{"a": ' + ENTRY + ', "a": ' + ENTRY + "}",
    "metadata key, both strings": '{"__metadata__": {"k": "v", "k": "w"}, "a": ' + ENTRY + "}",
    "an ignored field": '{"a": {"dtype": "U8", "x": 1, "shape": [2], "x": [2], "data_offsets": [0, 2]}}',
}
"""Repeated keys safetensors reads (the last value of each wins)."""


@pytest.mark.parametrize("kind", sorted(REPEATED))
def test_a_repeated_key_gets_safetensors_own_verdict_and_every_command_refuses_it(tmp_path, capsys, kind):
    path = raw_file(tmp_path / "dup.safetensors", REPEATED[kind], data=b"ab")
    real = _real(path)
    assert real is not None and "invalid JSON in header" in real
    assert _verdict(path) == real
    report = check(path)
    assert "C016" in {f.code for f in report.findings}
    before = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    out = tmp_path / "out.safetensors"
    for args in (
        ["migrate", path, "-o", str(out)],
        ["dequantize", path, "-o", str(out)],
        ["convert", path, "--to", "fp8", "-o", str(out)],
        ["compare", path, path],
    ):
        rc = main(args)
        _, err = capsys.readouterr()
        assert rc == 2, args
        assert err.count("\n") == 1 and path in err and re.search(r"\[C0\d\d\]", err) and "Traceback" not in err, (args, err)
        assert not out.exists()
    # fix reports container damage it cannot carry over (exit 1), as for a mis-sized tensor
    rc = main(["fix", path, "-o", str(out)])
    text, _ = capsys.readouterr()
    assert rc == 1 and "not repaired: the checkpoint's container is damaged" in text and "C016" in text
    assert "nothing was written" in text and not out.exists()
    rc = main(["inspect", path])
    text, _ = capsys.readouterr()
    assert rc == 1 and text.startswith("DAMAGED: ") and re.search(r"\[C0\d\d\]", text.splitlines()[0])
    rc = main(["check", path])
    text, err = capsys.readouterr()
    assert rc == 1 and err == "" and "C016" in text and real.split(": ", 1)[1] in text
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == before


@pytest.mark.parametrize(
    "header",
    [
        '{"__metadata__": {}, "a": ' + ENTRY + ', "__metadata__" } null}',
        '{"__metadata__": {}, "a": ' + ENTRY + ', "__metadata__"\n  }',
        '{"__metadata__": {}, "a": ' + ENTRY + ', "__metadata__"  ] }',
        '{"__metadata__": {}, "a": ' + ENTRY + ', "__metadata__"',
        '{"__metadata__": {}, "__metadata__": [1, "a": ' + ENTRY + "}",
    ],
)
def test_a_repeated_metadata_key_in_text_python_cannot_read_either(tmp_path, header):
    """The repeated key stops serde_json before the text's damage does: the verdict is its
    message, placed where serde_json places it (past whitespace and a closing brace)."""
    path = raw_file(tmp_path / "dup.safetensors", header, data=b"ab")
    real = _real(path)
    assert real is not None and "duplicate field `__metadata__`" in real
    assert _verdict(path) == real
    assert "C009" in {f.code for f in check(path).findings}


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
def test_a_repeated_key_safetensors_reads_is_read_the_same(tmp_path, kind):
    path = raw_file(tmp_path / "dup.safetensors", ACCEPTED[kind], data=b"ab")
    assert _real(path) is None
    assert _verdict(path) is None
    assert "C016" not in {f.code for f in check(path).findings}


def test_a_repeated_key_refuses_the_gate_with_its_finding(tmp_path):
    from comfyquant.errors import InputError
    from comfyquant.gate import open_input

    path = raw_file(tmp_path / "dup.safetensors", REPEATED["entry field dtype"], data=b"ab")
    with pytest.raises(
        InputError,
        match=r"refusing to convert: .*dup\.safetensors: header repeats the field 'dtype' in the entry of tensor 'a'.*\[C016\]",
    ):
        with open_input([path], "convert"):
            pass


HIDDEN = {
    "NaN in an ignored field": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": NaN}}',
    "a number too large in an ignored field": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1e400}}',
    "a lone surrogate in an ignored field": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": "\\udc00"}}',
    "-0 as a dimension": '{"a": {"dtype": "U8", "shape": [2, 1], "data_offsets": [-0, 2]}}',
    "nesting 128 deep in an ignored field": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": '
    + "[" * 126
    + "]" * 126
    + "}}",
}
"""JSON Python's parser reads where safetensors' refuses, in places Python's reading loses."""


@pytest.mark.parametrize("kind", sorted(HIDDEN))
def test_json_python_reads_and_safetensors_refuses_gets_safetensors_verdict(tmp_path, kind):
    path = raw_file(tmp_path / "hidden.safetensors", HIDDEN[kind], data=b"ab")
    real = _real(path)
    assert real is not None
    assert _verdict(path) == real
    assert {f.code for f in check(path).findings} & {"C006", "C016"}


def test_nesting_just_under_the_limit_loads(tmp_path):
    header = '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": ' + "[" * 125 + "]" * 125 + "}}"
    path = raw_file(tmp_path / "deep.safetensors", header, data=b"ab")
    assert _real(path) is None and _verdict(path) is None


QUOTED = {
    "an escaped letter": '"\\u0041"',
    "NUL": '"\\u0000"',
    "a byte-order mark": '"\\ufeff"',
    "a surrogate pair": '"\\ud83d\\ude00"',
    "control characters": '"\\u0001\\u001f\\u007f\\t\\n\\r"',
    "quotes and backslashes": '"\\"\\\\\'"',
    "a combining mark": '"e\\u0301"',
    "grapheme extenders Python's tables do not know": '"\\u09be\\uff9e\\u1715"',
    "characters newer than Python's Unicode tables": '"\\u0c5c\\u1b4e\\u2427"',
    "a private-use and an unassigned character": '"\\ue000\\u0378"',
    "spaces": '"\\u00a0\\u2028\\u3000 "',
    "non-ASCII text": '"\\u00e9t\\u00e9 \\u6f22\\u5b57"',
}
"""Strings safetensors quotes in its messages (decoded, then printed with Rust's ``{:?}``)."""


@pytest.mark.parametrize("kind", sorted(QUOTED))
@pytest.mark.parametrize("where", ["shape", "dtype", "data_offsets", "offset", "header", "__metadata__", "metadata value"])
def test_a_quoted_string_is_the_decoded_characters_as_safetensors_prints_them(tmp_path, kind, where):
    s = QUOTED[kind]
    header = {
        "shape": '{"a": {"dtype": "U8", "shape": %s, "data_offsets": [0, 2]}}',
        "dtype": '{"a": {"dtype": %s, "shape": [2], "data_offsets": [0, 2]}}',
        "data_offsets": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": %s}}',
        "offset": '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, %s]}}',
        "header": "%s",
        "__metadata__": '{"__metadata__": %s, "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}',
        "metadata value": '{"__metadata__": {%s: [1]}, "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}',
    }[where] % s
    path = raw_file(tmp_path / "s.safetensors", header, data=b"ab")
    real = _real(path)
    assert real is not None
    assert _verdict(path) == real


def test_a_tensor_name_is_quoted_as_is_in_an_offset_error(tmp_path):
    header = '{"\\u0000\\ufeff\\u0301": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}'
    path = raw_file(tmp_path / "n.safetensors", header, data=b"abc")
    real = _real(path)
    assert real is not None and "`\x00\ufeff\u0301`" in real
    assert _verdict(path) == real


def test_a_clean_header_with_colons_in_names_and_metadata_reads_plainly(tmp_path, monkeypatch):
    """A clean header whose strings hold colons is read without the second reading (check's
    hot path), and a repeated key in one is still found."""
    import comfyquant.io.hidden as hidden

    meta = {"note": "a: b: c", "json": json.dumps({"k": {"x": 1}})}
    clean = json.dumps({"__metadata__": meta, "x:y": json.loads(ENTRY)})
    path = raw_file(tmp_path / "c.safetensors", clean, data=b"ab")
    assert _real(path) is None and _verdict(path) is None
    second = hidden.hidden_refusal
    readings = []
    monkeypatch.setattr(hidden, "hidden_refusal", lambda *a: readings.append(a) or second(*a))
    src = LocalFile(path)
    try:
        assert read_header(src).findings == [] and readings == []
    finally:
        src.close()
    for dup in (clean[:-1] + ', "__metadata__": {}}', clean.replace('"x:y": {', '"x:y": {"shape": [2], ')):
        path = raw_file(tmp_path / "d.safetensors", dup, data=b"ab")
        real = _real(path)
        assert real is not None and "duplicate field" in real and _verdict(path) == real
    assert readings


def test_every_character_is_quoted_as_safetensors_prints_it():
    """The whole of Unicode, in batches, through the quoting of a string in an error."""
    from safetensors import deserialize

    from comfyquant.targets.serde_syntax import rust_debug

    for start in range(0, 0x110000, 4096):
        chars = "".join(chr(c) for c in range(start, min(start + 4096, 0x110000)) if not 0xD800 <= c <= 0xDFFF)
        if not chars:
            continue
        raw = json.dumps({"a": {"dtype": "U8", "shape": chars, "data_offsets": [0, 1]}}, ensure_ascii=False).encode()
        with pytest.raises(Exception) as exc:
            deserialize(struct.pack("<Q", len(raw)) + raw + b"x")
        assert f"invalid type: string {rust_debug(chars)}, expected a sequence" in str(exc.value), hex(start)


def test_differential_fuzz_of_header_reading_finds_nothing():
    """A bounded run of tools/fuzz_headers.py: mutated headers (repeated keys, escapes,
    strange strings, other values, whitespace, damaged bytes) get safetensors' own outcome."""
    findings = _fuzz_module().run(3000, seed=7, show=0, out=io.StringIO())
    assert not findings, "\n".join(findings[:5])


def test_the_fuzz_asks_safetensors_what_safe_open_and_load_file_say(tmp_path):
    """The fuzz reads safetensors' verdict from ``deserialize`` (in memory, fast): on its own
    mutated headers that is what ``safe_open`` and ``load_file`` raise opening the file."""
    fuzz_headers = _fuzz_module()
    rng = random.Random(3)
    for i in range(150):
        obj, data_len = fuzz_headers.base_header(rng)
        _kind, header = fuzz_headers.mutate(rng, obj, rng.choice([None, 1]))
        data = struct.pack("<Q", len(header)) + header + bytes(data_len)
        path = tmp_path / f"m{i}.safetensors"
        path.write_bytes(data)
        real = _real(str(path))
        told = fuzz_headers.theirs(data)
        assert told == real or fuzz_headers._either(told, real, data), (header, real, told)


def _fuzz_module():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    try:
        import fuzz_headers
    finally:
        sys.path.pop(0)
    return fuzz_headers


@pytest.mark.needs_torch
def test_load_quantized_refuses_a_repeated_key_in_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    from comfyquant.errors import ComfyQuantError
    from comfyquant.torch.load import load_quantized

    path = raw_file(tmp_path / "dup.safetensors", REPEATED["entry field shape"], data=b"ab")
    with pytest.raises(ComfyQuantError) as exc:
        load_quantized(torch.nn.Linear(2, 1), path)
    assert "\n" not in str(exc.value) and "[C016]" in str(exc.value) and path in str(exc.value)


NUMBERS = [
    "1e400",
    "1844e6744073709551616",
    "1e2147483648",
    "1E+99999999999999",
    "123456789012345678901234567890e99999999999999",
    "0e99999999999999",
    "0.5e99999999999999",
    "1e-99999999999999",
    "1" * 400,
]
"""Numbers beyond an f64 (serde_json refuses an exponent beyond i32 at the digit that
overflows it) and numbers it reads as zero."""


@pytest.mark.parametrize("number", NUMBERS)
@pytest.mark.parametrize(
    "where",
    [
        '{"__metadata__": {"k": %s}, "a": ' + ENTRY + "}",
        '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": %s}}',
        '{"a": {"dtype": "U8", "shape": [%s], "data_offsets": [0, 2]}}',
        "%s",
        '{"a": ' + ENTRY + ', "b": [%s',
    ],
)
def test_a_number_out_of_range_is_refused_where_serde_json_stops(tmp_path, number, where):
    path = raw_file(tmp_path / "n.safetensors", where % number, data=b"ab")
    assert _verdict(path) == _real(path)
