"""Safetensors dtype strings and their storage widths in bits.

Sub-byte dtypes (F4, F6_*) are stored packed; a tensor's byte span is the bit total / 8.
"""

from __future__ import annotations

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
"""Dense floating-point dtypes a model's unquantized weights use."""

QUANTIZED_WEIGHT_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "I8", "U8"})
"""Weight dtypes that only make sense with a quantization marker."""
