"""How torch and comfy-kitchen print what they refuse: dtype names and the broadcasting error.

The runtime profiles (``kitchen`` and the modules beside it, ``comfyui``, the dialects'
runtime models) predict messages torch raises inside the runtimes; the text lives here, below
all of them.
"""

from __future__ import annotations

from ..shapes import broadcast_mismatch

TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
"""safetensors dtype -> torch dtype name (as comfy-kitchen's messages print it: ``torch.<name>``)."""


def broadcast_error(a: tuple, b: tuple) -> str | None:
    """torch's message when shapes ``a`` and ``b`` do not broadcast (dimensions compared from
    the last one, as torch's ``infer_size`` does: ``shapes.broadcast_mismatch``), or None."""
    clash = broadcast_mismatch(a, b)
    if clash is None:
        return None
    da, db, i = clash
    return f"The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
