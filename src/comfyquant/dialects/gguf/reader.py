"""A GGUF file read as the safetensors file it stands for (city96 ComfyUI-GGUF layout).

GGUF is another container, so every command reads it through a *virtual* safetensors file
(``comfyquant.io.virtual.VirtualSource``): each GGUF tensor under its original name and
its true shape (GGUF lists dimensions innermost first; ComfyUI-GGUF's converter stores the
shape of a tensor it flattened to ``(n/256, 256)`` in ``comfy.gguf.orig_shape.<name>``),
dense tensors (F32, F16, BF16, F64, I8..I64) as ranges of the file's own bytes, and every
quantized ggml type decoded into F32 by ``gguf.quants.dequantize`` when a reader first asks
for it (the decode is exact only into F32: an FP16 scale times an integer code needs more
mantissa than BF16 or F16 hold).

The header is parsed here with bounds on every count and length, not by ``gguf.GGUFReader``:
a damaged or hostile file must give one line naming the file and tensor, never a traceback,
an unbounded loop over a 12 GB file or a memory blow-up.  Only the ``gguf`` package's type
table and its numpy dequantizers are used, imported when a GGUF file is opened.
"""

from __future__ import annotations

import json
import math
import struct

from ...errors import InputError
from ...installing import extra_command
from ...io.shards import is_url
from ...io.source import LocalFile
from ...io.virtual import Range, VirtualSource
from .keys import ARCH_KEY, CONTAINER_KEY, DENSE, MAGIC, ORIG_SHAPE_KEY, ORIG_SHAPE_PREFIX, TYPES_KEY

VERSIONS = (2, 3)
"""GGUF versions with 64-bit counts (version 1, 2023, used 32-bit ones and is long gone)."""
MAX_DIMS = 4
"""ggml tensors have at most 4 dimensions (``GGML_MAX_DIMS``)."""
MAX_ITEMS = 1 << 22
"""Elements of one string or nested array that are walked one by one (a 256k-token
vocabulary is far below); more is an absurd count, refused instead of walked."""
KEEP_ITEMS = 64
"""Arrays up to this length are kept as values (shapes); longer ones are skipped."""
MAX_NAME = 65535
"""The longest key or tensor name GGUF allows (the limit the GGUF format, ggml ``docs/gguf.md``,
sets for keys)."""
KEEP_STRING = 4096
"""String values up to this length are carried into the virtual file's metadata."""
CHUNK = 1 << 16
"""Header bytes read per request (a tokenizer-laden header costs a few hundred reads)."""

# GGUF value types (the file format's own numbering) -> struct code; 8 string, 9 array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
VALUE_TYPE_NAMES = {
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    9: "ARRAY",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}


class GGUFTensor:
    """One tensor of the GGUF header: name, ggml type, dims as stored (innermost first), where
    its bytes are, and the shape a reader sees (the original one)."""

    __slots__ = ("name", "type", "dims", "start", "nbytes", "shape", "block", "type_size")

    def __init__(self, name: str, type, dims: tuple, start: int, nbytes: int, block: int, type_size: int) -> None:
        self.name = name
        self.type = type
        self.dims = dims
        self.start = start
        self.nbytes = nbytes
        self.block = block
        self.type_size = type_size
        self.shape = tuple(reversed(dims))

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def type_name(self) -> str:
        return self.type.name

    @property
    def quantized(self) -> bool:
        return self.type.name not in DENSE


class GGUFHeader:
    """The parsed header: version, key/value pairs (type code, value; long arrays summarised),
    tensors in file order, alignment and where the data section starts."""

    __slots__ = ("version", "kv", "tensors", "alignment", "data_start")

    def __init__(self) -> None:
        self.version = 0
        self.kv: dict[str, tuple[int, object, int | None]] = {}
        """key -> (value type, value, element type of an array or None)."""
        self.tensors: list[GGUFTensor] = []
        self.alignment = 32
        self.data_start = 0


class _Skipped:
    """An array too long to keep (a tokenizer vocabulary): its element type and length."""

    __slots__ = ("item_type", "length")

    def __init__(self, item_type: int, length: int) -> None:
        self.item_type = item_type
        self.length = length


class _Cursor:
    """Sequential reads of a byte source through a window, each bounded by the file's size."""

    def __init__(self, source, path: str) -> None:
        self.source = source
        self.path = path
        self.size = source.size
        self.pos = 0
        self._buf = b""
        self._buf_at = 0

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.path}: {what}")

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.size:
            raise self.fail(f"GGUF header truncated: {what} at byte {self.pos} needs {n} bytes, the file has {self.size}")
        lo = self.pos - self._buf_at
        if lo < 0 or lo + n > len(self._buf):
            self._buf = self.source.pread(self.pos, max(n, CHUNK))
            self._buf_at = self.pos
            lo = 0
            if len(self._buf) < n:
                raise self.fail(f"GGUF header truncated: {what} at byte {self.pos}: the read came back short")
        self.pos += n
        return self._buf[lo : lo + n]

    def skip(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"GGUF header truncated: {what} at byte {self.pos} needs {n} bytes, the file has {self.size}")
        self.pos += n

    def remaining(self) -> int:
        return self.size - self.pos

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def name(self, what: str) -> str:
        """A key or tensor name: strict UTF-8, at most ``MAX_NAME`` bytes."""
        n = self.u64(f"the length of {what}")
        if n > min(MAX_NAME, self.remaining()):
            raise self.fail(
                f"{what} at byte {self.pos} claims {n} bytes (names are at most {MAX_NAME}; "
                f"{self.remaining()} bytes left in the file)"
            )
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {self.pos - n} is not valid UTF-8") from None


def _value(cur: _Cursor, vtype: int, what: str, depth: int = 0):
    """One GGUF value of type ``vtype``; arrays longer than ``KEEP_ITEMS`` are skipped
    (numeric ones in one step) and returned as ``_Skipped``."""
    code = _SCALARS.get(vtype)
    if code is not None:
        size = struct.calcsize("<" + code)
        return struct.unpack("<" + code, cur.take(size, what))[0]
    if vtype == _STRING:
        n = struct.unpack("<Q", cur.take(8, f"the length of {what}"))[0]
        if n > cur.remaining():
            raise cur.fail(f"{what} at byte {cur.pos} claims a {n}-byte string, more than the {cur.remaining()} bytes left")
        if n > KEEP_STRING:
            cur.skip(n, what)
            return _Skipped(_STRING, n)
        return cur.take(n, what).decode("utf-8", "replace")
    if vtype == _ARRAY:
        item = cur.u32(f"the element type of {what}")
        return _array(cur, item, cur.u64(f"the length of {what}"), what, depth)
    raise cur.fail(f"{what}: unknown GGUF value type {vtype} at byte {cur.pos - 4}")


def _array(cur: _Cursor, item: int, n: int, what: str, depth: int = 0):
    """An array of ``n`` values of type ``item`` (its element type and length already read)."""
    if depth >= 4:
        raise cur.fail(f"{what}: arrays nested more than 4 deep")
    code = _SCALARS.get(item)
    if code is not None:
        size = struct.calcsize("<" + code)
        if n * size > cur.remaining():
            raise cur.fail(
                f"{what}: an array of {n} {VALUE_TYPE_NAMES[item]} at byte {cur.pos} runs past the end of "
                f"the file ({cur.remaining()} bytes left)"
            )
        if n > KEEP_ITEMS:
            cur.skip(n * size, what)
            return _Skipped(item, n)
        return list(struct.unpack(f"<{n}{code}", cur.take(n * size, what)))
    if item not in (_STRING, _ARRAY):
        raise cur.fail(f"{what}: unknown GGUF value type {item} for array elements at byte {cur.pos - 12}")
    least = 8 if item == _STRING else 12
    if n * least > cur.remaining() or n > MAX_ITEMS:
        raise cur.fail(
            f"{what}: an array of {n} {VALUE_TYPE_NAMES[item]} at byte {cur.pos} is an absurd count "
            f"({cur.remaining()} bytes left)"
        )
    values = [_value(cur, item, f"{what}[{i}]", depth + 1) for i in range(n)]
    return values if n <= KEEP_ITEMS else _Skipped(item, n)


def _gguf_tables():
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        return None
    return GGML_QUANT_SIZES, GGMLQuantizationType


def read_header(source, path: str) -> GGUFHeader:
    """Parse and validate a GGUF header from ``source`` (a byte source with ``pread``/``size``)."""
    tables = _gguf_tables()
    if tables is None:
        raise InputError(f"{path}: a GGUF file; reading it needs the gguf package ({extra_command('gguf')})")
    sizes, qtypes = tables
    cur = _Cursor(source, path)
    hdr = GGUFHeader()
    magic = cur.take(4, "the magic") if cur.size >= 4 else b""
    if magic != MAGIC:
        raise cur.fail(f"not a GGUF file (starts with {magic!r}, expected {MAGIC!r})")
    version = cur.u32("the version")
    if version not in VERSIONS:
        if version & 0xFFFF == 0 and version:
            raise cur.fail(f"a big-endian GGUF file (version {version >> 24}): only little-endian GGUF is supported")
        raise cur.fail(f"GGUF version {version}: only versions 2 and 3 are supported")
    hdr.version = version
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the key/value count")
    if n_kv * 13 > cur.remaining():
        raise cur.fail(f"GGUF header claims {n_kv} key/value pairs, more than the {cur.remaining()} bytes left could hold")
    if n_tensors * 28 > cur.remaining():
        raise cur.fail(f"GGUF header claims {n_tensors} tensors, more than the {cur.remaining()} bytes left could hold")
    for i in range(n_kv):
        key = cur.name(f"key #{i}")
        vtype = cur.u32(f"the value type of key {key!r}")
        item = None
        if vtype == _ARRAY:
            item = cur.u32(f"the element type of key {key!r}")
            value = _array(cur, item, cur.u64(f"the length of key {key!r}"), f"key {key!r}")
        else:
            value = _value(cur, vtype, f"key {key!r}")
        if key in hdr.kv:
            raise cur.fail(f"GGUF key {key!r} appears twice")
        hdr.kv[key] = (vtype, value, item)
    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.name(f"the name of tensor #{i}")
        if name in names:
            raise cur.fail(f"tensor {name!r} appears twice in the GGUF header")
        if name == "__metadata__" or not name:
            raise cur.fail(f"tensor #{i} has the name {name!r}, which a safetensors view cannot hold")
        names.add(name)
        n_dims = cur.u32(f"the rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})")
        dims = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"the shape of tensor {name!r}"))
        raw_type = cur.u32(f"the ggml type of tensor {name!r}")
        offset = cur.u64(f"the data offset of tensor {name!r}")
        infos.append((name, dims, raw_type, offset))
    align = hdr.kv.get("general.alignment")
    if align is not None:
        if align[0] != 4 or not isinstance(align[1], int) or align[1] <= 0 or align[1] & (align[1] - 1):
            raise cur.fail(
                f"general.alignment is {align[1]!r} ({VALUE_TYPE_NAMES.get(align[0], align[0])}), not a UINT32 power of two"
            )
        hdr.alignment = align[1]
    hdr.data_start = cur.pos + (-cur.pos % hdr.alignment)
    for name, dims, raw_type, offset in infos:
        try:
            qtype = qtypes(raw_type)
            block, type_size = sizes[qtype]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor {name!r} has ggml type {raw_type}, which gguf does not know") from None
        if dims[0] % block:
            raise cur.fail(
                f"tensor {name!r}: a {qtype.name} row of {dims[0]} elements is not a whole number of {block}-element blocks"
            )
        nbytes = math.prod(dims) // block * type_size
        start = hdr.data_start + offset
        if start + nbytes > cur.size:
            raise cur.fail(
                f"tensor {name!r}: its data [{start}, {start + nbytes}) runs past the end of the file "
                f"({cur.size} bytes; truncated download?)"
            )
        hdr.tensors.append(GGUFTensor(name, qtype, dims, start, nbytes, block, type_size))
    _apply_orig_shapes(hdr, path)
    return hdr


def _apply_orig_shapes(hdr: GGUFHeader, path: str) -> None:
    """Give each tensor its original shape from ``comfy.gguf.orig_shape.<name>`` (an integer
    array whose product must be the tensor's element count)."""
    by_name = {t.name: t for t in hdr.tensors}
    for key, (vtype, value, _item) in hdr.kv.items():
        if not key.startswith(ORIG_SHAPE_PREFIX):
            continue
        name = key[len(ORIG_SHAPE_PREFIX) :]
        t = by_name.get(name)
        if t is None:
            continue  # a shape for a tensor the file does not have: nothing to reshape
        if (
            vtype != _ARRAY
            or not isinstance(value, list)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise InputError(f"{path}: tensor {name!r}: {key} is not an array of integers")
        if not value or any(v < 0 for v in value) or math.prod(value) != t.numel:
            raise InputError(
                f"{path}: tensor {name!r}: {key} is {value}, {math.prod(value)} elements, but the tensor "
                f"has {t.numel} ({list(t.shape)})"
            )
        t.shape = tuple(value)


class GGUFSource(VirtualSource):
    """The virtual safetensors view of one GGUF file; closing it closes the file."""

    def __init__(self, path: str, file: LocalFile, header: GGUFHeader, tensors: dict, metadata: dict) -> None:
        super().__init__(path, tensors, metadata)
        self.first_read = len(self._header)
        """The header reader's first read ends at the header: a longer one would run into the
        first tensor and decode it (a quantized Flux layer is 150 MB of F32) just to open the file."""
        self.file = file
        self.gguf = header
        self.stored_as = {t.name: (t.type_name, t.nbytes) for t in header.tensors if t.type_name not in DENSE}
        self.stored_size = file.size

    def close(self) -> None:
        super().close()
        self.file.close()


def _decoder(file: LocalFile, path: str, t: GGUFTensor):
    """The zero-argument producer of a quantized tensor's F32 bytes (read and decoded on call)."""

    def produce() -> bytes:
        import numpy as np
        from gguf.quants import dequantize

        if t.numel == 0:
            return b""
        raw = file.pread(t.start, t.nbytes)
        if len(raw) != t.nbytes:
            raise InputError(f"{path}: tensor {t.name!r}: the file ended inside its data (changed since it was opened?)")
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, t.dims[0] // t.block * t.type_size)
        with np.errstate(all="ignore"):  # NaN/Inf scales decode to NaN/Inf, as in ggml: values, not warnings
            out = dequantize(rows, t.type)
        return np.ascontiguousarray(out, dtype="<f4").tobytes()

    return produce


def _probe(t: GGUFTensor, path: str) -> None:
    """Refuse a quantized type the installed gguf cannot decode, before anything reads it."""
    import numpy as np
    from gguf.quants import dequantize

    try:
        with np.errstate(all="ignore"):
            dequantize(np.zeros((1, t.type_size), dtype=np.uint8), t.type)
    except Exception:  # noqa: BLE001 -- gguf's own decoder refusing the type, however it says so
        raise InputError(
            f"{path}: tensor {t.name!r} has ggml type {t.type_name}, which gguf {_gguf_version()} cannot dequantize"
        ) from None


def _gguf_version() -> str:
    """The installed gguf package's version, from its distribution (the module has no
    ``__version__``); ``(version unknown)`` when the metadata is missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(version unknown)"


def _metadata(hdr: GGUFHeader) -> dict[str, str]:
    """The virtual file's ``__metadata__``: the container, the architecture, every tensor's
    ggml type, the original shapes (with their array's element type: ComfyUI-GGUF takes
    INT32 only) and the other scalar keys as ``gguf.<key>`` (tokenizer arrays left out)."""
    meta = {
        CONTAINER_KEY: "gguf",
        "comfyquant.gguf.version": str(hdr.version),
        TYPES_KEY: json.dumps({t.name: t.type_name for t in hdr.tensors}, separators=(",", ":")),
    }
    shapes = {}
    for key, (vtype, value, item) in hdr.kv.items():
        if key.startswith(ORIG_SHAPE_PREFIX):
            shapes[key[len(ORIG_SHAPE_PREFIX) :]] = {
                "shape": value if isinstance(value, list) else None,
                "type": VALUE_TYPE_NAMES.get(item if item is not None else vtype, "?"),
            }
        elif key == "general.architecture" and isinstance(value, str):
            meta[ARCH_KEY] = value
        elif isinstance(value, (str, int, float)):
            meta["gguf." + key] = str(value)
    if shapes:
        meta[ORIG_SHAPE_KEY] = json.dumps(shapes, separators=(",", ":"))
    return meta


def virtual_source(path: str) -> GGUFSource:
    """The GGUF file at ``path`` as a virtual safetensors file (see the module docstring)."""
    path = str(path)
    if is_url(path):
        raise InputError(f"{path}: GGUF files are read from local paths only (remote GGUF is not supported: download it first)")
    file = LocalFile(path)
    try:
        hdr = read_header(file, path)
        tensors: dict[str, tuple] = {}
        probed: set[str] = set()
        for t in hdr.tensors:
            dense = DENSE.get(t.type_name)
            if dense is not None:
                tensors[t.name] = (dense, t.shape, Range(file, t.start, t.nbytes))
                continue
            if t.type_name not in probed:
                _probe(t, path)
                probed.add(t.type_name)
            tensors[t.name] = ("F32", t.shape, _decoder(file, path, t))
        return GGUFSource(path, file, hdr, tensors, _metadata(hdr))
    except InputError:
        file.close()
        raise
    except (struct.error, ValueError, OverflowError, MemoryError) as exc:
        file.close()
        raise InputError(f"{path}: malformed GGUF header ({type(exc).__name__}: {exc})") from None
