"""musubi-tuner's ``fp8_scaled`` checkpoints (musubi-tuner `src/musubi_tuner/modules/`): FP8
weights with musubi's scales.

kohya-ss/musubi-tuner ``src/musubi_tuner/modules/fp8_optimization_utils.py`` keeps each quantized
``<layer>.weight`` (F8_E4M3, or F8_E5M2 with ``--fp8_format e5m2``) and adds ``<layer>.scale_weight``
in one of three shapes, which is the whole tell of its mode (``quantize_weight``):

* ``tensor``: one element, ``[1]`` in the first writer (``torch.tensor([scale])``), ``[]`` since;
* ``channel``: ``[N, 1]`` (``[N]`` accepted: the same numbers);
* ``block``: ``[N, K/B, 1]`` over B-wide blocks of K (B = 64 by default, 16 in "fast" mode).

The scale dtype is the original weight's (BF16/F16/F32) on the main branch and F32 where the
block mode is *two-level* (the ``exp-nvfp4-support-for-torch-2-10`` branch, commit 0c9905b):
there ``scale_weight`` holds block scale / max block scale and ``<layer>.scale_weight_tensor`` (F32,
one element) that max, and the loader computes ``(q * scale_weight) * scale_weight_tensor``
(``fp8_linear_forward_patch``: the block factor first).  Older block files store the total block
scale only.  musubi writes no ``scaled_fp8`` sentinel (files that have one are ComfyUI's legacy
layout, which its own dialect claims first).

Decoders evaluate musubi's formula in F32, in its order.  For single-level scales that is the
exact product, which musubi's own result (computed in the scale's dtype) is the once-rounded
copy of; the two-level loader computes in the activations' dtype, so only with F32 activations
is it the very same bits (with BF16 ones it rounds each factor to BF16 first).

What it becomes: per-tensor layers are the Comfy per-tensor FP8 format of their element type exactly (a rename,
``[1]`` -> ``[]``, an exact BF16/F16 -> F32 upcast); no Comfy FP8 format has per-channel or per-block
scales, so those layers are lossy (``--allow-lossy`` requantizes them from the exact decode).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ...findings import Finding
from ...formats.registry import infer_format
from ...io.header import TensorEntry
from ...shapes import fmt_shape
from ...targets.base import RuntimeFailure
from ..base import EXACT, LOSSY, REFUSED, Claim, Dialect, Lossy, Translation, exact, refused
from ..common import (
    FLOAT_SCALE_DTYPES,
    TWO_LEVEL_SCALE,
    copy,
    drop_unit_scale_input,
    float_scalar,
    is_scalar_float,
    legacy_sentinels,
    scalar_scale,
    two_level_scales,
    unit_scale_inputs,
)
from ..decoders import scaled_fp8
from ..reading import read_sound

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "musubi-fp8"
_refused = partial(refused, NAME)
TENSOR_SCALE = TWO_LEVEL_SCALE
"""The two-level block mode's per-tensor factor; ``detect`` groups it with its layer."""
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
OWN = ("weight", "scale_weight", "scale_input", TENSOR_SCALE)
LOSSY_TARGET = Lossy(
    "float8_e4m3fn",
    why="re-quantized with one scale per tensor: no Comfy FP8 format keeps "
    "per-channel or per-block scales, and per-tensor E4M3 loads in every runtime",
)


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    """Unmarked layers with an FP8 weight and a ``scale_weight``, in a file without the legacy
    sentinel; in a file with it, only the layers with a two-level ``scale_weight_tensor`` (the
    legacy dialect leaves those: its one-scale reading would drop the factor).  Header only."""
    second = two_level_scales(ckpt)
    only_two_level = bool(legacy_sentinels(ckpt))
    if only_two_level and not second:
        return None
    layers: dict[str, Translation] = {}
    for prefix, layer in ckpt.layers.items():
        t = layer.tensors
        if prefix in claimed or layer.marker is not None or "scale_weight" not in t:
            continue
        if only_two_level and prefix not in second:
            continue
        w = t.get("weight")
        if w is None or w.dtype not in FP8_DTYPES:
            continue
        inputs = dict(t)
        if prefix in second:
            inputs[TENSOR_SCALE] = second[prefix]
        layers[prefix] = _translate(prefix, inputs)
    if not layers:
        return None
    notes = []
    variants: dict[str, int] = {}
    for tr in layers.values():
        variants[tr.variant] = variants.get(tr.variant, 0) + 1
    notes.append("musubi-tuner fp8_scaled layers: " + "; ".join(f"{n} {v}" for v, n in sorted(variants.items())))
    if all(tr.variant.startswith("tensor") for tr in layers.values()):
        notes.append(
            "per-tensor scales only: this may also be a ComfyUI legacy scaled-FP8 file without its scaled_fp8 "
            "sentinel; the translation is the same either way"
        )
    orphans = sorted(p for p in second if p not in layers)
    if orphans:
        notes.append(f"{len(orphans)} {TENSOR_SCALE} tensor(s) belong to no FP8 layer (e.g. {orphans[0]!r}): left as they are")
    unsettled = sorted({u for tr in layers.values() for u in tr.unsettled})
    return Claim(NAME, layers, notes=notes, unsettled=unsettled)


def per_tensor_format(w) -> str | None:
    """The Comfy format a 2-D FP8 weight with one F32 ``weight_scale`` is, as the format registry
    recognises it (no format name is written here: the formats say what they are)."""
    fmt = infer_format({"weight": w, "weight_scale": TensorEntry(w.name, "F32", (), 0, 4, w.file)})
    return fmt.name if fmt is not None else None


def _translate(prefix: str, t: dict) -> Translation:
    w, sw, st = t["weight"], t["scale_weight"], t.get(TENSOR_SCALE)
    if sw.dtype not in FLOAT_SCALE_DTYPES:
        return _refused(prefix, t, f"scale_weight is {sw.dtype}: musubi writes F32/BF16/F16 scales")
    if st is not None and not is_scalar_float(st):
        return _refused(
            prefix, t, f"{TENSOR_SCALE} {st.dtype} {fmt_shape(st.shape)} is not one float: musubi writes an F32 scalar"
        )
    if len(w.shape) != 2:
        return _refused(prefix, t, f"{fmt_shape(w.shape)} weight: Comfy FP8 formats hold 2-D linear weights")
    n, k = w.shape
    others = [copy(e, s) for s, e in t.items() if s not in OWN]
    if is_scalar_float(sw):
        fmt = per_tensor_format(w)
        if fmt is None:
            return _refused(prefix, t, f"no Comfy format holds a {w.dtype} weight with one scale")
        return _per_tensor(prefix, t, fmt, others)
    if sw.shape in ((n,), (n, 1)):
        return Translation(
            prefix,
            NAME,
            "channel",
            t,
            verdict=LOSSY,
            why=f"per-channel scale_weight {fmt_shape(sw.shape)}: no Comfy FP8 format has per-channel scales",
            decoder=scaled_fp8(),
            lossy=LOSSY_TARGET,
        )
    if len(sw.shape) == 3 and sw.shape[0] == n and sw.shape[2] == 1 and sw.shape[1] > 0 and k % sw.shape[1] == 0:
        size = k // sw.shape[1]
        if st is not None:
            return Translation(
                prefix,
                NAME,
                "block, two-level",
                t,
                verdict=LOSSY,
                why=f"block scales {fmt_shape(sw.shape)} (blocks of {size}) times the per-tensor "
                f"{TENSOR_SCALE}: no Comfy FP8 format has block scales (MXFP8 needs blocks of 32 "
                "with power-of-two scales)",
                decoder=scaled_fp8(second_suffix=TENSOR_SCALE),
                lossy=LOSSY_TARGET,
            )
        return Translation(
            prefix,
            NAME,
            "block",
            t,
            verdict=LOSSY,
            why=f"block scales {fmt_shape(sw.shape)} (blocks of {size}, total scale per block): no Comfy "
            "FP8 format has block scales (MXFP8 needs blocks of 32 with power-of-two scales)",
            decoder=scaled_fp8(),
            lossy=LOSSY_TARGET,
        )
    return _refused(
        prefix,
        t,
        f"scale_weight {sw.dtype} {fmt_shape(sw.shape)} fits none of musubi's modes for weight "
        f"{fmt_shape(w.shape)} ([1]/[] tensor, [N, 1] channel, [N, K/B, 1] block)",
    )


def _per_tensor(prefix: str, t: dict, fmt: str, others: list) -> Translation:
    w, sw, si, st = t["weight"], t["scale_weight"], t.get("scale_input"), t.get(TENSOR_SCALE)
    moves = [copy(w, "weight"), scalar_scale(sw, prefix, "weight_scale"), *others]
    drops, dropped_why, unsettled = [], "", ["scale_weight is finite and positive"]
    why = "rename scale_weight -> weight_scale"
    if sw.dtype != "F32" or sw.shape != ():
        why += f" ({sw.dtype} {fmt_shape(sw.shape)} -> F32 [], exact)"
    if si is not None:
        if is_scalar_float(si):
            moves.append(scalar_scale(si, prefix, "input_scale"))
            why += ", scale_input -> input_scale"
            unsettled.append("scale_input == 1.0")
        else:
            drops.append(si.name)
            dropped_why = "a non-scalar scale_input, which musubi's loader never reads"
    if st is not None:
        # fp8_linear_forward_patch multiplies by scale_weight_tensor in its block branch only
        drops.append(st.name)
        dropped_why = (
            dropped_why + "; " if dropped_why else ""
        ) + f"{TENSOR_SCALE}, which musubi applies to block scales only (its loader ignores it here)"
    variant = "tensor" if w.dtype == "F8_E4M3" else "tensor, e5m2"
    return exact(
        NAME,
        prefix,
        t,
        variant,
        fmt,
        why,
        moves=moves,
        drops=drops,
        dropped_why=dropped_why,
        unsettled=unsettled,
        decoder=scaled_fp8(),
    )


def settle(ckpt: Checkpoint, claim: Claim) -> list[Finding]:
    """Read the one-element scales: a per-tensor ``scale_weight`` (and a two-level layer's
    ``scale_weight_tensor``) that is not finite and positive decodes to garbage, so the layer is
    refused; ``scale_input == 1.0`` is dropped (ComfyUI drops it too: dynamic activations)."""
    wanted: dict[str, list] = {}
    for tr in claim.layers.values():
        wanted[tr.prefix] = []
        for s in ("scale_weight", "scale_input", TENSOR_SCALE):
            e = tr.inputs.get(s)
            if e is not None and is_scalar_float(e) and tr.verdict != REFUSED:
                wanted[tr.prefix].append(e)
    read = read_sound(ckpt, [e for entries in wanted.values() for e in entries])
    values = {n: float_scalar(d, ckpt.tensors[n].dtype) for n, d in read.items()}
    findings: list[Finding] = []
    ones, unit_tensor = [], []
    for tr in claim.layers.values():
        if any(e.name not in values for e in wanted[tr.prefix]):
            continue  # a scale whose bytes are not what its header says: C001/C002 name it, it stays unsettled
        for s in ("scale_weight", TENSOR_SCALE):
            e = tr.inputs.get(s)
            if e is None or e.name not in values:
                continue
            v = values[e.name]
            if not (v > 0.0 and v != float("inf")):
                if s == TENSOR_SCALE and tr.format is not None:
                    continue  # dropped: musubi never reads it on a per-tensor layer
                tr.verdict, tr.format, tr.marker, tr.moves, tr.decoder, tr.lossy = REFUSED, None, None, [], None, None
                tr.why = f"{s} is {v!r}: musubi's scales are positive (clamped to >= 1e-8), this one decodes to garbage"
                findings.append(
                    Finding(
                        "F004",
                        f"layer {tr.prefix}: {s} is {v!r}, not a positive finite scale",
                        layer=tr.prefix,
                        tensor=e.name,
                        severity="error",
                        cause="a damaged or hand-edited musubi scale",
                        fix="re-export the layer from its source weights",
                    )
                )
            elif s == TENSOR_SCALE and v == 1.0 and tr.variant == "block, two-level":
                unit_tensor.append(tr.prefix)
        si = tr.inputs.get("scale_input")
        if si is not None and si.name in values and drop_unit_scale_input(tr, values[si.name]):
            ones.append(tr.prefix)
        tr.unsettled = []
    claim.unsettled = []  # what stays open is on the layers it concerns
    findings += unit_scale_inputs(
        ones,
        "musubi",
        "dropped, the layer runs with dynamic activation scales",
        "musubi never reads scale_input",
        "nothing to do",
    )
    if unit_tensor:
        findings.append(
            Finding(
                "F004",
                f"{len(unit_tensor)} two-level block layer(s) have {TENSOR_SCALE} == 1.0 (e.g. "
                f"{unit_tensor[0]}): their block scales are the total scales",
                severity="info",
                cause="the tensor factor is 1.0",
                fix="nothing to do",
            )
        )
    return findings


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """ComfyUI reads no musubi scales: without the ``scaled_fp8`` sentinel its legacy translation
    (``convert_old_quants``) does nothing, so each unmarked FP8 weight is cast to the compute dtype
    by value and ``scale_weight`` stays an unexpected key: garbage without an error (the ComfyUI
    profile leaves a claimed unmarked layer to this model).  Block scales fail even where a
    sentinel makes ComfyUI read them (ComfyUI report #10491).  SGLang: see ``_sglang``.  comfy-kitchen
    never sees an unmarked layer."""
    return [*(_comfyui(tr) for tr in claim.layers.values()), *_sglang(claim)]


def _fix(tr: Translation) -> str:
    if tr.verdict == EXACT:
        return "comfyquant migrate"
    if tr.verdict == LOSSY:
        return "comfyquant migrate --allow-lossy, or comfyquant dequantize"
    return "re-export the layer"


def _comfyui(tr: Translation) -> RuntimeFailure:
    w = tr.inputs["weight"]
    block = tr.variant.startswith("block")
    cause = "musubi scales without a marker or the scaled_fp8 sentinel"
    if block:
        cause += "; block scales are not read even with the sentinel (ComfyUI report #10491)"
    return RuntimeFailure(
        "comfyui",
        f"layer '{tr.prefix}' has a {w.dtype} weight with a musubi {tr.variant} scale_weight "
        "but no marker and no scaled_fp8 sentinel: ComfyUI casts it to the compute dtype by value "
        "without its scale (garbage output, no error)",
        None,
        tr.prefix,
        "weight",
        "silent",
        cause,
        _fix(tr),
        severity="error",
    )


def _sglang(claim: Claim) -> list[RuntimeFailure]:
    """SGLang's profile refuses the unmarked E4M3 weights itself ("Quantized weights are
    missing comfy_quant metadata"); it does not count E5M2 as quantized, which only the dialect
    can say is a scaled weight loaded by value."""
    out: list[RuntimeFailure] = []
    for prefix, tr in claim.layers.items():
        if tr.inputs["weight"].dtype == "F8_E5M2":
            out.append(
                RuntimeFailure(
                    "sglang",
                    f"(no SGLang message modelled) layer '{prefix}': SGLang does not count "
                    "F8_E5M2 weights as quantized and loads this one as a dense weight by value, without "
                    "its scale_weight (garbage output)",
                    None,
                    prefix,
                    "weight",
                    "silent",
                    "E5M2 musubi layer without a marker",
                    _fix(tr),
                    severity="error",
                )
            )
    return out


DIALECTS = (
    Dialect(
        NAME,
        "musubi-tuner fp8_scaled (per-tensor, per-channel, per-block)",
        writer="kohya-ss/musubi-tuner --fp8_scaled (fp8_optimization_utils.quantize_weight)",
        source="musubi-tuner src/musubi_tuner/modules/fp8_optimization_utils.py quantize_weight, fp8_linear_forward_patch",
        detect=detect,
        failures=failures,
        rule_tag="musubi",
        settle=settle,
        order=20,
    ),
)
