"""comfy-kitchen 0.2.40 alone: each marked layer built as ComfyUI hands it over, then run.

For every layer with a marker (the ``.comfy_quant`` tensor, or its entry in the
``_quantization_metadata`` header map, which wins as in ComfyUI's ``convert_old_quants``):

1. read: the file through ``safetensors.safe_open`` (what every runtime uses);
2. load: the layout's ``Params`` from the stored tensors and marker keys, field by field as
   ComfyUI 0.33.0's ``_load_quantized_module`` (comfy/ops.py) fills them (marker integers
   through ``int()``), every tensor as stored (comfy-kitchen alone casts and reinterprets
   nothing: ComfyUI's U8 views and weight cast are ComfyUI's), in a ``QuantizedTensor``;
3. forward: ``F.linear`` with the ``QuantizedTensor`` on a seeded BF16 input (the layout's
   own linear), then ``dequantize()``; the output is measured against the dense layer
   (``measure``).

A marker that cannot be parsed, or whose format is not a name, leaves its layer to ComfyUI
(comfy-kitchen never sees it); a bias of the wrong shape is not passed (ComfyUI refuses it at
load) and the bias is cast to the input's dtype as ComfyUI casts it.
"""

from __future__ import annotations

import json
from pathlib import Path

from .outcome import Outcome

TARGET = "comfy-kitchen"
PREFIX = "model.diffusion_model."
"""The diffusion model's prefix in a whole checkpoint: ComfyUI strips it (``unet_prefix_from_state_dict``
finds it on more than five keys) before its layers reach comfy-kitchen."""
VERSION = "comfy-kitchen 0.2.40"
MISSING = ""


def _int(conf: dict, key: str, default: int):
    params = conf.get("params", {})
    if not isinstance(params, dict):
        params = {}
    return int(conf.get(key, params.get(key, default)))


def _get(conf: dict, key: str, default):
    params = conf.get("params", {})
    if not isinstance(params, dict):
        params = {}
    return conf.get(key, params.get(key, default))


def _markers(metadata: dict | None, tensors: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, t in tensors.items():
        if name.endswith(".comfy_quant"):
            try:
                conf = json.loads(t.numpy().tobytes())
            except ValueError:
                continue
            if isinstance(conf, dict):
                out[name[: -len(".comfy_quant")]] = conf
    text = (metadata or {}).get("_quantization_metadata")
    if text is not None:
        try:
            layers = json.loads(text)["layers"]
            for layer, conf in layers.items():
                if isinstance(conf, dict):
                    out[layer] = conf
        except (ValueError, TypeError, KeyError, AttributeError):
            pass
    return out


class KitchenDriver:
    target = TARGET
    version = VERSION

    def __init__(self) -> None:
        import comfy_kitchen.tensor as ckt
        import torch

        self.torch, self.ckt = torch, ckt

    def _build(self, conf: dict, tensors: dict, layer: str, shape: tuple[int, int]):
        torch, ckt = self.torch, self.ckt

        def stored(suffix: str, view=None):
            # as stored: reinterpreting U8-labelled scales is ComfyUI's doing, not comfy-kitchen's
            return tensors.get(f"{layer}.{suffix}")

        fmt = conf.get("format")
        common = {"orig_dtype": torch.bfloat16, "orig_shape": shape}
        if fmt in ("float8_e4m3fn", "float8_e5m2"):
            name, fields = "TensorCoreFP8Layout", {"scale": stored("weight_scale")}
        elif fmt == "mxfp8":
            name, fields = "TensorCoreMXFP8Layout", {"scale": stored("weight_scale", torch.float8_e8m0fnu)}
        elif fmt == "nvfp4":
            name = "TensorCoreNVFP4Layout"
            fields = {"scale": stored("weight_scale_2"), "block_scale": stored("weight_scale", torch.float8_e4m3fn)}
        elif fmt == "int8_tensorwise":
            name, fields = "TensorWiseINT8Layout", {"scale": stored("weight_scale")}
            if _get(conf, "convrot", False):
                fields.update(convrot=True, convrot_groupsize=_int(conf, "convrot_groupsize", 256))
        elif fmt == "convrot_w4a4":
            name = "TensorCoreConvRotW4A4Layout"
            fields = {
                "scale": stored("weight_scale"),
                "convrot_groupsize": _int(conf, "convrot_groupsize", 256),
                "quant_group_size": 64,
                "linear_dtype": _get(conf, "linear_dtype", "int4"),
            }
        elif fmt == "asym_w4a8_int8":
            name = "AsymW4A8Int8Layout"
            fields = {
                "scale": stored("weight_s_rel", torch.float8_e4m3fn),
                "s_channel": stored("weight_s_channel"),
                "codebook": stored("weight_codebook"),
                "correction": stored("weight_correction"),
                "group_size": _int(conf, "group_size", 16),
                "convrot_groupsize": _int(conf, "convrot_groupsize", 256),
            }
        elif fmt == "awq_w4a16":
            name = "TensorCoreAWQW4A16Layout"
            fields = {
                "scale": stored("weight_scale"),
                "zeros": stored("weight_zeros"),
                "group_size": _int(conf, "group_size", 64),
            }
        elif fmt == "svdquant_w4a4":
            name = "TensorCoreSVDQuantW4A4Layout"
            fields = {
                "scale": stored("weight_scale"),
                "proj_down": stored("weight_proj_down"),
                "proj_up": stored("weight_proj_up"),
                "smooth_factor": stored("weight_smooth_factor"),
                "act_unsigned": bool(_get(conf, "act_unsigned", False)),
            }
        else:
            raise KeyError(fmt)
        params = getattr(ckt, name).Params(**fields, **common)
        return ckt.QuantizedTensor(stored("weight"), name, params)

    def dense(self, path: Path) -> dict:
        """The dense layers ``Case.write`` kept beside the checkpoint."""
        from .cases import read_dense

        return read_dense(path)

    def run(self, path: Path) -> Outcome:
        from safetensors import safe_open

        from .measure import judge, reference_input, relative_error

        torch = self.torch
        try:
            with safe_open(str(path), framework="pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}
                metadata = f.metadata()
        except Exception as exc:
            return Outcome("raises", "read", type(exc).__name__, str(exc))
        markers = _markers(metadata, tensors)
        if sum(name.startswith(PREFIX) for name in tensors) > 5:  # ComfyUI strips the diffusion model's prefix
            tensors = {name[len(PREFIX) :]: t for name, t in tensors.items() if name.startswith(PREFIX)}
            markers = {name.removeprefix(PREFIX): conf for name, conf in markers.items()}
        dense = self.dense(Path(path))
        built = {}
        for layer, conf in markers.items():
            if layer not in dense or not isinstance(conf.get("format"), str):
                continue  # a layer without a format name never reaches comfy-kitchen
            try:
                built[layer] = self._build(conf, tensors, layer, tuple(dense[layer][0].shape))
            except Exception as exc:
                return Outcome("raises", "load", type(exc).__name__, str(exc), layer)
        errors = {}
        for layer, qt in built.items():
            weight, _ = dense[layer]
            x = reference_input(weight.shape[1])
            bias = tensors.get(f"{layer}.bias")
            # the bias is the caller's, in the compute dtype (ComfyUI casts it); one of another
            # shape never reaches comfy-kitchen (ComfyUI's load_state_dict refuses it)
            if bias is not None:
                bias = bias.to(x.dtype) if tuple(bias.shape) == (weight.shape[0],) else None
            try:
                with torch.inference_mode():
                    y = torch.nn.functional.linear(x, qt, bias)
                    qt.dequantize()
            except Exception as exc:
                return Outcome("raises", "forward", type(exc).__name__, str(exc), layer)
            errors[layer] = relative_error(y, weight, dense[layer][1], x)
        return judge(errors)

    def close(self) -> None:
        pass

    def __enter__(self) -> KitchenDriver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def driver() -> KitchenDriver | None:
    global MISSING
    try:
        from importlib.metadata import version

        found = version("comfy-kitchen")
    except Exception:
        MISSING = "comfy-kitchen is not installed"
        return None
    if found != "0.2.40":
        MISSING = f"comfy-kitchen {found} is installed; the verdicts are proven for 0.2.40"
        return None
    return KitchenDriver()
