"""``float8_e5m2``: FP8 E5M2 weights with one F32 scale per tensor (comfy-kitchen 0.2.40
``TensorCoreFP8Layout``).

The layout is per-tensor FP8's (``fp8.per_tensor_fp8``); E5M2 trades mantissa for range.
ComfyUI and comfy-kitchen load it; SGLang has no E5M2 path (its profile says so), so the
description lists only those two runtimes.
"""

from __future__ import annotations

from ..fp8 import per_tensor_fp8

FLOAT8_E5M2 = per_tensor_fp8(
    "float8_e5m2",
    "F8_E5M2",
    frozenset({"comfyui", "comfy-kitchen"}),
    "FP8 E5M2, per-tensor scale",
    aliases=("fp8_e5m2", "e5m2"),
    package=__name__,
)

FORMATS = (FLOAT8_E5M2,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
