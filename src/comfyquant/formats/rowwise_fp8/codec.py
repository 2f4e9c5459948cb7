"""SGLang's rowwise FP8: ``W = q * weight_scale[:, None]`` with one F32 scale per output row
(SGLang 0.5.23 ``weight_only_fp8.dequantize_rowwise_fp8_weight``).

Encoding takes each row's absolute maximum over the E4M3 maximum (448) as its scale, in F32, and
rounds ``w / scale`` to E4M3 with saturation; a zero row gets scale 1 (its codes are zero). The
forward dequantizes the weight and runs a dense product: SGLang's FP8 GEMM quantizes activations
per token, which the reference forward does not reproduce."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from ...numerics.floats import E4M3, FP8_MAX
from ...numerics.rows import as_source, row_blocks
from ..codec import Codec, finish, per_row, reject_unknown, rows_of
from . import ROWWISE_FP8


class RowwiseFP8Codec(Codec):
    name = ROWWISE_FP8

    def _encode(self, weight, params: dict, name: str, amax: torch.Tensor | None) -> tuple[dict, dict]:
        input_scale = params.pop("input_scale", None)
        reject_unknown(params, name)
        lim = FP8_MAX[E4M3]
        n, k = as_source(weight).shape
        q = torch.empty((n, k), dtype=E4M3)
        scale = torch.ones(n, dtype=torch.float32)
        for r0, r1, rows in row_blocks(weight):
            w = rows.to(torch.float32)
            s = w.abs().amax(dim=1) / lim if k else torch.zeros(r1 - r0)
            s = torch.where(s > 0, s, torch.ones_like(s))
            scale[r0:r1] = s
            q[r0:r1] = (w / s[:, None]).clamp_(-lim, lim).to(E4M3)
        tensors = {"weight": q, "weight_scale": scale}
        if input_scale is not None:
            tensors["input_scale"] = torch.as_tensor(input_scale).to(torch.float32).reshape(1)
        return tensors, {"format": self.name}

    def _prepare(self, t, env, dtype):
        return None

    def _decode_rows(self, t, plan, dtype, r0, r1, state, out):
        q = rows_of(t["weight"], r0, r1).to(torch.float32)
        s = per_row(t["weight_scale"].to(torch.float32).reshape(-1), plan.env["N"], r0, r1)
        return finish(q * s[:, None], dtype, out)

    def _linear_setup(self, x2, t, plan, runtime=True):
        return x2

    def _linear_rows(self, state, t, plan, bias, r0, r1):
        x2 = state
        q = rows_of(t["weight"], r0, r1).to(torch.float32)
        s = per_row(t["weight_scale"].to(torch.float32).reshape(-1), plan.env["N"], r0, r1)
        w = (q * s[:, None]).to(x2.dtype)
        return F.linear(x2, w, None if bias is None else bias.to(x2.dtype))


CODECS = {c.name: c for c in (RowwiseFP8Codec(),)}
