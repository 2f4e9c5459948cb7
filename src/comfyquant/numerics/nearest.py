"""Nearest-level assignment with comfy-kitchen's exact tie rule, in one binary search.

The reference picks, for a target ``t`` and a sorted table ``L``, ``pos = #{L < t}``, then the
upper neighbour ``L[pos]`` only when ``fl(t - L[pos])`` is smaller in magnitude than
``fl(t - L[pos-1])`` (F32 subtractions; ties and equal distances go down).  Between two
neighbours ``a < b`` that predicate is monotone in ``t`` (rounding is monotone), so it flips
exactly once, after a float ``tau(a, b)``.  With the 15 (or 62) ``tau`` values precomputed,
the chosen index is ``#{tau < t}``: one ``searchsorted`` instead of a search, two gathers,
two subtractions and a select -- and bit-identical, because ``tau`` is found by bisection
on the very same F32 predicate rather than taken as the midpoint.
"""

from __future__ import annotations

import torch

_SIGN = 0x80000000
_GRID_LIMIT = 127
_grid_cache: dict[str, torch.Tensor] = {}


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """F32 -> int64 on a line where consecutive floats are consecutive integers."""
    bits = x.view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _unordered(o: torch.Tensor) -> torch.Tensor:
    bits = torch.where(o < 0, (-o) | _SIGN, o)
    bits = torch.where(bits >= _SIGN, bits - (1 << 32), bits)
    return bits.to(torch.int32).view(torch.float32)


def thresholds(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """For F32 ``a <= b``: the largest ``t`` in ``[a, b]`` where the lower level still wins."""
    a = a.to(torch.float32)
    b = b.to(torch.float32)
    lo, hi = _ordered(a), _ordered(b)
    while bool((lo < hi).any()):
        mid = lo + (hi - lo + 1) // 2
        t = _unordered(mid)
        upper_wins = (b - t) < (t - a)
        lo = torch.where(upper_wins, lo, mid)
        hi = torch.where(upper_wins, mid - 1, hi)
    return _unordered(lo)


def table_thresholds(table: torch.Tensor) -> torch.Tensor | None:
    """Decision points of a sorted 1-D F32 table, or None if it is not sorted."""
    if table.numel() < 2:
        return table[:0].to(torch.float32)
    if not bool((table[1:] >= table[:-1]).all()):
        return None
    return thresholds(table[:-1], table[1:])


def nearest(table: torch.Tensor, target: torch.Tensor, cuts: torch.Tensor | None = None) -> torch.Tensor:
    """Index (int64) of the nearest entry of a sorted table, ties to the lower index."""
    if cuts is None:
        cuts = table_thresholds(table)
    if cuts is None:  # an unsorted table: the reference's search, step by step
        last = table.numel() - 1
        pos = torch.searchsorted(table, target.contiguous())
        lo, hi = (pos - 1).clamp(0, last), pos.clamp(0, last)
        return torch.where((target - table[hi]).abs() < (target - table[lo]).abs(), hi, lo)
    return torch.searchsorted(cuts, target.contiguous())


def grid_thresholds() -> torch.Tensor:
    """``tau(a, b)`` for every pair of integers in [-127, 127]: ``[255, 255]`` F32 (cached)."""
    cached = _grid_cache.get("pairs")
    if cached is None:
        v = torch.arange(-_GRID_LIMIT, _GRID_LIMIT + 1, dtype=torch.float32)
        a, b = torch.meshgrid(v, v, indexing="ij")
        ok = a <= b
        cached = torch.where(ok, thresholds(torch.where(ok, a, b), b), a)
        _grid_cache["pairs"] = cached
    return cached


def grid_nearest(levels: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row of sorted integer-valued ``levels [R, L]`` (in [-127, 127]), the nearest level
    index of each target in ``target [R, G]`` (int64), with the reference's tie rule."""
    idx = levels.to(torch.int64) + _GRID_LIMIT
    pairs = grid_thresholds()
    cuts = pairs[idx[:, :-1], idx[:, 1:]]
    return torch.searchsorted(cuts, target.contiguous())


def grid_by_code(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every FP8 E4M3 byte ``c``: the grid levels ``clamp(round(table * fp8(c)), -127, 127)``
    ``[256, L]`` and their decision points ``[256, L-1]``.

    A group's grid depends only on its FP8 scale byte, so 256 rows describe every group of a
    layer: assigning a group needs one row lookup, not a per-group table build."""
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    levels = (table.float().view(1, -1) * scales.view(-1, 1)).round_().clamp_(-_GRID_LIMIT, _GRID_LIMIT)
    finite = torch.isfinite(levels).all(dim=1, keepdim=True)
    safe = torch.where(finite, levels, torch.zeros_like(levels))  # NaN bytes never occur as scales
    idx = safe.to(torch.int64) + _GRID_LIMIT
    cuts = grid_thresholds()[idx[:, :-1], idx[:, 1:]]
    return levels, cuts.contiguous()


def grid_nearest_by_code(cuts: torch.Tensor, codes: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Nearest grid level index (int64) for ``target [R, G]`` whose rows use the grids of the
    FP8 bytes ``codes [R]`` (decision points from :func:`grid_by_code`)."""
    rows = cuts.index_select(0, codes.reshape(-1).to(torch.int32))
    return torch.searchsorted(rows, target.contiguous())
