"""The writer's ``O_DIRECT`` path (``io/direct.py``), which ``dequantize`` writes through.

Every test writes real files with ``write_safetensors`` and compares them byte for byte with
the buffered writer's output (and reads them back with ``safetensors``).  Staging buffers and
thresholds are made tiny so that every alignment case (unaligned heads and tails, chunks
spanning buffers, small and kernel-copied untouched tensors) happens in a small file.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest

import comfyquant.io.direct as direct
import comfyquant.io.writer as writer
from comfyquant.io.writer import CopyRange, write_safetensors


def _chunked(data: bytes, sizes: list[int]):
    def chunks():
        pos, i = 0, 0
        while pos < len(data):
            n = sizes[i % len(sizes)]
            yield memoryview(data)[pos : pos + n]
            pos += n
            i += 1

    return chunks


def _tensors(src_path) -> dict:
    """Odd-sized tensors of every data kind the writer takes, in a file order that puts every
    tensor at an unaligned offset."""
    rnd = os.urandom(300_000)
    with open(src_path, "wb") as fh:
        fh.write(rnd)
    fd = os.open(src_path, os.O_RDONLY)
    big = rnd[7 : 7 + 70_002]

    def copy(offset, length):
        return CopyRange(fd, offset, length, _chunked(rnd[offset : offset + length], [4096]))

    return (
        fd,
        {
            "a": ("U8", (13,), rnd[:13]),
            "b": ("BF16", (20_001,), _chunked(rnd[100 : 100 + 40_002], [1, 4095, 8193, 3, 20_000])),
            "c": ("U8", (999,), copy(1234, 999)),  # small untouched: read into staging
            "d": ("U8", (70_002,), copy(7, 70_002)),  # large untouched: kernel copy
            "e": ("F32", (2, 9_999), bytearray(rnd[50_000 : 50_000 + 79_992])),
            "f": ("U8", (70_002,), _chunked(big, [70_002])),
            "g": ("U8", (1,), b"z"),
        },
    )


@pytest.fixture
def small_stages(monkeypatch):
    monkeypatch.setattr(direct, "STAGE", 8192)
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(writer, "CHUNK", 16384)  # untouched tensors from 16 KiB on are kernel copies
    monkeypatch.setattr(direct, "supported", lambda folder: True)


def _direct_used(monkeypatch) -> list[int]:
    """Flags of every ``os.open`` from now on (``os`` is one module: all callers')."""
    flags: list[int] = []
    real = os.open

    def spy(path, flag, *args, **kwargs):
        flags.append(flag)
        return real(path, flag, *args, **kwargs)

    monkeypatch.setattr(direct.os, "open", spy)
    return flags


def _has_direct(folder) -> bool:
    try:
        fd = os.open(os.path.join(folder, ".probe"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(os.path.join(folder, ".probe"))
    return True


def test_direct_writes_the_same_bytes_as_buffered(tmp_path, small_stages, monkeypatch):
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    flags = _direct_used(monkeypatch)
    fd, tensors = _tensors(tmp_path / "src.bin")  # every data kind can be written twice
    try:
        plain = write_safetensors(str(tmp_path / "plain.safetensors"), tensors, {"k": "v"})
        assert not any(f & os.O_DIRECT for f in flags)
        fast = write_safetensors(str(tmp_path / "fast.safetensors"), tensors, {"k": "v"}, direct=True)
    finally:
        os.close(fd)
    assert any(f & os.O_DIRECT for f in flags)
    assert open(fast, "rb").read() == open(plain, "rb").read()
    assert not [t for t in threading.enumerate() if t.name == "comfyquant-direct-write"]


@pytest.mark.needs_torch
def test_dequantize_writes_its_output_with_o_direct(tmp_path, monkeypatch):
    """dequantize's output goes through the direct path (O_DIRECT opened on the temporary
    file), and the file equals the buffered writer's."""
    import comfyquant
    from kitchen_fixtures import dense_layer, make_layer, write_layers

    if not _has_direct(tmp_path) or not direct.supported(str(tmp_path)):
        pytest.skip("no plain O_DIRECT here")
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(direct, "STAGE", 16384)
    layers = [
        make_layer(v, prefix=f"b.{i}", n=64, k=256, seed=i)
        for i, v in enumerate(["fp8", "int8_convrot", "w4a8_codebook", "nvfp4"])
    ]
    layers.append(dense_layer("norm", (999,)))
    src = write_layers(tmp_path / "m.safetensors", layers)
    flags = _direct_used(monkeypatch)
    comfyquant.dequantize(src, str(tmp_path / "fast.safetensors"))
    assert any(f & os.O_DIRECT for f in flags)
    monkeypatch.setenv("COMFYQUANT_NO_DIRECT_IO", "1")
    flags.clear()
    comfyquant.dequantize(src, str(tmp_path / "plain.safetensors"))
    assert not any(f & os.O_DIRECT for f in flags)
    assert (tmp_path / "fast.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()


def test_a_refused_direct_write_falls_back_to_buffered(tmp_path, small_stages, monkeypatch):
    """A filesystem that refuses the aligned direct writes (EINVAL) gets the same bytes
    through the ordinary descriptor."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    fd, tensors = _tensors(tmp_path / "src.bin")
    try:
        plain = write_safetensors(str(tmp_path / "plain.safetensors"), tensors)
        refused = _direct_writes_fail(monkeypatch, errno.EINVAL, "Invalid argument")
        fast = write_safetensors(str(tmp_path / "fast.safetensors"), tensors, direct=True)
    finally:
        os.close(fd)
    assert len(refused) == 1  # tried once, refused, never tried again
    assert open(fast, "rb").read() == open(plain, "rb").read()


def _direct_writes_fail(monkeypatch, code: int, text: str, thread: threading.Thread | None = None) -> list[int]:
    """Every O_DIRECT ``pwrite`` from now on (in ``thread`` only, when given) fails with
    ``OSError(code, text)``; returns the offsets tried."""
    real = os.pwrite
    tried: list[int] = []

    def pwrite(fd, data, offset):
        if fcntl_flags(fd) & os.O_DIRECT and (thread is None or threading.current_thread() is thread):
            tried.append(offset)
            raise OSError(code, text)
        return real(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", pwrite)
    return tried


def fcntl_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_a_failing_direct_write_leaves_no_file_and_no_thread(tmp_path, small_stages, monkeypatch):
    """ENOSPC in the writer thread is the caller's OSError; the temporary file is removed and
    the thread is gone."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    _direct_writes_fail(monkeypatch, errno.ENOSPC, "No space left on device")
    fd, tensors = _tensors(tmp_path / "src.bin")
    try:
        with pytest.raises(OSError, match="No space left"):
            write_safetensors(str(tmp_path / "out.safetensors"), tensors, direct=True)
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["src.bin"]
    assert not [t for t in threading.enumerate() if t.name == "comfyquant-direct-write"]


@pytest.mark.needs_torch
def test_dequantize_reports_a_failing_direct_write_in_one_line(tmp_path, monkeypatch, capsys):
    from comfyquant.cli import main
    from kitchen_fixtures import make_layer, write_layers

    if not _has_direct(tmp_path) or not direct.supported(str(tmp_path)):
        pytest.skip("no plain O_DIRECT here")
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(direct, "STAGE", 16384)
    _direct_writes_fail(monkeypatch, errno.ENOSPC, "No space left on device")
    src = write_layers(tmp_path / "m.safetensors", [make_layer("fp8", prefix="a", n=128, k=256)])
    code = main(["dequantize", src, "-o", str(tmp_path / "d.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "cannot write (No space left on device); nothing was written" in err
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_the_filesystem_is_found_by_device(tmp_path, monkeypatch):
    import subprocess

    try:
        want = subprocess.run(
            ["df", "--output=fstype", str(tmp_path)], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        pytest.skip("no df(1) that prints file system types")
    got = direct.filesystem(str(tmp_path))
    assert got == want
    assert direct.supported(str(tmp_path)) == (got in direct.FILESYSTEMS)
    monkeypatch.setenv("COMFYQUANT_NO_DIRECT_IO", "1")
    assert not direct.supported(str(tmp_path))


def test_untouched_tensors_without_a_kernel_copy_are_streamed(tmp_path, small_stages, monkeypatch):
    """copy_file_range refused (another filesystem: EXDEV): the untouched tensors go through
    the tensors' own fallback reads, into the staging buffers; the same bytes."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    fd, tensors = _tensors(tmp_path / "src.bin")
    try:
        plain = write_safetensors(str(tmp_path / "plain.safetensors"), tensors)

        def exdev(*args):
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(writer.os, "copy_file_range", exdev)
        fast = write_safetensors(str(tmp_path / "fast.safetensors"), tensors, direct=True)
    finally:
        os.close(fd)
    assert open(fast, "rb").read() == open(plain, "rb").read()


def _placed(data: bytes, phase: int) -> memoryview:
    """``data`` in memory that starts ``phase`` bytes into a page (a page-aligned mapping)."""
    import mmap

    buf = mmap.mmap(-1, len(data) + 2 * direct.ALIGN)
    buf[phase : phase + len(data)] = data
    return memoryview(buf)[phase : phase + len(data)]


def _staged_bytes(monkeypatch) -> list[int]:
    """The length of every copy into a staging buffer from now on."""
    sizes: list[int] = []
    real = direct._copy

    def spy(buf, at, data):
        sizes.append(len(data))
        real(buf, at, data)

    monkeypatch.setattr(direct, "_copy", spy)
    return sizes


def _one_placed_chunk(monkeypatch) -> dict:
    """A table of a 5-byte tensor and a 250,000-byte one handed over as one chunk placed like
    its file offset (in-place writes from 4 KiB)."""
    monkeypatch.setattr(direct, "IN_PLACE_MIN", 4096)
    rnd = os.urandom(250_005)
    table = {"a": ("U8", (5,), rnd[:5]), "x": ("U8", (250_000,), None)}
    x = _placed(rnd[5:], writer.data_offsets(table, None)["x"] % direct.ALIGN)
    table["x"] = ("U8", (250_000,), lambda: iter([x]))
    return table


def test_chunks_placed_like_their_file_offsets_are_written_from_their_own_memory(tmp_path, small_stages, monkeypatch):
    """A large chunk whose memory sits at its file offset's place within a page is written with
    O_DIRECT from where it is: only its partial first and last pages are staged.  A chunk
    placed otherwise is staged whole.  The file equals the buffered writer's."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    monkeypatch.setattr(direct, "IN_PLACE_MIN", 4096)
    rnd = os.urandom(400_000)
    table = {
        "a": ("U8", (13,), rnd[:13]),
        "x": ("BF16", (100_001,), None),
        "y": ("U8", (150_001,), None),
        "z": ("U8", (3,), b"end"),
    }
    offsets = writer.data_offsets(table, {"k": "v"})
    x = _placed(rnd[13 : 13 + 200_002], offsets["x"] % direct.ALIGN)
    y = _placed(rnd[:150_001], (offsets["y"] + 2) % direct.ALIGN)  # two bytes off its file offset's place
    table["x"] = ("BF16", (100_001,), _chunked(bytes(x), [200_002]))
    table["y"] = ("U8", (150_001,), _chunked(bytes(y), [150_001]))
    plain = write_safetensors(str(tmp_path / "plain.safetensors"), table, {"k": "v"})
    table["x"] = ("BF16", (100_001,), lambda: iter([x]))
    table["y"] = ("U8", (150_001,), lambda: iter([y]))
    staged = _staged_bytes(monkeypatch)
    fast = write_safetensors(str(tmp_path / "fast.safetensors"), table, {"k": "v"}, direct=True)
    assert open(fast, "rb").read() == open(plain, "rb").read()
    # y copied whole (with a and z); of x's 200,002 bytes at most its two partial pages
    assert 150_001 + 13 + 3 <= sum(staged) < 150_001 + 13 + 3 + 2 * direct.ALIGN


def test_a_refused_in_place_write_is_staged_instead(tmp_path, small_stages, monkeypatch):
    """A filesystem that refuses the in-place direct write (EINVAL) gets the chunk staged and
    written through the ordinary descriptor; direct writes are not tried again."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    table = _one_placed_chunk(monkeypatch)
    plain = write_safetensors(str(tmp_path / "plain.safetensors"), table)  # buffered: the same chunk
    refused = _direct_writes_fail(monkeypatch, errno.EINVAL, "Invalid argument")
    fast = write_safetensors(str(tmp_path / "fast.safetensors"), table, direct=True)
    assert len(refused) == 1
    assert open(fast, "rb").read() == open(plain, "rb").read()


@pytest.mark.needs_torch
def test_dequantize_writes_decoded_blocks_from_where_they_were_decoded(tmp_path, monkeypatch):
    """dequantize places each layer's blocks at their file offsets' place within a page, so
    the direct writer copies almost nothing into staging buffers; the file equals the
    buffered writer's."""
    import comfyquant
    from kitchen_fixtures import dense_layer, make_layer, write_layers

    if not _has_direct(tmp_path) or not direct.supported(str(tmp_path)):
        pytest.skip("no plain O_DIRECT here")
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(direct, "STAGE", 16384)
    monkeypatch.setattr(direct, "IN_PLACE_MIN", 4096)
    layers = [dense_layer("head", (777,))]
    layers += [
        make_layer(v, prefix=f"b.{i}", n=256, k=512, seed=i)
        for i, v in enumerate(["fp8", "int8_convrot", "w4a8_codebook", "nvfp4", "w4a4", "mxfp8"])
    ]
    src = write_layers(tmp_path / "m.safetensors", layers)
    staged = _staged_bytes(monkeypatch)
    comfyquant.dequantize(src, str(tmp_path / "fast.safetensors"))
    decoded = 6 * 256 * 512 * 2
    assert sum(staged) < decoded // 10, (sum(staged), decoded)
    monkeypatch.setenv("COMFYQUANT_NO_DIRECT_IO", "1")
    comfyquant.dequantize(src, str(tmp_path / "plain.safetensors"))
    assert (tmp_path / "fast.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()


def test_a_failing_in_place_write_leaves_no_file_and_no_thread(tmp_path, small_stages, monkeypatch):
    """ENOSPC from a direct write made in the caller's thread (a placed chunk) is the caller's
    OSError too; the temporary file is removed and the writer thread is gone."""
    if not _has_direct(tmp_path):
        pytest.skip("no O_DIRECT on this filesystem")
    table = _one_placed_chunk(monkeypatch)
    failed = _direct_writes_fail(monkeypatch, errno.ENOSPC, "No space left on device", threading.current_thread())
    with pytest.raises(OSError, match="No space left"):
        write_safetensors(str(tmp_path / "out.safetensors"), table, direct=True)
    assert failed
    assert os.listdir(tmp_path) == []
    assert not [t for t in threading.enumerate() if t.name == "comfyquant-direct-write"]
