"""What ``quantize`` writes as ``int8_tensorwise``: ConvRot with row-wise scales by default, the
one INT8 variant every runtime loads (SGLang 0.5.23 loads INT8 linears only through
``ConvRotInt8Config``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError
from ..params import CONVROT_SIZE_FLAG, FULL_PRECISION_FLAG, Params, collect
from . import INT8_TENSORWISE

_SIZE_DEFAULT = INT8_TENSORWISE.default("convrot_groupsize")


@dataclass(frozen=True, slots=True)
class Int8Params(Params):
    convrot: bool = field(default=True, metadata={"help": "ConvRot rotation (SGLang needs it on linear layers)"})
    convrot_groupsize: int = field(
        default=INT8_TENSORWISE.default("convrot_groupsize"),
        metadata={"help": "ConvRot block size (16, 64 or 256 for SGLang)"},
    )
    per_channel: bool = field(default=True, metadata={"help": "row-wise [N, 1] scales (false: one scalar scale)"})

    FORMAT = INT8_TENSORWISE.name
    LABELS = {"convrot_groupsize": "C"}
    FLAGS = (
        (
            "--no-convrot",
            "convrot",
            {"action": "store_const", "const": False, "help": "INT8 without rotation (SGLang loads it on embeddings only)"},
        ),
        CONVROT_SIZE_FLAG,
        (
            "--scalar-scale",
            "per_channel",
            {"action": "store_const", "const": False, "help": "INT8 with one scalar scale (needs --no-convrot)"},
        ),
        FULL_PRECISION_FLAG,
    )

    def check(self, given: dict[str, Any], where: str) -> None:
        if self.convrot and not self.per_channel:
            raise InputError(f"{where}: {self.FORMAT} convrot=true needs per_channel=true (ConvRot scales are row-wise)")
        if not self.convrot and given.get("convrot_groupsize", _SIZE_DEFAULT) != _SIZE_DEFAULT:
            # a size other than the default is a choice the output could not keep (the default
            # is what reading any INT8 marker gives, so it is no contradiction)
            raise InputError(
                f"{where}: {self.FORMAT} convrot_groupsize={given['convrot_groupsize']!r} needs convrot=true "
                "(without rotation the size means nothing; drop one of them)"
            )

    def marker(self) -> dict[str, Any]:
        marker = Params.marker(self)
        if not self.convrot:
            marker.pop("convrot_groupsize", None)  # no rotation: its size means nothing
        return marker

    def encode_kwargs(self) -> dict[str, Any]:
        p = Params.encode_kwargs(self)
        if not self.convrot:
            p.pop("convrot_groupsize")
        return p

    def layout(self) -> dict[str, Any]:
        return {"scale_layout": "row" if self.per_channel else "scalar"}


PARAMS = collect(Int8Params)
