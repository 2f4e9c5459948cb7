"""``asym_w4a8_int8``: grouped 4/6-bit codes on an INT8 grid, always ConvRot (comfy-kitchen
0.2.40 ``AsymW4A8Int8Layout``).

Decoding goes through the INT8 grid ``g = clamp(round(level * s_rel), -127, 127)``, then
``W_rot = g * s_channel (+ correction)`` in F32, cast to the output dtype and un-rotated in
that dtype -- comfy-kitchen's one GEMM over the whole layer (``[N, G, C] @ H.T``, ``M = N*G``).

Where that GEMM's rounding may depend on its row count, the layer is decoded whole with
exactly those operands (``W4A8Codec._whole_layer``): with a correction, for F16 and F32
output, and for ConvRot blocks over 256.  Otherwise -- BF16 output, no correction, ``C <= 256``
-- row blocks are un-rotated in F32 and the result is provably the same whatever the blocks,
the BLAS kernel or the thread count:

* every ``W_rot`` value is ``bf16(f32(g * s))`` with an integer ``1 <= |g| <= 127`` (or 0) and
  one F32 ``s`` per row; with ``s`` in the binade ``[2^e, 2^(e+1))`` each nonzero value lies in
  ``[2^e, 2^(e+8))`` and, having 8 significant bits, is a multiple of ``2^(e-7)``: an integer
  number of units ``u = 2^(e-7)`` below ``2^15`` in magnitude;
* every row scale lies in ``[2^-100, 2^100)`` (else the layer decodes whole): no sum below can
  overflow, and no nonzero value, product or partial sum (all at least ``2^(e-11)``) is
  subnormal -- which matters, because BF16 GEMMs (AMX, AVX512-BF16) flush subnormals to zero
  where F32 GEMMs keep them;
* ``H`` entries are ``+-2^-d`` (``C = 4^d``, ``d <= 4``), so every product is an integer number
  of units ``u * 2^-d``, below 2^15, and every partial sum of at most ``C <= 256`` of them is an
  integer below ``2^23`` of those units: representable in F32 (24 bits), so exact in any order,
  with or without FMA (which rounds ``a*b + c`` once: exactly);
* hence the F32 GEMM over any rows gives the exact product, and its rounding to BF16 is the
  correctly rounded exact product.  comfy-kitchen's BF16 GEMM gives that too: CPU BF16 GEMMs
  (oneDNN with AVX512-BF16 or AMX, MKL, torch's own AVX2 fallback) multiply into F32
  accumulators and round once at the end, and with exact partial sums their order cannot
  matter.  ``tests/test_numerics.py`` checks the exactness on adversarial values (largest
  integer grid, scale binade edges, subnormal scales) and the equality with comfy-kitchen at
  1 and 2 threads with tails under 16 rows.

(For F16, 11 significant bits give units below 2^18 and sums of 256 below 2^26: not exact;
hence decoded whole.  An earlier version chose between the F32 and a blocked BF16 GEMM by
timing them; the choice is gone, no result depends on a measurement.)

The quantizer (``encoder``) reproduces comfy-kitchen's choices: codebook decision,
ALS refinement, grid assignment and the 6-bit scale search.
"""

from __future__ import annotations

import torch

from ...numerics.assemble import assemble_rows
from ...numerics.hadamard import rotate_activation, rotate_weight, unrotate
from ...numerics.int8 import int8_product, quantize_rows
from ...numerics.packing import lookup_pairs, pair_table, unpack_6bit
from ...numerics.rows import row_ranges
from ..codec import DEFAULT_BLOCK_ELEMENTS, Codec, finish, rows_of
from .encoder import encode_w4a8

_EXACT_MAX_BLOCK = 256
_EXACT_MAX_SCALE = 2.0**100
"""Row scales from here on could make a partial sum of the un-rotation overflow F32 (values
below ``2^(e+8)``, sums of up to 256 times ``2^-4`` of them below ``2^(e+12)``), where the
order would decide between a finite result and infinity: such layers decode whole."""
_EXACT_MIN_SCALE = 2.0**-100
"""Row scales below this could make a value, product or partial sum subnormal (every nonzero
one is at least ``2^(e-11)``), and BF16 GEMMs flush subnormals (AMX and AVX512-BF16 dot
products run with DAZ/FTZ: measured on AMX) while F32 GEMMs keep them: such layers (and a
zero or NaN scale) decode whole."""


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

    def _whole_layer(self, env, dtype, tensors):
        """Everything but the exact case of the module doc, which also needs every row scale
        in ``[_EXACT_MIN_SCALE, _EXACT_MAX_SCALE)``: no partial sum can overflow or be
        subnormal (a zero, infinite or NaN scale is outside)."""
        if dtype != torch.bfloat16 or "weight_correction" in tensors or env["convrot_groupsize"] > _EXACT_MAX_BLOCK:
            return True
        s = tensors["weight_s_channel"]
        if s.numel() == 0:
            return False
        lo, hi = torch.aminmax(s.float().abs())
        return not (bool(lo >= _EXACT_MIN_SCALE) and bool(hi < _EXACT_MAX_SCALE))

    def _rotated(self, t, env, r0: int, r1: int, table, dtype: torch.dtype, grid: torch.Tensor | None = None) -> torch.Tensor:
        """``W_rot`` of rows ``r0:r1`` in ``dtype``: the grid times ``s_channel`` (plus the
        correction) in F32, then rounded to ``dtype`` -- comfy-kitchen's operand.  ``grid``:
        the rows' grid already built (it is scaled in place)."""
        k, g = env["K"], env["group_size"]
        if grid is None:
            grid = self._grid(t, env, r0, r1, table)
        rows = grid.shape[0]
        w = grid.view(rows, k // g, g).mul_(rows_of(t["weight_s_channel"], r0, r1).to(torch.float32).view(rows, 1, 1))
        corr = t.get("weight_correction")
        if corr is not None:
            w.add_(corr[:, r0:r1].t().unsqueeze(-1).to(torch.float32))
        return w.view(rows, k).to(dtype)

    def _decode_whole(self, t, plan, dtype, state, out):
        env = plan.env
        # the GEMM operand (W_rot in ``dtype``) is row-wise arithmetic: filled in row blocks, no F32 layer
        operand = lambda: assemble_rows(plan.shape, dtype, lambda r0, r1: self._rotated(t, env, r0, r1, state, dtype))  # noqa: E731
        return unrotate(operand, env["convrot_groupsize"], dtype, out)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out, grid=None):
        size = plan.env["convrot_groupsize"]
        if self._whole_layer(plan.env, dtype, t):  # only with exact=False (see Codec.iter_decode)
            return finish(rotate_weight(self._rotated(t, plan.env, r0, r1, state, dtype, grid), size), dtype, out)
        # The exact case (BF16, no correction, C <= 256, moderate scales): see the module doc.
        w = self._rotated(t, plan.env, r0, r1, state, torch.bfloat16, grid).to(torch.float32)
        return finish(rotate_weight(w, size), dtype, out)

    def _measure_rows(self, t, plan, dtype, r0, r1, state, out, forward):
        """The grid of the rows is built once, for the INT8 forward and then the decode."""
        dense, fstate = forward
        if dense:
            return super()._measure_rows(t, plan, dtype, r0, r1, state, out, forward)
        grid = self._grid(t, plan.env, r0, r1, state)
        y = self._grid_product(fstate, t, grid.to(torch.int8), None, r0, r1)
        return self._decode_rows(t, plan, dtype, r0, r1, state, out, grid), y

    def _runs_dense(self, t):
        return "weight_correction" in t  # comfy-kitchen: dequantize + float matmul

    def _linear_setup(self, x2, t, plan, runtime=True):
        return quantize_rows(rotate_activation(x2, plan.env["convrot_groupsize"])), x2.dtype, runtime

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        env = plan.env
        # The INT8 grid is built in row blocks: one F32 temporary per block, not per layer.
        table = self._prepare(t, env, None)
        grid = torch.empty((r1 - r0, env["K"]), dtype=torch.int8)
        for b0, b1 in row_ranges(r1 - r0, env["K"], DEFAULT_BLOCK_ELEMENTS):
            grid[b0:b1] = self._grid(t, env, r0 + b0, r0 + b1, table).to(torch.int8)
        return self._grid_product(state, t, grid, bias, r0, r1)

    @staticmethod
    def _grid_product(state, t, grid: torch.Tensor, bias, r0: int, r1: int) -> torch.Tensor:
        """Output features ``r0:r1`` from their INT8 grid: the integer GEMM (the runtime's call,
        or exact products for the quality report: see ``_linear_setup``; the same bits for any
        subset of rows) and epilogue."""
        (q_x, s_x), dtype, runtime = state
        return int8_product(q_x, s_x, grid, rows_of(t["weight_s_channel"], r0, r1), bias, dtype, runtime)


def _s_rel(t: dict) -> torch.Tensor:
    s = t["weight_s_rel"]
    return s.view(torch.float8_e4m3fn) if s.dtype == torch.uint8 else s


CODECS = {W4A8Codec.name: W4A8Codec()}
