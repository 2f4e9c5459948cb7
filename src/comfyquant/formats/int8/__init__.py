"""``int8_tensorwise`` (scalar, row-wise or ConvRot) and c2q's converter-only ``int8_blockwise``."""

from __future__ import annotations

from ..base import WEIGHT, Constraint, Format, MarkerKey, Slot
from ..common import (
    ALL_RUNTIMES,
    BIAS_SLOT,
    CONVROT_JSON_TRUE,
    FORMAT_KEY,
    FULL_PRECISION_KEY,
    convrot_size_key,
    dense_geometry,
    f32_scale_slot,
    has_2d_weight,
)

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""

CONVROT_SIZE_FIX = "use 16, 64 or 256 (re-quantize with comfyquant quantize if the data was rotated with another size)"


def _geometry(tensors: dict, params: dict) -> dict:
    env = dense_geometry(tensors, params)
    scale = tensors.get("weight_scale")
    numel_1 = scale is not None and scale.numel == 1
    one_row = scale is not None and len(scale.shape) == 2 and env.get("N") == 1
    # A one-element scale means a scalar layout unless the layer rotates (ConvRot is always
    # row-wise in comfy-kitchen) or it is the [1, 1] row scale of a one-row layer (what the
    # row-wise encoder writes for N = 1); anything else is read as a row-wise layout.
    env["scale_layout"] = "scalar" if numel_1 and not params.get("convrot") and not one_row else "row"
    env["variant"] = "convrot" if params.get("convrot") else env["scale_layout"]
    return env


def _inspect_text(env: dict) -> str:
    if env["variant"] == "convrot":
        return f"convrot C={env.get('convrot_groupsize')}"
    return f"{env['variant']} scale"


def _encode_params(env: dict, tensors: dict) -> dict:
    """comfy-kitchen's arguments for this layer's variant: ConvRot (always row-wise) with its
    size, else row-wise or scalar scales."""
    if env.get("variant") == "convrot":
        return {"convrot": True, "convrot_groupsize": env["convrot_groupsize"], "per_channel": True}
    return {"per_channel": env.get("scale_layout") == "row"}


INT8_TENSORWISE = Format(
    name="int8_tensorwise",
    codec_module=CODEC,
    title="INT8 weights, scalar / row-wise / ConvRot scales, dynamic INT8 activations",
    slots=(
        Slot("weight", "I8", "(N, K)", kind=WEIGHT, meaning="INT8 weight (rotated domain with ConvRot)"),
        f32_scale_slot(
            "() if scale_layout == 'scalar' else (N, 1)",
            meaning="dequantization scale: scalar [] or per row [N, 1]",
            alt_shapes=(
                (
                    "(N,)",
                    "row scales stored as [N] instead of [N, 1]: comfy-kitchen's dequantize misreads them and SGLang refuses them",
                ),
                ("(1,)", "scalar scale stored as [1] instead of []: SGLang refuses it"),
                ("()", "scalar scale on a ConvRot layer: ConvRot layers carry row-wise [N, 1] scales"),
            ),
        ),
        BIAS_SLOT,
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        MarkerKey(
            "convrot", (bool,), default=False, allowed_text="true or false", nested_ok=True, invalid_cause=CONVROT_JSON_TRUE
        ),
        convrot_size_key(
            "a power of 4 (SGLang: 16, 64 or 256)",
            "convrot",
            "SGLang has no default for INT8 ConvRot layers and requires 16, 64 or 256 written explicitly",
        ),
        MarkerKey("per_row", (bool,), allowed_text="informational"),
    ),
    geometry=_geometry,
    constraints=(
        Constraint(
            "not convrot or is_pow4(convrot_groupsize)",
            "convrot_groupsize={convrot_groupsize} is not a power of 4",
            cause="written by a converter that falls back to a Sylvester Hadamard matrix (e.g. 128 or 512): a different rotation",
            fix=CONVROT_SIZE_FIX,
        ),
        Constraint(
            "not convrot or K % convrot_groupsize == 0",
            "ConvRot group size {convrot_groupsize} does not divide input features {K}",
            fix="keep this layer dense or re-quantize with a ConvRot size that divides K",
        ),
    ),
    bits_text="8",
    rotation="convrot key",
    loaders=ALL_RUNTIMES,
    bank_rows=("weight", "weight_scale", "bias"),
    bank_rows_if="weight_scale",
    encode_params=_encode_params,
    params_module=__name__ + ".params",
    aliases=("int8",),
    inspect_text=_inspect_text,
    recognize=lambda t: (
        has_2d_weight(t, "I8")
        and "weight_scale" in t
        and t["weight_scale"].dtype == "F32"
        and (t["weight_scale"].numel == 1 or t["weight_scale"].shape == (t["weight"].shape[0], 1))
    ),
)

INT8_BLOCKWISE = Format(
    name="int8_blockwise",
    title="INT8 with 2-D block scales (convert_to_quant only)",
    slots=(
        Slot("weight", "I8", "(N, K)", kind=WEIGHT),
        Slot("weight_scale", "F32", "(N // group_size, K // group_size)", positive=True),
        Slot("input_scale", "F32", "()", required=False),
        BIAS_SLOT,
    ),
    keys=(FORMAT_KEY, MarkerKey("group_size", (int,), default=128, allowed="v > 0", allowed_text="a positive block size")),
    geometry=dense_geometry,
    bits_text="8",
    converter_only=True,
)

FORMATS = (
    INT8_TENSORWISE,
    INT8_BLOCKWISE,
)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
