"""Name -> Format, and the inference of a format for layers that carry no marker."""

from __future__ import annotations

from .awq import AWQ_W4A16
from .base import Format
from .fp8 import FLOAT8_E4M3FN, FLOAT8_E4M3FN_BLOCKWISE, FLOAT8_E4M3FN_ROWWISE, FLOAT8_E5M2
from .int8 import INT8_BLOCKWISE, INT8_TENSORWISE
from .mxfp8 import MXFP8
from .nvfp4 import NVFP4
from .svdquant import SVDQUANT_W4A4
from .w4a4 import CONVROT_W4A4
from .w4a8 import ASYM_W4A8_INT8

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        FLOAT8_E4M3FN,
        FLOAT8_E5M2,
        INT8_TENSORWISE,
        ASYM_W4A8_INT8,
        CONVROT_W4A4,
        NVFP4,
        MXFP8,
        AWQ_W4A16,
        SVDQUANT_W4A4,
        FLOAT8_E4M3FN_ROWWISE,
        FLOAT8_E4M3FN_BLOCKWISE,
        INT8_BLOCKWISE,
    )
}

# Order matters: the more specific tensor signatures are tried first (spec 6.6).
_INFERENCE_ORDER = (
    ASYM_W4A8_INT8,
    AWQ_W4A16,
    SVDQUANT_W4A4,
    NVFP4,
    MXFP8,
    CONVROT_W4A4,
    INT8_TENSORWISE,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
)

LAYER_SUFFIXES: frozenset[str] = frozenset(
    {s.suffix for f in FORMATS.values() for s in f.slots} | {"comfy_quant", "scale_weight", "scale_input"}
)
"""Every tensor suffix that belongs to a layer (used to group tensors into layers).

``scale_weight``/``scale_input`` are the legacy scaled-FP8 names (spec 1.6)."""


def get(name: str) -> Format | None:
    return FORMATS.get(name)


def infer_format(tensors: dict) -> Format | None:
    """The format an unmarked layer's tensors look like, or None.  ConvRot sizes are not recoverable."""
    for fmt in _INFERENCE_ORDER:
        if fmt.recognize is not None and fmt.recognize(tensors):
            return fmt
    return None
