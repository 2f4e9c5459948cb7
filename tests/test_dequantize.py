"""``comfyquant.dequantize`` and ``comfyquant dequantize``: dense round trips of real files.

Checkpoints are written by ``safetensors`` from comfy-kitchen layers (every variant, plus
AWQ/SVDQuant layers and dense tensors), dequantized, and re-read by ``safetensors``:
decoded weights equal the codec's decode, untouched tensors keep their bytes, metadata
survives without the marker keys, and broken inputs are refused with the checker's finding.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

import comfyquant
from comfyquant import codecs
from comfyquant.cli import main
from comfyquant.dequantizer import DequantizeError
from kitchen_fixtures import KitchenLayer, dense_layer, make_layer, seed_defect, write_layers, write_sharded

VARIANTS = [
    "fp8",
    "fp8_static",
    "fp8_e5m2",
    "int8_scalar",
    "int8_rowwise",
    "int8_convrot",
    "w4a8_codebook",
    "w4a8_uniform",
    "w4a8_asym",
    "w6a8",
    "w4a4",
    "w4a4_int8",
    "nvfp4",
    "mxfp8",
]
META = {"modelspec.title": "tiny", "note": "kept"}


def awq_layer(prefix: str, n=32, k=128, seed=0) -> KitchenLayer:
    gen = torch.Generator().manual_seed(seed)
    t = {
        "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
        "weight_scale": (torch.rand(k // 64, n, generator=gen) * 0.01).to(torch.bfloat16),
        "weight_zeros": (torch.randn(k // 64, n, generator=gen) * 0.01).to(torch.bfloat16),
        "bias": torch.zeros(n, dtype=torch.bfloat16),
    }
    m = {"format": "awq_w4a16", "group_size": 64}
    return KitchenLayer(prefix, t, m, m, dict(m), "awq", n, k)


def svdquant_layer(prefix: str, n=128, k=128, r=8, seed=0) -> KitchenLayer:
    gen = torch.Generator().manual_seed(seed)
    t = {
        "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
        "weight_scale": (torch.rand(k // 64, n, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16),
        "weight_proj_down": (torch.randn(k, r, generator=gen) * 0.05).to(torch.bfloat16),
        "weight_proj_up": (torch.randn(n, r, generator=gen) * 0.05).to(torch.bfloat16),
        "weight_smooth_factor": (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16),
    }
    m = {"format": "svdquant_w4a4"}
    return KitchenLayer(prefix, t, m, m, dict(m), "svdquant", n, k)


def model_layers(n=32, k=256) -> list[KitchenLayer]:
    layers = [make_layer(v, prefix=f"blocks.{i}.proj", n=n if v != "nvfp4" else 40, k=k, seed=i) for i, v in enumerate(VARIANTS)]
    layers.append(awq_layer("blocks.90.mod"))
    layers.append(svdquant_layer("blocks.91.attn"))
    layers.append(dense_layer("blocks.0.norm", (k,), dtype=torch.float32))
    layers.append(dense_layer("embed", (64, k), bias=True))
    return layers


def read_all(path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata() or {}


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def expected_dense(layer: KitchenLayer, dtype=None) -> torch.Tensor:
    codec = codecs.get(layer.marker["format"])
    return codec.decode(layer.tensors, layer.marker, dtype=dtype)


def check_output(out_tensors: dict, meta: dict, layers: list[KitchenLayer], dtype=None) -> None:
    names = set()
    for layer in layers:
        if layer.marker is None:
            for suffix, t in layer.tensors.items():
                assert raw(out_tensors[f"{layer.prefix}.{suffix}"]) == raw(t)
                names.add(f"{layer.prefix}.{suffix}")
            continue
        dense = out_tensors[f"{layer.prefix}.weight"]
        want = expected_dense(layer, dtype)
        assert dense.dtype == want.dtype and dense.shape == want.shape and raw(dense) == raw(want), layer.prefix
        names.add(f"{layer.prefix}.weight")
        if "bias" in layer.tensors:
            assert raw(out_tensors[f"{layer.prefix}.bias"]) == raw(layer.tensors["bias"])
            names.add(f"{layer.prefix}.bias")
    assert set(out_tensors) == names  # no markers, scales, codebooks or corrections left
    assert meta == META


@pytest.mark.parametrize("marker_mode", ["tensor", "both"])
def test_single_file_round_trip(tmp_path, marker_mode):
    layers = model_layers()
    src = write_layers(tmp_path / "model.safetensors", layers, marker_mode=marker_mode, metadata=META)
    out = tmp_path / "dense.safetensors"
    summary = comfyquant.dequantize(src, str(out))
    tensors, meta = read_all(out)
    check_output(tensors, meta, layers)
    assert sum(summary.layers.values()) == 16 and summary.layers["asym_w4a8_int8"] == 4
    assert summary.copied == 18 and summary.outputs == [str(out)]
    assert summary.largest_layer[1] == max(t.numel() * t.element_size() for n, t in tensors.items() if n.endswith(".weight"))
    assert oct(os.stat(out).st_mode & 0o777) != oct(0o600)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_sharded_input_to_sharded_and_single_outputs(tmp_path):
    layers = model_layers()
    write_sharded(tmp_path / "src", [layers[:7], layers[7:]], metadata=META)
    out = tmp_path / "dense"
    summary = comfyquant.dequantize(str(tmp_path / "src"), str(out), dtype="f32")
    assert sorted(os.listdir(out)) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    merged: dict = {}
    for shard in sorted(os.listdir(out)):
        if shard.endswith(".safetensors"):
            tensors, meta = read_all(out / shard)
            assert meta == META
            merged.update(tensors)
    check_output(merged, META, layers, dtype="f32")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(merged)
    assert index["weight_map"]["blocks.0.proj.weight"] == "model-00001-of-00002.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in merged.values())
    assert len(summary.outputs) == 2
    one = tmp_path / "one.safetensors"
    comfyquant.dequantize([str(p) for p in sorted((tmp_path / "src").glob("*.safetensors"))], str(one))
    tensors, meta = read_all(one)
    check_output(tensors, meta, layers)


def test_output_dtype_choice(tmp_path):
    layers = [
        make_layer("w4a8_codebook", prefix="a", dtype=torch.float16, seed=1),
        make_layer("nvfp4", prefix="b", bias=False, seed=2),
    ]
    src = write_layers(tmp_path / "m.safetensors", layers, metadata=META)
    comfyquant.dequantize(src, str(tmp_path / "auto.safetensors"))
    tensors, _ = read_all(tmp_path / "auto.safetensors")
    assert tensors["a.weight"].dtype == torch.float16  # the bias's dtype
    assert tensors["b.weight"].dtype == torch.bfloat16  # nothing to go by
    comfyquant.dequantize(src, str(tmp_path / "f16.safetensors"), dtype="f16")
    tensors, _ = read_all(tmp_path / "f16.safetensors")
    assert {t.dtype for n, t in tensors.items() if n.endswith(".weight")} == {torch.float16}
    assert raw(tensors["b.weight"]) == raw(expected_dense(layers[1], "f16"))
    with pytest.raises(DequantizeError, match="^dtype must be one of bf16, f16, f32"):
        comfyquant.dequantize(src, str(tmp_path / "x.safetensors"), dtype="int8")


def test_large_layer_is_written_in_row_blocks(tmp_path, monkeypatch):
    import comfyquant.formats.codec as base

    monkeypatch.setattr(base, "DEFAULT_BLOCK_ELEMENTS", 64 * 256)
    monkeypatch.setattr(base, "ROTATED_BLOCK_ELEMENTS", 64 * 256)  # both layers here are rotated
    layers = [make_layer("int8_convrot", prefix="big", n=300, k=256), make_layer("w4a8_codebook", prefix="w", n=200, k=256)]
    src = write_layers(tmp_path / "m.safetensors", layers)
    seen = []
    # The blocks the writer receives (a ConvRot INT8 layer is un-rotated in one GEMM, as
    # comfy-kitchen does, then handed out in the same row blocks).
    monkeypatch.setattr(base.Codec, "iter_decode", _wrap_blocks(base.Codec.iter_decode, seen))
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert max(seen) == 64 and len(seen) >= 9
    tensors, _ = read_all(tmp_path / "d.safetensors")
    for layer in layers:
        assert raw(tensors[f"{layer.prefix}.weight"]) == raw(expected_dense(layer))


def _wrap_blocks(fn, seen):
    def wrapped(*args, **kwargs):
        for block in fn(*args, **kwargs):
            seen.append(block.shape[0])
            yield block

    return wrapped


# -- refusals ---------------------------------------------------------------------------------


def test_refuses_layers_the_checker_finds_broken(tmp_path):
    broken = seed_defect(make_layer("w4a8_asym", prefix="blocks.0.mlp.fc1"))
    src = write_layers(tmp_path / "m.safetensors", [make_layer("fp8", prefix="ok"), broken])
    out = tmp_path / "d.safetensors"
    with pytest.raises(
        DequantizeError,
        match=r"refusing to dequantize: layer blocks\.0\.mlp\.fc1 \(asym_w4a8_int8\): "
        r"weight_correction is BF16 \(32, 16\), expected F32 \(16, 32\).*\[L004\]",
    ):
        comfyquant.dequantize(src, str(out))
    assert not out.exists()


def test_refuses_unmarked_quantized_weights_and_unknown_formats(tmp_path):
    unmarked = make_layer("int8_rowwise", prefix="lost").with_marker(None)
    src = write_layers(tmp_path / "m.safetensors", [unmarked])
    with pytest.raises(DequantizeError, match="refusing to dequantize: .*lost"):
        comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    odd = make_layer("fp8", prefix="odd").with_marker({"format": "float8_e4m3fn_blockwise", "group_size": 64})
    src2 = write_layers(tmp_path / "m2.safetensors", [odd])
    with pytest.raises(DequantizeError, match="refusing to dequantize"):
        comfyquant.dequantize(src2, str(tmp_path / "d2.safetensors"))


def test_refuses_to_overwrite_its_input(tmp_path):
    src = write_layers(tmp_path / "m.safetensors", [make_layer("fp8", prefix="a")])
    before = open(src, "rb").read()
    with pytest.raises(DequantizeError, match="refusing to overwrite the input checkpoint"):
        comfyquant.dequantize(src, src)
    os.link(src, tmp_path / "alias.safetensors")
    with pytest.raises(DequantizeError, match="refusing to overwrite the input checkpoint"):
        comfyquant.dequantize(src, str(tmp_path / "alias.safetensors"))
    write_sharded(tmp_path / "shards", [[make_layer("fp8", prefix="a")], [make_layer("nvfp4", prefix="b")]])
    with pytest.raises(DequantizeError, match="refusing to overwrite"):
        comfyquant.dequantize(str(tmp_path / "shards"), str(tmp_path / "shards"))
    assert open(src, "rb").read() == before


# -- CLI --------------------------------------------------------------------------------------


def test_summary_times_the_torch_import_apart(monkeypatch, tmp_path):
    """A fresh import of torch (the start-up) is not counted in the run's seconds."""
    import comfyquant.dequantizer as dq

    ticks = iter([0.0, 5.0, 5.0] + [5.0 + i for i in range(1, 1000)])
    monkeypatch.setattr(dq.time, "perf_counter", lambda: next(ticks))
    src = write_layers(tmp_path / "m.safetensors", [make_layer("fp8", prefix="x")])
    summary = comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert summary.startup == 5.0 and summary.seconds >= 1.0
    assert "after 5.0 s loading torch" in summary.render()


def test_cli_writes_and_summarizes(tmp_path, capsys):
    src = write_layers(tmp_path / "m.safetensors", model_layers(), metadata=META)
    out = tmp_path / "d.safetensors"
    assert main(["dequantize", src, str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "dequantized 16 layers" in text and f"wrote {out}" in text and "copied 18 tensors" in text
    assert main(["dequantize", src, str(tmp_path / "e.safetensors"), "--json", "--dtype", "f32"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dtype"] == "f32" and doc["layers"]["nvfp4"] == 1 and doc["outputs"] == [str(tmp_path / "e.safetensors")]
    assert doc["seconds"] > 0 and doc["startup_seconds"] >= 0  # torch's import timed apart from the run
    assert main(["dequantize", src, str(tmp_path / "p.safetensors"), "--progress"]) == 0


def test_cli_refusal_is_one_line_and_exit_2(tmp_path, capsys):
    src = write_layers(tmp_path / "m.safetensors", [seed_defect(make_layer("w4a8_asym", prefix="x"))])
    assert main(["dequantize", src, str(tmp_path / "d.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("comfyquant: refusing to dequantize: layer x")
    assert main(["dequantize", str(tmp_path / "missing.safetensors"), str(tmp_path / "d.safetensors")]) == 2
    assert "missing.safetensors" in capsys.readouterr().err


def test_cli_module_top_stays_light():
    import subprocess
    import sys

    code = (
        "import sys; from comfyquant.cli import _build_parser; _build_parser('dequantize'); "
        "print(sorted(m for m in ('torch', 'rich', 'numpy', 'comfyquant.codecs') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rotated_layers_decode_in_smaller_blocks():
    """The decode block size follows the format description's rotation: ConvRot layers (W4A8,
    W4A4, INT8 with ``convrot: true``) use the smaller blocks, the others the default."""
    import comfyquant.formats.codec as base

    w = (torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    cases = [
        ("int8_tensorwise", {"per_channel": True, "convrot": True}, base.ROTATED_BLOCK_ELEMENTS),
        ("int8_tensorwise", {"per_channel": True}, base.DEFAULT_BLOCK_ELEMENTS),
        ("asym_w4a8_int8", {}, base.ROTATED_BLOCK_ELEMENTS),
        ("convrot_w4a4", {}, base.ROTATED_BLOCK_ELEMENTS),
        ("float8_e4m3fn", {}, base.DEFAULT_BLOCK_ELEMENTS),
        ("mxfp8", {}, base.DEFAULT_BLOCK_ELEMENTS),
    ]
    assert base.ROTATED_BLOCK_ELEMENTS < base.DEFAULT_BLOCK_ELEMENTS
    for fmt, kw, want in cases:
        codec = codecs.get(fmt)
        enc = codec.encode(w, **kw)
        assert codec.decode_block_elements(codec.plan(dict(enc), enc.marker).env) == want, (fmt, kw)


# -- output safety: space, all-or-nothing shards, checked before the rename --------------------


def test_refuses_at_once_when_the_output_cannot_fit(tmp_path, monkeypatch, capsys):
    """The dense size is known from the plan: too little free space is one line before any
    byte is written, naming what is needed and what is free."""
    import comfyquant.io.writer as writer

    src = write_layers(tmp_path / "m.safetensors", model_layers(), metadata=META)
    started = []
    monkeypatch.setattr(writer, "free_bytes", lambda folder: 1000)
    monkeypatch.setattr(writer.tempfile, "mkstemp", lambda *a, **k: started.append(1) or pytest.fail("wrote"))
    out = tmp_path / "out"
    assert main(["dequantize", src, str(tmp_path / "d.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d.safetensors: cannot write (needs " in err and "only 1000 B free on" in err
    assert "nothing was written" in err
    write_sharded(tmp_path / "src", [model_layers()[:7], model_layers()[7:]], metadata=META)
    with pytest.raises(DequantizeError, match=r"cannot write \(needs .* free on"):
        comfyquant.dequantize(str(tmp_path / "src"), str(out))
    assert not started and os.listdir(out) == []


def test_writer_checks_each_file_against_free_space(tmp_path, monkeypatch):
    """Every command's writer refuses a file that cannot fit before creating it (quantize and
    fix use it too); the exact size, header included, is compared."""
    import comfyquant.io.writer as writer

    tensors = {"a": ("F32", (256,), b"\0" * 1024)}
    need = len(writer.build_header(tensors, None)) + 1024
    monkeypatch.setattr(writer, "free_bytes", lambda folder: need - 1)
    with pytest.raises(writer.NoSpace, match=rf"needs {need:,} bytes, only {need - 1:,} bytes free on "):
        writer.write_safetensors(str(tmp_path / "x.safetensors"), tensors)
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(writer, "free_bytes", lambda folder: need)
    writer.write_safetensors(str(tmp_path / "x.safetensors"), tensors)
    assert os.listdir(tmp_path) == ["x.safetensors"]


def test_quantize_and_fix_refuse_outputs_that_cannot_fit(tmp_path, monkeypatch, capsys):
    import comfyquant.io.writer as writer

    broken = write_layers(tmp_path / "b.safetensors", [seed_defect(make_layer("w4a8_asym", prefix="x"))])
    dense = write_layers(tmp_path / "dense.safetensors", [dense_layer("blocks.0.fc", (64, 256))])
    before = {p: open(p, "rb").read() for p in (broken, dense)}
    monkeypatch.setattr(writer, "free_bytes", lambda folder: 10)
    assert main(["fix", broken, "-o", str(tmp_path / "f.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "f.safetensors: cannot write (needs" in err and "only 10 B free" in err and err.count("\n") == 1
    assert main(["quantize", dense, str(tmp_path / "q.safetensors"), "-f", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "q.safetensors: cannot write (needs" in err and "nothing was written" in err
    assert sorted(os.listdir(tmp_path)) == ["b.safetensors", "dense.safetensors"]
    assert all(open(p, "rb").read() == b for p, b in before.items())


def test_a_failing_shard_leaves_no_output_shard(tmp_path, monkeypatch):
    """Shards are renamed into place together, after all are written and checked: a failure
    writing the second leaves no first shard behind, and no temporary file."""
    import comfyquant.io.writer as writer

    write_sharded(tmp_path / "src", [model_layers()[:7], model_layers()[7:]], metadata=META)
    real, calls = writer.write_safetensors, []

    def second_fails(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(writer, "write_safetensors", second_fails)
    out = tmp_path / "dense"
    with pytest.raises(DequantizeError, match=r"model-00002-of-00002.safetensors: cannot write \(No space left"):
        comfyquant.dequantize(str(tmp_path / "src"), str(out))
    assert len(calls) == 2 and os.listdir(out) == []


def test_output_is_checked_before_it_is_renamed(tmp_path, monkeypatch):
    """A written file that does not hold what was planned (here: the plan's size of one
    weight is made wrong, as a writer bug would) is refused and never appears."""
    import comfyquant.dequantizer as dq

    src = write_layers(tmp_path / "m.safetensors", model_layers(), metadata=META)
    real = dq._Work.output

    def wrong_size(self, names, metadata):
        tensors, meta = real(self, names, metadata)
        self.sizes["blocks.0.proj.weight"] += 2
        return tensors, meta

    monkeypatch.setattr(dq._Work, "output", wrong_size)
    with pytest.raises(DequantizeError, match=r"does not hold the planned tensors \(first: 'blocks.0.proj.weight'\)"):
        comfyquant.dequantize(src, str(tmp_path / "d.safetensors"))
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_cli_output_by_option_like_fix(tmp_path, capsys):
    """``-o OUT`` works as the last positional does (``fix`` takes ``-o``); without either the
    output gets its default name, as ``fix``'s does (``<name>.dense.safetensors`` next to the
    input), and a second run refuses to replace it with one line (the output rule every writing command shares)."""
    src = write_layers(tmp_path / "m.safetensors", model_layers(), metadata=META)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert main(["dequantize", src, "-o", str(a), "--no-progress"]) == 0
    assert main(["dequantize", src, str(b), "--no-progress"]) == 0
    assert a.read_bytes() == b.read_bytes()
    capsys.readouterr()
    default = tmp_path / "m.dense.safetensors"
    assert main(["dequantize", src, "--no-progress"]) == 0
    assert capsys.readouterr().err == "" and default.read_bytes() == a.read_bytes()
    assert main(["dequantize", src]) == 2
    assert capsys.readouterr().err == f"comfyquant: {default}: exists; pass --overwrite to replace it\n"
    q = tmp_path / "q.safetensors"
    dense = write_layers(tmp_path / "dense.safetensors", [dense_layer("blocks.0.fc", (64, 256))])
    assert main(["quantize", dense, "-o", str(q), "-f", "fp8", "--no-progress"]) == 0 and q.exists()
    c = tmp_path / "c.safetensors"
    assert main(["convert", str(q), "-o", str(c), "-t", "nvfp4", "--no-progress"]) == 0 and c.exists()


def test_space_test_can_be_turned_off_and_skips_filesystems_without_sizes(tmp_path, monkeypatch):
    import comfyquant.io.writer as writer

    class Stat:
        f_blocks, f_bfree, f_bavail, f_frsize = 0, 0, 0, 4096

    monkeypatch.setattr(writer.os, "statvfs", lambda folder: Stat())
    assert writer.free_bytes(str(tmp_path)) is None  # no sizes reported: not a reason to refuse
    Stat.f_blocks = 100
    assert writer.free_bytes(str(tmp_path)) == 0
    monkeypatch.setenv("COMFYQUANT_NO_SPACE_CHECK", "1")
    assert writer.free_bytes(str(tmp_path)) is None
    src = write_layers(tmp_path / "m.safetensors", model_layers(), metadata=META)
    comfyquant.dequantize(src, str(tmp_path / "d.safetensors"), progress=False)
    assert (tmp_path / "d.safetensors").exists()


def test_f16_overflow_is_reported(tmp_path, capsys):
    """Dense F16 holds at most 65504: an FP8 layer scaled beyond that decodes to +-inf (as
    comfy-kitchen's decode cast to F16 does), and the summary says how many values and where."""
    layer = make_layer("fp8", prefix="blocks.0.big", bias=False)
    layer.tensors["weight_scale"] = torch.tensor(1000.0)  # codes up to 448 -> values up to 448000
    ok = make_layer("fp8", prefix="blocks.1.ok", bias=False, seed=1)
    src = write_layers(tmp_path / "m.safetensors", [layer, ok])
    out = tmp_path / "d.safetensors"
    summary = comfyquant.dequantize(src, str(out), dtype="f16", progress=False)
    dense = read_all(out)[0]["blocks.0.big.weight"]
    expected = int(torch.isinf(dense).sum())
    assert expected > 0 and summary.overflowed == {"blocks.0.big": expected}
    assert summary.to_dict()["overflowed"] == {"blocks.0.big": expected}
    assert f"{expected} values in 1 layer exceed F16's range" in summary.render()
    assert comfyquant.dequantize(src, str(tmp_path / "b.safetensors"), dtype="bf16", progress=False).overflowed == {}
