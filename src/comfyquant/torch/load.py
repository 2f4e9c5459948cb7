"""``load_quantized``: a Comfy quantized checkpoint into a PyTorch model, all or nothing.

1. Header only (``matching``): the checkpoint (any file ``comfyquant check`` reads, dialects
   included, through their Comfy view) is checked for comfy-kitchen -- the gate every decoding
   command shares -- and refused with its findings in one line; then every tensor is given its
   place in the model (``strip_prefix`` removed first).  Quantized layers must land on
   ``nn.Linear`` modules of the same shape that hold nothing a swap would drop (``swap``),
   with markers whose fields have their types; dense tensors on parameters or buffers of the
   same shape and kind of dtype; no two tensors in one place.  Missing and unexpected keys are
   known here, before any data is read: ``strict`` raises.
2. Reading: each quantized layer's tensors are read straight into their final storage
   (positioned reads, no memory map, no intermediate copy) and its ``QuantLinear`` built; each
   dense tensor is read.  The model is not touched yet, so a read or build that fails leaves
   it as it was.
3. The swaps and assignments (``assign=True`` semantics: a model built on the meta device gets
   real tensors without ever allocating its dense weights), made together (``edits``).
   Peak host memory: the quantized and dense bytes the model will hold, plus what the model
   held before (nothing for a meta-device model), plus one dense layer for a dialect's lossy
   layer (decoded exactly to F32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..formats.codec import CodecError
from ..numerics.dtypes import parse_float_dtype
from .edits import Edits
from .linear import QuantLinear, QuantWeight
from .matching import match
from .swap import carry_over
from .tensors import LoadError, open_checked, path_label, read_tensor

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

__all__ = ["LoadError", "LoadReport", "load_quantized"]


@dataclass
class LoadReport:
    """What ``load_quantized`` did: keys are the checkpoint's names (before ``strip_prefix``)."""

    path: str
    loaded: list[str] = field(default_factory=list)
    """Every tensor read into the model (markers included: they are consumed)."""
    missing: list[str] = field(default_factory=list)
    """Model parameters and buffers (model names) the checkpoint does not provide."""
    unexpected: list[str] = field(default_factory=list)
    """Checkpoint tensors no module takes."""
    quantized: dict[str, str] = field(default_factory=dict)
    """Model layer -> format of every layer now a ``QuantLinear``."""
    fallbacks: dict[str, str] = field(default_factory=dict)
    """Model layer -> why it computes with a dequantized weight or operands instead of
    comfy-kitchen's quantized GEMM (marker, device, comfy-kitchen missing)."""
    carried: dict[str, list[str]] = field(default_factory=dict)
    """Model layer -> the hooks moved from the replaced ``nn.Linear`` to its ``QuantLinear``
    (``["1 forward hook"]``)."""
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected

    def __repr__(self) -> str:
        return f"LoadReport({self.summary()}, ok={self.ok})"

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "loaded": self.loaded,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "quantized": self.quantized,
            "fallbacks": self.fallbacks,
            "carried": self.carried,
            "bytes_read": self.bytes_read,
        }

    def problems(self) -> str:
        """The missing and unexpected keys in one clause (what a strict load refuses with)."""
        return _problems(self)

    def summary(self) -> str:
        """One line: counts of each list."""
        return (
            f"{self.path}: {len(self.loaded)} tensors loaded, {len(self.quantized)} quantized layers, "
            f"{len(self.fallbacks)} on dequantized compute, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected"
        )


def load_quantized(
    model: nn.Module, path, *, device="cpu", dtype=None, strip_prefix: str | None = None, strict: bool = True
) -> LoadReport:
    """Load the checkpoint at ``path`` (file, shards, folder, dialect file) into ``model``.

    ``device``: where the tensors go; ``dtype``: dense floating-point tensors (biases, norms,
    unquantized layers) are cast to it (quantized tensors keep their stored dtypes; a
    ``QuantLinear`` computes in its input's dtype); ``strip_prefix``: removed from
    checkpoint names that start with it (``model.diffusion_model.``); ``strict``: raise
    ``LoadError`` naming every missing or unexpected key before reading any data.

    All or nothing: every check is made and every tensor read before the model changes; a
    ``LoadError`` (or any other failure) leaves it with the very modules, parameters and
    buffers it had."""
    from ..markers import file_level_markers

    device = torch.device(device)
    cast = None if dtype is None else parse_float_dtype(dtype)
    label = path_label(path)
    report = LoadReport(label)
    with open_checked(path) as ckpt:
        found = match(model, ckpt, file_level_markers(ckpt), strip_prefix, label)
        report.loaded, report.missing, report.unexpected = found.loaded, found.missing, found.unexpected
        if strict and (report.missing or report.unexpected):
            raise LoadError(f"refusing to load {label}: " + _problems(report) + " (strict=False loads the rest)")
        edits = Edits()
        for sw in found.swaps:
            layer = _quant_layer(ckpt, sw, device, cast, report, label)
            edits.set(sw.parent, sw.leaf, layer)
            report.quantized[sw.name] = layer.format
            _path, why = layer.compute(device, cast or layer.dtype)
            if why is not None:
                report.fallbacks[sw.name] = why
            hooks = carry_over(sw.module, layer)
            if hooks:
                report.carried[sw.name] = hooks
        for d in found.dense:
            value = read_tensor(ckpt, d.entry, device, report, cast)
            if isinstance(d.old, nn.Parameter):
                value = nn.Parameter(value, requires_grad=d.old.requires_grad and value.is_floating_point())
            edits.set(d.owner, d.leaf, value)
    edits.apply()
    return report


def _quant_layer(ckpt: Checkpoint, sw, device, cast, report: LoadReport, label: str) -> QuantLinear:
    """The ``QuantLinear`` of one planned swap, its tensors read (the model is not touched)."""
    tensors = {s: read_tensor(ckpt, e, device, report) for s, e in sw.entries.items()}
    bias = None if sw.bias is None else read_tensor(ckpt, sw.bias, device, report, cast)
    try:
        layer = QuantLinear.from_weight(QuantWeight(tensors, sw.marker, sw.name), bias, sw.module)
    except CodecError as exc:
        raise LoadError(f"{label}: {exc}") from None
    if sw.bias is None and getattr(sw.module, "bias", None) is not None:
        layer.bias = sw.module.bias  # not in the file: the model's own (reported missing)
    return layer


def _problems(report: LoadReport) -> str:
    parts = []
    for what, names in (("missing", report.missing), ("unexpected", report.unexpected)):
        if names:
            shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
            parts.append(f"{len(names)} {what} key{'s' * (len(names) > 1)}: {shown}")
    return "; ".join(parts)
