"""``svdquant_w4a4``: 4-bit weights plus a low-rank branch (comfy-kitchen; ComfyUI forks only).

Two storage layouts: natural (2-D weight) and tile-packed (4-D weight), both read by ck.
"""

from __future__ import annotations

from ..base import AUX, WEIGHT, Format, GeometryError, MarkerKey, Slot
from ..common import BIAS_SLOT, FORMAT_KEY

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""


def _geometry(tensors: dict, params: dict) -> dict:
    w = tensors.get("weight")
    if w is None:
        raise GeometryError("the layer has no weight tensor")
    if len(w.shape) == 2:
        n, k, packed = w.shape[0], 2 * w.shape[1], False
    elif len(w.shape) == 4:
        n, k, packed = w.shape[0] * 128, w.shape[1] * 64, True
    else:
        raise GeometryError(f"weight must be 2-D [N, K/2] or tile-packed 4-D, got {w.shape}")
    down = tensors.get("weight_proj_down")
    rank = down.shape[1] if down is not None and len(down.shape) == 2 else 0
    return dict(params, N=n, K=k, bits=4, R=rank, packed=packed, variant="tile-packed" if packed else "natural")


SVDQUANT_W4A4 = Format(
    name="svdquant_w4a4",
    codec_module=CODEC,
    title="SVDQuant: 4-bit weights and activations plus a low-rank branch",
    slots=(
        Slot("weight", "I8", "(N, K // 2)", kind=WEIGHT, when="not packed"),
        Slot("weight", "I8", "(N // 128, K // 64, 32, 128)", kind=WEIGHT, when="packed"),
        Slot("weight_scale", "float", "(K // 64, N)", when="not packed"),
        Slot("weight_scale", "float", "(N // 128, K // 64, 128)", when="packed"),
        Slot("weight_proj_down", "float", "(K, R)", kind=AUX),
        Slot("weight_proj_up", "float", "(N, R)", kind=AUX, when="not packed"),
        Slot("weight_proj_up", "float", "(N // 128, R, 128)", kind=AUX, when="packed"),
        Slot("weight_smooth_factor", "float", "(K,)", kind=AUX),
        BIAS_SLOT,
    ),
    keys=(
        FORMAT_KEY,
        MarkerKey("act_unsigned", (bool,), default=False, allowed_text="true or false"),
        MarkerKey("group_size", (int,), default=64, allowed="v == 64", allowed_text="64"),
    ),
    geometry=_geometry,
    inspect_text=lambda env: ("" if env["variant"] == "natural" else f"{env['variant']} ") + f"rank={env['R']}",
    bits_text="4 (+ low-rank branch)",
    loaders=frozenset({"comfy-kitchen"}),
    recognize=lambda t: "weight_proj_down" in t and "weight_proj_up" in t,
)

FORMATS = (SVDQUANT_W4A4,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
