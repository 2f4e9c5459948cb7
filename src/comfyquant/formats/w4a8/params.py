"""What ``quantize`` writes as ``asym_w4a8_int8``: the "loads in every runtime" profile (4-bit
codebook rows, FP8 group scales) and the knobs of comfy-kitchen's quantizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError
from ..params import CONVROT_SIZE_FLAG, FULL_PRECISION_FLAG, Params, collect
from . import ASYM_W4A8_INT8, GROUP_SIZE, six_bit_group_ok

CONVROT_GROUPSIZE = ASYM_W4A8_INT8.default("convrot_groupsize")

SCALE_DTYPES = {"fp8": "float8_e4m3fn", "f32": "float32"}
"""``scale_dtype`` values -> the encoder's names."""


@dataclass(frozen=True, slots=True)
class W4A8Params(Params):
    group_size: int = GROUP_SIZE
    convrot_groupsize: int = CONVROT_GROUPSIZE
    bits: int = field(default=4, metadata={"choices": (4, 6), "help": "4, or 6 (W6A8: ComfyUI and comfy-kitchen only)"})
    symmetric: bool = field(default=True, metadata={"help": "false: asymmetric with an F32 correction (ComfyUI drops it)"})
    codebook: bool = field(default=True, metadata={"help": "4-bit symmetric: code -> level table (false: uniform levels)"})
    scale_dtype: str = field(
        default="fp8", metadata={"choices": tuple(SCALE_DTYPES), "help": "group scales: fp8 (every runtime) or f32 (not SGLang)"}
    )
    convrot: bool = field(
        default=True, metadata={"choices": (True,), "help": "always true: W4A8 always rotates (SGLang requires the key)"}
    )

    FORMAT = ASYM_W4A8_INT8.name
    LABELS = {"group_size": "G", "convrot_groupsize": "C"}
    FLAGS = (
        ("--group-size", "group_size", {"type": int, "metavar": "G", "help": "W4A8 scale group size (default {default})"}),
        CONVROT_SIZE_FLAG,
        ("--bits", "bits", {"type": int, "choices": [4, 6], "help": "W4A8 bit depth (6: not for SGLang)"}),
        (
            "--asymmetric",
            "symmetric",
            {"action": "store_const", "const": False, "help": "W4A8 asymmetric with an F32 correction (ComfyUI drops it)"},
        ),
        (
            "--no-codebook",
            "codebook",
            {"action": "store_const", "const": False, "help": "W4A8 4-bit symmetric with uniform levels instead of the codebook"},
        ),
        ("--scale-dtype", "scale_dtype", {"choices": list(SCALE_DTYPES), "help": "W4A8 group scale dtype (f32: not for SGLang)"}),
        FULL_PRECISION_FLAG,
    )

    def check(self, given: dict[str, Any], where: str) -> None:
        name = self.FORMAT
        if self.bits == 6:
            if not self.symmetric:
                raise InputError(f"{where}: {name} bits=6 is symmetric only (drop symmetric=false)")
            if given.get("codebook") is True:
                raise InputError(f"{where}: {name} bits=6 is uniform: no codebook (drop codebook=true)")
            if not six_bit_group_ok(self.group_size):
                raise InputError(f"{where}: {name} bits=6 needs group_size a multiple of 16, got {self.group_size}")
        if not self.symmetric and given.get("codebook") is True:
            raise InputError(f"{where}: {name} symmetric=false has no codebook (drop codebook=true)")

    def encode_kwargs(self) -> dict[str, Any]:
        p = Params.encode_kwargs(self)
        p.pop("convrot")  # a marker flag only: the codec always rotates
        p["scale_dtype"] = SCALE_DTYPES[self.scale_dtype]
        p["codebook"] = self.has_codebook
        return p

    @property
    def has_codebook(self) -> bool:
        """Only 4-bit symmetric rows have a codebook (6-bit and asymmetric rows are uniform)."""
        return self.codebook and self.symmetric and self.bits != 6

    def stored_dtypes(self) -> dict[str, str]:
        return {"weight_s_rel": "F32"} if self.scale_dtype == "f32" else {}

    def layout(self) -> dict[str, Any]:
        return {"bits": self.bits, "has_codebook": self.has_codebook, "has_correction": not self.symmetric}


PARAMS = collect(W4A8Params)
