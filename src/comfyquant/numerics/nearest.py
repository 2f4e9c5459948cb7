"""Nearest-level assignment with comfy-kitchen's exact tie rule, in one binary search.

The reference picks, for a target ``t`` and a sorted table ``L``, ``pos = #{L < t}``, then the
upper neighbour ``L[pos]`` only when ``fl(t - L[pos])`` is smaller in magnitude than
``fl(t - L[pos-1])`` (F32 subtractions; ties and equal distances go down).  Between two
neighbours ``a < b`` that predicate is monotone in ``t`` (rounding is monotone), so it flips
exactly once, after a float ``tau(a, b)``.  With the 15 (or 62) ``tau`` values precomputed,
the chosen index is ``#{tau < t}``: one ``searchsorted`` instead of a search, two gathers,
two subtractions and a select -- and bit-identical, because ``tau`` is found by bisection
on the very same F32 predicate rather than taken as the midpoint.

``#{tau < t}`` is then counted without a per-element binary search (torch's ``searchsorted``
costs a mispredicted branch per step, ~20 ns an element): ``CutLookup`` splits the
line into buckets by a monotone F32 map (``clamp(t * 2^k + o)``, exact operations applied
to the cuts and the targets alike), fine enough that a bucket holds at most one distinct
cut value.  A cut in a lower bucket is below every target of the bucket, one in a higher
bucket above it, so the count is the bucket's base count plus one comparison with its cut
(its multiplicity when the cut repeats): two gathers, a comparison and a select per
element, in cache-sized steps.  Rows whose cuts are not sorted and finite keep torch's
binary search, whose answer on such rows depends on its probe order.
"""

from __future__ import annotations

import math

import torch

_SIGN = 0x80000000
_STEP = (1 << 15) - (1 << 10)
"""Elements per lookup step: below torch's parallel grain (32768), so each operation runs
on the calling thread (no fork-join per operation), and its temporaries stay in L2.

Running the steps in one part per torch thread side by side (a thread pool; torch releases
the GIL) was tried and dropped: on the shared 2-core machine, at load 3-4, W4A8/W6A8 encodes
at 2 threads took 1.6-5.5 s with it against 0.4-2.2 s without (the pool's second part waits
for a core the OpenMP team of the surrounding block operations holds)."""
_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)
"""Buckets per row tried, fewest first: the first that separates every distinct cut wins."""
_BIT_SHIFT = 15
"""Bit-pattern buckets of one cut row: ``bits >> 15``, 2^17 of them (see
``CutLookup._set_bit_tables``)."""
_lookup_cache: dict[bytes, CutLookup] = {}
_LOOKUP_CACHE_SIZE = 16
_threshold_cache: dict[bytes, torch.Tensor] = {}
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
    """Decision points of a sorted 1-D F32 table, or None if it is not sorted (cached: the
    encoder asks once per row block, and the bisection costs ~30 passes)."""
    if table.numel() < 2:
        return table[:0].to(torch.float32)
    if not bool((table[1:] >= table[:-1]).all()):
        return None
    key = table.to(torch.float32).contiguous().numpy().tobytes()
    found = _threshold_cache.get(key)
    if found is None:
        if len(_threshold_cache) >= _LOOKUP_CACHE_SIZE:
            _threshold_cache.pop(next(iter(_threshold_cache)))
        found = _threshold_cache[key] = thresholds(table[:-1], table[1:])
    return found.clone()


def nearest(
    table: torch.Tensor, target: torch.Tensor, cuts: torch.Tensor | None = None, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Index (``dtype``) of the nearest entry of a sorted table, ties to the lower index."""
    if cuts is None:
        cuts = table_thresholds(table)
    if cuts is None:  # an unsorted table: the reference's search, step by step
        last = table.numel() - 1
        pos = torch.searchsorted(table, target.contiguous())
        lo, hi = (pos - 1).clamp(0, last), pos.clamp(0, last)
        return torch.where((target - table[hi]).abs() < (target - table[lo]).abs(), hi, lo).to(dtype)
    return cut_lookup(cuts).index(target, dtype=dtype)


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


def grid_nearest(levels: torch.Tensor, target: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Per row of sorted integer-valued ``levels [R, L]`` (in [-127, 127]), the nearest level
    index of each target in ``target [R, G]`` (int64), with the reference's tie rule."""
    idx = levels.to(torch.int64) + _GRID_LIMIT
    pairs = grid_thresholds()
    cuts = pairs[idx[:, :-1], idx[:, 1:]]
    return count_below_rows(cuts, target, dtype)


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


def grid_nearest_by_code(
    cuts: torch.Tensor, codes: torch.Tensor, target: torch.Tensor, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Nearest grid level index (``dtype``) for ``target [R, G]`` whose rows use the grids of
    the FP8 bytes ``codes [R]`` (decision points from ``grid_by_code``)."""
    return cut_lookup(cuts).index(target, codes.reshape(-1), dtype=dtype)


class CutLookup:
    """``#{cuts[r] < t}`` (what ``searchsorted(cuts[r], t)`` returns) for rows of cuts.

    Exact for every target (NaN counts as above every cut, as in ``searchsorted``): see the
    module docstring.  Built once per cut table (``cut_lookup`` caches them)."""

    def __init__(self, cuts: torch.Tensor) -> None:
        count = cuts.shape[-1] if cuts.dim() else 0
        rows = math.prod(cuts.shape[:-1]) if cuts.dim() > 1 else 1
        cuts = cuts.to(torch.float32).reshape(rows, count).contiguous()
        self.cuts = cuts
        self.count = count
        exact = torch.isfinite(cuts).all(dim=1)
        if count > 1:
            exact &= (cuts[:, 1:] >= cuts[:, :-1]).all(dim=1)
        self._set_map(1.0, 0.0, 1)
        tables = None
        if bool(exact.any()) and count > 0:
            for size in _BUCKETS:
                self._set_map(*_bucket_map(cuts[exact], size), size)
                tables, separated = self._tables(exact)
                if bool(separated[exact].all()):
                    break
            exact &= separated
        if tables is None:
            tables = self._tables(exact)[0]
        value, low, high = tables
        # per bucket its cut, and interleaved (count below, count below or at the cut): one
        # gather at 2 * bucket + (t > cut) gives the answer
        self.value = value
        self.pair = torch.stack([low, high], dim=-1).reshape(-1)
        self.by_bits = rows == 1 and count > 0 and bool(exact[0]) and self._set_bit_tables(cuts[0])
        self.exact = exact
        self.inexact = ~exact
        self.all_exact = bool(exact.all())
        self._pairs: dict[tuple, torch.Tensor] = {}

    def _set_bit_tables(self, cuts: torch.Tensor) -> bool:
        """One sorted, finite row: buckets by the top 17 bits of the F32 pattern instead
        (``bits >> 15``; 2^17 buckets of 2^15 consecutive patterns, each an interval of the
        line a 256th of its binade wide), when every bucket holds one distinct cut at most.

        Two integer operations give the bucket (no scaling, clamping or NaN clean-up), and
        NaN, +-inf and -0.0 fall in buckets of their own patterns.  The comparison is
        ``t < nextup(cut)`` (``t <= cut``), which NaN fails: a NaN takes the bucket's upper
        count, set to every cut for the NaN buckets -- also for the one NaNs share with
        -inf (patterns ``0xFF800000..``), where -inf passes the comparison and counts none.
        So ``value`` holds ``nextup(cut)`` (+inf for a bucket without a cut) and ``pair``
        (count above, count at or below) per bucket.  Returns False (the linear buckets
        stay) if some bucket holds two distinct cuts."""
        count = cuts.numel()
        key = torch.arange(-(1 << 16), 1 << 16, dtype=torch.int64)
        first = (key << _BIT_SHIFT).to(torch.int32)
        lo = first.view(torch.float32)
        hi = (first + ((1 << _BIT_SHIFT) - 1)).view(torch.float32)
        negative = key < 0
        smallest = torch.where(negative, hi, lo)  # the bucket's interval, for finite buckets
        largest = torch.where(negative, lo, hi)
        finite = torch.isfinite(smallest) & torch.isfinite(largest)
        below = torch.searchsorted(cuts, torch.where(finite, smallest, 0.0))
        at_or_below = torch.searchsorted(cuts, torch.where(finite, largest, 0.0), right=True)
        held = at_or_below > below
        cut = cuts[below.clamp(max=count - 1)]
        last = cuts[(at_or_below - 1).clamp(min=0)]
        if not bool((~held | (cut == last))[finite].all()):
            return False
        value = torch.where(held & finite, torch.nextafter(cut, torch.tensor(float("inf"))), float("inf"))
        every = torch.full_like(below, count)
        minus_inf = (first == torch.tensor(0xFF800000 - (1 << 32), dtype=torch.int32)) & ~finite
        value = torch.where(minus_inf, torch.nextafter(torch.tensor(float("-inf")), torch.tensor(0.0)), value)
        low = torch.where(finite, below, torch.where(minus_inf, 0, every))
        high = torch.where(finite, at_or_below, every)
        index_dtype = torch.uint8 if count < 256 else torch.int32
        self.value = value.contiguous()
        self.pair = torch.stack([high, low], dim=-1).reshape(-1).to(index_dtype)
        return True

    def _bucket(self, t: torch.Tensor, nan: bool = True) -> torch.Tensor:
        """Bucket (int32) of F32 values: the same exact operations for cuts and targets.

        ``t * scale`` is exact (a power-of-two scale; a product below the normal range only
        for scales < 1, and then cuts and targets round alike), so buckets have equal widths."""
        x = torch.mul(t, self.scale).add_(self.offset).clamp_(0, self.size - 1)
        if nan:
            x.nan_to_num_(nan=float(self.size))
        return x.to(torch.int32)

    def _set_map(self, scale: float, offset: float, size: int) -> None:
        self.scale, self.offset, self.size = scale, offset, size

    def _tables(self, exact: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Per (row, bucket): the bucket's cut value (+inf if none), the count of the row's
        cuts in lower buckets and that count plus the bucket's own; and per row whether
        every bucket holds one distinct value at most.  Rows not ``exact`` get empty tables."""
        rows, count = self.cuts.shape
        width = self.size + 1  # the last bucket is NaN's: above every cut
        cuts = torch.where(exact.unsqueeze(1), self.cuts, torch.zeros(()))
        bucket = self._bucket(cuts).to(torch.int64) + torch.arange(rows).unsqueeze(1) * width
        bucket = torch.where(exact.unsqueeze(1), bucket, torch.arange(rows).unsqueeze(1) * width + self.size)
        flat, values = bucket.reshape(-1), cuts.reshape(-1)
        per_bucket = torch.bincount(flat[exact.repeat_interleave(count)], minlength=rows * width).view(rows, width)
        high = per_bucket.cumsum(1)
        low = high - per_bucket
        nan_bucket = torch.full((rows, 1), count, dtype=high.dtype)
        low[:, -1:] = torch.where(exact.unsqueeze(1), nan_bucket, 0)
        high[:, -1:] = low[:, -1:]
        smallest = torch.full((rows * width,), float("inf")).scatter_reduce(0, flat, values, "amin")
        largest = torch.full((rows * width,), float("-inf")).scatter_reduce(0, flat, values, "amax")
        occupied = per_bucket.reshape(-1) > 0
        separated = ((smallest == largest) | ~occupied).view(rows, width)[:, :-1].all(dim=1)
        value = torch.where(occupied, smallest, float("inf"))
        value.view(rows, width)[:, -1] = float("inf")
        value.view(rows, width)[~exact] = float("inf")
        index_dtype = torch.uint8 if count < 256 else torch.int32
        return (value, low.reshape(-1).to(index_dtype), high.reshape(-1).to(index_dtype)), separated

    def index(self, target: torch.Tensor, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """Counts for ``target`` (F32): against row 0 for any shape when ``rows`` is None,
        else ``target [R, G]`` against the rows ``rows [R]`` (integers)."""
        count = self.lookup(target, rows)[0]
        return count if count.dtype == dtype else count.to(dtype)

    def lookup(
        self, target: torch.Tensor, rows: torch.Tensor | None = None, payloads: tuple[torch.Tensor | None, ...] = (None,)
    ) -> list[torch.Tensor]:
        """Per payload, ``payload[row, count]`` for every target (``count`` as ``index``
        gives it, in the lookup's own narrow dtype, for a payload of None).

        A payload is a ``[count + 1]`` table (``rows`` None) or one row per cut row,
        ``[R, count + 1]``: the level values a count stands for, say.  Looking them up with
        the count's own gather saves the caller a gather and an index pass per payload --
        the values are copied, so they are bit for bit what ``payload[row, count]`` is."""
        t = target.to(torch.float32).contiguous()
        tables = [self._payload_pairs(p) for p in payloads]
        outs = [torch.empty(t.shape, dtype=tab.dtype) for tab in tables]
        if t.numel() == 0:
            return outs
        if self.count == 0:
            return [self._constant(p, rows, t.shape, out) for p, out in zip(payloads, outs)]
        if self.by_bits:  # one row: every target is looked up against it
            rows = None
        if rows is None:
            base = None
            flat_t = t.view(-1)
            flat_outs = [o.view(-1) for o in outs]
            step = _STEP
        else:
            base = (rows.reshape(-1).to(torch.int32) * (self.size + 1)).view(-1, 1)
            flat_t = t.view(t.shape[0], -1)
            flat_outs = [o.view(t.shape[0], -1) for o in outs]
            step = max(1, _STEP // max(flat_t.shape[1], 1))
        self._run(flat_t, base, tables, flat_outs, 0, flat_t.shape[0], step)
        if not self.all_exact:
            _binary_search_rows(self, t, rows, payloads, outs)
        return outs

    def _run(self, t, base, tables, outs, lo: int, hi: int, step: int) -> None:
        """The lookup for rows ``lo:hi`` of ``t`` (elements, when ``base`` is None), a step
        at a time in scratch buffers reused across steps: the bucket (two integer operations
        by bits, else four elementwise ones), a gather of its cut, a comparison, an add and
        a gather per payload, all in cache.  (The comparison is written into an INT32
        buffer: half the cost of a BOOL one, and the add stays INT32.)"""
        width = t.shape[1] if t.dim() == 2 else 1
        full = (step, width) if t.dim() == 2 else (step,)
        x = torch.empty(full, dtype=torch.float32)
        at = torch.empty(full, dtype=torch.int32)
        flat_at = at.view(-1)
        value = torch.empty(step * width, dtype=torch.float32)
        above = torch.empty(step * width, dtype=torch.int32)
        top, last, scale, offset = float(self.size), self.size - 1, self.scale, self.offset
        by_bits = self.by_bits and base is None
        for s0 in range(lo, hi, step):
            tt = t[s0 : s0 + step]
            if tt.shape[0] < step:  # the last, short step: views of the scratch
                n = tt.numel()
                x, at, flat_at, value, above = x[: tt.shape[0]], at[: tt.shape[0]], flat_at[:n], value[:n], above[:n]
            if by_bits:
                torch.bitwise_right_shift(tt.view(torch.int32), _BIT_SHIFT, out=at).add_(1 << 16)
                torch.index_select(self.value, 0, flat_at, out=value)
                torch.lt(tt, value, out=above)
            else:
                torch.mul(tt, scale, out=x).add_(offset).clamp_(0, last).nan_to_num_(nan=top)
                at.copy_(x)
                if base is not None:
                    torch.add(base[s0 : s0 + step], at, out=at)
                torch.index_select(self.value, 0, flat_at, out=value)
                torch.gt(tt.reshape(-1), value, out=above)
            torch.add(above, flat_at, alpha=2, out=flat_at)
            for table, out in zip(tables, outs):
                torch.index_select(table, 0, flat_at, out=out[s0 : s0 + step].view(-1))

    def _payload_pairs(self, payload: torch.Tensor | None) -> torch.Tensor:
        """``payload[row, low]``, ``payload[row, high]`` interleaved per (row, bucket), as
        ``pair`` holds the counts themselves (cached per payload)."""
        if payload is None:
            return self.pair
        p = payload.contiguous()
        key = (str(p.dtype), tuple(p.shape), p.view(torch.uint8).numpy().tobytes())
        found = self._pairs.get(key)
        if found is None:
            width = self.count + 1
            flat = p.reshape(-1, width)
            if flat.shape[0] not in (1, self.cuts.shape[0]):
                raise ValueError(f"payload rows {flat.shape[0]} do not match {self.cuts.shape[0]} cut rows")
            buckets = self.pair.numel() // (2 * self.cuts.shape[0])
            row = torch.arange(self.cuts.shape[0]).repeat_interleave(2 * buckets) if flat.shape[0] > 1 else 0
            found = flat.reshape(-1)[row * width + self.pair.to(torch.int64)].contiguous()
            if len(self._pairs) >= 4:
                self._pairs.pop(next(iter(self._pairs)))
            self._pairs[key] = found
        return found

    def _constant(self, payload, rows, shape, out):
        """No cuts: every count is 0."""
        if payload is None:
            return out.zero_()
        flat = payload.reshape(-1, 1)
        if rows is None or flat.shape[0] == 1:
            return out.copy_(flat[0, 0].expand(shape))
        return out.copy_(flat.index_select(0, rows.reshape(-1).to(torch.int64)).view(-1, 1).expand(shape))


def _binary_search_rows(
    lookup: CutLookup,
    t: torch.Tensor,
    rows: torch.Tensor | None,
    payloads: tuple[torch.Tensor | None, ...],
    outs: list[torch.Tensor],
) -> None:
    """torch's own search for the targets whose rows the lookup cannot count exactly."""
    if rows is None:
        found = torch.searchsorted(lookup.cuts[0], t.contiguous()).view(t.shape)
        for payload, out in zip(payloads, outs):
            out.copy_(found.to(out.dtype) if payload is None else payload.reshape(-1)[found])
        return
    rows = rows.reshape(-1).to(torch.int64)
    bad = lookup.inexact.index_select(0, rows)
    if bool(bad.any()):
        picked = rows[bad]
        found = torch.searchsorted(lookup.cuts.index_select(0, picked), t.view(t.shape[0], -1)[bad].contiguous())
        for payload, out in zip(payloads, outs):
            if payload is None:
                value = found.to(out.dtype)
            else:
                table = payload.reshape(-1, lookup.count + 1)
                table = table.expand(lookup.cuts.shape[0], -1) if table.shape[0] == 1 else table
                value = torch.gather(table.index_select(0, picked), 1, found)
            out.view(t.shape[0], -1)[bad] = value


def _bucket_map(cuts: torch.Tensor, size: int) -> tuple[float, float]:
    """``(2^k, o)`` putting the finite ``cuts`` into buckets ``1 .. size-2`` (or near): a
    power-of-two scale keeps ``t * scale`` exact, so buckets have equal widths."""
    lo, hi = float(cuts.min()), float(cuts.max())
    span = hi - lo
    reach = max(abs(lo), abs(hi), 1e-30)
    exponent = math.floor(math.log2((size - 2) / span)) if span > 0 else 0
    exponent = min(exponent, math.floor(math.log2((1 << 22) / reach)), 100)
    scale = 2.0**exponent
    return scale, float(1 - math.floor(lo * scale))


def cut_lookup(cuts: torch.Tensor) -> CutLookup:
    """The (cached) ``CutLookup`` of a cut table ``[L]`` or ``[R, L]``."""
    c = cuts.to(torch.float32).contiguous()
    key = bytes(str(tuple(c.shape)), "ascii") + c.view(torch.uint8).numpy().tobytes()
    found = _lookup_cache.get(key)
    if found is None:
        if len(_lookup_cache) >= _LOOKUP_CACHE_SIZE:
            _lookup_cache.pop(next(iter(_lookup_cache)))
        found = _lookup_cache[key] = CutLookup(c)
    return found


def count_below_rows(cuts: torch.Tensor, target: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``searchsorted(cuts[r], target[r])`` for per-row cuts ``[R, L]`` and targets ``[R, G]``
    that share no table (F32 group scales): comparison counts in cache-sized row steps.

    Counted as ``L - #{cuts >= t}`` so a NaN target, at or above no cut, gets ``L`` as in
    ``searchsorted``; rows not sorted and finite keep the binary search."""
    cuts = cuts.to(torch.float32).contiguous()
    t = target.to(torch.float32).contiguous()
    rows, count = cuts.shape
    out = torch.empty(t.shape, dtype=torch.uint8 if count < 256 else torch.int32)
    step = max(1, _STEP // max(1, t.shape[1] * count))
    for r0 in range(0, rows, step):
        at_or_above = torch.le(t[r0 : r0 + step].unsqueeze(-1), cuts[r0 : r0 + step].unsqueeze(-2))
        torch.sum(at_or_above.view(torch.uint8), -1, dtype=out.dtype, out=out[r0 : r0 + step])
    out = torch.sub(count, out) if count < 256 else count - out
    result = out.to(dtype)
    exact = torch.isfinite(cuts).all(dim=1)
    if count > 1:
        exact &= (cuts[:, 1:] >= cuts[:, :-1]).all(dim=1)
    bad = ~exact
    if bool(bad.any()):
        result[bad] = torch.searchsorted(cuts[bad], t[bad]).to(dtype)
    return result
