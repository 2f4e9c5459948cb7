"""How ComfyUI hands each format to comfy-kitchen: a model of ComfyUI's ``QUANT_ALGOS`` table
and its loader ``_load_quantized_module`` (ComfyUI 0.33.0 ``comfy/quant_ops.py``, ``comfy/ops.py``), as data.

Per format: the comfy-kitchen layout class, the dtype the stored weight must have, which
stored tensor feeds which field of the layout's ``Params`` (and the dtype ComfyUI views a
``U8``-labelled one as), which marker keys become ``Params`` fields, and whether ComfyUI
quantizes the activation itself before the matmul (``quantize_input``: FP8, NVFP4, MXFP8) or
hands the float activation to the layout's linear handler (INT8, W4A4 and W4A8 quantize it
there; AWQ and SVDQuant do not).  ``comfyquant.torch`` builds comfy-kitchen's
``QuantizedTensor`` from it.  Pure data (safetensors dtype names): no torch here.

One deliberate difference: ComfyUI drops W4A8's ``weight_correction`` (its loader never passes it); the model
passes it, so the result is comfy-kitchen's (and the codecs') asymmetric W4A8.
"""

from __future__ import annotations


class Field:
    """``Params`` field <- stored tensor ``suffix`` (viewed as ``view`` when stored as U8)."""

    __slots__ = ("field", "suffix", "view", "required")

    def __init__(self, field: str, suffix: str, view: str | None = None, required: bool = True) -> None:
        self.field, self.suffix, self.view, self.required = field, suffix, view, required


class KitchenLayout:
    """One format as ComfyUI builds it for comfy-kitchen."""

    __slots__ = (
        "layout",
        "storage",
        "fields",
        "keys",
        "constants",
        "quantize_input",
        "input_dtype",
        "unit_input_scale",
        "input_scale",
        "pre_scale",
    )

    def __init__(
        self,
        layout: str,
        storage: str,
        fields: tuple[Field, ...],
        keys: tuple[tuple[str, str, type], ...] = (),
        constants: dict | None = None,
        quantize_input: bool = False,
        input_dtype: str | None = None,
        unit_input_scale: bool = False,
        input_scale: str | None = None,
        pre_scale: str | None = None,
    ) -> None:
        self.layout = layout
        self.storage = storage
        """The weight's dtype in the layout (ComfyUI value-casts the stored weight to it)."""
        self.fields = fields
        self.keys = keys
        """(Params field, marker key, type): the marker value (or the description's default)."""
        self.constants = constants or {}
        self.quantize_input = quantize_input
        """ComfyUI wraps the activation with ``QuantizedTensor.from_float(x, layout, scale=...)``."""
        self.input_dtype = input_dtype
        """The element dtype the activation is quantized to, when the layout takes one."""
        self.unit_input_scale = unit_input_scale
        """Without a stored input scale ComfyUI quantizes with 1.0 (not a dynamic scale)."""
        self.input_scale = input_scale
        """Stored tensor ComfyUI passes as the activation's scale (None: the layout's own rule)."""
        self.pre_scale = pre_scale
        """Stored tensor the activation is multiplied by first (AWQ-style smoothing)."""


LAYOUTS: dict[str, KitchenLayout] = {
    "float8_e4m3fn": KitchenLayout(
        "TensorCoreFP8Layout",
        "F8_E4M3",
        (Field("scale", "weight_scale"),),
        quantize_input=True,
        input_dtype="F8_E4M3",
        unit_input_scale=True,
        input_scale="input_scale",
    ),
    "float8_e5m2": KitchenLayout(
        "TensorCoreFP8Layout",
        "F8_E5M2",
        (Field("scale", "weight_scale"),),
        quantize_input=True,
        input_dtype="F8_E5M2",
        unit_input_scale=True,
        input_scale="input_scale",
    ),
    "int8_tensorwise": KitchenLayout(
        "TensorWiseINT8Layout",
        "I8",
        (Field("scale", "weight_scale"),),
        (("convrot", "convrot", bool), ("convrot_groupsize", "convrot_groupsize", int)),
    ),
    "asym_w4a8_int8": KitchenLayout(
        "AsymW4A8Int8Layout",
        "I8",
        (
            Field("scale", "weight_s_rel", "F8_E4M3"),
            Field("s_channel", "weight_s_channel"),
            Field("codebook", "weight_codebook", required=False),
            Field("correction", "weight_correction", required=False),
        ),
        (("group_size", "group_size", int), ("convrot_groupsize", "convrot_groupsize", int)),
    ),
    "convrot_w4a4": KitchenLayout(
        "TensorCoreConvRotW4A4Layout",
        "I8",
        (Field("scale", "weight_scale"),),
        (("convrot_groupsize", "convrot_groupsize", int), ("linear_dtype", "linear_dtype", str)),
        {"quant_group_size": 64},
    ),
    "nvfp4": KitchenLayout(
        "TensorCoreNVFP4Layout",
        "U8",
        (Field("scale", "weight_scale_2"), Field("block_scale", "weight_scale", "F8_E4M3")),
        quantize_input=True,
        input_scale="input_scale",
        pre_scale="pre_quant_scale",
    ),
    "mxfp8": KitchenLayout("TensorCoreMXFP8Layout", "F8_E4M3", (Field("scale", "weight_scale", "F8_E8M0"),), quantize_input=True),
    "awq_w4a16": KitchenLayout(
        "TensorCoreAWQW4A16Layout",
        "I8",
        (Field("scale", "weight_scale"), Field("zeros", "weight_zeros")),
        (("group_size", "group_size", int),),
    ),
    "svdquant_w4a4": KitchenLayout(
        "TensorCoreSVDQuantW4A4Layout",
        "I8",
        (
            Field("scale", "weight_scale"),
            Field("proj_down", "weight_proj_down"),
            Field("proj_up", "weight_proj_up"),
            Field("smooth_factor", "weight_smooth_factor"),
        ),
        (("act_unsigned", "act_unsigned", bool),),
    ),
}
