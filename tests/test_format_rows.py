"""Row splits and joins for the loader (formats/rows.py), on every format of the registry:
which slice of each tensor belongs to each part, read from the slot shapes alone, and the
refusals where a split is not exact (blocked 128-row tiles, tile-packed rows, padding)."""

from __future__ import annotations

import numpy as np
import pytest

from comfyquant.formats.base import Meta
from comfyquant.formats.registry import FORMATS
from comfyquant.formats.rows import join_rows, row_rule, split_rows
from comfyquant.numerics import blocked

N, K = 384, 512


def example(fmt, n=N, k=K, bias_rows=None, extra=None):
    """A header-only layer of ``fmt`` built from its own slots, read back by its geometry."""
    params = fmt.params({"format": fmt.name, **(extra or {})})
    env = dict(
        params,
        N=n,
        K=k,
        N_model=bias_rows or n,
        K_model=k,
        bits=4,
        R=32,
        packed=False,
        variant="",
        has_codebook=False,
        has_correction=False,
        scale_layout="row",
    )
    metas = {}
    for suffix, slot in fmt.slots_for(env).items():
        if not slot.is_forbidden(env) and (slot.required or suffix in ("bias", "weight_correction", "input_scale")):
            metas[suffix] = Meta("BF16" if slot.dtype == "float" else slot.dtype, slot.expected_shape(env))
    got = fmt.geometry(metas, params)
    assert got["N"] == n and got["K"] == k, (fmt.name, got)
    for suffix, meta in metas.items():
        assert fmt.slots_for(got)[suffix].expected_shape(got) == meta.shape, (fmt.name, suffix)
    return got, metas


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_split_and_join_every_format(name):
    fmt = FORMATS[name]
    env, metas = example(fmt)
    parts = split_rows(fmt, env, metas, [128, 256])
    assert not isinstance(parts, str), parts
    assert len(parts) == 2 and all(set(p) == set(metas) for p in parts)
    for suffix, meta in metas.items():
        a, b = parts[0][suffix], parts[1][suffix]
        if a.axis is None:  # shared: both parts hold the whole tensor
            assert a.shape == b.shape == meta.shape
            continue
        assert (a.start, a.stop, b.start, b.stop) == (0, a.stop, a.stop, meta.shape[a.axis])
        assert a.shape[a.axis] + b.shape[b.axis] == meta.shape[a.axis]
    part_envs = [
        fmt.geometry({s: Meta(metas[s].dtype, c.shape) for s, c in p.items()}, fmt.params({"format": name})) for p in parts
    ]
    assert [e["N"] for e in part_envs] == [128, 256]
    rules = join_rows(fmt, part_envs, [{s: Meta(metas[s].dtype, c.shape) for s, c in p.items()} for p in parts])
    assert not isinstance(rules, str), rules
    assert {s: r.axis for s, r in rules.items()} == {s: parts[0][s].axis for s in metas}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_split_off_the_tiles_is_refused_where_a_slot_is_blocked(name):
    fmt = FORMATS[name]
    env, metas = example(fmt)
    result = split_rows(fmt, env, metas, [64, N - 64])
    if any(s.blocked for s in fmt.slots if s.suffix in metas):
        assert isinstance(result, str) and "128-row tiles" in result and "multiples of 128 rows" in result
    elif isinstance(result, str):  # e.g. a format whose rows must be padded to 128 on their own
        assert "not exact" in result or "not a valid" in result
    else:
        assert [p["weight"].shape[0] for p in result if p["weight"].axis == 0] in ([64, N - 64], [])


def test_what_each_slot_follows():
    w4a8 = FORMATS["asym_w4a8_int8"]
    env, _ = example(w4a8, extra={"group_size": 16, "convrot_groupsize": 256})
    slots = w4a8.slots_for(env)
    assert row_rule(slots["weight_correction"], env).axis == 1  # (K // group_size, N)
    assert row_rule(slots["weight_s_rel"], env).axis == 0
    assert row_rule(slots["weight_codebook"], env).axis is None
    nvfp4 = FORMATS["nvfp4"]
    env, _ = example(nvfp4)
    slots = nvfp4.slots_for(env)
    assert row_rule(slots["weight_scale_2"], env).axis is None
    assert row_rule(slots["weight_scale"], env).granularity == 128


def test_tile_packed_rows_split_only_at_128():
    svd = FORMATS["svdquant_w4a4"]
    metas = {
        "weight": Meta("I8", (3, 8, 32, 128)),
        "weight_scale": Meta("BF16", (3, 8, 128)),
        "weight_proj_down": Meta("BF16", (512, 32)),
        "weight_proj_up": Meta("BF16", (3, 32, 128)),
        "weight_smooth_factor": Meta("BF16", (512,)),
    }
    env = svd.geometry(metas, svd.params({"format": svd.name}))
    assert env["packed"] and env["N"] == 384
    refused = split_rows(svd, env, metas, [64, 320])
    assert isinstance(refused, str) and "128 rows per index" in refused
    parts = split_rows(svd, env, metas, [128, 256])
    assert [(p["weight"].start, p["weight"].stop) for p in parts] == [(0, 1), (1, 3)]
    assert parts[1]["weight_proj_down"].axis is None


def test_padded_rows_go_to_the_last_part():
    """NVFP4 stores 384 rows for a model of 376 (bias [376]): the parts split the model's rows,
    the last one carries the padding; a non-last part with padding cannot be joined."""
    fmt = FORMATS["nvfp4"]
    env, metas = example(fmt, bias_rows=376)
    assert env["N_model"] == 376
    parts = split_rows(fmt, env, metas, [128, 248])
    assert not isinstance(parts, str), parts
    assert parts[1]["weight"].shape[0] == 256 and parts[1]["bias"].shape == (248,)
    assert (parts[1]["bias"].start, parts[1]["bias"].stop) == (128, 376)
    assert isinstance(split_rows(fmt, env, metas, [128, 200]), str)  # 328 rows: neither the model's nor the stored
    part_envs = [dict(env, N=256, N_model=248), dict(env, N=128, N_model=128)]
    assert "padding rows" in join_rows(fmt, part_envs, [{"weight": metas["weight"]}] * 2)


def test_nvfp4_part_rows_must_keep_the_16_row_padding():
    fmt = FORMATS["nvfp4"]
    env, metas = example(fmt, n=256)
    metas = {s: m for s, m in metas.items() if s != "weight_scale"}  # leave the blocked rule out
    refused = split_rows(fmt, env, metas, [120, 136])
    assert isinstance(refused, str) and "not a valid nvfp4 layer" in refused and "16" in refused


def test_sections_must_add_up():
    fmt = FORMATS["float8_e4m3fn"]
    env, metas = example(fmt)
    assert "add up to 100" in split_rows(fmt, env, metas, [50, 50])
    assert "positive" in split_rows(fmt, env, metas, [0, N])


def test_blocked_scale_slices_are_the_parts_own_blocked_scales():
    """Cutting stored blocked scales at a 128-row boundary gives exactly the blocked layout of
    each part's logical scales (comfy-kitchen's ``to_blocked`` layout), padding included for the last part."""
    fmt = FORMATS["nvfp4"]
    env, metas = example(fmt, n=320)  # scales: 384 stored rows
    rng = np.random.default_rng(0)
    cols = K // 16
    logical = rng.integers(1, 255, (320, cols), dtype=np.uint8)
    stored = blocked.to_blocked(logical)
    parts = split_rows(fmt, env, metas, [128, 192])
    assert not isinstance(parts, str), parts
    for part, (r0, r1) in zip(parts, [(0, 128), (128, 320)]):
        cut = part["weight_scale"]
        assert np.array_equal(stored[cut.index], blocked.to_blocked(logical[r0:r1]))


def test_a_slot_can_declare_its_row_rule():
    from comfyquant.formats.base import Slot

    env = {"N": 256, "K": 64}
    assert row_rule(Slot("x", "F32", "(N,)"), env).axis == 0
    assert row_rule(Slot("x", "F32", "(N,)", rows="shared"), env).axis is None
    assert row_rule(Slot("x", "F32", "(N, N)"), env).startswith("x: its shape (N, N) does not follow N along one axis")
    assert row_rule(Slot("x", "F32", "(N, N)", rows=1), env).axis == 1
