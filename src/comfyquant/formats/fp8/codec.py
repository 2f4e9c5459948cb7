"""Per-tensor FP8 weights with one F32 scale (comfy-kitchen 0.2.40 ``TensorCoreFP8Layout``):
``float8_e4m3fn`` here, and the codec class other per-tensor FP8 packages instantiate with their
element type."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from ...numerics.floats import E4M3, FP8_MAX, fp8_decode_scaled, fp8_encode
from ...numerics.fp8_widen import folded_scale, has_nan_codes, widen_e4m3_scaled
from ...numerics.rows import Weight, cast_rows
from ..codec import Codec, reject_unknown, rows_of


class FP8Codec(Codec):
    """Per-tensor FP8.  The activation is quantized with ``input_scale`` (ComfyUI's unit scale
    when absent) and multiplied on torch's scaled-mm path, as comfy-kitchen does."""

    def __init__(self, name: str, fp8: torch.dtype) -> None:
        self.name = name
        self.fp8 = fp8

    def _encode(self, weight: Weight, params: dict, name: str, amax: torch.Tensor | None) -> tuple[dict, dict]:
        scale = params.pop("scale", None)
        input_scale = params.pop("input_scale", None)
        reject_unknown(params, name)
        if scale is None:
            # amax / max in the weight's dtype, then widened (comfy-kitchen's rule).
            assert amax is not None  # measured by ``encode``: this codec does not check finiteness itself
            scale = amax / FP8_MAX[self.fp8]
        scale = torch.as_tensor(scale).to(torch.float32).reshape(())
        if scale.item() == 0:
            # An all-zero weight: comfy-kitchen multiplies 0 by 1/0 and stores NaN codes.
            q = torch.zeros(weight.shape, dtype=self.fp8)
        else:
            inverse = (1.0 / scale).to(weight.dtype)
            lim = FP8_MAX[self.fp8]
            q = cast_rows(weight, self.fp8, lambda w, scratch: torch.mul(w, inverse, out=scratch).clamp_(-lim, lim))
        tensors = {"weight": q, "weight_scale": scale}
        if input_scale is not None:
            tensors["input_scale"] = torch.as_tensor(input_scale).to(torch.float32).reshape(())
        return tensors, {"format": self.name}

    def _prepare(self, t, env, dtype):
        # per layer: the folded scale of the E4M3 -> BF16 bit path (numerics/fp8_widen.py);
        # whether a block has NaN codes is asked per block, while its codes are in cache
        return folded_scale(t["weight"], t["weight_scale"].reshape(()), dtype, scan=False)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        q = rows_of(t["weight"], r0, r1)
        if state is not None and not has_nan_codes(q):
            return widen_e4m3_scaled(q, state, out)
        return fp8_decode_scaled(q, t["weight_scale"].reshape(()), dtype, out)

    def _linear_setup(self, x2, t, plan, runtime=True):
        s_x = t.get("input_scale")
        s_x = torch.ones((), dtype=torch.float32) if s_x is None else s_x.to(torch.float32).reshape(())
        s_w = t["weight_scale"].to(torch.float32).reshape(())
        return fp8_encode(x2 * (1.0 / s_x).to(x2.dtype), self.fp8), s_x, s_w, x2.dtype

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        q_x, s_x, s_w, dtype = state
        q_w = rows_of(t["weight"], r0, r1)
        b = None if bias is None else bias.to(dtype)
        try:
            return F.scaled_mm(
                q_x,
                q_w.t(),
                scale_a=s_x,
                scale_recipe_a=F.ScalingType.TensorWise,
                scale_b=s_w,
                scale_recipe_b=F.ScalingType.TensorWise,
                bias=b,
                output_dtype=dtype,
                use_fast_accum=False,
            )
        except (RuntimeError, TypeError, AttributeError):
            # No FP8 GEMM for these operands: dequantize both, as comfy-kitchen falls back.
            return F.linear(q_x.to(dtype) * s_x.to(dtype), q_w.to(dtype) * s_w.to(dtype), b)


CODECS = {c.name: c for c in (FP8Codec("float8_e4m3fn", E4M3),)}
