"""What ``quantize`` writes as ``convrot_w4a4``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..params import Params, collect
from . import CONVROT_W4A4


@dataclass(frozen=True, slots=True)
class W4A4Params(Params):
    convrot_groupsize: int = field(default=CONVROT_W4A4.key("convrot_groupsize").default,
                                   metadata={"help": "ConvRot block size (16, 64 or 256 for SGLang)"})
    linear_dtype: str = field(default=CONVROT_W4A4.key("linear_dtype").default, metadata={"choices": ("int4", "int8")})

    FORMAT = CONVROT_W4A4.name
    LABELS = {"convrot_groupsize": "C"}
    RANK = 2


PARAMS = collect(W4A4Params)
