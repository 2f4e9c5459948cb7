"""``check --deep`` hooks of ``asym_w4a8_int8``: the correction ComfyUI drops, and group scales
that do not fit the layer's levels on the INT8 grid.

ComfyUI 0.33.0 (``comfy/quant_ops.py``) builds a W4A8 layer from ``s_rel``, ``s_channel`` and
the codebook only; comfy-kitchen 0.2.40 (``backends/eager/w4a8_int8.py``,
``_dequantize_w4a8_int8_weight_from_int8``) adds the correction to each (row, group) of the
channel-scaled INT8 grid.  What ComfyUI computes is that weight without the correction, so its
relative output error is the correction's share of the full weight, measured here from the
codes, the scales and the correction (the rotation that follows is orthogonal: it keeps both
norms).  On the generated space this predicts ComfyUI's measured error within 0.02
(0.29 / 0.72 / 0.95 measured for corrections of 0.3, 1 and 3 times the weight's size).

Imported by the package's ``__init__``: numpy is handed in by the checker's ``--deep`` (``np``,
with its ``decode``), so describing the format never imports it.
"""

from __future__ import annotations

from ..hooks import DroppedPart

CORRECTION_SUFFIXES = ("weight", "weight_s_rel", "weight_s_channel", "weight_correction")
"""The tensors the correction's share is computed from (with the optional codebook)."""


def has_measurable_correction(layer) -> bool:
    """Whether ``layer`` is a 4-bit layer with a correction whose share can be measured."""
    t = layer.stored
    if any(s not in t for s in CORRECTION_SUFFIXES) or layer.bank is not None:
        return False
    w, s_rel, corr = t["weight"], t["weight_s_rel"], t["weight_correction"]
    if len(w.shape) != 2 or len(s_rel.shape) != 2 or len(corr.shape) != 2:
        return False
    n, packed = w.shape
    k = packed * 2
    groups = s_rel.shape[1]
    group_size = (layer.marker or {}).get("group_size", 16)
    return (
        type(group_size) is int
        and k == groups * group_size  # 4-bit codes, two a byte (6-bit storage has no correction)
        and w.dtype in ("I8", "U8")
        and s_rel.shape[0] == n
        and groups > 0
        and k % groups == 0
        and tuple(corr.shape) in ((groups, n), (n, groups))  # ComfyUI drops it either way
        and tuple(t["weight_s_channel"].shape) == (n,)
        and ("weight_codebook" not in t or tuple(t["weight_codebook"].shape) == (16,))
    )


def correction_share(np, decode, layer, data: dict[str, bytes], corr_dtype: str) -> float | None:
    """``|C| / |W + C|`` (Frobenius, per group expanded) with the correction's bytes read as
    ``corr_dtype``, or None when the values cannot be read soundly."""
    t = layer.stored
    w = t["weight"]
    n, packed = w.shape
    k = packed * 2
    s_rel = decode(data[t["weight_s_rel"].name], t["weight_s_rel"].dtype, "F8_E4M3")
    s_channel = decode(data[t["weight_s_channel"].name], t["weight_s_channel"].dtype, "F32")
    corr = decode(data[t["weight_correction"].name], corr_dtype, "F32")
    codebook_entry = t.get("weight_codebook")
    codebook = decode(data[codebook_entry.name], codebook_entry.dtype, "F32") if codebook_entry else None
    if any(v is None for v in (s_rel, s_channel, corr)) or (codebook_entry is not None and codebook is None):
        return None
    groups = s_rel.size // n
    group_size = k // groups
    raw = np.frombuffer(data[w.name], dtype=np.uint8).reshape(n, packed)
    codes = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(n, groups, group_size)
    levels = codebook[codes] if codebook is not None else codes.astype(np.float32) - 8.0
    with np.errstate(invalid="ignore", over="ignore"):
        grid = np.clip(np.round(levels * s_rel.reshape(n, groups, 1)), -127, 127)
        grid = np.nan_to_num(grid)  # the INT8 cast of a NaN group (see Slot.on_int8_grid): a constant
        scaled = grid.astype(np.float64) * s_channel.reshape(n, 1, 1)
        stored = tuple(t["weight_correction"].shape)
        c = corr.reshape(stored) if stored == (n, groups) else corr.reshape(groups, n).T
        c = c.astype(np.float64).reshape(n, groups, 1)
        full = float(((scaled + c) ** 2).sum())
        dropped = float((c**2).sum()) * group_size
    if not np.isfinite(full) or not np.isfinite(dropped):
        return None
    if full == 0.0:
        return 0.0 if dropped == 0.0 else 1.0
    return min(1.0, (dropped / full) ** 0.5)


DROPPED_CORRECTION = DroppedPart(
    suffix="weight_correction",
    reads=CORRECTION_SUFFIXES + ("weight_codebook",),
    wanted=has_measurable_correction,
    share=correction_share,
    expected="the correction applied (comfy-kitchen and SGLang apply it)",
    cause="ComfyUI's W4A8 loader passes only s_rel, s_channel and the codebook: the layer computes without the correction",
    fix="for ComfyUI, re-quantize symmetric (comfyquant fix --target comfyui --allow-lossy)",
)


UNIFORM_TOP = {4: 8, 6: 32}
"""The largest uniform level magnitude of 4- and 6-bit codes (code - 8, code - 32)."""


def level_mismatch(np, layer, tensor: str, s_rel) -> dict | None:
    """The fields of a finding on group scales that do not fit the layer's levels on the INT8
    grid, or None.  Too small: the largest level times the scale rounds to 0 in most groups (a
    codebook's levels are about 1 in magnitude), and the layer decodes to zero.  Too large: a
    layer without a codebook decodes uniform levels (up to 8 or 32 in magnitude) onto the INT8
    grid with ``s_rel`` (comfy-kitchen 0.2.40 ``_dequant_int4_grouped_to_int8``), so a writer's
    ``s_rel`` stays near 127 / top.  Group scales whose median is past 127 / (top / 2) clip
    every code beyond half the range: they were sized for a codebook's levels (magnitude about
    1, ``s_rel`` near 127), and the layer that has none computes garbage."""
    t = layer.stored
    w, rel = t.get("weight"), t.get("weight_s_rel")
    group_size = (layer.marker or {}).get("group_size", 16)
    if w is None or rel is None or len(w.shape) != 2 or len(rel.shape) != 2:
        return None
    if type(group_size) is not int or group_size <= 0 or not s_rel.size:
        return None
    k = rel.shape[1] * group_size
    bits = 4 if w.shape[1] * 2 == k else 6 if w.shape[1] * 4 == k * 3 else None
    finite = s_rel[np.isfinite(s_rel)]
    if bits is None or not finite.size:
        return None
    median = float(np.median(np.abs(finite)))
    top = 1.0 if "weight_codebook" in t else UNIFORM_TOP[bits]
    if median * top < 0.5:
        return {
            "message": f"{tensor}: group scales of median {median:g}: the largest level times the scale rounds to 0 on "
            f"the INT8 grid in most groups",
            "expected": f"median >= {0.5 / top:g}",
            "actual": f"median {median:g}",
            "cause": "the group scales are far too small for the levels (stored as another dtype's values?): "
            "most groups decode to zero",
            "fix": "re-export the layer (comfyquant quantize)",
        }
    limit = 127 / (UNIFORM_TOP[bits] / 2)
    if "weight_codebook" in t or median <= limit:
        return None
    return {
        "message": f"{tensor}: group scales of median {median:g} on a {bits}-bit layer without a codebook: every code "
        f"beyond half the uniform range leaves the INT8 grid",
        "expected": f"median <= {limit:g} (uniform levels up to {UNIFORM_TOP[bits]})",
        "actual": f"median {median:g}",
        "cause": "the group scales were sized for a codebook's levels (magnitude about 1) and the layer has no codebook",
        "fix": "restore the layer's weight_codebook, or re-export it (comfyquant quantize)",
    }
