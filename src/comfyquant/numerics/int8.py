"""Dynamic INT8 quantization and the INT8 GEMM epilogue (comfy-kitchen 0.2.40
``quantize_int8_rowwise``, ``mm_int8``).

``int8_tensorwise`` and ``asym_w4a8_int8`` (without a correction) run the same contract:
quantize each activation row with its own scale, multiply exactly in integers, then scale
by ``s_row * w_scale`` in F32 and round once to the output dtype; the bias is added in the
output dtype.  The weight quantizers use the same rounding rule.
"""

from __future__ import annotations

import torch

from .rows import row_ranges


def safe_divisor(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The F32 scale rounded to ``dtype``; a scale that rounds to 0 becomes the smallest normal."""
    d = scale.to(dtype)
    return torch.where(d == 0, torch.full_like(d, torch.finfo(dtype).tiny), d)


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``clamp(round(x / T(scale)), -128, 127)`` as int8, the division done in ``x``'s dtype."""
    return int8_levels(x, safe_divisor(scale, x.dtype)).to(torch.int8)


def int8_levels(x: torch.Tensor, divisor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``clamp(round(x / divisor), -128, 127)`` in ``x``'s dtype (integral values, exact in
    any cast to int8), computed in ``out`` when given; ``divisor`` from ``safe_divisor``."""
    return torch.div(x, divisor, out=out).round_().clamp_(-128.0, 127.0)


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-row F32 scales ``max(amax_row / 127, 1e-30)``, shape ``[..., 1]``."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    return (amax.float() / 127.0).clamp_(min=1e-30)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise INT8: ``(q int8 like x, scales F32 [..., 1])``."""
    scale = row_scales(x)
    return quantize_with_scale(x, scale), scale


def row_levels_inplace(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` before the int8 cast, computed in ``x`` itself (a temporary the
    caller owns, e.g. a freshly rotated block): ``(levels in x's dtype, scales F32 [..., 1])``."""
    scale = row_scales(x)
    return int8_levels(x, safe_divisor(scale, x.dtype), out=x), scale


MATMUL_BLOCK_ELEMENTS = 1 << 20
"""Weight elements converted to F64 at a time by ``int8_matmul`` (8 MB)."""


def int8_matmul(q_x: torch.Tensor, q_w: torch.Tensor) -> torch.Tensor:
    """Exact ``q_x @ q_w.T`` as int32 (``[M, K] x [N, K] -> [M, N]``).

    Computed as an F64 GEMM: every product and partial sum is an integer far below 2^53, so
    the result is exact in any summation order, the same as an int32 accumulation -- and
    MKL's DGEMM is 4-6x faster than torch's ``_int_mm`` on CPU (measured for 16-row
    activations, the quality report's).  The weight is converted in row blocks, so the F64
    copies stay small whatever the layer."""
    m, k = q_x.shape
    n = q_w.shape[0]
    x = q_x.to(torch.float64)
    out = torch.empty((m, n), dtype=torch.int32)
    for r0, r1 in row_ranges(n, k, MATMUL_BLOCK_ELEMENTS):
        out[:, r0:r1] = x @ q_w[r0:r1].to(torch.float64).t()
    return out


def runtime_int8_matmul(q_x: torch.Tensor, q_w: torch.Tensor) -> torch.Tensor:
    """``q_x @ q_w.T`` as int32 (``[M, K] x [N, K] -> [M, N]``) by the runtime's own call:
    comfy-kitchen's CPU path pads K and N with zeros to multiples of 8 and calls
    ``torch._int_mm(q_x, q_w.T.contiguous())``.

    Not always the exact product: on CPUs without VNNI (AVX2, early AVX-512) oneDNN's int8
    kernel adds pairs of products in saturating int16 arithmetic, so large sums come out
    wrong -- and the runtime computes exactly that on such a CPU.  ``Codec.linear``, which
    promises the runtime's bits, multiplies this way; the quality report, which measures the
    checkpoint, multiplies exactly (``int8_matmul``: what GPUs and VNNI CPUs compute)."""
    m, k = q_x.shape
    n = q_w.shape[0]
    rhs = q_w.t().contiguous()
    if m == 0 or k == 0:
        return torch._int_mm(q_x, rhs)
    pad_k, pad_n = -k % 8, -n % 8
    if pad_k:
        q_x = torch.cat((q_x, q_x.new_zeros((m, pad_k))), dim=1)
        rhs = torch.cat((rhs, rhs.new_zeros((pad_k, n))), dim=0)
    if pad_n:
        rhs = torch.cat((rhs, rhs.new_zeros((k + pad_k, pad_n))), dim=1)
    out = torch._int_mm(q_x, rhs)
    return out[:, :n] if pad_n else out


def int8_linear(
    x: torch.Tensor,
    q_w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    runtime: bool = True,
) -> torch.Tensor:
    """Dynamic row-wise INT8 activations times an INT8 weight grid (already rotated ``x``),
    by default with the runtime's GEMM call (see ``int8_product``).

    ``y = out(f32(acc) * (s_row * w_scale)) + out(bias)`` with ``w_scale`` F32 of numel 1 or N."""
    lead = x.shape[:-1]
    q_x, s_x = quantize_rows(x.reshape(-1, x.shape[-1]))
    return int8_product(q_x, s_x, q_w, w_scale, bias, out_dtype, runtime).reshape(*lead, q_w.shape[0])


def int8_product(
    q_x: torch.Tensor,
    s_x: torch.Tensor,
    q_w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    runtime: bool = False,
) -> torch.Tensor:
    """The GEMM and epilogue of ``int8_linear`` for already quantized activations
    ``(q_x [M, K], s_x [M, 1])``: exact integer products (``runtime``: the runtime's own
    GEMM call, ``runtime_int8_matmul``); the epilogue is per output feature."""
    acc = runtime_int8_matmul(q_x, q_w) if runtime else int8_matmul(q_x, q_w)
    scales = s_x * w_scale.to(torch.float32).reshape(1, -1)
    y = acc.float().mul_(scales).to(out_dtype)
    if bias is not None:
        y = y + bias.to(out_dtype).reshape(1, -1)
    return y
