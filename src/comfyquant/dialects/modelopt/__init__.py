"""NVIDIA ModelOpt's ComfyUI exports, FP8 and NVFP4 (NVIDIA Model-Optimizer
`modelopt/torch/export/`).

``export_hf_checkpoint`` with ModelOpt's single-file post-processing
(``modelopt/torch/export/unified_export_hf.py::_postprocess_safetensors``, ``diffusers_utils.py``)
writes the header ``quantization_config`` (``convert_hf_quant_config_format``: ``quant_method``
``modelopt``, ``quant_algo`` ``FP8`` / ``NVFP4`` / ``MIXED_PRECISION`` ..., ``ignore``) and, with
``enable_layerwise_quant_metadata``, a ``_quantization_metadata`` map whose every layer has
``{"format": quant_algo.lower()}`` (``build_layerwise_quant_metadata``): ``"fp8"``,
``"nvfp4"``, ``"mixed_precision"``.  No ``.comfy_quant`` tensors.

* FP8 layers are Comfy ``float8_e4m3fn`` tensors already (F8 weight, scalar ``weight_scale``,
  usually ``input_scale``); only the marker name differs (ComfyUI has no ``"fp8"``): exact.
* NVFP4 layers are packed **low nibble first** (``qtensor/nvfp4_tensor.py``), their scales
  **linear** ``[N, K/16]`` unless ``enable_swizzle_layout`` blocked them, rows padded to 16
  with ``padding_strategy="row"``, also packed and scale columns with ``"row_col"``: the Comfy
  layer is a byte permutation of them.  Which scale layout a layer has, its shape tells unless
  ``N % 128 == 0`` and the column count is a multiple of 4; the swizzle is one flag for the
  whole file, so one layer whose shape tells decides the others.  When none does, the header
  does not say either, and the layers are refused rather than guessed.
* ``pre_quant_scale`` (AWQ-style, which ComfyUI applies) is kept; NVFP4_SVD's low-rank
  ``svdquant_lora_a/b`` has no Comfy NVFP4 slot (refused).

A migrated file keeps ModelOpt's ``quantization_config`` under ``comfyquant.modelopt_quantization_config``
and the layout it came from under ``comfyquant.modelopt_layout``: the header no longer
claims a ModelOpt layout its tensors no longer have (SGLang falls back to
``quantization_config`` when a file has no layer map; this package detects by it), and
``migrate --to modelopt`` writes the same layout back.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...findings import Finding
from ...io.jsontext import parse as parse_json
from ...numerics import nvfp4_layouts as lay
from ...numerics.blocked import ceil_to
from ...shapes import fmt_shape
from ...targets.base import RuntimeFailure
from ...version import __version__
from ..base import EXACT, LOSSY, REFUSED, Claim, Dialect, Lossy, Translation, exact
from ..bfl import nvfp4
from ..common import FLOAT_SCALE_DTYPES, copy, is_scalar_float, scalar_scale
from ..decoders import scaled_fp8

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "modelopt"
CONFIG_KEY = "quantization_config"
SAVED_CONFIG_KEY = "comfyquant.modelopt_quantization_config"
LAYOUT_KEY = "comfyquant.modelopt_layout"
"""Written by comfyquant: the ModelOpt layout of this file (after ``migrate --to modelopt``), or
the one a Comfy file was migrated from: ``{"scales": "linear"|"blocked", "rows": "model"|"padded",
"row_col": bool}``."""
SOURCE = "ModelOpt packs the low nibble first"
DEFAULT_LAYOUT = {"scales": lay.LINEAR, "rows": "model", "row_col": False}
"""ModelOpt's export without its ComfyUI post-processing: linear scales, nothing padded."""
SVD_SUFFIXES = ("svdquant_lora_a", "svdquant_lora_b")


def _json(text) -> dict | None:
    try:
        obj = parse_json(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def modelopt_config(meta: dict) -> dict | None:
    """The header's ``quantization_config`` when ModelOpt wrote it (``quant_method`` or the
    producer's name is ``modelopt``)."""
    cfg = _json(meta.get(CONFIG_KEY))
    if cfg is None:
        return None
    producer = cfg.get("producer")
    if cfg.get("quant_method") == "modelopt" or (isinstance(producer, dict) and producer.get("name") == "modelopt"):
        return cfg
    return None


def recorded_layout(meta: dict) -> dict | None:
    obj = _json(meta.get(LAYOUT_KEY))
    if obj is None or obj.get("scales") not in (lay.LINEAR, lay.BLOCKED, None):
        return None
    return obj


def fp8_tensors(t: dict) -> bool:
    w = t.get("weight")
    return w is not None and w.dtype == "F8_E4M3" and len(w.shape) == 2 and "weight_scale" in t and "weight_scale_2" not in t


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    meta = ckpt.metadata()
    cfg = modelopt_config(meta)
    if cfg is None:
        return None
    record = recorded_layout(meta)
    nv: dict[str, dict[str, int]] = {}
    fp8: list[str] = []
    comfy_marked: list[str] = []
    for prefix, layer in ckpt.layers.items():
        if prefix in claimed or layer.bank is not None:  # ModelOpt writes no expert banks
            continue
        if any(rec.kind == "tensor" for rec in layer.sources):
            comfy_marked.append(prefix)
            continue
        if nvfp4.nvfp4_tensors(layer.tensors):
            nv[prefix] = nvfp4.fits(layer.tensors)
        elif fp8_tensors(layer.tensors):
            fp8.append(prefix)
    algo = cfg.get("quant_algo")
    notes = [
        f"quantization_config: quant_method modelopt, quant_algo {algo!r}; NVFP4 codes are packed low nibble "
        "first (ModelOpt's packing; the header cannot show it)"
    ]
    if comfy_marked:
        notes.append(
            f"{len(comfy_marked)} layer(s) (e.g. {comfy_marked[0]}) have comfy_quant tensors, which ModelOpt "
            "never writes: left as Comfy layers"
        )
    layers: dict[str, Translation] = {}
    unsettled: list[str] = []
    scales, evidence = _scale_layout(nv, record)
    for prefix, fits in nv.items():
        layers[prefix] = _nvfp4(ckpt, prefix, fits, scales, evidence, unsettled)
    for prefix in fp8:
        layers[prefix] = _fp8(prefix, ckpt.layers[prefix])
    if not layers:
        return Claim(NAME, notes=notes)
    keep = {SAVED_CONFIG_KEY: meta[CONFIG_KEY]}
    if nv:
        keep[LAYOUT_KEY] = json.dumps({"scales": scales, **_padding(ckpt, nv, scales)})
    return Claim(NAME, layers, metadata_drop=[CONFIG_KEY, LAYOUT_KEY], metadata_set=keep, notes=notes, unsettled=unsettled)


def _scale_layout(nv: dict[str, dict[str, int]], record: dict | None) -> tuple[str | None, str]:
    """The file's scale layout and the evidence for it (None: no evidence, or contradicting)."""
    if record is not None and record.get("scales"):
        return record["scales"], f"the header's {LAYOUT_KEY} (written by comfyquant)"
    linear = [p for p, f in nv.items() if set(f) == {lay.LINEAR}]
    blocked = [p for p, f in nv.items() if set(f) == {lay.BLOCKED}]
    if linear and blocked:
        return None, (
            f"layers {linear[0]!r} (linear scales) and {blocked[0]!r} (blocked scales) disagree, and "
            "ModelOpt swizzles all layers of a file or none"
        )
    if linear or blocked:
        layout, which = (lay.LINEAR, linear[0]) if linear else (lay.BLOCKED, blocked[0])
        return (
            layout,
            f"layer {which!r} of this file has scales only the {layout} layout fits (ModelOpt swizzles "
            "all layers of a file or none)",
        )
    return None, (
        "no layer of this file has a shape that tells, and the header does not record whether ModelOpt "
        "swizzled the scales (enable_swizzle_layout)"
    )


def _nvfp4(
    ckpt: Checkpoint, prefix: str, fits: dict[str, int], scales: str | None, evidence: str, unsettled: list[str]
) -> Translation:
    t = ckpt.layers[prefix].tensors
    svd = [n for n in (f"{prefix}.{s}" for s in SVD_SUFFIXES) if n in ckpt.tensors]
    if svd:
        return Translation(
            prefix,
            NAME,
            "nvfp4",
            t,
            verdict=REFUSED,
            why=f"NVFP4_SVD low-rank residual {svd[0]!r}: Comfy nvfp4 has no slot for it",
        )
    if not fits:
        return Translation(
            prefix,
            NAME,
            "nvfp4",
            t,
            verdict=REFUSED,
            why=f"weight_scale {fmt_shape(t['weight_scale'].shape)} fits neither linear nor blocked "
            f"scales of weight {fmt_shape(t['weight'].shape)}",
        )
    if len(fits) == 1:
        layout = next(iter(fits))
        if scales is not None and layout != scales:
            return Translation(
                prefix,
                NAME,
                "nvfp4",
                t,
                verdict=REFUSED,
                why=f"its scales fit only the {layout} layout, while {evidence} says {scales}",
            )
        note = []
    elif scales is None:
        return Translation(
            prefix,
            NAME,
            "nvfp4",
            t,
            verdict=REFUSED,
            why=f"weight_scale {fmt_shape(t['weight_scale'].shape)} fits both the linear and the "
            f"blocked layout (N % 128 == 0, columns % 4 == 0); {evidence}",
        )
    else:
        layout = scales
        note = [
            f"scale layout: linear and blocked have the same shape here (the data does not show it either); "
            f"{layout} because {evidence}"
        ]
        if note[0] not in unsettled:
            unsettled.append(note[0])
    tr = nvfp4.to_comfy(
        prefix,
        t,
        nvfp4.Packing(NAME, "nvfp4", lay.LOW_FIRST, layout),
        scale_cols=fits[layout],
        source=SOURCE,
        unsettled=note,
    )
    return _marker_note(tr, ckpt.layers[prefix])


def _fp8(prefix: str, layer) -> Translation:
    t = layer.tensors
    w, s, si = t["weight"], t["weight_scale"], t.get("input_scale")
    others = [copy(e, suffix) for suffix, e in t.items() if suffix not in ("weight", "weight_scale", "input_scale")]
    if "pre_quant_scale" in t:
        return Translation(
            prefix, NAME, "fp8", t, verdict=REFUSED, why="pre_quant_scale on an FP8 layer: Comfy float8_e4m3fn has no slot for it"
        )
    if si is not None and not is_scalar_float(si):
        return Translation(
            prefix, NAME, "fp8", t, verdict=REFUSED, why=f"input_scale {si.dtype} {fmt_shape(si.shape)} is not one float"
        )
    if is_scalar_float(s):
        moves = [copy(w, "weight"), scalar_scale(s, prefix, "weight_scale"), *others]
        if si is not None:
            moves.append(scalar_scale(si, prefix, "input_scale"))
        changes = [m.what for m in moves if m.what]
        why = "Comfy float8_e4m3fn tensors" + (f" ({', '.join(changes)})" if changes else "")
        return _marker_note(exact(NAME, prefix, t, "fp8", "float8_e4m3fn", why, moves=moves), layer)
    if s.dtype in FLOAT_SCALE_DTYPES and tuple(s.shape) in ((w.shape[0],), (w.shape[0], 1)):
        return Translation(
            prefix,
            NAME,
            "fp8 per-channel",
            t,
            verdict=LOSSY,
            why=f"per-channel weight_scale {fmt_shape(s.shape)}: Comfy FP8 takes one scale per tensor",
            moves=[m for m in others],
            decoder=scaled_fp8("weight", "weight_scale"),
            lossy=Lossy("float8_e4m3fn", why="requantized with one scale per tensor"),
        )
    return Translation(
        prefix,
        NAME,
        "fp8",
        t,
        verdict=REFUSED,
        why=f"weight_scale {s.dtype} {fmt_shape(s.shape)} does not fit weight {fmt_shape(w.shape)}",
    )


def _marker_note(tr: Translation, layer) -> Translation:
    fmt = layer.marker.get("format") if isinstance(layer.marker, dict) else None
    if tr.format is not None and fmt != tr.format:
        said = f"marker format {fmt!r}" if layer.marker is not None else "no marker (no _quantization_metadata)"
        tr.why = f"{said} -> {tr.format!r}; {tr.why}"
    return tr


def _padding(ckpt: Checkpoint, nv: dict[str, dict[str, int]], scales: str | None) -> dict:
    """What the shapes show of ModelOpt's ``padding_strategy``: rows padded past the bias
    (``row``), scale columns padded to 16 (``row_col``, which pads the rows too)."""
    rows = "model"
    row_col = False
    for prefix, fits in nv.items():
        t = ckpt.layers[prefix].tensors
        weight, bias = t["weight"], t.get("bias")
        if bias is not None and len(bias.shape) == 1 and bias.shape[0] < weight.shape[0]:
            rows = "padded"
        layout = scales if scales in fits else next(iter(fits), None)
        kblocks = 2 * weight.shape[1] // lay.BLOCK
        if layout is not None and fits[layout] > (kblocks if layout == lay.LINEAR else ceil_to(kblocks, 4)):
            row_col = True
    return {"rows": "padded" if row_col else rows, "row_col": row_col}


def settle(ckpt: Checkpoint, claim: Claim) -> list[Finding]:
    """Read the block scales whose translation drops padding (``row_col`` scale columns, the
    blocked layout's padding): padding that is not zero is not padding, and the layer is refused."""
    return nvfp4.settle(ckpt, claim)


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    return [f for target in ("comfyui", "sglang") for f in _failures(target, ckpt, claim)]


def _failures(target: str, ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """What ComfyUI and SGLang do with ModelOpt's layers as they are, beyond what their own
    profiles already say of a marked layer (ComfyUI's ``KeyError: 'fp8'``, SGLang's format set,
    a scale shape that fails ``from_blocked``): both read an ``nvfp4`` layer-map entry as Comfy's
    layout, high nibble first, which ModelOpt's codes are not (garbage output, no error).  A
    layer without a layer-map entry is left to this model by the ComfyUI profile."""
    out: list[RuntimeFailure] = []
    if target not in ("comfyui", "sglang"):
        return out
    runtime_name = "ComfyUI" if target == "comfyui" else "SGLang"
    for tr in claim.layers.values():
        layer = ckpt.layers.get(tr.prefix)
        if layer is None:
            continue
        w = tr.inputs["weight"]
        if layer.marker is None:
            if target == "comfyui":
                u8 = w.dtype == "U8"
                what = (
                    (
                        f"loads the U8 weight {fmt_shape(w.shape)} as a plain weight where the model has "
                        f"[{w.shape[0]}, {2 * w.shape[1]}] (size mismatch at load)"
                    )
                    if u8
                    else "casts the F8 weight by value without its weight_scale (garbage output, no error)"
                )
                out.append(
                    RuntimeFailure(
                        "comfyui",
                        f"(no exact ComfyUI message modelled) layer '{tr.prefix}': no "
                        f"_quantization_metadata entry, so ComfyUI {what}",
                        "RuntimeError" if u8 else None,
                        tr.prefix,
                        "weight",
                        "load" if u8 else "silent",
                        "ModelOpt export without enable_layerwise_quant_metadata",
                        "comfyquant migrate",
                        severity="error",
                    )
                )
            continue
        if layer.marker.get("format") != "nvfp4" or not nvfp4.nvfp4_tensors(tr.inputs):
            continue  # the runtime's own profile judges the marker (an unknown format raises there)
        if target == "comfyui" and set(nvfp4.fits(tr.inputs)) == {lay.LINEAR}:
            continue  # the ComfyUI profile has from_blocked's reshape error for these scales
        out.append(
            RuntimeFailure(
                target,
                f"(no {runtime_name} message modelled) layer '{tr.prefix}': "
                f"{runtime_name} reads a marked nvfp4 layer high nibble first (and its scales as "
                "blocked); ModelOpt packs the low nibble first (garbage output, no error)",
                None,
                tr.prefix,
                "weight",
                "silent",
                "ModelOpt NVFP4 layout under a Comfy marker",
                "comfyquant migrate",
                severity="error",
            )
        )
    return out


def export(ckpt: Checkpoint, claimed: set) -> Claim | None:
    """Comfy ``nvfp4`` / ``float8_e4m3fn`` layers in ModelOpt's layout: the layout the file was
    migrated from (``comfyquant.modelopt_layout``), else ModelOpt's plain export (linear
    scales, nothing padded)."""
    meta = ckpt.metadata()
    layout: dict[str, Any] = dict(DEFAULT_LAYOUT)  # updated from the header's record: any JSON value
    layout.update({k: v for k, v in (recorded_layout(meta) or {}).items() if k in DEFAULT_LAYOUT and v is not None})
    saved = _json(meta.get(SAVED_CONFIG_KEY))
    picked: dict[str, str] = {}
    for prefix, layer in ckpt.layers.items():
        if prefix in claimed or layer.marker is None or layer.inferred or layer.bank is not None:
            continue
        if layer.format_name == "nvfp4" and nvfp4.nvfp4_tensors(layer.tensors):
            picked[prefix] = "NVFP4"
        elif (
            layer.format_name == "float8_e4m3fn" and fp8_tensors(layer.tensors) and is_scalar_float(layer.tensors["weight_scale"])
        ):
            picked[prefix] = "FP8"
    if not picked:
        return None
    algos = set(picked.values())
    algo = saved.get("quant_algo") if saved else (algos.pop() if len(algos) == 1 else "MIXED_PRECISION")
    marker = {"format": str(algo).lower()}
    layers: dict[str, Translation] = {}
    for prefix, kind in picked.items():
        t = ckpt.layers[prefix].tensors
        if kind == "NVFP4":
            tr = layers[prefix] = nvfp4.from_comfy(
                prefix,
                t,
                nvfp4.Packing(NAME, "nvfp4", lay.LOW_FIRST, layout["scales"]),
                keep_rows=layout["rows"] == "padded",
                pad_scale_cols=bool(layout["row_col"]),
                marker=dict(marker),
            )
            tr.header_only = True
            nvfp4.check_padding(ckpt, tr)
        else:
            moves = [copy(e, suffix) for suffix, e in t.items() if suffix != "comfy_quant"]
            layers[prefix] = Translation(
                prefix,
                NAME,
                "fp8",
                t,
                verdict=EXACT,
                why="the same tensors, ModelOpt's marker",
                marker=dict(marker),
                moves=moves,
                header_only=True,
                drops=[t["comfy_quant"].name] if "comfy_quant" in t else [],
                dropped_why="ModelOpt writes the header map only",
            )
    config = (
        text
        if saved and (text := meta.get(SAVED_CONFIG_KEY)) is not None
        else json.dumps(
            {
                "quant_algo": algo,
                "quant_method": "modelopt",
                "ignore": [],
                "producer": {"name": "comfyquant", "version": __version__},
            }
        )
    )
    return Claim(
        NAME, layers, metadata_drop=[SAVED_CONFIG_KEY], metadata_set={CONFIG_KEY: config, LAYOUT_KEY: json.dumps(layout)}
    )


DIALECTS = (
    Dialect(
        NAME,
        "NVIDIA ModelOpt ComfyUI export (FP8 / NVFP4)",
        writer="NVIDIA ModelOpt export_hf_checkpoint with its ComfyUI post-processing",
        source="NVIDIA/Model-Optimizer modelopt/torch/export/diffusers_utils.py, unified_export_hf.py, convert_hf_config.py",
        detect=detect,
        failures=failures,
        rule_tag="modelopt",
        settle=settle,
        export=export,
        order=20,
    ),
)
