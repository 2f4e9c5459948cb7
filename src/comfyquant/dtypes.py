"""The safetensors dtypes: one row each, with every name the package needs for it.

Each column is a fact about the dtype that some layer of the package needs without importing
the library it names: the storage width (the header reader, the writer, the runtime
profiles), the NumPy dtype that holds an element's bytes (byte-exact repairs: BF16 and the
FP8 kinds are moved as unsigned integers, NumPy has no such floats) and torch's ScalarType
name (what its view errors print; the codecs find their torch dtypes by it).  Sub-byte dtypes (F4, F6_*) are stored packed;
a tensor's byte span is the bit total / 8.

Rows follow the order of the ``Dtype`` enum of safetensors 0.8 (``safetensors/src/tensor.rs``),
which is the order its unknown-variant message lists them in.  Plain tuples, no classes: this module is
on the start-up path of ``check``.
"""

from __future__ import annotations

BOOL_KIND, INT_KIND, FLOAT_KIND, FLOAT8_KIND, FNUZ_KIND, COMPLEX_KIND, PACKED_KIND = (
    "bool",
    "int",
    "float",
    "float8",
    "float8-fnuz",
    "complex",
    "packed",
)
"""What a dtype's elements are: ``float`` is the dense floating point a model's unquantized
weights use; ``float8`` the OCP 8-bit floats (and E8M0 scales); ``float8-fnuz`` AMD's
no-negative-zero variants; ``packed`` the sub-byte floats stored several to a byte."""

DTYPES: tuple[tuple[str, int, str, str | None, str | None], ...] = (
    # name, bits, kind, NumPy dtype of the bytes, torch ScalarType
    ("BOOL", 8, BOOL_KIND, "u1", "Bool"),
    ("F4", 4, PACKED_KIND, None, None),
    ("F6_E2M3", 6, PACKED_KIND, None, None),
    ("F6_E3M2", 6, PACKED_KIND, None, None),
    ("U8", 8, INT_KIND, "u1", "Byte"),
    ("I8", 8, INT_KIND, "i1", "Char"),
    ("F8_E5M2", 8, FLOAT8_KIND, "u1", "Float8_e5m2"),
    ("F8_E4M3", 8, FLOAT8_KIND, "u1", "Float8_e4m3fn"),
    ("F8_E8M0", 8, FLOAT8_KIND, "u1", "Float8_e8m0fnu"),
    ("F8_E4M3FNUZ", 8, FNUZ_KIND, "u1", "Float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", 8, FNUZ_KIND, "u1", "Float8_e5m2fnuz"),
    ("I16", 16, INT_KIND, "<i2", "Short"),
    ("U16", 16, INT_KIND, "<u2", "UInt16"),
    ("F16", 16, FLOAT_KIND, "<f2", "Half"),
    ("BF16", 16, FLOAT_KIND, "<u2", "BFloat16"),
    ("I32", 32, INT_KIND, "<i4", "Int"),
    ("U32", 32, INT_KIND, "<u4", "UInt32"),
    ("F32", 32, FLOAT_KIND, "<f4", "Float"),
    ("C64", 64, COMPLEX_KIND, "<c8", "ComplexFloat"),
    ("F64", 64, FLOAT_KIND, "<f8", "Double"),
    ("I64", 64, INT_KIND, "<i8", "Long"),
    ("U64", 64, INT_KIND, "<u8", "UInt64"),
)

DTYPE_BITS: dict[str, int] = {name: bits for name, bits, *_ in DTYPES}
"""Header dtype string -> storage width in bits (every dtype safetensors knows)."""

DTYPE_KINDS: dict[str, str] = {name: kind for name, _bits, kind, *_ in DTYPES}
"""Header dtype string -> what its elements are (the ``*_KIND`` names above)."""

NUMPY_NAMES: dict[str, str] = {row[0]: row[3] for row in DTYPES if row[3] is not None}
"""Header dtype string -> the NumPy dtype that holds one element's little-endian bytes."""

SCALAR_TYPES: dict[str, str] = {row[0]: row[4] for row in DTYPES if row[4] is not None}
"""Header dtype string -> torch's ScalarType name (``"F16"`` -> ``"Half"``): what torch's
messages print, and how ``comfyquant.numerics.dtypes`` finds each torch dtype."""

DENSE_FLOAT_DTYPES = frozenset(name for name, kind in DTYPE_KINDS.items() if kind == FLOAT_KIND)
"""Dense floating-point dtypes a model's unquantized weights use (F16, BF16, F32, F64)."""

MODEL_FLOAT_DTYPES = ("F32", "BF16", "F16")
"""The floats a model's dense weights and scales are stored in: what the encoders take, what
``--reference`` reads as an original weight, the scales that widen to F32 exactly.  (F64 is
dense too, but no runtime loads a weight or scale of it.)"""

QUANTIZED_WEIGHT_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "I8", "U8"})
"""Weight dtypes that only make sense with a quantization marker."""
