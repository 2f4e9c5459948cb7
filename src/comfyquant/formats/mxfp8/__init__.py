"""``mxfp8``: FP8 E4M3 weights with E8M0 1x32 block scales in the blocked layout."""

from __future__ import annotations

from ..base import WEIGHT, Constraint, Format, MarkerKey, Slot
from ..common import ALL_RUNTIMES, FORMAT_KEY, FULL_PRECISION_KEY, dense_geometry, model_size, no_params, padded_bias_slot

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""


def weight_rows(t: dict) -> int:
    return t["weight"].shape[0]


def _recognize(t: dict) -> bool:
    w, s = t.get("weight"), t.get("weight_scale")
    if w is None or s is None or w.dtype != "F8_E4M3" or len(w.shape) != 2 or s.dtype not in ("U8", "F8_E8M0"):
        return False
    n, k = w.shape
    blocked = (-(-n // 128) * 128, -(-(k // 32) // 4) * 4)
    return s.shape in (blocked, (n, k // 32))


MXFP8 = Format(
    name="mxfp8",
    codec_module=CODEC,
    title="FP8 E4M3 weights, E8M0 1x32 block scales",
    slots=(
        Slot("weight", "F8_E4M3", "(N, K)", kind=WEIGHT, meaning="FP8 weight padded to 32x32"),
        Slot(
            "weight_scale",
            "F8_E8M0",
            "(pad(N, 128), pad(K // 32, 4))",
            blocked=32,
            meaning="per-32-block E8M0 exponents, blocked 128x4 layout, zero padded",
            also_dtypes={"U8": ("E8M0 bytes labelled U8 (as convert_to_quant writes them); ComfyUI reads both", "info")},
            alt_shapes=(
                (
                    "(N, K // 32)",
                    "unblocked [N, K/32] layout (SGLang quant_format=mxfp8 style): comfy-kitchen and ComfyUI read the blocked, padded layout",
                ),
            ),
        ),
        Slot("input_scale", "F32", "()", required=False, meaning="activation scale (ignored by the MXFP8 quantizer)"),
        padded_bias_slot(32),
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        MarkerKey("group_size", (int,), default=32, allowed="v == 32", allowed_text="32 (informational)"),
    ),
    geometry=lambda t, p: dict(dense_geometry(t, p), N_model=model_size(t, "bias", weight_rows(t), 32)),
    constraints=(
        Constraint(
            "N % 32 == 0 and K % 32 == 0",
            "stored weight [{N}, {K}] is not padded to multiples of 32",
            cause="written by a tool that does not pad MXFP8 weights",
            fix="re-quantize with comfyquant quantize",
        ),
    ),
    bits_text="8 (+ E8M0 scale per 32)",
    loaders=ALL_RUNTIMES,
    pad=(32, 32),
    recognize=_recognize,
    encode_params=no_params,
    params_module=__name__ + ".params",
    quant_format="mxfp8",
)

FORMATS = (MXFP8,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
