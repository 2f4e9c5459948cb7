"""``compare A B`` and the ``--max-error`` / ``--reference`` quality gates.

Every figure ``compare`` prints is checked against a direct torch computation (F64) on
weights decoded another way: comfyquant's whole-layer ``codec.decode``, comfy-kitchen's own
``dequantize`` for files comfy-kitchen wrote, and comfy-kitchen's FP8 dequantize for a
ComfyUI legacy scaled-FP8 file (a dialect, read through its Comfy view).  The gates are run
through the CLI: exit codes, output names, the layers named worst first, and convert's
``--reference`` measuring against the original weights rather than the decoded input.
"""

from __future__ import annotations

import json
import os
import tempfile

import comfy_kitchen as ck
import pytest
import torch
from comfy_kitchen.tensor import QuantizedTensor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.checker.run import check
from comfyquant.cli import main
from comfyquant.comparison import compare
from kitchen_fixtures import VARIANTS, decoded_layer, make_layer, make_weight, moe_bank_layer, write_layers
from test_dialect_legacy import legacy_file
from test_fuzz_commands import build, digest, mutation

# Deliberately not in model order as written: blocks.10 after blocks.2 after blocks.1.
LAYERS = (("blocks.10.mlp.fc1", 128, 256), ("blocks.2.attn.qkv", 128, 512), ("blocks.1.attn.qkv", 256, 256))
MODEL_ORDER = ["blocks.0.norm1", "blocks.1.attn.qkv", "blocks.2.attn.qkv", "blocks.10.mlp.fc1", "token_embed"]


def dense_model(path, layers=LAYERS, dtype=torch.bfloat16, seed=0) -> str:
    sd = {}
    for i, (name, n, k) in enumerate(layers):
        sd[f"{name}.weight"] = make_weight(n, k, dtype, seed=seed + i)
        sd[f"{name}.bias"] = (torch.arange(n, dtype=torch.float32) / 1000).to(dtype)
    sd["blocks.0.norm1.weight"] = torch.ones(256, dtype=dtype)
    sd["token_embed.weight"] = make_weight(16, 256, dtype, seed=99)
    save_file(sd, str(path))
    return str(path)


def direct(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(||a-b|| / ||b||, cosine, max |a-b|), computed whole in F64."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    rel = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
    cos = float(a @ b / (torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b)))
    return rel, cos, float((a - b).abs().max())


def assert_figures(row, a: torch.Tensor, b: torch.Tensor) -> None:
    rel, cos, top = direct(a, b)
    assert row.rel_l2 == pytest.approx(rel, rel=1e-5, abs=1e-9), row.layer
    assert row.cosine == pytest.approx(cos, abs=1e-6), row.layer
    assert row.max_abs == pytest.approx(top, rel=1e-6, abs=1e-9), row.layer


def run_cli(args, capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def quantized(tmp_path, fmt: str, name: str = "q.safetensors", src: str | None = None) -> tuple[str, str]:
    src = src or dense_model(tmp_path / "dense.safetensors")
    out = str(tmp_path / name)
    result = comfyquant.quantize(src, out, fmt, target="comfy-kitchen", progress=False)
    assert result.ok and len(result.plan.quantized) == 3
    return src, out


# -- compare: figures ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["nvfp4", "int8", "w4a8", "fp8", "mxfp8", "w4a4"])
def test_figures_equal_a_direct_computation_in_model_order(tmp_path, fmt):
    src, out = quantized(tmp_path, fmt)
    result = compare(out, src, progress=False)
    assert [r.layer for r in result.layers] == MODEL_ORDER
    assert result.only_a == result.only_b == [] and not result.refused
    dense = load_file(src)
    for row in result.layers:
        b = dense[f"{row.layer}.weight"]
        if row.layer.endswith(("qkv", "fc1")):
            a = decoded_layer(out, row.layer)  # the whole-layer decode, not compare's row blocks
            assert a.dtype == torch.bfloat16 and row.a not in ("", "-") and not row.a.startswith("dense")
            assert row.rel_l2 > 1e-4  # a quantization error, not a layer compared with itself
        else:
            a = load_file(out)[f"{row.layer}.weight"]
            assert row.a == "dense BF16" and row.rel_l2 == 0.0 and row.max_abs == 0.0
        assert_figures(row, a, b)
    s = result.summary()
    worst = max(result.layers, key=lambda r: r.rel_l2)
    assert s["rel_l2_max_layer"] == worst.layer and s["rel_l2_max"] == worst.rel_l2
    assert s["rel_l2_mean"] == pytest.approx(sum(r.rel_l2 for r in result.layers) / len(result.layers))


def test_b_is_the_reference_and_two_quantized_files_compare(tmp_path):
    src, q1 = quantized(tmp_path, "nvfp4", "a.safetensors")
    _, q2 = quantized(tmp_path, "int8", "b.safetensors", src=src)
    dense = load_file(src)
    swapped = compare(src, q1, progress=False)  # the dense file measured against the quantized one
    both = compare(q1, q2, progress=False)
    for name, *_ in LAYERS:
        row = next(r for r in swapped.layers if r.layer == name)
        assert_figures(row, dense[f"{name}.weight"], decoded_layer(q1, name))
        row = next(r for r in both.layers if r.layer == name)
        assert (row.a, row.b) == ("nvfp4", "int8_tensorwise")
        assert_figures(row, decoded_layer(q1, name), decoded_layer(q2, name))
    assert [r.layer for r in both.layers] == MODEL_ORDER


@pytest.mark.parametrize("variant", ["nvfp4", "int8_convrot", "w4a8_codebook", "mxfp8", "fp8"])
def test_files_comfy_kitchen_wrote(tmp_path, variant):
    """comfy-kitchen's quantization in the file, comfy-kitchen's dequantize as the truth."""
    names = ["blocks.3.attn.qkv", "blocks.12.attn.qkv"]
    layers = [make_layer(variant, prefix=p, n=64, k=256, seed=i) for i, p in enumerate(names)]
    path = write_layers(tmp_path / "ck.safetensors", layers)
    ref = {f"{p}.weight": make_weight(64, 256, seed=i) for i, p in enumerate(names)}
    save_file(ref, str(tmp_path / "ref.safetensors"))
    result = compare(path, str(tmp_path / "ref.safetensors"), progress=False)
    assert [r.layer for r in result.layers] == names  # model order: blocks.3 before blocks.12
    v = VARIANTS[variant]
    for i, row in enumerate(result.layers):
        kw = dict(v.kwargs)
        if v.format == "asym_w4a8_int8":
            kw.update(group_size=16, convrot_groupsize=256)
        elif kw.get("convrot"):
            kw["convrot_groupsize"] = 256
        truth = QuantizedTensor.from_float(make_weight(64, 256, seed=i), v.layout, **kw).dequantize().to(torch.bfloat16)
        assert_figures(row, truth, ref[f"{row.layer}.weight"])
        assert row.a == v.format and row.b == "dense BF16"


def test_a_dialect_file_against_its_dense_original(tmp_path):
    """A ComfyUI legacy scaled-FP8 file (no markers, ``scale_weight``, the ``scaled_fp8``
    sentinel) is compared through its Comfy view with the weights it was made from."""
    path = tmp_path / "legacy.safetensors"
    sd = legacy_file(path)
    # The originals, from the generator sequence legacy_file draws (weight, then bias, per layer).
    g = torch.Generator().manual_seed(0)
    original = {}
    for name in ("blocks.0.attn.qkv", "blocks.0.mlp.fc1"):
        original[f"{name}.weight"] = torch.randn(64, 256, generator=g) * 0.05
        torch.randn(64, generator=g)
    original["final_layer.linear.weight"] = sd["final_layer.linear.weight"]
    original["norm.weight"] = sd["norm.weight"]
    save_file(original, str(tmp_path / "orig.safetensors"))
    result = compare(str(path), str(tmp_path / "orig.safetensors"), progress=False)
    assert [r.layer for r in result.layers] == ["blocks.0.attn.qkv", "blocks.0.mlp.fc1", "final_layer.linear", "norm"]
    for row in result.layers[:2]:
        assert row.a == "float8_e4m3fn" and row.b == "dense F32"
        truth = ck.dequantize_per_tensor_fp8(sd[f"{row.layer}.weight"], sd[f"{row.layer}.scale_weight"], torch.bfloat16)
        assert_figures(row, truth, original[f"{row.layer}.weight"])
        assert 1e-3 < row.rel_l2 < 0.1
    assert [(r.rel_l2, r.max_abs) for r in result.layers[2:]] == [(0.0, 0.0), (0.0, 0.0)]


def test_padded_decode_compares_the_models_part(tmp_path):
    """An NVFP4 layer without a bias whose N is not a multiple of 16 decodes padded (nothing
    in the file records the model's N): its first N rows are compared, and the note says so."""
    layer = make_layer("nvfp4", prefix="blocks.0.proj", n=40, k=256, bias=False)
    path = write_layers(tmp_path / "ck.safetensors", [layer])
    weight = make_weight(40, 256, seed=0)
    save_file({"blocks.0.proj.weight": weight}, str(tmp_path / "ref.safetensors"))
    [row] = compare(path, str(tmp_path / "ref.safetensors"), progress=False).layers
    decoded = decoded_layer(path, "blocks.0.proj")
    if tuple(decoded.shape) == (40, 256):
        pytest.skip("this NVFP4 layer records its model shape")
    assert tuple(decoded.shape) == (48, 256) and row.compared and "padded shape [48, 256]" in row.note
    assert_figures(row, decoded[:40], weight)


def test_only_in_one_file_differing_shapes_and_layer_globs(tmp_path, capsys):
    a = {
        "blocks.1.x.weight": make_weight(32, 64, seed=1),
        "blocks.2.y.weight": make_weight(32, 64, seed=2),
        "only_a.weight": make_weight(8, 64, seed=3),
        "idx.weight": torch.arange(8, dtype=torch.int64),
        "wide.weight": make_weight(4, 8, torch.float64, seed=6),
    }
    b = {
        "blocks.1.x.weight": make_weight(32, 64, seed=4),
        "blocks.2.y.weight": make_weight(64, 32, seed=2),
        "only_b.weight": make_weight(8, 64, seed=5),
        "idx.weight": torch.arange(8, dtype=torch.int64),
        "wide.weight": make_weight(4, 8, torch.float32, seed=7),
    }
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    result = compare(str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), progress=False)
    assert result.only_a == ["only_a"] and result.only_b == ["only_b"]
    by = {r.layer: r for r in result.layers}
    assert by["blocks.2.y"].refused == "shapes differ: A (dense BF16) is [32, 64], B (dense BF16) is [64, 32]"
    assert "neither a float weight nor a quantized layer" in by["idx"].refused
    assert_figures(by["blocks.1.x"], a["blocks.1.x.weight"], b["blocks.1.x.weight"])
    assert (by["wide"].a, by["wide"].b) == ("dense F64", "dense F32")
    assert_figures(by["wide"], a["wide.weight"], b["wide.weight"])
    code, out, _ = run_cli(
        ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--layers", "blocks.*"], capsys
    )
    assert code == 0
    assert "not compared: blocks.2.y: shapes differ" in out and "only_a" not in out and "idx" not in out
    code, out, _ = run_cli(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["only_a"] == ["only_a"] and doc["only_b"] == ["only_b"]
    assert [r["layer"] for r in doc["layers"]] == ["blocks.1.x", "blocks.2.y", "idx", "wide"]
    assert doc["layers"][0]["rel_l2"] == pytest.approx(direct(a["blocks.1.x.weight"], b["blocks.1.x.weight"])[0], rel=1e-5)


def test_nonfinite_values_are_reported_not_hidden(tmp_path, capsys):
    w = make_weight(32, 64, seed=1)
    bad = w.clone()
    bad[3, 5] = float("nan")
    save_file({"l.weight": bad}, str(tmp_path / "a.safetensors"))
    save_file({"l.weight": w}, str(tmp_path / "b.safetensors"))
    code, out, _ = run_cli(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json"], capsys)
    row = json.loads(out)["layers"][0]
    assert code == 0 and row["nonfinite"] == 1 and row["rel_l2"] is None
    code, out, _ = run_cli(
        ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--max-error", "0.5"], capsys
    )
    assert code == 1 and "NaN/Inf" in out and "FAILED: 1 layer above it" in out


def test_cli_table_sort_plot_and_gate(tmp_path, capsys):
    src, out = quantized(tmp_path, "nvfp4")
    png = str(tmp_path / "cmp.png")
    code, text, _ = run_cli(["compare", out, src, "--sort", "error", "--plot", png, "--no-progress"], capsys)
    assert code == 0 and os.path.getsize(png) > 1000
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("  blocks.") or ln.startswith("  token")]
    errors = [float(cells[-3]) for cells in lines]
    assert errors == sorted(errors, reverse=True) and len(lines) == 5
    result = compare(out, src, progress=False)
    mid = sorted(r.rel_l2 for r in result.compared)[-2]  # the second worst: exactly one layer above it
    code, text, _ = run_cli(["compare", out, src, "--max-error", repr(mid)], capsys)
    worst = max(result.compared, key=lambda r: r.rel_l2).layer
    assert code == 1 and f"FAILED: 1 layer above it (worst first): {worst} " in text
    code, _, _ = run_cli(["compare", out, src, "--max-error", "1"], capsys)
    assert code == 0


def test_broken_inputs_are_refused_in_one_line(tmp_path, capsys):
    layer = make_layer("int8_convrot", prefix="blocks.0.q").with_marker(None)  # quantized, no marker
    path = write_layers(tmp_path / "broken.safetensors", [layer])
    save_file({"blocks.0.q.weight": make_weight(32, 256)}, str(tmp_path / "ref.safetensors"))
    code, _, err = run_cli(["compare", path, str(tmp_path / "ref.safetensors")], capsys)
    assert code == 2 and err.startswith(f"comfyquant: refusing to compare {path}:") and len(err.splitlines()) == 1
    code, _, err = run_cli(["compare", str(tmp_path / "missing.safetensors"), str(tmp_path / "ref.safetensors")], capsys)
    assert code == 2 and "missing.safetensors" in err


# -- the --max-error gate and --reference ----------------------------------------------------


def _errors(doc: dict, key: str = "weight") -> dict[str, float]:
    return {
        r["layer"]: (r["reference"] if key == "reference" else r)["weight"]["rel_l2"] for r in doc["layers"] if r.get("weight")
    }


def test_quantize_gate_passes_and_fails_with_exit_codes_and_names(tmp_path, capsys):
    src = dense_model(tmp_path / "dense.safetensors")
    out = str(tmp_path / "q.safetensors")
    over = str(tmp_path / "q.over-max-error.safetensors")
    code, text, _ = run_cli(["quantize", src, out, "-f", "int8", "--no-progress", "--json"], capsys)
    errors = _errors(json.loads(text))
    assert code == 0 and len(errors) == 3
    os.unlink(out)
    limit = sorted(errors.values())[0]  # the best layer passes, the two others do not
    code, text, _ = run_cli(["quantize", src, out, "-f", "int8", "--no-progress", "--max-error", repr(limit)], capsys)
    above = sorted((n for n in errors if errors[n] > limit), key=lambda n: -errors[n])
    assert code == 1 and not os.path.exists(out) and os.path.exists(over)
    assert f"FAILED: 2 layers above {limit:g}" in text and f"{above[0]} {errors[above[0]]:.4f}, {above[1]}" in text
    assert f"wrote {over}" in text and check(over, target="all").ok
    # the same run over the limit leaves a file it cannot silently replace
    code, _, err = run_cli(["quantize", src, out, "-f", "int8", "--no-progress", "--max-error", repr(limit)], capsys)
    assert code == 2 and "q.over-max-error.safetensors: exists; pass --overwrite" in err and "--max-error" in err
    code, text, _ = run_cli(
        ["quantize", src, out, "-f", "int8", "--no-progress", "--max-error", "0.5", "--json", "--overwrite"], capsys
    )
    doc = json.loads(text)
    assert (
        code == 0
        and os.path.exists(out)
        and doc["max_error"] == {"limit": 0.5, "against": "source", "ok": True, "measured": 3, "over": []}
    )
    code, _, err = run_cli(["quantize", src, out, "-f", "int8", "--max-error", "-1", "--overwrite"], capsys)
    assert code == 2 and "--max-error must be a finite number >= 0" in err


def test_quantize_gate_default_name_and_sharded_folder(tmp_path, capsys):
    src = dense_model(tmp_path / "dense.safetensors")
    code, _, _ = run_cli(
        ["quantize", src, "-f", "nvfp4", "--target", "comfy-kitchen", "--no-progress", "--max-error", "0.001"], capsys
    )
    assert code == 1
    assert sorted(os.listdir(tmp_path)) == ["dense.nvfp4.over-max-error.safetensors", "dense.safetensors"]
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"a.weight": make_weight(64, 256, seed=1)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": make_weight(64, 256, seed=2)}, str(folder / "model-00002-of-00002.safetensors"))
    out = str(tmp_path / "out")
    code, _, _ = run_cli(["quantize", str(folder), out, "-f", "int8", "--no-progress", "--max-error", "0.0001"], capsys)
    assert code == 1 and not os.path.exists(out)
    kept = tmp_path / "out.over-max-error"
    assert sorted(os.listdir(kept)) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert check(str(kept), target="all").ok


def test_convert_reference_measures_against_the_original(tmp_path, capsys):
    src, q = quantized(tmp_path, "nvfp4")
    out = str(tmp_path / "c.safetensors")
    code, text, _ = run_cli(["convert", q, out, "--to", "int8", "--reference", src, "--no-progress", "--json"], capsys)
    doc = json.loads(text)
    assert code == 0 and doc["reference"] == src
    vs_input = compare(out, q, progress=False)
    vs_original = compare(out, src, progress=False)
    for row in doc["layers"]:
        if not row.get("weight"):
            continue
        name = row["layer"]
        want = next(r for r in vs_original.layers if r.layer == name).rel_l2
        got = next(r for r in vs_input.layers if r.layer == name).rel_l2
        assert row["reference"]["weight"]["rel_l2"] == pytest.approx(want, rel=1e-4)
        assert row["weight"]["rel_l2"] == pytest.approx(got, rel=1e-4)
        assert row["reference"]["weight"]["rel_l2"] > 3 * row["weight"]["rel_l2"]  # NVFP4's own error is in it
    # a limit between the two: passes against the decoded input, fails against the original
    limit = 2 * max(_errors(doc).values())
    assert limit < min(_errors(doc, "reference").values())
    code, text, _ = run_cli(
        ["convert", q, out, "--to", "int8", "--max-error", repr(limit), "--overwrite", "--no-progress"], capsys
    )
    assert code == 0 and "max-error gate: passed" in text
    os.unlink(out)
    code, text, _ = run_cli(
        ["convert", q, out, "--to", "int8", "--reference", src, "--max-error", repr(limit), "--no-progress"], capsys
    )
    assert code == 1 and not os.path.exists(out) and os.path.exists(str(tmp_path / "c.over-max-error.safetensors"))
    assert "FAILED: 3 layers" in text and "against the reference" in text and "vs reference" in text


def test_reference_that_cannot_serve_is_refused_up_front(tmp_path, capsys):
    src, q = quantized(tmp_path, "int8")
    other = str(tmp_path / "other.safetensors")
    save_file({"blocks.1.attn.qkv.weight": make_weight(256, 256)}, other)
    out = str(tmp_path / "c.safetensors")
    code, _, err = run_cli(["convert", q, out, "--to", "fp8", "--reference", other, "--no-progress"], capsys)
    assert code == 2 and "has no tensor 'blocks.2.attn.qkv.weight'" in err and not os.path.exists(out)
    save_file({f"{n}.weight": make_weight(k, n_, seed=1) for n, n_, k in LAYERS}, other)  # transposed shapes
    code, _, err = run_cli(["quantize", src, out, "-f", "int8", "--reference", other, "--no-progress"], capsys)
    assert code == 2 and "not the original of this layer" in err and not os.path.exists(out)
    code, _, err = run_cli(["convert", q, out, "--to", "dense", "--reference", src], capsys)
    assert code == 2 and "--reference" in err


def test_quantize_reference_is_reported_per_layer(tmp_path, capsys):
    src = dense_model(tmp_path / "dense.safetensors")
    # the reference is the F32 original; quantize reads a BF16 copy of it
    ref = dense_model(tmp_path / "orig.safetensors", dtype=torch.float32)
    out = str(tmp_path / "q.safetensors")
    result = comfyquant.quantize(src, out, "int8", reference=ref, progress=False)
    rows = [r for r in result.doc["layers"] if r.get("weight")]
    original = load_file(ref)
    for row in rows:
        truth = direct(decoded_layer(out, row["layer"]), original[f"{row['layer']}.weight"])[0]
        assert row["reference"]["weight"]["rel_l2"] == pytest.approx(truth, rel=1e-4)
        assert row["reference"]["weight"]["rel_l2"] != row["weight"]["rel_l2"]
    # worker processes read the reference themselves: the same figures as one job's, which
    # computes with one thread as each worker does (MKL may split an F32 GEMM's sums by thread
    # count: on AVX2 the figures of 1 and 2 threads differ in the 5th digit)
    again = comfyquant.quantize(src, str(tmp_path / "q2.safetensors"), "int8", reference=ref, jobs=2, progress=False)
    one = comfyquant.quantize(src, str(tmp_path / "q3.safetensors"), "int8", reference=ref, jobs=1, progress=False)
    assert again.doc["jobs"]["workers"] == 2 and one.doc["jobs"]["workers"] == 0
    assert [r.get("reference") for r in again.doc["layers"]] == [r.get("reference") for r in one.doc["layers"]]
    for mine, theirs in zip(again.doc["layers"], result.doc["layers"]):  # and close to the default run's
        if mine.get("reference"):
            assert mine["reference"]["weight"]["rel_l2"] == pytest.approx(theirs["reference"]["weight"]["rel_l2"], rel=1e-4)


def _int8_unsized(tmp_path):
    layer = make_layer("int8_convrot", prefix="blocks.0.attn.qkv", n=64, k=256, seed=0, convrot_groupsize=256)
    layer = layer.with_marker({k: v for k, v in layer.marker.items() if k != "convrot_groupsize"})
    src = write_layers(tmp_path / "in.safetensors", [layer])
    ref = str(tmp_path / "ref.safetensors")
    save_file({"blocks.0.attn.qkv.weight": make_weight(64, 256, seed=0)}, ref)
    return src, ref


def test_fix_gate(tmp_path, capsys):
    src, ref = _int8_unsized(tmp_path)
    out = str(tmp_path / "out.safetensors")
    over = str(tmp_path / "out.over-max-error.safetensors")
    base = ["fix", src, "-o", out, "--convrot-groupsize", "256", "--reference", ref]
    code, text, _ = run_cli(base + ["--max-error", "0.5"], capsys)
    assert code == 0 and os.path.exists(out) and not os.path.exists(over) and "max-error gate: passed" in text
    os.unlink(out)
    code, text, _ = run_cli(base + ["--max-error", "0.0001"], capsys)
    assert code == 1 and not os.path.exists(out) and os.path.exists(over)
    assert "max-error gate: FAILED: 1 layer above 0.0001" in text and "blocks.0.attn.qkv" in text
    assert check(over, target="all").ok
    code, _, err = run_cli(["fix", src, "-o", out, "--convrot-groupsize", "256", "--max-error", "0.1"], capsys)
    assert code == 2 and "--max-error needs --reference" in err


def test_fix_gate_never_replaces_the_input_in_place(tmp_path, capsys):
    src, ref = _int8_unsized(tmp_path)
    before = open(src, "rb").read()
    code, _, _ = run_cli(
        ["fix", src, "--in-place", "--convrot-groupsize", "256", "--reference", ref, "--max-error", "0.0001"], capsys
    )
    assert code == 1 and open(src, "rb").read() == before
    assert os.path.exists(str(tmp_path / "in.over-max-error.safetensors"))


@pytest.mark.parametrize("variant", ["fp8", "int8_rowwise", "w4a8_codebook"])
def test_moe_expert_banks_against_their_dense_experts(tmp_path, variant):
    """A bank ([E, out, K], stacked or flattened by comfy-kitchen's rule) against the dense
    bank: the decoded experts in order, each compared with its own rows."""
    experts, n, k = 4, 32, 256
    layer, _ = moe_bank_layer(variant, "blocks.0.moe.experts", experts, n, k, seed=3)
    path = write_layers(tmp_path / "bank.safetensors", [layer])
    flat = VARIANTS[variant].format == "asym_w4a8_int8" or VARIANTS[variant].kwargs.get("per_channel")
    dense = (
        make_weight(experts * n, k, seed=3).reshape(experts, n, k)
        if flat
        else torch.stack([make_weight(n, k, seed=3 + e) for e in range(experts)])
    )
    save_file({"blocks.0.moe.experts.weight": dense.contiguous()}, str(tmp_path / "ref.safetensors"))
    [row] = compare(path, str(tmp_path / "ref.safetensors"), progress=False).layers
    assert row.compared and row.shape == [experts, n, k]
    out = str(tmp_path / "dense.safetensors")
    comfyquant.dequantize(path, out, progress=False)  # the dequantizer's writer decodes the bank too
    truth = load_file(out)["blocks.0.moe.experts.weight"]
    assert truth.shape == dense.shape
    assert_figures(row, truth, dense)
    assert 1e-4 < row.rel_l2 < 0.2


FUZZ_EXAMPLES = int(os.environ.get("COMFYQUANT_FUZZ_EXAMPLES", "25"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(mutation, min_size=1, max_size=3), st.booleans())
def test_mutated_checkpoints_never_crash_compare(capsys, mutations, swap):
    """test_fuzz_commands' campaign for compare: a mutated checkpoint (every format of the
    fuzz base) against the intact one, either way round: exit 0 or 2, one line when refused,
    never an internal error, inputs unchanged."""
    with tempfile.TemporaryDirectory() as folder:
        base, src = os.path.join(folder, "base.safetensors"), os.path.join(folder, "in.safetensors")
        build(base, [])
        build(src, mutations)
        before = digest(src)
        args = ["compare", base, src] if swap else ["compare", src, base]
        rc = main(args + ["--json", "--no-progress"])
        out, err = capsys.readouterr()
        assert rc in (0, 2) and "internal error" not in err, f"{args}: exit {rc}: {err} ({mutations})"
        if rc == 2:
            assert err.count("\n") == 1, err
        else:
            json.loads(out)  # strict JSON: no NaN or Infinity
        assert digest(src) == before


def test_layer_after_layer_reuses_memory_and_the_figures_stay(tmp_path, monkeypatch, reuse_pools):
    """compare decodes layer after layer, like dequantize: the one-GEMM decoders' F32 operand
    and product reuse the last layer's memory (numerics.pages.reused_outputs) instead of
    fresh pages, and every figure is the same as with fresh memory."""
    import contextlib

    import comfyquant.comparison as comparison
    from comfyquant.numerics import pages

    pools = reuse_pools  # small layers' buffers count as large
    a = write_layers(
        tmp_path / "a.safetensors", [make_layer("int8_convrot", prefix=f"l{i}", n=512, k=512, seed=i) for i in range(3)]
    )
    b = write_layers(tmp_path / "b.safetensors", [make_layer("w4a4", prefix=f"l{i}", n=512, k=512, seed=i) for i in range(3)])
    reused = compare(a, b, progress=False).to_dict()
    assert len(pools) == 1 and pools[0].reused > 0 and pages._REUSE is None
    monkeypatch.setattr(comparison, "_reused_outputs", contextlib.nullcontext)
    fresh = compare(a, b, progress=False).to_dict()
    assert len(pools) == 1
    reused.pop("seconds", None), fresh.pop("seconds", None)
    assert reused == fresh and len(reused["layers"]) == 3


def test_large_packed_tensors_are_mapped_and_the_figures_stay(tmp_path, monkeypatch):
    """compare maps large packed tensors from the page cache, as dequantize does (no copies),
    and every figure equals a run that reads them (a kernel without the populate advice)."""
    import comfyquant.dequantizer as dq
    import comfyquant.io.source as source

    monkeypatch.setattr(dq, "MAP_MIN", 4096)
    a = write_layers(
        tmp_path / "a.safetensors",
        [make_layer(v, prefix=f"l{i}", n=256, k=512, seed=i) for i, v in enumerate(["fp8", "int8_convrot", "nvfp4"])],
    )
    b = write_layers(
        tmp_path / "b.safetensors",
        [make_layer(v, prefix=f"l{i}", n=256, k=512, seed=i) for i, v in enumerate(["w4a8_codebook", "mxfp8", "w4a4"])],
    )
    real = source.LocalFile.mapped
    calls = []

    def spy(self, offset, length):
        view = real(self, offset, length)
        calls.append(view is not None)
        return view

    monkeypatch.setattr(source.LocalFile, "mapped", spy)
    mapped = compare(a, b, progress=False).to_dict()
    assert calls and all(calls)
    monkeypatch.setattr(source, "_MADV_POPULATE_READ", 0x7FFF)  # EINVAL: read instead
    calls.clear()
    read = compare(a, b, progress=False).to_dict()
    assert calls and not any(calls)
    mapped.pop("seconds", None), read.pop("seconds", None)
    assert mapped == read and len(mapped["layers"]) == 3


# -- the plot's title ----------------------------------------------------------------------------


def _title_inside(fig, words: str) -> None:
    """The figure, rendered as the PNG is (``stage_figure``'s dpi), has a title holding
    ``words`` (its lines joined) whose bounding box lies inside the figure."""
    import io

    fig.savefig(io.BytesIO(), format="png", dpi=110)
    renderer = fig.canvas.get_renderer()
    texts = [*fig.texts, *(ax.title for ax in fig.axes)]
    titles = [t for t in texts if words in " ".join(t.get_text().split())]
    assert len(titles) == 1, [t.get_text() for t in fig.texts]
    box, frame = titles[0].get_window_extent(renderer), fig.bbox
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)


@pytest.mark.parametrize(
    "name", ["q.safetensors", "flux1-dev-transformer-quantized-with-a-very-long-file-name-nvfp4.safetensors"]
)
def test_compare_plot_title_lies_inside_the_figure(tmp_path, capsys, name):
    """The title names both files and the figures; however long the names, every line of it is
    inside the PNG (it was centred on the axes and ran off the figure's left edge)."""
    from comfyquant.comparison import figure

    src, out = quantized(tmp_path, "nvfp4", name=name, src=dense_model(tmp_path / "dense_tiny.safetensors"))
    png = tmp_path / "cmp.png"
    code, _text, _ = run_cli(["compare", out, src, "--plot", str(png), "--no-progress"], capsys)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _title_inside(figure(compare(out, src, progress=False)), f"comfyquant compare: {name} vs dense_tiny.safetensors")


def test_quantize_report_title_lies_inside_the_figure(tmp_path):
    from comfyquant.quantizer.report import figure

    src = dense_model(tmp_path / "dense.safetensors")
    result = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "nvfp4", target="comfy-kitchen", progress=False)
    _title_inside(figure(result.to_dict()), "comfyquant quantize: 3 layers, mean weight error")
