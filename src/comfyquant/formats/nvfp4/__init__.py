"""``nvfp4``: E2M1 codes (high nibble first), FP8 1x16 block scales in the blocked layout."""

from __future__ import annotations

from ..base import WEIGHT, Constraint, Format, MarkerKey, Slot
from ..common import ALL_RUNTIMES, FORMAT_KEY, FULL_PRECISION_KEY, model_size, no_params, padded_bias_slot, weight_2d

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""


def _geometry(tensors: dict, params: dict) -> dict:
    rows, cols = weight_2d(tensors)
    # N and K are the stored (16-padded) sizes; the model's own sizes, which the bias and
    # pre_quant_scale keep, are read from those tensors when present.
    k = 2 * cols
    return dict(
        params,
        N=rows,
        K=k,
        bits=4,
        N_model=model_size(tensors, "bias", rows, 16),
        K_model=model_size(tensors, "pre_quant_scale", k, 16),
    )


NVFP4 = Format(
    name="nvfp4",
    codec_module=CODEC,
    title="FP4 E2M1 weights, FP8 1x16 block scales, F32 tensor scale",
    slots=(
        Slot("weight", "U8", "(N, K // 2)", kind=WEIGHT, meaning="E2M1 codes, high nibble first, padded to 16x16"),
        Slot(
            "weight_scale",
            "F8_E4M3",
            "(pad(N, 128), pad(K // 16, 4))",
            blocked=16,
            meaning="per-16-block FP8 scales, blocked 128x4 layout, zero padded",
            also_dtypes={"U8": ("FP8 bytes labelled U8: ComfyUI views them as FP8, SGLang refuses them", "warning")},
            alt_shapes=(
                (
                    "(N, K // 16)",
                    "unblocked [N, K/16] scale layout: comfy-kitchen and ComfyUI read the blocked, 128x4-padded layout",
                ),
                ("(pad(N, 128), K // 16)", "blocked rows but unpadded columns: block count per row must be padded to 4"),
            ),
        ),
        Slot(
            "weight_scale_2",
            "F32",
            "()",
            positive=True,
            meaning="per-tensor scale",
            alt_shapes=(("(1,)", "1-element tensor scale stored as [1]; accepted by the loaders", "info"),),
        ),
        Slot("input_scale", "F32", "()", required=False, positive=True, meaning="per-tensor activation scale (ComfyUI)"),
        Slot("pre_quant_scale", "float", "(K_model,)", required=False, meaning="activation smoothing factors"),
        padded_bias_slot(16),
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        MarkerKey(
            "convrot",
            (bool,),
            default=False,
            allowed="not v",
            allowed_text="absent or false: NVFP4 is never rotated",
            drop_invalid=True,
        ),
        MarkerKey("group_size", (int,), default=16, allowed="v == 16", allowed_text="16 (informational)"),
    ),
    geometry=_geometry,
    constraints=(
        Constraint(
            "N % 16 == 0 and K % 16 == 0",
            "stored weight [{N}, {K} // 2] is not padded to multiples of 16",
            cause="written by a tool that does not pad NVFP4 weights",
            fix="re-quantize with comfyquant quantize",
        ),
    ),
    bits_text="4 (+ FP8 scale per 16)",
    loaders=ALL_RUNTIMES,
    pad=(16, 16),
    recognize=lambda t: "weight" in t and t["weight"].dtype == "U8" and "weight_scale_2" in t,
    encode_params=no_params,
    params_module=__name__ + ".params",
)

FORMATS = (NVFP4,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
