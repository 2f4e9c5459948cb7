"""ComfyUI's layers at the size its model builds them with (``comfyui_model``): what loading
and the first forward do with a file's tensors where that size is not the one they record, what
the model lacks, and what its layers' silent losses make of the whole model.

A ``Linear`` of ComfyUI's model checks its bias, and torch every norm and table, against the
model's size at load; a marked layer's weight reaches comfy-kitchen with the model's size as its
``orig_shape`` (on CPU FP8, NVFP4 and MXFP8 are dequantized and cut to it; INT8, ConvRot W4A4
and W4A8 compare the input and their own tensors with it); an unmarked weight of a quantized
model is assigned unchecked.  Measured against ComfyUI 0.33.0 on whole tiny Flux and Wan 2.1
models (docs/runtimes.md, *Whole models*).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..architectures.base import Shapes
from ..dtypes import QUANTIZED_WEIGHT_DTYPES
from .base import Violation, bind
from .comfyui_model import CUT_ON_CPU, WholeModel, recorded_fits, recorded_size, size_mismatch


def corrections_at_model_level(whole: WholeModel, violations: list[Violation]) -> None:
    """The dropped W4A8 corrections, judged on the whole model: where its architecture's output
    is garbage without them (``Detected.dropped_correction``), a silent error."""
    d = whole.resolution.detected
    if d is None or d.model is None or d.dropped_correction != "garbage":
        return
    for v in violations:
        if v.rule == "comfyui.correction":
            v.severity = "error"
            # the layer's own words up to its "(no error; ...)" aside, then the model's verdict
            head = v.message.rsplit(" (no error;", 1)[0]
            v.message = f"{head} (no error): through the {d.name} model's blocks its output is garbage"


def dropped_layer(out: list, whole: WholeModel, prefix: str, marker, t: dict) -> None:
    """A quantized layer outside the prefix ComfyUI adopts: its keys are dropped unread."""
    w = t.get("weight")
    if marker is None and (w is None or w.dtype not in QUANTIZED_WEIGHT_DTYPES):
        return
    kept = whole.resolution.prefix
    out.append(
        Violation(
            "comfyui.dropped",
            f"layer '{prefix}' lies outside the prefix '{kept}' ComfyUI strips: its keys are dropped and it is not loaded",
            None,
            prefix,
            None,
            False,
            f"more than five keys carry the prefix '{kept}', and ComfyUI keeps only the keys that do",
            f"store every key under '{kept}' or none under it",
        )
    )


def true_size(
    whole: WholeModel,
    by_size: dict | None,
    prefix: str,
    layer,
    marker,
    true,
    biases: list,
    forward: list,
    cut_on_cpu: frozenset = CUT_ON_CPU,
) -> bool:
    """The layer's tensors against the size ComfyUI's architecture builds it at; True when its
    stored weight is not of that size (the per-layer forward rules, which assume the recorded
    size, then do not apply).  ``by_size``: the layer class's readings of its weight by model
    size (None for an unmarked layer); ``cut_on_cpu``: the formats cut to the model's size."""
    t = layer.tensors
    b = t.get("bias")
    if b is not None and tuple(b.shape) != (true.n,):
        v = Violation(
            "comfyui.bias",
            size_mismatch(prefix, "bias", tuple(b.shape), (true.n,)),
            "RuntimeError",
            prefix,
            "bias",
            True,
            f"bias of shape {list(b.shape)} for a layer the model builds with {true.n} outputs",
            f"store the bias as [{true.n}]",
        )
        biases.append(v)
    fits: bool | None
    size: tuple[int, int] | None
    if marker is None:  # a plain weight records its size as it is
        w = t.get("weight")
        if w is None or len(w.shape) != 2 or (w.shape[0], w.shape[1]) == (true.n, true.k):
            return False
        fits, size = False, (w.shape[0], w.shape[1])
    else:
        assert by_size is not None
        reading = by_size.get((true.n, true.k))
        if reading is None:
            reading = by_size[(true.n, true.k)] = (recorded_fits(layer, marker, true), recorded_size(layer, marker))
        fits, size = reading
    if fits is not False and not (
        isinstance(marker, dict) and marker.get("format") == "asym_w4a8_int8" and size != (true.n, true.k)
    ):
        return False  # (W4A8's Params are built with the model's size even when its weight fits it)
    w = t["weight"]
    fmt = marker.get("format") if isinstance(marker, dict) else None
    if marker is None and not whole.quantized:
        biases.append(
            Violation(
                "comfyui.size",
                size_mismatch(prefix, "weight", tuple(w.shape), (true.n, true.k)),
                "RuntimeError",
                prefix,
                "weight",
                True,
                f"weight of shape {list(w.shape)} for a layer the model builds as [{true.n}, {true.k}] "
                "(no layer is marked: ComfyUI loads the model with plain layers, which check every size)",
                "store the weight at the model's size, with its marker if it is quantized",
            )
        )
        return True
    if marker is None:  # a quantized model's unmarked layer takes its weight unchecked
        forward.append(
            Violation(
                "comfyui.model-size",
                f"mat1 and mat2 shapes cannot be multiplied (Mx{true.k} and {w.shape[1]}x{w.shape[0]})",
                "RuntimeError",
                prefix,
                "weight",
                True,
                f"unmarked weight of shape {list(w.shape)} in a quantized model: ComfyUI assigns it unchecked "
                f"and the first forward multiplies an input of {true.k} features by it (M: the input's rows)",
                "add the layer's marker, or store the weight at the model's size",
            )
        )
        return True
    if fmt == "asym_w4a8_int8":
        return True  # its Params are checked against the model's size at load (w4a8_at_model_size)
    model = whole.model
    external = model is not None and whole.model_name(prefix) in model.external
    detected = whole.resolution.detected
    read_width = detected is not None and f"{prefix}.weight" in detected.read
    at_size = _forward_at_model_size(prefix, fmt, marker, t, w, size, true, external, read_width, cut_on_cpu)
    if at_size is not None:
        forward.append(at_size)
    return True


def w4a8_at_model_size(prefix: str, marker: dict, t: dict, true) -> tuple[Violation | None, Violation | None]:
    """comfy-kitchen's W4A8 ``Params`` built with the model's (N, K) as ``orig_shape``: what
    loading a layer of another size raises, else what its first forward raises (the stored
    operands checked against each other, then against the model's K)."""
    from ..formats.base import GeometryError
    from ..formats.w4a8 import ASYM_W4A8_INT8, model_geometry
    from .kitchen import check_w4a8, w4a8_forward

    try:
        env = dict(model_geometry(t, ASYM_W4A8_INT8.params(marker)), N=true.n, K=true.k)
    except GeometryError:
        return None, None
    v = check_w4a8(prefix, t, env, dropped_correction=True)
    if v is not None:
        return Violation("comfyui.ck", v.message, v.exception, prefix, v.tensor, True, v.cause, v.fix), None
    first = w4a8_forward("comfyui", t, env, dropped_correction=True)
    return None, (bind([first], prefix)[0] if first is not None else None)


def _forward_at_model_size(
    prefix: str, fmt, marker: dict, t: dict, w, size, true, external: bool, read_width: bool, cut_on_cpu: frozenset
) -> Violation | None:
    """What the first forward of a quantized layer stored at another size than the model's
    raises.  On CPU, FP8, NVFP4 and MXFP8 are dequantized and cut to the model's size: a weight
    that covers it runs, a narrower one meets the input in torch's matmul (M: the input's rows).
    INT8's linear compares the input's K with the stored one, then adds the bias of the model's
    N to an output of the stored N.  A layer the model's inputs feed (``external``) gets the
    data's width, the K the file records, even where detection built the layer narrower (a
    packed weight read as the layer's width)."""
    cause = (
        f"weight recording {list(size) if size else list(w.shape)} for a layer the model builds as [{true.n}, {true.k}]: "
        "comfy-kitchen gets the model's size as orig_shape and the first forward meets the stored one"
    )
    fix = "re-quantize the layer at the model's size"

    def matmul_error(message: str) -> Violation:
        """torch's error where the cut weight meets the input (M: its rows) or the bias."""
        return Violation(
            "comfyui.model-size",
            message,
            "RuntimeError",
            prefix,
            "weight",
            True,
            cause + " (M: the rows of the layer's input)",
            fix,
        )

    if size is None:
        return None
    n_file, k_file = size
    if fmt in CUT_ON_CPU and fmt not in cut_on_cpu:  # dequantized whole: the stored weight meets the input
        width = k_file if external else true.k
        if k_file != width:
            return matmul_error(f"mat1 and mat2 shapes cannot be multiplied (Mx{width} and {k_file}x{n_file})")
        if n_file != true.n and "bias" in t:
            return matmul_error(
                f"The expanded size of the tensor ({n_file}) must match the existing size ({true.n}) at non-singleton "
                f"dimension 1.  Target sizes: [M, {n_file}].  Tensor sizes: [{true.n}]"
            )
        return None
    if fmt in CUT_ON_CPU:
        width = k_file if external else true.k  # the model's inputs have the data's width
        if n_file >= true.n and k_file >= true.k and width == true.k:
            if k_file > true.k and read_width:  # the cut columns are the weight's own, not padding
                return Violation(
                    "comfyui.model-size",
                    f"layer '{prefix}': ComfyUI built the layer {true.k} wide from the packed weight's width and cuts "
                    f"the weight's {k_file} columns to it (garbage output, no error)",
                    None,
                    prefix,
                    "weight",
                    False,
                    cause + " (detection read the layer's width from the packed weight)",
                    fix,
                    severity="error",
                )
            return None
        rows, cols = min(n_file, true.n), min(k_file, true.k)  # the weight cut to the model's size
        if cols == width and rows != true.n and "bias" in t:  # the product has too few columns for the bias
            return matmul_error(
                f"The expanded size of the tensor ({rows}) must match the existing size ({true.n}) at non-singleton "
                f"dimension 1.  Target sizes: [M, {rows}].  Tensor sizes: [{true.n}]"
            )
        if cols == width:
            return None  # the product has the weight's rows: what follows meets them
        return matmul_error(f"mat1 and mat2 shapes cannot be multiplied (Mx{width} and {cols}x{rows})")
    scale = t.get("weight_scale")
    rows = scale.shape[0] if scale is not None and len(scale.shape) in (1, 2) and scale.shape[-1:] != (0,) else None
    if scale is not None and len(scale.shape) == 2 and scale.shape[1] != 1:
        rows = None  # not a row scale
    width = k_file if external else true.k
    if fmt == "int8_tensorwise" and k_file != width:
        message, exc = f"Input and weight inner dimensions must match, got {width} and {k_file}", "ValueError"
    elif fmt == "int8_tensorwise" and rows is not None and rows not in (1, n_file):
        message = (  # ComfyUI hands the layout its row scales as a vector
            f"INT8 weight scale must be scalar or per-output-channel, got ({rows},) for weight shape ({w.shape[0]}, {w.shape[1]})"
        )
        exc = "ValueError"
    elif fmt == "convrot_w4a4" and k_file != width:
        message, exc = f"Input K={width} does not match qweight K={k_file}", "ValueError"
    elif fmt in ("int8_tensorwise", "convrot_w4a4") and n_file != true.n and "bias" in t:
        message = f"The size of tensor a ({n_file}) must match the size of tensor b ({true.n}) at non-singleton dimension 1"
        exc = "RuntimeError"
    elif fmt in ("int8_tensorwise", "convrot_w4a4"):
        return None  # it runs at the stored size
    else:
        message = (
            f"(no ComfyUI message modelled) layer '{prefix}': the weight records [{n_file}, {k_file}] while the model "
            f"builds the layer as [{true.n}, {true.k}]"
        )
        exc = "RuntimeError"
    return Violation("comfyui.model-size", message, exc, prefix, "weight", True, cause, fix)


def parameters(whole: WholeModel, markers: dict) -> tuple[list[Violation], list[Violation], list[Violation]]:
    """(what loading raises, what the first forward raises, what runs undefined) for the model's
    parameters outside its ``Linear`` layers' own rules: a norm, convolution or modulation table
    of another size than the model's (torch checks those at load), and the parameters the file
    does not hold: ``load_state_dict(strict=False)`` logs them (``unet missing``) and leaves them
    as allocated, uninitialised; a quantized model's ``Linear`` without a weight keeps none and
    its forward fails."""
    model = whole.model
    if model is None:
        return [], [], []
    kept = whole.resolution.kept
    prefix = whole.resolution.prefix
    load: list[Violation] = []
    forward: list[Violation] = []
    missing: list[str] = []
    no_weight: set[str] = set()
    # the header's own entries where the keys are stored unprefixed (no per-key view)
    raw: Mapping[str, Any] = kept.raw if isinstance(kept, Shapes) else kept
    at = kept.at if isinstance(kept, Shapes) else None
    # the usual file holds every parameter under its own name: only the sizes of those outside
    # the Linear layers are left to see
    params = model.plain() if model.names() <= raw.keys() else model.params
    for p in params:
        if p.name in raw:
            stored: str | None = p.name
        else:
            stored = next((a for a in p.aliases if a in raw), None) if p.aliases else None
        if stored is not None:
            if p.linear is not None:
                continue  # its layer's rules judge it
            entry = raw[stored]
            have = tuple(entry[at] if at is not None else entry)
            if have != p.shape:
                module, _, suffix = p.name.rpartition(".")
                load.append(
                    Violation(
                        "comfyui.size",
                        size_mismatch(prefix + module, suffix, tuple(have), p.shape),
                        "RuntimeError",
                        prefix + module,
                        suffix,
                        True,
                        f"{stored} of shape {list(have)} where the model builds {list(p.shape)}",
                        f"store {stored} as {list(p.shape)}",
                    )
                )
            continue
        if p.linear is not None and whole.quantized:
            if p.linear in no_weight:
                continue  # the module returned before loading its bias
            if p.name.endswith(".weight"):
                no_weight.add(p.linear)
                if prefix + p.linear not in markers:  # a marked layer's own rule says it
                    forward.append(
                        Violation(
                            "comfyui.weight",
                            "'NoneType' object has no attribute 'device'",
                            "AttributeError",
                            prefix + p.linear,
                            "weight",
                            True,
                            f"the model's layer {p.linear} has no weight in the file: ComfyUI logs 'Missing "
                            "weight' and the layer's first forward reads the weight it does not have",
                            "store the layer's weight",
                        )
                    )
                continue
        missing.append(p.name)
    if not missing:
        return load, forward, []
    shown = ", ".join(repr(m) for m in missing[:8]) + (", ..." if len(missing) > 8 else "")
    count = "this parameter" if len(missing) == 1 else f"these {len(missing)} parameters"
    module, _, suffix = missing[0].rpartition(".")
    v = Violation(
        "comfyui.missing",
        f"unet missing: [{shown}]: ComfyUI runs with {count} uninitialised (undefined output, no error)",
        None,
        prefix + module,
        suffix,
        False,
        f"the file lacks {len(missing)} of the parameters the {whole.resolution.detected.name} model builds",  # type: ignore[union-attr]
        "store every parameter of the model",
        severity="error",
    )
    return load, forward, [v]
