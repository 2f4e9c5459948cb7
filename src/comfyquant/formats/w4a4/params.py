"""What ``quantize`` writes as ``convrot_w4a4``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..params import CONVROT_SIZE_FLAG, FULL_PRECISION_FLAG, Params, collect
from . import CONVROT_W4A4

LINEAR_DTYPES = ("int4", "int8")
"""What the activation of a W4A4 layer is quantized to on CUDA (``linear_dtype``)."""


@dataclass(frozen=True, slots=True)
class W4A4Params(Params):
    convrot_groupsize: int = field(
        default=CONVROT_W4A4.default("convrot_groupsize"), metadata={"help": "ConvRot block size (16, 64 or 256 for SGLang)"}
    )
    linear_dtype: str = field(default=CONVROT_W4A4.default("linear_dtype"), metadata={"choices": LINEAR_DTYPES})

    FORMAT = CONVROT_W4A4.name
    LABELS = {"convrot_groupsize": "C"}
    FLAGS = (
        CONVROT_SIZE_FLAG,
        ("--linear-dtype", "linear_dtype", {"choices": list(LINEAR_DTYPES), "help": "W4A4 activation dtype on CUDA"}),
        FULL_PRECISION_FLAG,
    )


PARAMS = collect(W4A4Params)
