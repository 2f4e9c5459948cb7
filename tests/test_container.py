"""The safetensors reader: structural damage is one clear line (exit 2) for the writing commands
and a report for check; per-tensor damage is a finding; nothing is modified."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import dense_layer, raw_file, w4a8_layer, write
from comfyquant import check
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.header import Header, _enter_tensors, read_header
from comfyquant.io.source import LocalFile
from conftest import HAS_TORCH


def codes(report):
    return {f.code for f in report.findings}


def run_cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda p: (p.write_bytes(b"abc"), str(p))[1], "truncated: 3 bytes"),
        (lambda p: raw_file(p, "{}", length=10_000), "runs past the end of the file"),
        (lambda p: raw_file(p, "{}", length=200 * 1024 * 1024), "exceeds the 100 MB limit"),
        (lambda p: raw_file(p, "{not json"), "header is not valid JSON"),
        (
            lambda p: raw_file(p, '{"a": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}'),
            "for integer string conversion",
        ),
        (lambda p: raw_file(p, "[1, 2]"), "header is a JSON array, expected an object"),
        (lambda p: raw_file(p, b"\xff\xfe{}"), "not UTF-8"),
        (lambda p: raw_file(p, '{"__metadata__": [1]}'), "__metadata__ is a JSON array"),
    ],
)
def test_unreadable_file_is_one_line_exit_2_for_the_writing_commands(tmp_path, capsys, build, needle):
    path = build(tmp_path / "bad.safetensors")
    before = hashlib.sha256(open(path, "rb").read()).hexdigest()
    with pytest.raises(InputError, match=needle):
        read_header(LocalFile(path))
    rc, out, err = run_cli(capsys, "fix", path, "-o", str(tmp_path / "fixed.safetensors"))
    assert rc == 2
    assert err.count("\n") == 1 and str(path) in err and needle in err
    assert "Traceback" not in err
    assert not (tmp_path / "fixed.safetensors").exists()
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == before


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda p: (p.write_bytes(b"abc"), str(p))[1], "truncated: 3 bytes"),
        (lambda p: (p.write_bytes(b""), str(p))[1], "truncated: 0 bytes"),
        (lambda p: raw_file(p, "{}", length=10_000), "runs past the end of the file"),
        (lambda p: raw_file(p, "{}", length=200 * 1024 * 1024), "exceeds the 100 MB limit"),
        (lambda p: raw_file(p, "{not json"), "header is not valid JSON"),
        (lambda p: raw_file(p, "not json"), "header is not valid JSON"),
        (lambda p: raw_file(p, '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]', data=b"ab"), "not valid JSON"),
        (lambda p: raw_file(p, "[1, 2]"), "header is a JSON array, expected an object"),
        (lambda p: raw_file(p, '"text"'), "header is a JSON string, expected an object"),
        (lambda p: raw_file(p, b"\xff\xfe{}"), "not UTF-8"),
        (lambda p: raw_file(p, b'{"\xc3": 1}'), "not UTF-8"),
        (lambda p: raw_file(p, '{"__metadata__": [1]}'), "__metadata__ is a JSON array"),
        (lambda p: raw_file(p, "[" * 2000 + "]" * 2000), "nested too deeply"),
    ],
)
def test_unreadable_file_gets_a_report_with_safetensors_own_message(tmp_path, capsys, build, needle):
    """check reports a file nothing can read (exit 1): a C009 finding that says why, and every
    runtime FAILS with the SafetensorError the safetensors library itself raises opening it."""
    path = build(tmp_path / "bad.safetensors")
    before = hashlib.sha256(open(path, "rb").read()).hexdigest()
    report = check(path)
    (c009,) = [f for f in report.findings if f.code == "C009"]
    assert needle in c009.message and c009.severity == "error"
    real = _safetensors_error(path)
    for verdict in report.verdicts.values():
        first = verdict.first
        assert not verdict.loads and first.exception == "SafetensorError"
        if real is not None:
            assert first.message == real
    rc, out, err = run_cli(capsys, "check", path)
    assert rc == 1 and err == "" and "C009" in out and "FAILS  SafetensorError: Error while deserializing header: " in out
    rc, out, _ = run_cli(capsys, "check", path, "--json")
    doc = json.loads(out)
    assert rc == 1 and all(v["exception"] == "SafetensorError" for v in doc["targets"].values())
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == before


def _safetensors_error(path: str) -> str | None:
    """The message safetensors raises opening ``path`` (None where it is not installed)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    try:
        with safe_open(path, framework="np"):
            pass
    except Exception as exc:  # the library's own SafetensorError
        assert type(exc).__name__ == "SafetensorError"
        return str(exc)
    raise AssertionError(f"safetensors opened {path}")


def test_missing_path_and_empty_folder(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "check", str(tmp_path / "nope.safetensors"))
    assert rc == 2 and "no such file" in err
    rc, _, err = run_cli(capsys, "check", str(tmp_path))
    assert rc == 2 and "holds no .safetensors files" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_named_pipes_and_devices_are_refused_without_blocking(tmp_path, capsys):
    """Opening a named pipe for reading waits for a writer forever: a pipe named like a
    checkpoint (alone, in a folder, as an index or a rules file) and a device are one line
    each, at once."""
    import threading

    pipe = tmp_path / "model.safetensors"
    os.mkfifo(pipe)
    index = tmp_path / "other" / "model.safetensors.index.json"
    index.parent.mkdir()
    os.mkfifo(index)
    rules = tmp_path / "other" / "rules.toml"
    os.mkfifo(rules)
    dense = write(tmp_path / "other" / "dense.safetensors", dense_layer("blocks.0.fc"))
    runs = [
        ("check", str(pipe)),
        ("check", str(tmp_path)),
        ("inspect", str(index)),
        ("check", "/dev/zero"),
        ("quantize", "/dev/zero", str(tmp_path / "q.safetensors"), "-f", "fp8"),
        ("dequantize", str(pipe), str(tmp_path / "d.safetensors")),
        ("quantize", dense, str(tmp_path / "r.safetensors"), "--rules", str(rules)),
    ]
    results = []
    worker = threading.Thread(target=lambda: results.extend(run_cli(capsys, *r) for r in runs), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "a named pipe blocked the reader"
    assert len(results) == len(runs)
    for run, (rc, _, err) in zip(runs, results):
        assert rc == 2 and err.count("\n") == 1, err
        refused = "is a named pipe, not a file comfyquant can read" in err or "/dev/zero: is a character device" in err
        # a light install may name the missing extra before it looks at the input: still one line, at once
        assert refused or (not HAS_TORCH and run[0] in ("quantize", "dequantize") and "needs torch" in err), err


def test_json_nested_too_deeply_is_bad_input_not_a_crash(tmp_path, capsys):
    """json.loads gives up on 100,000 nested arrays with RecursionError (not ValueError): in the
    header it is a report for check (C009, and safetensors' own message) and a one-line refusal
    for the writing commands, in a marker M001, in the header marker map M010."""
    deep = "[" * 100_000 + "]" * 100_000
    header = raw_file(tmp_path / "h.safetensors", '{"a":' + deep + "}")
    rc, out, err = run_cli(capsys, "check", header)
    assert rc == 1 and err == "" and "header is not valid safetensors JSON (nested too deeply" in out
    real = _safetensors_error(header)
    assert real is None or f"FAILS  SafetensorError: {real}" in out
    rc, _, err = run_cli(capsys, "fix", header, "-o", str(tmp_path / "fixed.safetensors"))
    assert rc == 2 and err.count("\n") == 1 and "header is not valid safetensors JSON (nested too deeply" in err
    marker = ('{"format":' + deep + "}").encode()
    entries = {
        "x.comfy_quant": {"dtype": "U8", "shape": [len(marker)], "data_offsets": [0, len(marker)]},
        "x.weight": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [len(marker), len(marker) + 16]},
    }
    p = raw_file(tmp_path / "m.safetensors", json.dumps(entries), marker + bytes(16))
    assert "M001" in {f.code for f in check(p).findings}
    p = raw_file(tmp_path / "q.safetensors", json.dumps({"__metadata__": {"_quantization_metadata": '{"layers":' + deep + "}"}}))
    report = check(p)
    assert "M010" in {f.code for f in report.findings} and report.verdicts["comfyui"].first.exception == "RecursionError"
    assert main(["fix", p, "-o", str(tmp_path / "f.safetensors")]) in (0, 1)


def _entry_file(tmp_path, entries: dict, data_len: int, metadata=None):
    obj = dict(entries)
    if metadata is not None:
        obj["__metadata__"] = metadata
    return raw_file(tmp_path / "c.safetensors", json.dumps(obj), bytes(data_len))


def test_unknown_dtype_is_a_finding(tmp_path):
    p = _entry_file(tmp_path, {"a.weight": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, 2)
    r = check(p)
    f = [f for f in r.findings if f.code == "C005"]
    assert f and "'Q7'" in f[0].message and f[0].severity == "error" and not r.ok


def test_byte_span_mismatch(tmp_path):
    p = _entry_file(tmp_path, {"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, 12)
    f = [f for f in check(p).findings if f.code == "C001"]
    assert f and f[0].expected == "16 bytes" and f[0].actual == "12 bytes"


def test_offsets_out_of_range_and_overlap_and_gap(tmp_path):
    p = _entry_file(
        tmp_path,
        {
            "a.weight": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
            "b.weight": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
            "c.weight": {"dtype": "U8", "shape": [8], "data_offsets": [16, 24]},
            "d.weight": {"dtype": "U8", "shape": [8], "data_offsets": [24, 32]},
        },
        28,
    )
    c = codes(check(p))
    assert {"C002", "C003", "C004"} <= c


def test_trailing_bytes_and_metadata_not_string(tmp_path):
    p = _entry_file(tmp_path, {"a.weight": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, 6, metadata={"k": 1})
    c = codes(check(p))
    assert {"C004", "C007"} <= c


def test_malformed_entry(tmp_path):
    p = _entry_file(tmp_path, {"a.weight": {"dtype": "F32", "shape": [1]}, "b.bias": "x"}, 0)
    assert [f.code for f in check(p).findings].count("C006") == 2


def test_clean_file_reads_only_header_and_markers(tmp_path):
    p = write(tmp_path / "m.safetensors", w4a8_layer("blocks.0.q", n=64, k=4096), dense_layer("norm"))
    size = os.path.getsize(p)
    r = check(p)
    assert r.ok, [f.message for f in r.findings]
    stats = r.io[p]
    # one read for the header (the whole file is small here so the header read covers it),
    # one per marker
    assert stats["requests"] == 2
    big = write(tmp_path / "big.safetensors", w4a8_layer("blocks.0.q", n=3072, k=12288))
    r = check(big)
    assert r.io[big]["bytes"] < 300_000 < os.path.getsize(big)
    assert size > 0


def test_sparse_40gb_file_checks_without_reading_data(tmp_path):
    """A 40 GB checkpoint (file holes) is checked from its header: the reader never maps it."""
    from comfyquant.io.writer import build_header

    n, k = 40_000, 512_000  # 10 GB of packed codes per layer, 4 layers
    tensors = {}
    for i in range(4):
        p = f"blocks.{i}.ff"
        tensors[f"{p}.weight"] = ("I8", (n, k // 2), b"")
        tensors[f"{p}.weight_s_rel"] = ("F8_E4M3", (n, k // 16), b"")
        tensors[f"{p}.weight_s_channel"] = ("F32", (n,), b"")
    header = build_header(
        tensors,
        {
            "_quantization_metadata": json.dumps(
                {
                    "format_version": "1.0",
                    "layers": {
                        f"blocks.{i}.ff": {
                            "format": "asym_w4a8_int8",
                            "group_size": 16,
                            "convrot_groupsize": 256,
                            "convrot": True,
                        }
                        for i in range(4)
                    },
                }
            )
        },
    )
    total = len(header) + sum(n * k // 2 + n * k // 16 + 4 * n for _ in range(4))
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as fh:
        fh.write(header)
        fh.truncate(total)
    assert os.path.getsize(path) > 40 * 10**9 * 0.9
    r = check(str(path))
    assert r.ok, [f.message for f in r.findings if f.severity == "error"]
    assert r.io[str(path)]["bytes"] < 1_000_000


# -- the bulk header pass agrees with the entry-by-entry pass --------------------------------

_DTYPES = {"F32": 4, "BF16": 2, "U8": 1, "I8": 1, "F8_E4M3": 1}


@st.composite
def headers(draw):
    """A valid header (tensors tiling the data area in a shuffled order, zero-length ones
    included) and, half of the time, one corruption of one entry."""
    n = draw(st.integers(0, 12))
    specs = [(draw(st.sampled_from(sorted(_DTYPES))), tuple(draw(st.lists(st.integers(0, 5), max_size=3)))) for _ in range(n)]
    order = draw(st.permutations(range(n)))
    obj, pos = {}, 0
    for i in order:
        dtype, shape = specs[i]
        size = _DTYPES[dtype]
        for d in shape:
            size *= d
        obj[f"t{i}"] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + size]}
        pos += size
    data_len = pos
    if n and draw(st.booleans()):
        victim = obj[f"t{draw(st.integers(0, n - 1))}"]
        kind = draw(st.sampled_from(["dtype", "neg", "float", "bool", "overlap", "hole", "short", "offsets", "missing"]))
        if kind == "dtype":
            victim["dtype"] = "Q7"
        elif kind == "neg":
            numel = 1
            for d in victim["shape"]:
                numel *= d
            victim["shape"] = [-1, -numel]  # same element count, impossible dims
        elif kind == "float":
            victim["data_offsets"] = [float(victim["data_offsets"][0]), victim["data_offsets"][1]]
        elif kind == "bool":
            victim["shape"] = [True] + victim["shape"]
        elif kind == "overlap":
            victim["data_offsets"] = [max(0, victim["data_offsets"][0] - 1), victim["data_offsets"][1] - 1]
        elif kind == "hole":
            data_len += 3
        elif kind == "short":
            data_len = max(0, data_len - 1)
        elif kind == "offsets":
            victim["data_offsets"] = victim["data_offsets"] + [0]
        else:
            del victim["shape"]
    return obj, data_len


@settings(max_examples=300, deadline=None)
@given(headers(), st.sampled_from(["", "Jan 1st", "true", "- a note"]))
def test_header_pass_matches_strict_reference(tmp_path_factory, case, note):
    """Whatever shortcut the reader takes (dimensions checked only when the header text can
    hold a negative or boolean one), it enters and reports exactly what a check of every
    dimension of every entry does."""
    obj, data_len = case
    header = dict(obj)
    if note:
        header["__metadata__"] = {"note": note}
    raw = json.dumps(header).encode()
    path = tmp_path_factory.mktemp("h") / "m.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data_len))
    source = LocalFile(str(path))
    try:
        got = read_header(source)
    finally:
        source.close()
    ref = Header(str(path), 8 + len(raw) + data_len, len(raw))
    _enter_tensors(ref, json.loads(json.dumps(obj)), data_len, strict_dims=True)
    assert got.tensors == ref.tensors and list(got.tensors) == list(ref.tensors)
    assert [(f.code, f.message) for f in got.findings] == [(f.code, f.message) for f in ref.findings]


def _mutations(seed: int, count: int) -> list[bytes]:
    """Seeded damage to a real header's text: bytes cut, inserted, replaced or the text ended early."""
    import random

    rng = random.Random(seed)
    good = json.dumps(
        {
            "__metadata__": {"format": "pt", "quant": "x"},
            "w.weight": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]},
            "w.comfy_quant": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]},
        },
        indent=1 if seed % 2 else None,
    ).encode()
    alphabet = b'{}[]:,"\\ \n\t0123456789-+.eEnulltruefalsexyz\x01\xff\xc3\xa9u'
    out = []
    for _ in range(count):
        text = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text) + 1)
            op = rng.randrange(4)
            if op == 0:
                del text[i : i + rng.randint(1, 4)]
            elif op == 1:
                text[i:i] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))
            elif op == 2 and i < len(text):
                text[i] = rng.choice(alphabet)
            else:
                del text[i:]
        out.append(bytes(text))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_damaged_headers_get_the_message_safetensors_raises(tmp_path, seed):
    """Every runtime opens files with safetensors: on seeded damage to a header's text, the
    verdict's message is the one safetensors raises opening the very file (where it opens it,
    the verdict does not blame the container)."""
    pytest.importorskip("safetensors")
    differ = []
    for i, header in enumerate(_mutations(seed, 150)):
        path = raw_file(tmp_path / f"m{i}.safetensors", header, data=bytes(10))
        real = _safetensors_error_or_none(path)
        first = check(path, target="sglang").verdicts["sglang"].first
        ours = first.message if first is not None and first.exception == "SafetensorError" else None
        if ours != real:
            differ.append(f"{header[:70]!r}\n  safetensors: {real}\n  comfyquant:  {ours}")
    assert not differ, "\n".join(differ[:10])


def _safetensors_error_or_none(path: str) -> str | None:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="np"):
            return None
    except Exception as exc:  # the library's own SafetensorError
        return str(exc)


@pytest.mark.parametrize("seed", [0, 1])
def test_damaged_files_get_the_message_safetensors_raises(tmp_path, seed):
    """Seeded damage anywhere in a real file (cut short, its length field changed, header bytes
    changed or removed with or without the length following, bytes appended): check's verdict
    names exactly the SafetensorError safetensors raises opening the file, or none when it opens."""
    import random
    import struct

    pytest.importorskip("safetensors")
    rng = random.Random(seed)
    base = write(tmp_path / "base.safetensors", w4a8_layer("blocks.0.x"), dense_layer("blocks.1.y"))
    data = open(base, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    differ = []
    for i in range(150):
        damaged = bytearray(data)
        kind = rng.randrange(5)
        if kind == 0:
            damaged = damaged[: rng.randrange(len(damaged))]
        elif kind == 1:
            damaged[rng.randrange(8)] = rng.randrange(256)
        elif kind == 2:
            damaged[8 + rng.randrange(n)] = rng.choice(b'{}[]",:0123456789 \xff')
        elif kind == 3:
            at = 8 + rng.randrange(n)
            cut = rng.randint(1, 5)
            del damaged[at : at + cut]
            if rng.random() < 0.5:
                damaged[:8] = struct.pack("<Q", n - cut)
        else:
            damaged += bytes(rng.randrange(1, 20))
        path = tmp_path / f"d{i}.safetensors"
        path.write_bytes(bytes(damaged))
        real = _safetensors_error_or_none(str(path))
        first = check(str(path), target="sglang").verdicts["sglang"].first
        ours = first.message if first is not None and first.exception == "SafetensorError" else None
        if ours != real:
            differ.append(f"damage {kind} ({bytes(damaged[:40])!r}...)\n  safetensors: {real}\n  comfyquant:  {ours}")
    assert not differ, "\n".join(differ[:10])
