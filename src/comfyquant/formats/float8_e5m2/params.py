"""What ``quantize`` writes as ``float8_e5m2``: the encoder takes no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import FLOAT8_E5M2


@dataclass(frozen=True, slots=True)
class E5M2Params(Params):
    FORMAT = FLOAT8_E5M2.name


PARAMS = collect(E5M2Params)
