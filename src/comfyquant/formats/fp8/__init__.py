"""Per-tensor FP8 E4M3 (``float8_e4m3fn``), the description every per-tensor FP8 format shares
(``per_tensor_fp8``, which other FP8 packages build on), and c2q's FP8 converter-only
variants."""

from __future__ import annotations

from ..base import WEIGHT, Format, MarkerKey, Slot
from ..common import ALL_RUNTIMES, BIAS_SLOT, FORMAT_KEY, FULL_PRECISION_KEY, dense_geometry, has_2d_weight, no_params


def _scalar_scale_slot() -> Slot:
    return Slot(
        "weight_scale",
        "F32",
        "()",
        positive=True,
        meaning="per-tensor dequantization scale",
        alt_shapes=(("(1,)", "1-element scale stored as [1]; loaders treat it like a scalar", "info"),),
    )


def per_tensor_fp8(
    name: str,
    weight_dtype: str,
    loaders: frozenset,
    title: str,
    aliases: tuple[str, ...],
    package: str = __name__,
    legacy_renames: dict[str, str] | None = None,
) -> Format:
    """An FP8 format with one F32 scale per tensor (comfy-kitchen 0.2.40
    ``TensorCoreFP8Layout``) whose codec and Params live in ``package`` (``<package>.codec``,
    ``<package>.params``): the layout is the same for every FP8 element type, only the weight
    dtype, the runtimes that load it and the names differ."""
    return Format(
        name=name,
        params_module=package + ".params",
        aliases=aliases,
        codec_module=package + ".codec",
        encode_params=no_params,
        title=title,
        slots=(
            Slot("weight", weight_dtype, "(N, K)", kind=WEIGHT, meaning="FP8 weight"),
            _scalar_scale_slot(),
            Slot(
                "input_scale",
                "F32",
                "()",
                required=False,
                positive=True,
                meaning="static activation scale",
                alt_shapes=(("(1,)", "1-element scale stored as [1]; loaders treat it like a scalar", "info"),),
            ),
            BIAS_SLOT,
        ),
        keys=(FORMAT_KEY, FULL_PRECISION_KEY),
        geometry=dense_geometry,
        bits_text="8",
        loaders=loaders,
        recognize=lambda t: (
            has_2d_weight(t, weight_dtype)
            and "weight_scale" in t
            and len(t["weight_scale"].shape) <= 1
            and t["weight_scale"].numel == 1
        ),
        legacy_renames=legacy_renames,
    )


FLOAT8_E4M3FN = per_tensor_fp8(
    "float8_e4m3fn",
    "F8_E4M3",
    ALL_RUNTIMES,
    "FP8 E4M3, per-tensor scale",
    ("fp8",),
    legacy_renames={"scale_weight": "weight_scale", "scale_input": "input_scale"},
)
"""Also what ComfyUI reads a legacy scaled-FP8 layer as (0.33.0 ``comfy/utils.py``
``convert_old_quants``): ``legacy_renames``."""

FLOAT8_E4M3FN_ROWWISE = Format(
    name="float8_e4m3fn_rowwise",
    title="FP8 E4M3, per-row scale (convert_to_quant only)",
    slots=(
        Slot("weight", "F8_E4M3", "(N, K)", kind=WEIGHT),
        Slot("weight_scale", "F32", "(N,)", positive=True),
        BIAS_SLOT,
    ),
    keys=(FORMAT_KEY,),
    geometry=dense_geometry,
    bits_text="8",
    converter_only=True,
)

_BLOCK_KEY = MarkerKey("group_size", (int,), default=64, allowed="v > 0", allowed_text="a positive block size")

FLOAT8_E4M3FN_BLOCKWISE = Format(
    name="float8_e4m3fn_blockwise",
    title="FP8 E4M3, 2-D block scales (convert_to_quant only)",
    slots=(
        Slot("weight", "F8_E4M3", "(N, K)", kind=WEIGHT),
        Slot("weight_scale", "F32", "(N // group_size, K // group_size)", positive=True),
        BIAS_SLOT,
    ),
    keys=(FORMAT_KEY, _BLOCK_KEY),
    geometry=dense_geometry,
    bits_text="8",
    converter_only=True,
)

__all__ = ["FLOAT8_E4M3FN", "FLOAT8_E4M3FN_ROWWISE", "FLOAT8_E4M3FN_BLOCKWISE"]

FORMATS = (
    FLOAT8_E4M3FN,
    FLOAT8_E4M3FN_ROWWISE,
    FLOAT8_E4M3FN_BLOCKWISE,
)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
