"""The ConvRot rotation: a block-diagonal regular Hadamard matrix along K (comfy-kitchen 0.2.40
``tensor/int8_utils.py`` ``_build_hadamard``).

``H_C`` for ``C = 4^k`` is ``(H4 (x) ... (x) H4) / sqrt(C)`` with
``H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]``: entry ``(i, j)`` is
``C^-1/2 * prod_d (-1 if a_d + b_d == 3 else 1)`` over the base-4 digits of ``i`` and ``j``.
It is symmetric, orthogonal and its own inverse, and every entry is +-2^-k (exact in every
float dtype).

``rotate_weight`` / ``rotate_activation`` multiply by the matrix in the operand's dtype
exactly as comfy-kitchen does (weights by ``H.T``, activations by ``H``; the memory layout of
the right-hand side changes BLAS's summation order, so both are kept).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .pages import empty_output

_CACHE: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def is_power_of_4(size) -> bool:
    """4, 16, 64, 256, 1024, ... (the sizes comfy-kitchen can build)."""
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 4
        and (size & (size - 1)) == 0
        and (size.bit_length() - 1) % 2 == 0
    )


def _check_size(size) -> None:
    if not is_power_of_4(size):
        raise ValueError(f"Regular Hadamard size must be a power of 4, got {size}")


def hadamard(size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The normalized ``[size, size]`` ConvRot matrix in ``dtype`` (cached, do not modify)."""
    key = (size, dtype)
    h = _CACHE.get(key)
    if h is None:
        _check_size(size)
        idx = torch.arange(size, dtype=torch.int64)
        i, j = idx.view(-1, 1), idx.view(1, -1)
        negatives = torch.zeros((size, size), dtype=torch.int64)
        for d in range(0, size.bit_length() - 1, 2):
            negatives += (((i >> d) & 3) + ((j >> d) & 3) == 3).to(torch.int64)
        sign = 1.0 - 2.0 * (negatives & 1).to(torch.float64)
        h = _CACHE[key] = (sign / size**0.5).to(dtype)
    return h


def _blocks(features: int, size: int, what: str) -> int:
    _check_size(size)
    if features % size:
        raise ValueError(f"{what} {features} not divisible by group_size {size}")
    return features // size


def rotate_weight(weight: torch.Tensor, size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``W[n, gC:(g+1)C] @ H.T`` for every block, computed in the weight's dtype.

    The call is comfy-kitchen's ``_rotate_weight`` operand for operand (``[n, G, C]`` times the
    transposed view of ``H``: one GEMM of ``M = n * G`` rows), so for the same ``weight`` shape
    BLAS picks the same kernel and sums in the same order on any CPU and thread count; a
    product over fewer rows may round differently (MKL/oneDNN choose kernels by ``M``).
    ``out`` (contiguous ``[n, k]``, same dtype, not ``weight``) receives the product: the
    same GEMM writing into a given buffer instead of a fresh one.  Without ``out`` the
    product is a new tensor on huge pages when large (``empty_output``): a
    whole layer's product (283 MB in F32 at 5120x13824) was faulted in 4 KiB pages, about
    70k faults per layer that decoded whole; the GEMM call and its bits are the same."""
    n, k = weight.shape
    groups = _blocks(k, size, "in_features")
    h = hadamard(size, weight.dtype)
    if out is None:
        out = empty_output((n, k), weight.dtype)
    torch.matmul(weight.reshape(n, groups, size), h.t(), out=out.view(n, groups, size))
    return out


def unrotate(
    dequantize: Callable[[], torch.Tensor], size: int, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The un-rotation of a whole dequantized layer: comfy-kitchen's ``_rotate_weight(w, H)``,
    the GEMM on the same operands (in ``w``'s dtype), whose rounding to ``dtype`` is left to
    the caller -- except that a product already in ``dtype`` is written straight into
    ``out`` when given.  ``dequantize()`` makes ``w``, a temporary released right after the
    GEMM, so the peak is two layers (``w`` and the product)."""
    w = dequantize()
    if w.dtype == dtype and out is not None:
        return rotate_weight(w, size, out=out)
    return rotate_weight(w, size)


def rotate_activation(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x[..., gC:(g+1)C] @ H`` for every block, computed in the activation's dtype."""
    features = x.shape[-1]
    groups = _blocks(features, size, "features")
    h = hadamard(size, x.dtype)
    return torch.matmul(x.reshape(-1, groups, size), h).reshape(x.shape)
