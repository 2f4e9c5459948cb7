"""``svdquant_w4a4``: signed 4-bit residual, per-64 group scales, smoothing and a low-rank
branch (comfy-kitchen 0.2.40 ``TensorCoreSVDQuantW4A4Layout``); natural or tile-packed storage.

The effective weight is ``q * scale / smooth + proj_up @ proj_down.T``.  comfy-kitchen
computes it by running its eager kernel on an identity input, so its roundings are those of
the kernel: ``a_k = T(7 * T(|T(1 / smooth_k)| / 7))`` (signed), the main term
``T(a_k * T(q * scale))``, the low-rank term in F32 rounded to ``T``, and one more rounding
for their sum, all in the scales' dtype ``T``.  ``decode`` reproduces exactly that
arithmetic without the K x K identity.  There is no quantizer (offline calibration only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from ...numerics.packing import LNF, lookup_pairs, pack_nibbles, pair_table, to_signed, unpack_nibbles
from ...numerics.rows import row_ranges
from ..codec import DEFAULT_BLOCK_ELEMENTS, Codec, finish

GROUP = 64
INT4_MAX = 7
UINT4_MAX = 15
GELU_SHIFT = 0.171875
"""Added to post-GELU activations of ``act_unsigned`` layers (nunchaku's convention)."""
ROW_PAD = 256
"""comfy-kitchen pads activation rows to a multiple of 256 before its GEMM; the padding is
kept so the GEMM (and its summation order) is the same one."""


def natural(t: dict) -> dict:
    """The layer's tensors in the natural layout (tile-packed ones converted)."""
    w = t["weight"]
    if w.dim() != 4:
        return t
    nt, kg = w.shape[0], w.shape[1]
    out = dict(t)
    out["weight"] = w.view(nt, kg, 32, 4, GROUP // 2).permute(0, 2, 3, 1, 4).reshape(nt * 128, kg * GROUP // 2)
    s = t["weight_scale"]
    out["weight_scale"] = s.permute(1, 0, 2).reshape(s.shape[1], s.shape[0] * 128)
    up = t["weight_proj_up"]
    out["weight_proj_up"] = up.permute(0, 2, 1).reshape(up.shape[0] * 128, up.shape[1])
    return out


class SVDQuantCodec(Codec):
    name = "svdquant_w4a4"
    can_encode = False
    model_dtype_scales = True

    def _prepare(self, t, env, dtype):
        t = natural(t)
        compute = t["weight_scale"].dtype
        smooth = t["weight_smooth_factor"]
        inv = torch.div(torch.ones(smooth.shape, dtype=compute), smooth)
        step = inv.abs().clamp(min=1e-10) / INT4_MAX
        q = torch.div(inv, step).round().clamp(-INT4_MAX, INT4_MAX)
        act = q.to(compute) * step  # the identity row's dequantized activation, per k
        return t, act

    def _whole_layer(self, env, dtype, tensors):
        return True  # the low-rank term is one F32 GEMM over the whole layer (see _decode_whole)

    def _decode_whole(self, t, plan, dtype, state, out):
        """The main term row block by row block (elementwise, see ``_main_rows``) plus the
        low-rank term, which comfy-kitchen computes as one F32 GEMM
        ``lora_act [Kp, R] @ proj_up.T`` with ``lora_act`` the identity's down-projection,
        padded to ``Kp`` (a multiple of 256) rows: made here on the same operands, since a
        GEMM over a block of output features may round differently.  ``lora_act`` itself is
        ``proj_down`` in F32: each of its entries is one product ``1 * d`` plus products with
        the identity's zeros, exact in any order (only a ``-0.0`` may come out ``+0.0``, as
        from an accumulator started at zero, which is what is used here)."""
        t, act = state
        n, k = plan.shape
        compute = t["weight_scale"].dtype
        down = t["weight_proj_down"].float() + 0.0
        lora = F.pad(down, (0, 0, 0, -(-k // ROW_PAD) * ROW_PAD - k))
        low = lora @ t["weight_proj_up"].float().t()  # [Kp, N], comfy-kitchen's GEMM
        del lora, down
        out = torch.empty((n, k), dtype=dtype) if out is None else out
        for r0, r1 in row_ranges(n, k, DEFAULT_BLOCK_ELEMENTS):
            finish(self._main_rows(t, act, k, r0, r1) + low[:k, r0:r1].t().to(compute), dtype, out[r0:r1])
        return out

    @staticmethod
    def _main_rows(t, act, k: int, r0: int, r1: int) -> torch.Tensor:
        """``T(a_k * T(q * scale))`` of rows ``r0:r1``: comfy-kitchen's identity-input GEMM,
        whose every output is one product plus products with zeros -- exact in any order and
        any accumulator, so computed elementwise."""
        compute = t["weight_scale"].dtype
        table = pair_table(torch.tensor([float(v if v < 8 else v - 16) for v in range(16)]).to(compute))
        w = lookup_pairs(t["weight"][r0:r1], table).view(r1 - r0, k // GROUP, GROUP)
        w = w.mul_(t["weight_scale"][:, r0:r1].t().unsqueeze(-1)).view(r1 - r0, k)
        return (w.to(torch.float32) * act.to(torch.float32)).to(compute)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):  # only with exact=False (Codec.iter_decode)
        t, act = state
        k = plan.env["K"]
        low = (t["weight_proj_down"].float() @ t["weight_proj_up"][r0:r1].float().t()).t()
        return finish(self._main_rows(t, act, k, r0, r1) + low.to(t["weight_scale"].dtype), dtype, out)

    def _linear_setup(self, x2, t, plan, runtime=True):
        """comfy-kitchen's eager forward: smoothed per-row per-64 INT4 (or UINT4) activations,
        dequantized GEMM in the scales' dtype, low-rank branch in F32 on the raw input."""
        t = natural(t)
        unsigned = bool(plan.env.get("act_unsigned"))
        k = plan.shape[1]
        m = x2.shape[0]
        main_x = x2 + GELU_SHIFT if unsigned else x2
        low_act = x2.float() @ t["weight_proj_down"].float()
        smoothed = main_x / t["weight_smooth_factor"]
        groups = smoothed.view(m, k // GROUP, GROUP)
        qmax, qmin = (UINT4_MAX, 0) if unsigned else (INT4_MAX, -INT4_MAX)
        scales = groups.abs().amax(dim=-1).clamp(min=1e-10) / qmax
        q = (groups / scales.unsqueeze(-1)).round().clamp(qmin, qmax).to(torch.int8).reshape(m, k)
        packed = pack_nibbles(q, LNF)
        mp = -(-m // ROW_PAD) * ROW_PAD
        if mp > m:
            packed = F.pad(packed, (0, 0, 0, mp - m))
            scales = F.pad(scales, (0, 0, 0, mp - m))
            low_act = F.pad(low_act, (0, 0, 0, mp - m))
        a_scales = scales.t().contiguous().to(x2.dtype)
        compute = t["weight_scale"].dtype
        codes = unpack_nibbles(packed, LNF)
        act = (codes if unsigned else to_signed(codes)).to(compute).view(mp, k // GROUP, GROUP)
        act = (act * a_scales.t().unsqueeze(-1)).view(mp, k)
        return t, act, low_act, m, x2.dtype

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        t, act, low_act, m, dtype = state
        compute = t["weight_scale"].dtype
        k = plan.shape[1]
        w = to_signed(unpack_nibbles(t["weight"][r0:r1], LNF)).to(compute).view(r1 - r0, k // GROUP, GROUP)
        w = (w * t["weight_scale"][:, r0:r1].t().unsqueeze(-1)).view(r1 - r0, k)
        y = act @ w.t()
        y = y + (low_act.float() @ t["weight_proj_up"][r0:r1].float().t()).to(y.dtype)
        if bias is not None:
            y = y + bias
        return y[:m].to(dtype)


CODECS = {SVDQuantCodec.name: SVDQuantCodec()}
