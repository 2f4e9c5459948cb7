"""comfy-kitchen's ``QuantizedTensor`` built from a layer's stored tensors, as ComfyUI builds it.

What goes where is the runtime model in ``comfyquant.targets.kitchen_layouts`` (data);
this module turns it into comfy-kitchen objects: the weight (``QuantizedTensor(qdata,
layout, Params)`` with the model's shape and the compute dtype), the activation ComfyUI
quantizes for the layouts that need it, and whether comfy-kitchen can run the layout's
quantized GEMM on a device at all.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..numerics.dtypes import TORCH_DTYPES
from ..targets.kitchen_layouts import LAYOUTS, KitchenLayout


@lru_cache(maxsize=1)
def available() -> bool:
    """comfy-kitchen importable (and its layouts registered)."""
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


def build(spec: KitchenLayout, tensors: dict[str, torch.Tensor], marker_params: dict, shape: tuple[int, int], dtype: torch.dtype):
    """The weight as ComfyUI hands it to comfy-kitchen: ``QuantizedTensor(qdata, layout, Params)``
    with ``orig_shape`` the model's ``[N, K]`` and ``orig_dtype`` the compute dtype (ComfyUI
    casts the weight to the input's dtype, which for a QuantizedTensor changes only that)."""
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
            t = t.view(TORCH_DTYPES[f.view])
        kwargs[f.field] = t
    for name, key, kind in spec.keys:
        value = marker_params.get(key)
        if value is not None:
            kwargs[name] = kind(value)
    params = get_layout_class(spec.layout).Params(orig_dtype=dtype, orig_shape=tuple(shape), **kwargs)
    weight, storage = tensors["weight"], TORCH_DTYPES[spec.storage]
    return QuantizedTensor(weight if weight.dtype == storage else weight.to(storage), spec.layout, params)


def _input_kwargs(spec: KitchenLayout, with_scale: bool = True) -> dict:
    kwargs: dict = {}
    if spec.input_dtype is not None:
        kwargs["dtype"] = TORCH_DTYPES[spec.input_dtype]
    if with_scale and spec.unit_input_scale:
        kwargs["scale"] = 1.0
    return kwargs


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

        try:
            w = QuantizedTensor.from_float(
                torch.ones((128, 128), dtype=dtype, device=device), spec.layout, **_input_kwargs(spec, with_scale=False)
            )
            x = QuantizedTensor.from_float(torch.ones((1, 128), dtype=dtype, device=device), spec.layout, **_input_kwargs(spec))
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
    kwargs = _input_kwargs(spec)
    scale = tensors.get(spec.input_scale) if spec.input_scale else None
    if scale is not None:
        kwargs["scale"] = scale
    return QuantizedTensor.from_float(x2, spec.layout, **kwargs)
