"""Parse and validate a safetensors header without reading tensor data.

Layout: 8-byte little-endian header length ``n``, ``n`` bytes of JSON, then the data area.
Structural damage that makes the file unreadable (truncation, a header past the end, non-JSON,
non-object) raises ``InputError``, or, for ``check`` (``damaged_ok``), gives an empty
header with one C009 finding and the bytes safetensors would read (``unreadable``, ``raw``), so
the report can say what each runtime raises.  Damage confined to single entries (unknown dtype,
bad offsets, overlaps) becomes container findings so the rest of the checkpoint is still
checked.
"""

from __future__ import annotations

import json
import math
import struct
from itertools import chain
from operator import itemgetter

from ..dtypes import DTYPE_BITS
from ..errors import InputError
from ..findings import Finding, json_kind
from .source import ByteSource

MAX_HEADER_BYTES = 100 * 1024 * 1024
SAFETENSORS_MAX_HEADER = 100_000_000
"""The safetensors library refuses longer headers (``header too large``): a finding (C008)."""
MAX_SIZE = 2**63 - 1
"""Largest dimension or offset an entry may hold: runtimes (and the OS) address bytes and
elements with 64-bit signed integers, and a larger number only overflows downstream."""
FIRST_READ = 1 << 18
"""Bytes fetched by the first read of a remote source; a longer header costs one more read.
Sources may choose their own size (``first_read``)."""


class TensorEntry(tuple):
    """One tensor of the header: name, dtype string, shape and absolute byte range in its file.

    A tuple subclass: a checkpoint has thousands of entries and building tuples is several
    times cheaper than building objects, which matters for a check that must take a few ms.
    """

    __slots__ = ()

    name = property(itemgetter(0))
    dtype = property(itemgetter(1))
    shape = property(itemgetter(2))
    start = property(itemgetter(3))
    end = property(itemgetter(4))
    file = property(itemgetter(5))

    def __new__(cls, name: str, dtype: str, shape: tuple, start: int, end: int, file: str) -> TensorEntry:
        return _tuple_new(cls, (name, dtype, shape, start, end, file))

    @property
    def nbytes(self) -> int:
        return self[4] - self[3]

    @property
    def numel(self) -> int:
        return math.prod(self[2])

    def __repr__(self) -> str:
        return f"TensorEntry({self[0]!r}, {self[1]}, {self[2]}, {self[3]}:{self[4]})"


_tuple_new = tuple.__new__


class Header:
    """A parsed header: metadata, tensor entries in file order, and container findings."""

    __slots__ = (
        "file",
        "size",
        "header_len",
        "data_start",
        "metadata",
        "tensors",
        "findings",
        "nonstring_metadata",
        "unreadable",
        "raw",
    )

    def __init__(self, file: str, size: int, header_len: int) -> None:
        self.file = file
        self.size = size
        self.header_len = header_len
        self.data_start = 8 + header_len
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorEntry] = {}
        self.findings: list[Finding] = []
        self.nonstring_metadata: dict[str, object] = {}
        """``__metadata__`` values that are not strings (C007), kept so ``fix`` can store them as
        JSON text instead of dropping them."""
        self.unreadable = False
        """Whether the header could not be read at all (C009): no tensors, no metadata."""
        self.raw: bytes | None = None
        """For an unreadable header: the ``header_len`` bytes after the length field, when the
        file holds them (what safetensors would try to parse); None otherwise."""


def _bad(path: str, what: str) -> InputError:
    return InputError(f"{path}: {what}")


def read_header(source: ByteSource, damaged_ok: bool = False) -> Header:
    """Read and validate ``source``'s header: one read of ``source.first_read`` bytes (64 KB
    locally, 512 KB remotely), and one more for exactly the rest of a longer header.

    A header that cannot be read raises ``InputError``, unless ``damaged_ok``: then it is
    an empty ``Header`` marked ``unreadable`` with the reason as its C009 finding."""
    path = source.name
    size = source.size
    if size < 8:
        return _unreadable(
            path, size, 0, None, f"truncated: {size} bytes, a safetensors file starts with an 8-byte header length", damaged_ok
        )
    head = source.pread(0, min(size, getattr(source, "first_read", FIRST_READ)))
    if len(head) < 8:
        raise _bad(path, f"only {len(head)} of the first 8 bytes could be read (file changed or cut short?)")
    if _starts_with_text(head):
        raise NotACheckpoint(
            f"{path}: not a checkpoint: it starts with text ({_shown(head)}), so it is not a safetensors file, "
            "a GGUF file or a *.safetensors.index.json"
        )
    (n,) = struct.unpack_from("<Q", head, 0)
    if n > MAX_HEADER_BYTES:
        return _unreadable(
            path, size, n, None, f"header length {n} exceeds the 100 MB limit (not a safetensors file?)", damaged_ok
        )
    if 8 + n > size:
        return _unreadable(
            path,
            size,
            n,
            None,
            f"header length {n} runs past the end of the file ({size} bytes): truncated or not safetensors",
            damaged_ok,
        )
    if 8 + n <= len(head):
        raw = head[8 : 8 + n]
    elif len(head) == 8:
        raw = source.pread(8, n)
    else:
        raw = head[8:] + source.pread(len(head), 8 + n - len(head))
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
        if _minus_zero(raw):  # serde_json reads -0 as a float: a dimension or offset it refuses
            obj = json.loads(text, parse_int=_serde_int)
    except UnicodeDecodeError:
        return _unreadable(path, size, n, raw, "header is not UTF-8 text (not a safetensors file?)", damaged_ok)
    except json.JSONDecodeError as exc:
        return _unreadable(path, size, n, raw, f"header is not valid JSON ({exc.msg} at byte {exc.pos})", damaged_ok)
    except ValueError as exc:  # the parser's other refusal: an integer literal past Python's digit limit
        return _unreadable(path, size, n, raw, f"header is not valid JSON ({str(exc).split(':', 1)[0]})", damaged_ok)
    except RecursionError:
        return _unreadable(path, size, n, raw, "header is not valid safetensors JSON (nested too deeply to parse)", damaged_ok)
    if not isinstance(obj, dict):
        return _unreadable(path, size, n, raw, f"header is a JSON {json_kind(obj)}, expected an object", damaged_ok)
    # Fast scans of the raw bytes: can any number be negative (1), or any value a boolean (2)?
    odd = 2 if b"true" in raw or b"false" in raw else 1 if b"-" in raw else 0
    keys = len(obj)
    try:
        hdr = parse_header_object(obj, path, size, n, odd)
    except InputError as exc:  # a header nothing can read (its __metadata__ is no object)
        return _unreadable(path, size, n, raw, str(exc).removeprefix(f"{path}: "), damaged_ok)
    if n > SAFETENSORS_MAX_HEADER:
        hdr.findings.append(
            Finding(
                "C008",
                f"{path}: header is {n} bytes, more than the safetensors library's limit of {SAFETENSORS_MAX_HEADER}",
                expected=f"<= {SAFETENSORS_MAX_HEADER} bytes",
                actual=f"{n} bytes",
                cause="very many tensors or very long metadata",
                fix="move metadata out of the header or split the file into shards",
                file=path,
            )
        )
    # Lone surrogates: every name at once (isascii() is O(1): the usual case costs one copy)
    names = "".join(obj)
    meta = "".join(chain.from_iterable(hdr.metadata.items()))
    if not (_ascii_or_text(names) and _ascii_or_text(meta)) or hdr.nonstring_metadata:
        _lone_surrogates(hdr, obj)
    if hdr.findings or not _plainly_read(raw, obj, keys, names, meta, len(hdr.metadata)):
        _hidden_refusal(hdr, text, raw)
    return hdr


def _serde_int(token: str) -> int | float:
    return -0.0 if token == "-0" else int(token)


def _minus_zero(raw: bytes) -> bool:
    """Whether ``-0`` occurs in the text: one ``find`` per minus sign (a header has few)."""
    i = raw.find(b"-")
    while i != -1:
        if raw[i + 1 : i + 2] == b"0":
            return True
        i = raw.find(b"-", i + 1)
    return False


def _plainly_read(raw: bytes, entries: dict, keys: int, names: str, meta: str, meta_keys: int) -> bool:
    """Whether Python's reading of a header that has no finding holds all its text.

    Each key of the text has its colon, and so has each colon inside a string; Python reads a
    repeated key once, and an entry's fields beyond its three are ignored.  Counting three
    fields per entry, the text holds exactly as many colons as Python's reading accounts for
    only when no key was repeated and no field is ignored (each leaves colons over).  An
    escaped colon (``\\u003a``) in a name or metadata is one the text does not show: such a
    text is not plain."""
    in_strings = (names.count(":") if ":" in names else 0) + meta.count(":")
    if in_strings and b"\\u003" in raw:
        return False
    return raw.count(b":") == keys + 3 * len(entries) + meta_keys + in_strings


def _hidden_refusal(hdr: Header, text: str, raw: bytes) -> None:
    """A C016 finding for what safetensors refuses in the header that Python's reading hides
    (``hidden``): a repeated key always, anything else when no other finding explains it."""
    from .hidden import hidden_refusal

    found = hidden_refusal(text, raw)
    if found is None:
        return
    what, repeated = found
    if not repeated and hdr.findings:
        return
    path = hdr.file
    hdr.findings.append(
        Finding(
            "C016",
            f"{path}: header {what}: the safetensors library refuses it (Python's JSON reads it)",
            cause="written by a tool that does not write JSON as safetensors reads it (a repeated key, "
            "or a value Python's JSON takes and serde_json does not)",
            fix="rewrite the header with each key once and only JSON values (the file cannot be loaded as it is)",
            file=path,
        )
    )


class NotACheckpoint(InputError):
    """The file is no checkpoint at all (a README, a web page, a Git LFS pointer): refused in
    one line by every command, ``check`` and ``inspect`` included, never reported as damage."""


TEXT_BYTES = frozenset({9, 10, 13, *range(0x20, 0x7F), *range(0x80, 0x100)})
"""Bytes of text (printable ASCII, tab and line ends, UTF-8's multi-byte sequences)."""


def _starts_with_text(head: bytes) -> bool:
    """Whether the first 8 bytes are text.  A safetensors file starts with its header length,
    a little-endian 64-bit number below 100 MB: its high bytes are zero, never text; a GGUF
    file's magic is followed by a small version number.  So eight bytes of text are the start
    of a text file (by content, whatever the file's name), not of damaged safetensors."""
    return len(head) >= 8 and all(b in TEXT_BYTES for b in head[:8])


def _shown(head: bytes) -> str:
    """The file's first line, cut short, as the one-line refusal quotes it."""
    line = head[:64].decode("utf-8", errors="replace").splitlines()[0] if head[:64].strip() else ""
    line = line.strip()
    return repr(line[:40] + ("..." if len(line) > 40 else ""))


def _unreadable(path: str, size: int, header_len: int, raw: bytes | None, what: str, damaged_ok: bool) -> Header:
    """The header of a file whose header cannot be read: the one-line refusal (InputError), or
    with ``damaged_ok`` an empty header that says why (C009) and keeps what safetensors reads."""
    if not damaged_ok:
        raise _bad(path, what)
    hdr = Header(path, size, header_len)
    hdr.unreadable = True
    hdr.raw = raw
    hdr.findings.append(
        Finding(
            "C009",
            f"{path}: {what}",
            cause="a truncated or interrupted download, a damaged disk, or not a safetensors file",
            fix="re-download or rewrite the file (nothing in it can be read)",
            file=path,
        )
    )
    return hdr


def _ascii_or_text(s: str) -> bool:
    return s.isascii() or _is_text(s)


def _is_text(s: str) -> bool:
    """Whether ``s`` is a string that UTF-8 can encode: a lone surrogate (``"\\ud800"`` in the
    JSON) decodes to a Python string that cannot be encoded, and the safetensors library
    (serde) refuses the whole header."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    except AttributeError:
        return True  # not a string: other findings judge it
    return True


def _lone_surrogates(hdr: Header, obj: dict) -> None:
    """Findings for names and metadata holding lone UTF-16 surrogates: not Unicode text, so
    no runtime can load the file, and nothing may print or write them unescaped."""
    path = hdr.file
    for name in obj:
        if not _is_text(name):
            hdr.findings.append(
                Finding(
                    "C006",
                    f"{path}: tensor name {name!r} holds a lone UTF-16 surrogate, which is not Unicode "
                    "text: the safetensors library refuses the header",
                    tensor=name,
                    actual=ascii(name)[:120],
                    expected="a UTF-8 tensor name",
                    cause="written by a tool that does not follow the safetensors format",
                    fix="rename the tensor (the file cannot be loaded as it is)",
                    file=path,
                )
            )
    for key, value in [*hdr.metadata.items(), *hdr.nonstring_metadata.items()]:
        if not _is_text(key) or not _is_text(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)):
            hdr.findings.append(
                Finding(
                    "C007",
                    f"{path}: __metadata__[{key!r}] holds a lone UTF-16 surrogate, which is not Unicode "
                    "text: the safetensors library refuses the header",
                    expected="UTF-8 text",
                    actual=ascii(value)[:120],
                    cause="written by a tool that does not follow the safetensors format",
                    fix="re-save the metadata value as UTF-8 text",
                    file=path,
                )
            )


def parse_header_object(obj: dict, path: str, size: int, header_len: int, odd_numbers: int = 2) -> Header:
    """Validate a decoded header object; see the module docstring for the error policy.
    ``odd_numbers`` says what the header text may hold: 0 no minus sign and no JSON boolean,
    1 minus signs but no boolean, 2 anything (``read_header`` knows from the raw bytes;
    fewer possibilities, cheaper validation)."""
    hdr = Header(path, size, header_len)
    findings = hdr.findings
    data_len = size - hdr.data_start
    meta = obj.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict):
            raise _bad(path, f"__metadata__ is a JSON {json_kind(meta)}, expected an object of strings")
        for key, value in meta.items():
            if isinstance(value, str):
                hdr.metadata[key] = value
            else:
                hdr.nonstring_metadata[key] = value
                findings.append(
                    Finding(
                        "C007",
                        f"{path}: __metadata__[{key!r}] is a JSON {json_kind(value)}, safetensors requires strings",
                        expected="string",
                        actual=json_kind(value),
                        cause="written by a tool that does not follow the safetensors format",
                        fix="re-save the metadata value as a JSON string",
                        file=path,
                    )
                )
    mark = len(findings)
    _enter_tensors(hdr, obj, data_len, strict_dims=False)
    if odd_numbers and _odd_dims(hdr.tensors, odd_numbers):
        # A negative or boolean dimension slipped through the arithmetic test: start over,
        # checking every dimension, so the bad entries are reported and left out.
        del findings[mark:]
        hdr.tensors.clear()
        _enter_tensors(hdr, obj, data_len, strict_dims=True)
    return hdr


_SHAPE_OF = itemgetter(2)


def _odd_dims(tensors: dict, odd_numbers: int) -> bool:
    """Whether any entered dimension is negative or (``odd_numbers`` 2) not an int."""
    dims = list(chain.from_iterable(map(_SHAPE_OF, tensors.values())))
    return bool(dims) and (min(dims) < 0 or (odd_numbers == 2 and {*map(type, dims)} != {int}))


def _enter_tensors(hdr: Header, obj: dict, data_len: int, strict_dims: bool) -> None:
    """Enter every usable tensor; report each bad one precisely.

    One lean pass: per tensor, one arithmetic test (byte span == dtype width x element count,
    integer offsets inside the data area), and the tiling test on whole sets at the end; only a
    suspicious entry goes to ``_validate_entry``.  Dimensions are checked one by one only
    with ``strict_dims``; otherwise floats fail the integer test and the caller looks for
    negative or boolean ones afterwards, only when the header text can hold them."""
    path = hdr.file
    findings = hdr.findings
    base = hdr.data_start
    tensors = hdr.tensors
    bits_of = DTYPE_BITS
    prod = math.prod
    add = sum
    new, TE = _tuple_new, TensorEntry
    begins: list[int] = []
    ends: list[int] = []
    empty: list[tuple[int, str]] = []
    for name, entry in obj.items():
        try:
            dtype = entry["dtype"]
            shape = entry["shape"]
            begin, end = entry["data_offsets"]
            add(shape)  # a non-number raises here; in prod() it would repeat a string or list (GBs)
            numel = prod(shape)
            ok = (
                (end - begin) * 8 == numel * bits_of[dtype]
                and type(numel) is int
                and type(begin) is int
                and type(end) is int
                and 0 <= begin
                and end <= data_len
                and type(shape) is list  # "" and {} multiply to 1 like []: not shapes
                and numel != 0  # an empty tensor's dimensions are unbounded by its span: validate them
            )
            if strict_dims and ok:
                ok = all(type(d) is int and d >= 0 for d in shape)
        except (TypeError, KeyError, ValueError, OverflowError):  # e.g. NaN minus a 400-digit int
            ok = False
        if not ok:
            usable = _validate_entry(name, entry, path, data_len, findings)
            if not usable:
                continue
            dtype, shape, begin, end = usable
        if end != begin:
            begins.append(begin)
            ends.append(end)
        else:
            empty.append((begin, name))
        tensors[name] = new(TE, (name, dtype, tuple(shape), base + begin, base + end, path))
    b = set(begins)
    if not (len(b) == len(begins) and b | {data_len} == set(ends) | {0}) and (begins or data_len):
        _check_layout(sorted(zip(begins, ends, (n for n in tensors if tensors[n].nbytes))), data_len, path, findings)
    if empty:
        _check_empty(empty, sorted(zip(begins, ends, (n for n in tensors if tensors[n].nbytes))), path, findings)


def _check_empty(empty: list[tuple[int, str]], spans: list[tuple[int, int, str]], path: str, findings: list[Finding]) -> None:
    """A zero-length tensor must sit on a tensor boundary: safetensors sorts entries by
    (begin, end) and refuses one whose begin is not where the previous tensor ended."""
    from bisect import bisect_left

    starts = [s[0] for s in spans]
    for offset, name in empty:
        i = bisect_left(starts, offset) - 1
        if i >= 0 and spans[i][0] < offset < spans[i][1]:
            findings.append(
                Finding(
                    "C003",
                    f"{path}: zero-length tensor {name!r} at data offset {offset} lies inside {spans[i][2]!r} "
                    f"[{spans[i][0]}, {spans[i][1]})",
                    tensor=name,
                    cause="an empty tensor's offsets must be a tensor boundary; the safetensors library refuses the file",
                    fix="rewrite the file (comfyquant fix)",
                    file=path,
                )
            )


def _validate_entry(name: str, entry, path: str, data_len: int, findings: list[Finding]):
    """Precise findings for one suspicious entry; returns (dtype, shape, begin, end) if usable."""
    try:
        dtype = entry["dtype"]
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        findings.append(
            Finding(
                "C006",
                f"{path}: tensor {name!r} has a malformed header entry (needs dtype, shape, data_offsets)",
                tensor=name,
                actual=json.dumps(entry)[:120],
                file=path,
            )
        )
        return None
    if type(begin) is int and type(end) is int and all(type(d) is int for d in shape) and max(begin, end, *shape) > MAX_SIZE:
        findings.append(
            Finding(
                "C006",
                f"{path}: tensor {name!r} has a dimension or offset beyond 2^63-1 ({list(shape)} [{begin}, {end}]): "
                "no runtime can address it",
                tensor=name,
                expected=f"sizes and offsets <= {MAX_SIZE}",
                file=path,
            )
        )
        return None
    if (
        type(entry["shape"]) is not list
        or type(begin) is not int
        or type(end) is not int
        or not 0 <= begin <= end
        or not all(type(d) is int and d >= 0 for d in shape)
        or type(dtype) is not str
    ):
        findings.append(
            Finding(
                "C006",
                f"{path}: tensor {name!r} has invalid dtype, shape or offsets: {dtype!r} {list(shape)} [{begin}, {end}]",
                tensor=name,
                file=path,
            )
        )
        return None
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        findings.append(
            Finding(
                "C005",
                f"{path}: tensor {name!r} has unknown dtype {dtype!r}",
                tensor=name,
                actual=dtype,
                expected="a safetensors dtype (F32, BF16, F16, F8_E4M3, I8, U8, ...)",
                file=path,
            )
        )
    else:
        numel = math.prod(shape)
        if (end - begin) * 8 != numel * bits:
            findings.append(
                Finding(
                    "C001",
                    f"{path}: tensor {name!r} spans {end - begin} bytes, but {dtype} {list(shape)} needs {numel * bits // 8}",
                    tensor=name,
                    expected=f"{numel * bits // 8} bytes",
                    actual=f"{end - begin} bytes",
                    cause="header written with a wrong shape or dtype, or the file was edited",
                    file=path,
                )
            )
    if end > data_len:
        findings.append(
            Finding(
                "C002",
                f"{path}: tensor {name!r} ends at data offset {end}, past the data area ({data_len} bytes): file truncated?",
                tensor=name,
                expected=f"end <= {data_len}",
                actual=str(end),
                cause="the file is truncated (incomplete download?)",
                fix="download or copy the file again",
                file=path,
            )
        )
    return dtype, shape, begin, end


def _check_layout(spans: list[tuple[int, int, str]], data_len: int, path: str, findings: list[Finding]) -> None:
    """Overlaps and holes: safetensors requires tensors to tile the data area exactly."""
    spans.sort()
    pos = 0
    prev = None
    for begin, end, name in spans:
        if begin < pos and end > begin:
            findings.append(
                Finding(
                    "C003",
                    f"{path}: tensor {name!r} [{begin}, {end}) overlaps {prev!r} (ends at {pos})",
                    tensor=name,
                    file=path,
                )
            )
        elif begin > pos:
            findings.append(
                Finding(
                    "C004",
                    f"{path}: {begin - pos} unused bytes before tensor {name!r} at data offset {pos}",
                    tensor=name,
                    cause="tensors do not tile the data area; the safetensors library refuses such files",
                    fix="rewrite the file (comfyquant fix)",
                    file=path,
                )
            )
        if end > pos:
            pos = end
            prev = name
    if pos < data_len:
        findings.append(
            Finding(
                "C004",
                f"{path}: {data_len - pos} trailing bytes after the last tensor",
                cause="tensors do not tile the data area; the safetensors library refuses such files",
                fix="rewrite the file (comfyquant fix)",
                file=path,
            )
        )
