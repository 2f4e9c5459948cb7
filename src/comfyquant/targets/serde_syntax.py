"""serde_json's own error for header text that is not a JSON object, as safetensors reports it.

safetensors (0.8.x) deserializes a header with serde_json into its ``HashMetadata`` struct. When
the text is not JSON, serde_json stops at the first byte its parser cannot take and names it
with one of its fixed messages and a position (``expected value at line 1 column 7``); when the
text is JSON but not an object, the struct's visitor refuses the value's type. This module walks
the text the way serde_json's parser does (serde_json 1.x ``de.rs``: the same branches, the
same recursion limit of 128, positions counted in bytes, ``column`` the bytes since the last
newline) and returns that message, so ``check`` can give it for a damaged file without importing
safetensors. Text serde_json parses without error gives None: the rest of the header's
validation is ``comfyquant.targets.container``'s.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Callable

from .rust_escapes import ESCAPED_FROM
from .serde_numbers import out_of_range_stop, rust_float, serde_number

RECURSION_LIMIT = 128
_WS = b" \t\n\r"
_HEX = b"0123456789abcdefABCDEF"
STRUCT = "struct HashMetadata"


class SerdeError(Exception):
    """A serde_json error: its message and the byte index its position is computed at."""

    def __init__(self, code: str, index: int) -> None:
        super().__init__(code)
        self.code = code
        self.index = index


def position(data: bytes, index: int) -> str:
    """serde_json's ``line L column C`` of a byte index."""
    start = data.rfind(b"\n", 0, index) + 1
    line = data.count(b"\n", 0, start) + 1
    return f"line {line} column {index - start}"


class _Parser:
    """serde_json's ``Deserializer`` over a byte slice, reduced to what decides its errors."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.index = 0
        self.depth = RECURSION_LIMIT

    # -- serde_json's reading primitives ----------------------------------------------------

    def peek(self) -> int | None:
        return self.data[self.index] if self.index < len(self.data) else None

    def next_char(self) -> int | None:
        c = self.peek()
        if c is not None:
            self.index += 1
        return c

    def whitespace(self) -> int | None:
        while (c := self.peek()) is not None and c in _WS:
            self.index += 1
        return c

    def error(self, code: str) -> SerdeError:
        """An error at the current index (after the byte that failed was consumed)."""
        return SerdeError(code, self.index)

    def peek_error(self, code: str) -> SerdeError:
        """An error at the byte peeked at (one past the current index, at most the end)."""
        return SerdeError(code, min(self.index + 1, len(self.data)))

    # -- values -----------------------------------------------------------------------------

    def value(self) -> object:
        c = self.whitespace()
        if c is None:
            raise self.peek_error("EOF while parsing a value")
        if c == ord("n"):
            self.index += 1
            self.ident(b"ull")
            return None
        if c == ord("t"):
            self.index += 1
            self.ident(b"rue")
            return True
        if c == ord("f"):
            self.index += 1
            self.ident(b"alse")
            return False
        if c == ord("-"):
            self.index += 1
            return self.number(negative=True)
        if ord("0") <= c <= ord("9"):
            return self.number(negative=False)
        if c == ord('"'):
            self.index += 1
            return self.string()
        if c == ord("["):
            return self.nested(self.sequence)
        if c == ord("{"):
            return self.nested(self.mapping)
        raise self.peek_error("expected value")

    def nested(self, parse) -> object:
        self.depth -= 1
        if self.depth == 0:
            raise self.peek_error("recursion limit exceeded")
        self.index += 1
        try:
            return parse()
        finally:
            self.depth += 1

    def ident(self, rest: bytes) -> None:
        for expected in rest:
            c = self.next_char()
            if c is None:
                raise self.error("EOF while parsing a value")
            if c != expected:
                raise self.error("expected ident")

    def digits(self) -> int:
        start = self.index
        while (c := self.peek()) is not None and ord("0") <= c <= ord("9"):
            self.index += 1
        return self.index - start

    def number(self, negative: bool) -> int | float:
        start = self.index - (1 if negative else 0)
        c = self.next_char()
        if c is None:
            raise self.error("EOF while parsing a value")
        if c == ord("0"):
            nxt = self.peek()
            if nxt is not None and ord("0") <= nxt <= ord("9"):
                raise self.peek_error("invalid number")
        elif ord("1") <= c <= ord("9"):
            self.digits()
        else:
            raise self.error("invalid number")
        if self.peek() == ord("."):
            self.index += 1
            if not self.digits():
                c = self.next_char()
                raise self.error("EOF while parsing a value" if c is None else "invalid number")
        if self.peek() in (ord("e"), ord("E")):
            self.index += 1
            if self.peek() in (ord("+"), ord("-")):
                self.index += 1
            if not self.digits():
                c = self.next_char()
                raise self.error("EOF while parsing a value" if c is None else "invalid number")

        token = self.data[start : self.index].decode("ascii")
        value = serde_number(token)
        if isinstance(value, float) and math.isinf(value):
            self.index = start + out_of_range_stop(token)
            raise self.error("number out of range")
        return value

    def string(self) -> str:
        data = self.data
        start = self.index
        while True:
            c = self.next_char()
            if c is None:
                raise self.error("EOF while parsing a string")
            if c == ord('"'):
                # the characters the string stands for, escapes decoded (checked above: no
                # lone surrogate, no control character)
                return json.loads(data[start - 1 : self.index])
            if c == ord("\\"):
                self.escape()
            elif c < 0x20:
                raise self.error("control character (\\u0000-\\u001F) found while parsing a string")

    def escape(self) -> None:
        c = self.next_char()
        if c is None:
            raise self.error("EOF while parsing a string")
        if c in b'"\\/bfnrt':
            return
        if c != ord("u"):
            raise self.error("invalid escape")
        unit = self.hex_escape()
        if 0xDC00 <= unit <= 0xDFFF:
            raise self.error("lone leading surrogate in hex escape")
        if 0xD800 <= unit <= 0xDBFF:
            # a leading surrogate must be followed by an escaped trailing one
            for expected in b"\\u":
                c = self.peek()
                if c is None:
                    raise self.error("EOF while parsing a string")
                self.index += 1
                if c != expected:
                    raise self.error("unexpected end of hex escape")
            trail = self.hex_escape()
            if not 0xDC00 <= trail <= 0xDFFF:
                raise self.error("lone leading surrogate in hex escape")

    def hex_escape(self) -> int:
        if self.index + 4 > len(self.data):
            self.index = len(self.data)
            raise self.error("EOF while parsing a string")
        digits = self.data[self.index : self.index + 4]
        self.index += 4
        if any(d not in _HEX for d in digits):
            raise self.error("invalid escape")
        return int(digits, 16)

    def _item(self, close: str, what: str, first: bool) -> int | None:
        """The first byte of a list's or an object's next item, or None at its closing bracket
        (read): serde's errors for what stands before an item, in serde's order."""
        c = self.whitespace()
        if c == ord(close):
            self.index += 1
            return None
        if c == ord(",") and not first:
            self.index += 1
            c = self.whitespace()
        elif c is None:
            raise self.peek_error(f"EOF while parsing {what}")
        elif not first:
            raise self.peek_error(f"expected `,` or `{close}`")
        if c == ord(close):
            raise self.peek_error("trailing comma")
        if c is None:
            raise self.peek_error("EOF while parsing a value")
        return c

    def sequence(self) -> list:
        out: list = []
        while self._item("]", "a list", not out) is not None:
            out.append(self.value())
        return out

    def mapping(self) -> dict:
        out: dict = {}
        first = True
        while True:
            c = self._item("}", "an object", first)
            if c is None:
                return out
            first = False
            if c != ord('"'):
                raise self.peek_error("key must be a string")
            self.index += 1
            key = self.string()
            top = key == "__metadata__" and self.depth == RECURSION_LIMIT - 1
            c = self.whitespace()
            if top and key in out:
                # the struct's own field, refused as its key is read again; serde_json then
                # reads to the object's end (whitespace, and a closing brace) and places the
                # error there
                if c == ord("}"):
                    self.index += 1
                raise self.error("duplicate field `__metadata__`")
            if c is None:
                raise self.peek_error("EOF while parsing an object")
            if c != ord(":"):
                raise self.peek_error("expected `:`")
            self.index += 1
            if top:
                out[key] = self.metadata()
            else:
                out[key] = self.value()

    def metadata(self) -> object:
        """The header's ``__metadata__``, which the struct reads in the stream as an optional map
        of strings: a value of another type fails at once, before anything after it is read."""
        c = self.whitespace()
        if c == ord("n"):
            return self.value()
        if c != ord("{"):
            raise self.invalid_type("a map")
        self.depth -= 1
        if self.depth == 0:
            raise self.peek_error("recursion limit exceeded")
        self.index += 1
        first = True
        while True:
            c = self.whitespace()
            if c == ord("}"):
                self.index += 1
                self.depth += 1
                return {}
            if c == ord(",") and not first:
                self.index += 1
                c = self.whitespace()
            elif c is None:
                raise self.peek_error("EOF while parsing an object")
            elif not first:
                raise self.peek_error("expected `,` or `}`")
            first = False
            if c == ord("}"):
                raise self.peek_error("trailing comma")
            if c is None:
                raise self.peek_error("EOF while parsing a value")
            if c != ord('"'):
                raise self.peek_error("key must be a string")
            self.index += 1
            self.string()
            c = self.whitespace()
            if c is None:
                raise self.peek_error("EOF while parsing an object")
            if c != ord(":"):
                raise self.peek_error("expected `:`")
            self.index += 1
            if self.whitespace() != ord('"'):
                raise self.invalid_type("a string")
            self.index += 1
            self.string()

    def invalid_type(self, expected: str) -> SerdeError:
        """serde_json's ``peek_invalid_type``: a list or map is refused where it starts, any other
        value just past it (a value that does not parse fails with its own error)."""
        c = self.whitespace()
        if c == ord("["):
            return self.error(f"invalid type: sequence, expected {expected}")
        if c == ord("{"):
            return self.error(f"invalid type: map, expected {expected}")
        if c is None:
            return self.peek_error("EOF while parsing a value")
        if c not in b'ntf-"0123456789':
            return self.peek_error("expected value")
        value = self.value()
        return self.error(f"invalid type: {_kind(value)}, expected {expected}")


def _kind(value: object) -> str:
    """How serde names an unexpected value's type (``Unexpected``'s Display)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{rust_float(value)}`"
    if isinstance(value, str):
        return "string " + rust_debug(value)
    return "map" if isinstance(value, dict) else "sequence"


_SHORT = {"\0": "\\0", "\t": "\\t", "\n": "\\n", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def rust_debug(s: str) -> str:
    """A string as Rust's ``{:?}`` prints it, which serde's messages quote: in double quotes,
    ``\\0 \\t \\n \\r \\" \\\\`` for those six, ``\\u{hex}`` for every other character Rust's
    Unicode tables call unprintable or a grapheme extender (``rust_escapes``, measured from the
    library), the rest as is."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = []
    for ch in s:
        short = _SHORT.get(ch)
        if short is not None:
            out.append(short)
        elif bisect_right(ESCAPED_FROM, ord(ch)) % 2:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def stream_error(data: bytes, entries: Callable[[bytes], object]) -> str | None:
    """serde_json's message (with its position) for what fails while the header is read: text
    that is not JSON, a value that is not an object, a ``__metadata__`` that is not a map of
    strings; None when it reads through (the tensor entries, which the struct collects and
    checks only after the closing brace, are ``entries``': the header reader's
    ``container.serde_header``, which returns their error text or the tensors).
    ``data`` must be UTF-8 (safetensors checks that first)."""
    p = _Parser(data)
    try:
        c = p.whitespace()
        if c is None:
            raise p.peek_error("EOF while parsing a value")
        if c != ord("{"):
            raise p.invalid_type(STRUCT)
        p.value()
        end = p.index
        if p.whitespace() is not None:
            # the struct's deferred checks of the tensor entries run when its closing brace is
            # read, before serde_json looks past it
            deferred = entries(data[:end])
            if isinstance(deferred, str):
                return deferred
            raise p.peek_error("trailing characters")
    except SerdeError as exc:
        return f"{exc.code} at {position(data, exc.index)}"
    return None


def utf8_error(data: bytes) -> str | None:
    """Rust's ``Utf8Error`` text for bytes that are not UTF-8 (None when they are)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return f"incomplete utf-8 byte sequence from index {exc.start}"
        return f"invalid utf-8 sequence of {exc.end - exc.start} bytes from index {exc.start}"
    return None
