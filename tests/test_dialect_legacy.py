"""ComfyUI's legacy "scaled FP8" files (dialect ``comfy-legacy-fp8``): detection, per-runtime
verdicts, ``migrate``, and ``dequantize``/``convert`` reading them.

The files are built following ComfyUI's published legacy layout (comfy/ops.py
``scaled_fp8_ops``: an FP8 ``weight`` and a scalar ``scale_weight``, optional
``scale_input``; comfy/model_detection.py: a ``scaled_fp8`` sentinel at the diffusion model's
prefix, 2 elements for "no FP8 matmul").  What ComfyUI makes of them today is re-stated from
comfy/utils.py ``convert_old_quants`` (``comfyui_translation``), and the migrated file
must carry exactly its markers for the true FP8 layers.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects.registry import detect
from comfyquant.repair.migrate import MigrateError
from test_remote import server  # noqa: F401  (the HTTP fixture)

ROOT = "model.diffusion_model."
SCALE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def legacy_file(
    path,
    *,
    prefix="",
    sentinel=(0,),
    scale_dtype="F32",
    scale_shape=(),
    scale_input=None,
    dummy_dense=True,
    e5m2=False,
    per_channel=False,
    n=64,
    k=256,
    seed=0,
) -> dict:
    """A legacy scaled-FP8 checkpoint: two FP8 linears (one with ``scale_input``), a BF16
    linear with a dummy ``scale_weight`` (optional), a norm, and the sentinel."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    fp8 = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    for i, name in enumerate(("blocks.0.attn.qkv", "blocks.0.mlp.fc1")):
        w = torch.randn(n, k, generator=g) * 0.05
        p = f"{prefix}{name}"
        amax = w.abs().amax()
        if per_channel and i == 1:
            scale = w.abs().amax(dim=1, keepdim=True) / 448.0
            sd[f"{p}.weight"] = (w / scale).to(fp8)
            sd[f"{p}.scale_weight"] = scale.to(torch.float32)
        else:
            scale = (amax / 448.0).to(SCALE_DTYPES[scale_dtype]).reshape(scale_shape)
            sd[f"{p}.weight"] = (w / scale.float()).to(fp8)
            sd[f"{p}.scale_weight"] = scale
        sd[f"{p}.bias"] = torch.randn(n, generator=g).to(torch.bfloat16)
        if i == 0 and scale_input is not None:
            sd[f"{p}.scale_input"] = torch.tensor(scale_input, dtype=torch.float32)
    if dummy_dense:
        sd[f"{prefix}final_layer.linear.weight"] = torch.randn(16, k, generator=g).to(torch.bfloat16)
        sd[f"{prefix}final_layer.linear.scale_weight"] = torch.ones((), dtype=torch.float32)
    sd[f"{prefix}norm.weight"] = torch.ones(k, dtype=torch.bfloat16)
    if sentinel is not None:
        sd[f"{prefix}scaled_fp8"] = torch.zeros(sentinel, dtype=fp8)
    save_file(sd, str(path))
    return sd


def comfyui_translation(sd: dict, model_prefix: str) -> dict[str, dict]:
    """The markers ComfyUI's ``convert_old_quants`` (comfy/utils.py) gives a legacy file: every
    layer under the prefix with a ``scale_weight`` gets ``float8_e4m3fn`` (plus
    ``full_precision_matrix_mult`` for a 2-element sentinel)."""
    sentinel = sd.get(f"{model_prefix}scaled_fp8")
    if sentinel is None:
        return {}
    conf = {"format": "float8_e4m3fn"}
    if sentinel.numel() == 2:
        conf["full_precision_matrix_mult"] = True
    return {k[: -len(".scale_weight")]: dict(conf) for k in sd if k.startswith(model_prefix) and k.endswith(".scale_weight")}


def written_markers(path) -> dict[str, dict]:
    out = {}
    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata().get("_quantization_metadata", "{}"))
        for k in f.keys():
            if k.endswith(".comfy_quant"):
                out[k[: -len(".comfy_quant")]] = json.loads(bytes(f.get_tensor(k).tolist()).decode())
    assert header.get("layers", out) == out  # the header map says what the tensors say
    return out


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


CASES = [
    dict(prefix="", sentinel=(0,), scale_dtype="F32", scale_shape=(), scale_input=1.0),
    dict(prefix=ROOT, sentinel=(0,), scale_dtype="BF16", scale_shape=(1,), scale_input=0.5),
    dict(prefix="", sentinel=(2,), scale_dtype="F16", scale_shape=(), scale_input=None),
    dict(prefix=ROOT, sentinel=(2,), scale_dtype="F32", scale_shape=(1,), scale_input=1.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['prefix'] or 'bare'}-{c['sentinel']}-{c['scale_dtype']}")
def test_migrate_gives_comfyuis_markers_and_identical_weights(tmp_path, case):
    src, out = tmp_path / "legacy.safetensors", tmp_path / "comfy.safetensors"
    sd = legacy_file(src, **case)
    with open_checkpoint(str(src)) as ckpt:
        detection = detect(ckpt)
        assert detection.name == "comfy-legacy-fp8"
        verdicts = {p: (t.verdict, t.format) for p, t in detection.layers.items()}
    prefix = case["prefix"]
    assert verdicts[f"{prefix}blocks.0.attn.qkv"] == ("exact", "float8_e4m3fn")
    assert verdicts[f"{prefix}final_layer.linear"] == ("exact", None)

    result = comfyquant.migrate(str(src), str(out))
    assert result.ok and result.after.ok, result.to_dict()
    markers = written_markers(out)
    comfy = comfyui_translation(sd, prefix)
    true_fp8 = {p: m for p, m in comfy.items() if sd[f"{p}.weight"].dtype == torch.float8_e4m3fn}
    assert markers == true_fp8  # ComfyUI's markers for the FP8 layers, none for the dense one

    migrated = load_file(str(out))
    assert f"{prefix}scaled_fp8" not in migrated
    assert f"{prefix}final_layer.linear.scale_weight" not in migrated
    assert migrated[f"{prefix}final_layer.linear.weight"].dtype == torch.bfloat16
    for p in true_fp8:
        scale = migrated[f"{p}.weight_scale"]
        assert scale.dtype == torch.float32 and scale.shape == ()
        assert scale.item() == sd[f"{p}.scale_weight"].float().item()  # an exact upcast
        assert bits(migrated[f"{p}.weight"]) == bits(sd[f"{p}.weight"])
    qkv = f"{prefix}blocks.0.attn.qkv"
    if case["scale_input"] == 1.0:  # ComfyUI drops it (dynamic activations): so does migrate
        assert f"{qkv}.input_scale" not in migrated
    elif case["scale_input"] is not None:
        assert migrated[f"{qkv}.input_scale"].item() == case["scale_input"]

    # dequantized before and after migrate: the same bits, and the legacy formula's values
    before, after = tmp_path / "before.safetensors", tmp_path / "after.safetensors"
    comfyquant.dequantize(str(src), str(before), dtype="f32")
    comfyquant.dequantize(str(out), str(after), dtype="f32")
    a, b = load_file(str(before)), load_file(str(after))
    assert a.keys() == b.keys()
    assert all(bits(a[k]) == bits(b[k]) for k in a)
    w = sd[f"{qkv}.weight"].float() * sd[f"{qkv}.scale_weight"].float()
    assert bits(a[f"{qkv}.weight"]) == bits(w)


def test_check_names_the_layout_and_comfyuis_failure_modes(tmp_path, capsys):
    src = tmp_path / "aio.safetensors"
    legacy_file(src, prefix=ROOT, sentinel=None)
    # the sentinel sits outside the diffusion model's prefix: ComfyUI strips the prefix first
    sd = load_file(str(src))
    sd["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    save_file(sd, str(src))
    report = comfyquant.check(str(src), target="comfyui")
    assert report.to_dict()["dialect"] == "comfy-legacy-fp8"
    assert not report.verdicts["comfyui"].loads
    assert "sentinel is lost" in report.verdicts["comfyui"].first.message
    dense = [f for f in report.findings if f.layer == f"{ROOT}final_layer.linear"]
    assert dense and "casts this BF16 weight to FP8" in dense[0].message
    assert main(["check", str(src), "--target", "comfyui"]) == 1
    assert "layout: 3 layers in the ComfyUI legacy scaled FP8 layout" in capsys.readouterr().out
    out = tmp_path / "fixed.safetensors"
    assert comfyquant.migrate(str(src), str(out)).ok
    assert comfyquant.check(str(out)).ok


def test_e5m2_becomes_float8_e5m2_never_a_silent_recast(tmp_path):
    src = tmp_path / "e5m2.safetensors"
    sd = legacy_file(src, e5m2=True, dummy_dense=False)
    report = comfyquant.check(str(src), target="comfyui")
    # ComfyUI re-casts the E5M2 codes by value: said in every check, and measured with --deep
    # (these codes lie within E4M3's range: the real runtime computes them normally)
    recast = [f for f in report.findings if "re-casts this F8_E5M2 weight by value" in f.message]
    assert recast and recast[0].severity == "warning"
    assert comfyquant.check(str(src), target="comfyui", deep=True).verdicts["comfyui"].loads
    out = tmp_path / "out.safetensors"
    # SGLang loads no float8_e5m2: refused for it, with nothing written
    with pytest.raises(MigrateError, match="would not load"):
        comfyquant.migrate(str(src), str(out), target="sglang")
    assert not out.exists()
    result = comfyquant.migrate(str(src), str(out), target="comfyui")
    assert result.ok
    assert set(m["format"] for m in written_markers(out).values()) == {"float8_e5m2"}
    migrated = load_file(str(out))
    assert bits(migrated["blocks.0.attn.qkv.weight"]) == bits(sd["blocks.0.attn.qkv.weight"])


def test_per_channel_scales_are_lossy_and_need_allow_lossy(tmp_path):
    src = tmp_path / "channel.safetensors"
    sd = legacy_file(src, per_channel=True)
    out = tmp_path / "out.safetensors"
    dry = comfyquant.migrate(str(src), str(out), dry_run=True)
    assert not dry.ok and any("fc1" in layer for layer, _ in dry.plan.refused)
    with pytest.raises(MigrateError, match="allow-lossy"):
        comfyquant.migrate(str(src), str(out))
    assert not out.exists()
    result = comfyquant.migrate(str(src), str(out), allow_lossy=True)
    assert result.ok
    rows = {r["layer"]: r for r in result.layers}
    fc1 = rows["blocks.0.mlp.fc1"]
    assert fc1["verdict"] == "lossy" and fc1["format"] == "float8_e4m3fn" and 0 < fc1["error"] < 0.1
    assert written_markers(out)["blocks.0.mlp.fc1"] == {"format": "float8_e4m3fn"}
    # dequantize reads the per-channel layer by the legacy formula, exactly into F32
    dense = tmp_path / "dense.safetensors"
    comfyquant.dequantize(str(src), str(dense), dtype="f32")
    got = load_file(str(dense))["blocks.0.mlp.fc1.weight"]
    want = sd["blocks.0.mlp.fc1.weight"].float() * sd["blocks.0.mlp.fc1.scale_weight"]
    assert bits(got) == bits(want)


def test_dense_layer_with_a_real_scale_is_refused_after_reading_it(tmp_path):
    src = tmp_path / "odd.safetensors"
    sd = legacy_file(src)
    sd["final_layer.linear.scale_weight"] = torch.tensor(0.5)
    save_file(sd, str(src))
    report = comfyquant.check(str(src), deep=True)
    assert any(f.code == "F004" and "not a dummy 1.0" in f.message for f in report.findings)
    with pytest.raises(MigrateError, match="weight x scale is meant is unknown"):
        comfyquant.migrate(str(src), str(tmp_path / "out.safetensors"))


def test_inspect_json_names_dialect_and_verdicts(tmp_path, capsys):
    src = tmp_path / "legacy.safetensors"
    legacy_file(src)
    assert main(["inspect", str(src), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dialect"] == "comfy-legacy-fp8"
    rows = {r["layer"]: r for r in doc["layers"]}
    assert rows["blocks.0.attn.qkv"]["dialect"] == "comfy-legacy-fp8 (tensor)"
    assert rows["blocks.0.attn.qkv"]["verdict"] == "exact" and rows["blocks.0.attn.qkv"]["format"] == "float8_e4m3fn"
    assert rows["final_layer.linear"]["format"] == "dense"
    assert rows["norm"]["dialect"] == "dense" and rows["norm"]["verdict"] is None


def test_convert_reads_a_legacy_file(tmp_path):
    src = tmp_path / "legacy.safetensors"
    legacy_file(src, n=64, k=256)
    out = tmp_path / "int8.safetensors"
    comfyquant.convert(str(src), str(out), to="int8")
    formats = {m["format"] for m in written_markers(out).values()}
    assert formats == {"int8_tensorwise"}
    assert comfyquant.check(str(out)).ok


def test_migrate_on_a_comfy_file_has_nothing_to_do(tmp_path, capsys):
    src, out = tmp_path / "legacy.safetensors", tmp_path / "comfy.safetensors"
    legacy_file(src)
    comfyquant.migrate(str(src), str(out))
    assert main(["migrate", str(out), "-o", str(tmp_path / "again.safetensors")]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert not (tmp_path / "again.safetensors").exists()


def test_remote_detection_costs_what_a_marker_file_costs(tmp_path, server):  # noqa: F811
    legacy_file(tmp_path / "legacy.safetensors")
    out = tmp_path / "comfy.safetensors"
    comfyquant.migrate(
        str(tmp_path / "legacy.safetensors"),
        str(out),
    )
    legacy = comfyquant.check(server.url("legacy.safetensors"))
    assert legacy.to_dict()["dialect"] == "comfy-legacy-fp8"
    n_legacy = server.requests("legacy.safetensors")
    comfyquant.check(server.url("comfy.safetensors"))
    assert n_legacy <= server.requests("comfy.safetensors")


def _e5m2_file(path, amax: float) -> None:
    """One legacy layer whose weight is E5M2 codes scaled so their largest is ``amax``."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 0.05
    scale = w.abs().amax() / amax
    save_file(
        {
            "blocks.0.attn.qkv.weight": (w / scale).to(torch.float8_e5m2),
            "blocks.0.attn.qkv.scale_weight": scale.reshape(()).float(),
            "scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn),
        },
        str(path),
    )


@pytest.mark.parametrize(("amax", "garbage"), [(448.0, False), (57344.0, True)])
def test_e5m2_weights_cast_to_e4m3_are_garbage_only_past_its_range(tmp_path, amax, garbage):
    # ComfyUI casts the E5M2 codes by value to E4M3: codes within E4M3's range (448) survive,
    # codes scaled to E5M2's own range (57344) saturate
    src = tmp_path / "e5m2.safetensors"
    _e5m2_file(src, amax)
    header = comfyquant.check(str(src), target="comfyui")
    assert header.verdicts["comfyui"].loads  # the header alone cannot tell: a warning
    assert any("check --deep measures the cast" in f.message for f in header.findings if f.severity == "warning")
    deep = comfyquant.check(str(src), target="comfyui", deep=True)
    assert deep.verdicts["comfyui"].loads is not garbage
    assert any(f.code == "D008" and f.severity == "error" for f in deep.findings) is garbage


@pytest.mark.parametrize(("codes", "scale", "garbage"), [(False, 1e-4, True), (False, 1.0, False), (True, 1e-3, False)])
def test_dense_weight_with_a_scale_is_garbage_when_the_cast_times_the_scale_is_not_it(tmp_path, codes, scale, garbage):
    # ComfyUI casts a dense weight with a scale_weight to E4M3 and multiplies by the scale: a
    # dense weight with a real scale is garbage; FP8 values stored wide with their scale are not
    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 256, generator=g) * (100.0 if codes else 0.05)
    if codes:
        w = w.to(torch.float8_e4m3fn).float()
    src = tmp_path / "dense.safetensors"
    save_file(
        {
            "blocks.0.attn.qkv.weight": w.to(torch.bfloat16),
            "blocks.0.attn.qkv.scale_weight": torch.tensor(scale),
            "scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn),
        },
        str(src),
    )
    assert comfyquant.check(str(src), target="comfyui").verdicts["comfyui"].loads
    deep = comfyquant.check(str(src), target="comfyui", deep=True)
    assert deep.verdicts["comfyui"].loads is not garbage
    assert any(f.code == "D008" for f in deep.findings) is garbage
