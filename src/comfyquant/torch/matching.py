"""The header-only half of ``load_quantized``: where every checkpoint tensor goes in the model.

Every decision and every check is made here, before a byte of tensor data is read and before
the model is touched: which ``nn.Linear`` each quantized layer replaces (its marker's field
types, its geometry against the module, what the module holds that the swap would drop),
which parameter or buffer each dense tensor replaces (shape, kind of dtype), and that no two
checkpoint tensors land in the same place.  Destinations are resolved to module objects now,
while the model is as the user built it, so a later swap cannot redirect a tensor into the
module that replaced its owner (a dense ``fc.weight_scale`` into a quantized layer's scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..numerics.dtypes import TORCH_DTYPES
from .linear import QuantLinear
from .marker_fields import marker_problem
from .swap import lost_state
from .tensors import DENSE_TORCH_DTYPES, LoadError

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint


@dataclass
class LayerSwap:
    """One quantized layer: the module it replaces and where that module sits."""

    name: str
    """Model name of the layer."""
    prefix: str
    """Checkpoint name of the layer."""
    entries: dict
    """Suffix -> header entry of the stored tensors (no bias, no marker)."""
    marker: dict
    bias: object | None
    """The file's bias entry; None: the layer keeps the module's own bias (if any)."""
    module: nn.Module
    parent: nn.Module
    leaf: str


@dataclass
class DenseLoad:
    """One dense tensor: the attribute of the module object it replaces."""

    name: str
    """Model name of the parameter or buffer."""
    entry: object
    owner: nn.Module
    leaf: str
    old: torch.Tensor


@dataclass
class Matching:
    swaps: list[LayerSwap] = field(default_factory=list)
    dense: list[DenseLoad] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def tensor_kind(dtype: torch.dtype) -> str:
    """What a tensor's values are, as far as a load may change its dtype: a dense float may
    become another dense float (``dtype=``, or the file's); codes never become values."""
    if dtype in DENSE_TORCH_DTYPES:
        return "floating-point"
    if dtype.is_floating_point:
        return "8-bit float codes"
    if dtype == torch.bool:
        return "boolean"
    if dtype.is_complex:
        return "complex"
    return "integer"


def state_names(model: nn.Module) -> list[str]:
    """The model's state-dict names (persistent buffers and extra state included, every path
    of a shared module listed)."""
    return list(model.state_dict(keep_vars=True))


def match(model: nn.Module, ckpt: Checkpoint, implied: dict, strip_prefix: str | None, label: str) -> Matching:
    """Where every tensor of ``ckpt`` goes in ``model``; raises ``LoadError`` (one line naming
    the layer or tensor) on anything that cannot load."""
    modules = dict(model.named_modules(remove_duplicate=False))
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    out = Matching()

    def strip(name: str) -> str:
        return name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name

    slots: dict[tuple[int, str], str] = {}  # (id(module), attribute) -> checkpoint name that fills it

    def claim(module: nn.Module, leaf: str, what: str, model_name: str) -> None:
        key = (id(module), leaf)
        if key in slots:
            raise LoadError(
                f"{label}: {slots[key]!r} and {what!r} both load into the model's {model_name!r}"
                + (" (after strip_prefix)" if strip_prefix else " (one module under two names)")
            )
        slots[key] = what

    covered: set[str] = set()
    swapped: dict[int, str] = {}  # id(replaced module) -> checkpoint layer
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker if layer.marker is not None else implied.get(prefix)
        if marker is None:
            continue
        problem = marker_problem(marker, f"layer {prefix!r}")
        if problem is not None:
            raise LoadError(f"{label}: {problem}")
        name = strip(prefix)
        module = modules.get(name)
        names = [e.name for e in layer.stored.values()]
        if module is None:
            out.unexpected.extend(names)
            continue
        fmt = marker["format"]
        if layer.bank is not None or not isinstance(module, (nn.Linear, QuantLinear)):
            what = "a MoE expert bank" if layer.bank is not None else f"a {type(module).__name__}"
            raise LoadError(
                f"{label}: layer {prefix!r} is quantized ({fmt}) but the model's {name!r} is {what}: "
                "only nn.Linear layers load quantized"
            )
        if name == "":
            raise LoadError(f"{label}: layer {prefix!r} would replace the model itself (an nn.Linear): wrap it in a module")
        lost = lost_state(module)
        if lost is not None:
            raise LoadError(
                f"{label}: layer {prefix!r}: the model's {name!r} ({type(module).__name__}) holds {lost} "
                "besides its weight and bias; a QuantLinear in its place would drop it "
                "(load into plain nn.Linear layers, or keep it outside the linear)"
            )
        entries = {s: e for s, e in layer.stored.items() if s not in ("bias", "comfy_quant")}
        bias = layer.stored.get("bias")
        _check_geometry(label, prefix, name, module, marker, entries, bias)
        if bias is not None and getattr(module, "bias", None) is None:
            out.unexpected.append(bias.name)
            bias = None
        if bias is not None and tensor_kind(TORCH_DTYPES.get(bias.dtype, torch.uint8)) != "floating-point":
            raise LoadError(f"{label}: layer {prefix!r}: bias {bias.name!r} is {bias.dtype}, not a dense float")
        parent_name, _, leaf = name.rpartition(".")
        parent = modules[parent_name]
        claim(parent, leaf, prefix, name)
        swapped[id(module)] = prefix
        out.swaps.append(LayerSwap(name, prefix, entries, marker, bias, module, parent, leaf))
        used = [e.name for e in entries.values()] + ([bias.name] if bias is not None else [])
        if "comfy_quant" in layer.stored:
            used.append(layer.stored["comfy_quant"].name)
        out.loaded.extend(used)
        kept_bias = bias is None and getattr(module, "bias", None) is not None
        covered.update(n for n in _module_state(name, module) if not (kept_bias and n == f"{name}.bias"))

    done = set(out.loaded) | set(out.unexpected)
    for tensor_name, entry in ckpt.tensors.items():
        if tensor_name in done:
            continue
        name = strip(tensor_name)
        target = targets.get(name)
        if target is None:
            out.unexpected.append(tensor_name)
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = modules[owner_name]
        if id(owner) in swapped:
            raise LoadError(
                f"{label}: tensor {tensor_name!r} loads into the model's {name!r}, "
                f"whose module the quantized layer {swapped[id(owner)]!r} replaces"
            )
        claim(owner, leaf, tensor_name, name)
        if tuple(target.shape) != tuple(entry.shape):
            raise LoadError(
                f"{label}: tensor {tensor_name!r} is {list(entry.shape)}, the model's {name!r} is {list(target.shape)}"
            )
        stored = TORCH_DTYPES.get(entry.dtype)
        if stored is None:
            raise LoadError(f"{label}: tensor {tensor_name!r} has dtype {entry.dtype}, which torch cannot hold")
        if tensor_kind(stored) != tensor_kind(target.dtype):
            raise LoadError(
                f"{label}: tensor {tensor_name!r} is {entry.dtype} ({tensor_kind(stored)}), the model's {name!r} is "
                f"{str(target.dtype).replace('torch.', '')} ({tensor_kind(target.dtype)})"
            )
        out.dense.append(DenseLoad(name, entry, owner, leaf, target))
        covered.add(name)
        out.loaded.append(tensor_name)
    out.missing = sorted(n for n in set(state_names(model)) if n not in covered)
    out.loaded = sorted(set(out.loaded))
    return out


def _module_state(name: str, module: nn.Module) -> list[str]:
    """The state names the module at ``name`` has (it has no submodules: ``lost_state``)."""
    own = (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False))
    return [f"{name}.{n}" for n, _t in own]


def _check_geometry(label, prefix, name, module, marker, entries, bias) -> None:
    """The quantized layer fits the module: its codec's geometry against in/out features."""
    from .. import codecs
    from ..formats.codec import CodecError
    from ..formats.registry import FORMATS

    fmt = marker["format"]
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
