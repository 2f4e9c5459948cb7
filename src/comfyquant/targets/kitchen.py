"""comfy-kitchen 0.2.40 layouts (its ``Params`` and eager ops): would each layer's tensors build and run?

comfy-kitchen validates operands when a layout's parameters are built (at load) and when it
runs (the first forward); the messages below are its own.  Load-time checks come first in a
verdict, then what the first forward raises (``FORWARD``): its backend registry refuses an
operand of the wrong dtype (``NoCapableBackendError``; measured with the eager backend of
0.2.40 on CPU, the CUDA backends were not run), and NVFP4/MXFP8 block scales of the wrong size
fail inside ``from_blocked`` with torch's reshape error.  Scales it casts itself are not
checked: the FP8 and NVFP4 per-tensor scales (cast to F32 when the layout is built), INT8 and
W4A4 scales (used in the compute dtype) and a W4A8 correction work exactly in BF16 or F16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from ..dtypes import DTYPE_BITS
from ..formats.base import GeometryError, is_pow4
from ..formats.registry import FORMATS
from ..formats.w4a8 import six_bit_fits
from .base import LAYER, Verdict, Violation, bind, container_violations, in_module_order
from .kitchen_awq import awq_forward
from .kitchen_int8 import int8_input_k
from .kitchen_w4a4 import w4a4_scale_length, w4a4_scale_rank
from .torch_text import TORCH_DTYPES, broadcast_error

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint, Layer


def _v(
    rule: str,
    message: str,
    layer: str,
    tensor: str | None = None,
    exception: str = "ValueError",
    blocking: bool = True,
    cause: str | None = None,
    fix: str | None = None,
) -> Violation:
    return Violation(f"comfy-kitchen.{rule}", message, exception if blocking else None, layer, tensor, blocking, cause, fix)


def kitchen_verdict(ckpt: Checkpoint, adjust: Callable | None = None) -> Verdict:
    """comfy-kitchen 0.2.40's verdict; ``adjust(name, marker, layer, load, forward)``, when given,
    returns another release's (load, first forward) templates of a layer (``kitchen_releases``)."""
    # comfy-kitchen is handed its tensors by ComfyUI: a file ComfyUI's safe_open refuses never
    # reaches it, so its verdict starts with the same SafetensorError
    out: list[Violation] = container_violations("comfy-kitchen", ckpt)
    forward: list[Violation] = []
    built = len(out)
    for prefix, load, first_forward in layer_templates(ckpt, adjust):
        if load:
            out.extend(bind(load, prefix))
        if first_forward:
            forward.extend(bind(first_forward, prefix))
    out[built:] = in_module_order(out[built:])  # each layer is built in turn
    out.extend(in_module_order(forward))  # every layer is built (loaded) before the first forward
    return Verdict("comfy-kitchen", out)


def layer_templates(ckpt: Checkpoint, adjust: Callable | None = None) -> Iterator[tuple[str, list[Violation], list[Violation]]]:
    """(layer, load templates, first-forward templates) of each marked layer, in the file's
    order (``adjust`` as for ``kitchen_verdict``): the verdict binds and orders them."""
    memo = ckpt.memo
    for prefix, layer, marker, name in marked_layers(ckpt):
        load, first_forward = memo.get("comfy-kitchen", marker, layer, partial(_layer_templates, name, marker, layer.tensors))
        if adjust is not None:
            load, first_forward = adjust(name, marker, layer, load, first_forward)
        yield prefix, load, first_forward


NOT_2D: dict[str, dict[str, tuple[str, str, str] | tuple[str, str]]] = {
    # format: target -> (op, operand) refusing a weight that is not exactly 2-D, or
    # (exception, message) of what fails instead: the layout's linear (FP8, NVFP4 and MXFP8
    # dequantize first: ComfyUI has no FP8 compute on CPU, and comfy-kitchen's linear with a
    # float input dequantizes).  Measured with comfy-kitchen 0.2.40's eager backend.
    "float8_e4m3fn": {
        "comfy-kitchen": ("RuntimeError", "t() expects a tensor with <= 2 dimensions, but self is 3D"),
        "comfyui": ("RuntimeError", "t() expects a tensor with <= 2 dimensions, but self is 3D"),
    },
    "float8_e5m2": {
        "comfy-kitchen": ("RuntimeError", "t() expects a tensor with <= 2 dimensions, but self is 3D"),
        "comfyui": ("RuntimeError", "t() expects a tensor with <= 2 dimensions, but self is 3D"),
    },
    "asym_w4a8_int8": {
        "comfy-kitchen": ("w4a8_int8_linear", "qdata", ""),
        "comfyui": ("w4a8_int8_linear", "qdata", ""),
    },
    "convrot_w4a4": {
        "comfy-kitchen": ("convrot_w4a4_linear", "qweight", ""),
        "comfyui": ("convrot_w4a4_linear", "qweight", ""),
    },
    "nvfp4": {"comfy-kitchen": ("dequantize_nvfp4", "qx", ""), "comfyui": ("dequantize_nvfp4", "qx", "")},
    "mxfp8": {"comfy-kitchen": ("dequantize_mxfp8", "qx", ""), "comfyui": ("dequantize_mxfp8", "qx", "")},
    "awq_w4a16": {"comfy-kitchen": ("gemv_awq_w4a16", "qweight", "")},
}
INT8_NOT_2D = {
    # INT8 with a single scale: the int_mm of the linear (both runtimes)
    "scalar": ("RuntimeError", "int_mm_out_cpu: Expected mat2 to be of dimension 2 but got 3"),
}


def not_2d_templates(target: str, name: str, marker: dict, t: dict) -> list[Violation] | None:
    """What the first forward of a layer whose weight is 3-D (and not an expert bank) raises,
    or None when the weight is 2-D.  The message is the runtime's where it was measured; a
    row-scaled INT8 layer fails inside its scale checks or broadcasting, depending on how the
    rows are split."""
    w = t.get("weight")
    if w is None or len(w.shape) != 3:
        return None
    found = NOT_2D.get(name, {}).get(target)
    if name == "int8_tensorwise":
        s = t.get("weight_scale")
        if s is not None and s.numel == 1:
            found = INT8_NOT_2D["scalar"]
        elif s is not None:
            # the INT8 linear's own scale check
            found = (
                "ValueError",
                f"INT8 weight scale must be scalar or per-output-channel, got ({s.numel},) for weight shape {tuple(w.shape)}",
            )
    cause = f"weight stored 3-D {list(w.shape)}: the layer is a 2-D linear (a bank needs num_experts in its marker)"
    fix = "store the weight 2-D [N, K] (or mark the bank with num_experts)"
    if found is None:
        return [
            Violation(
                f"{target}.not-2d",
                f"(message depends on how the rows are split) the first forward refuses the 3-D weight {list(w.shape)}",
                "RuntimeError",
                LAYER,
                "weight",
                True,
                cause,
                fix,
            )
        ]
    if len(found) == 3:
        op, operand, _ = found
        dims = ", ".join(str(d) for d in w.shape)
        exception, message = (
            "NoCapableBackendError",
            f"No backend can handle '{op}': eager: {operand}: shape [{dims}] fails: exactly 2D",
        )
    else:
        exception, message = found
    return [Violation(f"{target}.not-2d", message, exception, LAYER, "weight", True, cause, fix)]


MISSING_FORWARD: dict[str, tuple[tuple[str, str], ...]] = {
    # format: (suffix, the attribute comfy-kitchen 0.2.40 reads off None at the first forward)
    # for a tensor the layout needs but was not given (measured, eager backend); AWQ's are
    # read inside its op, after its operand checks (kitchen_awq)
    "float8_e4m3fn": (("weight_scale", "to"),),
    "float8_e5m2": (("weight_scale", "to"),),
    "int8_tensorwise": (("weight_scale", "to"),),
    "convrot_w4a4": (("weight_scale", "reshape"),),
    "nvfp4": (("weight_scale", "reshape"), ("weight_scale_2", "to")),
    "mxfp8": (("weight_scale", "view"),),
    "svdquant_w4a4": (("weight_proj_down", "shape"), ("weight_proj_up", "shape"), ("weight_smooth_factor", "shape")),
}


def _none_attribute(target: str, suffix: str, attribute: str) -> Violation:
    return Violation(
        f"{target}.missing",
        f"'NoneType' object has no attribute '{attribute}'",
        "AttributeError",
        LAYER,
        suffix,
        True,
        f"{suffix} is missing: the layout is built without it and fails when it is used",
        "re-export the layer with all its tensors",
    )


def missing_templates(name: str, tensors: dict) -> tuple[list[Violation], list[Violation]] | None:
    """(load, first forward) of a comfy-kitchen layer missing a tensor it needs, or None: the
    ``QuantizedTensor`` of no weight fails at once (``device``), a missing scale where the
    layout first uses it."""
    if "weight" not in tensors:
        return [_none_attribute("comfy-kitchen", "weight", "device")], []
    for suffix, attribute in MISSING_FORWARD.get(name, ()):
        if suffix not in tensors:
            # the op refuses a weight of the wrong dtype before it reads the missing tensor
            refused = forward_templates("comfy-kitchen", name, {"weight": tensors["weight"]})
            return [], refused or [_none_attribute("comfy-kitchen", suffix, attribute)]
    return None


def marked_layers(ckpt: Checkpoint) -> Iterator[tuple[str, Layer, dict, str]]:
    """(name, layer, marker, format) of each layer comfy-kitchen is handed as quantized, in the
    file's order: its marker, or for a marker comfyquant refuses, what Python's ``json`` reads
    (``python_json_markers``, read only when such a layer is met)."""
    lenient: dict[str, dict] | None = None
    for prefix, layer in ckpt.layers.items():
        marker, name = layer.marker, layer.format_name
        if marker is None:
            if lenient is None:
                lenient = python_json_markers(ckpt)
            if prefix in lenient:
                marker = lenient[prefix]
                name = marker.get("format") if isinstance(marker.get("format"), str) else None
        if marker is None or name is None:
            continue
        yield prefix, layer, marker, name


def python_json_markers(ckpt: Checkpoint) -> dict[str, dict]:
    """Tensor markers comfyquant refuses but Python's ``json`` reads into an object (``NaN``,
    ``Infinity``, ``1e400`` in them): ComfyUI parses markers with it, so their layers are built,
    and fail on those values (``int()`` of a non-finite size).  Read once per check, kept on the
    checkpoint for every runtime model that asks."""
    import json

    found = ckpt.shared.get("python_json_markers")
    if isinstance(found, dict):
        return found
    out: dict[str, dict] = {}
    ckpt.shared["python_json_markers"] = out
    for rec in ckpt.markers.records:
        if rec.kind != "tensor" or rec.obj is not None:
            continue
        try:
            obj = json.loads(ckpt.markers.marker_bytes.get((rec.file, rec.key), b""))
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            out[rec.prefix] = obj
    return out


def _layer_templates(name: str, marker: dict, tensors: dict) -> tuple[list[Violation], list[Violation]]:
    """(what building the layer raises, what its first forward raises): cached per layer class."""
    fmt = FORMATS.get(name)
    if fmt is not None and "comfy-kitchen" in fmt.loaders:
        read, refused = marker_ints(name, marker)
        if refused is None:
            missing = missing_templates(name, tensors)
            if missing is not None:
                return missing
        not_2d = None if refused is not None else not_2d_templates("comfy-kitchen", name, read, tensors)
        if not_2d is not None:
            return [], not_2d
    load = _load_templates(name, marker, tensors)
    read = marker_ints(name, marker)[0]
    if name == "awq_w4a16":
        if load or any(len(tensors[s].shape) != 2 for s in ("weight",) if s in tensors):
            return load, []
        v = awq_forward(tensors, FORMATS[name].params(read)["group_size"])
        return load, [v] if v is not None else []
    convrot = bool(read.get("convrot"))
    if not load and name == "convrot_w4a4":
        ranked = w4a4_scale_rank("comfy-kitchen", tensors)
        if ranked is not None:
            return load, [ranked]
    if not load and name in ("asym_w4a8_int8", "convrot_w4a4", "int8_tensorwise"):
        fmt = FORMATS[name]
        try:
            env = fmt.model_geometry(tensors, fmt.params(read))
        except GeometryError:
            env = None
        if env is not None:
            if name == "asym_w4a8_int8":
                v = w4a8_forward("comfy-kitchen", tensors, env)
            elif name == "int8_tensorwise" and int8_input_k("comfy-kitchen", tensors) is not None:
                v = int8_input_k("comfy-kitchen", tensors)  # the linear compares the input's K first
            else:
                v = convrot_forward("comfy-kitchen", name, env)
                if v is None and name == "convrot_w4a4":
                    v = w4a4_scale_length("comfy-kitchen", tensors)
            if v is not None:
                return load, [v]
    forward = forward_templates("comfy-kitchen", name, tensors, None, convrot) if runs_forward("comfy-kitchen", name) else []
    if not forward and not load:
        short = short_padded_rows("comfy-kitchen", name, tensors)
        if short is not None:
            return load, [short]
    if name == "int8_tensorwise" and not forward and not any(v.blocking for v in load):
        v = int8_dequantize(tensors, convrot)
        if v is not None:  # beside the load's note on a row scale stored [N]
            return load, [v]
    return load, forward if not load else []


def short_padded_rows(target: str, name: str, t: dict) -> Violation | None:
    """A format that pads its stored rows (NVFP4, MXFP8) with a weight of fewer rows than the
    bias, and a row count no padded storage has: the bias has the model's rows, the weight is
    what is off.  The linear computes one output per stored row and the bias added to its
    output of shape [4, rows] does not broadcast (torch's ``expand`` error, raised at the first
    forward; the 4 is the input's rows)."""
    fmt = FORMATS.get(name)
    w, b = t.get("weight"), t.get("bias")
    if fmt is None or w is None or b is None or len(w.shape) != 2 or len(b.shape) != 1:
        return None
    rows, pad = w.shape[0], fmt.pad[0]
    if pad <= 1 or rows % pad == 0 or b.shape[0] <= rows:
        return None
    n = b.shape[0]
    return Violation(
        f"{target}.rows",
        f"The expanded size of the tensor ({rows}) must match the existing size ({n}) at non-singleton dimension 1.  "
        f"Target sizes: [4, {rows}].  Tensor sizes: [{n}]",
        "RuntimeError",
        LAYER,
        "weight",
        True,
        f"weight stored with {rows} rows for a layer of {n} outputs (its bias): {name} pads its stored rows "
        f"to a multiple of {pad}, so the weight is short (raised at the first forward, where the bias is added)",
        "re-export the layer from its original weights (comfyquant quantize)",
    )


def int8_dequantize(t: dict, convrot: bool) -> Violation | None:
    """What ``dequantize()`` of an INT8 layer raises once its linear ran: the codes times the
    scale as stored, so a scale of one value per row that is not [N, 1] raises torch's
    broadcasting error, and a ConvRot layer, which unpacks the product as [N, K] to rotate it
    back, refuses one broadcast to more dimensions."""
    w, s = t.get("weight"), t.get("weight_scale")
    if w is None or s is None or len(w.shape) != 2:
        return None
    message = broadcast_error(tuple(w.shape), tuple(s.shape))
    exception = "RuntimeError"
    if message is None and convrot and len(s.shape) > 2:
        message, exception = "too many values to unpack (expected 2)", "ValueError"
    if message is None:
        return None
    return Violation(
        "comfy-kitchen.int8-dequantize",
        message,
        exception,
        LAYER,
        "weight_scale",
        True,
        f"weight_scale of shape {list(s.shape)} for a weight of {list(w.shape)}: the linear takes it, "
        "dequantize() multiplies the codes by it as stored",
        "store per-row scales as [N, 1] (comfyquant fix)",
    )


def _load_templates(name: str, marker: dict, tensors: dict) -> list[Violation]:
    prefix = LAYER
    fmt = FORMATS.get(name)
    if fmt is None or "comfy-kitchen" not in fmt.loaders:
        return [
            _v(
                "layout",
                repr(name),
                prefix,
                exception="KeyError",
                cause="format comfy-kitchen does not implement",
                fix="convert the layer (comfyquant convert)",
            )
        ]
    marker, refused = marker_ints(name, marker)
    if refused is not None:
        return [int_violation("comfy-kitchen", prefix, refused)]
    if name == "awq_w4a16":
        return []  # its Params validate nothing: the first forward decides (awq_forward)
    # W4A8's Params check the group size themselves, against the model's K
    try:
        env = fmt.model_geometry(tensors, fmt.params(marker))
    except GeometryError as exc:
        return [_v("shape", f"layer '{prefix}': {exc}", prefix, "weight")]
    check = _CHECKS.get(name)
    v = check(prefix, tensors, env) if check is not None else None
    return [v] if v is not None else []


INT_KEYS: dict[str, tuple[str, ...]] = {
    "int8_tensorwise": ("convrot_groupsize",),
    "convrot_w4a4": ("convrot_groupsize",),
    "asym_w4a8_int8": ("group_size", "convrot_groupsize"),
    "awq_w4a16": ("group_size",),
}
"""The marker keys ComfyUI passes through ``int()`` when it builds a layer's ``Params``, in its
order (ComfyUI 0.33.0 comfy/ops.py ``_load_quantized_module``; INT8 reads its ConvRot size only
when ``convrot`` is set).  A nested ``params`` object is the fallback for each key."""


def _nested(marker: dict) -> dict:
    nested = marker.get("params", {})
    return nested if isinstance(nested, dict) else {}


def marker_ints(name: str, marker: dict) -> tuple[dict, tuple[str, str, str] | None]:
    """The marker as ComfyUI reads it: each key of ``INT_KEYS`` through Python's ``int()`` (a
    string of digits or a float becomes an integer), ``convrot`` by truthiness.  Returns the
    read marker and, when ``int()`` refuses a value, (exception type, Python's message, key)."""
    nested = _nested(marker)
    read = dict(marker)
    if name == "int8_tensorwise":
        convrot = bool(marker.get("convrot", nested.get("convrot", False)))
        read["convrot"] = convrot
        if not convrot:
            return read, None
    for key in INT_KEYS.get(name, ()):
        if key not in marker and key not in nested:
            continue
        value = marker[key] if key in marker else nested[key]
        try:
            read[key] = int(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return read, (type(exc).__name__, str(exc), key)
    return read, None


def int_violation(target: str, prefix: str, refused: tuple[str, str, str]) -> Violation:
    exception, message, key = refused
    return Violation(
        f"{target}.marker",
        message,
        exception,
        prefix,
        "comfy_quant",
        True,
        f"marker key {key} is not a number ComfyUI's int() takes",
        f"set {key} to an integer (comfyquant fix)",
    )


def _hadamard(prefix: str, c) -> Violation | None:
    if not is_pow4(c):
        return _v(
            "hadamard",
            f"Regular Hadamard size must be a power of 4, got {c}",
            prefix,
            cause="ConvRot size comfy-kitchen cannot build",
            fix="re-quantize with convrot_groupsize 16, 64 or 256",
        )
    return None


def _int8(prefix: str, t: dict, env: dict) -> Violation | None:
    s = t.get("weight_scale")
    if s is None:
        return _v("missing", f"layer '{prefix}' has no weight_scale", prefix, "weight_scale")
    if s.shape == (env["N"],) and env["N"] != 1:
        return _v(
            "int8",
            f"layer '{prefix}': row scale of shape [N] is broadcast along K by dequantize "
            f"({'wrong values' if env['N'] == env['K'] else 'raises'}); linear still runs",
            prefix,
            "weight_scale",
            blocking=False,
            cause="row scales stored as [N] instead of [N, 1]",
            fix="reshape to [N, 1] (comfyquant fix)",
        )
    return None


def check_w4a8(prefix: str, t: dict, env: dict, dropped_correction: bool = False) -> Violation | None:
    """What building comfy-kitchen's W4A8 ``Params`` raises (at load), in its order: the
    combined geometry rule, then the shapes of scale (s_rel), s_channel, correction and
    codebook against the model's (N, K) (comfy-kitchen 0.2.40
    ``AsymW4A8Int8Layout.Params``).  ComfyUI never passes the correction in
    (``dropped_correction``), so it is not validated there."""
    n, k, g, c = env["N"], env["K"], env["group_size"], env["convrot_groupsize"]
    s_rel, s_ch = t.get("weight_s_rel"), t.get("weight_s_channel")
    if g < 4 or k % 16 or k % g or (c != 0 and k % c) or (16 % g and g % 16):
        return _v(
            "w4a8",
            f"K={k} must be divisible by 16, group_size={g}, and convrot_groupsize={c}; group_size must be "
            f">=4 and divide 16 or be a multiple of 16",
            prefix,
        )
    if c == 0:  # the same test divides by it
        return _v(
            "w4a8",
            "integer modulo by zero",
            prefix,
            exception="ZeroDivisionError",
            cause="convrot_groupsize 0",
            fix="set convrot_groupsize to 16, 64 or 256",
        )
    groups = k // g
    if s_rel is None:  # ComfyUI refuses it before ("Missing W4A8 group scale"); comfy-kitchen reads its shape
        return _v("w4a8", "'NoneType' object has no attribute 'shape'", prefix, "weight_s_rel", exception="AttributeError")
    if tuple(s_rel.shape) != (n, groups):
        return _v("w4a8", f"scale must have shape {(n, groups)}, got {tuple(s_rel.shape)}", prefix, "weight_s_rel")
    if s_ch is None or tuple(s_ch.shape) != (n,):
        got = None if s_ch is None else tuple(s_ch.shape)
        return _v("w4a8", f"s_channel must have shape {(n,)}, got {got}", prefix, "weight_s_channel")
    corr = None if dropped_correction else t.get("weight_correction")
    if corr is not None and tuple(corr.shape) != (groups, n):
        return _v("w4a8", f"correction must have shape {(groups, n)}, got {tuple(corr.shape)}", prefix, "weight_correction")
    cb = t.get("weight_codebook")
    if cb is not None and tuple(cb.shape) != (16,):
        return _v("w4a8", f"codebook must have shape (16,), got {tuple(cb.shape)}", prefix, "weight_codebook")
    return None


def w4a8_forward(target: str, t: dict, env: dict, dropped_correction: bool = False) -> Violation | None:
    """What W4A8's linear refuses at the first forward once ``Params`` built with the model's
    (N, K) (comfy-kitchen 0.2.40 ``validate_w4a8_operands``, eager backend): a ConvRot size
    that is not a power of 4; then the stored tensors against each other, K read off s_rel's
    groups: a packed row width that is neither 4 nor 6 bits of that K, 6-bit storage with a
    group size or extras it cannot have, s_rel and s_channel against the weight's rows; last,
    the input's K (the model's, for an input of shape [4, K]) against the stored one."""
    k_model, g, c = env["K"], env["group_size"], env["convrot_groupsize"]
    w, s_rel, s_ch = t["weight"], t.get("weight_s_rel"), t.get("weight_s_channel")
    v = _hadamard(LAYER, c)
    if v is None and len(w.shape) == 2 and s_rel is not None and len(s_rel.shape) == 2:
        v = _w4a8_operands(tuple(w.shape), tuple(s_rel.shape), s_ch, t, g, c, dropped_correction, k_model)
    if v is not None:
        v.rule = v.rule.replace("comfy-kitchen.", f"{target}.", 1)
    return v


def _w4a8_operands(w: tuple, s_rel: tuple, s_ch, t: dict, g: int, c: int, dropped: bool, k_model: int) -> Violation | None:
    n, cols = w
    k = s_rel[1] * g
    bits = cols * 8 // k if k > 0 else 0
    if k <= 0 or bits not in (4, 6) or k * bits != cols * 8:
        return _v("w4a8", f"packed row width {cols} does not match K={k} at 4 or 6 bits", LAYER, "weight")
    if bits == 6:
        if not six_bit_fits(k, g):
            return _v(
                "w4a8",
                f"6-bit storage needs K divisible by 32 and group_size a multiple of 16, got K={k}, group_size={g}",
                LAYER,
            )
        if "weight_codebook" in t or ("weight_correction" in t and not dropped):
            return _v("w4a8", "6-bit storage is uniform and symmetric: no codebook or correction", LAYER)
    if k % 16 or (c and k % c):
        return _v("w4a8", f"K={k} must be divisible by 16 and convrot_groupsize={c}", LAYER)
    if s_rel != (n, k // g):
        return _v("w4a8", f"s_rel must have shape {(n, k // g)}, got {s_rel}", LAYER, "weight_s_rel")
    if s_ch is not None and tuple(s_ch.shape) != (n,):
        return _v("w4a8", f"s_channel must have shape {(n,)}, got {tuple(s_ch.shape)}", LAYER, "weight_s_channel")
    if k_model != k:
        return _v("w4a8", f"Input K={k_model} does not match qdata K={k}", LAYER, "weight")
    return None


def w4a4_params(prefix: str, t: dict, env: dict) -> Violation | None:
    """What building ConvRot W4A4's ``Params`` raises (at load): its ``linear_dtype``."""
    ld = env.get("linear_dtype", "int4")
    if ld not in ("int4", "int8"):
        return _v("w4a4", f"ConvRot W4A4 linear_dtype must be 'int4' or 'int8', got {ld!r}", prefix)
    return None


CONVROT_DIVIDES = {
    "convrot_w4a4": "Input K={K} not divisible by convrot_groupsize {c}",
    "int8_tensorwise": "ConvRot group size {c} does not divide input features {K}",
}
"""What each ConvRot linear says when its group size does not divide K (comfy-kitchen 0.2.40)."""


def convrot_forward(target: str, name: str, env: dict) -> Violation | None:
    """What a ConvRot layer's first forward refuses, in the linear's order (measured): a group
    size of 0 (Python's modulo by zero), one that does not divide K, then one that is not a
    power of 4 (the Hadamard rotation it builds)."""
    if name not in CONVROT_DIVIDES or (name == "int8_tensorwise" and not env.get("convrot")):
        return None
    k, c = env["K"], env.get("convrot_groupsize")
    if not isinstance(c, int):
        return None
    if c == 0:
        v: Violation | None = _v(
            "convrot", "integer modulo by zero", LAYER, exception="ZeroDivisionError", cause="convrot_groupsize 0"
        )
    elif k % c:
        v = _v("convrot", CONVROT_DIVIDES[name].format(K=k, c=c), LAYER, cause=f"ConvRot group size {c} for K={k}")
    elif name == "convrot_w4a4" and k % 64:
        v = _v("convrot", f"in_features {k} not divisible by quant_group_size 64", LAYER)
    else:
        v = _hadamard(LAYER, c)
    if v is not None:
        v.rule = v.rule.replace("comfy-kitchen.", f"{target}.", 1)
        v.fix = v.fix or "re-quantize with convrot_groupsize 16, 64 or 256 dividing K"
    return v


FORWARD: dict[str, tuple[str, tuple[tuple[str, str, tuple[str, ...]], ...], int, int]] = {
    # format: (comfy-kitchen op of the first forward, (suffix, operand, accepted dtypes) in the
    # order the op's constraints list them, elements per block scale (0: none), elements per
    # stored weight byte)
    "asym_w4a8_int8": (
        "w4a8_int8_linear",
        (
            ("weight_s_rel", "s_rel", ("F8_E4M3", "F32")),
            ("weight_s_channel", "s_channel", ("F32",)),
            ("weight_codebook", "codebook", ("F32",)),
        ),
        0,
        2,
    ),
    "nvfp4": ("dequantize_nvfp4", (("weight_scale", "block_scales", ("F8_E4M3",)),), 16, 2),
    "mxfp8": ("dequantize_mxfp8", (("weight_scale", "block_scales", ("F8_E8M0",)),), 32, 1),
}
"""What comfy-kitchen's eager backend requires when a layer first runs (measured): the block
scales' geometry (elements per block scale, elements per stored weight byte)."""

VIEWS: dict[str, dict[str, tuple[str, tuple[str, ...] | None]]] = {
    # ComfyUI's pop_scale(..., dtype) views these scales as that dtype (the same bytes) before
    # they reach comfy-kitchen
    "nvfp4": {"weight_scale": ("F8_E4M3", None)},
    "mxfp8": {"weight_scale": ("F8_E8M0", None)},
    "asym_w4a8_int8": {"weight_s_rel": ("F8_E4M3", ("U8",))},
}
FLOATS = ("F32", "F16", "BF16")
OPERANDS: dict[str, dict[str, tuple[str, tuple[tuple[str, str, tuple[str, ...]], ...]]]] = {
    # target -> format -> (the comfy-kitchen op the first forward runs, (suffix, operand,
    # accepted dtypes), in the order it checks them).  Its message prints the accepted dtypes
    # as a Python set, in an order that changes from one process to the next.  ComfyUI (on
    # CPU) casts the weight to the layout's dtype itself.  Measured with comfy-kitchen 0.2.40's
    # eager backend.
    "comfy-kitchen": {
        "float8_e4m3fn": ("dequantize_per_tensor_fp8", (("weight", "x", ("F8_E4M3", "F8_E5M2")),)),
        "float8_e5m2": ("dequantize_per_tensor_fp8", (("weight", "x", ("F8_E4M3", "F8_E5M2")),)),
        "int8_tensorwise": ("int8_linear", (("weight", "weight", ("I8",)), ("weight_scale", "weight_scale", FLOATS))),
        "asym_w4a8_int8": (
            "w4a8_int8_linear",
            (
                ("weight", "qdata", ("I8",)),
                ("weight_s_rel", "s_rel", ("F32", "F8_E4M3")),
                ("weight_s_channel", "s_channel", ("F32",)),
                ("weight_codebook", "codebook", ("F32",)),
                ("weight_correction", "correction", FLOATS),
            ),
        ),
        "convrot_w4a4": ("convrot_w4a4_linear", (("weight", "qweight", ("I8",)), ("weight_scale", "wscales", FLOATS))),
        "nvfp4": ("dequantize_nvfp4", (("weight", "qx", ("U8",)), ("weight_scale", "block_scales", ("F8_E4M3",)))),
        "mxfp8": ("dequantize_mxfp8", (("weight", "qx", ("F8_E4M3",)), ("weight_scale", "block_scales", ("F8_E8M0",)))),
        "awq_w4a16": (
            "gemv_awq_w4a16",
            (("weight", "qweight", ("I8",)), ("weight_scale", "wscales", FLOATS), ("weight_zeros", "wzeros", FLOATS)),
        ),
    },
    "comfyui": {
        # the weight is cast to FP8 by ComfyUI and the scale to F32: no operand to refuse, but
        # the dequantize's multiply checks the scale's shape (scale_shape_template)
        "float8_e4m3fn": ("dequantize_per_tensor_fp8", ()),
        "float8_e5m2": ("dequantize_per_tensor_fp8", ()),
        "int8_tensorwise": ("int8_linear", (("weight_scale", "weight_scale", FLOATS),)),
        "asym_w4a8_int8": (
            "w4a8_int8_linear",
            (
                ("weight_s_rel", "s_rel", ("F32", "F8_E4M3")),
                ("weight_s_channel", "s_channel", ("F32",)),
                ("weight_codebook", "codebook", ("F32",)),
            ),
        ),
        "convrot_w4a4": ("convrot_w4a4_linear", (("weight_scale", "wscales", FLOATS),)),
        "nvfp4": ("dequantize_nvfp4", (("weight_scale", "block_scales", ("F8_E4M3",)),)),
        "mxfp8": ("dequantize_mxfp8", (("weight_scale", "block_scales", ("F8_E8M0",)),)),
    },
}


def runs_forward(target: str, name: str) -> bool:
    """Whether the first forward of a ``name`` layer has operand rules modelled for ``target``."""
    return name in OPERANDS[target] or name in FORWARD


def scale_shape_template(target: str, name: str, t: dict) -> Violation | None:
    """A scale whose shape the first forward refuses: an FP8 per-tensor scale that does not
    broadcast against the weight (torch's own error from the dequantize's multiply), an INT8
    scale that is neither one value nor one per weight row (the INT8 linear's check)."""
    w, s = t.get("weight"), t.get("weight_scale")
    if w is None or s is None or len(w.shape) != 2:
        return None
    message = exception = None
    if name in ("float8_e4m3fn", "float8_e5m2"):
        message, exception = broadcast_error(tuple(w.shape), tuple(s.shape)), "RuntimeError"
    elif name == "int8_tensorwise" and s.numel not in (1, w.shape[0]):
        message = f"INT8 weight scale must be scalar or per-output-channel, got ({s.numel},) for weight shape {tuple(w.shape)}"
        exception = "ValueError"
    if message is None:
        return None
    return Violation(
        f"{target}.scale-shape",
        message,
        exception,
        LAYER,
        "weight_scale",
        True,
        f"weight_scale of shape {list(s.shape)} for a weight of {list(w.shape)} (raised at the first forward)",
        "store the scale as the format defines it (comfyquant fix reshapes it when the values allow)",
    )


def forward_templates(
    target: str,
    name: str,
    t: dict,
    views: dict[str, tuple[str, tuple[str, ...] | None]] | None = None,
    convrot: bool = False,
) -> list[Violation]:
    """What one layer's first forward raises in comfy-kitchen, or nothing.  ``views``: the
    dtypes ComfyUI reinterprets operands as before they reach comfy-kitchen (suffix ->
    (dtype, only these source dtypes or None for any)); ``convrot``: an INT8 ConvRot layer."""
    op, operands = OPERANDS[target].get(name, ("", ()))
    _, _, block, per_byte = FORWARD.get(name, ("", (), 0, 1))
    viewed: dict[str, tuple[str, int]] = {}
    for suffix, operand, accepted in operands:
        e = t.get(suffix)
        if e is None:
            continue
        dtype, numel = e.dtype, e.numel
        view = (views or {}).get(suffix)
        if view is not None and (view[1] is None or dtype in view[1]) and dtype in DTYPE_BITS:
            numel, dtype = numel * DTYPE_BITS[dtype] // DTYPE_BITS[view[0]], view[0]
        viewed[suffix] = (dtype, numel)
        if dtype not in accepted:
            names = ", ".join(f"torch.{TORCH_DTYPES[d]}" for d in accepted)
            return [
                Violation(
                    f"{target}.dtype",
                    f"No backend can handle '{op}': eager: {operand}: dtype "
                    f"torch.{TORCH_DTYPES.get(dtype, dtype)} not in {{{names}}}",
                    "NoCapableBackendError",
                    LAYER,
                    suffix,
                    True,
                    f"{suffix} stored as {e.dtype}: comfy-kitchen's {op} takes {' or '.join(accepted)} "
                    "(raised at the first forward, not at load)",
                    f"store {suffix} as {accepted[0]} (comfyquant fix converts it when that is exact)",
                )
            ]
    shaped = scale_shape_template(target, name, t)
    if shaped is not None:
        return [shaped]
    if block and "weight_scale" in viewed and "weight" in t and len(t["weight"].shape) == 2:
        rows, cols = t["weight"].shape
        num_cols = cols * per_byte // block
        numel = viewed["weight_scale"][1]
        rb, cb = -(-rows // 128), -(-num_cols // 4)
        shape = "[-1, 32, 16]" if numel % 512 else f"[{rb}, {cb}, 4, 32, 4]" if numel != rb * cb * 512 else None
        if shape is not None:
            return [
                Violation(
                    f"{target}.blocked",
                    f"shape '{shape}' is invalid for input of size {numel}",
                    "RuntimeError",
                    LAYER,
                    "weight_scale",
                    True,
                    f"from_blocked cannot read {numel} block scales as the blocked, padded layout of "
                    f"[{rows}, {num_cols}] ({rb * cb * 512}); raised at the first forward",
                    "convert the scales to the blocked layout (comfyquant fix)",
                )
            ]
    if name in ROW_BLOCKS and "weight" in t and len(t["weight"].shape) == 2:
        v = _row_blocks(target, name, t["weight"].shape)
        if v is not None:
            return [v]
    if name == "nvfp4":
        v = _nvfp4_global_scale(target, t)
        if v is not None:
            return [v]
    if name in ROW_BLOCKS:
        v = _sliced_transposed(target, name, t)
        if v is not None:
            return [v]
    return []


def block_rows(name: str | None, t: dict) -> int | None:
    """The model's rows of a block-scaled layer (NVFP4, MXFP8) where the bias and the block
    scales outvote the weight: a bias whose length the scales' padded rows (a multiple of 128)
    fit while the weight's rows do not.  None when they do not outvote it."""
    if name not in ROW_BLOCKS:
        return None
    w, b, s = t.get("weight"), t.get("bias"), t.get("weight_scale")
    if w is None or b is None or s is None or len(w.shape) != 2 or len(b.shape) != 1 or len(s.shape) != 2:
        return None
    padded = s.shape[0]
    if -(-b.shape[0] // 128) * 128 == padded and -(-w.shape[0] // 128) * 128 != padded:
        return b.shape[0]
    return None


def _sliced_transposed(target: str, name: str, t: dict) -> Violation | None:
    """An MXFP8 weight stored transposed ([K, N], its columns the rows the bias and the block
    scales record): the runtime dequantizes it as stored, slices it to the model's [N, K] (the
    model's K is the weight's rows) and the first forward's matmul, on an input of shape
    [4, K], meets a weight of fewer columns."""
    block, per_byte = ROW_BLOCKS[name]
    n = block_rows(name, t)
    if n is None or per_byte != 1:
        return None
    rows, cols = t["weight"].shape
    if cols != n:
        return None
    k = rows
    sliced = (min(rows, n), min(cols, k))
    if sliced[1] == k:
        return None
    return Violation(
        f"{target}.sliced",
        f"mat1 and mat2 shapes cannot be multiplied (4x{k} and {sliced[1]}x{sliced[0]})",
        "RuntimeError",
        LAYER,
        "weight",
        True,
        f"weight stored [{rows}, {cols}] for a layer of {n} outputs (its bias and block scales): stored transposed; "
        f"the first forward (on an input of shape [4, {k}]) meets its slice to the model's [{n}, {k}]",
        f"store the weight as [{n}, {k}] (re-export the layer)",
    )


ROW_BLOCKS = {"mxfp8": (32, 1), "nvfp4": (16, 2)}
"""Formats whose dequantize reshapes each stored row into blocks: (elements per block,
elements per stored byte)."""


def _row_blocks(target: str, name: str, shape: tuple) -> Violation | None:
    """A weight row whose element count is not whole blocks: the dequantize's reshape into
    blocks fails with torch's view error (MXFP8 names the block count, NVFP4 infers it)."""
    block, per_byte = ROW_BLOCKS[name]
    rows, cols = shape
    elements = cols * per_byte
    if elements % block == 0:
        return None
    blocks = elements // block if name == "mxfp8" else -1
    return Violation(
        f"{target}.row-blocks",
        f"shape '[{rows}, {blocks}, {block}]' is invalid for input of size {rows * elements}",
        "RuntimeError",
        LAYER,
        "weight",
        True,
        f"weight rows of {elements} elements: {name} dequantizes whole blocks of {block} (raised at the first forward)",
        f"store the weight with K a multiple of {block}",
    )


def _nvfp4_global_scale(target: str, t: dict) -> Violation | None:
    """NVFP4's dequantize multiplies its per-tensor scale by the block scales read back as
    [N, K / 16]: a ``weight_scale_2`` of several values that does not broadcast against them
    raises torch's broadcasting error (scale first, block scales second)."""
    w, s2 = t.get("weight"), t.get("weight_scale_2")
    if w is None or s2 is None or len(w.shape) != 2 or s2.numel <= 1:
        return None
    blocks = (w.shape[0], w.shape[1] * 2 // 16)
    message = broadcast_error(tuple(s2.shape), blocks)
    if message is None:
        return None
    return Violation(
        f"{target}.scale-shape",
        message,
        "RuntimeError",
        LAYER,
        "weight_scale_2",
        True,
        f"weight_scale_2 of shape {list(s2.shape)}: NVFP4 takes one per-tensor value, multiplied by the "
        f"{list(blocks)} block scales at the first forward",
        "store weight_scale_2 as one value",
    )


def _block_scale(prefix: str, t: dict, env: dict) -> Violation | None:
    if "weight_scale" not in t:
        return _v("missing", f"layer '{prefix}' has no weight_scale", prefix, "weight_scale")
    return None  # its dtype and size are checked where they fail: at the first forward


_CHECKS = {
    "int8_tensorwise": _int8,
    "asym_w4a8_int8": check_w4a8,
    "convrot_w4a4": w4a4_params,
    "nvfp4": _block_scale,
    "mxfp8": _block_scale,
}
