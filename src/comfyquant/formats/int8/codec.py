"""``int8_tensorwise``: INT8 weights with a scalar, row-wise or ConvRot row-wise scale
(comfy-kitchen 0.2.40 ``TensorWiseINT8Layout``)."""

from __future__ import annotations

import torch

from ...numerics import rows
from ...numerics.assemble import fill_rows
from ...numerics.hadamard import rotate_activation, rotate_weight, unrotate
from ...numerics.int8 import int8_levels, int8_product, quantize_rows, row_levels_inplace, safe_divisor
from ...numerics.rows import Weight, cast_rows, gather_rows, materialize, row_blocks
from ..codec import Codec, CodecError, check_convrot, finish, per_row, refuse_nonfinite, reject_unknown, rows_of


class Int8Codec(Codec):
    """Dequantize ``float32(q) * scale`` (then un-rotate in F32); run dynamic row-wise INT8."""

    name = "int8_tensorwise"

    def _checks_finite(self, params):
        # row-wise scales (row-wise or ConvRot) reveal NaN/Inf; the scalar scale needs max|w|
        return _row_scaled(params.get("per_channel"), params.get("convrot", False))

    def _encode(self, weight, params, name, amax):
        convrot = bool(params.pop("convrot", False))
        per_channel = _row_scaled(params.pop("per_channel", None), convrot)
        if not convrot and "convrot_groupsize" in params:
            raise CodecError(
                f"{name}: convrot_groupsize={params['convrot_groupsize']!r} needs convrot=True "
                "(without rotation the size would be ignored)"
            )
        size = params.pop("convrot_groupsize", 256)
        scale = params.pop("scale", None)
        reject_unknown(params, name)
        if convrot:
            if not per_channel:
                raise CodecError(f"{name}: convrot is only supported when per_channel is True")
            check_convrot(size, weight.shape[1], name)
            # comfy-kitchen rotates the whole layer in one GEMM in the weight's dtype; over a
            # block of rows the GEMM may round differently (kernel choice by row count), so the
            # layer is rotated whole, as there.  The rows are then independent: levels and row
            # scales are computed in place in the rotated layer, block by block.
            rotated = rotate_weight(materialize(weight), size)
            q, s = _encode_rows(weight, row_levels_inplace, name, rows.rotation_encode_block_elements(), rotated)
            return {"weight": q, "weight_scale": s}, {"format": self.name, "convrot": True, "convrot_groupsize": size}
        if per_channel:
            q, s = _encode_rows(weight, lambda w: row_levels_inplace(w.clone()), name)
            return {"weight": q, "weight_scale": s}, {"format": self.name}
        if scale is not None:
            s = torch.as_tensor(scale).to(torch.float32).reshape(())
        else:
            s = (amax.float() / 127.0).clamp_(min=1e-30)
        divisor = safe_divisor(s, weight.dtype)
        q = cast_rows(weight, torch.int8, lambda w, scratch: int8_levels(w, divisor, out=scratch))
        return {"weight": q, "weight_scale": s}, {"format": self.name}

    def _whole_layer(self, env, dtype, tensors):
        # comfy-kitchen un-rotates the whole F32 layer in one GEMM; its rounding depends on
        # the row count on some CPUs (an 8-row tail differs on AVX-512), so ConvRot decodes whole.
        return env.get("convrot") is True

    def _decode_whole(self, t, plan, dtype, state, out):
        operand = lambda: fill_rows(plan.shape, torch.float32, lambda r0, r1, dest: self._dequantized(t, r0, r1, dest))  # noqa: E731
        return unrotate(operand, plan.env["convrot_groupsize"], dtype, out)

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        w = self._dequantized(t, r0, r1)
        if plan.env.get("convrot") is True:  # only with exact=False (see Codec.iter_decode)
            w = rotate_weight(w, plan.env["convrot_groupsize"])
        return finish(w, dtype, out)

    @staticmethod
    def _dequantized(t: dict, r0: int, r1: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """``float32(q) * scale`` of rows ``r0:r1`` (before any un-rotation), in ``out`` (F32)
        when given, else a new F32 tensor."""
        q = rows_of(t["weight"], r0, r1)
        scale = t["weight_scale"]
        if scale.dim() == 2:
            scale = rows_of(scale, r0, r1)
        out = torch.empty(q.shape, dtype=torch.float32) if out is None else out
        return out.copy_(q).mul_(scale.to(torch.float32))

    def _linear_setup(self, x2, t, plan, runtime=True):
        env = plan.env
        if env.get("convrot"):
            x2 = rotate_activation(x2, env["convrot_groupsize"])
        return quantize_rows(x2), x2.dtype, runtime

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        (q_x, s_x), dtype, runtime = state
        scale = per_row(t["weight_scale"], plan.shape[0], r0, r1)
        return int8_product(q_x, s_x, rows_of(t["weight"], r0, r1), scale, bias, dtype, runtime)


def _row_scaled(per_channel, convrot) -> bool:
    """Whether the weight gets row-wise scales: ``per_channel``, which defaults to ``convrot``
    (comfy-kitchen's rule)."""
    return bool(convrot if per_channel is None else per_channel)


def _encode_rows(
    weight: Weight, fn, name: str, block_elements: int | None = None, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn`` (block -> INT8 levels as floats and their row scales) over row blocks of
    ``rows`` (default: ``weight``), the levels cast to int8 as they are gathered.  A
    non-finite row scale means a NaN/Inf in the weight (see
    ``refuse_nonfinite``): the encoder skipped the separate scan
    for it."""
    source = weight if rows is None else rows
    q, s = gather_rows(row_blocks(source, block_elements), fn, weight.shape[0], dtypes=(torch.int8,))
    if not bool(torch.isfinite(s).all()):
        refuse_nonfinite(weight, name)
    return q, s


CODECS = {Int8Codec.name: Int8Codec()}
