"""ComfyUI 0.33.0's loader (``comfy/utils.py`` ``convert_old_quants``, ``comfy/sd.py``, ``comfy/ops.py``): what raises, and what it silently loses.

ComfyUI replaces tensor markers with header markers (trying names with and without the
diffusion-model prefix), then loads each marked layer through comfy-kitchen layouts built
with the model's shape.  Silent losses (a dropped W4A8 correction, unconsumed tensors, an
unmarked INT8/FP8 weight cast by value) are non-blocking violations.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import TYPE_CHECKING

from ..architectures.registry import comfyui_prefix
from ..dtypes import DTYPE_BITS, QUANTIZED_WEIGHT_DTYPES
from ..findings import DEEP_MEASURES
from ..markers import nonfinite_sizes, same_marker
from .base import LAYER, Verdict, Violation, bind, container_violations, in_module_order, incomplete_violations
from .comfyui_model import NEWEST_READING, WHOLE_MODEL, Reading, WholeModel, whole_model
from .comfyui_sizes import corrections_at_model_level, dropped_layer, parameters, true_size, w4a8_at_model_size
from .kitchen import (
    VIEWS,
    block_rows,
    convrot_forward,
    forward_templates,
    int_violation,
    marker_ints,
    not_2d_templates,
    runs_forward,
    short_padded_rows,
    w4a8_forward,
)

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

DIFFUSION_PREFIX = "model.diffusion_model."

OWN_FORWARD = ("nvfp4", "mxfp8", "asym_w4a8_int8")
"""Formats whose first forward checks their stored tensors against each other before the weight
meets the input (NVFP4/MXFP8 block scales read at the model's size, W4A8's operands): what the
per-layer rules find in them comes first at any size."""
SCALAR_TYPES = {
    "BOOL": "Bool",
    "U8": "Byte",
    "I8": "Char",
    "I16": "Short",
    "U16": "UInt16",
    "I32": "Int",
    "U32": "UInt32",
    "I64": "Long",
    "U64": "UInt64",
    "F16": "Half",
    "BF16": "BFloat16",
    "F32": "Float",
    "F64": "Double",
    "C64": "ComplexFloat",
    "F8_E4M3": "Float8_e4m3fn",
    "F8_E5M2": "Float8_e5m2",
    "F8_E8M0": "Float8_e8m0fnu",
}
"""torch's ScalarType names, as its view error prints them."""
QUANT_ALGOS = ("float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8", "int8_tensorwise", "convrot_w4a4", "asym_w4a8_int8")
"""The formats of ``QUANT_ALGOS`` in ComfyUI 0.33.0 comfy/quant_ops.py (no AWQ: a layer marked
``awq_w4a16`` raises ``KeyError`` at load)."""
STORAGE = {
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "nvfp4": "U8",
    "mxfp8": "F8_E4M3",
    "int8_tensorwise": "I8",
    "convrot_w4a4": "I8",
    "asym_w4a8_int8": "I8",
}
CONSUMED = {
    "float8_e4m3fn": {"weight_scale", "input_scale"},
    "float8_e5m2": {"weight_scale", "input_scale"},
    "nvfp4": {"weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale"},
    "mxfp8": {"weight_scale", "input_scale"},
    "int8_tensorwise": {"weight_scale"},
    "convrot_w4a4": {"weight_scale"},
    "asym_w4a8_int8": {"weight_s_rel", "weight_s_channel", "weight_codebook"},
}
REQUIRED = {
    "mxfp8": (("weight_scale",), "Missing MXFP8 block scales for layer {layer}"),
    "nvfp4": (("weight_scale_2", "weight_scale"), "Missing NVFP4 scales for layer {layer}"),
    "int8_tensorwise": (("weight_scale",), "Missing INT8 weight scale for layer {layer}"),
    "convrot_w4a4": (("weight_scale",), "Missing ConvRot W4A4 weight scale for layer {layer}"),
    "asym_w4a8_int8": (("weight_s_rel",), "Missing W4A8 group scale (weight_s_rel) for layer {layer}"),
}


def _fail(
    out: list,
    rule: str,
    message: str,
    layer=None,
    tensor=None,
    exception="ValueError",
    blocking=True,
    cause=None,
    fix=None,
    severity="",
) -> None:
    out.append(
        Violation(f"comfyui.{rule}", message, exception if blocking else None, layer, tensor, blocking, cause, fix, severity)
    )


def comfyui_markers(ckpt: Checkpoint, out: list, at_load: list | None = None, map_after_prefix: bool = False) -> dict[str, dict]:
    """The marker ComfyUI ends up with per prefix: the header replaces the tensor marker.  A
    header map is read while the file is converted (``out``); a tensor marker by its module
    as the model loads (``at_load``; ``out`` too when not given).  A map entry names its layer
    with or without the diffusion-model prefix (ComfyUI 0.33.0 folds the map into the keys
    before it strips the prefix and again after); ``map_after_prefix``: only as the stripped
    model names it (the releases that fold the map once, after stripping)."""
    markers: dict[str, dict] = {}
    header_out, out = out, (out if at_load is None else at_load)
    load_out = out
    for rec in ckpt.markers.records:
        if rec.kind == "tensor" and isinstance(rec.obj, dict):
            markers[rec.prefix] = rec.obj
        elif rec.kind == "tensor" and rec.obj is not None:
            _fail(
                out,
                "marker",
                f"'{type(rec.obj).__name__}' object has no attribute 'get'",
                rec.prefix,
                "comfy_quant",
                exception="AttributeError",
                cause="the marker is not a JSON object",
                fix="rewrite the marker (comfyquant fix)",
            )
        elif rec.kind == "tensor":
            # ComfyUI parses the bytes with Python's json, which also takes NaN and Infinity
            try:
                obj = json.loads(ckpt.markers.marker_bytes.get((rec.file, rec.key), b""))
            except (ValueError, RecursionError) as exc:
                _fail(
                    out,
                    "marker",
                    str(exc),
                    rec.prefix,
                    "comfy_quant",
                    exception=type(exc).__name__,
                    cause="the marker tensor's bytes are not JSON",
                    fix="rewrite the marker (comfyquant fix)",
                )
                continue
            if isinstance(obj, dict):
                markers[rec.prefix] = obj
            else:
                _fail(
                    out,
                    "marker",
                    f"'{type(obj).__name__}' object has no attribute 'get'",
                    rec.prefix,
                    "comfy_quant",
                    exception="AttributeError",
                    cause="the marker is not a JSON object",
                    fix="rewrite the marker (comfyquant fix)",
                )
    out = header_out
    for hm in ckpt.markers.headers:
        if hm.error == "M010":
            try:
                obj = json.loads(hm.raw)
            except (ValueError, RecursionError) as exc:
                _fail(
                    out,
                    "header",
                    str(exc),
                    exception=type(exc).__name__,
                    cause="the header marker map is not JSON",
                    fix="rewrite the header markers (comfyquant fix)",
                )
            else:  # Python's json takes NaN/Infinity/1e400: ComfyUI reads the map; a non-finite size fails
                sizes = nonfinite_sizes(obj)
                if sizes:
                    prefix, key, value = sizes[0]
                    _fail(
                        out,
                        "header",
                        f"(no ComfyUI message modelled) layer '{prefix}': {key}={value} in the header "
                        "marker map cannot be a size",
                        prefix,
                        exception=None,
                        cause="a writer stored a non-finite marker value",
                        fix="rewrite the header markers (comfyquant fix)",
                    )
            continue
        if hm.error in ("M011", "M012"):
            refused = _layers_refused(hm.raw)
            if refused is not None:
                _fail(
                    out,
                    "header",
                    refused[1],
                    exception=refused[0],
                    cause="the header marker map has no layers object",
                    fix="rewrite the header markers (comfyquant fix)",
                )
            continue
    layers = ckpt.layers
    stripped = model_prefix(ckpt.tensors) if map_after_prefix else None
    for rec in ckpt.markers.records:
        if rec.kind != "header":
            continue
        target = rec.prefix if stripped is None else stripped + rec.prefix
        if target not in layers:
            alt = target[len(DIFFUSION_PREFIX) :] if target.startswith(DIFFUSION_PREFIX) else DIFFUSION_PREFIX + target
            if stripped is None and alt in layers:
                target = alt
            else:
                _fail(
                    out,
                    "stray",
                    f"header marker for {rec.prefix!r} names no layer: left over as a stray '{rec.prefix}.comfy_quant' key",
                    rec.prefix,
                    blocking=False,
                    cause="header marker without tensors (prefix mismatch?)",
                    fix="re-key or remove it (comfyquant fix)",
                )
                continue
        if not isinstance(rec.obj, dict):
            # ComfyUI writes each entry of the map as the layer's marker tensor (replacing the
            # file's own) and parses it as the layer loads: a null entry is no marker at all,
            # any other value fails that layer's load, in module order
            markers.pop(target, None)
            if rec.obj is not None:
                _fail(
                    load_out,
                    "header",
                    f"'{type(rec.obj).__name__}' object has no attribute 'get'",
                    rec.prefix,
                    exception="AttributeError",
                    cause="a header marker entry is not an object",
                    fix="rewrite the header markers (comfyquant fix)",
                )
            continue
        # The same marker as the checkpoint's merged one (the usual case: header and tensor
        # markers written identical) is that object, so per-layer results cached under it
        # serve ComfyUI too.
        effective = ckpt.markers.effective.get(target)
        replaced = markers.get(target)
        if isinstance(replaced, dict) and _rotated(replaced) and not _rotated(rec.obj):
            _fail(
                out,
                "rotation",
                f"layer '{target}': ComfyUI takes the header map's marker ({rec.obj.get('format')!r}, no rotation) "
                f"over the tensor marker, which says the weights are ConvRot-rotated: the layer computes "
                f"without the rotation (garbage output, no error)",
                target,
                "comfy_quant",
                blocking=False,
                cause="the header marker map and the tensor marker disagree on the layer's rotation",
                fix="rewrite the header markers from the tensor markers (comfyquant fix)",
                severity="error",
            )
        markers[target] = effective if effective is not None and same_marker(effective, rec.obj) else rec.obj
    return markers


def _rotated(marker: dict) -> bool:
    """Whether a marker says its layer's weights are stored ConvRot-rotated: W4A8 and W4A4
    always are, INT8 with a true ``convrot`` (ComfyUI 0.33.0 comfy/quant_ops.py reads it with
    ``bool``)."""
    fmt = marker.get("format")
    return fmt in ("asym_w4a8_int8", "convrot_w4a4") or (fmt == "int8_tensorwise" and bool(marker.get("convrot")))


def _layers_refused(raw: str) -> tuple[str, str] | None:
    """What ComfyUI's ``convert_old_quants`` raises reading a parsed header map that has no
    ``layers`` object: it indexes the map with ``"layers"`` and iterates ``.items()`` of the
    result (ComfyUI 0.33.0 comfy/utils.py).  Python itself gives the exception and its words
    (``TypeError: list indices must be integers or slices, not str``, ``KeyError: 'layers'``,
    ``AttributeError: 'list' object has no attribute 'items'``...)."""
    try:
        obj = json.loads(raw)
        obj["layers"].items()
    except Exception as exc:  # the runtime's own exception, whatever the map holds
        return type(exc).__name__, str(exc)
    return None


def model_prefix(names) -> str:
    """The prefix ComfyUI strips from a checkpoint's keys before building the diffusion model
    (``comfyquant.architectures.registry.comfyui_prefix``); "" when no key starts with it
    (``load_diffusion_model_state_dict`` then keeps the keys as they are)."""
    names = list(names)
    prefix = comfyui_prefix(names)
    return prefix if any(name.startswith(prefix) for name in names) else ""


def _collected(mismatches: list[Violation]) -> list[Violation]:
    """torch's ``load_state_dict`` raises the size mismatches of every module at once, one line
    each in the model's module order after ``Error(s) in loading state_dict for <model>:``:
    several (given in that order) become one violation carrying those lines (joined as torch
    joins them)."""
    if len(mismatches) < 2:
        return mismatches
    first = mismatches[0]
    first.message = "\n\t".join(v.message for v in mismatches)
    first.cause = f"{len(mismatches)} tensors do not fit their layers (the first: {first.cause})"
    return [first]


def _as_comfyui_names(violations: list[Violation], ckpt: Checkpoint) -> None:
    """What loading and running the layers raise names them as ComfyUI's model does, without
    the prefix it stripped (the messages only: the violations keep the file's layer names).
    The prefix is looked for only when a message could hold one."""
    if not any(v.message and any(c in v.message for c in ("model.", "net.")) for v in violations):
        return
    prefix = model_prefix(ckpt.tensors)
    if not prefix:
        return
    pattern = re.compile(r"(?<![\w.])" + re.escape(prefix) + r"(?=[\w])")
    for v in violations:
        if v.message and prefix in v.message:
            v.message = pattern.sub("", v.message)


def comfyui_verdict(ckpt: Checkpoint, reading: Reading = NEWEST_READING) -> Verdict:
    """ComfyUI 0.33.0's verdict (with comfy-kitchen 0.2.40); ``reading``: as a release that
    reads the file otherwise (``comfyui_model.Reading``) meets it."""
    # load_torch_file opens the file with safetensors.safe_open before anything else
    out: list[Violation] = container_violations("comfyui", ckpt)
    at_load: list[Violation] = []
    markers = comfyui_markers(ckpt, out, at_load, reading.map_after_prefix)
    read_and_convert = len(out)  # what follows is raised by loading and running the model
    whole = whole_model(ckpt, markers, reading.map_after_prefix)
    if reading is NEWEST_READING:
        ckpt.shared[WHOLE_MODEL] = whole
    detection = whole.failure()
    if detection is not None:  # detection ends the load before any module is built
        out.append(detection)
        return Verdict("comfyui", out, whole.describe())
    out.extend(at_load)
    foreign = ckpt.foreign
    forward: list[Violation] = []
    biases: list[Violation] = []
    sized: set[str] = set()
    for prefix, layer in ckpt.layers.items():
        marker = markers.get(prefix)
        t = layer.tensors
        if not whole.kept(prefix):
            dropped_layer(out, whole, prefix, marker, t)
            continue
        true = whole.linear(prefix)
        b = t.get("bias")
        # per layer class: (what loading raises or loses, what the first forward raises, the
        # readings of the weight at each size a model builds the layer with)
        cls = None if marker is None else ckpt.memo.get("comfyui", marker, layer, partial(_layer_class, marker, t))
        if true is not None:
            by_size = cls[2] if cls is not None else None
            if true_size(whole, by_size, prefix, layer, marker, true, biases, forward, reading.cut_on_cpu):
                sized.add(prefix)
        elif b is not None:
            w = t.get("weight")  # entries are tuples: [2] is the shape
            if w is not None and (len(b[2]) != 1 or len(w[2]) != 2 or b[2][0] != w[2][0]):
                v = _bias_mismatch(prefix, layer, w, b)
                if v is not None:
                    biases.append(v)
        if marker is None:
            w = t.get("weight")
            if prefix in foreign:
                continue  # what ComfyUI does with a dialect's layer is that dialect's runtime model
            if w is not None and w.dtype in QUANTIZED_WEIGHT_DTYPES and prefix not in sized:
                _fail(
                    out,
                    "unmarked",
                    f"layer '{prefix}' has a {w.dtype} weight but no marker: ComfyUI casts it to the "
                    f"compute dtype by value (garbage output, no error)",
                    prefix,
                    "weight",
                    blocking=False,
                    severity="error",
                    cause="quantized weight without a marker",
                    fix="add the marker (comfyquant fix)",
                )
            continue
        assert cls is not None
        load, first_forward = cls[0], cls[1]
        if prefix in sized and marker.get("format") == "asym_w4a8_int8":
            # its Params are built with the model's size: that check replaces the file-sized one
            load = [v for v in load if v.rule != "comfyui.ck"]
            if not any(v.blocking for v in load):
                sized_load, sized_forward = w4a8_at_model_size(prefix, marker, t, true)
                if sized_load is not None:
                    out.append(sized_load)
                elif sized_forward is not None:
                    forward.append(sized_forward)
                first_forward = []  # judged at the model's size
        if load:
            out.extend(bind(load, prefix))
        if first_forward and (prefix not in sized or marker.get("format") in OWN_FORWARD):
            if prefix in sized:  # the block scales are read before the weight meets the input
                forward[:] = [v for v in forward if v.layer != prefix or v.rule != "comfyui.model-size"]
            forward.extend(bind(first_forward, prefix))
        # else: a layer of another size fails at its size first
        bank = layer.bank
        if bank is not None:
            declared = marker.get("num_experts")
            if type(declared) is not int or declared != bank.experts:
                _fail(
                    out,
                    "bank",
                    f"(no ComfyUI message modelled) layer '{prefix}' is read as a bank of "
                    f"num_experts {declared!r} while its weight holds {bank.experts} experts",
                    prefix,
                    "weight",
                    exception=None,
                    cause="ComfyUI splits a bank by the marker's num_experts",
                    fix=f"set num_experts to {bank.experts} in the marker",
                )
    out[read_and_convert:] = _in_model_order(whole, out[read_and_convert:], whole.load_key)  # each module loads in turn
    corrections_at_model_level(whole, out)
    sizes, missing_forward, missing = parameters(whole, markers)
    out.extend(_collected(_in_model_order(whole, biases + sizes, whole.load_key)))  # load_state_dict raises them at once
    forward.extend(missing_forward)
    for v in forward:
        v.stage = "forward"
    out.extend(_in_model_order(whole, forward, whole.forward_key))  # the whole model loads before its first forward
    _as_comfyui_names(out[read_and_convert:], ckpt)
    out.extend(missing)
    # load_state_dict(strict=False) logs missing keys and leaves those weights uninitialized
    for v in incomplete_violations(
        "comfyui",
        ckpt,
        False,
        "ComfyUI logs the missing keys and runs with those weights uninitialized (garbage output, no error)",
    ):
        v.severity = "error"
        out.append(v)
    if any(e.dtype == "F8_E8M0" for lay in ckpt.layers.values() if lay.format_name == "mxfp8" for e in lay.tensors.values()):
        _fail(
            out,
            "e8m0",
            "F8_E8M0 tensors: ComfyUI's own (aimdo) safetensors reader has no F8_E8M0 entry; the "
            "safe_open path reads them (unverified)",
            blocking=False,
            severity="info",
            cause="F8_E8M0 dtype",
            fix="relabel the scales as U8 (same bytes) if your ComfyUI fails to read them",
        )
    # a file safetensors refuses never reaches detection: no architecture to name
    opened = not any(v.file is not None for v in out[:read_and_convert])
    return Verdict("comfyui", out, whole.describe() if opened else None)


def _in_model_order(whole: WholeModel, violations: list[Violation], key) -> list[Violation]:
    """The violations of one stage in the order ComfyUI's model meets their layers: the
    architecture's order (registration for loading, execution for the forward) where it is
    known, else the order the names tell (``in_module_order``)."""
    if whole.model is None or len(violations) < 2:
        return in_module_order(violations)
    ordered = in_module_order(violations)
    return sorted(ordered, key=lambda v: key(v.layer))


def _padded_rows(name: str | None) -> bool:
    """Whether the format may store its weight with more rows than the model has (its bias
    slot is sized by the model: ``N_model``)."""
    from ..formats.registry import FORMATS

    fmt = FORMATS.get(name) if name else None
    return fmt is not None and any(s.suffix == "bias" and "N_model" in s.shape for s in fmt.slots)


def _row_padding(name: str | None) -> int:
    """The multiple a format pads its stored rows to (1: no padding)."""
    from ..formats.registry import FORMATS

    fmt = FORMATS.get(name) if name else None
    return (fmt.pad[0] if fmt is not None and fmt.pad else 1) or 1


def _rows(entry) -> int | None:
    """The output rows a per-row tensor (``[N]`` or ``[N, 1]``) speaks for."""
    shape = entry.shape
    if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
        return shape[0]
    return None


def _bias_mismatch(prefix: str, layer, w, b) -> Violation | None:
    """A bias whose shape is not the model's ``(N,)``: ``load_state_dict`` collects them and
    raises once all modules are loaded (before any forward).  torch's message opens with
    ``Error(s) in loading state_dict for <model class>:``, which a file cannot tell; the
    verdict carries the line that names the tensor."""
    if len(w.shape) != 2 or layer.bank is not None or tuple(b.shape) == (w.shape[0],):
        return None
    if len(b.shape) == 1 and any(_rows(e) == b.shape[0] for e in layer.tensors.values() if e is not w and e is not b):
        return None  # a per-row tensor agrees with the bias: the weight is what is off
    if len(b.shape) == 1 and block_rows(layer.format_name, layer.tensors) == b.shape[0]:
        return None  # the block scales' padded rows fit the bias, not the weight: the weight is off
    if len(b.shape) == 1 and _padded_rows(layer.format_name):
        pad = _row_padding(layer.format_name)
        if b.shape[0] < w.shape[0] and -(-b.shape[0] // pad) * pad == w.shape[0]:
            return None  # padded storage: the bias has the model's rows, the weight those padded
        if w.shape[0] % pad:
            return None  # rows no padded storage has: the weight is what is off, the bias the model's
    have = ", ".join(str(d) for d in b.shape)
    out: list[Violation] = []
    _fail(
        out,
        "bias",
        f"size mismatch for {prefix}.bias: copying a param with shape torch.Size([{have}]) from checkpoint, "
        f"the shape in current model is torch.Size([{w.shape[0]}]).",
        prefix,
        "bias",
        exception="RuntimeError",
        cause=f"bias of shape {list(b.shape)} for a layer of {w.shape[0]} outputs",
        fix=f"store the bias as [{w.shape[0]}]",
    )
    return out[0]


def _layer_class(marker: dict, t: dict) -> tuple[list[Violation], list[Violation], dict]:
    """What ``comfyui_verdict`` keeps per layer class: the layer's templates and an empty map
    of its readings at the sizes models build it with (``true_size`` fills it)."""
    load, first_forward = _layer_templates(marker, t)
    return load, first_forward, {}


def _layer_templates(marker: dict, t: dict) -> tuple[list[Violation], list[Violation]]:
    """(what loading the layer raises or loses, what its first forward raises): cached per
    layer class.  A layer that does not load never runs."""
    out: list[Violation] = []
    if "weight" not in t:
        # the loader leaves the weight None and returns; the first forward reads its device
        return [], [
            Violation(
                "comfyui.weight",
                "'NoneType' object has no attribute 'device'",
                "AttributeError",
                LAYER,
                "weight",
                True,
                "marked layer without a weight: ComfyUI logs 'Missing weight' and loads nothing",
                "re-export the layer with its weight",
            )
        ]
    marker = _read_marker(out, marker, t)
    if out:
        return out, []
    fmt = marker.get("format")
    if isinstance(fmt, str) and fmt in QUANT_ALGOS and all(s in t for s in REQUIRED.get(fmt, ((), ""))[0]):
        not_2d = not_2d_templates("comfyui", fmt, marker, t)
        if not_2d is not None:
            return out, not_2d
    first_forward = _layer(out, LAYER, marker, t)
    fmt = marker.get("format")
    if any(v.blocking for v in out) or not isinstance(fmt, str):
        return out, []
    smoothing = _pre_quant_scale(fmt, marker, t)
    if smoothing is not None:  # the forward multiplies the input by it before anything else
        return out, [smoothing]
    if first_forward is not None:
        return out, [first_forward]
    forward = forward_templates("comfyui", fmt, t, VIEWS.get(fmt)) if runs_forward("comfyui", fmt) else []
    if not forward:
        short = short_padded_rows("comfyui", fmt, t)
        if short is not None:
            return out, [short]
    return out, forward


def _pre_quant_scale(fmt: str, marker: dict, t: dict) -> Violation | None:
    """A ``pre_quant_scale`` ComfyUI loads (the formats whose parameters list it) that does not
    broadcast against the input: the forward's opening ``input * pre_quant_scale`` raises
    torch's broadcasting error, for an input of shape [4, K] (K the layer's input size: the
    unpadded one a padded weight records with its ``pre_quant_scale``)."""
    from ..formats.base import GeometryError
    from ..formats.registry import FORMATS
    from .torch_text import broadcast_error

    e = t.get("pre_quant_scale")
    if e is None or "pre_quant_scale" not in CONSUMED.get(fmt, ()):
        return None
    desc = FORMATS[fmt]
    try:
        env = desc.geometry(t, desc.params(marker))
        k = env.get("K_model", env["K"])
    except (GeometryError, KeyError):
        return None
    message = broadcast_error((4, k), tuple(e.shape))
    if message is None:
        return None
    return Violation(
        "comfyui.pre-quant-scale",
        message,
        "RuntimeError",
        LAYER,
        "pre_quant_scale",
        True,
        f"pre_quant_scale of shape {list(e.shape)} for a layer of {k} inputs: the first forward (on an input "
        f"of shape [4, {k}]) multiplies the input by it",
        f"store pre_quant_scale as [{k}]",
    )


def _read_marker(out: list, marker: dict, t: dict) -> dict:
    """The marker with its integer keys read through ``int()`` as ComfyUI reads them; a value
    ``int()`` refuses raises Python's own error at load, after a missing scale would have."""
    fmt = marker.get("format")
    if not isinstance(fmt, str) or fmt not in QUANT_ALGOS:
        return marker
    read, refused = marker_ints(fmt, marker)
    if refused is not None and all(s in t for s in REQUIRED.get(fmt, ((), ""))[0]):
        out.append(int_violation("comfyui", LAYER, refused))
    return read


def _layer(out: list, prefix: str, marker: dict, t: dict) -> Violation | None:
    fmt = marker.get("format")
    if fmt is None:
        _fail(
            out,
            "format",
            f"Unknown quantization format for layer {prefix}",
            prefix,
            cause="marker has no format key",
            fix="add the format key (comfyquant fix)",
        )
        return None
    if isinstance(fmt, (list, dict)):  # looked up in a set of formats first
        _fail(
            out,
            "format",
            f"unhashable type: '{type(fmt).__name__}'",
            prefix,
            exception="TypeError",
            cause="the marker's format is not a name",
            fix="set the format to a format name (comfyquant fix)",
        )
        return None
    if fmt not in QUANT_ALGOS:
        _fail(
            out,
            "format",
            repr(fmt),
            prefix,
            exception="KeyError",
            cause=f"stock ComfyUI does not know format {fmt!r}",
            fix="convert the layer (comfyquant convert)",
        )
        return None
    for suffix, (dtype, sources) in VIEWS.get(fmt, {}).items():
        e = t.get(suffix)
        if (
            e is not None
            and not e.shape
            and (sources is None or e.dtype in sources)
            and DTYPE_BITS.get(e.dtype, 8) != DTYPE_BITS[dtype]
            and e.dtype in SCALAR_TYPES
        ):
            _fail(
                out,
                "view",
                f"self.dim() cannot be 0 to view {SCALAR_TYPES[e.dtype]} as {SCALAR_TYPES[dtype]} (different element sizes)",
                prefix,
                suffix,
                exception="RuntimeError",
                cause=f"ComfyUI reinterprets {suffix} as {dtype}, which a scalar of another width cannot be",
                fix=f"store {suffix} as {dtype} in its blocked layout",
            )
            return None
    if fmt in ("float8_e4m3fn", "float8_e5m2") and "weight_scale" not in t and "weight" in t:
        # ComfyUI's FP8 layout copies its scale when the parameters are built
        _fail(
            out,
            "missing",
            "'NoneType' object has no attribute 'clone'",
            prefix,
            "weight_scale",
            exception="AttributeError",
            cause="an FP8 layer without weight_scale",
            fix="re-export the layer with its weight_scale",
        )
        return None
    if fmt in REQUIRED:
        needed, message = REQUIRED[fmt]
        if any(s not in t for s in needed):
            _fail(
                out,
                "missing",
                message.format(layer=prefix),
                prefix,
                cause="a required scale tensor is missing",
                fix="re-export the layer",
            )
            return None
    w = t.get("weight")
    if w is None:
        _fail(
            out,
            "weight",
            f"Missing weight for layer {prefix}",
            prefix,
            "weight",
            blocking=False,
            severity="error",
            cause="marked layer without a weight",
        )
        return None
    if w.dtype != STORAGE[fmt]:
        # ComfyUI casts the stored weight to the layout's dtype by value: codes stored in a
        # wider dtype survive it exactly and the layer computes normally; other values (bytes
        # of another dtype, a dense weight) do not.  Only the values tell (check --deep).
        _fail(
            out,
            "cast",
            f"layer '{prefix}': {w.dtype} weight is value-cast to {STORAGE[fmt]} at load (exact when "
            f"the values are {STORAGE[fmt]} codes, garbage otherwise; {DEEP_MEASURES} the cast's relative error)",
            prefix,
            "weight",
            blocking=False,
            cause=f"weight stored as {w.dtype}, the format needs {STORAGE[fmt]}",
            fix=f"store the weight as {STORAGE[fmt]} (relabel it if the bytes are {STORAGE[fmt]} codes)",
        )
        t = dict(t, weight=type(w)(w.name, STORAGE[fmt], w.shape, w.start, w.end, w.file))
    first_forward = _w4a8(out, prefix, marker, t) if fmt == "asym_w4a8_int8" else _convrot(out, prefix, fmt, marker, t)
    for suffix in t:
        if suffix in ("weight", "bias", "comfy_quant") or suffix in CONSUMED[fmt]:
            continue
        if suffix == "weight_correction":
            _fail(
                out,
                "correction",
                f"layer '{prefix}': ComfyUI does not load weight_correction: the layer computes without "
                f"it, off by the correction's share of the weight (no error; {DEEP_MEASURES} it)",
                prefix,
                suffix,
                blocking=False,
                cause="ComfyUI's W4A8 loader passes only s_rel, s_channel and codebook",
                fix="for ComfyUI, re-quantize symmetric (comfyquant fix --target comfyui --allow-lossy)",
            )
        else:
            _fail(
                out,
                "unconsumed",
                f"layer '{prefix}': {suffix} is not consumed and stays as a left-over key",
                prefix,
                suffix,
                blocking=False,
                cause="tensor the ComfyUI loader does not read",
                fix="remove it (comfyquant fix)",
            )
    return first_forward


def _convrot(out: list, prefix: str, fmt: str, marker: dict, t: dict) -> Violation | None:
    """ConvRot W4A4's ``Params`` (its linear_dtype, at load) and what a ConvRot layer's first
    forward refuses (group size 0, not dividing K, not a power of 4), as comfy-kitchen decides."""
    from ..formats.base import GeometryError
    from ..formats.registry import FORMATS
    from .kitchen import w4a4_params
    from .kitchen_int8 import int8_input_k
    from .kitchen_w4a4 import w4a4_scale_length, w4a4_scale_rank

    if fmt not in ("convrot_w4a4", "int8_tensorwise"):
        return None
    desc = FORMATS[fmt]
    try:
        env = desc.geometry(t, desc.params(marker))
    except GeometryError:
        return None
    if fmt == "convrot_w4a4":
        v = w4a4_params(prefix, t, env)
        if v is not None:
            _fail(out, "ck", v.message, prefix, v.tensor, exception=v.exception, cause=v.cause, fix=v.fix)
            return None
        ranked = w4a4_scale_rank("comfyui", t)  # the op's dispatch checks it before the linear's own checks
        if ranked is not None:
            return ranked
    if fmt == "int8_tensorwise":
        v = int8_input_k("comfyui", t)  # the linear compares the input's K first
        if v is not None:
            return v
    v = convrot_forward("comfyui", fmt, env)
    return v if v is not None or fmt != "convrot_w4a4" else w4a4_scale_length("comfyui", t)


def _w4a8(out: list, prefix: str, marker: dict, t: dict) -> Violation | None:
    """ComfyUI builds comfy-kitchen's W4A8 Params (with nested ``params`` as a fallback): the
    layout's own validation decides at load, so the kitchen profile's check is reused as is;
    returns what the layer's first forward raises once it loaded."""
    from ..formats.base import GeometryError
    from ..formats.w4a8 import ASYM_W4A8_INT8, model_geometry
    from .kitchen import check_w4a8

    try:
        env = model_geometry(t, ASYM_W4A8_INT8.params(marker))
    except GeometryError as exc:
        _fail(out, "ck", f"layer '{prefix}': {exc}", prefix, "weight")
        return None
    v = check_w4a8(prefix, t, env, dropped_correction=True)
    if v is not None:
        _fail(out, "ck", v.message, prefix, v.tensor, exception=v.exception, cause=v.cause, fix=v.fix)
        return None
    return w4a8_forward("comfyui", t, env, dropped_correction=True)
