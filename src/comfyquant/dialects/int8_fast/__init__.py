"""ComfyUI-INT8-Fast checkpoints (BobJohnson24), and the WINT8 quantizer's.

ComfyUI-INT8-Fast's ``INT8ModelSave`` (``int8_save.py``) saves through ``comfy.sd.save_checkpoint``,
so every tensor sits under ComfyUI's checkpoint prefix ``model.diffusion_model.``; it adds per
quantized linear a ``comfy_quant`` marker (it prepends ``model.`` to the module name itself) and,
for a scalar scale, ``weight_scale`` (F32 ``[]``); row scales are the ``[N, 1]`` F32 buffer of
``quantize_int8_axiswise``.  Its marker changed over time:

* ``{"quarot": bool[, "quarot_groupsize": C]}`` (the first saves; the rotation is ComfyUI's ConvRot,
  the regular Hadamard of a power-of-4 size, 256 by default, ``quarot.py``);
* ``{"convrot": bool[, "convrot_groupsize": C], "per_row": bool}``;
* ``{"format": "int8_tensorwise", "convrot": ..., "per_row": ...}`` ("without it core's UNETLoader
  raises 'Unknown quantization format'", as the writer's comment says).

The header keeps the source file's ``int8_quantized``/``int8_model_type`` metadata (kept by
``migrate``).  Winnougan's
WINT8 quantizer (``wint8_model_quantizer.py``), made for the same loader, writes
``{"format": "int8_tensorwise", "per_row": true[, "convrot": true, "convrot_groupsize": C]}``, an
``input_scale`` of 1.0 per layer and ``int8_quantized``/``int8_model_type`` as U8 *tensors*; its
rotation is the Sylvester Hadamard (``scipy.linalg.hadamard``, sizes 64-256), not ConvRot's.

What it becomes: canonical ``int8_tensorwise`` exactly (the weight and scale bytes as they are, a
``format`` key added, ``per_row``/``quarot*`` dropped or renamed, a ``[N]``/``[1]`` scale reshaped,
an unused ``input_scale`` dropped).  The ``model.diffusion_model.`` prefix is kept: it is ComfyUI's
own checkpoint prefix, which its UNETLoader strips and its checkpoint loader expects.  Layers
rotated with a Sylvester Hadamard have no Comfy form (ComfyUI and comfy-kitchen rotate with the
regular one): lossy, requantized from the un-rotated weights.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

from ...shapes import fmt_shape
from ...targets.base import RuntimeFailure
from ..base import EXACT, LOSSY, Claim, Dialect, Lossy, Move, Translation, refused
from ..common import FLOAT_SCALE_DTYPES, copy, root_of, scalar_scale, upcast

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "int8-fast"
_refused = partial(refused, NAME)
FORMAT = "int8_tensorwise"
FLAGS = ("int8_quantized", "int8_model_type")
"""File-level flags: ``__metadata__`` keys (INT8ModelSave, kept: its loader reads them) or U8
tensors (the WINT8 quantizer's, which also tell that ``convrot`` means its Sylvester rotation)."""
WRITER_KEYS = frozenset(
    {"format", "convrot", "convrot_groupsize", "per_row", "quarot", "quarot_groupsize", "full_precision_matrix_mult"}
)
"""Every key these writers put in a marker (a marker with another key is someone else's)."""
DEFAULT_GROUP = 256
"""ConvRot size the writers use when the marker names none (``CONVROT_GROUP_SIZE``)."""
MARKER_TENSOR = "comfy_quant"


def _flags(ckpt: Checkpoint) -> tuple[list[str], list[str]]:
    """(metadata keys, tensor names) of the file-level flags."""
    meta = ckpt.metadata()
    keys = [k for k in FLAGS if k in meta]
    tensors = [n for n in ckpt.other_tensors if n.rpartition(".")[2] in FLAGS or n in FLAGS]
    return keys, tensors


def _is_pow4(v: int) -> bool:
    return v >= 4 and v & (v - 1) == 0 and math.log(v, 4) % 1 == 0


def _ours(marker: dict, t: dict, wint8: bool) -> bool:
    """Whether a layer is one of these writers' and needs translating: a marker without
    ``format`` made of their keys only, or an ``int8_tensorwise`` marker with their ``per_row``
    or ``quarot`` key (convert_to_quant, the other writer of ``per_row``, also writes
    ``orig_dtype``), or WINT8's layer (an ``input_scale`` or ConvRot in a WINT8 file).  A layer
    already canonical is Comfy's, whatever the file's flags say (a migrated file keeps
    INT8-Fast's metadata)."""
    if not set(marker) <= WRITER_KEYS:
        return False
    fmt = marker.get("format")
    if fmt is None:
        return bool(set(marker) & {"convrot", "per_row", "quarot"})
    if fmt != FORMAT:
        return False
    # an input_scale alone is no trace of WINT8 (a canonical layer may carry an extra one, which
    # ComfyUI leaves unread): WINT8 writes per_row in every marker, or its flags mark the file
    return bool(set(marker) & {"per_row", "quarot", "quarot_groupsize"}) or (
        wint8 and ("input_scale" in t or bool(marker.get("convrot")))
    )


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    meta_keys, flag_tensors = _flags(ckpt)
    wint8 = bool(flag_tensors)
    layers: dict[str, Translation] = {}
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker
        if prefix in claimed or marker is None or not _ours(marker, layer.tensors, wint8):
            continue
        w = layer.tensors.get("weight")
        if w is None or w.dtype != "I8":
            continue
        layers[prefix] = _translate(prefix, layer.tensors, marker, sylvester_default=wint8)
    if not layers:
        return None
    notes = []
    if meta_keys:
        notes.append(
            "header metadata "
            + ", ".join(f"{k}={ckpt.metadata().get(k)!r}" for k in meta_keys)
            + ": kept (ComfyUI-INT8-Fast's loader and save node read them)"
        )
    if flag_tensors:
        notes.append(
            f"flag tensors {flag_tensors} (the WINT8 quantizer's mark, which says its rotations are "
            "Sylvester Hadamards): dropped, no longer true of the migrated layers"
        )
    prefixed = sum(1 for p in layers if root_of(p))
    if prefixed:
        notes.append(
            f"{prefixed} layer(s) under {root_of(next(p for p in layers if root_of(p)))!r} "
            "(comfy.sd.save_checkpoint's prefix): kept, ComfyUI's loaders read it"
        )
    return Claim(NAME, layers, drop=flag_tensors, notes=notes)


def _translate(prefix: str, t: dict, marker: dict, sylvester_default: bool) -> Translation:
    """One layer.  ``sylvester_default``: the file is the WINT8 quantizer's, whose ``convrot``
    rotation is the Sylvester Hadamard."""
    w, s = t["weight"], t.get("weight_scale")
    if s is None:
        return _refused(prefix, t, "no weight_scale: INT8-Fast writes one per quantized layer")
    if len(w.shape) != 2:
        return _refused(prefix, t, f"{fmt_shape(w.shape)} weight: int8_tensorwise holds 2-D linear weights")
    n, k = w.shape
    if s.dtype not in FLOAT_SCALE_DTYPES:
        return _refused(prefix, t, f"weight_scale is {s.dtype}: INT8-Fast writes F32 scales")
    if s.numel == 1 and len(s.shape) <= 1:
        layout, scale_move = "scalar", scalar_scale(s, prefix, "weight_scale")
    elif s.shape in ((n, 1), (n,)):
        layout = "per-row"
        what = [] if s.dtype == "F32" else [f"{s.dtype} -> F32 (exact)"]
        if s.shape != (n, 1):
            what.append(f"{fmt_shape(s.shape)} -> [{n}, 1]")
        scale_move = Move("weight_scale", s.name, "F32", (n, 1), upcast(s.dtype), EXACT, ", ".join(what))
    else:
        return _refused(
            prefix,
            t,
            f"weight_scale {fmt_shape(s.shape)} is neither a scalar nor one scale per row "
            f"[{n}, 1] of weight {fmt_shape(w.shape)}",
        )
    rotated, group, sylvester, key = _rotation(marker, sylvester_default or "input_scale" in t)
    if rotated and not group:
        return _refused(prefix, t, f"{key}_groupsize {marker.get(key + '_groupsize')!r} is not a positive size")
    if rotated and layout != "per-row":
        return _refused(prefix, t, f"{key} with a scalar weight_scale: ConvRot layers carry one scale per row")
    if rotated and (k % group or group & (group - 1)):
        return _refused(
            prefix,
            t,
            f"rotation size {group} is not a power of 2 dividing K={k}: no Hadamard rotation "
            "of that size exists in these writers",
        )
    if sylvester:
        return Translation(
            prefix,
            NAME,
            f"{layout}, Sylvester Hadamard {group}",
            t,
            verdict=LOSSY,
            why=f"rotated with the Sylvester Hadamard of size {group} (scipy.linalg.hadamard): ComfyUI "
            "and comfy-kitchen rotate with the regular Hadamard of a power-of-4 size, so no Comfy "
            "marker describes this layer; it is requantized from the un-rotated weight",
            decoder=sylvester_decoder(group),
            lossy=Lossy(FORMAT, why="re-quantized as ConvRot INT8"),
        )
    new: dict[str, Any] = {"format": FORMAT}
    if rotated:
        new["convrot"] = True
        new["convrot_groupsize"] = group
    if marker.get("full_precision_matrix_mult") is not None:
        new["full_precision_matrix_mult"] = marker["full_precision_matrix_mult"]
    moves = [copy(w, "weight"), scale_move]
    moves += [copy(e, sfx) for sfx, e in t.items() if sfx not in ("weight", "weight_scale", "input_scale", MARKER_TENSOR)]
    drops, dropped_why = [], ""
    if "input_scale" in t:
        drops.append(t["input_scale"].name)
        dropped_why = (
            "input_scale: INT8 activations are always dynamic; ComfyUI does not read it for int8_tensorwise "
            "and INT8-Fast's loader pops and ignores it"
        )
    changes = []
    if "format" not in marker:
        changes.append("add format")
    gone = sorted(set(marker) - set(new) - {"convrot"} - ({"quarot", "quarot_groupsize"} if key == "quarot" else set()))
    if gone:
        changes.append("drop " + ", ".join(gone))
    if "quarot" in marker and rotated:
        changes.append("quarot -> convrot")
    if rotated and "convrot_groupsize" not in marker and "quarot_groupsize" not in marker:
        changes.append(f"convrot_groupsize {group} (the writer's default) written out")
    if scale_move.what:
        changes.append(f"weight_scale {scale_move.what}")
    if drops:
        changes.append("drop input_scale")
    variant = ("convrot" if rotated else layout) + ("" if "format" in marker else ", no format")
    return Translation(
        prefix,
        NAME,
        variant,
        t,
        verdict=EXACT,
        why=", ".join(changes) or "marker normalised",
        format=FORMAT,
        marker=new,
        moves=moves,
        drops=drops,
        dropped_why=dropped_why,
    )


def _rotation(marker: dict, sylvester: bool) -> tuple[bool, int, bool, str]:
    """(rotated, size, Sylvester rotation, marker key); size 0 when the marker's is not a
    positive integer.  ``quarot`` and ``convrot`` are both ConvRot's regular Hadamard in
    INT8-Fast; a size that is not a power of 4 cannot be (the regular construction exists for
    powers of 4 only), so it is the Sylvester one."""
    for key in ("convrot", "quarot"):
        if marker.get(key):
            size = marker.get(f"{key}_groupsize", DEFAULT_GROUP)
            if type(size) is not int or size <= 0:
                return True, 0, False, key
            return True, size, sylvester or not _is_pow4(size), key
    return False, 0, False, ""


def sylvester_decoder(group: int):
    """``W = (q * scale) @ H`` per group of ``group`` inputs, with H the normalised Sylvester
    Hadamard the writer rotated with (``W_rot = W @ H^T``; H is symmetric and orthogonal).
    Computed in float64 and rounded once to F32."""

    def decode(stored: dict):
        import torch

        q = stored["weight"].to(torch.float64)
        scale = stored["weight_scale"].to(torch.float64)
        n, k = q.shape
        w = q * (scale.reshape(()) if scale.numel() == 1 else scale.reshape(n, 1))
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < group:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = h / math.sqrt(group)
        return (w.reshape(n, k // group, group) @ h).reshape(n, k).to(torch.float32)

    return decode


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    return [f for target in ("sglang", "comfyui", "comfy-kitchen") for f in _failures(target, ckpt, claim)]


def _failures(target: str, ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """What only this dialect knows.  The runtime profiles judge these marked layers by their
    markers already (ComfyUI's ``Unknown quantization format for layer {name}`` on a marker
    without ``format``, MooshieUI #647 / ComfyUI #14777; SGLang's format set with ``None``; an
    unconsumed ``input_scale``; ``per_row`` is ignored by every reader).  What they cannot see is
    a Sylvester rotation under a ConvRot marker: comfy-kitchen refuses a size that is not a power
    of 4 (its profile says so; ComfyUI's first forward hits the same error), and at 16, 64 or 256
    every runtime rotates the activations with the other, regular, Hadamard and computes garbage
    without an error."""
    out: list[RuntimeFailure] = []
    for tr in claim.layers.values():
        marker = _marker_of(ckpt, tr.prefix)
        if marker is None or tr.verdict != LOSSY or "format" not in marker or not marker.get("convrot"):
            continue
        size = marker.get("convrot_groupsize", DEFAULT_GROUP)
        if isinstance(size, int) and not _is_pow4(size):
            if target == "comfyui":
                out.append(
                    RuntimeFailure(
                        "comfyui",
                        f"Regular Hadamard size must be a power of 4, got {size}",
                        "ValueError",
                        tr.prefix,
                        MARKER_TENSOR,
                        "forward",
                        "a Sylvester-Hadamard rotation size in a ConvRot marker",
                        "comfyquant migrate --allow-lossy",
                    )
                )
        elif target in ("comfyui", "comfy-kitchen", "sglang"):
            out.append(
                RuntimeFailure(
                    target,
                    f"layer '{tr.prefix}': the weight was rotated with the Sylvester "
                    f"Hadamard of size {size}, the runtime rotates activations with ConvRot's regular one "
                    "(garbage output, no error)",
                    None,
                    tr.prefix,
                    "weight",
                    "silent",
                    "a WINT8 Sylvester rotation written as a ConvRot marker",
                    "comfyquant migrate --allow-lossy",
                    severity="error",
                )
            )
    return out


def _marker_of(ckpt: Checkpoint, prefix: str) -> dict | None:
    layer = ckpt.layers.get(prefix)
    return layer.marker if layer is not None else None


DIALECTS = (
    Dialect(
        NAME,
        "ComfyUI-INT8-Fast (and WINT8) int8 checkpoints",
        writer="BobJohnson24/ComfyUI-INT8-Fast INT8ModelSave; Winnougan/WINT8-ComfyUI WINT8ModelQuantizer",
        source="ComfyUI-INT8-Fast int8_save.py, int8_quant.py, quarot.py; "
        "WINT8-ComfyUI wint8_model_quantizer.py, wint8_quarot.py",
        detect=detect,
        failures=failures,
        rule_tag="int8-fast",
        order=30,
    ),
)
