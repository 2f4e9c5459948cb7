"""The W4A8/W6A8 encoder's fast paths equal their reference definitions bit for bit.

* ``CutLookup.lookup`` with payloads (the level values gathered with the count) equals
  ``payload[row, searchsorted(cuts[row], t)]``, whatever the thread count: checked at 1 and
  2 threads on targets spanning many steps, with NaN,
  +-inf, +-0, subnormals, exact cut values (ties) and rows the lookup cannot count exactly;
* the codebook decision's normalized samples (only the drawn values divided by their group's
  maximum) equal comfy-kitchen's whole-sample division indexed afterwards;
* whole encodes at 1 and 2 threads equal comfy-kitchen's on layers large enough for several
  lookup steps and row blocks, with odd row counts.
"""

from __future__ import annotations

import pytest
import torch

from comfyquant import codecs
from comfyquant.formats.w4a8 import encoder as enc
from comfyquant.numerics import nearest as nr
from kitchen_fixtures import quantize, same_bits

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
    126.5,
    -126.5,
]

PATTERNS = [
    0x7F800001,
    0x7F807FFF,
    0x7F808000,
    0x7FC00000,
    0x7FFFFFFF,
    0xFF800000 - (1 << 32),
    0xFF800001 - (1 << 32),
    0xFF807FFF - (1 << 32),
    0xFFC00000 - (1 << 32),
    0xFFFFFFFF - (1 << 32),
    0x80000001 - (1 << 32),
    0x80007FFF - (1 << 32),
    0x80008000 - (1 << 32),
    0x00007FFF,
    0x00008000,
    0x7F7FFFFF,
    0xFF7FFFFF - (1 << 32),
]
"""F32 bit patterns at the edges of the lookup's bit buckets (``bits >> 15``): NaNs with small
payloads beside +-inf, the signed zeros' and subnormals' buckets, the largest finite values."""


def targets(cuts: torch.Tensor, n: int, scale: float, seed: int) -> torch.Tensor:
    """``n`` targets: Gaussian ones, every cut and its float neighbours, specials, subnormals."""
    gen = torch.Generator().manual_seed(seed)
    c = cuts[torch.isfinite(cuts)].reshape(-1)
    near = torch.cat(
        [
            c,
            torch.nextafter(c, torch.full_like(c, float("inf"))),
            torch.nextafter(c, torch.full_like(c, float("-inf"))),
            torch.tensor(SPECIAL),
            torch.randint(-(1 << 23), 1 << 23, (64,), generator=gen).to(torch.int32).view(torch.float32),
            torch.tensor(PATTERNS, dtype=torch.int64).to(torch.int32).view(torch.float32),
        ]
    )
    t = torch.randn(n, generator=gen) * scale
    at = torch.randint(0, n, (near.numel() * 8,), generator=gen)
    t[at] = near.repeat(8)
    return t


def test_payload_lookup_equals_the_gathered_searchsorted(threads):
    book = torch.tensor(enc.FIXED_CODEBOOK)
    cuts = nr.table_thresholds(book)
    t = targets(cuts, 5 * nr._STEP + 77, 0.5, seed=1)  # several steps, a short last step
    lookup = nr.cut_lookup(cuts)
    count, levels = lookup.lookup(t, payloads=(None, book))
    expected = torch.searchsorted(cuts, t)
    assert torch.equal(count.long(), expected)
    assert same_bits(levels, book[expected])
    shaped = t[: (t.numel() // 3) * 3].view(3, -1)  # any target shape
    assert same_bits(lookup.lookup(shaped, payloads=(book,))[0], book[torch.searchsorted(cuts, shaped)])


@pytest.mark.parametrize("table", ["codebook", "six_bit"])
def test_payload_row_lookup_equals_the_gathered_searchsorted(threads, table):
    """The per-FP8-byte grids (the final assignment and the 6-bit scale search): every byte,
    NaN bytes and negative scales (descending grids, the binary search's own answer) included."""
    levels_table = torch.tensor(enc.FIXED_CODEBOOK) if table == "codebook" else torch.arange(-31, 32).float()
    levels, cuts = nr.grid_by_code(levels_table)
    gen = torch.Generator().manual_seed(2)
    rows = 3 * nr._STEP // 16 + 5
    codes = torch.randint(0, 256, (rows,), generator=gen).to(torch.uint8)
    codes[: rows // 2] = torch.randint(96, 120, (rows // 2,), generator=gen).to(torch.uint8)  # typical s_rel bytes
    t = targets(cuts, rows * 16, 60.0, seed=3).view(rows, 16)
    count, chosen = nr.cut_lookup(cuts).lookup(t, codes, payloads=(None, levels))
    c = cuts.index_select(0, codes.int())
    expected = torch.searchsorted(c, t.contiguous())
    assert torch.equal(count.long(), expected)
    assert same_bits(chosen, torch.gather(levels.index_select(0, codes.int()), 1, expected))


def test_lookup_does_not_depend_on_the_thread_count():
    cuts = nr.table_thresholds(torch.tensor(enc.FIXED_CODEBOOK))
    t = targets(cuts, 7 * nr._STEP + 3, 0.5, seed=4)
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(nr.cut_lookup(cuts).lookup(t)[0])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("g", [4, 16, 32])
def test_normalized_samples_equal_the_whole_division(g):
    gen = torch.Generator().manual_seed(g)
    rotated = (torch.randn(77, 512, generator=gen) * 0.02).to(torch.bfloat16)
    flat = rotated.view(-1)
    flat[:g] = 0.0  # a zero group: divided by the 1e-8 floor
    flat[g : 2 * g] = -0.0
    flat[5 * g + 1] = float("nan")
    flat[7 * g + 2] = float("inf")
    flat[9 * g + 3] = float("-inf")
    flat[11 * g : 12 * g] = torch.tensor(1e-40).to(torch.bfloat16)  # subnormal BF16 values
    flat[13 * g + 4] = 2**-130
    index = torch.cat([torch.arange(20 * g), torch.randint(0, flat.numel(), (5000,), generator=gen)])
    whole = rotated.float().view(77, -1, g)
    expected = (whole / whole.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8)).flatten()[index]
    assert same_bits(enc._normalized_at(rotated, g, index), expected)


@pytest.mark.parametrize("variant,bits", [("w4a8_codebook", 4), ("w6a8", 6)])
def test_encode_matches_kitchen_at_any_thread_count(threads, variant, bits):
    """A layer of several row blocks and lookup steps, with an odd row count, encoded at 1 and
    2 threads: comfy-kitchen's bits either way."""
    gen = torch.Generator().manual_seed(9)
    w = (torch.randn(333, 768, generator=gen) * 0.02).to(torch.bfloat16)
    w[7, :16] = 0.0  # an all-zero group
    w[8, 3] = 1e-39  # a subnormal weight
    ours = codecs.get("asym_w4a8_int8").encode(w, bits=bits)
    ref = quantize(variant, w)
    assert all(same_bits(ours[s], ref[s]) for s in ref)


@pytest.mark.parametrize("variant,bits", [("w4a8_codebook", 4), ("w6a8", 6)])
def test_blocks_encoded_side_by_side_are_kitchens_bits(monkeypatch, variant, bits):
    """The per-block search is many small operations that each run on one core; with two
    torch threads the encoder computes two row blocks at once in threads of its own.  Every
    block is still computed from its own rows alone: comfy-kitchen's bits, in order."""
    import threading

    from comfyquant.numerics import rows

    monkeypatch.setattr(rows, "encode_block_elements", lambda: 32 * 768)  # 11 blocks of 32 rows
    seen: set[str] = set()
    quantize_rotated = enc._quantize_rotated

    def recorded(*args):
        seen.add(threading.current_thread().name)
        return quantize_rotated(*args)

    monkeypatch.setattr(enc, "_quantize_rotated", recorded)
    gen = torch.Generator().manual_seed(11)
    w = (torch.randn(333, 768, generator=gen) * 0.02).to(torch.bfloat16)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ours = codecs.get("asym_w4a8_int8").encode(w, bits=bits)
    finally:
        torch.set_num_threads(before)
    assert seen and all(name.startswith("comfyquant-rows") for name in seen)  # not in the caller's thread
    ref = quantize(variant, w)
    assert all(same_bits(ours[s], ref[s]) for s in ref)
    assert not [t for t in threading.enumerate() if t.name.startswith("comfyquant-rows")]  # the pool is gone


def test_an_error_in_a_block_computed_aside_is_raised_and_leaves_no_thread():
    """A failing block's exception reaches the caller (the first in block order), blocks
    not started are dropped, and no worker thread outlives the call."""
    import threading

    from comfyquant.numerics.rows import gather_rows

    def fn(block):
        if int(block[0, 0]) == 3:
            raise ValueError("block 3")
        return (block * 2,)

    blocks = [(i, i + 1, torch.full((1, 4), float(i))) for i in range(8)]
    with pytest.raises(ValueError, match="block 3"):
        gather_rows(iter(blocks), fn, 8, workers=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("comfyquant-rows")]
    (out,) = gather_rows(iter(blocks[:3]), fn, 3, workers=2)
    assert torch.equal(out, torch.tensor([[0.0] * 4, [2.0] * 4, [4.0] * 4]))
