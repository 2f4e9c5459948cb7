"""GGUF files (city96 ComfyUI-GGUF layout) read as virtual safetensors files.

Files are written by the ``gguf`` package's own ``GGUFWriter`` (values from
``gguf.quants.quantize``; the K-quants, which it cannot quantize, as random blocks with finite
FP16 scales, laid out as ``gguf.quants`` reads them).  Expected values come from ``gguf``'s
own reader and ``gguf.quants.dequantize``, never from comfyquant: every tensor of the virtual
view must equal them bit for bit, under its original name and true shape.  Damaged files
must give one ``InputError`` line naming the file (and tensor), also under fuzzing.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from comfyquant.checkpoint import open_checkpoint  # noqa: E402
from comfyquant.dialects.base import EXACT, LOSSY  # noqa: E402
from comfyquant.dialects.gguf import is_gguf, virtual_source  # noqa: E402
from comfyquant.dialects.registry import detect  # noqa: E402
from comfyquant.dialects.report import claim_violations  # noqa: E402
from comfyquant.errors import InputError  # noqa: E402
from comfyquant.installing import extra_command  # noqa: E402
from comfyquant.io.shards import ShardSet  # noqa: E402

FP16_FIELDS = {"Q6_K": (208,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q3_K": (108,), "Q2_K": (80, 82), "IQ4_XS": (0,), "IQ4_NL": (0,)}
"""Byte offsets of the FP16 scales in one block of the types ``gguf.quants`` cannot quantize."""

HIDDEN = 256


def raw_blocks(qtype, rows: int, k: int, seed: int) -> np.ndarray:
    """Random blocks of ``qtype`` for a ``[rows, k]`` tensor whose FP16 scales are small finite numbers."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    scales = (rng.random((rows, k // block)) * 0.02 + 1e-3).astype(np.float16).view(np.uint8).reshape(rows, k // block, 2)
    for off in FP16_FIELDS[qtype.name]:
        data[:, :, off : off + 2] = scales
    return data.reshape(rows, -1)


def tensor_data(qtype, shape: tuple, seed: int) -> np.ndarray:
    """What GGUFWriter.add_tensor takes for ``qtype``: dense arrays, ``quantize``'s bytes, or raw blocks."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    if qtype == T.F32:
        return values
    if qtype == T.F16:
        return values.astype(np.float16)
    if qtype.name in FP16_FIELDS:
        return raw_blocks(qtype, int(np.prod(shape[:-1])), shape[-1], seed).reshape(*shape[:-1], -1)
    return gguf.quants.quantize(values, qtype)


FLUX = [
    # name, ggml type, shape (row-major, as the model has it), stored flattened (ComfyUI-GGUF's reshape)?
    ("img_in.weight", T.F32, (HIDDEN, 64), False),
    ("img_in.bias", T.F32, (HIDDEN,), False),
    ("time_in.in_layer.weight", T.F16, (HIDDEN, 256), False),
    ("double_blocks.0.img_attn.qkv.weight", T.Q8_0, (48, HIDDEN), False),
    ("double_blocks.0.img_attn.qkv.bias", T.F32, (48,), False),
    ("double_blocks.0.img_attn.norm.query_norm.scale", T.F16, (64,), False),
    ("double_blocks.0.img_attn.proj.weight", T.Q4_0, (32, HIDDEN), False),
    ("double_blocks.0.img_mlp.0.weight", T.Q6_K, (64, HIDDEN), False),
    ("double_blocks.0.img_mlp.2.weight", T.Q4_K, (32, HIDDEN), False),
    ("double_blocks.0.txt_attn.qkv.weight", T.Q5_1, (48, HIDDEN), False),
    ("single_blocks.0.linear1.weight", T.BF16, (32, HIDDEN), False),
    ("single_blocks.0.linear2.weight", T.MXFP4, (32, HIDDEN), False),
    ("single_blocks.0.modulation.lin.weight", T.Q8_0, (24, 48, 2, 2), True),
    ("final_layer.linear.weight", T.F32, (3, 5, 7), True),
    ("pos_embed", T.Q8_0, (1, 16, 64), False),
]


def write_gguf(
    path, spec=FLUX, arch: str | None = "flux", kv: dict | None = None, seed: int = 0, orig_shape_type=V.INT32
) -> dict[str, tuple[str, tuple]]:
    """Write ``spec`` with GGUFWriter; returns name -> (ggml type name, true shape)."""
    writer = gguf.GGUFWriter(str(path), arch=arch or "unused")
    if arch is None:
        writer.kv_data[0].pop("general.architecture")
    writer.add_name("tiny flux")
    for key, value in (kv or {}).items():
        writer.add_string(key, value)
    out = {}
    for i, (name, qtype, shape, flatten) in enumerate(spec):
        if not flatten:
            data = tensor_data(qtype, shape, seed + i)
        else:
            n = int(np.prod(shape))
            stored = (n // 256, 256) if n % 256 == 0 else (n,)
            data = tensor_data(qtype, stored, seed + i)
            writer.add_key_value(f"comfy.gguf.orig_shape.{name}", list(shape), V.ARRAY, sub_type=orig_shape_type)
        writer.add_tensor(name, data, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)
        out[name] = (qtype.name, tuple(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def reference(path) -> dict[str, np.ndarray]:
    """Every tensor as gguf's reader and dequantizer give it, in its original shape (the
    ComfyUI-GGUF loader's rule), F32 for quantized types, the stored dtype otherwise."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        field = reader.get_field(f"comfy.gguf.orig_shape.{t.name}")
        shape = tuple(int(field.parts[i][0]) for i in field.data) if field else tuple(int(d) for d in reversed(t.shape))
        if t.tensor_type in (T.F32, T.F16):
            out[t.name] = np.array(t.data).reshape(shape)
        elif t.tensor_type == T.BF16:
            out[t.name] = np.array(t.data).view(np.uint16).reshape(shape)
        else:
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
    return out


NP = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def open_view(path):
    return open_checkpoint(str(path), sources=[virtual_source(str(path))], shardset=ShardSet(files=[str(path)]))


def as_array(ckpt, name) -> np.ndarray:
    e = ckpt.tensors[name]
    return np.frombuffer(ckpt.read_bytes(e), dtype=NP[e.dtype]).reshape(e.shape)


@pytest.fixture
def flux(tmp_path):
    path = tmp_path / "flux1-tiny-Q8_0.gguf"
    return path, write_gguf(path)


# -- the virtual view -------------------------------------------------------------------------


def test_every_tensor_bit_identical_to_gguf_dequantize(flux):
    path, written = flux
    ref = reference(path)
    with open_view(path) as ckpt:
        assert list(ckpt.tensors) == list(written)
        for name, (type_name, shape) in written.items():
            e = ckpt.tensors[name]
            assert e.shape == shape, name
            expected = {"F32": "F32", "F16": "F16", "BF16": "BF16"}.get(type_name, "F32")
            assert e.dtype == expected, name
            got = as_array(ckpt, name)
            assert got.shape == ref[name].shape
            assert got.tobytes() == np.ascontiguousarray(ref[name]).tobytes(), name


def test_dense_tensors_read_through_the_files_bytes(flux):
    """F32/F16/BF16 tensors are ranges of the GGUF file itself, not copies or decodes."""
    path, written = flux
    reader = gguf.GGUFReader(str(path))
    raw = path.read_bytes()
    source = virtual_source(str(path))
    try:
        for t in reader.tensors:
            if t.tensor_type in (T.F32, T.F16, T.BF16):
                data = source._spans[[s[3] for s in source._spans].index(t.name)][2]
                assert data.start == t.data_offset and data.length == t.n_bytes
                assert raw[data.start : data.start + data.length] == np.asarray(t.data).tobytes()
    finally:
        source.close()


def test_reshaped_tensor_gets_its_original_shape(flux):
    path, _ = flux
    with open_view(path) as ckpt:
        e = ckpt.tensors["single_blocks.0.modulation.lin.weight"]
        assert e.shape == (24, 48, 2, 2)
        assert ckpt.tensors["final_layer.linear.weight"].shape == (3, 5, 7)
        shapes = json.loads(ckpt.metadata()["comfyquant.gguf.orig_shape"])
        assert shapes["single_blocks.0.modulation.lin.weight"] == {"shape": [24, 48, 2, 2], "type": "INT32"}


def test_metadata_names_container_architecture_and_types(flux):
    path, written = flux
    with open_view(path) as ckpt:
        meta = ckpt.metadata()
    assert meta["comfyquant.container"] == "gguf"
    assert meta["gguf.architecture"] == "flux"
    assert meta["gguf.general.name"] == "tiny flux"
    assert json.loads(meta["comfyquant.gguf.types"]) == {n: t for n, (t, _) in written.items()}


def test_open_reads_the_header_only_and_decodes_lazily(tmp_path):
    big = [("blocks.0.weight", T.Q8_0, (512, 1024), False), ("blocks.1.weight", T.Q8_0, (512, 1024), False)]
    path = tmp_path / "big.gguf"
    write_gguf(path, big)
    source = virtual_source(str(path))
    try:
        assert source.file.bytes_read < 70_000 < os.path.getsize(path) // 4
        assert not source._cache
        with open_checkpoint(str(path), sources=[source], shardset=ShardSet(files=[str(path)])) as ckpt:
            e = ckpt.tensors["blocks.0.weight"]
            before = source.file.bytes_read
            ckpt.read_bytes(e)
            assert list(source._cache) == ["blocks.0.weight"]
            assert source.file.bytes_read - before == 512 * 1024 // 32 * 34  # that tensor's blocks, once
    finally:
        source.close()


def test_is_gguf_sniffs_without_raising(tmp_path, flux):
    path, _ = flux
    assert is_gguf(str(path))
    (tmp_path / "x.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")
    (tmp_path / "short").write_bytes(b"GG")
    (tmp_path / "empty").write_bytes(b"")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for other in ("x.safetensors", "short", "empty", "pipe", "missing", "."):
        assert not is_gguf(str(tmp_path / other)), other
    assert not is_gguf("https://example.com/model.gguf")
    assert not is_gguf("bad\0name")


def test_discovery_and_sniffing_import_neither_gguf_nor_numpy(flux):
    """``check`` and ``inspect`` import every dialect package; this one must stay standard-library
    until a GGUF file is actually opened."""
    import subprocess
    import sys

    path, _ = flux
    code = (
        "import sys; import comfyquant.dialects.registry; from comfyquant.dialects.gguf import is_gguf; "
        f"assert is_gguf({str(path)!r}); print(sorted(m for m in ('gguf', 'numpy', 'comfyquant.io.virtual') "
        "if m in sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_gguf_package_the_error_says_what_to_install(flux, monkeypatch):
    import sys

    path, _ = flux
    monkeypatch.setitem(sys.modules, "gguf.constants", None)  # makes ``from gguf.constants import ...`` fail
    refused(path, "needs the gguf package", extra_command("gguf"))


# -- the dialect ------------------------------------------------------------------------------


def test_detection_claims_exactly_the_quantized_layers(flux):
    path, written = flux
    with open_view(path) as ckpt:
        found = detect(ckpt)
        assert found.name == "gguf"
        quantized = {
            n[: -len(".weight")]: (t, shape)
            for n, (t, shape) in written.items()
            if t not in ("F32", "F16", "BF16") and n.endswith(".weight")
        }
        assert set(found.layers) == set(quantized)
        for prefix, tr in found.layers.items():
            type_name, shape = quantized[prefix]
            assert tr.variant == type_name and tr.format is None and tr.decoder is not None
            if len(shape) == 2:
                assert tr.verdict == LOSSY and tr.lossy is not None
            else:  # no Comfy format quantizes a 4-D tensor: its exact F32 decode is its Comfy form
                assert tr.verdict == EXACT and [m.source for m in tr.moves] == [prefix + ".weight"]
        assert found.layers["single_blocks.0.modulation.lin"].verdict == EXACT
        notes = " | ".join(found.claim("gguf").notes)
        assert "1 quantized tensor(s) that are no layer's weight (e.g. 'pos_embed')" in notes
        why = found.layers["double_blocks.0.img_attn.qkv"].why
        assert "per-32 FP16 scales" in why and "no Comfy layout" in why
        assert "bias" in found.layers["double_blocks.0.img_attn.qkv"].inputs  # the layer's dense bias comes along
        assert not any(p.startswith(("img_in", "time_in", "single_blocks.0.linear1")) for p in found.layers)


@pytest.mark.parametrize(
    "types, fmt, params",
    [
        (["Q8_0"], "int8_tensorwise", {}),
        (["Q6_K"], "int8_tensorwise", {}),
        (["Q5_1"], "int8_tensorwise", {}),
        (["Q4_0"], "asym_w4a8_int8", {"bits": 4}),
        (["Q4_K"], "asym_w4a8_int8", {"bits": 4}),
        (["Q4_K", "Q3_K", "Q2_K"], "asym_w4a8_int8", {"bits": 4}),
        (["Q4_K", "Q6_K"], "int8_tensorwise", {}),  # a Q4_K_M mix: the deepest type decides, for every layer
        (["MXFP4"], "nvfp4", {}),
        (["MXFP4", "Q4_0"], "asym_w4a8_int8", {"bits": 4}),
    ],
)
def test_one_lossy_target_per_file_by_its_deepest_type(tmp_path, types, fmt, params):
    path = tmp_path / "mix.gguf"
    write_gguf(
        path,
        [(f"blocks.{i}.weight", getattr(T, t), (8, 256), False) for i, t in enumerate(types)]
        + [("blocks.9.weight", T.Q8_0, (2, 4, 256), False)],
    )  # 3-D: exact, does not vote
    with open_view(path) as ckpt:
        found = detect(ckpt).layers
    assert {p: tr.variant for p, tr in found.items()} == {**{f"blocks.{i}": t for i, t in enumerate(types)}, "blocks.9": "Q8_0"}
    assert found["blocks.9"].verdict == EXACT
    for i in range(len(types)):
        assert (found[f"blocks.{i}"].lossy.format, found[f"blocks.{i}"].lossy.params) == (fmt, params)


def test_runtimes_refuse_the_container(flux):
    path, _ = flux
    with open_view(path) as ckpt:
        claim = detect(ckpt).claim("gguf")
        comfy = claim_violations(ckpt, claim, "comfyui")
        sglang = claim_violations(ckpt, claim, "sglang")
        assert claim_violations(ckpt, claim, "kitchen") == []
    assert len(comfy) == 1 and comfy[0].blocking and "UnetLoaderGGUF" in comfy[0].message
    assert len(sglang) == 1 and sglang[0].blocking and "GGUF" in sglang[0].message


def test_dense_gguf_is_still_the_gguf_dialect(tmp_path):
    """A GGUF file with no quantized tensor claims no layer, but ComfyUI still cannot open it."""
    path = tmp_path / "f16.gguf"
    write_gguf(path, [("blocks.0.weight", T.F16, (8, 32), False)])
    with open_view(path) as ckpt:
        found = detect(ckpt)
        assert found.name == "gguf" and not found.layers
        assert claim_violations(ckpt, found.claim("gguf"), "comfyui")[0].blocking


@pytest.mark.parametrize(
    "arch, words",
    [
        ("flux", "accepts"),
        ("t5", "CLIPLoaderGGUF"),
        ("llama_diffusion_x", "refuses architecture 'llama_diffusion_x'"),
        (None, "compatibility mode"),
    ],
)
def test_notes_say_what_comfyui_gguf_does_with_the_architecture(tmp_path, arch, words):
    path = tmp_path / "a.gguf"
    write_gguf(path, [("blocks.0.weight", T.Q8_0, (8, 32), False)], arch=arch)
    with open_view(path) as ckpt:
        notes = " | ".join(detect(ckpt).claim("gguf").notes)
    assert words in notes


def test_non_int32_orig_shape_is_read_and_noted(tmp_path):
    path = tmp_path / "i64.gguf"
    write_gguf(path, [("blocks.0.weight", T.Q8_0, (3, 4, 64), True)], orig_shape_type=V.INT64)
    with open_view(path) as ckpt:
        assert ckpt.tensors["blocks.0.weight"].shape == (3, 4, 64)
        notes = " | ".join(detect(ckpt).claim("gguf").notes)
    assert "Bad original shape metadata" in notes


def test_gguf_metadata_copied_into_safetensors_is_not_gguf(tmp_path):
    from builders import dense_layer, write

    path = write(
        tmp_path / "copy.safetensors",
        dense_layer("blocks.0"),
        metadata={"comfyquant.container": "gguf", "comfyquant.gguf.types": '{"blocks.0.weight": "Q8_0"}'},
    )
    with open_checkpoint(path) as ckpt:
        assert detect(ckpt).name != "gguf"


@pytest.mark.needs_torch
def test_decoder_is_the_exact_f32_weight(flux):
    import torch

    path, _ = flux
    ref = reference(path)
    with open_view(path) as ckpt:
        for prefix, tr in detect(ckpt).layers.items():
            stored = {s: torch.from_numpy(as_array(ckpt, e.name).copy()) for s, e in tr.inputs.items() if e.dtype in NP}
            out = tr.decoder(stored)
            assert out.dtype == torch.float32
            assert torch.equal(out.view(torch.int32), torch.from_numpy(ref[prefix + ".weight"].copy()).view(torch.int32))


# -- damaged input ----------------------------------------------------------------------------


def small(tmp_path, name="s.gguf"):
    path = tmp_path / name
    write_gguf(path, [("blocks.0.weight", T.Q8_0, (4, 64), False), ("blocks.0.bias", T.F32, (4,), False)])
    return path


def header_offsets(raw: bytes) -> dict[str, int]:
    """Where the fields of the first tensor info sit (by parsing the writer's simple layout)."""
    pos = 24
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", raw, pos)[0]
        pos += 8 + klen
        vtype = struct.unpack_from("<I", raw, pos)[0]
        pos += 4
        assert vtype == 8  # the helper writes string keys only
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
    nlen = struct.unpack_from("<Q", raw, pos)[0]
    ndims_at = pos + 8 + nlen
    ndims = struct.unpack_from("<I", raw, ndims_at)[0]
    type_at = ndims_at + 4 + 8 * ndims
    return {"name": pos, "ndims": ndims_at, "dims": ndims_at + 4, "type": type_at, "offset": type_at + 4}


def patched(path, at: int, fmt: str, value) -> None:
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, at, value)
    path.write_bytes(bytes(raw))


def refused(path, *words) -> str:
    with pytest.raises(InputError) as exc:
        virtual_source(str(path))
    msg = str(exc.value)
    assert str(path) in msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_truncated_anywhere_is_one_line(tmp_path):
    path = small(tmp_path)
    raw = path.read_bytes()
    end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)  # then alignment padding
    cut = tmp_path / "cut.gguf"
    for n in list(range(0, 200)) + list(range(200, end, 7)) + [end - 1]:
        cut.write_bytes(raw[:n])
        refused(cut)


def test_truncated_data_names_the_tensor(tmp_path):
    path = small(tmp_path)
    end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)
    path.write_bytes(path.read_bytes()[: end - 1])
    refused(path, "blocks.0.bias", "past the end of the file")


@pytest.mark.parametrize(
    "field, fmt, value, words",
    [
        ("type", "<I", 99, ("blocks.0.weight", "ggml type 99")),
        ("ndims", "<I", 0, ("blocks.0.weight", "0 dimensions")),
        ("ndims", "<I", 9, ("blocks.0.weight", "9 dimensions")),
        ("dims", "<Q", 65, ("blocks.0.weight", "not a whole number of 32-element blocks")),
        ("dims", "<Q", 2**40, ("blocks.0.weight", "past the end")),
        ("offset", "<Q", 2**62, ("blocks.0.weight", "past the end")),
        ("name", "<Q", 2**60, ("name of tensor #0",)),
    ],
)
def test_bad_tensor_info(tmp_path, field, fmt, value, words):
    path = small(tmp_path)
    patched(path, header_offsets(path.read_bytes())[field], fmt, value)
    refused(path, *words)


@pytest.mark.parametrize(
    "at, fmt, value, words",
    [
        (0, "<4s", b"GGUX", ("not a GGUF file",)),
        (4, "<I", 1, ("version 1",)),
        (4, "<I", 3 << 24, ("big-endian",)),
        (8, "<Q", 2**60, ("2", "tensors")),
        (16, "<Q", 2**61, ("key/value pairs",)),
    ],
)
def test_bad_preamble(tmp_path, at, fmt, value, words):
    path = small(tmp_path)
    patched(path, at, fmt, value)
    refused(path, *words)


def test_duplicate_tensor_and_bad_orig_shape(tmp_path):
    path = tmp_path / "dup.gguf"
    write_gguf(path, [("a.weight", T.F32, (2, 32), False), ("b.weight", T.F32, (2, 32), False)])
    raw = path.read_bytes().replace(b"b.weight", b"a.weight")
    path.write_bytes(raw)
    refused(path, "'a.weight' appears twice")
    bad = tmp_path / "shape.gguf"
    writer = gguf.GGUFWriter(str(bad), arch="flux")
    writer.add_array("comfy.gguf.orig_shape.a.weight", [3, 3])
    writer.add_tensor("a.weight", np.zeros((2, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    refused(bad, "'a.weight'", "9 elements", "64")


def test_custom_alignment_is_honoured_and_a_bad_one_refused(tmp_path):
    path = tmp_path / "a64.gguf"
    writer = gguf.GGUFWriter(str(path), arch="flux")
    writer.add_custom_alignment(64)
    writer.add_tensor(
        "a.weight", gguf.quants.quantize(np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64), T.Q8_0), raw_dtype=T.Q8_0
    )
    writer.add_tensor("b.weight", np.arange(5, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ref = reference(path)
    with open_view(path) as ckpt:
        for name in ("a.weight", "b.weight"):
            assert as_array(ckpt, name).tobytes() == ref[name].tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.index(b"general.alignment") + len(b"general.alignment") + 4
    struct.pack_into("<I", raw, at, 48)
    path.write_bytes(bytes(raw))
    refused(path, "general.alignment is 48")


def test_missing_directory_url(tmp_path):
    refused(tmp_path / "nope.gguf", "no such file")
    refused(tmp_path, "directory")
    with pytest.raises(InputError, match="remote GGUF is not supported"):
        virtual_source("https://huggingface.co/city96/FLUX.1-dev-gguf/resolve/main/flux1-dev-Q8_0.gguf")


def test_safetensors_file_is_not_gguf(tmp_path):
    from builders import dense_layer, write

    path = tmp_path / "m.safetensors"
    write(path, dense_layer("blocks.0"))
    refused(path, "not a GGUF file")


def _value_bytes(draw, vtype: int, depth: int = 0) -> bytes:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return draw(st.binary(min_size=sizes[vtype], max_size=sizes[vtype]))
    if vtype == 8:
        text = draw(st.binary(max_size=12))
        n = draw(st.sampled_from([len(text), len(text), 2**63, 2**40]))
        return struct.pack("<Q", n) + text
    if vtype == 9 and depth < 3:
        item = draw(st.integers(0, 13))
        count = draw(st.integers(0, 4))
        n = draw(st.sampled_from([count, count, 2**62, 2**33]))
        return struct.pack("<IQ", item, n) + b"".join(_value_bytes(draw, item, depth + 1) for _ in range(count))
    return b""


@settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_headers_open_or_refuse_in_one_line(tmp_path_factory, data):
    """Headers built field by field: any value type (also unknown ones), nested arrays, lying
    lengths and counts, tensors of any ggml type number, rank and offset."""
    draw = data.draw
    kvs = []
    for i in range(draw(st.integers(0, 4))):
        vtype = draw(st.integers(0, 13))
        key = draw(
            st.sampled_from([b"general.architecture", b"general.alignment", b"comfy.gguf.orig_shape.t0"] + [f"k{i}".encode()] * 5)
        )
        kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + _value_bytes(draw, vtype))
    infos = []
    for i in range(draw(st.integers(0, 3))):
        name = f"t{i}".encode()
        dims = draw(
            st.lists(st.sampled_from([1, 2, 32, 256]), min_size=1, max_size=2)
            | st.lists(st.sampled_from([0, 1, 3, 2**40]), min_size=0, max_size=5)
        )
        rank = draw(st.sampled_from([len(dims)] * 5 + [2**31]))
        qtype = draw(st.sampled_from([0, 1, 2, 8, 12, 14, 16, 30, 39, 40, 99]))
        offset = draw(st.sampled_from([0, 0, 32, 64, 2**63]))
        infos.append(
            struct.pack("<Q", len(name))
            + name
            + struct.pack("<I", rank)
            + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", qtype, offset)
        )
    n_tensors = draw(st.sampled_from([len(infos)] * 5 + [2**63]))
    n_kv = draw(st.sampled_from([len(kvs)] * 5 + [2**40]))
    raw = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(kvs) + b"".join(infos)
    raw += b"\0" * (-len(raw) % 32) + draw(st.binary(min_size=0, max_size=64)) * 64
    path = tmp_path_factory.mktemp("g") / "generated.gguf"
    path.write_bytes(raw)
    try:
        source = virtual_source(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        event("refused: " + str(exc).split(": ", 1)[1][:40])
        return
    try:
        ckpt = open_checkpoint(str(path), sources=[source], shardset=ShardSet(files=[str(path)]))
        for e in ckpt.tensors.values():
            assert len(ckpt.read_bytes(e)) == e.nbytes
        detect(ckpt)
        event(f"opened with {len(ckpt.tensors)} tensor(s)")
    finally:
        source.close()


_FUZZ_BASE: dict[str, bytes] = {}


def _fuzz_base(tmp_path_factory) -> bytes:
    if "raw" not in _FUZZ_BASE:
        path = tmp_path_factory.mktemp("fuzz") / "base.gguf"
        write_gguf(
            path,
            [
                ("double_blocks.0.img_attn.qkv.weight", T.Q8_0, (4, 64), False),
                ("double_blocks.0.img_mlp.0.weight", T.Q4_K, (2, 256), False),
                ("blocks.0.bias", T.F32, (4,), False),
                ("blocks.1.weight", T.Q4_0, (2, 2, 64), True),
            ],
        )
        _FUZZ_BASE["raw"] = path.read_bytes()
    return _FUZZ_BASE["raw"]


@settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_open_and_read_or_refuse_in_one_line(tmp_path_factory, data):
    raw = bytearray(_fuzz_base(tmp_path_factory))
    header = 600  # the header of the base file and a little beyond
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, min(header, len(raw) - 1)))
        width = data.draw(st.sampled_from([1, 4, 8]))
        value = data.draw(st.integers(0, 2 ** (8 * width) - 1) | st.sampled_from([0, 1, 2 ** (8 * width) - 1]))
        raw[at : at + width] = value.to_bytes(width, "little")[: len(raw) - at]
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = tmp_path_factory.mktemp("f") / "fuzzed.gguf"
    path.write_bytes(bytes(raw))
    try:
        source = virtual_source(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    try:
        ckpt = open_checkpoint(str(path), sources=[source], shardset=ShardSet(files=[str(path)]))
        for e in ckpt.tensors.values():
            assert len(ckpt.read_bytes(e)) == e.nbytes
        detect(ckpt)
    finally:
        source.close()


# -- through the commands ---------------------------------------------------------------------


def cli(capsys, *args):
    from comfyquant.cli import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_json_names_the_dialect_and_each_layers_ggml_type(flux, capsys):
    path, written = flux
    rc, out, _ = cli(capsys, "inspect", path, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["dialect"] == "gguf" and doc["dialects"] == ["gguf"]
    rows = {r["layer"]: r for r in doc["layers"]}
    assert rows["double_blocks.0.img_attn.qkv"]["dialect"] == "gguf (Q8_0)"
    assert rows["double_blocks.0.img_attn.qkv"]["verdict"] == "lossy"
    assert rows["double_blocks.0.img_mlp.0"]["dialect"] == "gguf (Q6_K)"
    assert rows["single_blocks.0.modulation.lin"]["verdict"] == "exact"
    assert rows["img_in"].get("dialect") in (None, "dense", "")  # kept F32 by the converter: a dense layer
    assert any("architecture 'flux'" in n for n in doc["notes"])


def test_check_says_comfyui_and_sglang_cannot_load_a_gguf_file(flux, capsys):
    path, _ = flux
    rc, out, _ = cli(capsys, "check", path, "--json")
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"]
    assert doc["targets"]["comfyui"]["loads"] is False and "UnetLoaderGGUF" in doc["targets"]["comfyui"]["error"]
    assert doc["targets"]["sglang"]["loads"] is False and "GGUF" in doc["targets"]["sglang"]["error"]
    assert doc["targets"]["comfy-kitchen"]["loads"] is True
    f001 = [f for f in doc["findings"] if f["code"] == "F001"]
    assert f001 and f001[0]["actual"] == "gguf"
    rc, out, _ = cli(capsys, "check", path)
    assert rc == 1 and "gguf" in out and "UnetLoaderGGUF" in out


def test_damaged_gguf_is_one_line_exit_2_in_every_command(tmp_path, capsys):
    path = small(tmp_path)
    end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)
    path.write_bytes(path.read_bytes()[: end - 3])
    for args in (
        ["check", path],
        ["inspect", path],
        ["dequantize", path, "-o", tmp_path / "o.safetensors"],
        ["convert", path, "--to", "fp8", "-o", tmp_path / "c.safetensors"],
        ["migrate", path, "--allow-lossy"],
    ):
        rc, out, err = cli(capsys, *args)
        assert rc == 2, (args, out, err)
        assert err.count("\n") == 1 and str(path) in err and "blocks.0.bias" in err, err
    assert sorted(os.listdir(tmp_path)) == ["s.gguf"]  # nothing written


@pytest.mark.needs_torch
def test_dequantize_writes_the_exact_f32_weights(flux, tmp_path, capsys):
    from safetensors import safe_open

    path, written = flux
    out = tmp_path / "flux1-tiny-f32.safetensors"
    rc, _, err = cli(capsys, "dequantize", path, "-o", out)
    assert rc == 0, err
    ref = reference(path)
    with safe_open(str(out), "np") as f:
        meta = f.metadata()
        assert set(f.keys()) == set(written)
        for name, (type_name, shape) in written.items():
            got = f.get_tensor(name) if type_name != "BF16" else None
            if type_name == "BF16":  # numpy has no bfloat16: compare the raw bits through torch
                continue
            assert got.shape == shape, name
            expected = ref[name] if type_name not in ("F16",) else ref[name].astype(np.float16)
            assert got.dtype == (np.float16 if type_name == "F16" else np.float32), name
            assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), name
    with safe_open(str(out), "pt") as f:
        import torch

        bf16 = f.get_tensor("single_blocks.0.linear1.weight")
        assert bf16.dtype == torch.bfloat16
        assert bf16.view(torch.int16).numpy().tobytes() == ref["single_blocks.0.linear1.weight"].tobytes()
    assert meta["gguf.architecture"] == "flux"
    assert "comfyquant.container" not in meta and "comfyquant.gguf.types" not in meta  # a safetensors file now


@pytest.mark.needs_torch
def test_convert_to_fp8_requantizes_the_gguf_layers_and_keeps_the_dense_ones(flux, tmp_path, capsys):
    import torch
    from safetensors import safe_open

    path, written = flux
    out = tmp_path / "flux1-tiny-fp8.safetensors"
    # the fixture is a partial Flux (a query norm, no key norm): ComfyUI detects no model from
    # it before or after, so the gate judges the output for the other runtimes only
    rc, _, err = cli(capsys, "convert", path, "--to", "fp8", "-o", out)
    assert rc == 0, err
    ref = reference(path)
    linear = [
        n[: -len(".weight")]
        for n, (t, shape) in written.items()
        if t not in ("F32", "F16", "BF16") and n.endswith(".weight") and len(shape) == 2
    ]
    with safe_open(str(out), "pt") as f:
        keys = set(f.keys())
        for prefix in linear:
            w = f.get_tensor(prefix + ".weight")
            assert w.dtype == torch.float8_e4m3fn, prefix
            assert json.loads(bytes(f.get_tensor(prefix + ".comfy_quant").tolist()))["format"] == "float8_e4m3fn"
            decoded = w.to(torch.float32) * f.get_tensor(prefix + ".weight_scale").to(torch.float32)
            exact = torch.from_numpy(ref[prefix + ".weight"].copy())
            assert (decoded - exact).norm() / exact.norm() < 0.06, prefix
        for name in ("img_in.weight", "time_in.in_layer.weight", "double_blocks.0.img_attn.qkv.bias"):
            assert name in keys and not any(k.startswith(name[: -len(".weight")] + ".comfy_quant") for k in keys)
            got = f.get_tensor(name)
            assert got.numpy().tobytes() == np.ascontiguousarray(ref[name]).tobytes(), name
    rc, report, _ = cli(capsys, "check", out, "--json", "--target", "comfy-kitchen,sglang")
    assert rc == 0 and json.loads(report)["ok"], report
    rc, report, _ = cli(capsys, "check", out, "--json", "--target", "comfyui")
    assert rc == 1 and "Could not detect model type" in json.loads(report)["targets"]["comfyui"]["error"], report


@pytest.mark.needs_torch
def test_migrate_needs_allow_lossy_then_writes_one_comfy_format(tmp_path, capsys):
    from safetensors import safe_open

    path = tmp_path / "flux1-tiny-Q4_K_M.gguf"
    write_gguf(
        path,
        [
            ("img_in.weight", T.F32, (64, 32), False),
            ("double_blocks.0.img_attn.qkv.weight", T.Q4_K, (96, 256), False),
            ("double_blocks.0.img_attn.qkv.bias", T.F32, (96,), False),
            ("double_blocks.0.img_mlp.2.weight", T.Q6_K, (32, 256), False),
        ],
    )
    out = tmp_path / "migrated.safetensors"
    rc, _, err = cli(capsys, "migrate", path, "-o", out)
    assert rc == 2 and "--allow-lossy" in err and err.count("\n") == 1 and not out.exists()  # a MigrateError (InputError)
    rc, text, err = cli(capsys, "migrate", path, "-o", out, "--allow-lossy", "--json")
    assert rc == 0, err + text
    rows = {r["layer"]: r for r in json.loads(text)["layers"]}
    assert {p: (r["verdict"], r["format"]) for p, r in rows.items()} == {
        "double_blocks.0.img_attn.qkv": ("lossy", "int8_tensorwise"),
        "double_blocks.0.img_mlp.2": ("lossy", "int8_tensorwise"),
    }
    assert all(0 < r["error"] < 0.02 for r in rows.values()), rows
    with safe_open(str(out), "np") as f:
        assert f.get_tensor("img_in.weight").tobytes() == reference(path)["img_in.weight"].tobytes()
    rc, report, _ = cli(capsys, "check", out, "--json")
    assert rc == 0 and json.loads(report)["ok"], report


def test_fix_and_mixed_inputs_say_what_a_gguf_file_is(flux, tmp_path, capsys):
    from builders import dense_layer, write

    path, _ = flux
    rc, _, err = cli(capsys, "fix", path, "-o", tmp_path / "fixed.safetensors")
    assert rc == 2 and "a GGUF file: fix repairs safetensors checkpoints" in err and err.count("\n") == 1
    other = write(tmp_path / "other.safetensors", dense_layer("blocks.0"))
    for args in (["check", other, path], ["inspect", path, other]):
        rc, _, err = cli(capsys, *args)
        assert rc == 2 and f"{path}: a GGUF file is read on its own" in err, err
    assert not (tmp_path / "fixed.safetensors").exists()


def test_check_recursive_finds_gguf_files_beside_safetensors(tmp_path, capsys):
    """A models folder mixes .safetensors and .gguf files: each GGUF file is a checkpoint of its
    own, checked as when named alone; a broken one is unreadable with its one-line reason."""
    from comfyquant import check
    from comfyquant.checker.batch import check_tree

    tree = tmp_path / "models"
    (tree / "unet").mkdir(parents=True)
    write_gguf(tree / "unet" / "flux-Q8_0.gguf")
    (tree / "unet" / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "dense_tiny.safetensors")
    (tree / "dense.safetensors").write_bytes(open(example, "rb").read())
    result = check_tree([str(tree)])
    by = {i.label: i for i in result.items}
    assert sorted(by) == ["dense.safetensors", os.path.join("unet", "broken.gguf"), os.path.join("unet", "flux-Q8_0.gguf")]
    alone = check(str(tree / "unet" / "flux-Q8_0.gguf")).to_dict()
    got = by[os.path.join("unet", "flux-Q8_0.gguf")].report.to_dict()
    assert [f["code"] for f in got["findings"]] == [f["code"] for f in alone["findings"]]
    assert got["targets"] == alone["targets"]
    broken = by[os.path.join("unet", "broken.gguf")]
    assert broken.status == "unreadable" and "broken.gguf" in broken.error
    rc, out, err = cli(capsys, "check", "-r", tree)
    assert "flux-Q8_0.gguf" in out and "Traceback" not in out + err
    only = tmp_path / "only"
    (only / "sub").mkdir(parents=True)
    write_gguf(only / "sub" / "m.gguf")
    assert [i.label for i in check_tree([str(only)]).items] == [os.path.join("sub", "m.gguf")]


def test_inspect_reports_the_files_own_types_and_sizes(flux, capsys):
    """inspect tells what the GGUF file holds, not its F32 view: each quantized tensor's ggml type
    and its bytes in the file (the gguf package's own sizes), bits/weight from them, and the
    file's size on disk."""
    from gguf import GGUFReader

    path, written = flux
    rc, out, _ = cli(capsys, "inspect", path, "--json", "--tensors")
    assert rc == 0
    doc = json.loads(out)
    truth = {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in GGUFReader(str(path)).tensors}
    got = {t["name"]: (t["dtype"], t["bytes"]) for t in doc["tensors"]}
    assert got == truth  # dense tensors as stored, quantized ones with their ggml type and block bytes
    assert doc["file_bytes"] == os.path.getsize(path)
    rows = {r["layer"]: r for r in doc["layers"]}
    qkv = rows["double_blocks.0.img_attn.qkv"]
    assert qkv["dtypes"][0]["dtype"] == "Q8_0"
    assert qkv["bytes"] == truth["double_blocks.0.img_attn.qkv.weight"][1]  # the bias is not counted in a layer's bytes
    assert abs(qkv["bits_per_weight"] - 8.5) < 1e-3  # Q8_0: 34 bytes per 32 weights
    assert abs(rows["double_blocks.0.img_mlp.0"]["bits_per_weight"] - 6.5625) < 1e-3  # Q6_K: 210 bytes per 256
