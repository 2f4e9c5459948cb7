"""``convrot_w4a4``: signed 4-bit weights with per-row F32 scales, INT4 activations
(comfy-kitchen 0.2.40 ``TensorCoreConvRotW4A4Layout``)."""

from __future__ import annotations

import torch

from ...numerics.assemble import fill_rows
from ...numerics.hadamard import rotate_activation, rotate_weight, unrotate
from ...numerics.int8 import int8_matmul
from ...numerics.packing import lookup_pairs, pack_nibbles, pair_table, to_signed, unpack_nibbles
from ...numerics.rows import gather_rows, materialize, row_blocks
from ..codec import Codec, CodecError, check_convrot, finish, reject_unknown, rows_of

INT4_MAX = 7
QUANT_GROUP = 64
"""comfy-kitchen's fixed ``quant_group_size``: only a divisibility rule, scales are per row."""

_EXACT_MAX_K = (1 << 24) // 49
"""Below this K every partial sum of INT4 x INT4 products is an integer exact in F32."""

_SIGNED = pair_table(torch.tensor([float(v if v < 8 else v - 16) for v in range(16)]))


def quantize_int4_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed INT4 per row: ``s = max(amax, 1e-10) / 7`` and the division in ``x``'s dtype.

    Returns (int8 codes in [-7, 7], scales in ``x``'s dtype, shape ``[rows, 1]``)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / INT4_MAX
    q = torch.div(x, scale).round_().clamp_(-INT4_MAX, INT4_MAX).to(torch.int8)
    return q, scale


class W4A4Codec(Codec):
    name = "convrot_w4a4"

    def _encode(self, weight, params, name, amax):
        size = params.pop("convrot_groupsize", 256)
        linear_dtype = params.pop("linear_dtype", "int4")
        reject_unknown(params, name)
        if linear_dtype not in ("int4", "int8"):
            raise CodecError(f"{name}: ConvRot W4A4 linear_dtype must be 'int4' or 'int8', got {linear_dtype!r}")
        k = weight.shape[1]
        check_convrot(size, k, name)
        if k % QUANT_GROUP:
            raise CodecError(f"{name}: in_features {k} not divisible by quant_group_size {QUANT_GROUP}")
        marker = {"format": self.name, "convrot_groupsize": size}
        if linear_dtype != "int4":
            marker["linear_dtype"] = linear_dtype
        # comfy-kitchen rotates the whole layer in one GEMM in the weight's dtype (a block of
        # rows may round differently); the quantization after it is per row, so it is blocked.
        rotated = rotate_weight(materialize(weight), size)
        packed, scale = gather_rows(row_blocks(rotated), _encode_block, weight.shape[0])
        return {"weight": packed, "weight_scale": scale}, marker

    def _whole_layer(self, env, dtype, tensors):
        return True  # comfy-kitchen un-rotates the whole F32 layer in one GEMM (see base)

    def _decode_whole(self, t, plan, dtype, state, out):
        operand = lambda: fill_rows(plan.shape, torch.float32, lambda r0, r1, dest: self._dequantized(t, r0, r1, dest))  # noqa: E731
        return unrotate(operand, plan.env["convrot_groupsize"], dtype, out)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):  # only with exact=False (Codec.iter_decode)
        return finish(rotate_weight(self._dequantized(t, r0, r1), plan.env["convrot_groupsize"]), dtype, out)

    @staticmethod
    def _dequantized(t: dict, r0: int, r1: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Signed codes times the row scales in F32 (still rotated), in ``out`` when given,
        else a new tensor."""
        w = lookup_pairs(rows_of(t["weight"], r0, r1), _SIGNED, out)
        return w.mul_(rows_of(t["weight_scale"], r0, r1).to(torch.float32).reshape(-1, 1))

    def _linear_setup(self, x2, t, plan, runtime=True):
        x2 = rotate_activation(x2.contiguous(), plan.env["convrot_groupsize"])
        return quantize_int4_rows(x2), x2.dtype

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        # comfy-kitchen eager: INT4 activations whatever linear_dtype says, multiplied as
        # integers in a BF16/F16 GEMM.  Every product (|.| <= 49) and partial sum (< 49 * K <
        # 2^24 for K below 342k) is an integer exact in F32, and torch's CPU BF16/F16 GEMMs
        # accumulate in F32 and round once to the output (torch's
        # allow_fp16_reduced_precision_reduction is off by default), so the exact int32
        # result rounded once is the same bits, in any blocking.  Beyond that K the GEMM is
        # comfy-kitchen's own call.
        (q_x, s_x), dtype = state
        q_w = to_signed(unpack_nibbles(rows_of(t["weight"], r0, r1)))
        if q_x.shape[1] >= _EXACT_MAX_K:
            y = q_x.to(dtype) @ q_w.to(dtype).t()
        else:
            y = int8_matmul(q_x, q_w).to(dtype)
        y = y * s_x.to(torch.float32).to(dtype)
        y = y * rows_of(t["weight_scale"], r0, r1).reshape(1, -1).to(dtype)
        if bias is not None:
            y = y + bias.to(dtype).reshape(1, -1)
        return y


def _encode_block(rotated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Already rotated rows, quantized and packed, with their F32 scales."""
    q, scale = quantize_int4_rows(rotated)
    return pack_nibbles(q).view(torch.int8), scale.reshape(-1).to(torch.float32)


CODECS = {W4A4Codec.name: W4A4Codec()}
