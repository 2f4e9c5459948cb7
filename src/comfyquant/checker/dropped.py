"""``--deep``: how far a W4A8 layer's output moves when ComfyUI drops its correction.

ComfyUI 0.33.0 (``comfy/quant_ops.py``) builds a W4A8 layer from ``s_rel``, ``s_channel`` and
the codebook only; comfy-kitchen 0.2.40 (``backends/eager/w4a8_int8.py``,
``_dequantize_w4a8_int8_weight_from_int8``) adds the correction to each (row, group) of the
channel-scaled INT8 grid.  What ComfyUI computes is that weight without the correction, so its
relative output error is the correction's share of the full weight, measured here from the
codes, the scales and the correction (the rotation that follows is orthogonal: it keeps both
norms).  On the generated space this predicts ComfyUI's measured error within 0.02
(0.29 / 0.72 / 0.95 measured for corrections of 0.3, 1 and 3 times the weight's size).

numpy is imported by the caller (``deep``), never by plain ``check``."""

from __future__ import annotations

from ..findings import Finding

CODE = "D010"
GARBAGE = 0.9
"""The relative output error from which the layer's output is garbage (the harness's
threshold); from ``DEGRADED`` it works, clearly worse than the format's usual error."""
DEGRADED = 0.3
SUFFIXES = ("weight", "weight_s_rel", "weight_s_channel", "weight_correction")


def wanted(layer) -> bool:
    """Whether ``layer`` is a 4-bit W4A8 layer with a correction whose share can be measured."""
    if layer.format_name != "asym_w4a8_int8":
        return False
    t = layer.stored
    if any(s not in t for s in SUFFIXES) or layer.bank is not None:
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


OTHER_HALF = {"F16": "BF16", "BF16": "F16"}
"""A 16-bit float correction's bytes read as the other 16-bit float: both are valid numbers,
and the file does not record which one the writer meant."""


def share(np, decode, layer, data: dict[str, bytes]) -> float | None:
    """The correction's share of the full weight, ``|C| / |W + C|`` (Frobenius, per group
    expanded), or None when the values cannot be read soundly.  A 16-bit correction is read
    both ways (``OTHER_HALF``) and the smaller share is the one a file can vouch for."""
    dtype = layer.stored["weight_correction"].dtype
    shares = [_share(np, decode, layer, data, d) for d in (dtype, OTHER_HALF.get(dtype)) if d is not None]
    known = [v for v in shares if v is not None]
    return min(known) if known else None


def _share(np, decode, layer, data: dict[str, bytes], corr_dtype: str) -> float | None:
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
        grid = np.nan_to_num(grid)  # the INT8 cast of a NaN group (see deep.CLAMPED): a constant
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


def finding(layer, share_: float) -> Finding:
    """The D010 finding: what ComfyUI computes without the correction (garbage from
    ``GARBAGE``; the verdict follows, see ``deep.makes_garbage``).  ``deep`` reports it only
    from ``GARBAGE``: below, ComfyUI's profile already warns that the layer computes without
    its correction, and a valid asymmetric layer (about 0.4) raises no value finding."""
    tensor = layer.stored["weight_correction"].name
    if share_ >= GARBAGE:
        what, actual = "garbage", f"garbage: relative error {share_:.2f}"
    elif share_ >= DEGRADED:
        what, actual = "a degraded output", f"degraded: relative error {share_:.2f}"
    else:
        what, actual = "a close output", f"close: relative error {share_:.2f}"
    return Finding(
        CODE,
        f"{tensor}: ComfyUI drops the correction, {share_:.0%} of the layer's weight: {what} (no error)",
        layer=layer.name,
        tensor=tensor,
        expected="the correction applied (comfy-kitchen and SGLang apply it)",
        actual=actual,
        cause="ComfyUI's W4A8 loader passes only s_rel, s_channel and the codebook: the layer computes without the correction",
        fix="for ComfyUI, re-quantize symmetric (comfyquant fix --target comfyui --allow-lossy)",
    )
