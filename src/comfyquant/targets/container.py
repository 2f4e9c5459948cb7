"""What the safetensors library (0.8.x) raises when a runtime opens a damaged file.

All three runtimes read checkpoints through safetensors: SGLang's inspector opens every shard
with ``safe_open`` (in the given order, before it looks at any marker of that shard), ComfyUI's
``load_torch_file`` opens the file with ``safe_open`` and re-raises its error unchanged (its
``HeaderTooLarge``/``MetadataIncompleteBuffer`` rewording tests for names that safetensors
0.8 no longer puts in its messages), and comfy-kitchen is handed its tensors by ComfyUI, so a
file ComfyUI cannot open never reaches it.  ``safe_open`` and ``load_file`` validate the same
way (``SafeTensors::read_metadata``), so each runtime fails with the same exception and
message: ``SafetensorError: Error while deserializing header: ...``.

This module reproduces that validation from data comfyquant already has (no safetensors or
torch import: ``check`` stays light), in the library's own order:

1. the header length: more than 100,000,000 bytes is ``header too large``;
2. serde's deserialization of the header (``HashMetadata``): ``__metadata__`` is read in the
   stream, so a non-string value fails at its own position; tensor entries are a flattened
   map, buffered and deserialized only after the whole object is read, so their errors (unknown
   dtype, missing or mistyped field, wrong number of offsets ...) carry the position just past
   the header's closing brace, and the first bad entry in document order is reported;
3. ``Metadata::validate``: tensors sorted by (begin, end) must tile the data area from 0
   (``invalid offset for tensor `x```), with no arithmetic overflow, whole bytes for sub-byte
   dtypes, and a span of exactly dtype x shape bytes;
4. the tiling must end at the end of the file (``incomplete metadata, file not fully covered``).

The raw header is re-read only for a file whose header has a container finding, so clean
files cost nothing; what Python's JSON reading hides from the reader (a repeated key, ``NaN``
in an ignored field ...) is such a finding (C016, ``io.hidden``).  Not modelled (documented):
which of several tensors with identical offsets safetensors names (it picks one by hash
order, which changes from one run to the next).
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..dtypes import DTYPE_BITS
from ..io.hidden import hex_escapes
from .serde_numbers import U64 as _U64
from .serde_numbers import out_of_range_stop, rust_float, serde_number
from .serde_syntax import rust_debug

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

EXCEPTION = "SafetensorError"
PREFIX = "Error while deserializing header: "
MAX_HEADER = 100_000_000
"""safetensors' limit (decimal; comfyquant's own reader allows 100 MiB)."""

SERDE_DTYPES = (
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
"""safetensors' Dtype variants, in the order its unknown-variant message lists them."""
_VARIANTS = ", ".join(f"`{d}`" for d in SERDE_DTYPES)

TOO_LARGE = "header too large"
INCOMPLETE = "incomplete metadata, file not fully covered"
INVALID_INFO = "invalid shape, data type, or offset for tensor"
OVERFLOW = "overflow computing buffer size from shape and/or element type"
MISALIGNED = "The slice is slicing for subbytes dtypes, and the slice does not end up at a byte boundary, this is invalid."


_ERRORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""container_errors' results by checkpoint, for as long as the checkpoint lives."""


def container_errors(ckpt: Checkpoint) -> dict[str, str]:
    """The safetensors error message of every file it refuses, by file (computed once per
    checkpoint: every runtime profile asks)."""
    cached = _ERRORS.get(ckpt)
    if cached is None:
        cached = {}
        for hdr in ckpt.headers:
            message = open_error(hdr, lambda h=hdr: ckpt.source(h.file).pread(8, h.header_len))
            if message is not None:
                cached[hdr.file] = message
        _ERRORS[ckpt] = cached
    return cached


def open_error(hdr, read_raw) -> str | None:
    """The message safetensors raises opening the file of ``hdr`` (a parsed header), or None.

    ``read_raw()`` returns the header's JSON bytes; it is called only when serde decides."""
    if hdr.unreadable:
        return PREFIX + unreadable_error(hdr)
    if hdr.header_len > MAX_HEADER:
        return PREFIX + TOO_LARGE
    if not hdr.findings:
        return None  # the reader found the tiling exact and every entry well-formed
    # serde's own reading of the entries decides (Python's json and comfyquant's reader accept
    # things serde does not: a dict as a shape, integers beyond u64, nesting beyond 128 ...).
    from .serde_syntax import stream_error

    raw = read_raw()
    streamed = stream_error(raw, serde_header)
    outcome = streamed if streamed is not None else serde_header(raw)
    if isinstance(outcome, str):
        return PREFIX + "invalid JSON in header: " + outcome
    message = validate(outcome, hdr.size - hdr.data_start)
    return None if message is None else PREFIX + message


def unreadable_error(hdr) -> str:
    """What safetensors says of a header comfyquant could not read at all (``hdr.unreadable``),
    in its own order: the length field, the length against the file, UTF-8, then serde_json."""
    from .serde_syntax import stream_error, utf8_error

    if hdr.size < 8:
        return "header too small"
    if hdr.header_len > MAX_HEADER:
        return TOO_LARGE
    raw = hdr.raw
    if raw is None:
        return "invalid header length"
    if (text := utf8_error(raw)) is not None:
        return "invalid UTF-8 in header: " + text
    if (text := stream_error(raw, serde_header)) is not None:
        return "invalid JSON in header: " + text
    outcome = serde_header(raw)  # serde reads what Python's json did not (nesting deeper than Python's limit)
    if isinstance(outcome, str):
        return "invalid JSON in header: " + outcome
    return validate(outcome, hdr.size - hdr.data_start) or INCOMPLETE


def validate(tensors: list[tuple[str, str, tuple, int, int]], data_len: int) -> str | None:
    """``Metadata::validate`` and the coverage test over (name, dtype, shape, begin, end).

    safetensors sorts the tensors by offsets starting from a hash map's order, which changes
    from one process to the next: of two tensors at the same offsets, either may be the one it
    names.  The stable sort here names the later one in header order."""
    start = 0
    for name, dtype, shape, begin, end in sorted(tensors, key=lambda t: (t[3], t[4])):
        if begin != start or end < begin:
            return f"invalid offset for tensor `{name}`"
        start = end
        n = 1
        for d in shape:
            n *= d
            if n > _U64:
                return OVERFLOW
        nbits = n * DTYPE_BITS[dtype]
        if nbits > _U64:
            return OVERFLOW
        if nbits % 8:
            return MISALIGNED
        if end - begin != nbits // 8:
            return INVALID_INFO
    return None if start == data_len else INCOMPLETE


# -- serde_json's view of the header ----------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""The json module's string scanner: (the decoded string, the offset past its closing quote)
from the offset past its opening quote.  (typeshed does not declare it; it is public in CPython.)"""
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class _Constant(Exception):
    """A NaN/Infinity literal: Python's json accepts it, serde_json does not."""


def _no_constants(name: str):
    raise _Constant(name)


class _Pairs(dict):
    """A JSON object that also keeps its duplicate keys (``pairs``, in order): Python's json
    keeps the last value of a repeated key, serde sees every one."""

    pairs: list


def _keep_pairs(pairs: list) -> _Pairs:
    d = _Pairs(pairs)
    d.pairs = pairs
    return d


class _OutOfRange(Exception):
    """A number serde_json reads as an infinite f64 (``1e400``, a 400-digit integer): it
    refuses it ("number out of range") where Python's json gives ``inf``."""


def _finite_number(token: str) -> int | float:
    value = serde_number(token)
    if isinstance(value, float) and math.isinf(value):
        raise _OutOfRange(token)
    return value


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?', re.S)


def _out_of_range_end(text: str, pos: int) -> int:
    """Where serde stops on the first out-of-range number after ``pos``: the end of its token
    (strings are skipped whole, so a number inside one is not taken)."""
    for m in _TOKEN.finditer(text, pos):
        if not m.group().startswith('"') and math.isinf(float(serde_number(m.group()))):
            return m.start() + out_of_range_stop(m.group())
    return pos


_STRICT = json.JSONDecoder(
    parse_constant=_no_constants, object_pairs_hook=_keep_pairs, parse_float=_finite_number, parse_int=_finite_number
)


class _Fail(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.message = message
        self.pos = pos


def serde_header(raw: bytes) -> str | list[tuple[str, str, tuple, int, int]]:
    """serde_json's deserialization of a header into safetensors' ``HashMetadata``: the error
    text (with serde's line and column) or the tensors (name, dtype, shape, begin, end).

    ``raw`` is a header Python's json accepted as an object (comfyquant's reader refuses the
    rest before any verdict)."""
    text = raw.decode("utf-8")
    surrogate = _surrogate_error(text)
    try:
        entries, end = _top_level(text)
        for _name, value in entries:  # buffered: checked once the whole object is read
            error = _tensor_info_error(value)
            if error is not None:
                raise _Fail(error, end)
        if surrogate is not None:
            raise surrogate
    except _Fail as fail:
        if surrogate is not None and surrogate.pos < fail.pos:
            fail = surrogate  # serde reads in text order: the earlier error is the one it raises
        line, column = _line_column(text, fail.pos)
        return f"{fail.message} at line {line} column {column}"
    out: dict[str, tuple] = {}
    for name, value in entries:
        out[name] = _tensor_info(name, value)
    return list(out.values())


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _surrogate_error(text: str) -> _Fail | None:
    """serde_json's error for the first ``\\uXXXX`` escape that is not a whole UTF-16
    surrogate pair (Python's json decodes a lone surrogate into a string that is not text):
    a trailing surrogate alone, or a leading one not followed by ``\\u`` and a trailing one.
    The positions are where serde stops reading (checked against safetensors in the tests)."""
    paired = 0  # the end of the last trailing half read with its leading one
    for digits, pos in hex_escapes(_ESCAPE, text):
        code = int(digits, 16)
        if pos <= paired:
            continue
        if 0xDC00 <= code <= 0xDFFF:
            return _Fail("lone leading surrogate in hex escape", pos)
        if not 0xD800 <= code <= 0xDBFF:
            continue
        if text[pos : pos + 1] != "\\":
            return _Fail("unexpected end of hex escape", pos + 1)
        if text[pos + 1 : pos + 2] != "u":
            return _Fail("unexpected end of hex escape", pos + 2)
        low = text[pos + 2 : pos + 6]
        if len(low) < 4 or not all(c in "0123456789abcdefABCDEF" for c in low) or not 0xDC00 <= int(low, 16) <= 0xDFFF:
            return _Fail("lone leading surrogate in hex escape", pos + 6)
        paired = pos + 6
    return None


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """serde_json's position of a character offset: 1-based line, column counted in bytes."""
    before = text[:pos].encode("utf-8")
    nl = before.rfind(b"\n")
    return before.count(b"\n") + 1, len(before) - (nl + 1)


def _ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)  # a pattern of "*" matches everywhere
    return m.end() if m is not None else pos


def _top_level(text: str) -> tuple[list[tuple[str, object]], int]:
    """Stream the top-level object: ``__metadata__`` is checked in place, tensor entries are
    decoded (serde buffers them); returns the entries and the offset past the closing brace."""
    pos = _ws(text, 0) + 1  # past "{"
    entries: list[tuple[str, object]] = []
    seen_meta = False
    pos = _ws(text, pos)
    if text[pos] == "}":
        return entries, pos + 1
    while True:
        key, pos = _scanstring(text, pos + 1)
        key_end = pos
        pos = _ws(text, _ws(text, pos) + 1)  # past ":"
        if key == "__metadata__":
            if seen_meta:
                at = _ws(text, key_end)  # serde_json places it past what ends the object
                raise _Fail("duplicate field `__metadata__`", at + (text[at : at + 1] == "}"))
            seen_meta = True
            pos = _metadata(text, pos)
        else:
            try:
                value, pos = _STRICT.raw_decode(text, pos)
            except _Constant:
                raise _Fail("expected value", _constant_position(text, pos)) from None
            except _OutOfRange:
                raise _Fail("number out of range", _out_of_range_end(text, pos)) from None
            entries.append((key, value))
        pos = _ws(text, pos)
        if text[pos] == "}":
            return entries, pos + 1
        pos = _ws(text, pos + 1)  # past ","


def _metadata(text: str, pos: int) -> int:
    """``Option<HashMap<String, String>>`` read in the stream: returns the offset past it."""
    if text.startswith("null", pos):
        return pos + 4
    pos = _ws(text, pos + 1)  # past "{" (the reader refused any other type)
    if text[pos] == "}":
        return pos + 1
    while True:
        _key, pos = _scanstring(text, pos + 1)
        pos = _ws(text, _ws(text, pos) + 1)
        c = text[pos]
        if c == '"':
            _value, pos = _scanstring(text, pos + 1)
        elif c == "[":
            raise _Fail("invalid type: sequence, expected a string", pos)
        elif c == "{":
            raise _Fail("invalid type: map, expected a string", pos)
        else:
            for literal, what in (("true", "boolean `true`"), ("false", "boolean `false`"), ("null", "null")):
                if text.startswith(literal, pos):
                    raise _Fail(f"invalid type: {what}, expected a string", pos + len(literal))
            m = _NUMBER.match(text, pos)
            if m is None or m.end() == pos:
                raise _Fail("expected value", _constant_position(text, pos))
            if math.isinf(serde_number(m.group())):
                raise _Fail("number out of range", m.start() + out_of_range_stop(m.group()))
            raise _Fail(f"invalid type: {_unexpected(serde_number(m.group()))}, expected a string", m.end())
        pos = _ws(text, pos)
        if text[pos] == "}":
            return pos + 1
        pos = _ws(text, pos + 1)


def _constant_position(text: str, pos: int) -> int:
    """Where serde_json stops at the first NaN/Infinity literal of the value at ``pos``:
    one past its first character (``-Infinity``: past the minus sign, an invalid number)."""
    i, n = pos, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            _s, i = _scanstring(text, i + 1)
            continue
        if c in "NI":
            return i + 1
        if c == "-" and text.startswith("Infinity", i + 1):
            return i + 2
        i += 1
    return pos + 1


# -- serde's Content -> TensorInfo ---------------------------------------------------------


def _content_kind(v) -> str:
    """Which serde Content a Python JSON value is (serde_json: non-negative ints are u64,
    negative ones i64, integers beyond both and all non-integers f64)."""
    if v is None:
        return "unit"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        if 0 <= v <= _U64:
            return "u64"
        return "i64" if -(1 << 63) <= v < 0 else "f64"
    if isinstance(v, float):
        return "f64"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "seq"
    return "map"


def _unexpected(v) -> str:
    kind = _content_kind(v)
    if kind in ("u64", "i64"):
        return f"integer `{v}`"
    if kind == "f64":
        return f"floating point `{rust_float(float(v))}`"
    if kind == "bool":
        return f"boolean `{'true' if v else 'false'}`"
    if kind == "str":
        return "string " + rust_debug(v)
    return {"unit": "null", "seq": "sequence", "map": "map"}[kind]


def _usize_error(v) -> str | None:
    kind = _content_kind(v)
    if kind == "u64":
        return None
    if kind == "i64":
        return f"invalid value: integer `{v}`, expected usize"
    return f"invalid type: {_unexpected(v)}, expected usize"


def _dtype_error(v) -> str | None:
    kind = _content_kind(v)
    if kind == "str":
        return None if v in SERDE_DTYPES else f"unknown variant `{v}`, expected one of {_VARIANTS}"
    if kind == "map":
        if len(v.pairs if isinstance(v, _Pairs) else v) != 1:  # a repeated variant counts twice
            return "invalid value: map, expected map with a single key"
        ((name, inner),) = v.items()
        if name not in SERDE_DTYPES:
            return f"unknown variant `{name}`, expected one of {_VARIANTS}"
        return None if inner is None else f"invalid type: {_unexpected(inner)}, expected unit"
    return f"invalid type: {_unexpected(v)}, expected string or map"


def _shape_error(v) -> str | None:
    if not isinstance(v, list):
        return f"invalid type: {_unexpected(v)}, expected a sequence"
    for d in v:
        error = _usize_error(d)
        if error is not None:
            return error
    return None


def _sequence_error(v: list, checks: tuple, expecting: str) -> str | None:
    """serde's first complaint reading the JSON array ``v`` as a fixed-size tuple or struct:
    the elements in order (``checks``, one per position), then a short or long array."""
    for check, value in zip(checks, v):
        error = check(value)
        if error is not None:
            return error
    if len(v) < len(checks):
        return f"invalid length {len(v)}, expected {expecting}"
    if len(v) > len(checks):
        return f"invalid length {len(v)}, expected {len(checks)} elements in sequence"
    return None


def _offsets_error(v) -> str | None:
    if not isinstance(v, list):
        return f"invalid type: {_unexpected(v)}, expected a tuple of size 2"
    return _sequence_error(v, (_usize_error, _usize_error), "a tuple of size 2")


_FIELDS = (("dtype", _dtype_error), ("shape", _shape_error), ("data_offsets", _offsets_error))


def _tensor_info_error(v) -> str | None:
    """serde's first complaint deserializing one tensor entry into ``TensorInfo``."""
    if isinstance(v, dict):
        seen: set[str] = set()
        checks = dict(_FIELDS)
        for key, value in v.pairs if isinstance(v, _Pairs) else v.items():
            check = checks.get(key)
            if check is None:
                continue
            if key in seen:
                return f"duplicate field `{key}`"
            seen.add(key)
            error = check(value)
            if error is not None:
                return error
        for key, _check in _FIELDS:
            if key not in seen:
                return f"missing field `{key}`"
        return None
    if isinstance(v, list):
        return _sequence_error(v, tuple(check for _key, check in _FIELDS), "struct TensorInfo with 3 elements")
    return f"invalid type: {_unexpected(v)}, expected struct TensorInfo"


def _tensor_info(name: str, v) -> tuple[str, str, tuple, int, int]:
    if isinstance(v, dict):
        dtype, shape, offsets = v["dtype"], v["shape"], v["data_offsets"]
    else:
        dtype, shape, offsets = v[0], v[1], v[2]
    if isinstance(dtype, dict):
        dtype = next(iter(dtype))
    return name, dtype, tuple(shape), offsets[0], offsets[1]
