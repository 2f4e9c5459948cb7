"""What ``quantize`` writes as ``rowwise-float8_e4m3fn``: the encoder takes no parameters, and
the one every format has, ``full_precision_matrix_mult``, is refused: SGLang's rowwise map
names each layer's format only, with no per-layer flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InputError
from ..params import Params, collect
from . import ROWWISE_FLOAT8_E4M3FN


@dataclass(frozen=True, slots=True)
class RowwiseFP8Params(Params):
    FORMAT = ROWWISE_FLOAT8_E4M3FN.name

    def check(self, given: dict[str, Any], where: str) -> None:
        if self.full_precision_matrix_mult:
            raise InputError(
                f"{where}: {self.FORMAT} has no full_precision_matrix_mult: SGLang's rowwise map carries no per-layer flags"
            )


PARAMS = collect(RowwiseFP8Params)
