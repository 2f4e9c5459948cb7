"""What the safetensors library refuses in a header that Python's JSON reading hides.

comfyquant reads a header with Python's ``json``; every runtime reads it with safetensors,
which deserializes it with serde_json into its ``HashMetadata`` struct.  The two agree on every
value both keep, but Python's reading loses some text safetensors refuses:

* a repeated key: Python keeps the last value, serde sees each one.  safetensors refuses a
  second ``__metadata__``, a second ``dtype``, ``shape`` or ``data_offsets`` in a tensor's
  entry, and a dtype written as a map whose one variant comes twice; it reads every value of a
  repeated tensor name or ``__metadata__`` key (the last one wins), so it refuses one whose
  earlier value is not a tensor entry, or not a string;
* in a field safetensors ignores (an entry's unknown keys) or a value Python dropped: the
  literals ``NaN``/``Infinity``, a number too large for an f64, ``-0`` read as a float where an
  integer is due, a lone UTF-16 surrogate escape, nesting 128 levels deep.

``hidden_refusal`` names the first such thing in a header text (None when there is none); the
header reader turns it into a C016 finding, and the container verdict
(``targets.container``) gives safetensors' own message for it.  It runs only on a header
that is not plainly read (``read_header``'s count of keys and colons), so a clean file costs
one ``bytes.count``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import accumulate

from ..dtypes import DTYPE_BITS

U64 = (1 << 64) - 1
FIELDS = ("dtype", "shape", "data_offsets")
RECURSION_LIMIT = 128
"""serde_json's nesting limit: the 128th open bracket is refused."""


class _Object:
    """A JSON object as its key/value pairs in order, repeated keys included."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list) -> None:
        self.pairs = pairs


class _Reading:
    """Python's JSON decoder set to keep what it would otherwise lose: every pair of an object,
    and a note of the first literal or number serde_json refuses."""

    def __init__(self) -> None:
        self.refused: str | None = None
        self.decoder = json.JSONDecoder(
            object_pairs_hook=_Object, parse_constant=self._constant, parse_float=self._float, parse_int=self._int
        )

    def _note(self, what: str) -> None:
        if self.refused is None:
            self.refused = what

    def _constant(self, name: str) -> float:
        self._note(f"the literal {name}, which is not JSON")
        return math.nan

    def _float(self, token: str) -> float:
        value = float(token)
        if math.isinf(value):
            self._note(f"the number {token[:24]}{'...' if len(token) > 24 else ''}, too large for an f64")
        return value

    def _int(self, token: str) -> int | float:
        if token == "-0":
            return -0.0  # serde_json reads -0 as a float
        value = int(token)
        if not -(1 << 63) <= value <= U64 and math.isinf(float(token)):
            self._note(f"the number {token[:24]}..., too large for an f64")
        return value


def hidden_refusal(text: str, raw: bytes) -> tuple[str, bool] | None:
    """The first thing safetensors refuses in the header ``text`` (``raw`` its bytes) that
    Python's reading hides: (what, whether it is a repeated key), or None."""
    reading = _Reading()
    top = reading.decoder.decode(text)
    repeated = _repeated_key(top) if isinstance(top, _Object) else None
    if repeated is not None:
        return repeated, True
    if reading.refused is not None:
        return f"holds {reading.refused}", False
    if b"\\u" in raw and (what := _lone_surrogate(text)) is not None:
        return what, False
    if raw.count(b"[") + raw.count(b"{") >= RECURSION_LIMIT and _depth(raw) >= RECURSION_LIMIT:
        return f"nests values {RECURSION_LIMIT} or more levels deep (serde_json's limit)", False
    return None


def _repeated_key(top: _Object) -> str | None:
    seen: dict[str, object] = {}
    for key, value in top.pairs:
        if key == "__metadata__":
            if key in seen:
                return "repeats the key '__metadata__'"
            seen[key] = value
            if isinstance(value, _Object):
                earlier: dict[str, object] = {}
                for k, v in value.pairs:
                    if k in earlier and not isinstance(earlier[k], str):
                        return f"repeats the __metadata__ key {k!r}, first with a value that is not a string"
                    earlier[k] = v
            continue
        if key in seen and not _tensor_info(seen[key]):
            return f"repeats the tensor name {key!r}, first with an entry that is not a valid tensor entry"
        seen[key] = value
        what = _repeated_field(value)
        if what is not None:
            return f"repeats {what} in the entry of tensor {key!r}"
    return None


def _repeated_field(entry: object) -> str | None:
    if isinstance(entry, _Object):
        fields: set[str] = set()
        for k, v in entry.pairs:
            if k in FIELDS:
                if k in fields:
                    return f"the field {k!r}"
                fields.add(k)
                if k == "dtype" and _repeated_variant(v):
                    return "the dtype's variant"
    elif isinstance(entry, list) and entry and _repeated_variant(entry[0]):
        return "the dtype's variant"
    return None


def _repeated_variant(dtype: object) -> bool:
    return isinstance(dtype, _Object) and len({k for k, _ in dtype.pairs}) < len(dtype.pairs)


def _tensor_info(v: object) -> bool:
    """Whether serde reads ``v`` as safetensors' ``TensorInfo`` (a map of the three fields, each
    once, or a sequence of the three)."""
    if isinstance(v, _Object):
        fields = {}
        for k, x in v.pairs:
            if k in FIELDS:
                if k in fields:
                    return False
                fields[k] = x
        if len(fields) != 3:
            return False
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
    elif isinstance(v, list) and len(v) == 3:
        dtype, shape, offsets = v
    else:
        return False
    return _dtype(dtype) and _dims(shape) and _dims(offsets) and len(offsets) == 2


def _dtype(v: object) -> bool:
    if isinstance(v, str):
        return v in DTYPE_BITS
    return isinstance(v, _Object) and len(v.pairs) == 1 and v.pairs[0][0] in DTYPE_BITS and v.pairs[0][1] is None


def _dims(v: object) -> bool:
    return isinstance(v, list) and all(type(d) is int and 0 <= d <= U64 for d in v)


_ESCAPE = re.compile(r"\\(?:u([dD][0-9a-fA-F]{3})|.)", re.S)


def hex_escapes(pattern: re.Pattern[str], text: str) -> Iterator[tuple[str, int]]:
    """The hex digits of each ``\\uXXXX`` escape in JSON text that ``pattern``'s group 1
    captures, with the position just past the escape.  ``pattern`` matches every other escape
    too (``\\\\.``), so an escaped backslash is never read as the start of one."""
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        pos = m.end()
        if m.group(1) is not None:
            yield m.group(1), pos


def _lone_surrogate(text: str) -> str | None:
    """A ``\\uXXXX`` escape anywhere in the text that is not half of a surrogate pair."""
    paired = 0  # the end of the last trailing half read with its leading one
    for digits, pos in hex_escapes(_ESCAPE, text):
        code = int(digits, 16)
        if pos <= paired or code < 0xD800:
            continue
        if code <= 0xDBFF and re.match(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", text[pos : pos + 6]):
            paired = pos + 6
            continue
        return f"holds the lone UTF-16 surrogate escape \\u{digits}, which is not Unicode text"
    return None


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = dict.fromkeys(b"[{", 1) | dict.fromkeys(b"]}", -1)


def _depth(raw: bytes) -> int:
    """How deeply the header's arrays and objects nest (strings skipped)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
