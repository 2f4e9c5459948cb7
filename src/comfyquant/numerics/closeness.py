"""How close a decoded weight is to the original: the sums behind relative L2 error and cosine
similarity, accumulated over row blocks so no command holds a dense layer twice.  ``quantize``'s
quality report and ``fix --reference`` measure with the same arithmetic."""

from __future__ import annotations

import torch


def error_sums(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[sum (d - w)^2, sum w^2, sum d*w, sum d^2]`` of two F32 matrices, in F64.

    Row by row F32 dot products, added up in F64: a ``sum(dtype=float64)`` would first copy
    its whole input to F64."""
    e = d - w
    return torch.stack([_dot(e, e), _dot(w, w), _dot(d, w), _dot(d, d)])


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # A product and a row sum (vectorized, one temporary of the block): twice as fast as one
    # batched [1, K] x [K, 1] GEMM per row, which is most of quantize's measurement time.
    rows = a.shape[0]
    return (a.reshape(rows, -1) * b.reshape(rows, -1)).sum(-1).sum(dtype=torch.float64)


def relative_l2(e2: float, r2: float) -> float:
    """``||d - w|| / ||w||`` from the sums (0 for two zero matrices, inf against a zero ``w``)."""
    return (e2 / r2) ** 0.5 if r2 > 0 else (0.0 if e2 == 0 else float("inf"))


def cosine(r2: float, dot: float, d2: float) -> float:
    return dot / (r2 * d2) ** 0.5 if r2 > 0 and d2 > 0 else (1.0 if r2 == d2 == 0 else 0.0)
