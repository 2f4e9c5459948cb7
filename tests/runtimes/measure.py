"""How a driver judges what a layer computed: the same seeded input for every runtime, the
dense layer's output as the reference, and the outcome class of the relative error."""

from __future__ import annotations

import torch

from .outcome import GARBAGE, Outcome

DEGRADED = 0.3
"""Relative output error from which a layer works but clearly worse than any format's usual
error (4-bit formats measure about 0.1 on these layers, 8-bit ones about 0.03)."""

ROWS = 4


def reference_input(k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + k)
    return torch.randn(ROWS, k, generator=gen, dtype=torch.float32).to(dtype)


def relative_error(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> float:
    """``|y - y_ref| / |y_ref|`` with ``y_ref`` the dense layer's F32 output; inf when ``y`` is
    not finite or of the wrong shape."""
    ref = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    y = y.float()
    if y.shape != ref.shape or not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def judge(errors: dict[str, float]) -> Outcome:
    """The outcome of a file whose layers all computed, from each layer's relative error."""
    if not errors:
        return Outcome("ok")
    layer = max(errors, key=lambda name: errors[name])
    worst = errors[layer]
    if worst == float("inf"):
        return Outcome("garbage", None, None, "non-finite output", layer, worst)
    if worst >= GARBAGE:
        return Outcome("garbage", None, None, f"relative error {worst:.3g}", layer, worst)
    if worst >= DEGRADED:
        return Outcome("degraded", None, None, "", layer, worst)
    return Outcome("ok", None, None, "", layer, worst)
