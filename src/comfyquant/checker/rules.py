"""Checkpoint-wide rules: every layer against its format, markers without layers, unmarked
quantized weights, orphan tensors and name-mapping collisions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..dtypes import QUANTIZED_WEIGHT_DTYPES
from ..findings import Finding
from ..formats.registry import FORMATS, infer_format
from ..formats.validation import check_layer
from ..markers import FILE_LEVEL_DTYPES, file_level_format

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

KNOWN_ROOTS = ("model.diffusion_model.", "diffusion_model.", "model.", "transformer.", "unet.")


def check_layers(ckpt: Checkpoint) -> tuple[list[Finding], dict[str, dict]]:
    """All layer findings (bound to layer names) and each layer's geometry env."""
    findings: list[Finding] = []
    envs: dict[str, dict] = {}
    foreign = ckpt.foreign
    file_fmt = file_level_format(ckpt.markers)
    conflicts = {f.layer: f for f in ckpt.markers.findings if f.code == "M020"}
    fits: dict = {}  # (markers by side, tensor signature) -> fitting side: layers of a model share both
    for prefix, layer in ckpt.layers.items():
        if prefix in foreign:
            continue  # a dialect's layer: its dialect says what it is (dialects/report.py)
        marker = layer.marker
        name = layer.name
        if marker is not None:
            fmt_name = marker.get("format")
            if fmt_name is None:
                findings.append(
                    Finding(
                        "M030",
                        f"layer {name}: marker has no format key",
                        layer=name,
                        actual=json.dumps(marker)[:120],
                        expected='{"format": ...}',
                        fix="add the format key (comfyquant fix infers it where unambiguous)",
                    )
                )
                continue
            fmt = FORMATS.get(fmt_name) if isinstance(fmt_name, str) else None
            if fmt is None:
                guess = infer_format(layer.tensors)
                findings.append(
                    Finding(
                        "M031",
                        f"layer {name}: unknown format {fmt_name!r}",
                        layer=name,
                        actual=repr(fmt_name),
                        expected=" | ".join(FORMATS),
                        cause="typo or a format from a fork" + (f"; the tensors look like {guess.name}" if guess else ""),
                        fix=f"set format to {guess.name!r}" if guess else "convert the layer",
                    )
                )
                continue
            if fmt.converter_only:
                findings.append(
                    Finding(
                        "M032",
                        f"layer {name}: format {fmt.name!r} is written by convert_to_quant only; no runtime loads it",
                        layer=name,
                        actual=fmt.name,
                        cause="exported with a converter-only format",
                        fix="convert to a loadable format (comfyquant convert)",
                    )
                )
            if layer.bank is not None:
                findings.append(_bank_finding(layer, fmt, marker))
            layer_findings, env = check_layer(fmt, marker, layer.tensors, ckpt.memo, layer)
        else:
            w = layer.tensors.get("weight")
            if w is None or w.dtype not in QUANTIZED_WEIGHT_DTYPES:
                if w is None and any(s not in ("bias", "comfy_quant") for s in layer.tensors):
                    findings.append(
                        Finding(
                            "L009",
                            f"layer {name}: {sorted(layer.tensors)} without a weight or marker",
                            layer=name,
                            cause="the weight is in a missing shard, or left over from an edit",
                            fix="remove the orphan tensors or restore the weight",
                        )
                    )
                continue
            fmt = FORMATS.get(layer.format_name) if layer.format_name else None
            looks = f"the tensors look like {fmt.name}" if fmt else "the tensors match no known format"
            cause = (
                "marker lost on re-save (markers are tensors or header metadata some tools drop); "
                "ComfyUI casts the weight by value (garbage), SGLang refuses it"
            )
            if fmt is None:
                fix = "re-export the layer"
            elif fmt.rotation != "none":
                fix = (
                    "add the marker: comfyquant fix --convrot-groupsize C, C being the ConvRot size the layer was "
                    "rotated with (the tensors cannot tell it)"
                )
            else:
                fix = "add the marker: comfyquant fix"
            if file_fmt is not None and w.dtype in FILE_LEVEL_DTYPES:
                cause = (
                    f"only SGLang reads the file's quant_format={file_fmt.quant_format} (as a {file_fmt.name} marker "
                    "for every unmarked quantized weight); ComfyUI casts the weight by value (garbage)"
                )
                fix = f"write the {file_fmt.name} markers per layer (comfyquant fix)"
            findings.append(
                Finding(
                    "M023",
                    f"layer {name}: {w.dtype} weight has no comfy_quant marker ({looks})",
                    layer=name,
                    tensor=f"{prefix}.weight",
                    expected="a marker",
                    actual="none",
                    cause=cause,
                    fix=fix,
                )
            )
            if fmt is None:
                continue
            layer_findings, env = check_layer(fmt, None, layer.tensors, ckpt.memo, layer)
        if env is not None:
            envs[prefix] = env
        bound = [f.with_layer(name, prefix) for f in layer_findings]
        if prefix in conflicts and marker is not None:
            _name_fitting_side(layer, conflicts[prefix], bound, fits)
        findings.extend(bound)
    return findings, envs


def _name_fitting_side(layer, conflict: Finding, bound: list[Finding], cache: dict) -> None:
    """Header map and tensor marker disagree (M020): when exactly one side fits the tensors,
    the conflict and the layer's errors name it, and ``fix`` takes it without ``--prefer``."""
    from .fit import SIDE_TEXT, explain, fitting_side, side_markers

    sides = side_markers(layer.sources)
    key = (json.dumps(sides, sort_keys=True, default=repr), layer.signature)
    fit = cache.get(key, cache)
    if fit is cache:
        fit = cache[key] = fitting_side(layer.sources, layer.tensors)
    if fit is None:
        return
    why = explain(*fit)
    fix = f"take the values of {SIDE_TEXT[fit[0]]} (comfyquant fix does, no --prefer needed)"
    conflict.cause, conflict.fix = why, fix  # the same text every time this checkpoint is checked
    for f in bound:
        if f.severity == "error" and f.code.startswith("L"):
            f.cause = f"{f.cause}; {why}" if f.cause else why
            f.fix = fix


def _bank_finding(layer, fmt, marker: dict) -> Finding:
    """L010: what comfyquant makes of a MoE expert bank (ComfyUI 0.33.0 comfy/ops.py MoEExperts), and whether its marker
    declares the expert count the weight holds."""
    experts, name, tensor = layer.bank.experts, layer.name, f"{layer.prefix}.weight"
    declared = marker.get("num_experts")
    if type(declared) is not int or declared != experts:
        return Finding(
            "L010",
            f"layer {name} ({fmt.name}) is a MoE expert bank whose weight holds {experts} experts, but "
            f"its marker has num_experts {declared!r}",
            layer=name,
            tensor=tensor,
            expected=f"num_experts: {experts}",
            actual=f"num_experts: {declared!r}",
            cause="ComfyUI reads the expert count of a bank from the marker's num_experts",
            targets=["comfyui"],
            fix=f"set num_experts to {experts} in the marker",
        )
    if layer.bank.layout == "rows":
        how = f"checked as one layer of {layer.tensors['weight'].shape[0]} rows, as ComfyUI's loader reads it"
        cause = "expert banks flatten [E, out, ...] to [E*out, ...] for this format (ComfyUI 0.33.0 comfy/ops.py MoEExperts)"
    else:
        how = "checked as one expert's layer: the stored [E, ...] tensors give every expert that layout"
        cause = "each expert's tensors carry a leading expert dimension; per-tensor scales are [E] or shared (ComfyUI 0.33.0 comfy/ops.py MoEExperts)"
    return Finding(
        "L010",
        f"layer {name} ({fmt.name}) is a MoE expert bank of {experts} experts (ComfyUI only): {how}",
        layer=name,
        tensor=tensor,
        severity="info",
        cause=cause,
        fix="none for ComfyUI; SGLang has no loader for expert banks (keep such a model for ComfyUI)",
    )


def check_marker_prefixes(ckpt: Checkpoint) -> list[Finding]:
    """Header markers for prefixes without tensors: name the prefix mismatch when there is one."""
    out: list[Finding] = []
    layers = ckpt.layers
    for prefix, _marker in ckpt.markers.effective.items():
        if prefix in layers:
            continue
        cause, fix = "a marker for a layer that has no tensors", "remove the marker or restore the layer"
        match = prefix_match(prefix, layers)
        if match:
            cause = f"prefix mismatch: the marker says {prefix!r}, the tensors are named {match!r}"
            fix = "re-key the header markers to the tensor names (comfyquant fix)"
        out.append(
            Finding(
                "M022",
                f"marker for {prefix!r} names no layer in the checkpoint",
                layer=prefix,
                expected=match or "tensors named " + prefix + ".*",
                actual="no such tensors",
                cause=cause,
                fix=fix,
            )
        )
    return out


def prefix_match(prefix: str, layers: dict) -> str | None:
    for root in KNOWN_ROOTS:
        if root + prefix in layers:
            return root + prefix
        if prefix.startswith(root) and prefix[len(root) :] in layers:
            return prefix[len(root) :]
    return None


def check_mapping(ckpt: Checkpoint) -> list[Finding]:
    out: list[Finding] = []
    seen: dict[str, str] = {}
    for prefix, layer in ckpt.layers.items():
        if layer.marker is None:
            continue
        other = seen.get(layer.name)
        if other is not None and other != prefix:
            out.append(
                Finding(
                    "M040",
                    f"layers {other!r} and {prefix!r} both map to {layer.name!r}",
                    layer=layer.name,
                    cause="the prefix mapping is not one-to-one (a model-prefixed and an unprefixed copy?)",
                    fix="remove the duplicate layer",
                )
            )
        seen[layer.name] = prefix
    return out
