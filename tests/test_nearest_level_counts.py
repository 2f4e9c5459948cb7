"""The nearest-level counts equal torch.searchsorted(side='left') bit for bit.

The W4A8/W6A8 encoders count decision points below each target with bucket lookups
(``CutLookup``) and comparison counts (``count_below_rows``) instead of torch's binary search;
the codes stay comfy-kitchen's only if every count is the one ``searchsorted`` returns --
for ties (repeated cuts), -0.0 against +0.0, subnormals, +-inf and NaN targets, and rows
whose cuts are not sorted (where the binary search's answer depends on its probes)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comfyquant.numerics import nearest as nr

SPECIAL = [
    0.0,
    -0.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    -float("nan"),
    1e-45,
    -1e-45,
    1.17549435e-38,
    -1.17549435e-38,
    3.4028235e38,
    -3.4028235e38,
    0.5,
    -0.5,
    127.0,
    -127.0,
]

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
small = st.one_of(
    f32,
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 2e-40, 0.5, -0.5, 1.0, -1.0]),
    st.integers(-127, 127).map(float),
    st.floats(-2, 2, width=32),
)


def sorted_cuts(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).sort().values


def probes(cuts: torch.Tensor, extra: list[float]) -> torch.Tensor:
    """Every cut, its float neighbours, the special values and the drawn targets."""
    c = cuts.reshape(-1)
    up = torch.nextafter(c, torch.full_like(c, float("inf")))
    down = torch.nextafter(c, torch.full_like(c, float("-inf")))
    return torch.cat([c, up, down, -c, torch.tensor(SPECIAL + extra, dtype=torch.float32)])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([15, 62]), st.data())
def test_table_lookup_equals_searchsorted(count, data):
    values = data.draw(st.lists(small, min_size=count, max_size=count))
    repeat = data.draw(st.integers(0, count - 1))
    for i in range(repeat, min(count, repeat + data.draw(st.integers(0, 4)))):
        values[i] = values[repeat]  # ties: repeated cuts
    cuts = sorted_cuts(values)
    extra = data.draw(st.lists(st.one_of(f32, st.floats(width=32)), max_size=40))
    t = probes(cuts, extra)
    assert same(nr.CutLookup(cuts).index(t), torch.searchsorted(cuts, t))
    grid = t[: (t.numel() // 2) * 2].view(2, -1)  # any target shape
    assert same(nr.CutLookup(cuts).index(grid, dtype=torch.int32), torch.searchsorted(cuts, grid).int())


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([15, 62]), st.integers(1, 6), st.data())
def test_row_lookup_equals_searchsorted_of_the_gathered_rows(count, nrows, data):
    rows = []
    for _ in range(nrows):
        values = data.draw(st.lists(small, min_size=count, max_size=count))
        kind = data.draw(st.sampled_from(["sorted", "sorted", "ties", "unsorted", "nan"]))
        row = sorted_cuts(values)
        if kind == "ties":
            row = sorted_cuts([float(v) for v in torch.tensor(values).round().tolist()])
        elif kind == "unsorted":
            row = torch.tensor(values, dtype=torch.float32)
        elif kind == "nan":
            row[data.draw(st.integers(0, count - 1))] = float("nan")
        rows.append(row)
    table = torch.stack(rows)
    t = probes(table, data.draw(st.lists(st.floats(width=32), max_size=20)))
    codes = torch.tensor(data.draw(st.lists(st.integers(0, nrows - 1), min_size=1, max_size=8)), dtype=torch.uint8)
    target = t.view(1, -1).expand(codes.numel(), -1).contiguous()
    expected = torch.searchsorted(table.index_select(0, codes.int()), target)
    assert same(nr.CutLookup(table).index(target, codes), expected)
    assert same(nr.count_below_rows(table.index_select(0, codes.int()), target), expected)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1.5, 1.5, width=32), min_size=16, max_size=16), st.booleans(), st.data())
def test_grid_by_code_assignment_equals_searchsorted(levels, ordered, data):
    """The FP8-scale grids of a 16-level codebook (sorted or not) and of the 63 6-bit levels."""
    for table in (
        torch.tensor(levels).sort().values if ordered else torch.tensor(levels),
        torch.arange(-31, 32, dtype=torch.float32),
    ):
        _levels, cuts = nr.grid_by_code(table)
        codes = torch.tensor(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=16)), dtype=torch.uint8)
        spread = torch.tensor(data.draw(st.lists(st.floats(-200, 200, width=32), min_size=8, max_size=8)))
        target = torch.cat([spread, torch.tensor(SPECIAL), torch.arange(-128, 128) / 2.0])
        target = target.view(1, -1).expand(codes.numel(), -1).contiguous()
        expected = torch.searchsorted(cuts.index_select(0, codes.int()), target)
        assert same(nr.grid_nearest_by_code(cuts, codes, target), expected)


def test_per_group_grid_assignment_equals_searchsorted():
    gen = torch.Generator().manual_seed(3)
    levels = torch.randint(-127, 128, (400, 16), generator=gen).float().sort(dim=1).values
    levels[:50] = levels[:50].div(16).round()  # many repeated levels: repeated cuts
    levels[50:60] = levels[50:60].flip(1)  # descending rows: the binary search's own answer
    target = torch.cat([torch.randn(400, 40, generator=gen) * 70, torch.tensor(SPECIAL).expand(400, -1)], 1)
    idx = levels.to(torch.int64) + 127
    cuts = nr.grid_thresholds()[idx[:, :-1], idx[:, 1:]]
    assert same(nr.grid_nearest(levels, target), torch.searchsorted(cuts, target.contiguous()))


def test_nearest_keeps_the_reference_tie_rule():
    """Ties between two levels go to the lower one; an unsorted table keeps the reference's
    binary-search path (the same answer as before the lookup)."""
    table = torch.tensor([-1.0, -0.25, 0.25, 1.0])
    t = torch.tensor([-0.625, 0.0, 0.625, 2.0, -2.0, float("nan")])
    assert nr.nearest(table, t).tolist() == [0, 1, 2, 3, 0, 3]
    unsorted = torch.tensor([0.5, -1.0, 1.0, 0.0])
    pos = torch.searchsorted(unsorted, t)
    lo, hi = (pos - 1).clamp(0, 3), pos.clamp(0, 3)
    expected = torch.where((t - unsorted[hi]).abs() < (t - unsorted[lo]).abs(), hi, lo)
    assert same(nr.nearest(unsorted, t), expected)


def test_lookup_survives_degenerate_tables():
    for cuts in (
        torch.zeros(0),
        torch.zeros(15),
        torch.full((15,), -0.0),
        torch.tensor([1e-45] * 7 + [2e-45] * 8),
        torch.tensor([-3.4028235e38] * 8 + [3.4028235e38] * 7),
        torch.tensor([float("inf")] * 15),
    ):
        t = probes(cuts, [])
        assert same(nr.CutLookup(cuts).index(t), torch.searchsorted(cuts, t))
