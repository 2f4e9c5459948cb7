"""comfy-kitchen's ``QuantizedTensor`` built from a layer's stored tensors, as ComfyUI builds it.

This is a model of one runtime (ComfyUI's ``QUANT_ALGOS`` table and its loader
``_load_quantized_module``, spec formats.md 1.8 and 4.5), so, like the runtime profiles in
``targets/``, it names the formats that runtime knows; nothing else here depends on a format's
name.  Per format it says which comfy-kitchen layout class holds the layer, which stored
tensor feeds which field of the layout's ``Params`` (and the dtype ComfyUI views it as), which
marker keys become ``Params`` fields, and whether ComfyUI quantizes the activation itself
before the matmul (``quantize_input``: FP8, NVFP4, MXFP8) or hands the float activation to the
layout's linear handler, which quantizes it (INT8, W4A4, W4A8) or does not (AWQ, SVDQuant).

One deliberate difference: ComfyUI drops W4A8's ``weight_correction`` (spec I-2); the layout
gets it here, so the result is comfy-kitchen's (and the codecs') asymmetric W4A8.
"""

from __future__ import annotations

from functools import lru_cache

import torch

KITCHEN_MODULE = "comfy_kitchen.tensor"


class Field:
    """``Params`` field <- stored tensor ``suffix`` (viewed as ``view`` when stored as U8)."""

    __slots__ = ("field", "suffix", "view", "required")

    def __init__(self, field: str, suffix: str, view: torch.dtype | None = None, required: bool = True) -> None:
        self.field, self.suffix, self.view, self.required = field, suffix, view, required


class KitchenLayout:
    """How ComfyUI turns one format's stored tensors and marker into a comfy-kitchen layout."""

    __slots__ = ("layout", "storage", "fields", "keys", "constants", "quantize_input", "input_kwargs", "input_scale",
                 "pre_scale")

    def __init__(self, layout: str, storage: torch.dtype, fields: tuple[Field, ...], keys: tuple[tuple[str, str, type], ...] = (),
                 constants: dict | None = None, quantize_input: bool = False, input_kwargs: dict | None = None,
                 input_scale: str | None = None, pre_scale: str | None = None) -> None:
        self.layout = layout
        self.storage = storage
        self.fields = fields
        self.keys = keys
        """(Params field, marker key, type) -- the marker value (or the description's default)."""
        self.constants = constants or {}
        self.quantize_input = quantize_input
        """ComfyUI wraps the activation with ``QuantizedTensor.from_float(x, layout, scale=...)``."""
        self.input_kwargs = input_kwargs or {}
        self.input_scale = input_scale
        """Stored tensor ComfyUI passes as the activation's scale (None: the layout's own rule)."""
        self.pre_scale = pre_scale
        """Stored tensor the activation is multiplied by first (AWQ-style smoothing)."""


_E4M3, _E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu

LAYOUTS: dict[str, KitchenLayout] = {
    "float8_e4m3fn": KitchenLayout("TensorCoreFP8Layout", _E4M3, (Field("scale", "weight_scale"),),
                                   quantize_input=True, input_kwargs={"dtype": _E4M3, "scale": 1.0}, input_scale="input_scale"),
    "float8_e5m2": KitchenLayout("TensorCoreFP8Layout", torch.float8_e5m2, (Field("scale", "weight_scale"),),
                                 quantize_input=True, input_kwargs={"dtype": torch.float8_e5m2, "scale": 1.0},
                                 input_scale="input_scale"),
    "int8_tensorwise": KitchenLayout("TensorWiseINT8Layout", torch.int8, (Field("scale", "weight_scale"),),
                                     (("convrot", "convrot", bool), ("convrot_groupsize", "convrot_groupsize", int))),
    "asym_w4a8_int8": KitchenLayout("AsymW4A8Int8Layout", torch.int8,
                                    (Field("scale", "weight_s_rel", _E4M3), Field("s_channel", "weight_s_channel"),
                                     Field("codebook", "weight_codebook", required=False),
                                     Field("correction", "weight_correction", required=False)),
                                    (("group_size", "group_size", int), ("convrot_groupsize", "convrot_groupsize", int))),
    "convrot_w4a4": KitchenLayout("TensorCoreConvRotW4A4Layout", torch.int8, (Field("scale", "weight_scale"),),
                                  (("convrot_groupsize", "convrot_groupsize", int), ("linear_dtype", "linear_dtype", str)),
                                  {"quant_group_size": 64}),
    "nvfp4": KitchenLayout("TensorCoreNVFP4Layout", torch.uint8,
                           (Field("scale", "weight_scale_2"), Field("block_scale", "weight_scale", _E4M3)),
                           quantize_input=True, input_scale="input_scale", pre_scale="pre_quant_scale"),
    "mxfp8": KitchenLayout("TensorCoreMXFP8Layout", _E4M3, (Field("scale", "weight_scale", _E8M0),), quantize_input=True),
    "awq_w4a16": KitchenLayout("TensorCoreAWQW4A16Layout", torch.int8,
                               (Field("scale", "weight_scale"), Field("zeros", "weight_zeros")),
                               (("group_size", "group_size", int),)),
    "svdquant_w4a4": KitchenLayout("TensorCoreSVDQuantW4A4Layout", torch.int8,
                                   (Field("scale", "weight_scale"), Field("proj_down", "weight_proj_down"),
                                    Field("proj_up", "weight_proj_up"), Field("smooth_factor", "weight_smooth_factor")),
                                   (("act_unsigned", "act_unsigned", bool),)),
}


@lru_cache(maxsize=1)
def available() -> bool:
    """comfy-kitchen importable (and the layouts registered)."""
    try:
        import comfy_kitchen.tensor  # noqa: F401
    except Exception:  # noqa: BLE001 -- any import failure means: not usable here
        return False
    return True


def layout_for(fmt: str) -> KitchenLayout | None:
    """The layout model of ``fmt`` when comfy-kitchen is usable and has the layout class."""
    spec = LAYOUTS.get(fmt)
    if spec is None or not available():
        return None
    from comfy_kitchen.tensor.base import LAYOUTS as REGISTERED

    return spec if spec.layout in REGISTERED else None


def build(spec: KitchenLayout, tensors: dict[str, torch.Tensor], marker_params: dict, shape: tuple[int, int],
          dtype: torch.dtype):
    """The weight as ComfyUI hands it to comfy-kitchen: ``QuantizedTensor(qdata, layout, Params)``
    with ``orig_shape`` the model's ``[N, K]`` and ``orig_dtype`` the compute dtype."""
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.base import get_layout_class

    kwargs: dict = dict(spec.constants)
    for f in spec.fields:
        t = tensors.get(f.suffix)
        if t is None:
            if f.required:
                raise KeyError(f.suffix)
            continue
        if f.view is not None and t.dtype == torch.uint8:
            t = t.view(f.view)
        kwargs[f.field] = t
    for name, key, kind in spec.keys:
        value = marker_params.get(key)
        if value is not None:
            kwargs[name] = kind(value)
    params = get_layout_class(spec.layout).Params(orig_dtype=dtype, orig_shape=tuple(shape), **kwargs)
    weight = tensors["weight"]
    return QuantizedTensor(weight if weight.dtype == spec.storage else weight.to(spec.storage), spec.layout, params)


_SUPPORT: dict[tuple[str, str, torch.dtype], str | None] = {}


def gemm_unsupported(spec: KitchenLayout, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why comfy-kitchen cannot run this layout's quantized-activation GEMM on ``device``
    (None: it can).  Probed once per layout, device type and dtype with a tiny layer:
    comfy-kitchen 0.2.40's eager backend has no NVFP4/MXFP8 GEMM on CPU, where ComfyUI runs
    those formats emulated."""
    if not spec.quantize_input:
        return None
    key = (spec.layout, device.type, dtype)
    if key not in _SUPPORT:
        from comfy_kitchen.tensor import QuantizedTensor

        weight_kwargs = {k: v for k, v in spec.input_kwargs.items() if k != "scale"}
        try:
            w = QuantizedTensor.from_float(torch.ones((128, 128), dtype=dtype, device=device), spec.layout, **weight_kwargs)
            x = QuantizedTensor.from_float(torch.ones((1, 128), dtype=dtype, device=device), spec.layout, **spec.input_kwargs)
            torch.nn.functional.linear(x, w)
            _SUPPORT[key] = None
        except Exception as exc:  # noqa: BLE001 -- the library's refusal is the answer
            _SUPPORT[key] = f"{type(exc).__name__}: {exc}"
    return _SUPPORT[key]


def quantized_input(spec: KitchenLayout, x2: torch.Tensor, tensors: dict[str, torch.Tensor]):
    """ComfyUI's activation: smoothed by ``pre_scale``, then ``QuantizedTensor.from_float``
    with the stored input scale when the layer has one."""
    from comfy_kitchen.tensor import QuantizedTensor

    if spec.pre_scale is not None and spec.pre_scale in tensors:
        x2 = x2 * tensors[spec.pre_scale].to(x2.dtype)
    kwargs = dict(spec.input_kwargs)
    scale = tensors.get(spec.input_scale) if spec.input_scale else None
    if scale is not None:
        kwargs["scale"] = scale
    return QuantizedTensor.from_float(x2, spec.layout, **kwargs)
