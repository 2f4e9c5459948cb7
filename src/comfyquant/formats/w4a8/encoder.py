"""The ``asym_w4a8_int8`` reference quantizer (comfy-kitchen 0.2.40
``backends/eager/w4a8_int8.py`` ``quantize_w4a8_int8_weight``).

Step by step as comfy-kitchen 0.2.40 eager does it, so codes, ``s_rel``, ``s_channel``, the
codebook and the correction come out bit-identical:

0. rotate ``W`` per ConvRot block in its own dtype, in comfy-kitchen's row chunks of
   ``2^22 // K`` rows (one GEMM each, the same operands: the same rounding on any CPU);
   everything after the codebook decision is per row, so it runs in smaller row blocks;
1. codebook (A) or 6-bit (D): group scale from the group maximum, then two ALS passes;
2. uniform symmetric (B): ``amax / 7``; 3. asymmetric (C): ``(max - min) / 15`` plus a
   group-major correction ``8 * gs + min`` in the weight's dtype;
4. ``s_channel`` from the largest shifted level, ``s_rel = gs / s_channel`` rounded to FP8;
5. (A, D) final nearest-level assignment against the decoded INT8 grid, for 6-bit after a
   search over ``s_rel`` and its two FP8 neighbours; 6. pack.

Every reduction, search and gather is the same torch operation on the same shapes as the
reference: summation order is part of the result.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...numerics.floats import E4M3, fp8_neighbours
from ...numerics.hadamard import is_power_of_4, rotate_weight
from ...numerics.nearest import cut_lookup, grid_by_code, grid_nearest, grid_nearest_by_code, nearest, table_thresholds
from ...numerics.packing import pack_6bit, pack_nibbles
from ...numerics.rows import Weight, as_source, gather_rows, materialize, release_memory, row_blocks
from ..codec import CodecError, reject_unknown
from . import GROUP_SIZE, group_size_ok, k_fits, six_bit_fits

FIXED_CODEBOOK = (
    -0.980602,
    -0.794529,
    -0.638165,
    -0.500986,
    -0.377321,
    -0.263187,
    -0.155210,
    -0.050720,
    0.052541,
    0.156985,
    0.265284,
    0.379533,
    0.502636,
    0.638953,
    0.794876,
    0.980671,
)
"""Lloyd-Max levels for group-normalized Gaussian data (comfy-kitchen's built-in table)."""

KURTOSIS_GATE = -0.1
KURTOSIS_SAMPLE = 1 << 19
FIT_SAMPLE = 300_000
FIT_ITERATIONS = 25
ALS_PASSES = 2
SIX_BIT_LEVELS = 31
SCALE_STEP_F32 = 0.03
ROW_BUDGET = 1 << 22
"""Elements sampled for the codebook decision (and comfy-kitchen's rotation chunk)."""

_SCALE_DTYPES = {"fp8": E4M3, "float8_e4m3fn": E4M3, "f32": torch.float32, "float32": torch.float32}


def encode_w4a8(weight: Weight, params: dict, name: str, fmt: str) -> tuple[dict, dict]:
    """Quantize a dense weight; ``params`` as comfy-kitchen's ``AsymW4A8Int8Layout.quantize``."""
    g = params.pop("group_size", GROUP_SIZE)
    c = params.pop("convrot_groupsize", 256)
    symmetric = bool(params.pop("symmetric", True))
    scale_dtype = params.pop("scale_dtype", E4M3)
    use_codebook = bool(params.pop("codebook", True))
    book = params.pop("codebook_tensor", None)
    bits = params.pop("bits", 4)
    search = bool(params.pop("scale_search", True))
    if params.pop("stochastic_rounding", 0):
        raise CodecError(f"{name}: stochastic rounding is not supported (it is seeded noise, not a format property)")
    reject_unknown(params, name)
    scale_dtype = _SCALE_DTYPES.get(scale_dtype, scale_dtype) if isinstance(scale_dtype, str) else scale_dtype
    if scale_dtype not in (torch.float32, E4M3):
        raise CodecError(f"{name}: scale_dtype must be float32 or float8_e4m3fn, got {scale_dtype}")
    _validate(weight, g, c, bits, name)
    if bits == 6:
        if not symmetric:
            raise CodecError(f"{name}: 6-bit storage is symmetric only")
        use_codebook = False
    table = None
    if symmetric and use_codebook:
        table = book.to(torch.float32) if book is not None else _decide_codebook(weight, g, c)
        release_memory()  # the decision's blocks, before the quantizer's (other sizes)
        if tuple(table.shape) != (16,):
            raise CodecError(f"{name}: codebook must have shape (16,), got {tuple(table.shape)}")
    # the per-block search is many small operations on one core each: blocks side by side
    # use the cores torch is given (one with --jobs, whose workers take a core each)
    parts = gather_rows(
        _rotated_blocks(weight, c),
        lambda rows: _quantize_rotated(rows, g, symmetric, scale_dtype, table, bits, search),
        weight.shape[0],
        workers=torch.get_num_threads(),
    )
    packed, s_rel, s_channel = parts[:3]
    corr = parts[3].t().contiguous() if len(parts) > 3 else None
    tensors = {"weight": packed.view(torch.int8), "weight_s_rel": s_rel, "weight_s_channel": s_channel}
    if table is not None:
        tensors["weight_codebook"] = table.contiguous()
    if corr is not None:
        tensors["weight_correction"] = corr
    return tensors, {"format": fmt, "group_size": g, "convrot_groupsize": c, "convrot": True}


def _validate(weight: Weight, g, c, bits, name: str) -> None:
    k = weight.shape[1]
    if bits not in (4, 6):
        raise CodecError(f"{name}: bits must be 4 or 6, got {bits}")
    if bits == 6 and (not group_size_ok(g) or not six_bit_fits(k, g)):
        raise CodecError(
            f"{name}: 6-bit storage needs K divisible by 32 and group_size a multiple of 16, got K={k}, group_size={g}"
        )
    if not isinstance(g, int) or not isinstance(c, int) or c <= 0 or not group_size_ok(g) or not k_fits(k, g, c):
        raise CodecError(
            f"{name}: K={k} must be divisible by 16, group_size={g}, and convrot_groupsize={c}; "
            "group_size must be >=4 and divide 16 or be a multiple of 16"
        )
    if not is_power_of_4(c):
        raise CodecError(f"{name}: Regular Hadamard size must be a power of 4, got {c}")


def _rotated_blocks(weight: Weight, c: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(r0, r1, rotated rows)`` for the row blocks of ``weight``.

    The rotation is comfy-kitchen's call: one GEMM per row chunk of ``ROW_BUDGET // K`` rows
    (at least one; the whole weight when it has no more rows), in the weight's dtype -- the
    same operand shapes, so the same rounding on any CPU (a GEMM over other row counts may
    round differently, see ``comfyquant.numerics.rows``).  Everything after the rotation
    is per row, so the quantizer then takes each rotated chunk in row blocks: its
    temporaries, about 20 bytes per element, follow the block, not the chunk."""
    n, k = weight.shape
    chunk = max(1, ROW_BUDGET // max(k, 1))
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        rotated = rotate_weight(materialize(weight, c0, c1).contiguous(), c)
        for b0, b1, rows in row_blocks(rotated):
            yield c0 + b0, c0 + b1, rows
        del rotated


# -- codebook ---------------------------------------------------------------------------------


def _decide_codebook(weight: Weight, g: int, c: int) -> torch.Tensor:
    """One table per tensor, from evenly spaced sample rows (never from chunk boundaries).

    The sample is rotated whole, as the reference does; the group-normalized values the
    decision draws from are computed a row block at a time and only where drawn."""
    source = as_source(weight)
    n, k = source.shape
    max_rows = max(1, ROW_BUDGET // max(k, 1))
    if n > max_rows:
        sample = source.select(torch.linspace(0, n - 1, max_rows).long())
    else:
        sample = source.rows(0, n)
    rotated = rotate_weight(sample.contiguous(), c)
    del sample
    return _codebook_for(lambda index: _normalized_at(rotated, g, index), rotated.numel())


def _normalized_at(rotated: torch.Tensor, g: int, index: torch.Tensor | None) -> torch.Tensor:
    """F32 values of ``rotated`` divided by their group's largest magnitude, at the flat
    positions ``index`` (all of them, in order, for None).

    Only the drawn values are divided: each by its group's ``amax.clamp(min=1e-8)``, the
    very operands of the reference's whole-sample division (a maximum does not depend on
    the order it is taken in), so the same F32 quotients.  The group maxima (one F32 per
    group) are taken a row block at a time; no F32 copy of the sample is made."""
    if index is None:
        return _normalize_groups(rotated, g).flatten()
    rows = rotated.shape[0]
    amax = torch.empty(rows * (rotated.shape[1] // g), dtype=torch.float32)
    per_row = rotated.shape[1] // g
    for r0, r1, block in row_blocks(rotated):
        torch.amax(block.float().view(-1, g).abs_(), dim=-1, out=amax[r0 * per_row : r1 * per_row])
    values = rotated.reshape(-1).index_select(0, index).float()
    return values.div_(amax.index_select(0, torch.div(index, g, rounding_mode="floor")).clamp_(min=1e-8))


def _normalize_groups(rows: torch.Tensor, g: int) -> torch.Tensor:
    grouped = rows.float().view(rows.shape[0], -1, g)
    return grouped / grouped.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8)


def _seeded_index(numel: int, limit: int) -> torch.Tensor | None:
    """Positions of at most ``limit`` of ``numel`` values, drawn with a generator seeded 0 as
    comfy-kitchen draws them; None when all values are taken."""
    if numel <= limit:
        return None
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, numel, (limit,), generator=gen)


def _codebook_for(values, numel: int) -> torch.Tensor:
    """The fixed table unless the normalized groups are heavy-tailed (excess kurtosis > -0.1).
    ``values(index)`` gives the normalized values at sampled positions (see ``_seeded_index``)."""
    x = values(_seeded_index(numel, KURTOSIS_SAMPLE)).float()
    excess = ((x - x.mean()) / (x.std() + 1e-9)).pow(4).mean() - 3.0
    if excess.item() <= KURTOSIS_GATE:
        return torch.tensor(FIXED_CODEBOOK, dtype=torch.float32)
    del x
    return _fit_codebook(values(_seeded_index(numel, FIT_SAMPLE)).float())


def _fit_codebook(samples: torch.Tensor) -> torch.Tensor:
    """16-level Lloyd-Max: quantile start, 25 rounds of nearest assignment and mean update
    (the nearest level found for blocks of samples: a ``[samples, 16]`` distance table
    would be 20 MB)."""
    book = torch.quantile(samples, torch.linspace(0, 1, 16, device=samples.device))
    for _ in range(FIT_ITERATIONS):
        nearest = torch.cat([(part - book).abs().argmin(-1) for _r0, _r1, part in row_blocks(samples.view(-1, 1), 1 << 16)])
        updated = book.clone()
        for i in range(16):
            chosen = nearest == i
            if chosen.any():
                updated[i] = samples[chosen].mean()
        book = updated
    return book.contiguous()


# -- assignment -------------------------------------------------------------------------------


def _grid_levels(table: torch.Tensor, s_rel: torch.Tensor) -> torch.Tensor:
    """INT8 value of every level in every group: ``clamp(round(level * s_rel), -127, 127)``."""
    return (table.view(1, 1, -1) * s_rel.float().unsqueeze(-1)).round_().clamp_(-127, 127)


def _assign_grid(
    gw: torch.Tensor, levels: torch.Tensor, s_channel: torch.Tensor, target: torch.Tensor | None = None
) -> torch.Tensor:
    """Per group, the nearest decoded grid level of ``w / s_channel`` (same tie rule)."""
    n, groups, gsize = gw.shape
    if target is None:
        target = gw / s_channel.view(-1, 1, 1)
    idx = grid_nearest(levels.reshape(n * groups, -1), target.reshape(n * groups, gsize))
    return idx.reshape(n, groups, gsize)


def _search_scale(gw, s_rel, s_channel, table):
    """6-bit: keep, per group, the candidate scale (base, lower, upper) with the smallest
    through-grid squared error; a later candidate must be strictly better."""
    target = gw / s_channel.view(-1, 1, 1)
    if s_rel.dtype == E4M3:
        return _search_scale_fp8(gw, s_rel, table, target)

    def score(cand):
        levels = _grid_levels(table, cand)
        idx = _assign_grid(gw, levels, s_channel, target=target)
        err = torch.gather(levels, 2, idx).sub_(target).pow_(2).sum(-1)
        return err, idx

    base = s_rel.float()
    best_scale = base
    best_err, best_idx = score(base)
    for cand in (base * (1 - SCALE_STEP_F32), base * (1 + SCALE_STEP_F32)):
        err, idx = score(cand)
        better = err < best_err
        torch.where(better, err, best_err, out=best_err)
        torch.where(better, cand, best_scale, out=best_scale)
        torch.where(better.unsqueeze(-1), idx, best_idx, out=best_idx)
    return best_scale.to(s_rel.dtype).contiguous(), best_idx


def _search_scale_fp8(gw, s_rel, table, target):
    """The FP8 scale search with per-byte grids: the chosen level of a group is recomputed
    elementwise (``clamp(round(table[i] * s), -127, 127)``, the same value the reference
    gathers from its per-group level table), so no per-group tables are built."""
    n, groups, gsize = gw.shape
    levels, cuts = grid_by_code(table)
    lookup = cut_lookup(cuts)
    flat_target = target.reshape(n * groups, gsize)
    lower, upper = fp8_neighbours(s_rel)

    def score(cand):
        codes = cand.view(torch.uint8)
        # the level of byte c, index i is clamp(round(table[i] * fp8(c)), -127, 127): the
        # very product the reference rounds, gathered with the index instead of recomputed
        idx, chosen = lookup.lookup(flat_target, codes.reshape(-1), payloads=(None, levels))
        err = chosen.view(n, groups, gsize).sub_(target).pow_(2).sum(-1)
        return err, idx.view(n, groups, gsize)

    best_scale = s_rel.float()
    best_err, best_idx = score(s_rel)
    for cand in (lower, upper):
        err, idx = score(cand)
        better = err < best_err
        torch.where(better, err, best_err, out=best_err)
        torch.where(better, cand.float(), best_scale, out=best_scale)
        torch.where(better.unsqueeze(-1), idx, best_idx, out=best_idx)
    return best_scale.to(s_rel.dtype).contiguous(), best_idx


# -- one chunk of rotated rows ----------------------------------------------------------------


def _quantize_rotated(rotated, g, symmetric, scale_dtype, table, bits, search) -> tuple[torch.Tensor, ...]:
    """(packed uint8, s_rel, s_channel) and, asymmetric, the correction (row-major
    ``[rows, groups]``: the caller transposes the whole layer's) for already rotated rows.

    Temporaries are dropped as soon as they are dead: a block's peak is a few F32 copies
    of it plus one int64 index tensor, which is what sizes the blocks."""
    dtype = rotated.dtype
    n, k = rotated.shape
    groups = k // g
    gw = rotated.float().view(n, groups, g)
    levels = None
    corr = None
    codes: torch.Tensor  # the codebook and 6-bit cases assign theirs against the INT8 grid, below
    if bits == 6 or table is not None:
        levels = torch.arange(-SIX_BIT_LEVELS, SIX_BIT_LEVELS + 1, dtype=torch.float32) if bits == 6 else table
        gs, shifted = _refine_levels(gw, levels, bits)
    elif symmetric:
        gs = (gw.abs().amax(dim=-1, keepdim=True) / 7.0).clamp(min=1e-8)
        signed = (gw / gs).round().clamp(-8, 7).to(torch.int32)
        codes = (signed + 8).view(n, k)
        shifted = signed * gs
        del signed
    else:
        low = gw.amin(dim=-1, keepdim=True)
        gs = ((gw.amax(dim=-1, keepdim=True) - low) / 15.0).clamp(min=1e-8)
        codes = ((gw - low) / gs).round().clamp(0, 15).to(torch.int32).view(n, k)
        shifted = (codes.view(n, groups, g) - 8) * gs
        corr = (8.0 * gs + low).squeeze(-1).to(dtype)
    s_channel = (shifted.abs().amax(dim=(1, 2)) / 127.0).clamp(min=1e-8)
    del shifted
    s_rel = (gs.squeeze(-1) / s_channel.unsqueeze(1)).float().contiguous()
    if scale_dtype != torch.float32:
        s_rel = s_rel.to(scale_dtype).contiguous()
    if levels is not None:
        s_rel, codes = _assign_levels(gw, s_rel, s_channel, levels, bits, search)
    del gw
    packed = pack_6bit(codes) if bits == 6 else pack_nibbles(codes)
    out = (packed, s_rel, s_channel.float().contiguous())
    return out if corr is None else (*out, corr)


def _refine_levels(gw: torch.Tensor, levels: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codebook (A) or 6-bit (D): group scale from the group maximum, then ``ALS_PASSES``
    rounds of nearest-level assignment and least-squares scale.  Returns the group scales
    and the shifted values ``levels[idx] * gs``."""
    amax = gw.abs().amax(dim=-1, keepdim=True)
    if bits == 6:
        gs = (amax / SIX_BIT_LEVELS).clamp(min=1e-8)

        def level_values(normalized):
            # levels[round(x).clamp(-31, 31) + 31] is the rounded value itself; adding 0.0
            # turns round's -0.0 into the table's +0.0
            return normalized.round_().clamp_(-SIX_BIT_LEVELS, SIX_BIT_LEVELS).add_(0.0)
    else:
        gs = amax.clamp(min=1e-8)
        cuts = table_thresholds(levels)
        lookup = cut_lookup(cuts) if cuts is not None else None

        def level_values(normalized):
            if lookup is not None:  # the level itself, gathered where its index would be
                return lookup.lookup(normalized, payloads=(levels,))[0]
            idx = nearest(levels, normalized, dtype=torch.int32)
            return levels.index_select(0, idx.view(-1)).view(idx.shape)

    lv = level_values(gw / gs)
    for _ in range(ALS_PASSES):
        gs = ((gw * lv).sum(-1, keepdim=True) / (lv * lv).sum(-1, keepdim=True).clamp(min=1e-8)).clamp(min=1e-8)
        lv = level_values(gw / gs)
    return gs, lv.mul_(gs)


def _assign_levels(gw, s_rel, s_channel, levels, bits: int, search: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, D) the final nearest-level assignment against the decoded INT8 grid (6-bit after
    the scale search): the stored ``s_rel`` and the codes ``[rows, K]``."""
    n, groups, g = gw.shape
    if bits == 6 and search:
        s_rel, idx = _search_scale(gw, s_rel, s_channel, levels)
    elif s_rel.dtype == E4M3:
        _lv, cuts = grid_by_code(levels)
        target = (gw / s_channel.view(-1, 1, 1)).reshape(n * groups, g)
        idx = grid_nearest_by_code(cuts, s_rel.view(torch.uint8), target, dtype=torch.uint8).view(n, groups, g)
    else:
        idx = _assign_grid(gw, _grid_levels(levels, s_rel), s_channel)
    if bits == 6:
        idx.add_(1)
    return s_rel, idx.view(n, groups * g)
