"""What ``quantize`` writes as ``float8_e4m3fn`` / ``float8_e5m2``: the encoders take no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import FLOAT8_E4M3FN, FLOAT8_E5M2


@dataclass(frozen=True, slots=True)
class E4M3Params(Params):
    FORMAT = FLOAT8_E4M3FN.name
    RANK = 5


@dataclass(frozen=True, slots=True)
class E5M2Params(Params):
    FORMAT = FLOAT8_E5M2.name
    RANK = 6


PARAMS = collect(E4M3Params, E5M2Params)
