"""``fix --reference DENSE``: measure every repaired layer against the original dense weights.

A repair that only moves bytes is exact, but the marker values it writes may be assumptions
(a ConvRot size the file does not record): decoding with a wrong one gives garbage that no
check of the file can see.  With the original weights the question has an answer.  For
each repaired layer the planned output tensors are decoded with the codecs (row blocks, so
memory is the layer's packed tensors and a block) and compared with the reference weight of
the same name; the error a fresh encode of the reference with the same format and
parameters gives is the error of the format itself.  A repair whose error exceeds that by
more than the format's ``reference_factor`` (data in the format description) is refused.
torch is imported only here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..errors import InputError
from ..formats.registry import FORMATS
from .lossy import requantize

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from .edits import Plan

ABS_SLACK = 1e-6
"""Added to every limit: exact formats (a fresh encode with error 0) still allow rounding."""
MAX_ERROR_WITHOUT_ENCODER = 0.5
"""For a format nothing here can encode (AWQ, SVDQuant): an error this large is no
quantization at all (the weights are unrelated)."""


class ReferenceError(InputError):
    """The reference file cannot be used for a repaired layer; the message names both."""


class Measurement:
    """One repaired layer against its original: the relative L2 error of the repaired layer,
    that of a fresh encode of the original (None: the format has no encoder), the limit."""

    __slots__ = ("layer", "format", "error", "fresh", "limit")

    def __init__(self, layer: str, fmt: str, error: float, fresh: float | None, limit: float) -> None:
        self.layer = layer
        self.format = fmt
        self.error = error
        self.fresh = fresh
        self.limit = limit

    @property
    def ok(self) -> bool:
        return self.error <= self.limit

    @property
    def text(self) -> str:
        own = (
            f"a fresh {self.format} encode of the original: {self.fresh:.4f}"
            if self.fresh is not None
            else f"no encoder for {self.format}"
        )
        return f"relative error {self.error:.4f} ({own}; limit {self.limit:.4f})"

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "format": self.format,
            "error": self.error,
            "fresh": self.fresh,
            "limit": self.limit,
            "ok": self.ok,
        }


def measure(ckpt: Checkpoint, plan: Plan, reference: str) -> list[Measurement]:
    """Measure every layer the plan repairs (marker or tensors) against ``reference``."""
    from ..checkpoint import open_checkpoint
    from ..gate import refuse_damage

    layers = [p for p in plan.repaired_layers if _decodable(ckpt, plan, p)]
    if not layers:
        return []
    with open_checkpoint(reference) as ref:
        refuse_damage(ref, "read --reference")
        return [_measure_layer(ckpt, plan, ref, reference, prefix) for prefix in layers]


def _decodable(ckpt: Checkpoint, plan: Plan, prefix: str) -> bool:
    from .. import codecs

    layer = ckpt.layers.get(prefix)
    marker = plan.markers.get(prefix)
    name = marker.get("format") if marker else None
    if layer is None or layer.bank is not None or "weight" not in layer.tensors:
        return False  # no layer (a removed marker), or an expert bank (fix copies banks as stored)
    return isinstance(name, str) and codecs.has(name) and all(r != prefix for r, _ in plan.refused)


def _measure_layer(ckpt: Checkpoint, plan: Plan, ref: Checkpoint, ref_path: str, prefix: str) -> Measurement:
    from .. import codecs
    from ..formats.codec import CodecError

    marker = plan.markers[prefix]
    codec = codecs.get(marker["format"])
    tensors = _output_tensors(ckpt, plan, prefix)
    try:
        codec_plan = codec.plan(tensors, marker, prefix)
    except CodecError as exc:
        raise ReferenceError(f"cannot decode repaired layer {prefix!r} to measure it: {exc}") from None
    original = _reference_rows(ref, ref_path, prefix, codec_plan.shape)
    error = _relative_error(codec.iter_decode(tensors, marker, dtype=torch.float32, plan=codec_plan), original)
    fmt = FORMATS[marker["format"]]
    fresh = None
    if codec.can_encode and fmt.encode_params is not None:
        params = fmt.encode_params(codec_plan.env, tensors)
        try:
            encoded = codec.encode(original, layer=prefix, **params)
        except CodecError as exc:
            raise ReferenceError(
                f"{ref_path}: cannot encode {prefix}.weight as {fmt.name} to measure the format's own error: {exc}"
            ) from None
        fresh = _relative_error(codec.iter_decode(dict(encoded), encoded.marker, dtype=torch.float32, layer=prefix), original)
        limit = fmt.reference_factor * fresh + ABS_SLACK
    else:
        limit = MAX_ERROR_WITHOUT_ENCODER
    return Measurement(prefix, fmt.name, error, fresh, limit)


def _output_tensors(ckpt: Checkpoint, plan: Plan, prefix: str) -> dict[str, torch.Tensor]:
    """The layer's tensors as ``fix`` will write them: edits and renames applied, re-quantized
    tensors computed (and the result cached for the writer)."""
    from ..numerics.dtypes import from_bytes

    layer = ckpt.layers[prefix]
    out: dict[str, torch.Tensor] = {}
    op = plan.requant.get(prefix)
    if op is not None:
        for suffix, data in requantize(ckpt, op, keep=True).items():
            dtype, shape = op.specs[suffix]
            out[suffix] = from_bytes(bytearray(data), dtype, shape)
    for suffix, entry in layer.tensors.items():
        name = entry.name
        if suffix == "comfy_quant" or name in plan.drop or (op is not None and suffix in op.replaces):
            continue
        new_name = plan.renames.get(name, name)
        edit = plan.edits.get(name)
        data = ckpt.read_bytes(entry)
        dtype, shape = entry.dtype, entry.shape
        if edit is not None:
            new_name, dtype, shape = edit.name, edit.dtype, edit.shape
            if edit.transform is not None:
                data = edit.transform(data)
        out[new_name.rsplit(".", 1)[-1]] = from_bytes(bytearray(data), dtype, shape)
    return out


def _reference_rows(ref: Checkpoint, ref_path: str, prefix: str, shape: tuple[int, int]):
    """The original weight as a row source read from the reference file block by block."""
    from ..comparison import file_rows, reference_weight

    entry = reference_weight(ref, ref_path, prefix, shape, ReferenceError, role="repaired layer", verb="decodes to")
    return file_rows(ref.source(entry.file), entry, ReferenceError)


def _relative_error(blocks, original) -> float:
    """``||decoded - original|| / ||original||`` over row blocks (the quality report's sums)."""
    from ..numerics.closeness import error_sums, relative_l2

    acc = torch.zeros(4, dtype=torch.float64)
    r0 = 0
    for block in blocks:
        r1 = r0 + block.shape[0]
        acc += error_sums(block.to(torch.float32), original.rows(r0, r1).to(torch.float32))
        r0 = r1
    diff, norm = float(acc[0]), float(acc[1])
    return math.inf if not math.isfinite(diff) else relative_l2(diff, norm)
