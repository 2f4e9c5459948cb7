"""What ``quantize`` writes as ``rowwise-float8_e4m3fn``: the encoder takes no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import ROWWISE_FLOAT8_E4M3FN


@dataclass(frozen=True, slots=True)
class RowwiseFP8Params(Params):
    FORMAT = ROWWISE_FLOAT8_E4M3FN.name


PARAMS = collect(RowwiseFP8Params)
