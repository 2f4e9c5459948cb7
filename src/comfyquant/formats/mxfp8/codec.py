"""``mxfp8``: FP8 E4M3 values with one E8M0 exponent per 1x32 block, blocked layout
(comfy-kitchen 0.2.40 ``TensorCoreMXFP8Layout``).

Storage is padded to 32x32; the dense weight is sliced to the model's ``[N, K]`` (N from the
bias, both from a convert_to_quant ``orig_shape`` marker key when present).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from ...numerics.blocked import ceil_to, from_blocked, padded_blocks, to_blocked
from ...numerics.floats import (
    E4M3,
    FP8_MAX,
    e8m0_decode,
    e8m0_from_amax,
    fp8_decode,
    fp8_decode_scaled,
)
from ...numerics.fp8_widen import folded_scale, has_nan_codes, widen_e4m3_scaled
from ...numerics.rows import gather_rows, row_blocks
from ..codec import Codec, finish, reject_unknown

BLOCK = 32


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to 32x32; per 1x32 block the smallest power of two that fits ``amax`` under 448.

    Returns (FP8 values ``[Np, Kp]``, E8M0 exponents uint8 ``[Np, Kp/32]``)."""
    blocks, rp, cp = padded_blocks(x, BLOCK)
    amax = torch.amax(torch.abs(blocks), dim=-1)
    e = e8m0_from_amax(amax)
    empty = amax == 0
    scale = torch.where(empty, torch.ones_like(amax, dtype=torch.float32), e8m0_decode(e))
    data = blocks.float() / scale.unsqueeze(-1)
    if bool(empty.any()):  # an all-zero block divides by 1; -0.0 becomes +0.0 as in the reference
        data = torch.where(empty.unsqueeze(-1), torch.zeros_like(data), data)
    lim = FP8_MAX[E4M3]
    return data.clamp_(-lim, lim).reshape(rp, cp).to(E4M3), e


class MXFP8Codec(Codec):
    name = "mxfp8"

    def dense_shape(self, env, marker):
        orig = marker.get("orig_shape")
        if (
            isinstance(orig, list)
            and len(orig) == 2
            and all(isinstance(v, int) and v > 0 for v in orig)
            and env["N"] == ceil_to(orig[0], BLOCK)
            and env["K"] == ceil_to(orig[1], BLOCK)
        ):
            return orig[0], orig[1]
        return env.get("N_model", env["N"]), env["K"]

    def _encode(self, weight, params, name, amax):
        reject_unknown(params, name)
        q, e = gather_rows(row_blocks(weight, multiple=BLOCK), quantize_mxfp8, ceil_to(weight.shape[0], BLOCK))
        return {"weight": q, "weight_scale": to_blocked(e).view(torch.float8_e8m0fnu)}, {"format": self.name}

    def _prepare(self, t, env, dtype):
        """Per layer: the block scales in the arithmetic's dtype and, for a BF16 output, the
        folded factors ``2^120 * scale`` of the E4M3 -> BF16 bit path (None where one would
        overflow BF16: a scale over 2^7, E8M0 255 -- infinite -- among them)."""
        scales = e8m0_decode(from_blocked(t["weight_scale"].view(torch.uint8), env["N"], env["K"] // BLOCK))
        if dtype != torch.bfloat16:
            return scales, None
        # Powers of two are exact in BF16, and a BF16 product is the F32 product rounded
        # once: the same bits as comfy-kitchen's F32 multiply + cast, at half the traffic.
        scales = scales.to(torch.bfloat16)
        return scales, folded_scale(t["weight"], scales, dtype, scan=False)  # NaN codes: per block

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        k = plan.env["K"]
        scales, folded = state
        q = t["weight"][r0:r1]
        blocks = q.view(r1 - r0, k // BLOCK, BLOCK)
        if dtype == torch.bfloat16:
            direct = out is not None and plan.shape[1] == k
            dest = out.view(blocks.shape) if direct else None
            if folded is not None and not has_nan_codes(q):
                # the per-tensor FP8 bit path (numerics/fp8_widen.py) with a factor per block
                w = widen_e4m3_scaled(blocks, folded[r0:r1].unsqueeze(-1), dest)
            else:
                w = fp8_decode_scaled(blocks, scales[r0:r1].unsqueeze(-1), dtype, dest)
            if direct:
                return out
        else:
            w = fp8_decode(blocks, torch.float32).mul_(scales[r0:r1].unsqueeze(-1))
        return finish(w.view(r1 - r0, k)[:, : plan.shape[1]], dtype, out)

    def _linear_setup(self, x2, t, plan, runtime=True):
        """Emulated MXFP8 GEMM: activation quantized the same way (dynamic, per 1x32 block),
        both dequantized to F32, F32 products and bias, one rounding to the input's dtype."""
        q, e = quantize_mxfp8(x2)
        x_deq = _dequantize_f32(q, e)[: x2.shape[0], : plan.shape[1]]
        env = plan.env
        return x_deq, x2.dtype, from_blocked(t["weight_scale"].view(torch.uint8), env["N"], env["K"] // BLOCK)

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        x_deq, dtype, e_w = state
        w_deq = _dequantize_f32(t["weight"][r0:r1], e_w[r0:r1])[:, : plan.shape[1]]
        y = F.linear(x_deq, w_deq, None if bias is None else bias.to(torch.float32))
        return y.to(dtype)


def _dequantize_f32(q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    return (q.to(torch.float32).view(rows, cols // BLOCK, BLOCK) * e8m0_decode(e).unsqueeze(-1)).view(rows, cols)


CODECS = {MXFP8Codec.name: MXFP8Codec()}
