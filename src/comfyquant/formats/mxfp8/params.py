"""What ``quantize`` writes as ``mxfp8``: the encoder takes no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import MXFP8


@dataclass(frozen=True, slots=True)
class MXFP8Params(Params):
    FORMAT = MXFP8.name


PARAMS = collect(MXFP8Params)
