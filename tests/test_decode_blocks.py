"""Decoders in row blocks: any block size, any output dtype, 1 or 2 threads, the same bits as
one block and as comfy-kitchen 0.2.40; large outputs on huge pages.

The shapes are odd on purpose: row counts that leave a short tail block (fewer rows than
``min_rows``), and for the padded formats (NVFP4, MXFP8) model
shapes that are not multiples of their 16/32 blocks."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.svdquant_w4a4 import TensorCoreSVDQuantW4A4Layout

from comfyquant import codecs
from comfyquant.formats.codec import CodecError
from comfyquant.numerics import pages, rows
from comfyquant.numerics.packing import lookup_pairs, pair_table
from comfyquant.numerics.rows import materialize, row_ranges
from kitchen_fixtures import VARIANTS, same_bits
from test_codecs_vs_kitchen import DTYPES, ENCODE_ARGS, awq_layer, kitchen_qtensor, svdquant_tensors, weight

# (variant, N, K): rotated formats need K a multiple of 256 (64 for W4A4's groups)
SHAPES = {
    "fp8": (203, 200),
    "fp8_e5m2": (203, 200),
    "int8_scalar": (203, 200),
    "int8_rowwise": (203, 200),
    "int8_convrot": (203, 512),
    "w4a8_codebook": (203, 512),
    "w4a8_uniform": (203, 512),
    "w4a8_asym": (203, 512),
    "w6a8": (203, 512),
    "w4a4": (203, 512),
    "nvfp4": (203, 200),
    "mxfp8": (203, 200),
}
BLOCKS = (1 << 24, 16 * 512, 5000)
"""One block for the whole layer, blocks of 16 rows (at K=512), and blocks whose size is
no multiple of anything (with K=200: 25 rows, a 3-row tail)."""


def _decodes(codec, tensors, marker, dtype) -> list[torch.Tensor]:
    """decode at every block size, iter_decode's blocks (one reused buffer) joined, decode
    into a given buffer (``out=``), and a row source's rows written into a destination block
    by block (``rows_into``, what materialize does)."""
    out = [codec.decode(tensors, marker, dtype=dtype, block_elements=b) for b in BLOCKS]
    for b in BLOCKS:
        out.append(torch.cat([x.clone() for x in codec.iter_decode(tensors, marker, dtype=dtype, block_elements=b)]))
    shape = tuple(out[0].shape)
    for b in BLOCKS:
        buf = torch.full(shape, float("nan"), dtype=dtype)
        assert codec.decode(tensors, marker, dtype=dtype, block_elements=b, out=buf) is buf
        out.append(buf)
    source = codec.row_source(tensors, marker, dtype=dtype)
    for b in BLOCKS:
        dest = torch.full(shape, float("nan"), dtype=dtype)
        for r0, r1 in row_ranges(shape[0], shape[1], b):
            source.rows_into(r0, r1, dest[r0:r1])
        out.append(dest)
    return out


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("variant", list(SHAPES))
def test_blocked_decode_equals_one_block_and_kitchen(variant, dtype_name, threads):
    dtype = DTYPES[dtype_name]
    n, k = SHAPES[variant]
    w = weight("gauss", n, k, dtype, seed=23)
    q = kitchen_qtensor(variant, w)
    ref = {s: v.contiguous() for s, v in q.state_dict("weight").items()}
    codec = codecs.get(VARIANTS[variant].format)
    marker = codec.encode(w, **ENCODE_ARGS[variant]).marker
    if variant in ("nvfp4", "mxfp8"):  # padded storage: the model shape from the bias (and K as the runtimes learn it)
        ref["bias"] = torch.zeros(n, dtype=dtype)
        if variant == "nvfp4":
            ref["pre_quant_scale"] = torch.ones(k, dtype=dtype)
        else:
            marker = dict(marker, orig_shape=[n, k])
    expected = q.dequantize()
    assert expected.dtype == dtype and tuple(expected.shape) == (n, k)
    for got in _decodes(codec, ref, marker, dtype):
        assert same_bits(got, expected)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_blocked_awq_decode_equals_kitchen(dtype_name, threads):
    dtype = DTYPES[dtype_name]
    n, k, g = 203, 256, 64
    t, q = awq_layer(dtype, n, k, g, torch.Generator().manual_seed(31))
    expected = q.dequantize()
    for got in _decodes(codecs.get("awq_w4a16"), t, {"format": "awq_w4a16", "group_size": g}, dtype):
        assert same_bits(got, expected)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_blocked_svdquant_decode_equals_kitchen(dtype_name, threads):
    dtype = DTYPES[dtype_name]
    n, k = 384, 320  # three 128-row tiles; K not a multiple of 256 (the low-rank GEMM's padding)
    t = svdquant_tensors(dtype, n, k, seed=9)
    params = TensorCoreSVDQuantW4A4Layout.Params(
        scale=t["weight_scale"],
        orig_dtype=dtype,
        orig_shape=(n, k),
        proj_down=t["weight_proj_down"],
        proj_up=t["weight_proj_up"],
        smooth_factor=t["weight_smooth_factor"],
        act_unsigned=False,
    )
    expected = QuantizedTensor(t["weight"], "TensorCoreSVDQuantW4A4Layout", params).dequantize()
    for got in _decodes(codecs.get("svdquant_w4a4"), t, {"format": "svdquant_w4a4"}, dtype):
        assert same_bits(got, expected)


def _vm_flags(address: int) -> list[str] | None:
    """The VmFlags of the mapping holding ``address`` in this process (None: no smaps)."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


def _thp_available() -> bool:
    try:
        setting = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False
    return "[never]" not in setting


@pytest.mark.skipif(not (os.path.exists("/proc/self/smaps") and _thp_available()), reason="needs Linux with THP")
def test_large_decoded_output_is_advised_onto_huge_pages():
    """A decoded output above glibc's mmap threshold is a fresh mapping; faulting it in 4 KiB
    pages cost as much as the FP8 decode itself (0.68x per byte at 5120x13824 vs 3072x3072).
    The decoder asks for huge pages before writing it; the values are the same."""
    n, k = 3072, 3072  # F32 output: 37.7 MB, above the 32 MiB threshold
    w = weight("gauss", n, k, torch.bfloat16, seed=5)
    q = kitchen_qtensor("fp8", w)
    ref = {s: v.contiguous() for s, v in q.state_dict("weight").items()}
    codec = codecs.get("float8_e4m3fn")
    dense = codec.decode(ref, {"format": "float8_e4m3fn"}, dtype=torch.float32)
    assert dense.nbytes > pages.LARGE_BYTES
    inner = -(-dense.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE  # the advised interior starts here
    assert "hg" in (_vm_flags(inner) or [])
    assert same_bits(dense, ref["weight"].to(torch.float32) * ref["weight_scale"])  # comfy-kitchen's formula in F32
    # below the threshold nothing is advised (glibc may reuse heap memory for it)
    small = pages.empty_output((1024, 1024), torch.float32)
    assert not pages.advise_huge(small)


@pytest.mark.skipif(not (os.path.exists("/proc/self/smaps") and _thp_available()), reason="needs Linux with THP")
def test_whole_layer_product_and_its_rounding_are_advised_onto_huge_pages(monkeypatch):
    """A layer un-rotated by one F32 GEMM (INT8 ConvRot) gets its product, and the layer
    rounded whole to BF16 (``round_whole``), on huge pages: both are fresh layer-sized
    mappings, and faulting the product in 4 KiB pages cost 150k faults per dequantize pass
    of the bench's mixed file.  The GEMM is the same call (it writes into a given buffer) and
    the bits stay comfy-kitchen's."""
    from comfyquant.numerics import hadamard

    n, k = 3072, 3328  # BF16 output 20 MB; the F32 product 41 MB, above the 32 MiB threshold
    w = weight("gauss", n, k, torch.bfloat16, seed=8)
    q = kitchen_qtensor("int8_convrot", w)
    ref = {s: v.contiguous() for s, v in q.state_dict("weight").items()}
    codec = codecs.get("int8_tensorwise")
    marker = codec.encode(w, **ENCODE_ARGS["int8_convrot"]).marker
    products, real = [], hadamard.rotate_weight

    def seen(weight, size, out=None):
        got = real(weight, size, out)
        inner = -(-got.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE
        products.append((got.nbytes, _vm_flags(inner) or []))
        return got

    monkeypatch.setattr(hadamard, "rotate_weight", seen)
    expected = q.dequantize()
    assert same_bits(codec.decode(ref, marker), expected)
    for whole in (False, True):
        blocks = [b.clone() for b in codec.iter_decode(ref, marker, round_whole=whole)]
        assert same_bits(torch.cat(blocks), expected)
    assert len(products) == 3 and all(size > pages.LARGE_BYTES and "hg" in flags for size, flags in products)
    monkeypatch.setattr(pages, "LARGE_BYTES", 16 << 20)  # the rounded BF16 layer (20 MB) counts as large too
    blocks = list(codec.iter_decode(ref, marker, round_whole=True))
    base = blocks[0].untyped_storage()
    assert all(b.untyped_storage().data_ptr() == base.data_ptr() for b in blocks)  # slices of one rounded layer
    assert "hg" in (_vm_flags(-(-base.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE) or [])
    assert same_bits(torch.cat(blocks), expected)


@pytest.mark.skipif(not (os.path.exists("/proc/self/smaps") and _thp_available()), reason="needs Linux with THP")
def test_read_buffer_and_streamed_block_buffers_are_advised_onto_huge_pages():
    """dequantize's read buffer (a layer's packed tensors, 100 MB here and there) and a
    streaming consumer's block buffers are fresh memory every run or layer; faulting them in
    4 KiB pages was 80k page faults per dequantize of the bench's mixed file.  The read buffer
    is a private mapping (a shared anonymous one is shmem, which gets no huge pages)."""
    import ctypes

    buf = pages.byte_buffer(pages.LARGE_BYTES + (4 << 20))
    at = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    flags = _vm_flags(-(-at // pages.HUGE_PAGE) * pages.HUGE_PAGE) or []
    assert "hg" in flags and "sh" not in flags and "wr" in flags
    memoryview(buf)[:8] = b"12345678"
    assert bytes(buf[:8]) == b"12345678"
    with pytest.raises(MemoryError):  # as a bytearray fails: the command line says "out of memory"
        pages.byte_buffer(1 << 62)

    codec = codecs.get("float8_e4m3fn")
    w = weight("gauss", 4096, 2048, torch.bfloat16, seed=3)
    enc = codec.encode(w)
    blocks = list(codec.iter_decode(enc, enc.marker, block_elements=1 << 20, buffers=3))
    storages = {b.untyped_storage().data_ptr() for b in blocks}
    assert len(storages) == 1  # the three turns are slices of one allocation
    base = blocks[0].untyped_storage()
    assert base.nbytes() == 3 * (1 << 20) * 2
    assert "hg" in (_vm_flags(-(-base.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE) or [])
    turns = [b.clone() for b in codec.iter_decode(enc, enc.marker, block_elements=1 << 20, buffers=3)]
    assert same_bits(torch.cat(turns), codec.decode(enc, enc.marker))


def test_within_reused_outputs_a_large_output_takes_memory_no_tensor_uses_any_more():
    """Fresh memory is faulted in and zeroed by the kernel at its first touch (here: as long
    as the F32 GEMM of a whole-layer un-rotation).  Within ``reused_outputs`` a large output
    takes the memory of an earlier one -- only once nothing uses it: not while a view, a
    NumPy array or a memoryview of it lives; never outside the scope."""
    shape = (1024, 9000)  # F32: 36.9 MB, above the 32 MiB threshold
    probes = []  # kept alive: each probe takes memory of its own

    def probe(dtype=torch.float32) -> int:
        probes.append(pages.empty_output(shape, dtype))
        return probes[-1].data_ptr()

    with pages.reused_outputs():
        pool = pages._REUSE
        a = pages.empty_output(shape, torch.float32)
        taken = a.data_ptr()
        assert probe() != taken
        view = a[1:]
        del a
        assert probe() != taken  # the view still uses it
        array = view.numpy()
        del view
        assert probe() != taken
        mv = memoryview(array)
        del array
        assert probe() != taken
        del mv
        assert probe(torch.bfloat16) != taken  # half the size: would waste half of it
        assert pool.reused == 0
        d = pages.empty_output(shape, torch.int32)
        assert d.data_ptr() == taken and tuple(d.shape) == shape and d.dtype == torch.int32
        assert pool.reused == d.nbytes
        assert sum(buf.numel() for buf, _ in pool._held) <= pool._peak  # never more than used at once
        with pages.reused_outputs():  # nested: the same pool
            assert pages._REUSE is pool
        del d
    assert pages._REUSE is None  # released with the scope
    e = pages.empty_output(shape, torch.float32)
    assert e.data_ptr() not in {t.data_ptr() for t in probes}  # they live: nothing is handed out twice
    del e
    assert pages._REUSE is None


def test_reused_outputs_holds_no_more_than_its_outputs_used_at_once():
    """A buffer freed for reuse is kept only while the memory held stays within the most
    the scope's outputs ever used at once: a command's peak memory is what it was without
    reuse."""
    mib = 1 << 20
    with pages.reused_outputs():
        pool = pages._REUSE
        a = pages.empty_output((48 * mib,), torch.uint8)
        b = pages.empty_output((48 * mib,), torch.uint8)
        del a, b  # peak 96 MiB in use; both kept
        assert sum(buf.numel() for buf, _ in pool._held) == 96 * mib
        c = pages.empty_output((100 * mib,), torch.uint8)  # fits neither: both freed ones go
        assert sum(buf.numel() for buf, _ in pool._held) == 100 * mib
        del c
        d = pages.empty_output((90 * mib,), torch.uint8)  # within a quarter of 100 MiB: reused
        assert pool.reused == 90 * mib and sum(buf.numel() for buf, _ in pool._held) == 100 * mib
        del d


def test_reused_outputs_without_torchs_count_of_users_reuses_nothing(monkeypatch):
    """Whether memory is free is torch's count of its storage's users (a private function):
    with a torch that lacks it, the scope hands out fresh memory as before."""
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    assert not pages._counts_users()
    with pages.reused_outputs():
        assert pages._REUSE is None  # no pool: empty_output is torch.empty as outside the scope
        b = pages.empty_output((1024, 9000), torch.float32)
        assert tuple(b.shape) == (1024, 9000) and b.dtype == torch.float32 and b.is_contiguous()


@pytest.fixture
def spare(monkeypatch):
    """Small test layers (above 64 KiB) count as large; no result memory kept before or after."""
    monkeypatch.setattr(pages, "LARGE_BYTES", 64 << 10)
    pages.release_spare()
    yield
    pages.release_spare()


def _fresh_decode(codec, enc, dtype=torch.bfloat16) -> torch.Tensor:
    """The reference bits: decoded into memory of the test's own (``out=``)."""
    n, k = codec.plan(enc, enc.marker).shape
    return codec.decode(enc, enc.marker, dtype=dtype, out=torch.empty((n, k), dtype=dtype))


def test_a_large_result_reuses_the_last_ones_memory_once_nothing_uses_it(spare):
    """decode() of a large layer into fresh memory paid the kernel's faulting and zeroing of
    every page (on this VM more than an FP8 decode's arithmetic); the memory of the last large
    result is kept and a later result takes it -- only once no tensor, view, NumPy array or
    memoryview uses it, and only when its size fits."""
    codec = codecs.get("float8_e4m3fn")
    enc_a = codec.encode(weight("gauss", 4096, 2048, torch.bfloat16, seed=5))  # 16 MiB of BF16
    enc_b = codec.encode(weight("gauss", 4096, 2048, torch.bfloat16, seed=6))
    ref_a, ref_b = _fresh_decode(codec, enc_a), _fresh_decode(codec, enc_b)
    a = codec.decode(enc_a, enc_a.marker)
    kept = a.data_ptr()
    assert same_bits(a, ref_a)
    del a
    b = codec.decode(enc_b, enc_b.marker)
    assert b.data_ptr() == kept and same_bits(b, ref_b)  # the dropped result's memory, new values
    c = codec.decode(enc_a, enc_a.marker)  # b is in use: new memory, b untouched
    assert c.data_ptr() != kept and same_bits(b, ref_b) and same_bits(c, ref_a)
    assert len(pages._SPARE) == 1  # one buffer kept, never more
    del b  # no longer referenced by the module either: freed
    kept = c.data_ptr()
    holders = []
    encs, refs, last = (enc_a, enc_b), (ref_a, ref_b), 0
    for hold in (lambda t: t[1:], lambda t: t.view(torch.int16).numpy(), lambda t: memoryview(t.view(torch.int16).numpy())):
        holders.append((hold(c), refs[last]))
        del c
        last = 1 - last
        c = codec.decode(encs[last], encs[last].marker)
        assert c.data_ptr() != kept and same_bits(c, refs[last])  # a view of the last result holds it
        kept = c.data_ptr()
    for holder, ref in holders:  # and each still shows its own result's values
        assert np.array_equal(
            np.asarray(holder if not isinstance(holder, torch.Tensor) else holder.view(torch.int16)).reshape(-1)[-512:],
            ref.view(torch.int16).reshape(-1)[-512:].numpy(),
        )
    half = codec.encode(weight("gauss", 2048, 2048, torch.bfloat16, seed=7))
    del c
    d = codec.decode(half, half.marker)  # half the size: it would waste half the memory
    assert same_bits(d, _fresh_decode(codec, half))
    assert len(pages._SPARE) == 1 and pages._SPARE[0][0].numel() == 8 << 20  # the idle 16 MiB went
    assert codecs.release_memory() == -(-d.nbytes // pages.HUGE_PAGE) * pages.HUGE_PAGE  # the public name
    assert pages.release_spare() == 0 and same_bits(d, _fresh_decode(codec, half))  # d stays valid


def test_a_materialized_row_source_and_a_scope_share_the_rule(spare, reuse_pools):
    """materialize (convert's and quantize's read of a quantized layer) hands out a result
    too; inside ``reused_outputs`` the scope's pool serves and the kept memory is left alone."""
    codec = codecs.get("int8_tensorwise")
    enc = codec.encode(weight("gauss", 512, 512, torch.bfloat16, seed=8), per_channel=True)
    ref = _fresh_decode(codec, enc)
    a = materialize(codec.row_source(enc, enc.marker))
    kept = a.data_ptr()
    del a
    b = materialize(codec.row_source(enc, enc.marker))
    assert b.data_ptr() == kept and same_bits(b, ref)
    del b
    with pages.reused_outputs():
        c = codec.decode(enc, enc.marker)
        assert c.data_ptr() != kept and same_bits(c, ref)
        del c
        d = codec.decode(enc, enc.marker)
        assert reuse_pools[-1].reused == d.nbytes and same_bits(d, ref)
        del d
    assert pages._SPARE and pages._SPARE[0][0].data_ptr() == kept  # untouched by the scope


def test_results_decoded_in_two_threads_never_share_memory(spare):
    """Two threads decoding layer after layer, each holding its last result while it decodes
    the next: every result keeps its own bits (the kept memory is handed out under a lock)."""
    import threading

    codec = codecs.get("float8_e4m3fn")
    encs = [codec.encode(weight("gauss", 512, 512, torch.bfloat16, seed=s)) for s in (9, 10)]
    refs = [_fresh_decode(codec, e) for e in encs]
    bad: list[str] = []

    def run(i: int) -> None:
        last = None
        for step in range(40):
            j = (i + step) % 2
            now = codec.decode(encs[j], encs[j].marker)
            if last is not None and not same_bits(last[1], refs[last[0]]):
                bad.append(f"thread {i} step {step}")
            last = (j, now)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_without_torchs_count_of_users_no_result_memory_is_kept(spare, monkeypatch):
    """With a torch that does not count a storage's users, every result is fresh memory."""
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    monkeypatch.setattr(pages, "_USER_COUNT", [])
    codec = codecs.get("float8_e4m3fn")
    enc = codec.encode(weight("gauss", 512, 512, torch.bfloat16, seed=5))
    a = codec.decode(enc, enc.marker)
    assert same_bits(a, _fresh_decode(codec, enc)) and not pages._SPARE


def test_empty_output_without_madvise_is_a_plain_tensor(monkeypatch):
    """Where there is no madvise (not Linux), the output is an ordinary tensor (and a read
    buffer an ordinary bytearray: Windows' mmap has no private anonymous mappings)."""
    monkeypatch.setattr(pages, "_MADVISE", False)
    buf = pages.byte_buffer(1 << 20)
    assert isinstance(buf, bytearray) and len(buf) == 1 << 20
    t = pages.empty_output((4096, 4097), torch.bfloat16)
    assert tuple(t.shape) == (4096, 4097) and t.dtype == torch.bfloat16
    assert not pages.advise_huge(t)


@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
def test_w4a8_whole_layer_operand_is_built_in_row_blocks(monkeypatch, dtype_name):
    """A W4A8 layer un-rotated whole (here: with a correction) gets its GEMM operand filled
    in row blocks of the output dtype: no F32 copy of the layer (283 MB at 5120x13824 beside
    the operand); the one GEMM and the bits stay comfy-kitchen's."""
    from comfyquant.formats.w4a8.codec import W4A8Codec
    from comfyquant.numerics import assemble

    dtype = DTYPES[dtype_name]
    n, k = 600, 512
    w = weight("gauss", n, k, dtype, seed=8)
    q = kitchen_qtensor("w4a8_asym", w)
    ref = {s: v.contiguous() for s, v in q.state_dict("weight").items()}
    codec = codecs.get("asym_w4a8_int8")
    marker = codec.encode(w, **ENCODE_ARGS["w4a8_asym"]).marker
    assert codec._whole_layer(codec.plan(ref, marker).env, dtype, ref)
    spans = []
    rotated = W4A8Codec._rotated

    def recording(self, t, env, r0, r1, table, d):
        spans.append((r0, r1))
        return rotated(self, t, env, r0, r1, table, d)

    monkeypatch.setattr(W4A8Codec, "_rotated", recording)
    dense = codec.decode(ref, marker, dtype=dtype)
    assert same_bits(dense, q.dequantize())
    block_rows = assemble.OPERAND_BLOCK_ELEMENTS // k
    assert len(spans) == -(-n // block_rows) and max(r1 - r0 for r0, r1 in spans) == block_rows


@pytest.mark.parametrize("variant", ["fp8", "int8_convrot", "w4a8_codebook", "nvfp4"])
def test_iter_decode_blocks_stay_valid_across_their_buffers(variant):
    """With ``buffers`` block buffers a block stays valid while the next ``buffers - 1`` are
    made (dequantize writes one block while the next is decoded); with one, as before, the
    next block overwrites it."""
    n, k = 600, SHAPES[variant][1]
    w = weight("gauss", n, k, torch.bfloat16, seed=3)
    codec = codecs.get(VARIANTS[variant].format)
    enc = codec.encode(w, **ENCODE_ARGS[variant])
    whole = codec.decode(enc, enc.marker)
    block = 16 * k
    count = len(list(codec.iter_decode(enc, enc.marker, block_elements=block)))
    assert count >= 4
    held = list(codec.iter_decode(enc, enc.marker, block_elements=block, buffers=count))
    assert same_bits(torch.cat(held), whole)
    window = []
    for b in codec.iter_decode(enc, enc.marker, block_elements=block, buffers=3):
        window.append((b, b.clone()))
        window = window[-3:]
        assert all(same_bits(view, copy) for view, copy in window)  # the last three are intact


def test_decoded_ahead_keeps_order_and_runs_in_a_worker():
    import threading

    from comfyquant.dequantizer import decoded_ahead

    where = []

    def produce():
        for i in range(20):
            where.append(threading.current_thread() is threading.main_thread())
            yield i

    assert list(decoded_ahead(produce(), 1)) == list(range(20))
    assert where and not any(where)


def test_decoded_ahead_raises_the_producers_error_at_its_place():
    from comfyquant.dequantizer import decoded_ahead
    from comfyquant.formats.codec import CodecError

    def produce():
        yield 1
        yield 2
        raise CodecError("blocks.3.ff: bad scale")

    got = []
    with pytest.raises(CodecError, match="bad scale"):
        for item in decoded_ahead(produce(), 1):
            got.append(item)
    assert got == [1, 2]


def test_decoded_ahead_stops_its_worker_when_the_consumer_stops():
    import threading

    from comfyquant.dequantizer import decoded_ahead

    made = []

    def produce():
        for i in range(1000):
            made.append(i)
            yield i

    before = threading.active_count()
    it = decoded_ahead(produce(), 1)
    assert next(it) == 0
    it.close()  # the consumer gives up (a write failed)
    assert threading.active_count() == before
    assert len(made) <= 3  # the worker went at most the queue and one block ahead


@pytest.mark.parametrize("scale", [1.0, 3e-4, 2.0**-130, 1e-38, 7.5, 2.0**7, 1e30])
def test_e4m3_widening_equals_torchs_cast_and_multiply_for_every_code(scale):
    """The three-pass E4M3 -> BF16 path (numerics/fp8_widen.py) against ``q.to(bf16) *
    scale.to(bf16)`` for all 254 non-NaN codes, scales whose products are subnormal or large;
    a factor that would overflow BF16 (1e30 * 2^120) leaves the layer to the general path."""
    from comfyquant.numerics.fp8_widen import folded_scale, widen_e4m3_scaled

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn).reshape(2, 127)
    s = torch.tensor(scale, dtype=torch.float32)
    expected = codes.to(torch.bfloat16) * s.to(torch.bfloat16)
    folded = folded_scale(codes, s, torch.bfloat16)
    if scale == 1e30:
        assert folded is None
    else:
        assert same_bits(widen_e4m3_scaled(codes, folded), expected)
    t = {"weight": codes, "weight_scale": s}
    assert same_bits(codecs.get("float8_e4m3fn").decode(t, {"format": "float8_e4m3fn"}, dtype=torch.bfloat16), expected)


@pytest.mark.parametrize("nan", [0x7F, 0xFF])
def test_fp8_layer_with_nan_codes_decodes_like_torch(nan):
    from comfyquant.numerics.fp8_widen import folded_scale

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].reshape(2, 127).clone()
    codes[1, 5] = nan
    q = codes.view(torch.float8_e4m3fn)
    s = torch.tensor(0.01)
    assert folded_scale(q, s, torch.bfloat16) is None
    got = codecs.get("float8_e4m3fn").decode({"weight": q, "weight_scale": s}, {"format": "float8_e4m3fn"}, dtype=torch.bfloat16)
    assert same_bits(got, q.to(torch.bfloat16) * s.to(torch.bfloat16))


@pytest.mark.parametrize("nan", [0x7F, 0xFF])
def test_fp8_nan_codes_in_one_row_block_decode_like_torch(nan):
    """NaN codes are looked for per row block (numerics/fp8_widen.has_nan_codes): a layer
    whose one block holds one decodes that block by the general path and the others by the
    bit path, every block the bits of ``q.to(bf16) * scale.to(bf16)`` (comfy-kitchen's)."""
    w = weight("gauss", 256, 200, torch.bfloat16, seed=6)
    codec = codecs.get("float8_e4m3fn")
    enc = codec.encode(w)
    q = enc["weight"].clone()
    q.view(torch.uint8)[130, 7] = nan
    t = {"weight": q, "weight_scale": enc["weight_scale"]}
    expected = q.to(torch.bfloat16) * enc["weight_scale"].to(torch.bfloat16)
    for b in BLOCKS:
        assert same_bits(codec.decode(t, enc.marker, dtype=torch.bfloat16, block_elements=b), expected)
        got = torch.cat([x.clone() for x in codec.iter_decode(t, enc.marker, dtype=torch.bfloat16, block_elements=b)])
        assert same_bits(got, expected)


@pytest.mark.parametrize("case", ["every code", "a NaN code", "a scale over 2^7", "an infinite scale"])
def test_mxfp8_bit_path_equals_kitchen_for_every_code_and_scale(case, monkeypatch):
    """MXFP8 to BF16 by the per-tensor FP8 bit path with a factor per block: all 254 non-NaN
    codes under every block scale from 0 (E8M0 0) and 2^-126 to 2^7 give comfy-kitchen's bits
    (its ``dequantize_mxfp8``: F32 products, one cast); a block with a NaN code, or a layer
    with a scale whose factor would overflow BF16 (over 2^7, or E8M0 255: infinite), takes the
    general path -- the same bits either way."""
    from comfy_kitchen.backends.eager.quantization import dequantize_mxfp8

    import comfyquant.formats.mxfp8.codec as mx
    from comfyquant.numerics.blocked import to_blocked

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # 254 codes
    n, k = 128, 256
    q = codes.repeat(n * k // 254 + 1)[: n * k].reshape(n, k).clone()
    e = torch.arange(n * k // 32, dtype=torch.int32).remainder(135).to(torch.uint8).reshape(n, k // 32)  # 0 .. 2^7
    if case == "a NaN code":
        q[40, 9] = 0xFF
    elif case == "a scale over 2^7":
        e[5, 2] = 135
    elif case == "an infinite scale":
        e[5, 2] = 0xFF
    q = q.view(torch.float8_e4m3fn)
    scale = to_blocked(e).view(torch.float8_e8m0fnu)
    expected = dequantize_mxfp8(q, scale, torch.bfloat16)
    used = []
    real = mx.widen_e4m3_scaled
    monkeypatch.setattr(mx, "widen_e4m3_scaled", lambda *a: used.append(1) or real(*a))
    codec = codecs.get("mxfp8")
    for b in (1 << 20, 16 * k):
        got = codec.decode({"weight": q, "weight_scale": scale}, {"format": "mxfp8"}, dtype=torch.bfloat16, block_elements=b)
        assert same_bits(got, expected), b
    assert bool(used) == (case in ("every code", "a NaN code"))


def test_nvfp4_packed_weight_decode_equals_the_unpacked_codes():
    """The emulated NVFP4 GEMM decodes its weight a byte (two E2M1 values) per gather: every
    byte value, odd scales (subnormal, zero, NaN-free E4M3 range) and signed zeros give the
    same F32 bits as unpacking the codes and indexing the 16-value table."""
    from comfyquant.formats.nvfp4.codec import dequantize_f32, dequantize_packed_f32
    from comfyquant.numerics.packing import HNF, unpack_nibbles

    g = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (48, 64), dtype=torch.uint8, generator=g)
    packed.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    scales = (torch.rand(48, 128 // 16, generator=g) * 448).to(torch.float8_e4m3fn)
    scales[0, 0] = 0.0
    scales[1, 1] = torch.tensor(2.0**-9).to(torch.float8_e4m3fn)  # the smallest E4M3 subnormal
    for ts in (torch.tensor(0.0123), torch.tensor(1.0), torch.tensor(3.0e-6)):
        want = dequantize_f32(unpack_nibbles(packed, HNF), scales, ts)
        got = dequantize_packed_f32(packed, scales, ts)
        assert torch.equal(want.view(torch.int32), got.view(torch.int32))


@pytest.mark.parametrize("variant", ["fp8", "mxfp8", "nvfp4", "w4a8_codebook", "int8_rowwise"])
def test_row_source_prepares_its_layer_once(monkeypatch, variant):
    """A row source (convert's decoded input, read block by block by the encoders; the
    blocked dense forward) does the layer's own work (_prepare: FP8's scan for NaN codes,
    MXFP8's and NVFP4's unblocked scales) once, not once per read: per read, a layer of B
    blocks was scanned B times, and materializing a 5120x13824 FP8 layer ran at 50 MB/s
    against 592 MB/s at 3072x3072.  The rows are the decode's bits, read in blocks or
    materialized."""
    n, k = 600, SHAPES[variant][1]
    w = weight("gauss", n, k, torch.bfloat16, seed=12)
    codec = codecs.get(VARIANTS[variant].format)
    enc = codec.encode(w, **ENCODE_ARGS[variant])
    expected = codec.decode(enc, enc.marker)
    calls = []
    prepare = type(codec)._prepare

    def counting(self, *args):
        calls.append(args)
        return prepare(self, *args)

    monkeypatch.setattr(type(codec), "_prepare", counting)
    source = codec.row_source(enc, enc.marker)
    got = torch.cat([block.clone() for _, _, block in rows.row_blocks(source, 16 * k)])
    assert same_bits(got[: expected.shape[0]], expected)
    assert len(calls) == 1, f"{len(calls)} preparations for {-(-n // 16)} blocks"
    assert same_bits(materialize(source)[: expected.shape[0]], expected) and len(calls) == 1


def test_decode_into_a_wrong_destination_is_refused():
    w = weight("gauss", 64, 256, torch.bfloat16, seed=2)
    codec = codecs.get("float8_e4m3fn")
    enc = codec.encode(w)
    bad = {
        "shape": torch.empty(64, 255, dtype=torch.bfloat16),
        "dtype": torch.empty(64, 256, dtype=torch.float16),
        "strides": torch.empty(256, 64, dtype=torch.bfloat16).t(),
        "type": [0.0] * 64,
    }
    for out in bad.values():
        with pytest.raises(CodecError, match="^blk.0: out must be"):
            codec.decode(enc, enc.marker, dtype=torch.bfloat16, layer="blk.0", out=out)
    buf = torch.empty(64, 256, dtype=torch.bfloat16)
    assert codec.decode(enc, enc.marker, out=buf) is buf and same_bits(buf, codec.decode(enc, enc.marker))


def test_lookup_pairs_into_a_buffer_is_the_same_gather():
    gen = torch.Generator().manual_seed(4)
    packed = torch.randint(-128, 128, (37, 24), dtype=torch.int8, generator=gen)
    table = pair_table(torch.randn(16, generator=gen))
    dest = torch.full((37, 48), float("nan"))
    assert lookup_pairs(packed, table, dest) is dest and same_bits(dest, lookup_pairs(packed, table))


@pytest.mark.parametrize("variant", list(SHAPES))
def test_blocks_placed_at_a_file_phase_are_the_same_bits_at_that_phase(variant):
    """``iter_decode(phase=p)``: every block's memory starts ``p`` bytes into a page (the
    streamed buffers, and a one-GEMM layer's wider product rounded block by block or whole),
    each block but the last is whole pages, and the bits are the plain decode's.  Not placed:
    K=200 (400-byte BF16 rows need 256-row blocks, over four of these small blocks' worth),
    and a one-GEMM layer whose product is in the output dtype (its blocks are slices of the
    GEMM's own product: placing them would cost a copy of the layer)."""
    n, k = SHAPES[variant]
    codec = codecs.get(VARIANTS[variant].format)
    enc = codec.encode(weight("gauss", n, k, torch.bfloat16, seed=5), **ENCODE_ARGS[variant])
    for dtype in (torch.bfloat16, torch.float32):
        whole = codec.decode(enc, enc.marker, dtype=dtype)
        count = len(list(codec.iter_decode(enc, enc.marker, dtype=dtype, block_elements=16 * k)))
        plan = codec.plan(enc, enc.marker)
        # a one-GEMM layer whose product is the output dtype hands out slices of that product
        own = (
            codec.decodes_whole(enc, plan, dtype)
            and codec._decode_whole(enc, plan, dtype, codec._prepare(enc, plan.env, dtype), None).dtype == dtype
        )
        for phase in (0, 4, 2052, 4092):
            for round_whole in (False, True):
                blocks = list(
                    codec.iter_decode(
                        enc, enc.marker, dtype=dtype, block_elements=16 * k, buffers=count, phase=phase, round_whole=round_whole
                    )
                )
                assert same_bits(torch.cat(blocks), whole), (dtype, phase, round_whole)
                if k == 512 and not own:  # 1024- or 2048-byte rows: 4 or 2 of them make a page
                    assert {b.data_ptr() % pages.PAGE for b in blocks} == {phase}, (dtype, phase, round_whole)
                    assert all(b.nbytes % pages.PAGE == 0 for b in blocks[:-1])
        # an odd offset (an odd-sized U8 tensor before the layer): no element can sit there
        odd = list(codec.iter_decode(enc, enc.marker, dtype=dtype, block_elements=16 * k, buffers=count, phase=4093))
        assert same_bits(torch.cat(odd), whole)


def test_page_rows_is_the_fewest_rows_of_whole_pages():
    from comfyquant.formats.codec import page_rows

    assert page_rows(13824, torch.bfloat16, 1 << 22) == 4  # 27648-byte rows: 4 make 27 pages
    assert page_rows(3072, torch.bfloat16, 1 << 22) == 2
    assert page_rows(2048, torch.bfloat16, 1 << 22) == 1
    assert page_rows(3073, torch.bfloat16, 1 << 22) == 2048  # odd K: 2048 rows, 6.3M elements
    assert page_rows(3073, torch.bfloat16, 1 << 20) is None  # more than four blocks' worth
    for k in (200, 13824, 3073, 5120):
        rows = page_rows(k, torch.float32, 1 << 30)
        assert rows * k * 4 % pages.PAGE == 0 and all(r * k * 4 % pages.PAGE for r in range(1, rows))


@pytest.mark.parametrize("in_pool", [False, True])
def test_empty_output_at_a_phase(in_pool, reuse_pools):
    """``empty_output(phase=p)`` starts ``p`` bytes into a page, in a reuse scope or not, and
    a phase that is no multiple of the element size is refused."""
    import contextlib

    scope = pages.reused_outputs() if in_pool else contextlib.nullcontext()
    with scope:
        for phase in (0, 2, 2050, 4094):
            t = pages.empty_output((300, 1000), torch.bfloat16, phase=phase)
            assert t.data_ptr() % pages.PAGE == phase and t.shape == (300, 1000) and t.is_contiguous()
            t.fill_(1.5)
            assert bool((t == 1.5).all())
            del t
        with pytest.raises(ValueError, match="not a multiple"):
            pages.empty_output((4, 4), torch.float32, phase=6)
    if in_pool:
        assert reuse_pools and reuse_pools[0].reused > 0
