"""``convrot_w4a4``: signed 4-bit weights with per-row F32 scales, INT4 activations, ConvRot."""

from __future__ import annotations

from ..base import WEIGHT, Constraint, Format, MarkerKey, Slot
from ..common import ALL_RUNTIMES, BIAS_SLOT, FORMAT_KEY, FULL_PRECISION_KEY, as_int, convrot_size_key, f32_scale_slot, weight_2d

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""


def _geometry(tensors: dict, params: dict) -> dict:
    n, cols = weight_2d(tensors)
    return dict(params, N=n, K=2 * cols, bits=4, convrot_groupsize=as_int(params.get("convrot_groupsize"), 256))


def _encode_params(env: dict, tensors: dict) -> dict:
    return {"convrot_groupsize": env["convrot_groupsize"], "linear_dtype": env.get("linear_dtype") or "int4"}


CONVROT_W4A4 = Format(
    name="convrot_w4a4",
    heavy_encoder=True,
    codec_module=CODEC,
    title="signed 4-bit weights and activations, per-row scales, ConvRot",
    slots=(
        Slot("weight", "I8", "(N, K // 2)", kind=WEIGHT, meaning="signed nibbles, low nibble first"),
        f32_scale_slot(
            "(N,)",
            meaning="per-row scale",
            alt_shapes=(("(N, 1)", "row scales stored as [N, 1]; this format stores them as [N]"),),
        ),
        BIAS_SLOT,
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        convrot_size_key(
            "a power of 4 (SGLang: 16, 64 or 256)", True, "write the ConvRot size explicitly so every reader agrees"
        ),
        MarkerKey(
            "linear_dtype",
            (str,),
            default="int4",
            allowed="v in ('int4', 'int8')",
            allowed_text="'int4' or 'int8'",
            nested_ok=True,
        ),
    ),
    geometry=_geometry,
    constraints=(
        Constraint(
            "K % 64 == 0 and K % convrot_groupsize == 0",
            "input size {K} is incompatible with quant_group_size=64 and convrot_groupsize={convrot_groupsize}",
            fix="keep this layer dense, or re-quantize with a ConvRot size that divides K",
        ),
        Constraint(
            "is_pow4(convrot_groupsize)",
            "convrot_groupsize={convrot_groupsize} is not a power of 4",
            fix="re-quantize with convrot_groupsize 16, 64 or 256",
        ),
    ),
    bits_text="4",
    rotation="always",
    loaders=ALL_RUNTIMES,
    encode_params=_encode_params,
    params_module=__name__ + ".params",
    aliases=("w4a4",),
    inspect_text=lambda env: f"C={env['convrot_groupsize']}",
    recognize=lambda t: (
        "weight" in t
        and t["weight"].dtype == "I8"
        and len(t["weight"].shape) == 2
        and "weight_scale" in t
        and t["weight_scale"].dtype == "F32"
        and t["weight_scale"].shape == (t["weight"].shape[0],)
    ),
)

FORMATS = (CONVROT_W4A4,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
