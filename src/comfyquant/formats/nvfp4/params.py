"""What ``quantize`` writes as ``nvfp4``: the encoder takes no parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Params, collect
from . import NVFP4


@dataclass(frozen=True, slots=True)
class NVFP4Params(Params):
    FORMAT = NVFP4.name


PARAMS = collect(NVFP4Params)
