"""``QuantLinear``: one Comfy-quantized linear layer as an ``nn.Module``.

It holds the layer's stored tensors (buffers named by their suffixes, so its ``state_dict``
keys are the checkpoint's) and its marker, and computes what ComfyUI computes with them:

* comfy-kitchen installed: the weight is comfy-kitchen's ``QuantizedTensor`` built the way
  ComfyUI's loader builds it (``kitchen``), and the forward is ComfyUI's -- the
  activation quantized by the layout where ComfyUI does it (FP8, NVFP4, MXFP8), then
  ``F.linear(x, QuantizedTensor, bias)``, whose layout handler quantizes the activation
  itself for INT8, W4A4 and W4A8.  A layout whose activation quantization comfy-kitchen
  cannot run on the device (NVFP4/MXFP8 on CPU) runs emulated, as ComfyUI does there: the
  comfyquant codec's forward (both operands quantized, dequantized, one F32 GEMM).
* without comfy-kitchen: the codec's ``linear`` (bit-exact with comfy-kitchen's eager backend).
* ``full_precision_matrix_mult`` in the marker: the dequantized weight and a float matmul.

A loader builds it from one ``QuantWeight`` (the "parameter object": stored tensors by
suffix plus the marker), which is what a converter that splits or fuses rows passes around.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from .. import codecs
from ..formats.codec import CodecError, output_dtype
from ..formats.registry import FORMATS
from . import kitchen
from .marker_fields import marker_problem

KITCHEN = "comfy-kitchen"
CODEC = "codec"
EMULATED = "emulated"
DENSE = "dense"


class QuantWeight:
    """A quantized layer's stored tensors (by suffix: ``weight``, ``weight_scale`` ...; no bias)
    and its marker -- everything needed to run or decode it, carried as one object."""

    __slots__ = ("tensors", "marker", "name")

    def __init__(self, tensors: Mapping[str, torch.Tensor], marker: Mapping, name: str | None = None) -> None:
        problem = marker_problem(marker, name or "layer")
        if problem is not None:
            raise CodecError(problem)
        self.tensors = {s: t for s, t in tensors.items() if s not in ("bias", "comfy_quant")}
        self.marker = dict(marker)
        self.name = name

    @property
    def format(self) -> str:
        return self.marker["format"]

    def __repr__(self) -> str:
        shapes = {s: (str(t.dtype).replace("torch.", ""), tuple(t.shape)) for s, t in self.tensors.items()}
        return f"QuantWeight({self.name!r}, {self.marker}, {shapes})"


class QuantLinear(nn.Module):
    """A linear layer whose weight is stored quantized (any format with a codec).

    ``forward`` accepts BF16, F16 or F32 input with any leading dimensions and returns the
    input's dtype; ``dequantize()`` gives the dense ``[out_features, in_features]`` weight."""

    weight: torch.Tensor
    """The stored weight (a buffer registered under its suffix, like every stored tensor)."""
    compute_dtype: torch.dtype
    """Set by a loader whose convention it is (diffusers): the dtype the model computes in."""

    def __init__(
        self,
        weight: QuantWeight,
        bias: torch.Tensor | None = None,
        *,
        in_features: int | None = None,
        out_features: int | None = None,
    ) -> None:
        super().__init__()
        name = weight.name or "layer"
        codec = codecs.get(weight.format)
        probe = dict(weight.tensors)
        if bias is not None:
            probe["bias"] = bias
        plan = codec.plan(probe, weight.marker, name)  # the checker's layer rules: raises on a contradiction
        n, k = plan.shape
        out_features = n if out_features is None else out_features
        in_features = k if in_features is None else in_features
        rows, cols = FORMATS[weight.format].pad
        if (n, k) != (out_features, in_features) and (n, k) != (-(-out_features // rows) * rows, -(-in_features // cols) * cols):
            raise CodecError(
                f"{name}: stored {weight.format} weight is [{n}, {k}], the model's layer is [{out_features}, {in_features}]"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.marker = dict(plan.marker)
        self.name = weight.name
        self.suffixes = tuple(weight.tensors)
        for suffix, t in weight.tensors.items():
            self.register_buffer(suffix, t)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._qt: dict = {}

    # -- construction helpers ----------------------------------------------------------------
    @classmethod
    def from_weight(cls, weight: QuantWeight, bias: torch.Tensor | None = None, linear: nn.Linear | None = None) -> QuantLinear:
        """The layer for ``weight``; with ``linear``, its shape is the model's (padded storage
        is read as the model's ``[out, in]``, as ComfyUI does)."""
        if linear is None:
            return cls(weight, bias)
        return cls(weight, bias, in_features=linear.in_features, out_features=linear.out_features)

    @property
    def format(self) -> str:
        return self.marker["format"]

    def stored(self) -> dict[str, torch.Tensor]:
        """The quantized tensors by suffix (no bias)."""
        return {s: getattr(self, s) for s in self.suffixes}

    def quant_weight(self) -> QuantWeight:
        return QuantWeight(self.stored(), self.marker, self.name)

    # -- how it runs -------------------------------------------------------------------------
    def compute(self, device: torch.device | None = None, dtype: torch.dtype = torch.bfloat16) -> tuple[str, str | None]:
        """(path, why): ``comfy-kitchen`` (its QuantizedTensor linear; why None), ``dense``
        (marker asks for a float matmul), ``emulated`` (comfy-kitchen cannot run this
        layout's quantized GEMM on the device), ``codec`` (comfy-kitchen not installed)."""
        if self.marker.get("full_precision_matrix_mult") is True:
            return DENSE, "the marker sets full_precision_matrix_mult: dequantized weight, float matmul"
        spec = kitchen.layout_for(self.format)
        if spec is None:
            why = (
                "comfy-kitchen is not installed" if not kitchen.available() else f"comfy-kitchen has no layout for {self.format}"
            )
            return CODEC, f"{why}: comfyquant's codec runs the same arithmetic"
        device = device or self.weight.device
        refused = kitchen.gemm_unsupported(spec, device, dtype)
        if refused is not None:
            return EMULATED, (
                f"comfy-kitchen has no {self.format} GEMM on {device.type} ({refused}): "
                "emulated with dequantized operands and an F32 GEMM, as ComfyUI runs it there"
            )
        return KITCHEN, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise CodecError(f"{self.name or 'layer'}: input has {x.shape[-1]} features, the layer takes {self.in_features}")
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise CodecError(f"{self.name or 'layer'}: activations must be BF16, F16 or F32, got {x.dtype}")
        lead = x.shape[:-1]
        compute = self._compute_dtype(x.dtype)
        x2 = x.reshape(-1, self.in_features).to(compute)
        bias = None if self.bias is None else self.bias.to(compute)
        route = self._route(x.device, compute)
        if route is None:
            y = self._codec_linear(x2, bias)
        else:
            spec, qt, dense = route
            if dense:
                if spec.pre_scale is not None and spec.pre_scale in self.suffixes:
                    x2 = x2 * getattr(self, spec.pre_scale).to(compute)
                y = F.linear(x2, qt.dequantize(), bias)
            elif spec.quantize_input:
                y = F.linear(kitchen.quantized_input(spec, x2, self._operands(compute)), qt, bias)
            else:
                y = F.linear(x2, qt, bias)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the layer computes in for input of ``dtype``: the input's, except for the
        formats whose stored scales are in the model dtype (AWQ, SVDQuant), whose kernels need
        the activation in the scales' dtype.  There an F32 input (or F32 scales) computes in
        F32, the other side upcast exactly; a BF16 input to F16 scales or the reverse computes
        in the scales' dtype, the file's model dtype.  The output is cast back to the input's
        dtype by ``forward``."""
        scales = self._buffers.get("weight_scale")
        if scales is None or scales.dtype == dtype or not codecs.get(self.format).model_dtype_scales:
            return dtype
        return torch.float32 if torch.float32 in (dtype, scales.dtype) else scales.dtype

    def _operands(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The stored tensors a forward in ``dtype`` uses: as stored, except that an F32
        forward of a model-dtype-scales format reads its F16/BF16 tensors upcast to F32 (exact)."""
        stored = self.stored()
        if dtype != torch.float32 or not codecs.get(self.format).model_dtype_scales:
            return stored
        return {s: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for s, t in stored.items()}

    def _route(self, device: torch.device, dtype: torch.dtype):
        """(layout model, comfy-kitchen weight in ``dtype``, dense?) of the comfy-kitchen path,
        or None for the codec path; decided once per device and dtype."""
        key = (device, dtype)
        if key not in self._qt:
            path, _why = self.compute(device, dtype)
            spec = kitchen.layout_for(self.format) if path in (KITCHEN, DENSE) else None
            if spec is None:
                self._qt[key] = None
            else:
                params = FORMATS[self.format].params(self.marker)
                qt = kitchen.build(spec, self._operands(dtype), params, (self.out_features, self.in_features), dtype)
                self._qt[key] = (spec, qt, path == DENSE)
        return self._qt[key]

    def _codec_linear(self, x2: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        tensors = self._operands(x2.dtype)
        if bias is not None and self.bias is not None:
            tensors["bias"] = self.bias  # the model's N of padded storage, as the file keeps it
        codec = codecs.get(self.format)
        plan_k = codec.plan(tensors, self.marker, self.name).shape[1]
        if plan_k != self.in_features:  # padded K (no record of the model's K): zero columns
            x2 = F.pad(x2, (0, plan_k - self.in_features))
        y = codec.linear(x2, tensors, self.marker, bias, layer=self.name)
        return y[:, : self.out_features] if y.shape[1] != self.out_features else y

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense weight ``[out_features, in_features]`` (default dtype: the layer's model
        dtype -- the bias's, else BF16), bit-identical to comfy-kitchen's ``dequantize``
        (a ``pre_quant_scale`` folded in per column)."""
        tensors = self.stored()
        if self.bias is not None:
            tensors["bias"] = self.bias
        dense = codecs.get(self.format).decode(tensors, self.marker, dtype=dtype, layer=self.name)
        return dense[: self.out_features, : self.in_features]

    @property
    def dtype(self) -> torch.dtype:
        """The model dtype the layer computes in by default (bias, marker ``orig_dtype`` ...)."""
        tensors = self.stored()
        if self.bias is not None:
            tensors["bias"] = self.bias
        return output_dtype(None, tensors, self.marker)

    def extra_repr(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.marker.items() if k != "format")
        path, _ = self.compute()
        text = (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"format={self.format}"
        )
        return f"{text}{', ' + params if params else ''}, compute={path}"

    # -- device and dtype moves, loads ---------------------------------------------------------
    def _load_from_state_dict(self, *args, **kwargs):
        self._qt = {}  # comfy-kitchen weights built from the old tensors (``assign=True`` replaces them)
        return super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, recurse=True):
        """Moves follow the module (``.to(device)``), casts do not touch the stored tensors:
        ``model.to(torch.bfloat16)`` would otherwise turn FP8 codes or scales into values."""
        stored = {id(b) for b in self._buffers.values() if b is not None}

        def keep_dtype(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in stored:
                return fn(t)
            # where fn sends a tensor of this dtype, learned on an empty one: the stored tensor
            # is never converted (a cast of a large FP8 layer only to be thrown away is seconds)
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            return fn(t) if probe.dtype == t.dtype else t.to(device=probe.device)

        super()._apply(keep_dtype, recurse)
        self._qt = {}
        return self
