"""quantize and convert: every format against comfy-kitchen and the checker, rules, plan,
report, refusals, sharded inputs and outputs, worker processes and interruption."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant import codecs
from comfyquant.checker.run import check
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.installing import extra_command
from comfyquant.quantizer.params import validate
from comfyquant.quantizer.rules import parse_rules
from kitchen_fixtures import VARIANTS, make_weight, quantize

P = "blocks.0.attn.qkv"


def dense_model(path, layers=((P, 128, 256),), dtype=torch.bfloat16, extra=None, metadata=None) -> str:
    """A dense checkpoint: linears with biases, a norm and an embedding."""
    sd = {}
    for i, (name, n, k) in enumerate(layers):
        sd[f"{name}.weight"] = make_weight(n, k, dtype, seed=i)
        sd[f"{name}.bias"] = (torch.arange(n, dtype=torch.float32) / 1000).to(dtype)
    sd["blocks.0.norm1.weight"] = torch.ones(256, dtype=dtype)
    sd["token_embed.weight"] = make_weight(16, 256, dtype, seed=99)
    sd.update(extra or {})
    save_file(sd, str(path), metadata=metadata)
    return str(path)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def header(path) -> tuple[dict, dict]:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        obj = json.loads(fh.read(n))
    return obj.pop("__metadata__", {}), obj


# (variant in kitchen_fixtures, quantize format, params, targets that load it)
CASES = [
    ("w4a8_codebook", "w4a8", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("w4a8_uniform", "w4a8", {"codebook": False}, ("sglang", "comfyui", "comfy-kitchen")),
    ("w4a8_asym", "w4a8", {"symmetric": False}, ("sglang", "comfy-kitchen")),
    # ComfyUI 0.33.0 loads 6-bit rows with comfy-kitchen 0.2.40, not with the 0.2.31 it pins
    ("w6a8", "w4a8", {"bits": 6}, ("comfy-kitchen",)),
    ("int8_convrot", "int8", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("int8_rowwise", "int8", {"convrot": False}, ("comfyui", "comfy-kitchen")),
    ("w4a4", "w4a4", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("w4a4_int8", "w4a4", {"linear_dtype": "int8"}, ("sglang", "comfyui", "comfy-kitchen")),
    ("nvfp4", "nvfp4", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("mxfp8", "mxfp8", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("fp8", "fp8", {}, ("sglang", "comfyui", "comfy-kitchen")),
    ("fp8_e5m2", "fp8_e5m2", {}, ("comfyui", "comfy-kitchen")),
]


@pytest.mark.parametrize("variant,fmt,params,loaders", CASES, ids=[c[0] for c in CASES])
def test_each_format_loads_and_matches_kitchen(tmp_path, variant, fmt, params, loaders):
    src = dense_model(tmp_path / "in.safetensors")
    out = str(tmp_path / "out.safetensors")
    target = "all" if len(loaders) == 3 else loaders[0]
    result = comfyquant.quantize(src, out, fmt, params, target=target, progress=False)
    assert result.ok and [lp.name for lp in result.plan.quantized] == [P]
    for t in loaders:
        assert check(out, target=t).ok, t
    if variant == "w6a8":
        assert check(out, target="comfyui").verdicts["comfyui"].with_newer_kitchen.loads
    # Stored tensors are comfy-kitchen's own quantization of the same weight (the correction
    # upcast to F32), so comfy-kitchen's decode of them is q.dequantize(); ours must equal it.
    weight = load_file(src)[f"{P}.weight"]
    ref = quantize(variant, weight)
    stored = {k.rsplit(".", 1)[1]: v for k, v in load_file(out).items() if k.startswith(P + ".") and "comfy_quant" not in k}
    assert set(stored) - {"bias"} == set(ref)
    for suffix, t in ref.items():
        want = t.float() if suffix == "weight_correction" else t
        assert stored[suffix].dtype == want.dtype and torch.equal(_bits(stored[suffix]), _bits(want)), suffix
    from comfy_kitchen.tensor import QuantizedTensor

    v = VARIANTS[variant]
    kw = dict(v.kwargs)
    if v.format == "asym_w4a8_int8":
        kw.update(group_size=16, convrot_groupsize=256)
    elif v.format == "convrot_w4a4" or kw.get("convrot"):
        kw["convrot_groupsize"] = 256
    q = QuantizedTensor.from_float(weight, v.layout, **kw)
    marker = json.loads(bytes(load_file(out)[f"{P}.comfy_quant"].tolist()))
    layer = {s: t for s, t in stored.items() if s != "bias"}
    mine = codecs.get(marker["format"]).decode(layer, marker, dtype=torch.bfloat16)
    assert torch.equal(mine, q.dequantize().to(torch.bfloat16))


def test_output_markers_stamp_and_metadata(tmp_path):
    src = dense_model(tmp_path / "in.safetensors", metadata={"modelspec.title": "tiny"})
    out = str(tmp_path / "out.safetensors")
    comfyquant.quantize(src, out, "w4a8", target="sglang", progress=False)
    meta, entries = header(out)
    layers = json.loads(meta["_quantization_metadata"])
    assert layers["format_version"] == "1.0"
    marker = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True}
    assert layers["layers"] == {P: marker}
    with safe_open(out, "pt") as f:
        assert json.loads(bytes(f.get_tensor(f"{P}.comfy_quant").tolist())) == marker
    stamp = json.loads(meta["comfyquant"])
    assert stamp["tool"] == "comfyquant" and stamp["version"] == comfyquant.__version__
    assert stamp["history"][-1]["command"] == "quantize" and stamp["formats"] == {"asym_w4a8_int8": 1}
    assert meta["modelspec.title"] == "tiny"
    assert entries["token_embed.weight"]["dtype"] == "BF16" and entries["blocks.0.norm1.weight"]["dtype"] == "BF16"


def test_plan_reasons_and_dry_run(tmp_path, capsys):
    layers = ((P, 128, 256), ("img_in", 128, 48), ("blocks.0.mlp.fc2", 64, 1024))
    src = dense_model(
        tmp_path / "in.safetensors",
        layers,
        extra={"pos": torch.zeros(4, 256, dtype=torch.bfloat16), "conv.weight": torch.zeros(8, 4, 3, 3)},
    )
    out = tmp_path / "out.safetensors"
    assert main(["quantize", src, str(out), "--format", "nvfp4", "--target", "sglang", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists() and "dry run" in text
    assert "1-D tensor" in text and "embedding table" in text and "4-D weight" in text
    assert "nvfp4 cannot take [64, 1024]" in text and "incompatible weight/scale shapes" in text  # SGLang F4
    assert "nvfp4 cannot take [128, 48]" in text  # K=48: sglang's K % 64 rule
    r = comfyquant.quantize(src, str(out), "nvfp4", target="comfyui", dry_run=True)
    actions = {lp.name: lp.action for lp in r.plan.layers}
    assert actions == {
        P: "quantize",
        "img_in": "quantize",
        "blocks.0.mlp.fc2": "quantize",
        "blocks.0.norm1": "dense",
        "token_embed": "dense",
        "conv": "dense",
    }  # ComfyUI takes padded NVFP4 shapes
    assert r.doc["other_tensors"] == ["pos"] and r.doc["dry_run"]


def test_rules_precedence_keep_and_exclude(tmp_path):
    rules = parse_rules(
        {
            "default": {"format": "int8"},
            "rules": [
                {"match": "blocks.*", "format": "w4a8"},
                {"match": "blocks.*.mlp.*", "format": "w4a8", "group_size": 32},  # more literal characters: wins
                {"match": "blocks.1.mlp.fc2", "format": "keep"},  # exact name beats every glob
                {"match": ["*.attn.*"], "format": "w4a8", "convrot_groupsize": 64},
                {"match": "blocks.*.attn.*", "format": "w4a8", "convrot_groupsize": 16},  # same specificity? no: longer
            ],
        }
    )
    choose = rules.choose
    assert choose("blocks.0.mlp.fc1").params["group_size"] == 32
    assert choose("blocks.1.mlp.fc2").keep
    assert choose("blocks.0.attn.qkv").params["convrot_groupsize"] == 16
    assert choose("blocks.0.norm").format == "asym_w4a8_int8" and choose("blocks.0.norm").params["group_size"] == 16
    assert choose("final.linear").format == "int8_tensorwise"
    tie = parse_rules({"rules": [{"match": "a.*", "format": "w4a8"}, {"match": "*.b", "format": "fp8"}]})
    assert tie.choose("a.b").format == "float8_e4m3fn"  # equal specificity: the later rule wins
    assert tie.choose("c.d") is None

    layers = (("blocks.0.mlp.fc1", 64, 256), ("blocks.1.mlp.fc2", 64, 256), ("blocks.0.attn.qkv", 64, 256), ("final", 64, 256))
    src = dense_model(tmp_path / "in.safetensors", layers)
    path = tmp_path / "rules.toml"
    path.write_text('[[rules]]\nmatch = "blocks.*"\nformat = "w4a8"\n\n[[rules]]\nmatch = "blocks.1.*"\nformat = "keep"\n')
    r = comfyquant.quantize(src, str(tmp_path / "o.safetensors"), rules=str(path), exclude=["attn"], dry_run=True)
    got = {lp.name: (lp.action, lp.reason) for lp in r.plan.layers}
    assert got["blocks.0.mlp.fc1"][0] == "quantize"
    assert got["blocks.1.mlp.fc2"] == ("dense", f"kept by {path} rule 'blocks.1.*'")
    assert got["blocks.0.attn.qkv"] == ("dense", "excluded by --exclude 'attn'")
    assert got["final"] == ("dense", "no rule matches and no --format")
    r = comfyquant.quantize(src, str(tmp_path / "o.safetensors"), "fp8", rules=str(path), dry_run=True, target="comfyui")
    assert {lp.name: lp.format for lp in r.plan.quantized} == {
        "blocks.0.mlp.fc1": "asym_w4a8_int8",
        "blocks.0.attn.qkv": "asym_w4a8_int8",
        "final": "float8_e4m3fn",
    }


@pytest.mark.parametrize(
    "doc,message",
    [
        ({"rules": [{"match": "x", "format": "w4a8", "group_size": 12}]}, "group_size=12 is not allowed: >= 4 and dividing 16"),
        ({"rules": [{"match": "x", "format": "nvfp4", "group_size": 16}]}, "nvfp4 has no parameter 'group_size'; its parameters"),
        ({"rules": [{"match": "x", "format": "awq_w4a16"}]}, "offline calibration only"),
        ({"rules": [{"match": "x", "format": "keep", "bits": 4}]}, "takes no parameters"),
        ({"rules": [{"format": "w4a8"}]}, "match must be"),
        ({"rule": []}, "unknown top-level key"),
    ],
)
def test_bad_rules(doc, message):
    with pytest.raises(InputError, match=message):
        parse_rules(doc, "r.toml")


def test_invalid_toml(tmp_path, capsys):
    src = dense_model(tmp_path / "in.safetensors")
    bad = tmp_path / "r.toml"
    bad.write_text("[[rules]\nmatch = 1")
    assert main(["quantize", src, str(tmp_path / "o.safetensors"), "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "r.toml: not valid TOML" in err


def test_report_json_png_and_worst_layers(tmp_path, capsys):
    layers = ((P, 64, 256), ("blocks.0.mlp.fc1", 64, 256))
    src = dense_model(tmp_path / "in.safetensors", layers)
    out = tmp_path / "out.safetensors"
    assert main(["quantize", src, str(out), "-f", "w4a4", "--report", str(tmp_path / "rep.json"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "worst layers" in text and "check --target sglang: loads" in text
    doc = json.loads((tmp_path / "rep.json").read_text())
    png = (tmp_path / "rep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r["layer"]: r for r in doc["layers"]}
    for name in (P, "blocks.0.mlp.fc1"):
        w, o = rows[name]["weight"], rows[name]["output"]
        assert 0.05 < w["rel_l2"] < 0.3 and 0.95 < w["cosine"] <= 1 and 0.05 < o["rel_l2"] < 0.4
    assert rows["token_embed"]["weight"] is None and rows["token_embed"]["action"] == "dense"
    t = doc["totals"]
    assert t["quantized"] == 2 and t["by_format"]["convrot_w4a4"]["layers"] == 2 and doc["check"]["ok"]
    assert doc["worst"][0] in (P, "blocks.0.mlp.fc1") and t["compression"] > 1
    assert [r["index"] for r in doc["layers"]] == list(range(len(doc["layers"])))


def test_report_needs_matplotlib(tmp_path, capsys, monkeypatch):
    src = dense_model(tmp_path / "in.safetensors")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["quantize", src, str(tmp_path / "o.safetensors"), "-f", "w4a8", "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert extra_command("plot") in err and not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["-f", "w4a8", "--target", "sglang", "--bits", "6"], "cannot be written for --target sglang"),
        (["-f", "fp8_e5m2"], "Unsupported Comfy quantization format(s): float8_e5m2"),
        (["-f", "w4a8", "--asymmetric", "--target", "comfyui"], "ComfyUI does not load weight_correction"),
        (["-f", "w4a8", "--scale-dtype", "f32", "--target", "sglang"], "SGLang refuses it"),
        (["-f", "w4a4", "--convrot-groupsize", "1024", "--target", "sglang"], "unsupported convrot_groupsize=1024"),
        (
            ["-f", "nvfp4", "--group-size", "16"],
            "nvfp4 has no parameter 'group_size'; its parameters: full_precision_matrix_mult",
        ),
        (["-f", "w4a8", "--group-size", "12"], "group_size=12 is not allowed"),
        (["-f", "q5_k"], "'q5_k' is an unknown format; choose from asym_w4a8_int8 (w4a8)"),
        (["--group-size", "32"], "need --format F"),
        ([], "give --format F or --rules FILE"),
        (["-f", "w4a8", "--exclude", "("], "not a valid regular expression"),
    ],
)
def test_refusals_are_one_line(tmp_path, capsys, args, message):
    src = dense_model(tmp_path / "in.safetensors")
    out = tmp_path / "o.safetensors"
    assert main(["quantize", src, str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["in.safetensors"]


def test_format_combination_the_target_refuses(tmp_path):
    layers = ((P, 64, 256), ("blocks.0.mlp.fc1", 64, 256))
    src = dense_model(tmp_path / "in.safetensors", layers)
    rules = parse_rules({"rules": [{"match": "*.attn.*", "format": "w4a4"}, {"match": "*.mlp.*", "format": "w4a8"}]})
    with pytest.raises(
        InputError,
        match=r"would not load for --target sglang: .*Unsupported Comfy quantization "
        r"format\(s\): asym_w4a8_int8, convrot_w4a4",
    ):
        comfyquant.quantize(src, str(tmp_path / "o.safetensors"), rules=rules, target="sglang")
    r = comfyquant.quantize(src, str(tmp_path / "o.safetensors"), rules=rules, target="comfyui", progress=False)
    assert r.ok and r.plan.formats() == {"asym_w4a8_int8": 1, "convrot_w4a4": 1}


def test_bad_weights(tmp_path, capsys):
    src = dense_model(tmp_path / "in.safetensors", extra={"ids.weight": torch.zeros(64, 256, dtype=torch.int32)})
    out = tmp_path / "o.safetensors"
    assert main(["quantize", src, str(out), "-f", "w4a8"]) == 2
    assert "layer 'ids': weight is I32, not a float dtype" in capsys.readouterr().err
    assert main(["quantize", src, str(out), "-f", "w4a8", "--exclude", "^ids$", "--no-progress"]) == 0
    capsys.readouterr()
    assert header(out)[1]["ids.weight"]["dtype"] == "I32"

    w = make_weight(64, 256)
    w[3, 7] = float("nan")
    bad = dense_model(tmp_path / "nan.safetensors", extra={"blocks.9.fc.weight": w})
    out2 = tmp_path / "o2.safetensors"
    assert main(["quantize", bad, str(out2), "-f", "w4a8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "blocks.9.fc" in err and "NaN/Inf" in err and "--keep-bad" in err and err.count("\n") == 1
    assert not out2.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant")]
    r = comfyquant.quantize(bad, str(out2), "w4a8", keep_bad=True, progress=False)
    kept = {lp.name: lp for lp in r.plan.layers}["blocks.9.fc"]
    assert kept.action == "dense" and "1 NaN/Inf value(s), first at [3, 7] (--keep-bad)" in kept.reason
    assert check(str(out2)).ok

    assert main(["quantize", src, str(out), "-f", "w4a8", "--exclude", "^ids$"]) == 2  # exists
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["quantize", str(out), str(tmp_path / "o3.safetensors"), "-f", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "already quantized (asym_w4a8_int8)" in err and "comfyquant convert" in err
    assert main(["quantize", src, src, "-f", "w4a8", "--overwrite"]) == 2
    assert "is the input" in capsys.readouterr().err


@pytest.mark.parametrize(("fmt", "passes"), [("int8", 2), ("nvfp4", 3)])
def test_layers_are_read_encoded_and_measured_in_row_blocks(tmp_path, monkeypatch, fmt, passes):
    """A layer is never in memory whole.  With 64-row blocks the weight is read in
    64-row pieces (once for the finite check, once to encode, once to measure), and the
    output is the one whole-layer blocks give, bit for bit.  Row-scaled INT8 finds NaN/Inf
    from its row scales, so it skips the separate finite check's pass."""
    import comfyquant.numerics.rows as rows
    import comfyquant.quantizer.work as work

    src = dense_model(tmp_path / "in.safetensors", layers=((P, 640, 512),))
    whole = comfyquant.quantize(src, str(tmp_path / "whole.safetensors"), fmt, progress=False)
    reads: list[int] = []
    pread = work._pread
    monkeypatch.setattr(work, "_pread", lambda file, start, n: reads.append(n) or pread(file, start, n))
    monkeypatch.setattr(rows, "encode_block_elements", lambda: 64 * 512)
    monkeypatch.setattr(rows, "rotation_encode_block_elements", lambda: 64 * 512)
    blocked = comfyquant.quantize(src, str(tmp_path / "blocked.safetensors"), fmt, progress=False)
    assert max(reads) == 64 * 512 * 2 and sum(reads) == passes * 640 * 512 * 2
    a, b = load_file(str(tmp_path / "whole.safetensors")), load_file(str(tmp_path / "blocked.safetensors"))
    assert set(a) == set(b) and all(torch.equal(_bits(a[name]), _bits(b[name])) for name in a)
    q1, q2 = (r.doc["layers"][0] for r in (whole, blocked))
    for key in ("weight", "output"):
        assert q2[key]["rel_l2"] == pytest.approx(q1[key]["rel_l2"], rel=1e-5)
        assert q2[key]["cosine"] == pytest.approx(q1[key]["cosine"], rel=1e-6)


def test_f16_and_f32_sources(tmp_path):
    for dtype in (torch.float16, torch.float32):
        src = dense_model(tmp_path / f"in{dtype}.safetensors", dtype=dtype)
        out = str(tmp_path / f"o{dtype}.safetensors")
        r = comfyquant.quantize(src, out, "w4a8", {"symmetric": False}, target="sglang", progress=False)
        assert r.ok
        meta, entries = header(out)
        assert entries[f"{P}.weight_correction"]["dtype"] == "F32"  # upcast from the source dtype, for SGLang
        assert entries[f"{P}.bias"]["dtype"] == {torch.float16: "F16", torch.float32: "F32"}[dtype]


def sharded(tmp_path) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    a = {
        f"{P}.weight": make_weight(64, 256, seed=1),
        f"{P}.bias": torch.zeros(64, dtype=torch.bfloat16),
        "blocks.0.norm1.weight": torch.ones(256, dtype=torch.bfloat16),
    }
    b = {"blocks.1.mlp.fc1.weight": make_weight(128, 256, seed=2), "final.weight": make_weight(64, 512, seed=3)}
    save_file(a, str(folder / "model-00001-of-00002.safetensors"))
    save_file(b, str(folder / "model-00002-of-00002.safetensors"))
    wm = {n: "model-00001-of-00002.safetensors" for n in a} | {n: "model-00002-of-00002.safetensors" for n in b}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    return str(folder)


def test_sharded_in_sharded_out_with_jobs(tmp_path):
    src = sharded(tmp_path)
    out = tmp_path / "q"
    r = comfyquant.quantize(src, str(out), "int8", target="sglang", jobs=2, progress=False)
    names = sorted(os.listdir(out))
    assert names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert check(str(out), target="all").ok and r.ok
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 1}
    assert index["weight_map"]["blocks.1.mlp.fc1.comfy_quant"] == "model-00002-of-00002.safetensors"
    assert index["weight_map"][f"{P}.weight_scale"] == "model-00001-of-00002.safetensors"
    meta1, _ = header(out / "model-00001-of-00002.safetensors")
    assert list(json.loads(meta1["_quantization_metadata"])["layers"]) == [P]  # markers stay with their layer's shard
    one = tmp_path / "q1"
    comfyquant.quantize(src, str(one), "int8", target="sglang", jobs=1, progress=False)
    for n in names[:2]:  # worker processes write the same bytes as the main process
        assert (out / n).read_bytes() == (one / n).read_bytes()
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no spill or temporary file left
    assert sorted(r.plan.formats()) == ["int8_tensorwise"] and len(r.plan.quantized) == 3


def test_sharded_needs_a_folder(tmp_path):
    src = sharded(tmp_path)
    with pytest.raises(InputError, match="give a folder as OUT"):
        comfyquant.quantize(src, str(tmp_path / "x.safetensors"), "w4a8")


def _cli(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    code = "import sys; from comfyquant.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("stage,jobs", [("after-tensor:1", "1"), ("before-rename", "2")])
def test_sigkill_leaves_no_output(tmp_path, stage, jobs):
    src = dense_model(tmp_path / "in.safetensors", ((P, 64, 256), ("blocks.0.mlp.fc1", 64, 256)))
    out = tmp_path / "out.safetensors"
    proc = _cli(["quantize", src, str(out), "-f", "w4a8", "-j", jobs], {"COMFYQUANT_FAULT": stage})
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()


def test_convert_between_formats(tmp_path):
    src = dense_model(tmp_path / "in.safetensors", ((P, 128, 256), ("blocks.0.mlp.fc1", 128, 256)))
    w6 = str(tmp_path / "w6.safetensors")
    comfyquant.quantize(src, w6, "w4a8", {"bits": 6}, target="comfy-kitchen", progress=False)
    assert not check(w6, target="sglang").ok
    w4 = str(tmp_path / "w4.safetensors")
    r = comfyquant.convert(w6, w4, "w4a8", target="sglang", progress=False)  # 6-bit -> 4-bit for SGLang
    assert r.ok and check(w4, target="all").ok and len(r.plan.quantized) == 2
    assert all(0.05 < row["weight"]["rel_l2"] < 0.2 for row in r.doc["layers"] if row["weight"])
    asym = str(tmp_path / "asym.safetensors")
    comfyquant.quantize(src, asym, "w4a8", {"symmetric": False}, target="sglang", progress=False)
    sym = str(tmp_path / "sym.safetensors")
    assert comfyquant.convert(asym, sym, "w4a8", target="comfyui", progress=False).ok  # asymmetric -> symmetric
    assert "weight_correction" not in "".join(header(sym)[1])
    nv = str(tmp_path / "nv.safetensors")
    comfyquant.quantize(src, nv, "nvfp4", target="sglang", progress=False)
    back = str(tmp_path / "nv_w4a8.safetensors")
    r = comfyquant.convert(nv, back, "w4a8", target="sglang", progress=False)  # NVFP4 -> W4A8
    assert r.plan.formats() == {"asym_w4a8_int8": 2} and check(back, target="all").ok
    stamp = json.loads(header(back)[0]["comfyquant"])
    assert [h["command"] for h in stamp["history"]] == ["quantize", "convert"]
    same = str(tmp_path / "same.safetensors")
    r = comfyquant.convert(back, same, "w4a8", progress=False)  # already that format: copied, lossless
    assert not r.plan.quantized and all("already" in lp.reason for lp in r.plan.layers if lp.src_format)
    assert load_file(same)[f"{P}.weight"].equal(load_file(back)[f"{P}.weight"])


def test_convert_to_dense_uses_dequantize(tmp_path, capsys):
    src = dense_model(tmp_path / "in.safetensors")
    q = str(tmp_path / "q.safetensors")
    comfyquant.quantize(src, q, "fp8", progress=False)
    out = tmp_path / "d.safetensors"
    assert main(["convert", q, str(out), "--to", "dense", "--dtype", "f32"]) == 0
    assert "dequantized 1 layer" in capsys.readouterr().out
    dense = load_file(str(out))
    assert dense[f"{P}.weight"].dtype == torch.float32 and f"{P}.comfy_quant" not in dense
    assert main(["convert", q, str(out), "--to", "dense"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["convert", q, str(tmp_path / "e.safetensors"), "--to", "dense", "--rules", "x.toml"]) == 2
    assert "do not apply" in capsys.readouterr().err


def test_api_is_lazy_and_callable():
    code = (
        "import sys, comfyquant; assert 'torch' not in sys.modules; import comfyquant.quantizer.plan; "
        "assert callable(comfyquant.quantize) and callable(comfyquant.convert); "
        "from comfyquant.quantizer import convert; assert convert is comfyquant.convert; "
        "assert 'torch' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_params_keep_explicit_markers():
    assert validate("int8_tensorwise", {}).marker() == {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
    assert validate("convrot_w4a4", {"convrot_groupsize": 64}).marker() == {"format": "convrot_w4a4", "convrot_groupsize": 64}
    assert validate("nvfp4", {}).marker() == {"format": "nvfp4"}


def test_worker_failure_leaves_no_spill_files(tmp_path, monkeypatch):
    """With --jobs, encoded layers travel through spill files next to the output; a run that
    fails midway removes them along with its temporary output."""
    src = dense_model(tmp_path / "in.safetensors", ((P, 64, 256), ("blocks.0.mlp.fc1", 64, 256), ("blocks.1.mlp.fc1", 64, 256)))
    out = tmp_path / "out"
    out.mkdir()
    from comfyquant.quantizer import runner

    real = runner.write_safetensors

    def fail_at_first_tensor(dest, tensors, meta, **kw):
        def broken():
            raise OSError(28, "No space left on device")
            yield b""  # pragma: no cover

        items = list(tensors.items())  # the first tensor fails: computed layers are never written
        name, (dtype, shape, _data) = items[0]
        tensors = dict([(name, (dtype, shape, broken))] + items[1:])
        return real(dest, tensors, meta, **kw)

    monkeypatch.setattr(runner, "write_safetensors", fail_at_first_tensor)
    with pytest.raises(InputError, match="No space left"):
        comfyquant.quantize(src, str(out / "q.safetensors"), "int8", jobs=2, progress=False)
    assert os.listdir(out) == []


@pytest.mark.parametrize("fmt", ["fp8", "int8", "w4a8", "w4a4", "nvfp4", "mxfp8"])
def test_empty_weights_are_copied_dense(tmp_path, fmt):
    """A [0, K] or [N, 0] weight has nothing to quantize: it is copied with the reason (it used
    to crash the encoder's finite scan); the other layers are quantized as usual."""
    extra = {
        "blocks.7.fc.weight": torch.zeros((0, 256), dtype=torch.bfloat16),
        "blocks.8.fc.weight": torch.zeros((64, 0), dtype=torch.bfloat16),
    }
    src = dense_model(tmp_path / "in.safetensors", extra=extra)
    out = str(tmp_path / "out.safetensors")
    r = comfyquant.quantize(src, out, fmt, progress=False)
    plans = {lp.name: lp for lp in r.plan.layers}
    for name, shape in (("blocks.7.fc", [0, 256]), ("blocks.8.fc", [64, 0])):
        assert plans[name].action == "dense" and plans[name].reason == f"empty weight {shape}: nothing to quantize"
    assert plans[P].action == "quantize" and check(out).ok
    written = load_file(out)
    assert written["blocks.7.fc.weight"].shape == (0, 256) and written["blocks.8.fc.weight"].shape == (64, 0)


@pytest.mark.parametrize(("fmt", "multiple"), [("mxfp8", 32), ("nvfp4", 16)])
def test_padded_formats_keep_the_model_shape_or_the_layer_dense(tmp_path, fmt, multiple):
    """NVFP4 and MXFP8 store weights padded to 16 / 32.  With a bias the model's N is read back
    from it, so such a layer is quantized and dequantizes to its own shape (the quality report
    compares only the model's rows, never the padding); without one, or when K
    would be padded (nothing records the model's K), the layer is kept dense with the reason."""
    n = 4 * multiple + 2
    sd = {
        "a.fc.weight": make_weight(n, 256, seed=1),
        "a.fc.bias": torch.zeros(n, dtype=torch.bfloat16),
        "b.fc.weight": make_weight(n, 256, seed=2),
        "c.fc.weight": make_weight(64, 2 * multiple + 4, seed=3),
        "c.fc.bias": torch.zeros(64, dtype=torch.bfloat16),
    }
    src = str(tmp_path / "in.safetensors")
    save_file(sd, src)
    out = str(tmp_path / "q.safetensors")
    r = comfyquant.quantize(src, out, fmt, target="comfyui", progress=False)
    plans = {lp.name: lp for lp in r.plan.layers}
    assert plans["a.fc"].action == "quantize"
    assert (
        plans["b.fc"].action == "dense"
        and f"N={n} is not a multiple of {multiple} and the layer has no bias" in plans["b.fc"].reason
    )
    assert plans["c.fc"].action == "dense" and f"K={2 * multiple + 4} is not a multiple of {multiple}" in plans["c.fc"].reason
    row = {x["layer"]: x for x in r.doc["layers"]}["a.fc"]
    assert row["weight"]["rel_l2"] < 0.2
    dense = str(tmp_path / "d.safetensors")
    comfyquant.dequantize(out, dense, progress=False)
    assert load_file(dense)["a.fc.weight"].shape == (n, 256)
