"""``asym_w4a8_int8``: grouped 4/6-bit codes on an INT8 grid, always ConvRot (spec 3.3).

Decoding goes through the INT8 grid ``g = clamp(round(level * s_rel), -127, 127)``, then
``W_rot = g * s_channel (+ correction)`` in F32, cast to the output dtype and un-rotated in
that dtype.  For BF16 output without a correction and ConvRot blocks up to 256, every
partial sum of the un-rotation is exact in F32 (values are BF16 multiples of one power of
two spanning < 2^23 units), so the F32 product rounded once equals comfy-kitchen's BF16
product bit for bit.  Which of the two is computed is a matter of speed only: the F32 GEMM
costs a quarter of the BF16 one on CPUs without BF16 arithmetic and twice as much on CPUs
with it (AVX512-BF16: measured 11.3 vs 5.6 ms for a 303 x 13824 block), so the faster one is
measured once per process (:func:`_bf16_gemm_is_faster`).

The quantizer (:mod:`.w4a8_quant`) reproduces comfy-kitchen's choices: codebook decision,
ALS refinement, grid assignment and the 6-bit scale search.
"""

from __future__ import annotations

import torch

from ..numerics.hadamard import rotate_activation, rotate_weight
from ..numerics.int8 import int8_product, quantize_rows
from ..numerics.packing import lookup_pairs, pair_table, unpack_6bit
from ..numerics.rows import row_ranges
from .base import DEFAULT_BLOCK_ELEMENTS, Codec, finish, rows_of
from .w4a8_quant import encode_w4a8

_EXACT_MAX_BLOCK = 256


class W4A8Codec(Codec):
    name = "asym_w4a8_int8"

    def _encode(self, weight, params, name, amax):
        return encode_w4a8(weight, params, name, self.name)

    def _prepare(self, t, env, dtype):
        if env["bits"] == 6:
            return None
        book = t.get("weight_codebook")
        levels = book.to(torch.float32) if book is not None else torch.arange(16, dtype=torch.float32) - 8.0
        return pair_table(levels)

    def _grid(self, t, env, r0: int, r1: int, table) -> torch.Tensor:
        """The INT8 grid values (as F32) of rows ``r0:r1``."""
        k, g = env["K"], env["group_size"]
        packed = rows_of(t["weight"], r0, r1)
        rows = packed.shape[0]
        if env["bits"] == 6:
            v = unpack_6bit(packed, k).to(torch.float32).sub_(32.0)
        else:
            if table is None:
                table = self._prepare(t, env, None)
            v = lookup_pairs(packed, table)
        s_rel = rows_of(_s_rel(t), r0, r1).to(torch.float32)
        v = v.view(rows, k // g, g).mul_(s_rel.unsqueeze(-1))
        return v.round_().clamp_(-127.0, 127.0).view(rows, k)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        env = plan.env
        k, g, size = env["K"], env["group_size"], env["convrot_groupsize"]
        grid = self._grid(t, env, r0, r1, state)
        rows = grid.shape[0]
        w = grid.view(rows, k // g, g).mul_(rows_of(t["weight_s_channel"], r0, r1).to(torch.float32).view(rows, 1, 1))
        corr = t.get("weight_correction")
        if corr is not None:
            w.add_(corr[:, r0:r1].t().unsqueeze(-1).to(torch.float32))
        w = w.view(rows, k).to(dtype)
        if dtype == torch.bfloat16 and corr is None and size <= _EXACT_MAX_BLOCK and not _bf16_gemm_is_faster():
            return finish(rotate_weight(w.to(torch.float32), size), dtype, out)  # same bits, see the module doc
        return finish(rotate_weight(w, size), dtype, out)

    def _linear_setup(self, x2, t, plan):
        if "weight_correction" in t:
            return x2  # comfy-kitchen runs the asymmetric variant as dequantize + float matmul
        return quantize_rows(rotate_activation(x2, plan.env["convrot_groupsize"])), x2.dtype

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        if "weight_correction" in t:
            return self._dense_linear(state, t, plan, bias, r0, r1)
        (q_x, s_x), dtype = state
        env = plan.env
        # The INT8 grid is built in row blocks: one F32 temporary per block, not per layer.
        table = self._prepare(t, env, None)
        grid = torch.empty((r1 - r0, env["K"]), dtype=torch.int8)
        for b0, b1 in row_ranges(r1 - r0, env["K"], DEFAULT_BLOCK_ELEMENTS):
            grid[b0:b1] = self._grid(t, env, r0 + b0, r0 + b1, table).to(torch.int8)
        return int8_product(q_x, s_x, grid, rows_of(t["weight_s_channel"], r0, r1), bias, dtype)


_BF16_FASTER: bool | None = None


def _bf16_gemm_is_faster() -> bool:
    """Whether this CPU runs the BF16 un-rotation GEMM faster than the F32 one (timed once per
    process on a 64 x 4096 block, best of three each: ~3 ms).  Both give the same bits in the
    exact case, so the answer changes speed only."""
    global _BF16_FASTER
    if _BF16_FASTER is None:
        import time

        x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        best = {}
        for dtype in (torch.float32, torch.bfloat16) * 3:
            v = x.to(dtype)
            t = time.perf_counter()
            rotate_weight(v, _EXACT_MAX_BLOCK)
            best[dtype] = min(best.get(dtype, float("inf")), time.perf_counter() - t)
        _BF16_FASTER = best[torch.bfloat16] < best[torch.float32]
    return _BF16_FASTER


def _s_rel(t: dict) -> torch.Tensor:
    s = t["weight_s_rel"]
    return s.view(torch.float8_e4m3fn) if s.dtype == torch.uint8 else s


CODECS = {W4A8Codec.name: W4A8Codec()}
