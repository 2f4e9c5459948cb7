"""``quantize_`` and ``save_quantized``: an in-memory model quantized with ``comfyquant
quantize``'s own planner and codecs, and written as a Comfy checkpoint by its writer.

The model's ``nn.Linear`` layers are described to the quantizer as a virtual checkpoint
(names, dtypes and shapes only), so every per-layer decision -- which rule or ``format``
applies, ``exclude``, embeddings, shapes a format or the target cannot take, format
combinations a runtime refuses -- is exactly what the command decides for the same weights
in a file.  Each chosen layer is encoded by its format's codec (as the command's workers do)
and replaced by a ``QuantLinear`` holding the encoded tensors.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..errors import InputError
from ..numerics.dtypes import DTYPE_NAMES, dtype_name, to_bytes
from .linear import QuantLinear, QuantWeight


def quantize_(
    model: nn.Module, format: str | None = None, rules=None, *, exclude: list[str] | tuple = (), target="all", **params
) -> dict[str, str]:
    """Quantize ``model``'s ``nn.Linear`` layers in place; returns layer -> what was done
    (the format and parameters, or why the layer stays dense).

    ``format`` and ``params`` (e.g. ``format="w4a8", group_size=32``) as ``--format`` and
    its flags; ``rules``: a rules file path, a parsed ``Rules``
    or a dict in the rules-file layout; ``exclude``: regular expressions of layers to keep;
    ``target``: the runtimes the result must load in.  Raises
    ``InputError`` with the command's messages."""
    from .. import codecs
    from ..checkpoint import open_checkpoint
    from ..io.shards import ShardSet
    from ..quantizer.layout import skeleton
    from ..quantizer.params import resolve_format, validate
    from ..quantizer.plan import QUANTIZE, Options, build_plan
    from ..quantizer.rules import Choice, Rules, load_rules, parse_rules

    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if "" in linears:
        raise InputError("quantize_: the model is a bare nn.Linear; wrap it in a module so the layer has a name")
    default = None
    given = {k: v for k, v in params.items() if v is not None}
    if format is not None:
        name = resolve_format(format, "format")
        default = Choice(name, validate(name, given, "format"), "format=")
    elif given:
        raise InputError(f"format parameters ({', '.join(sorted(given))}) need format=")
    if isinstance(rules, dict):
        rules = parse_rules(rules, "rules")
    elif rules is not None and not isinstance(rules, Rules):
        rules = load_rules(os.fspath(rules))
    if default is None and rules is None:
        raise InputError("quantize_: give format= or rules=")
    tensors: dict = {}
    for name, m in linears.items():
        if m.weight.device.type == "meta":
            raise InputError(f"quantize_: layer {name!r} is on the meta device: load its weights first")
        tensors[f"{name}.weight"] = (_header_dtype(m.weight, name), tuple(m.weight.shape), None)
        if m.bias is not None:
            tensors[f"{name}.bias"] = (_header_dtype(m.bias, name), tuple(m.bias.shape), None)
    source = skeleton("model", tensors, None)
    with open_checkpoint(["model"], sources=[source], shardset=ShardSet(files=["model"])) as ckpt:
        plan = build_plan(ckpt, "quantize", Options(rules, default, list(exclude), target))
    done: dict[str, str] = {}
    for lp in plan.layers:
        if lp.action != QUANTIZE:
            done[lp.name] = lp.reason or lp.action
            continue
        m = linears[lp.name]
        fmt, chosen, marker = lp.format, lp.params, lp.marker
        if fmt is None or chosen is None or marker is None:  # the plan sets all three on a layer it quantizes
            raise InputError(f"{lp.name}: the plan quantizes it into no format")
        enc = codecs.get(fmt).encode(m.weight.detach().cpu(), layer=lp.name, **chosen.encode_kwargs())
        stored = {}
        for suffix, (dtype, shape) in lp.planned.items():
            t = enc[suffix]
            if dtype_name(t.dtype) != dtype:  # an exact upcast the plan asks for (the command's rule)
                t = t.to(torch.float32)
            if tuple(t.shape) != tuple(shape):
                raise InputError(f"{lp.name}: {suffix} came out {tuple(t.shape)}, the plan says {tuple(shape)}")
            stored[suffix] = t.contiguous().to(m.weight.device)
        bias = None if m.bias is None else m.bias.detach()
        layer = QuantLinear.from_weight(QuantWeight(stored, marker, lp.name), bias, m)
        _replace(model, lp.name, layer)
        done[lp.name] = chosen.describe()
    return done


def _header_dtype(t: torch.Tensor, name: str) -> str:
    try:
        return DTYPE_NAMES[t.dtype]
    except KeyError:
        raise InputError(f"layer {name!r}: dtype {t.dtype} has no safetensors name") from None


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, layer)


def save_quantized(model: nn.Module, path, *, target="all", metadata: dict[str, str] | None = None) -> str:
    """Write ``model``'s state dict as a Comfy checkpoint: every ``QuantLinear``'s stored
    tensors plus its marker (a ``.comfy_quant`` U8 tensor and the ``_quantization_metadata``
    header map), every other tensor as it is.  The file is written to a temporary name,
    checked with ``comfyquant check --target`` (refused, and removed, on an error), then
    renamed into place.  Returns the path.  An existing file at ``path`` is replaced (as
    ``torch.save`` does); anything else the output rule refuses is refused before the work
    (``comfyquant.io.outputs.claim_files``: a folder, device or FIFO, a missing or
    unwritable folder)."""
    from ..checker.run import check
    from ..io.outputs import claim_files
    from ..io.writer import commit_file, write_safetensors
    from ..quantizer.layout import marker_entries

    path = os.fspath(path)
    claim_files([path], overwrite=True)
    state = model.state_dict()
    markers = {name: m.marker for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    entries: dict = {}
    for name, t in state.items():
        if t.device.type == "meta":
            raise InputError(f"save_quantized: {name!r} is on the meta device (never loaded)")
        t = t.detach().cpu().contiguous()
        entries[name] = (_header_dtype(t, name), tuple(t.shape), to_bytes(t))
    marker_tensors, marker_map = marker_entries(markers)
    entries.update(marker_tensors)
    meta = dict(metadata or {})
    meta.update(marker_map)  # the header map always describes the markers written
    tmp = write_safetensors(path, entries, meta or None, commit=False)
    committed = False
    try:
        report = check(tmp, target=target)
        errors = [f for f in report.findings if f.severity == "error"]
        if errors:
            first = errors[0]
            raise InputError(
                f"refusing to write {path}: the written file does not pass comfyquant check: {first.message} [{first.code}]"
            )
        commit_file(tmp, path)
        committed = True
    finally:
        if not committed and os.path.exists(tmp):
            os.unlink(tmp)
    return path
