"""Pieces several dialects share: exact scalar-scale moves, prefixes, runtime wording."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from ..dtypes import MODEL_FLOAT_DTYPES
from ..findings import Finding
from ..numerics import bytewise
from .base import EXACT, Move

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from .base import Translation

FLOAT_SCALE_DTYPES = MODEL_FLOAT_DTYPES
"""Scale dtypes whose values upcast to F32 exactly."""

DIFFUSION_ROOTS = ("model.diffusion_model.", "diffusion_model.")
"""Where ComfyUI's all-in-one checkpoints keep the diffusion model (it strips this prefix)."""


def upcast(dtype: str):
    """The byte transform to F32 of a float scale (exact), None when it already is F32."""
    if dtype == "F32":
        return None
    return lambda data, d=dtype: bytewise.to_f32(data, d)


def scalar_scale(entry, prefix: str, suffix: str) -> Move:
    """A one-element float scale (``[]`` or ``[1]``, F32/F16/BF16) as the F32 scalar ``prefix.suffix``
    Comfy formats store: an exact upcast and a reshape of the same element."""
    what = []
    if entry.dtype != "F32":
        what.append(f"{entry.dtype} -> F32 (exact)")
    if tuple(entry.shape) != ():
        what.append(f"{list(entry.shape)} -> []")
    return Move(suffix, entry.name, "F32", (), upcast(entry.dtype), EXACT, ", ".join(what))


def is_scalar_float(entry) -> bool:
    return entry is not None and entry.dtype in FLOAT_SCALE_DTYPES and entry.numel == 1 and len(entry.shape) <= 1


def copy(entry, suffix: str, prefix: str | None = None) -> Move:
    """The tensor carried over as it is (a rename when ``suffix`` differs)."""
    return Move(suffix, entry.name, entry.dtype, tuple(entry.shape))


def drop_unit_scale_input(tr: Translation, value: float) -> bool:
    """Drop a translated layer's ``scale_input`` whose value is 1.0, as ComfyUI does (it runs
    such a layer with dynamic activation scales), so the migrated file behaves as ComfyUI ran
    it; True when dropped.  A refused or lossy layer (no format) keeps its inputs as they are."""
    si = tr.inputs.get("scale_input")
    if si is None or tr.format is None or value != 1.0:
        return False
    tr.moves = [m for m in tr.moves if m.source != si.name]
    tr.drops.append(si.name)
    tr.dropped_why = "scale_input == 1.0, which ComfyUI drops (dynamic activations)"
    return True


def unit_scale_inputs(ones: list[str], kind: str, effect: str, cause: str, fix: str) -> list[Finding]:
    """The one info finding on the ``kind`` layers ``ones`` whose ``scale_input == 1.0`` was
    dropped (``drop_unit_scale_input``), and what that does (``effect``); none when none was."""
    if not ones:
        return []
    says = f"{len(ones)} {kind} layer(s) have scale_input == 1.0 (e.g. {ones[0]}): {effect}"
    return [Finding("F004", says, severity="info", cause=cause, fix=fix)]


def root_of(name: str) -> str:
    """The diffusion-model prefix a tensor name starts with ("" when none)."""
    return next((r for r in DIFFUSION_ROOTS if name.startswith(r)), "")


def float_scalar(data: bytes, dtype: str) -> float:
    """The value of a one-element F32/F16/BF16 tensor's bytes (NaN for a short read: the
    container findings say why; such a scale is unusable)."""
    if len(data) < (4 if dtype == "F32" else 2):
        return float("nan")
    if dtype == "F32":
        return struct.unpack("<f", data[:4])[0]
    if dtype == "F16":
        return struct.unpack("<e", data[:2])[0]
    return struct.unpack("<f", b"\0\0" + data[:2])[0]  # BF16: the high half of an F32


TWO_LEVEL_SCALE = "scale_weight_tensor"
"""musubi-tuner's two-level block mode's per-tensor factor (``<layer>.scale_weight_tensor``):
not a layer suffix the format registry knows, so a checkpoint lists it among its non-layer
tensors.  A layer that has one is musubi's, even in a file with the legacy sentinel: the
legacy reading (one scale) would drop the factor."""


def two_level_scales(ckpt: Checkpoint) -> dict:
    """``<layer>.scale_weight_tensor`` entries by layer prefix."""
    cut = len(TWO_LEVEL_SCALE) + 1
    return {n[:-cut]: ckpt.tensors[n] for n in ckpt.other_tensors if n.endswith("." + TWO_LEVEL_SCALE)}


LEGACY_SENTINEL = "scaled_fp8"
"""ComfyUI's legacy scaled-FP8 flag tensor, at the diffusion model's prefix (or none)."""


def legacy_sentinels(ckpt: Checkpoint) -> list[str]:
    """The file's ``scaled_fp8`` sentinel tensors: the legacy layout's tell, which musubi's
    files never have."""
    return [n for n in ckpt.other_tensors if n == LEGACY_SENTINEL or n.endswith("." + LEGACY_SENTINEL)]
