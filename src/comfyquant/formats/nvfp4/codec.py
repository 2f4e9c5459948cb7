"""``nvfp4``: E2M1 codes, FP8 scales per 1x16 block (blocked layout), an F32 tensor scale
(comfy-kitchen 0.2.40 ``TensorCoreNVFP4Layout``).

Storage is padded to 16x16; the dense weight is sliced to the model's ``[N, K]`` (read from
the bias and ``pre_quant_scale`` when present).  A ``pre_quant_scale`` multiplies the
activation before quantization, so the dense equivalent weight is ``W * pre_quant_scale``
per column; ``NVFP4Codec.decode`` returns that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from ...numerics.blocked import ceil_to, from_blocked, padded_blocks, to_blocked
from ...numerics.floats import E2M1_MAX, E4M3, FP8_MAX, e2m1_encode, e2m1_table
from ...numerics.packing import HNF, lookup_pairs, pack_nibbles, pair_table
from ...numerics.rows import gather_rows, row_blocks
from ..codec import Codec, reject_unknown

BLOCK = 16
TENSOR_SCALE_DIVISOR = FP8_MAX[E4M3] * E2M1_MAX
"""448 * 6: the per-tensor scale maps the largest value to the largest product of both."""


def quantize_nvfp4(x: torch.Tensor, tensor_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to 16x16, then per 1x16 block: FP8 block scale relative to ``tensor_scale``, E2M1 codes.

    Returns (codes uint8 ``[Np, Kp]``, block scales F8_E4M3 ``[Np, Kp/16]``)."""
    blocks, rp, cp = padded_blocks(x, BLOCK)
    ratio = (torch.amax(blocks.abs(), dim=-1).to(torch.float32) / E2M1_MAX) / tensor_scale
    scales = ratio.clamp(max=FP8_MAX[E4M3]).to(E4M3)
    total = tensor_scale * scales.to(torch.float32)
    empty = total == 0
    if bool(empty.any()):  # blocks whose scale is 0 encode as zeros (the reference's division by 1)
        data = blocks.float() / torch.where(empty, torch.ones_like(total), total).unsqueeze(-1)
        data = torch.where(empty.unsqueeze(-1), torch.zeros_like(data), data)
    else:
        data = blocks.float() / total.unsqueeze(-1)
    data = data.clamp_(-E2M1_MAX, E2M1_MAX)
    return e2m1_encode(data.view(rp, cp)), scales


def dequantize_f32(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Codes and logical block scales -> F32 values (used by the emulated GEMM)."""
    return _scaled(e2m1_table(torch.float32)[codes.long()], scales, tensor_scale)


def dequantize_packed_f32(packed: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Packed weight bytes (high nibble first) and logical block scales -> F32 values: the same
    numbers as ``dequantize_f32`` of the unpacked codes, decoded a byte (two values) per
    gather instead of unpacking and indexing every code with a 64-bit index."""
    return _scaled(lookup_pairs(packed, pair_table(e2m1_table(torch.float32), HNF)), scales, tensor_scale)


def _scaled(vals: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    rows, cols = vals.shape
    total = tensor_scale.to(torch.float32) * scales.to(torch.float32)
    return (vals.view(rows, cols // BLOCK, BLOCK) * total.unsqueeze(-1)).view(rows, cols)


class NVFP4Codec(Codec):
    name = "nvfp4"

    def dense_shape(self, env, marker):
        return env.get("N_model", env["N"]), env.get("K_model", env["K"])

    def _encode(self, weight, params, name, amax):
        scale = params.pop("scale", None)
        input_scale = params.pop("input_scale", None)
        pre = params.pop("pre_quant_scale", None)
        reject_unknown(params, name)
        stored = _identity
        if pre is not None:
            pre = torch.as_tensor(pre)
            pre = pre.to(weight.dtype) if not pre.is_floating_point() else pre
            stored = _divide_columns(pre, weight.dtype)
        if scale is None:
            scale = (amax if pre is None else _amax(weight, stored)) / TENSOR_SCALE_DIVISOR
        ts = torch.as_tensor(scale).to(torch.float32).reshape(())
        rp, cp = ceil_to(weight.shape[0], BLOCK), ceil_to(weight.shape[1], BLOCK)
        if ts.item() == 0:
            # All-zero weight: comfy-kitchen divides 0 by 0 and stores NaN scales.
            packed = torch.zeros((rp, cp // 2), dtype=torch.uint8)
            scales = torch.zeros((rp, cp // BLOCK), dtype=E4M3)
        else:
            packed, scales = gather_rows(row_blocks(weight, multiple=BLOCK), lambda w: _encode_block(stored(w), ts), rp)
        tensors = {"weight": packed, "weight_scale": to_blocked(scales), "weight_scale_2": ts}
        if input_scale is not None:
            tensors["input_scale"] = torch.as_tensor(input_scale).to(torch.float32).reshape(())
        if pre is not None:
            tensors["pre_quant_scale"] = pre.reshape(-1).contiguous()
        return tensors, {"format": self.name}

    def _prepare(self, t, env, dtype):
        rows, cols = env["N"], env["K"] // BLOCK
        blocked = t["weight_scale"]
        blocked = blocked.view(E4M3) if blocked.dtype == torch.uint8 else blocked
        total = t["weight_scale_2"].reshape(()).to(dtype) * from_blocked(blocked, rows, cols).to(dtype)
        pre = t.get("pre_quant_scale")
        return total, pair_table(e2m1_table(dtype), HNF), None if pre is None else pre.to(dtype)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        env = plan.env
        total, table, pre = state
        kp = env["K"]
        vals = lookup_pairs(t["weight"][r0:r1], table).view(r1 - r0, kp // BLOCK, BLOCK)
        w = vals.mul_(total[r0:r1].unsqueeze(-1)).view(r1 - r0, kp)[:, : plan.shape[1]]
        if pre is not None:
            w = w * pre.reshape(1, -1)
        return w if out is None else out.copy_(w)

    def _linear_setup(self, x2, t, plan, runtime=True):
        """Emulated NVFP4 GEMM: activation quantized like the weight (scale ``input_scale`` or
        dynamic ``amax / 2688``), both dequantized to F32, F32 products and bias, one rounding."""
        env = plan.env
        dtype = x2.dtype
        pre = t.get("pre_quant_scale")
        if pre is not None:
            x2 = x2 * pre.to(dtype)
        s_in = t.get("input_scale")
        s_in = (torch.amax(x2.abs()) / TENSOR_SCALE_DIVISOR) if s_in is None else s_in
        s_in = s_in.to(torch.float32).reshape(())
        codes, scales = quantize_nvfp4(x2, s_in)
        x_deq = dequantize_f32(codes, scales, s_in)[: x2.shape[0], : plan.shape[1]]
        blocked = t["weight_scale"]
        blocked = blocked.view(E4M3) if blocked.dtype == torch.uint8 else blocked
        return x_deq, dtype, from_blocked(blocked, env["N"], env["K"] // BLOCK)

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        x_deq, dtype, scales = state
        w_deq = dequantize_packed_f32(t["weight"][r0:r1], scales[r0:r1], t["weight_scale_2"].reshape(()))[:, : plan.shape[1]]
        y = F.linear(x_deq, w_deq, None if bias is None else bias.to(torch.float32))
        return y.to(dtype)


def _identity(w: torch.Tensor) -> torch.Tensor:
    return w


def _divide_columns(pre: torch.Tensor, dtype: torch.dtype):
    """The stored rows for a ``pre_quant_scale``: the runtime multiplies x by it, so the
    weight is ``W / s`` per column, computed in F32 and rounded to the weight's dtype."""
    divisor = pre.float().reshape(1, -1)
    return lambda w: (w.float() / divisor).to(dtype)


def _amax(weight: torch.Tensor, stored) -> torch.Tensor:
    """``max |stored(weight)|`` in the weight's dtype, one row block at a time."""
    return torch.stack([torch.amax(stored(w).abs()) for _r0, _r1, w in row_blocks(weight)]).amax()


def _encode_block(w: torch.Tensor, tensor_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed codes and logical block scales of a row block (padded like the whole tensor)."""
    codes, scales = quantize_nvfp4(w, tensor_scale)
    return pack_nibbles(codes, HNF), scales


CODECS = {NVFP4Codec.name: NVFP4Codec()}
