"""``load_transformer``: a Comfy quantized single file into a diffusers transformer class.

1. The checkpoint (any format, any dialect through its Comfy view) is checked for
   comfy-kitchen -- the gate of every decoding command -- and read: each quantized layer's
   tensors and marker become one ``ComfyQuantParameter`` under
   ``<layer>.weight`` (positioned reads into their final storage); dense tensors are read and
   cast to ``torch_dtype`` one at a time.  Nothing dense is made of a quantized layer.
2. diffusers' own converter (``SINGLE_FILE_LOADABLE_CLASSES[cls]["checkpoint_mapping_fn"]``)
   renames, splits and fuses that dict; the parameters carry their scales through it exactly
   or raise naming the layer.
3. The model is built from its config with its parameters on the meta device (buffers it
   computes in ``__init__`` stay real), each linear whose weight arrived quantized becomes a
   ``QuantLinear``, every other tensor is assigned.  Peak host memory:
   the quantized bytes and the dense tensors the model keeps, plus one layer in flight.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..formats.registry import FORMATS
from ..torch.linear import QuantLinear, QuantWeight
from ..torch.load import LoadReport
from ..torch.tensors import LoadError, assign_tensor, open_checked, path_label, read_tensor, replace_module
from . import flux_width
from .parameter import ComfyQuantParameter, InexactOperation
from .versions import require_diffusers

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

COMFY_PREFIX = "model.diffusion_model."
"""What ComfyUI files put before every transformer tensor; removed for every class (diffusers'
Flux.2 converter would otherwise misparse block indices, Qwen-Image's identity converter keep it)."""


def load_transformer(
    path,
    cls,
    *,
    config=None,
    subfolder: str | None = None,
    torch_dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    strict: bool = True,
) -> nn.Module:
    """Load the ComfyUI/BFL-named single file at ``path`` into the diffusers class ``cls``
    (the class or its name); returns the model in eval mode, its ``LoadReport``
    as ``model.comfyquant_report``.

    ``config``: a dict, a local folder (with ``subfolder``) or ``config.json`` file, or a repo id
    already in the local Hugging Face cache; None: the one diffusers' ``from_single_file``
    infers, read from the local cache only.  ``torch_dtype``: dense tensors (biases, norms,
    layers kept dense) and the dtype quantized layers compute in by default.  ``strict``:
    raise ``LoadError`` naming every missing or unexpected key.
    Raises ``LoadError`` (one line, naming the file and the layer) for
    an inexact split or join, a layer that lands on no ``nn.Linear``, and an unsupported
    diffusers."""
    diffusers = require_diffusers()
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    cls = _resolve_class(diffusers, cls)
    mapping = SINGLE_FILE_LOADABLE_CLASSES.get(cls.__name__)
    if not isinstance(mapping, dict):  # None: no entry (diffusers types its table's values as object)
        raise LoadError(f"diffusers {diffusers.__version__} has no single-file converter for {cls.__name__}")
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise LoadError(f"torch_dtype must be a floating-point torch.dtype, got {torch_dtype!r}")
    device = torch.device(device)
    label = path_label(path)
    report = LoadReport(label)
    with open_checked(path) as ckpt:
        checkpoint, origin = _read_checkpoint(ckpt, torch_dtype, device, report)
        file_tensors = list(ckpt.tensors)
    model_config = _config(cls, mapping, config, subfolder, checkpoint, label)
    named = {(k[len(COMFY_PREFIX) :] if k.startswith(COMFY_PREFIX) else k): v for k, v in checkpoint.items()}
    if len(named) != len(checkpoint):
        raise LoadError(f"{label}: tensor names collide once {COMFY_PREFIX!r} is removed")
    converter = mapping["checkpoint_mapping_fn"]
    leftover = dict(named)
    widened = flux_width.stand_in(converter, leftover, label)  # a Flux of another width than 3072
    try:
        converted = converter(checkpoint=leftover, config=model_config)
        if widened is not None:
            flux_width.put_back(converted, *widened)
    except InexactOperation as exc:
        raise LoadError(f"{label}: {exc}") from None
    except (KeyError, IndexError, ValueError, TypeError, RuntimeError) as exc:
        raise LoadError(
            f"{label}: diffusers' {cls.__name__} converter failed ({type(exc).__name__}: {exc}): "
            f"is this a {cls.__name__} checkpoint?"
        ) from None
    kept = {id(v) for v in converted.values()}
    dropped = {k: v for k, v in leftover.items() if id(v) not in kept}  # what diffusers would drop silently

    with _empty_parameters():
        model = cls.from_config(model_config)
    _load_converted(model, converted, dropped, origin, file_tensors, report, torch_dtype, device, label, strict)
    _cast_dense(model, torch_dtype)
    model.eval()
    model.comfyquant_report = report
    return model


def _cast_dense(model: nn.Module, dtype: torch.dtype) -> None:
    """What ``from_single_file`` ends with (``model.to(torch_dtype)``) for everything but the
    quantized layers: buffers the model computed itself (RoPE tables) in ``dtype``.  A
    ``QuantLinear`` is skipped rather than cast: its ``_apply`` keeps the stored tensors, but
    only after computing (and dropping) a cast of each FP8 one."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            continue
        for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if t.is_floating_point() and t.dtype != dtype:
                cast = t.detach().to(dtype)
                # setattr keeps a buffer's persistence; a parameter stays a parameter
                setattr(module, name, nn.Parameter(cast, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else cast)


def _resolve_class(diffusers, cls):
    if isinstance(cls, str):
        found = getattr(diffusers, cls, None)
        if found is None:
            raise LoadError(f"diffusers {diffusers.__version__} has no class {cls!r}")
        return found
    if not isinstance(cls, type):
        raise LoadError(f"cls must be a diffusers model class or its name, got {cls!r}")
    return cls


def _read_checkpoint(ckpt: Checkpoint, dtype: torch.dtype, device: torch.device, report: LoadReport):
    """Checkpoint name -> tensor or ``ComfyQuantParameter``, and the file names behind each
    dense value (by storage, so views a converter makes still name their file tensor)."""
    from ..markers import file_level_markers

    implied = file_level_markers(ckpt)
    checkpoint: dict[str, torch.Tensor] = {}
    origin: dict[int, str] = {}
    taken: set[str] = set()
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker if layer.marker is not None else implied.get(prefix)
        if marker is None:
            continue
        if layer.bank is not None:
            raise LoadError(
                f"{report.path}: layer {prefix!r} is a quantized MoE expert bank: diffusers' converters take no banks"
            )
        entries = {s: e for s, e in layer.stored.items() if s not in ("bias", "comfy_quant")}
        names = [e.name for e in layer.stored.values()]
        tensors = {s: read_tensor(ckpt, e, device, report) for s, e in entries.items()}
        bias = None
        if "bias" in layer.stored:
            bias = read_tensor(ckpt, layer.stored["bias"], device, report, dtype)
            checkpoint[f"{prefix}.bias"] = bias
            origin[_key(bias)] = layer.stored["bias"].name
        try:
            param = ComfyQuantParameter.from_layer(
                tensors,
                marker,
                prefix,
                dtype,
                names=[n for n in names if n != getattr(layer.stored.get("bias"), "name", None)],
                bias=bias,
            )
        except Exception as exc:  # noqa: BLE001 -- a codec's refusal of the layer, said in one line
            raise LoadError(f"{report.path}: layer {prefix!r}: {exc}") from None
        checkpoint[f"{prefix}.weight"] = param
        taken.update(names)
    for name, entry in ckpt.tensors.items():
        if name in taken:
            continue
        t = read_tensor(ckpt, entry, device, report, dtype)
        checkpoint[name] = t
        origin[_key(t)] = name
    return checkpoint, origin


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else id(t)


def _config(cls, mapping: Mapping, config, subfolder: str | None, checkpoint: dict, label: str) -> dict:
    """The model config as a dict: given, read from a local folder/file, or inferred the way
    ``from_single_file`` infers it and read from the local cache (no network)."""
    if isinstance(config, Mapping):
        return dict(config)
    if config is None:
        from diffusers.loaders.single_file_utils import fetch_diffusers_config

        try:
            inferred = fetch_diffusers_config(checkpoint)
        except Exception as exc:  # noqa: BLE001 -- diffusers' inference found no model type
            raise LoadError(
                f"{label}: diffusers cannot infer the model type ({type(exc).__name__}: {exc}); "
                "pass config= (a dict or a local folder with config.json)"
            ) from None
        config = inferred["pretrained_model_name_or_path"]
        subfolder = subfolder or mapping.get("default_subfolder") or inferred.get("subfolder")
        where = f"diffusers' default config {config!r} (subfolder {subfolder!r})"
    else:
        where = f"config {os.fspath(config)!r}" + (f" (subfolder {subfolder!r})" if subfolder else "")
    path = os.fspath(config)
    try:
        if os.path.isfile(path):
            import json

            with open(path, encoding="utf-8") as f:
                return dict(json.load(f))
        return dict(cls.load_config(path, subfolder=subfolder, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 -- missing folder, no cache, bad JSON: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoadError(
            f"{label}: cannot read {where} without network ({first}); pass config= as a dict or a local folder with config.json"
        ) from None


@contextmanager
def _empty_parameters() -> Iterator[None]:
    """Build a module with every parameter on the meta device (never allocated or initialised)
    while the buffers its ``__init__`` computes (RoPE tables ...) stay real: what
    ``accelerate.init_empty_weights()`` does, without needing accelerate."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None:
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    # Swapping torch's method for the context is the point here; the stubs forbid assigning one.
    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _load_converted(
    model: nn.Module,
    converted: dict,
    dropped: dict,
    origin: dict[int, str],
    file_tensors: list[str],
    report: LoadReport,
    dtype: torch.dtype,
    device: torch.device,
    label: str,
    strict: bool,
) -> None:
    modules = dict(model.named_modules())
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    wanted = set(model.state_dict(keep_vars=True))

    def file_names(value) -> list[str]:
        if isinstance(value, ComfyQuantParameter):
            return list(value.names)
        name = origin.get(_key(value)) if isinstance(value, torch.Tensor) else None
        return [name] if name else []

    quants: list[tuple[str, ComfyQuantParameter]] = []
    dense: list[tuple[str, torch.Tensor]] = []
    covered: set[str] = set()
    for key, value in dropped.items():  # left in the input by the converter: diffusers drops them silently
        report.unexpected.extend(file_names(value) or [key])
    for key, value in converted.items():
        if isinstance(value, ComfyQuantParameter):
            name = key[: -len(".weight")] if key.endswith(".weight") else None
            module = modules.get(name) if name else None
            if name is None or module is None:
                report.unexpected.extend(value.names or [key])
                continue
            if not isinstance(module, nn.Linear):
                raise LoadError(
                    f"{label}: {value.where()} is quantized ({value.format}) but lands on {name!r}, "
                    f"a {type(module).__name__}: only nn.Linear layers load quantized"
                )
            rows, cols = FORMATS[value.format].pad  # padded storage reads as the model's shape
            out_f, in_f = module.out_features, module.in_features
            if tuple(value.shape) not in ((out_f, in_f), (-(-out_f // rows) * rows, -(-in_f // cols) * cols)):
                raise LoadError(
                    f"{label}: {value.where()} is a [{value.shape[0]}, {value.shape[1]}] weight, the model's "
                    f"{name!r} is nn.Linear({module.in_features}, {module.out_features})"
                )
            quants.append((name, value))
            covered.add(key)
            continue
        target = targets.get(key)
        if target is None or not isinstance(value, torch.Tensor):
            report.unexpected.extend(file_names(value) or [key])
            continue
        if tuple(target.shape) != tuple(value.shape):
            raise LoadError(
                f"{label}: {key!r} ({', '.join(file_names(value)) or 'converted'}) is {list(value.shape)}, "
                f"the model's is {list(target.shape)}"
            )
        dense.append((key, value))
        covered.add(key)
    report.missing = sorted(n for n in wanted if n not in covered)
    report.unexpected = sorted(set(report.unexpected))
    # every file tensor the converter consumed into a key the model takes: all but the unexpected
    # (a converter's copy -- torch.cat([bias]) -- no longer shows its file name, so "loaded" is
    # what remains once the traced unexpected names are taken out)
    report.loaded = sorted(set(file_tensors) - set(report.unexpected))
    if strict and (report.missing or report.unexpected):
        raise LoadError(f"refusing to load {label}: " + report.problems() + " (strict=False loads the rest)")
    for name, param in quants:
        linear = modules[name]
        bias = converted.get(f"{name}.bias") if linear.bias is not None else None
        if bias is not None:
            covered.discard(f"{name}.bias")  # the QuantLinear takes it
            dense = [(k, v) for k, v in dense if k != f"{name}.bias"]
        weight = param.quant
        tensors = {s: t.contiguous() for s, t in weight.tensors.items()}
        layer = QuantLinear.from_weight(QuantWeight(tensors, weight.marker, name), bias, linear)
        layer.compute_dtype = dtype  # diffusers' convention for layers whose weight is not in the compute dtype
        replace_module(model, name, layer)
        report.quantized[name] = layer.format
        _path, why = layer.compute(device, dtype)
        if why is not None:
            report.fallbacks[name] = why
    for key, value in dense:
        assign_tensor(model, key, value if value.device == device else value.to(device))
