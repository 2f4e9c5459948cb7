"""``dequantize``'s decode thread: layers are read and decoded in file order by one thread per
output file, ahead of the writer, so the next layer's read overlaps writing this one.

Real checkpoints written by ``safetensors`` from comfy-kitchen layers; the outputs are compared
with the codecs' own decode (as in ``test_dequantize``), and the order of events is observed by
wrapping the dequantizer's read and the writer's consumption of each layer's chunks.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import comfyquant
import comfyquant.dequantizer as dq
from comfyquant import codecs
from kitchen_fixtures import dense_layer, make_layer, write_layers
from test_dequantize import raw, read_all


def _record(monkeypatch, hold_for_next: list[str] | None = None) -> list[tuple]:
    """Events: ("read", thread name, entry names) at each read of packed tensors, and
    ("written", layer name) when the writer, done with a layer's last chunk, asks for more.
    Writing is slow: 0.1 s per chunk (a slow disk), so a decode thread that ignored its
    bounds would run ahead.  ``hold_for_next``: the quantized layers in file order; the writer
    then finishes each one only once the next one has been read (or after 30 s, when it never
    is): a pipeline that reads ahead lets it, one that reads a layer only when the writer
    asks for it could not."""
    events: list[tuple] = []
    real_read, real_decoder, real_next = dq._Work._read, dq._Work._decoder, dq._Work._next
    seen = threading.Condition()

    def read(self, entries):
        with seen:
            events.append(("read", threading.current_thread().name, tuple(e.name for e in entries)))
            seen.notify_all()
        return real_read(self, entries)

    def read_of(prefix: str) -> bool:
        return any(e[0] == "read" and e[2][0].split(".")[0] == prefix for e in events)

    def decoder(self, layer):
        chunks = real_decoder(self, layer)

        def slow():
            for chunk in chunks():
                yield chunk
                time.sleep(0.1)  # the writer took this long to write it

        return slow

    def next_item(self, layer):
        kind, value = real_next(self, layer)
        if kind == "end":
            if hold_for_next and layer.name in hold_for_next[:-1]:
                following = hold_for_next[hold_for_next.index(layer.name) + 1]
                with seen:
                    seen.wait_for(lambda: read_of(following), timeout=30)
            events.append(("written", layer.name))
        return kind, value

    monkeypatch.setattr(dq._Work, "_read", read)
    monkeypatch.setattr(dq._Work, "_decoder", decoder)
    monkeypatch.setattr(dq._Work, "_next", next_item)
    return events


def _blocked_run(tmp_path, monkeypatch, layers, dtype: str) -> tuple[list[str], list[str]]:
    """Dequantize ``layers`` in blocks of 64 rows (several per layer) through a slow writer:
    the order of reads and finished layers, and the layers in the order written."""
    import comfyquant.formats.codec as base

    monkeypatch.setattr(base, "DEFAULT_BLOCK_ELEMENTS", 64 * 256)
    monkeypatch.setattr(base, "ROTATED_BLOCK_ELEMENTS", 64 * 256)
    src = write_layers(tmp_path / "m.safetensors", layers)
    events = _record(monkeypatch)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"), dtype=dtype)
    order = [e[0] + ":" + (e[2][0].split(".")[0] if e[0] == "read" else e[1]) for e in events]
    return order, [e[1] for e in events if e[0] == "written"]


def _file_order(path, prefixes: list[str]) -> list[str]:
    """The layers named by ``prefixes`` in the order their weights are stored in the file
    (the order a layer-by-layer writer meets them)."""
    import json
    import struct

    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    start = {p: header[f"{p}.weight"]["data_offsets"][0] for p in prefixes}
    return sorted(prefixes, key=start.__getitem__)


def test_the_next_layer_is_read_while_this_one_is_written(tmp_path, monkeypatch):
    layers = [
        make_layer("fp8", prefix="a", seed=1),
        dense_layer("between", (64,)),
        make_layer("nvfp4", prefix="b", n=64, seed=2),
        make_layer("int8_convrot", prefix="c", seed=3),
    ]
    src = write_layers(tmp_path / "m.safetensors", layers)
    events = _record(monkeypatch, hold_for_next=_file_order(src, ["a", "b", "c"]))
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    reads = [e for e in events if e[0] == "read"]
    assert reads and all(name != threading.current_thread().name for _, name, _ in reads)
    order = [e[0] + ":" + (e[2][0].split(".")[0] if e[0] == "read" else e[1]) for e in events]
    written = [e[1] for e in events if e[0] == "written"]  # the file's order
    assert sorted(written) == ["a", "b", "c"]
    for this, following in zip(written, written[1:]):  # read (and decoded) before this one is done
        assert order.index(f"read:{following}") < order.index(f"written:{this}"), order
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        if layer.marker is not None:
            want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker)
            assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def test_whole_layer_products_are_never_held_two_at_once(tmp_path, monkeypatch):
    """An F32 output of a layer decoded by one GEMM is handed out as slices of that product:
    the next layer is only decoded once the writer is done with them."""
    layers = [
        make_layer("int8_convrot", prefix="a", n=300, seed=1),
        make_layer("w4a4", prefix="b", n=300, seed=2),
        make_layer("fp8", prefix="c", n=300, seed=3),
    ]
    order, written = _blocked_run(tmp_path, monkeypatch, layers, "f32")
    for this, following in zip(written, written[1:]):
        if this in ("a", "b"):  # a one-GEMM layer's product is let go before the next is read
            assert order.index(f"written:{this}") < order.index(f"read:{following}"), order
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker, dtype=torch.float32)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def test_a_writer_error_stops_the_decode_thread(tmp_path, monkeypatch):
    """The writer fails in the middle of a layer: one error, no output, no thread left."""
    import comfyquant.io.writer as writer

    layers = [make_layer("fp8", prefix=f"l{i}", seed=i) for i in range(4)]
    src = write_layers(tmp_path / "m.safetensors", layers)
    real = writer._check_size
    calls = []

    def fail_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(writer, "_check_size", fail_second)
    with pytest.raises(dq.DequantizeError, match="cannot write"):
        comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    assert not [t for t in threading.enumerate() if t.name == "comfyquant-decode" and t.is_alive()]


def test_a_block_viewing_the_read_buffer_is_copied():
    """The read buffer is reused by the next layer while the writer may still hold blocks: a
    block that views it is recognised (and copied by the decode thread)."""
    from comfyquant.numerics.dtypes import from_bytes

    work = dq._Work.__new__(dq._Work)
    work.buffer = bytearray(4096)
    inside = from_bytes(memoryview(work.buffer)[128:256], "BF16", (64,))
    assert work._in_buffer(inside)
    assert not work._in_buffer(torch.zeros(64, dtype=torch.bfloat16))


def test_a_one_gemm_layer_in_a_narrower_dtype_is_written_while_the_next_is_unrotated(tmp_path, monkeypatch):
    """BF16 output of layers decoded by one GEMM: each is rounded whole and its F32 product
    let go, so the next such layer is read and un-rotated while this one is still being
    written (before: only after its last block), in the same row blocks and the same bits."""
    layers = [
        make_layer("int8_convrot", prefix="a", n=300, seed=1),
        make_layer("w4a4", prefix="b", n=300, seed=2),
        make_layer("int8_convrot", prefix="c", n=300, seed=3),
    ]
    order, written = _blocked_run(tmp_path, monkeypatch, layers, "bf16")
    assert written == ["a", "b", "c"]
    for this, following in zip(written, written[1:]):
        assert order.index(f"read:{following}") < order.index(f"written:{this}"), order
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        codec = codecs.get(layer.marker["format"])
        want = codec.decode(layer.tensors, layer.marker, dtype=torch.bfloat16)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)
        streamed = [b.clone() for b in codec.iter_decode(layer.tensors, layer.marker, dtype=torch.bfloat16)]
        rounded = list(codec.iter_decode(layer.tensors, layer.marker, dtype=torch.bfloat16, round_whole=True))
        assert [b.shape for b in rounded] == [b.shape for b in streamed]
        assert all(raw(x) == raw(y) for x, y in zip(rounded, streamed))


def test_the_heap_is_trimmed_only_where_the_decoder_changes(tmp_path, monkeypatch):
    """Trimming the heap after every layer made the next layer of the same format fault its
    temporaries in again; it is trimmed where the format or dtype changes, and at the end (a
    format's temporaries would otherwise add to the next format's peak)."""
    import comfyquant.numerics.rows as rows

    layers = [
        make_layer("fp8", prefix="a", seed=1),
        make_layer("fp8", prefix="b", seed=2),
        make_layer("nvfp4", prefix="c", n=64, seed=3),
        make_layer("nvfp4", prefix="d", n=64, seed=4),
    ]
    src = write_layers(tmp_path / "m.safetensors", layers)
    trims, real = [], rows.release_memory

    def counted():
        trims.append(1)
        real()

    monkeypatch.setattr(rows, "release_memory", counted)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert len(trims) == 2  # after b (fp8 -> nvfp4) and after d (the end)
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def test_one_gemm_layers_reuse_the_memory_of_the_last_ones(tmp_path, reuse_pools, monkeypatch):
    """Each INT8 ConvRot / W4A4 layer needs an F32 operand and product of its size and, for a
    BF16 output, the layer rounded whole: faulting in and zeroing fresh pages for all three at
    every layer can cost as much as the GEMM on a virtual machine.  A run reuses
    the memory of the last layers' once nothing holds it -- the writer lets go of the last
    chunk it wrote -- and the bits are those of a decode into fresh memory.

    The decode thread runs ahead of the writer by design, so on a loaded machine (a CI run)
    a layer could be rounded while the writer still held the last one: new memory, by
    scheduling, not by a defect.  Here each layer after the first starts once every buffer of
    the pool is free again, or after 30 s -- a writer that kept its last chunk (the defect this
    test is for) still leaves its buffer taken and fails the count."""
    import time

    from comfyquant.numerics import pages

    produce = dq._Work._produce

    def writer_paced(self, order):
        for item in produce(self, order):
            yield item
            if item[1] == "end":
                pool, deadline = pages._REUSE, time.monotonic() + 30
                while time.monotonic() < deadline and any(pages._users(b) != idle for b, idle in pool._held):
                    time.sleep(0.002)

    monkeypatch.setattr(dq._Work, "_produce", writer_paced)
    pools = reuse_pools  # small layers' buffers count as large
    layers = [make_layer("int8_convrot", prefix=p, n=512, k=512, seed=i) for i, p in enumerate("abcd")]
    layers.append(make_layer("w4a4", prefix="e", n=512, k=512, seed=9))
    src = write_layers(tmp_path / "m.safetensors", layers)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"), dtype="bf16")
    assert len(pools) == 1 and pages._REUSE is None
    per_layer = 512 * 512 * (4 + 4 + 2)  # operand, product, rounded layer
    # Each buffer here fits in one huge page, the pool's unit, so every layer after the first
    # takes all three from memory already held (with the writer keeping its last chunk, one
    # layer's rounded copy was still taken when the next asked: 8.9 of 10.5 MB reused).
    assert pools[0].reused >= 4 * per_layer, pools[0].reused
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker, dtype=torch.bfloat16)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def _mapping_spy(monkeypatch) -> list[tuple[int, int, bool]]:
    """Every ``LocalFile.mapped`` call: (offset, length, whether it gave a view)."""
    from comfyquant.io.source import LocalFile

    calls: list[tuple[int, int, bool]] = []
    real = LocalFile.mapped

    def spy(self, offset, length):
        view = real(self, offset, length)
        calls.append((offset, length, view is not None))
        return view

    monkeypatch.setattr(LocalFile, "mapped", spy)
    return calls


def test_large_packed_tensors_are_mapped_from_the_file_not_copied(tmp_path, monkeypatch):
    """Packed weights from MAP_MIN bytes are mapped from the page cache (no copy on the decode
    thread's path); smaller tensors are read.  The output is the codecs' decode, bit for bit."""
    monkeypatch.setattr(dq, "MAP_MIN", 4096)
    layers = [
        make_layer("fp8", prefix="a", n=128, k=256, seed=1),
        make_layer("int8_convrot", prefix="b", n=64, seed=2),
        make_layer("nvfp4", prefix="c", n=64, seed=3),
        make_layer("w4a8_codebook", prefix="d", n=64, seed=4),
    ]
    src = write_layers(tmp_path / "m.safetensors", layers)
    calls = _mapping_spy(monkeypatch)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    weights = {layer.tensors["weight"].numel() * layer.tensors["weight"].element_size() for layer in layers}
    mapped = {length for _, length, ok in calls if ok}
    assert calls and all(ok for *_, ok in calls) and weights <= mapped and min(mapped) >= 4096
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def test_without_mapping_the_packed_tensors_are_read_with_the_same_result(tmp_path, monkeypatch):
    """A kernel that cannot populate a mapping (older than Linux 5.14: EINVAL) gets None from
    ``mapped``, and the layer is read instead: the same bytes out."""
    import comfyquant.io.source as source

    monkeypatch.setattr(dq, "MAP_MIN", 4096)
    monkeypatch.setattr(source, "_MADV_POPULATE_READ", 0x7FFF)  # advice no kernel knows: EINVAL
    layers = [make_layer("fp8", prefix="a", n=128, k=256, seed=1), make_layer("w4a4", prefix="b", n=64, seed=2)]
    src = write_layers(tmp_path / "m.safetensors", layers)
    calls = _mapping_spy(monkeypatch)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert calls and not any(ok for *_, ok in calls)
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        want = codecs.get(layer.marker["format"]).decode(layer.tensors, layer.marker)
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(want)


def test_a_file_truncated_after_its_check_is_one_clean_error(tmp_path, monkeypatch):
    """The input shrinks between the check and the reading of its second layer (another program
    truncates it): one error naming the file and the tensor, no output file, no crash (a
    mapping populated past the end of a file fails here instead of at first touch)."""
    monkeypatch.setattr(dq, "MAP_MIN", 4096)
    layers = [make_layer("fp8", prefix="a", n=128, k=256, seed=1), make_layer("fp8", prefix="b", n=128, k=256, seed=2)]
    src = write_layers(tmp_path / "m.safetensors", layers)
    real_read = dq._Work._read
    reads = []

    def truncating_read(self, entries):
        reads.append(entries)
        if len(reads) == 2:
            os.truncate(src, os.path.getsize(src) - 40000)
        return real_read(self, entries)

    monkeypatch.setattr(dq._Work, "_read", truncating_read)
    with pytest.raises(
        dq.DequantizeError,
        match=r"m\.safetensors: file ended early \(truncated since it was checked\?\) -- while reading tensor 'b\.weight'",
    ):
        comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_a_mapped_view_outlives_its_name_and_equals_the_bytes_read(tmp_path):
    """``LocalFile.mapped``: the bytes at any offset (not page-aligned), equal to a read; a
    tensor made from the view keeps the mapping alive after every name for it is gone; a
    range past the end of the file is an InputError naming the file."""
    from comfyquant.errors import InputError
    from comfyquant.io.source import LocalFile
    from comfyquant.numerics.dtypes import from_bytes

    path = tmp_path / "bytes.bin"
    data = bytes(range(256)) * 5000
    path.write_bytes(data)
    src = LocalFile(str(path))
    try:
        view = src.mapped(4099, 300001)
        assert view is not None and bytes(view) == data[4099 : 4099 + 300001] == src.pread(4099, 300001)
        t = from_bytes(view, "U8", (300001,))
        del view
        assert bytes(t.numpy().tobytes()) == data[4099 : 4099 + 300001]
        with pytest.raises(InputError, match=r"bytes\.bin: file ended early"):
            src.mapped(len(data) - 10, 11)
    finally:
        src.close()
