"""Differential fuzz of header reading: comfyquant's container verdict against the safetensors
library's own, on mutated headers.

    python tools/fuzz_headers.py [-n 100000] [--seed 0] [--show 10] [--check-every 50]

Each execution but the ``--check-every``-th writes nothing: a seeded mutator damages the JSON text of a valid header
(bytes cut, inserted, replaced or the text ended early; keys repeated -- tensor names,
``__metadata__``, its keys, an entry's fields, a dtype map's variant --; unknown fields added;
entries written as lists; characters rewritten as ``\\uXXXX`` escapes; strings replaced by
ones holding NUL, a byte-order mark, control characters, surrogate escapes, combining marks,
non-ASCII text; values replaced by other JSON; integers moved by one or out of range;
punctuation put or removed after a string; whitespace and newlines inserted; the data area
one byte short or long), then compares, in one process:

* comfyquant: ``read_header`` (as ``check`` reads, damage reported) and the container verdict
  ``targets.container.open_error`` -- the message every runtime fails with, or none;
* safetensors: ``safetensors.deserialize`` of the same bytes (the library's ``read_metadata``,
  the same validation ``safe_open`` and ``load_file`` make; its prefix ``Error while
  deserializing:`` becomes ``safe_open``'s ``Error while deserializing header:``).

A header comfyquant reads with no container finding must also be one safetensors accepts, and
the reverse; every ``--check-every``-th header is also written to a file and given to the whole
``check``, whose verdict must be the reader's.  Prints the count of each mutation kind, the
outcomes, the time and every disagreement (the first ``--show`` in full); exit status 1 when
any.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import struct
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from comfyquant.io.header import read_header  # noqa: E402
from comfyquant.targets.container import open_error  # noqa: E402

DTYPES = {"F32": 4, "BF16": 2, "F16": 2, "U8": 1, "I8": 1, "F8_E4M3": 1, "I64": 8, "BOOL": 1}
FIELDS = ("dtype", "shape", "data_offsets")
ALPHABET = b'{}[]:,"\\ \n\t\r0123456789-+.eEnulltruefalsexyzNaInfity\x00\x01\x1f\x7f\xff\xc3\xa9\xef\xbb\xbfu'
STRANGE = [
    "\x00",
    "\ufeff",
    "\t",
    "\x1f",
    "\x7f",
    "\u0301",
    "\u200b",
    "\u2028",
    "\U0001f600",
    "\u00e9",
    "\ud800",
    "\udc00",
    "\ud83d\ude00",
    '"',
    "\\",
    "'",
    "\u0488",
    "\uff9e",
    "\u09be",
    "\U000e0001",
    "\U0010ffff",
    "\u0378",
    "\u00ad",
    " ",
    "\u3000",
]
VALUES = [
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "1e400",
    "-0",
    "18446744073709551616",
    "NaN",
    "Infinity",
    "-Infinity",
    '""',
    '"x"',
    "[]",
    "{}",
    "[1, 2]",
    '{"U8": null}',
    '{"U8": null, "U8": null}',
    '["U8", [1], [0, 1]]',
    '"\\u0000"',
    '"\\ufeff"',
    '"\\ud800"',
    '"\\udc00x"',
    '"\\ud83d\\ude00"',
    '"A\\u0041"',
    '"\\u0301"',
    '"\\u00e9"',
    "[" * 130 + "]" * 130,
    '{"a": 1, "a": 2}',
    "1844e6744073709551616",
    "1e2147483648",
    "0e99999999999",
    "-1e-99999999999",
]


class Bytes:
    """A ByteSource over bytes in memory (what ``read_header`` reads)."""

    name = "m.safetensors"
    first_read = 1 << 16

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)

    def pread(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


def base_header(rng: random.Random) -> tuple[dict, int]:
    """A valid header (tensors tiling the data area in a shuffled order) and its data length."""
    n = rng.randint(0, 4) if rng.random() < 0.9 else rng.randint(5, 40)
    obj: dict = {}
    if rng.random() < 0.6:
        obj["__metadata__"] = {
            rng.choice(["format", "quant", "k", "é"]): rng.choice(["pt", "x", "1", '{"a": 1}']) for _ in range(rng.randint(0, 3))
        }
    pos = 0
    names = [rng.choice(["w.weight", "w.comfy_quant", "b", "a.b.c", "x", "é"]) + str(i) for i in range(n)]
    rng.shuffle(names)
    for name in names:
        dtype = rng.choice(sorted(DTYPES))
        shape = [rng.randint(0, 3) for _ in range(rng.randint(0, 2))]
        size = DTYPES[dtype]
        for d in shape:
            size *= d
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    if "__metadata__" in obj and rng.random() < 0.5:
        obj = dict(reversed(list(obj.items())))
    return obj, pos


def _strings(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each JSON string token in ``text`` (quotes included)."""
    out, i = [], 0
    while (i := text.find('"', i)) != -1:
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        out.append((i, j + 1))
        i = j + 1
    return out


def _escape(ch: str) -> str:
    if ord(ch) > 0xFFFF:
        v = ord(ch) - 0x10000
        return f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04X}"
    return f"\\u{ord(ch):04x}" if ord(ch) % 2 else f"\\u{ord(ch):04X}"


def _json_string(s: str, rng: random.Random) -> str:
    out = []
    for ch in s:
        if 0xD800 <= ord(ch) <= 0xDFFF or ch in '"\\' or ord(ch) < 0x20 or rng.random() < 0.3:
            out.append(_escape(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


STRUCTURAL = ["dup_name", "dup_meta", "dup_meta_key", "dup_field", "dup_variant", "extra", "list_entry"]
TEXTUAL = ["escape", "strange", "value", "number", "punct", "space", "bytes"]


def mutate(rng: random.Random, obj: dict, indent) -> tuple[str, bytes]:
    """One mutation of the header ``obj``: its kind and the header bytes.  ``mixed`` is a
    structural mutation followed by one or two textual ones (and bytes damaged, at times)."""
    kind = rng.choice(STRUCTURAL + TEXTUAL + ["mixed", "mixed"])
    if kind != "mixed":
        return kind, _mutate(rng, obj, indent, kind)
    data = _mutate(rng, obj, indent, rng.choice(STRUCTURAL))
    for step in [*rng.choices(TEXTUAL[:-1], k=rng.randint(1, 2)), *(["bytes"] if rng.random() < 0.3 else [])]:
        try:
            text = data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:  # a structural mutation that had nothing to work on damaged bytes
            break
        data = _mutate(rng, obj, indent, step, text)
    return kind, data


def _mutate(rng: random.Random, obj: dict, indent, kind: str, text: str | None = None) -> bytes:
    sep = (", ", ": ") if indent is None else (",", ": ")
    if kind == "extra" and text is None:
        pairs = list(obj.items())
        value = _Raw(
            [(rng.choice(["x", "dtype_", "__metadata__", "offsets"]), json.loads(rng.choice(VALUES[:28]))) for _ in range(2)]
        )
        if pairs and rng.random() < 0.7:
            i = rng.randrange(len(pairs))
            name, entry = pairs[i]
            if isinstance(entry, dict) and name != "__metadata__":
                items = list(entry.items())
                items.insert(rng.randrange(len(items) + 1), value[0])
                pairs[i] = (name, _Raw(items))
                return _dump_pairs(pairs, indent, sep, rng)
        pairs.insert(rng.randrange(len(pairs) + 1), (rng.choice(["n", "w.weight0", "__metadata__"]), value))
        return _dump_pairs(pairs, indent, sep, rng)
    if kind == "list_entry" and text is None and any(k != "__metadata__" for k in obj):
        name = rng.choice([k for k in obj if k != "__metadata__"])
        entry = [obj[name][f] for f in FIELDS]
        if rng.random() < 0.5:
            entry[rng.randrange(3)] = json.loads(rng.choice(VALUES))
        if rng.random() < 0.2:
            entry = entry[: rng.randint(0, 4)]
        pairs = [(k, entry if k == name else v) for k, v in obj.items()]
        return _dump_pairs(pairs, indent, sep, rng)
    if kind == "dup_name" and any(k != "__metadata__" for k in obj):
        name = rng.choice([k for k in obj if k != "__metadata__"])
        other = dict(obj[name])
        if rng.random() < 0.7:
            field = rng.choice(FIELDS)
            other[field] = json.loads(rng.choice(VALUES + ['"U8"', "[1]", "[0, 1]", '"F32"']))
        pairs = list(obj.items())
        at = rng.randrange(len(pairs) + 1)
        pairs.insert(at, (name, other))
        return _dump_pairs(pairs, indent, sep, rng)
    if kind == "dup_meta":
        pairs = list(obj.items())
        value = rng.choice([{}, None, {"k": "v"}, {"k": 1}, [1], "x"])
        pairs.insert(rng.randrange(len(pairs) + 1), ("__metadata__", value))
        if not any(k == "__metadata__" for k, _ in pairs[:-1]) and rng.random() < 0.5:
            pairs.insert(rng.randrange(len(pairs) + 1), ("__metadata__", {"a": "b"}))
        return _dump_pairs(pairs, indent, sep, rng)
    if kind == "dup_meta_key":
        pairs = list(obj.items())
        meta = list((obj.get("__metadata__") or {"k": "v"}).items()) or [("k", "v")]
        key = rng.choice(meta)[0]
        meta.insert(rng.randrange(len(meta) + 1), (key, json.loads(rng.choice(VALUES[:16] + ['"v"', '"w"']))))
        pairs = [(k, v) for k, v in pairs if k != "__metadata__"]
        pairs.insert(rng.randrange(len(pairs) + 1), ("__metadata__", _Raw(meta)))
        return _dump_pairs(pairs, indent, sep, rng)
    if kind in ("dup_field", "dup_variant") and any(k != "__metadata__" for k in obj):
        name = rng.choice([k for k in obj if k != "__metadata__"])
        entry = list(obj[name].items())
        if kind == "dup_field":
            field = rng.choice(FIELDS + ("x",))
            value = obj[name].get(field, 1) if rng.random() < 0.5 else json.loads(rng.choice(VALUES[:20]))
            entry.insert(rng.randrange(len(entry) + 1), (field, value))
        else:
            dtype = obj[name]["dtype"]
            variant = [(dtype, None), (rng.choice([dtype, "F32", "Q"]), rng.choice([None, 1]))]
            rng.shuffle(variant)
            entry = [(k, _Raw(variant) if k == "dtype" else v) for k, v in entry]
        pairs = [(k, _Raw(entry) if k == name else v) for k, v in obj.items()]
        return _dump_pairs(pairs, indent, sep, rng)
    if text is None:
        text = json.dumps(obj, indent=indent, ensure_ascii=rng.random() < 0.3)
    if kind == "escape":
        spans = _strings(text)
        for _ in range(rng.randint(1, 3)):
            if not spans:
                break
            s, e = rng.choice(spans)
            inner = _decoded(text[s:e])
            if inner:
                i = rng.randrange(len(inner))
                new = _json_string(inner[:i], rng)[:-1] + _escape(inner[i]) + _json_string(inner[i + 1 :], rng)[1:]
                text = text[:s] + new + text[e:]
                spans = _strings(text)
        return text.encode("utf-8", "surrogatepass")
    if kind == "strange":
        spans = _strings(text)
        if spans:
            s, e = rng.choice(spans)
            inner = _decoded(text[s:e]) or ""
            i = rng.randrange(len(inner) + 1)
            inner = inner[:i] + "".join(rng.choice(STRANGE) for _ in range(rng.randint(1, 3))) + inner[i:]
            text = text[:s] + _json_string(inner, rng) + text[e:]
        return text.encode("utf-8", "surrogatepass")
    if kind == "value":
        for _ in range(rng.randint(1, 2)):
            tokens = [m for m in _values(text)]
            if not tokens:
                break
            s, e = rng.choice(tokens)
            text = text[:s] + rng.choice(VALUES) + text[e:]
        return text.encode("utf-8", "surrogatepass")
    if kind == "number":
        numbers = [m.span() for m in _INTEGER.finditer(text)]
        for _ in range(rng.randint(1, 2)):
            if not numbers:
                break
            s, e = rng.choice(numbers)
            value = int(text[s:e])
            new = str(rng.choice([value + 1, value - 1, value * 2, 0, -value, 2**63, 2**64 - 1, 2**64, 10**20]))
            text = text[:s] + new + text[e:]
            numbers = [m.span() for m in _INTEGER.finditer(text)]
        return text.encode("utf-8", "surrogatepass")
    if kind == "punct":
        spans = _strings(text)
        for _ in range(rng.randint(1, 2)):
            if not spans:
                break
            _s, e = rng.choice(spans)
            cut = rng.choice([0, 0, 1, 2])
            text = text[:e] + rng.choice(["}", " }", "\n}", "]", ",", ":", " :", "", "{", "[", '"', "}}"]) + text[e + cut :]
            spans = _strings(text)
        return text.encode("utf-8", "surrogatepass")
    if kind == "space":
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.choice([b"\n", b" ", b"\r\n", b"\t", b"\n\n "])
        return bytes(data)
    data = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(data) + 1)
        op = rng.randrange(4)
        if op == 0:
            del data[i : i + rng.randint(1, 4)]
        elif op == 1:
            data[i:i] = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 3)))
        elif op == 2 and i < len(data):
            data[i] = rng.choice(ALPHABET)
        elif rng.random() < 0.3:
            del data[i:]
    return bytes(data)


def _decoded(token: str) -> str | None:
    """A JSON string token's text (None for one a mutation left unreadable)."""
    try:
        return json.loads(token, strict=False)
    except ValueError:
        return None


class _Raw(list):
    """Pairs to write as one JSON object, repeated keys included."""


def _dump_pairs(pairs, indent, sep, rng: random.Random) -> bytes:
    def dump(v) -> str:
        if isinstance(v, _Raw):
            return "{" + sep[0].join(json.dumps(k) + sep[1] + dump(x) for k, x in v) + "}"
        return json.dumps(v)

    text = "{" + sep[0].join(json.dumps(k, ensure_ascii=False) + sep[1] + dump(v) for k, v in pairs) + "}"
    if indent is not None:
        text = text.replace(", ", ",\n ")
    return text.encode("utf-8")


_INTEGER = re.compile(r"(?<![\w.\\])-?\d+(?![\w.])")
"""An integer outside a string, mostly (a mutation may hit one inside a name: more damage)."""


def _values(text: str) -> list[tuple[int, int]]:
    """Spans of scalar values and small arrays after a colon."""
    out = []
    i = 0
    while (i := text.find(":", i)) != -1:
        j = i + 1
        while j < len(text) and text[j] in " \n":
            j += 1
        k = j
        if k < len(text) and text[k] == "[":
            k = text.find("]", k) + 1
        elif k < len(text) and text[k] == '"':
            k = next((e for s, e in _strings(text[k:]) if s == 0), 1) + k
        else:
            while k < len(text) and text[k] not in ",}\n]":
                k += 1
        if k > j:
            out.append((j, k))
        i += 1
    return out


def ours(data: bytes) -> str | None:
    """comfyquant's container verdict: the SafetensorError message, or None when it opens."""
    source = Bytes(data)
    hdr = read_header(source, damaged_ok=True)
    return open_error(hdr, lambda: source.pread(8, hdr.header_len))


def theirs(data: bytes) -> str | None:
    """What the installed safetensors raises reading the same bytes, as ``safe_open`` words it."""
    from safetensors import deserialize

    try:
        deserialize(data)
    except Exception as exc:  # safetensors' own SafetensorError
        return str(exc).replace("Error while deserializing:", "Error while deserializing header:", 1)
    return None


_VALIDATION = "Error while deserializing header: "
_SYNTAX = _VALIDATION + "invalid JSON in header: "


def _either(mine: str | None, real: str | None, data: bytes, tries: int = 64) -> bool:
    """Whether ``mine`` is another outcome safetensors may give: validating tensors that share
    offsets, it meets them in its hash map's order, which changes from one map to the next
    (``targets.container.validate``), so it may name either or fail on either's span; asking
    it again shows the others.  JSON errors do not depend on that order."""
    if not (mine and real) or mine.startswith(_SYNTAX) or real.startswith(_SYNTAX):
        return False
    return any(theirs(data) == mine for _ in range(tries))


def checked(data: bytes, folder: str) -> str | None:
    """The verdict of the whole ``check`` on the bytes written as a file: the SafetensorError
    message SGLang fails with, or None."""
    import os

    from comfyquant import check

    path = os.path.join(folder, "m.safetensors")
    with open(path, "wb") as fh:
        fh.write(data)
    first = check(path, target="sglang").verdicts["sglang"].first
    return first.message if first is not None and first.exception == "SafetensorError" else None


def run(count: int, seed: int, show: int = 10, out=sys.stdout, check_every: int = 50) -> list[str]:
    """``count`` executions from ``seed``; every ``check_every``-th also runs the whole ``check``
    on the bytes written as a file.  Returns the disagreements."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="fuzz-headers-")
    rng = random.Random(seed)
    kinds: Counter = Counter()
    outcomes: Counter = Counter()
    findings: list[str] = []
    start = time.perf_counter()
    for i in range(count):
        obj, data_len = base_header(rng)
        kind, header = mutate(rng, obj, rng.choice([None, None, 1]))
        kinds[kind] += 1
        data = struct.pack("<Q", len(header)) + header + bytes(max(0, data_len + rng.choice([0, 0, 0, 0, 1, -1])))
        try:
            mine = ours(data)
        except Exception as exc:  # a crash is a finding too
            mine = f"CRASH {type(exc).__name__}: {exc}"
        real = theirs(data)
        outcomes["refused" if real else "accepted"] += 1
        if check_every and i % check_every == 0:
            outcomes["also checked whole"] += 1
            try:
                whole = checked(data, folder)
            except Exception as exc:  # a crash is a finding too
                whole = f"CRASH {type(exc).__name__}: {exc}"
            if whole != mine:
                findings.append(f"#{i} {kind} (check): {header!r}\n  reader: {mine}\n  check:  {whole}")
        if mine != real and _either(mine, real, data):
            outcomes["refused, one of the outcomes its hash order allows"] += 1
        elif mine != real:
            findings.append(f"#{i} {kind}: {header!r}\n  safetensors: {real}\n  comfyquant:  {mine}")
            if len(findings) <= show:
                print(findings[-1], file=out, flush=True)
    took = time.perf_counter() - start
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    print(f"{count} executions in {took:.1f} s (seed {seed}): {len(findings)} findings", file=out)
    print("mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())), file=out)
    print("safetensors: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())), file=out)
    return findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10)
    parser.add_argument("--check-every", type=int, default=50, help="run the whole check on every Nth header (0: never)")
    args = parser.parse_args()
    return 1 if run(args.count, args.seed, args.show, check_every=args.check_every) else 0


if __name__ == "__main__":
    sys.exit(main())
