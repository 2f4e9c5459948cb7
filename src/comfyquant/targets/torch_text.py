"""How torch and comfy-kitchen print what they refuse: dtype names and the broadcasting error.

The runtime profiles (``kitchen`` and the modules beside it, ``comfyui``, the dialects'
runtime models) predict messages torch raises inside the runtimes; the text lives here, below
all of them.
"""

from __future__ import annotations

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
    the last one, as torch's ``infer_size`` does), or None."""
    ndim = max(len(a), len(b))
    for i in range(ndim - 1, -1, -1):
        back = ndim - 1 - i
        da = a[len(a) - 1 - back] if back < len(a) else 1
        db = b[len(b) - 1 - back] if back < len(b) else 1
        if da != db and da != 1 and db != 1:
            return f"The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
    return None
