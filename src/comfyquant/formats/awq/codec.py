"""``awq_w4a16``: unsigned 4-bit codes, float group scales and zeros, float activations
(comfy-kitchen 0.2.40 ``TensorCoreAWQW4A16Layout``).

``W[n, k] = (u - 8) * weight_scale[k // G, n] + weight_zeros[k // G, n]``, computed in the
scales' dtype (group-major tensors, transposed).  There is no quantizer: AWQ needs offline
calibration, so ``encode`` refuses, as comfy-kitchen does.
"""

from __future__ import annotations

import torch

from ...numerics.packing import lookup_pairs, pair_table
from ..codec import Codec, finish


class AWQCodec(Codec):
    name = "awq_w4a16"
    can_encode = False
    model_dtype_scales = True

    def _weight(self, t: dict, env: dict, r0: int, r1: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``r0:r1`` in the arithmetic dtype of ``dtype``, the scales and the zeros."""
        k, g = env["K"], env["group_size"]
        scale = t["weight_scale"][:, r0:r1].t().unsqueeze(-1)
        zeros = t["weight_zeros"][:, r0:r1].t().unsqueeze(-1)
        table = pair_table(torch.arange(16, dtype=torch.float32).sub_(8.0).to(dtype))
        w = lookup_pairs(t["weight"][r0:r1], table).view(r1 - r0, k // g, g)
        if scale.dtype == dtype and zeros.dtype == dtype:
            w = w.mul_(scale).add_(zeros)
        else:
            w = w * scale + zeros
        return w.view(r1 - r0, k)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        return finish(self._weight(t, plan.env, r0, r1, dtype), dtype, out)

    def _linear_setup(self, x2, t, plan, runtime=True):
        """comfy-kitchen's eager GEMV: dequantize in the scales' dtype, one float matmul."""
        return x2.to(t["weight_scale"].dtype), x2.dtype

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        x_c, dtype = state
        y = x_c @ self._weight(t, plan.env, r0, r1, x_c.dtype).t()
        if bias is not None:
            y = y + bias
        return y.to(dtype)


CODECS = {AWQCodec.name: AWQCodec()}
