"""What ``quantize`` writes as ``float8_e4m3fn``: the encoder takes no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import FLOAT8_E4M3FN


@dataclass(frozen=True, slots=True)
class E4M3Params(Params):
    FORMAT = FLOAT8_E4M3FN.name


PARAMS = collect(E4M3Params)
