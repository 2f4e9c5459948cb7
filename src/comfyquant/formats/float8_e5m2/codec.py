"""The ``float8_e5m2`` codec: per-tensor FP8 arithmetic with the E5M2 element type."""

from __future__ import annotations

from ...numerics.floats import E5M2
from ..fp8.codec import FP8Codec

CODECS = {"float8_e5m2": FP8Codec("float8_e5m2", E5M2)}
