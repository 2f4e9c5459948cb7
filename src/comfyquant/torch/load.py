"""``load_quantized``: a Comfy quantized checkpoint into a PyTorch model, layer by layer.

1. Header only: the checkpoint (any file ``comfyquant check`` reads, dialects included,
   through their Comfy view) is checked for comfy-kitchen -- the gate every decoding command
   shares -- and refused with its findings in one line; then every tensor name is matched to
   the model (``strip_prefix`` removed first).  Quantized layers must land on ``nn.Linear``
   modules of the same shape; dense tensors on parameters or buffers of the same shape.
   Missing and unexpected keys are known here, before any data is read: ``strict`` raises.
2. Layer by layer: each quantized layer's tensors are read straight into their final storage
   (positioned reads, no memory map, no intermediate copy), the ``nn.Linear`` is replaced by
   a ``QuantLinear``; each dense tensor is read and assigned (``assign=True``
   semantics: a model built on the meta device gets real tensors without ever allocating its
   dense weights).  Peak host memory: the quantized bytes held by the model plus one tensor
   in flight (one dense layer for a dialect's lossy layer, decoded exactly to F32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..numerics.dtypes import parse_float_dtype
from .linear import QuantLinear, QuantWeight
from .tensors import LoadError, assign_tensor, open_checked, path_label, read_tensor, replace_module

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


class _QuantPlan:
    __slots__ = ("name", "prefix", "entries", "marker", "bias")

    def __init__(self, name, prefix, entries, marker, bias) -> None:
        self.name, self.prefix, self.entries, self.marker, self.bias = name, prefix, entries, marker, bias


def load_quantized(
    model: nn.Module, path, *, device="cpu", dtype=None, strip_prefix: str | None = None, strict: bool = True
) -> LoadReport:
    """Load the checkpoint at ``path`` (file, shards, folder, dialect file) into ``model``.

    ``device``: where the tensors go; ``dtype``: dense floating-point tensors (biases, norms,
    unquantized layers) are cast to it (quantized tensors keep their stored dtypes; a
    ``QuantLinear`` computes in its input's dtype); ``strip_prefix``: removed from
    checkpoint names that start with it (``model.diffusion_model.``); ``strict``: raise
    ``LoadError`` naming every missing or unexpected key before reading any data."""
    from ..markers import file_level_markers

    device = torch.device(device)
    cast = None if dtype is None else parse_float_dtype(dtype)
    label = path_label(path)
    with open_checked(path) as ckpt:
        quants, dense, report = _plan(model, ckpt, file_level_markers(ckpt), strip_prefix, label)
        if strict and (report.missing or report.unexpected):
            raise LoadError(f"refusing to load {label}: " + _problems(report) + " (strict=False loads the rest)")
        modules = dict(model.named_modules())
        for qp in quants:
            tensors = {s: read_tensor(ckpt, e, device, report) for s, e in qp.entries.items()}
            bias = None if qp.bias is None else read_tensor(ckpt, qp.bias, device, report, cast)
            linear = modules[qp.name]
            layer = QuantLinear.from_weight(QuantWeight(tensors, qp.marker, qp.name), bias, linear)
            replace_module(model, qp.name, layer)
            report.quantized[qp.name] = layer.format
            _path, why = layer.compute(device, cast or layer.dtype)
            if why is not None:
                report.fallbacks[qp.name] = why
        for target, entry in dense:
            assign_tensor(model, target, read_tensor(ckpt, entry, device, report, cast))
    return report


def _problems(report: LoadReport) -> str:
    parts = []
    for what, names in (("missing", report.missing), ("unexpected", report.unexpected)):
        if names:
            shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
            parts.append(f"{len(names)} {what} key{'s' * (len(names) > 1)}: {shown}")
    return "; ".join(parts)


def _plan(model: nn.Module, ckpt, implied: dict, strip_prefix: str | None, label: str):
    """Header-only matching of the checkpoint's tensors to the model."""
    modules = dict(model.named_modules())
    # tied parameters are listed under every name the state dict has
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    wanted = set(model.state_dict(keep_vars=True))
    report = LoadReport(label)

    def strip(name: str) -> str:
        return name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name

    quants: list[_QuantPlan] = []
    dense: list[tuple[str, object]] = []
    covered: set[str] = set()
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker if layer.marker is not None else implied.get(prefix)
        if marker is None:
            continue
        name = strip(prefix)
        module = modules.get(name)
        entries = {s: e for s, e in layer.stored.items() if s not in ("bias", "comfy_quant")}
        bias = layer.stored.get("bias")
        names = [e.name for e in layer.stored.values()]
        if module is None or layer.bank is not None or not isinstance(module, (nn.Linear, QuantLinear)):
            if module is not None:
                what = "a MoE expert bank" if layer.bank is not None else f"a {type(module).__name__}"
                raise LoadError(
                    f"{label}: layer {prefix!r} is quantized ({marker.get('format')}) but the model's "
                    f"{name!r} is {what}: only nn.Linear layers load quantized"
                )
            report.unexpected.extend(names)
            continue
        _check_linear(label, prefix, name, module, marker, entries, bias)
        if bias is not None and getattr(module, "bias", None) is None:
            report.unexpected.append(bias.name)
            bias = None
        quants.append(_QuantPlan(name, prefix, entries, marker, bias))
        used = [e.name for e in entries.values()] + ([bias.name] if bias is not None else [])
        if "comfy_quant" in layer.stored:
            used.append(layer.stored["comfy_quant"].name)
        report.loaded.extend(used)
        covered.add(f"{name}.weight")
        if bias is not None:
            covered.add(f"{name}.bias")
    done = set(report.loaded) | set(report.unexpected)
    for tensor_name, entry in ckpt.tensors.items():
        if tensor_name in done:
            continue
        name = strip(tensor_name)
        target = targets.get(name)
        if target is None or name in covered:
            report.unexpected.append(tensor_name)
            continue
        if tuple(target.shape) != tuple(entry.shape):
            raise LoadError(
                f"{label}: tensor {tensor_name!r} is {list(entry.shape)}, the model's {name!r} is {list(target.shape)}"
            )
        dense.append((name, entry))
        covered.add(name)
        report.loaded.append(tensor_name)
    report.missing = sorted(n for n in wanted if n not in covered)
    report.loaded = sorted(set(report.loaded))
    return quants, dense, report


def _check_linear(label, prefix, name, module, marker, entries, bias) -> None:
    """The quantized layer fits the module: its codec's geometry against in/out features."""
    from .. import codecs
    from ..formats.codec import CodecError
    from ..formats.registry import FORMATS

    fmt = marker.get("format")
    if not codecs.has(fmt):
        raise LoadError(f"{label}: layer {prefix!r}: format {fmt!r} cannot run here")
    metas = dict(entries)
    if bias is not None:
        metas["bias"] = bias
    try:
        n, k = codecs.get(fmt).plan(metas, marker, prefix).shape
    except CodecError as exc:
        raise LoadError(f"{label}: {exc}") from None
    rows, cols = FORMATS[fmt].pad
    out_f, in_f = module.out_features, module.in_features
    if (n, k) not in ((out_f, in_f), (-(-out_f // rows) * rows, -(-in_f // cols) * cols)):
        raise LoadError(
            f"{label}: layer {prefix!r} holds a [{n}, {k}] {fmt} weight, the model's {name!r} is nn.Linear({in_f}, {out_f})"
        )
