"""SGLang's rowwise FP8 (``rowwise-float8_e4m3fn``): an FP8 E4M3 weight with one F32 scale per
output row, declared in the header map rather than by Comfy markers.

SGLang 0.5.23 (``runtime/layers/quantization/rowwise_fp8.py``) reads it from the same
``_quantization_metadata`` key as Comfy's marker map, in another shape: ``format_version``
``"1.1"``, ``layers`` mapping each linear layer to the string ``"rowwise-float8_e4m3fn"`` or
``"bf16"`` (an object ``{"format": ...}`` reads the same), and
``quant_configs["rowwise-float8_e4m3fn"] == {"scale_recipe": "rowwise"}``. A quantized layer
stores ``weight`` (F8_E4M3 ``[N, K]``), ``weight_scale`` (F32 ``[N]``, ``W = q * scale[:, None]``)
and optionally a static activation scale ``input_scale`` (F32 ``[1]``); a ``bf16`` layer is
dense. ComfyUI and comfy-kitchen do not read this map: its entries are no marker objects.
"""

from __future__ import annotations

from ..base import WEIGHT, Format, Slot
from ..common import BIAS_SLOT, FORMAT_KEY, dense_geometry, no_params

ROWWISE_FP8 = "rowwise-float8_e4m3fn"
"""The ``layers`` value of a quantized layer, and its ``quant_configs`` key."""
DENSE = "bf16"
"""The ``layers`` value of a layer kept dense."""
MAP_VERSION = "1.1"
"""The only ``format_version`` SGLang 0.5.23 accepts for this map."""
SCALE_RECIPE = "rowwise"
"""The only ``quant_configs[ROWWISE_FP8]["scale_recipe"]`` SGLang 0.5.23 accepts."""


def header_map(quantized: list[str], dense: tuple[str, ...] | list[str] = ()) -> tuple[dict, str, dict]:
    """The header map of a rowwise FP8 file as (layers, version, further keys), which
    ``markers.marker_map_text`` writes: its quantized layers and the linear layers it keeps
    dense (SGLang builds the latter unquantized)."""
    layers = {prefix: ROWWISE_FP8 for prefix in sorted(quantized)}
    layers.update({prefix: DENSE for prefix in sorted(dense)})
    return layers, MAP_VERSION, {"quant_configs": {ROWWISE_FP8: {"scale_recipe": SCALE_RECIPE}}}


def declared_format(entry) -> object:
    """A ``layers`` entry's format as SGLang reads it: the string itself, or an object's
    ``format`` (None for an empty object)."""
    return (entry or {}).get("format") if isinstance(entry, dict) else entry


def declares_rowwise(obj) -> bool:
    """Whether SGLang 0.5.23 reads the parsed header map ``obj`` as rowwise FP8
    (``_get_serialized_quant_config``): a ``layers`` entry whose format is the string
    ``ROWWISE_FP8``, or a ``quant_configs`` object with that key. Such a file never reaches
    SGLang's Comfy marker reader."""
    if not isinstance(obj, dict) or not obj:
        return False
    layers = obj.get("layers", {})
    if isinstance(layers, dict) and any(declared_format(e) == ROWWISE_FP8 for e in layers.values()):
        return True
    configs = obj.get("quant_configs", {})
    return isinstance(configs, dict) and ROWWISE_FP8 in configs


ROWWISE_FLOAT8_E4M3FN = Format(
    name=ROWWISE_FP8,
    title="FP8 E4M3, per-row scale (SGLang rowwise)",
    params_module=__name__ + ".params",
    codec_module=__name__ + ".codec",
    aliases=("rowwise-fp8",),
    encode_params=no_params,
    slots=(
        Slot("weight", "F8_E4M3", "(N, K)", kind=WEIGHT, meaning="FP8 weight"),
        Slot("weight_scale", "F32", "(N,)", positive=True, meaning="per-row dequantization scale"),
        Slot("input_scale", "F32", "(1,)", required=False, positive=True, meaning="static activation scale"),
        BIAS_SLOT,
    ),
    keys=(FORMAT_KEY,),
    geometry=dense_geometry,
    bits_text="8",
    loaders=frozenset({"sglang"}),
    serialized_map=header_map,
)

__all__ = ["ROWWISE_FLOAT8_E4M3FN", "ROWWISE_FP8", "DENSE", "MAP_VERSION", "SCALE_RECIPE", "header_map", "declares_rowwise"]

FORMATS = (ROWWISE_FLOAT8_E4M3FN,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
