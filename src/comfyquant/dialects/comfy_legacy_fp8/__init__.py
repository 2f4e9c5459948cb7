"""ComfyUI's legacy "scaled FP8" checkpoints (``*_fp8_scaled.safetensors``; ComfyUI 0.33.0
``comfy/utils.py`` ``convert_old_quants``).

A ``scaled_fp8`` sentinel tensor at the diffusion model's prefix (its dtype the FP8 type, 0
elements, or 2 for "no FP8 matmul"), and per linear layer an FP8 ``weight`` with a scalar
``scale_weight`` (and optionally ``scale_input``); layers kept in high precision may carry a
*dummy* ``scale_weight``.  ComfyUI translates this at load time (``convert_old_quants``) into
``float8_e4m3fn`` markers; that translation has known failure modes, which ``runtime``
models: every layer is marked E4M3 (an E5M2 weight is re-cast by value), a dense layer with a
dummy scale is cast to FP8, a sentinel outside the stripped prefix is lost, and a header map
switches the translation off.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ...dtypes import MODEL_FLOAT_DTYPES
from ...findings import DEEP_MEASURES, Finding
from ...formats.registry import FORMATS, infer_format
from ...io.header import TensorEntry
from ...shapes import broadcast_mismatch, fmt_shape
from ...targets.base import RuntimeFailure
from ..base import EXACT, LOSSY, REFUSED, Claim, Dialect, Lossy, Translation, ValueCast, exact
from ..common import (
    DIFFUSION_ROOTS,
    FLOAT_SCALE_DTYPES,
    LEGACY_SENTINEL,
    copy,
    drop_unit_scale_input,
    float_scalar,
    is_scalar_float,
    legacy_sentinels,
    root_of,
    scalar_scale,
    two_level_scales,
    unit_scale_inputs,
)
from ..decoders import scaled_fp8
from ..reading import read_sound

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "comfy-legacy-fp8"
SENTINEL = LEGACY_SENTINEL
DENSE_DTYPES = MODEL_FLOAT_DTYPES
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
COMFY_READING = next(f for f in FORMATS.values() if f.legacy_renames)
"""The format ComfyUI's translation marks every legacy layer with: the one whose
``legacy_renames`` say it replaces the legacy names."""
COMFY_DTYPE = next(s.dtype for s in COMFY_READING.slots if s.suffix == "weight")
"""The weight dtype of that reading, which every legacy weight is cast to."""


def _per_tensor_format(w) -> str | None:
    """The Comfy format of an FP8 weight with one F32 scale, as the format registry recognises
    the renamed layer (no format name is written here: the formats say what they are)."""
    renames = COMFY_READING.legacy_renames
    scale = TensorEntry(w.name, "F32", (), 0, 4, w.file)
    fmt = infer_format({"weight": w, renames["scale_weight"]: scale})
    return fmt.name if fmt is not None else None


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    flags = legacy_sentinels(ckpt)
    if not flags:
        return None
    full_precision = any(ckpt.tensors[n].numel == 2 for n in flags)
    two_level = two_level_scales(ckpt)  # musubi's layers (its dialect claims them): one scale would drop a factor
    layers: dict[str, Translation] = {}
    for prefix, layer in ckpt.layers.items():
        t = layer.tensors
        if prefix in claimed or layer.marker is not None or "scale_weight" not in t or "weight" not in t:
            continue
        if prefix in two_level:
            continue
        layers[prefix] = _translate(prefix, t, full_precision)
    notes = []
    for n in flags:
        e = ckpt.tensors[n]
        mm = "no FP8 matmul (full_precision_matrix_mult)" if e.numel == 2 else "FP8 matmul allowed"
        notes.append(f"sentinel {n!r} {e.dtype} {fmt_shape(e.shape)}: {mm}")
    return Claim(
        NAME,
        layers,
        drop=flags,
        notes=notes,
        unsettled=["scale_input == 1.0 (ComfyUI then drops it: dynamic activations)"]
        if any("scale_input" in tr.inputs for tr in layers.values())
        else [],
    )


def _translate(prefix: str, t: dict, full_precision: bool) -> Translation:
    w, sw, si = t["weight"], t["scale_weight"], t.get("scale_input")
    others = [copy(e, s) for s, e in t.items() if s not in ("weight", "scale_weight", "scale_input")]
    fmt = _per_tensor_format(w) if w.dtype in FP8_DTYPES else None
    renames = COMFY_READING.legacy_renames
    if w.dtype in DENSE_DTYPES:
        drops = [sw.name] + ([si.name] if si is not None else [])
        return Translation(
            prefix,
            NAME,
            "dense layer, dummy scale",
            t,
            verdict=EXACT,
            why=f"{w.dtype} weight: the scale is a placeholder, dropped",
            moves=[copy(w, "weight"), *others],
            drops=drops,
            dropped_why="dummy scale on a dense layer",
            unsettled=["the dummy scale_weight is 1.0"],
        )
    if fmt is None:
        return Translation(
            prefix,
            NAME,
            "unknown",
            t,
            verdict=REFUSED,
            why=f"{w.dtype} weight with scale_weight: not an FP8 layer ComfyUI's legacy layout knows",
        )
    if is_scalar_float(sw) and (si is None or is_scalar_float(si)):
        marker: dict[str, Any] = {"format": fmt}
        if full_precision:
            marker["full_precision_matrix_mult"] = True
        moves = [copy(w, "weight"), scalar_scale(sw, prefix, renames["scale_weight"]), *others]
        if si is not None:
            moves.append(scalar_scale(si, prefix, renames["scale_input"]))
        variant = "tensor" if fmt == COMFY_READING.name else f"tensor, {w.dtype}"
        why = ", ".join(f"rename {old} -> {new}" for old, new in renames.items() if old in t)
        if sw.dtype != "F32":
            why += f", {sw.dtype} scale -> F32 (exact)"
        unsettled = ["scale_input == 1.0"] if si is not None else []
        return exact(NAME, prefix, t, variant, fmt, why, marker, moves=moves, unsettled=unsettled)
    if sw.dtype in FLOAT_SCALE_DTYPES and (len(sw.shape) in (1, 2, 3)) and len(w.shape) == 2 and _scale_fits(w.shape, sw.shape):
        variant = "block" if len(sw.shape) == 3 else "channel"
        return Translation(
            prefix,
            NAME,
            variant,
            t,
            verdict=LOSSY,
            why=f"{variant} scale {fmt_shape(sw.shape)}: no Comfy FP8 format has per-{variant} scales",
            decoder=scaled_fp8(),
            lossy=Lossy(COMFY_READING.name, why="re-quantized per tensor"),
        )
    return Translation(
        prefix,
        NAME,
        "unknown",
        t,
        verdict=REFUSED,
        why=f"scale_weight {sw.dtype} {fmt_shape(sw.shape)} does not fit weight {fmt_shape(w.shape)}",
    )


def _scale_fits(wshape: tuple, sshape: tuple) -> bool:
    n, k = wshape
    if len(sshape) == 3:
        return sshape[0] == n and sshape[2] == 1 and sshape[1] > 0 and k % sshape[1] == 0
    return sshape in ((n,), (n, 1))


def settle(ckpt: Checkpoint, claim: Claim) -> list[Finding]:
    """Read the scalars the header cannot tell: ``scale_input == 1.0`` (ComfyUI drops it, so
    the migrated layer drops it too: the file keeps behaving as ComfyUI ran it) and whether a
    dense layer's dummy scale is 1.0 (any other value: which weight was meant is unknown)."""
    wanted = {
        tr.prefix: [
            tr.inputs[s]
            for s in ("scale_input", "scale_weight")
            if s in tr.inputs
            and tr.inputs[s].numel == 1
            and tr.inputs[s].dtype in FLOAT_SCALE_DTYPES
            and (s == "scale_input" or tr.format is None)
        ]
        for tr in claim.layers.values()
    }
    values = read_sound(ckpt, [e for entries in wanted.values() for e in entries])
    ones, findings = [], []
    for tr in claim.layers.values():
        if any(e.name not in values for e in wanted[tr.prefix]):
            continue  # a scale whose bytes are not what its header says: C001/C002 name it, it stays unsettled
        si = tr.inputs.get("scale_input")
        if si is not None and si.name in values and drop_unit_scale_input(tr, float_scalar(values[si.name], si.dtype)):
            tr.why = tr.why.replace(", rename scale_input -> input_scale", "") + ", drop scale_input == 1.0"
            ones.append(tr.prefix)
        if tr.format is None and tr.verdict == EXACT:
            sw = tr.inputs["scale_weight"]
            if sw.name in values:
                v = float_scalar(values[sw.name], sw.dtype)
                if v != 1.0:
                    tr.verdict = REFUSED
                    tr.why = (
                        f"dense {tr.inputs['weight'].dtype} weight with scale_weight {v!r}, not 1.0: whether the "
                        "weight or weight x scale is meant is unknown"
                    )
                    findings.append(
                        Finding(
                            "F004",
                            f"layer {tr.prefix}: dense weight carries scale_weight {v!r}, not a dummy 1.0",
                            layer=tr.prefix,
                            tensor=sw.name,
                            cause="a dense layer with a real scale in a legacy file",
                            fix="compare with the original weights before using this layer",
                        )
                    )
        tr.unsettled = []
    claim.unsettled = []  # what stays open is on the layers it concerns
    return findings + unit_scale_inputs(
        ones,
        "legacy",
        "ComfyUI drops it and runs them with dynamic activation scales",
        cause="the value, not the header, decides ComfyUI's activation scheme",
        fix="nothing to do; comfyquant migrate drops it the same way",
    )


def _recast(tr: Translation) -> bool:
    """A weight of another FP8 type, which ComfyUI's translation re-casts by value to its reading."""
    return tr.format is not None and tr.format != COMFY_READING.name


def _dense_cast(tr: Translation) -> bool:
    """A dense weight beside a ``scale_weight``, which ComfyUI casts to FP8 and multiplies by it."""
    return tr.format is None and tr.verdict != LOSSY and tr.inputs["weight"].dtype in DENSE_DTYPES


def value_casts(claim: Claim) -> list[ValueCast]:
    """The weights ComfyUI's translation casts by value to its FP8 reading: a weight of another
    FP8 type (its scale applies to both readings alike) and a dense weight, which it then
    multiplies by a one-value ``scale_weight``."""
    out = []
    for tr in claim.layers.values():
        w, sw = tr.inputs["weight"], tr.inputs.get("scale_weight")
        if _recast(tr):
            out.append(ValueCast(tr.prefix, w, COMFY_DTYPE))
        elif _dense_cast(tr) and sw is not None and sw.numel == 1:
            out.append(ValueCast(tr.prefix, w, COMFY_DTYPE, sw))
    return out


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """ComfyUI's only: SGLang and comfy-kitchen read markers only, and their profiles judge the
    unmarked weights."""
    out: list[RuntimeFailure] = []
    fp8 = [tr for tr in claim.layers.values() if tr.format is not None or tr.verdict == LOSSY]
    if ckpt.markers.headers:
        for tr in fp8:
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"layer '{tr.prefix}': the header has _quantization_metadata, so "
                    "ComfyUI skips its legacy translation and casts the FP8 weight by value without its "
                    "scale_weight (garbage output, no error)",
                    None,
                    tr.prefix,
                    "weight",
                    "silent",
                    "legacy layers in a file that also has a marker map",
                    "comfyquant migrate",
                    severity="error",
                )
            )
        return out
    roots = {root_of(p) for p in claim.layers}
    flag_roots = {n[: -len(SENTINEL)] for n in claim.drop}
    lost = [r for r in roots if r in DIFFUSION_ROOTS and r not in flag_roots]
    for tr in fp8:
        if root_of(tr.prefix) in lost:
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"layer '{tr.prefix}': ComfyUI strips '{root_of(tr.prefix)}' before "
                    f"looking for the sentinel, and the file has it as {sorted(claim.drop)[0]!r}: the "
                    "sentinel is lost and the FP8 weight is cast by value without its scale (garbage "
                    "output, no error)",
                    None,
                    tr.prefix,
                    "weight",
                    "silent",
                    "scaled_fp8 sentinel outside the diffusion model's prefix",
                    "comfyquant migrate",
                    severity="error",
                )
            )
    for tr in sorted(claim.layers.values(), key=lambda tr: tr.prefix):
        si = tr.inputs.get("scale_input")
        count = math.prod(si.shape) if si is not None else 1
        if si is not None and root_of(tr.prefix) not in lost and count != 1:
            # the translation reads scale_input with .item() to drop a 1.0: the whole load stops
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"a Tensor with {count} elements cannot be converted to Scalar",
                    "RuntimeError",
                    tr.prefix,
                    "scale_input",
                    "load",
                    f"scale_input of shape {fmt_shape(si.shape)}: ComfyUI's legacy translation reads it as one value",
                    "store scale_input as one value (comfyquant migrate)",
                    severity="error",
                )
            )
            break
    for tr in claim.layers.values():
        w = tr.inputs["weight"]
        if _recast(tr):
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"layer '{tr.prefix}': ComfyUI's legacy translation marks every layer {COMFY_READING.name} "
                    f"and re-casts this {w.dtype} weight by value (garbage where its values lie outside "
                    f"{COMFY_READING.name}'s range; {DEEP_MEASURES} the cast's relative error)",
                    None,
                    tr.prefix,
                    "weight",
                    "silent",
                    f"{w.dtype} weights in a legacy file",
                    f"comfyquant migrate (writes {tr.format} markers)",
                    severity="warning",
                )
            )
        elif _dense_cast(tr):
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"layer '{tr.prefix}': ComfyUI marks any layer with a scale_weight "
                    f"{COMFY_READING.name}, casts this {w.dtype} weight to FP8 and multiplies it by the scale "
                    "(precision lost with a dummy 1.0; garbage with another scale unless the weight holds FP8 "
                    f"values; {DEEP_MEASURES} the cast's relative error)",
                    None,
                    tr.prefix,
                    "weight",
                    "silent",
                    "scale_weight on a dense layer",
                    "comfyquant migrate (drops a dummy scale)",
                    severity="warning",
                )
            )
        elif tr.verdict == LOSSY and broadcast_mismatch(tuple(w.shape), tuple(tr.inputs["scale_weight"].shape)):
            sw = tr.inputs["scale_weight"]
            # the float8_e4m3fn layout multiplies the weight by its scale as stored: torch's error
            out.append(
                RuntimeFailure(
                    "comfyui",
                    "",
                    "RuntimeError",
                    tr.prefix,
                    "scale_weight",
                    "forward",
                    f"{tr.variant} scale_weight {fmt_shape(sw.shape)} for a weight of {fmt_shape(w.shape)}: ComfyUI's "
                    "float8_e4m3fn layout multiplies the weight by it at the first forward",
                    "comfyquant migrate --allow-lossy, or dequantize",
                    severity="error",
                    broadcast=(tuple(w.shape), tuple(sw.shape)),
                )
            )
        elif tr.verdict == LOSSY:
            rank = len(tr.inputs["scale_weight"].shape)
            out.append(
                RuntimeFailure(
                    "comfyui",
                    f"(no exact ComfyUI message modelled) layer '{tr.prefix}': "
                    f"{tr.variant} scale_weight {fmt_shape(tr.inputs['scale_weight'].shape)} is not a "
                    "per-tensor scale: ComfyUI's float8_e4m3fn layout takes one scale per tensor",
                    None if rank < 3 else "RuntimeError",
                    tr.prefix,
                    "scale_weight",
                    "forward" if rank == 3 else "silent",
                    "per-channel or block scales (ComfyUI report #10491)",
                    "comfyquant migrate --allow-lossy, or dequantize",
                    severity="error",
                )
            )
    return out


DIALECTS = (
    Dialect(
        NAME,
        "ComfyUI legacy scaled FP8",
        writer="ComfyUI before 0.4 (fp8_scaled checkpoints)",
        source="ComfyUI 0.33.0 comfy/utils.py convert_old_quants",
        detect=detect,
        failures=failures,
        rule_tag="legacy",
        settle=settle,
        value_casts=value_casts,
        order=10,
    ),
)
