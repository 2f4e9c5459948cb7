"""The ``modelopt`` dialect on files built the way NVIDIA ModelOpt writes them.

ModelOpt is not installed here, so ``modelopt_file`` builds its ComfyUI export following
its published code (NVIDIA/Model-Optimizer, ``modelopt/torch/export``):

* NVFP4 codes packed even element in the low nibble (``quantization/qtensor/nvfp4_tensor.py``:
  ``(q[..., 1::2] << 4) | q[..., 0::2]``), scales ``[N, K/16]`` E4M3 and the F32
  ``weight_scale_2 = amax / (448 * 6)``: diffusers' ``quantize_nvfp4`` produces exactly that
  layout ("following the ModelOpt NVFP4 layout") and makes the codes;
* ``diffusers_utils.py::pad_nvfp4_weights``: ``"row"`` pads weight and scale rows to 16,
  ``"row_col"`` also the packed columns and the scale columns to 16 (zeros);
* ``diffusers_utils.py::swizzle_nvfp4_scales`` (after padding): the cuBLAS 128x4 tile layout,
  which is comfy-kitchen's ``to_blocked`` (asserted in ``test_dialect_bfl``);
* ``diffusers_utils.py::build_layerwise_quant_metadata``: ``{"format": quant_algo.lower()}`` for
  every layer with ``weight_scale``/``weight_scale_2``; ``convert_hf_config.py::
  convert_hf_quant_config_format``: ``quant_method`` ``modelopt``, ``quant_algo``, ``ignore``,
  ``producer``;
* FP8 (``FP8_DEFAULT_CFG``): F8_E4M3 weight, scalar F32 ``weight_scale = amax / 448``, scalar
  ``input_scale``.

Reference dequantization: diffusers' ``dequantize_nvfp4`` of the unpadded linear form and
comfy-kitchen's ``dequantize_nvfp4`` of the Comfy form.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from comfy_kitchen import float_utils
from comfy_kitchen.backends.eager.quantization import dequantize_nvfp4 as ck_dequantize_nvfp4
from diffusers.quantizers.bfl.utils import dequantize_nvfp4, quantize_nvfp4
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant import codecs
from comfyquant.checker.run import check_checkpoint
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects import registry
from comfyquant.dialects.base import EXACT, LOSSY, PERMUTATION, REFUSED
from comfyquant.dialects.report import claim_violations
from dialect_helpers import detect_claim, export_claim, raw_tensors, stored, write_claim
from kitchen_fixtures import make_layer, make_weight, write_layers

SHAPES = {
    "blocks.0.qkv": (256, 512),  # N % 128 == 0, K/16 % 4 == 0: linear and blocked scales have one shape
    "blocks.0.proj": (48, 80),  # K/16 = 5: the shape tells
    "blocks.0.odd": (13, 64),  # N % 16 != 0 (bias keeps N)
}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=torch.uint8)
    out[: t.shape[0], : t.shape[1]] = t.view(torch.uint8)
    return out.view(t.dtype)


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def modelopt_layer(
    n: int, k: int, seed: int, *, swizzle: bool, padding: str | None, bias: bool = True, pre_quant_scale: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the layer as ModelOpt's ComfyUI export writes it, its unpadded linear form)."""
    w = make_weight(n, k, torch.float32, seed)
    q, s, s2 = quantize_nvfp4(w)
    plain = {"weight": q, "weight_scale": s, "weight_scale_2": s2}
    if padding is not None:
        rows = _ceil(n, 16)
        q = _pad(q, rows, _ceil(q.shape[1], 16) if padding == "row_col" else q.shape[1])
        s = _pad(s, rows, _ceil(s.shape[1], 16) if padding == "row_col" else s.shape[1])
    if swizzle:
        r, c = s.shape
        s = float_utils.to_blocked(s.view(torch.uint8)).reshape(_ceil(r, 128), _ceil(c, 4)).view(torch.float8_e4m3fn)
    out = {"weight": q, "weight_scale": s, "weight_scale_2": s2, "input_scale": torch.tensor(0.0371)}
    if bias:
        out["bias"] = make_weight(1, n, torch.float32, seed + 5)[0].to(torch.bfloat16)
    if pre_quant_scale:
        out["pre_quant_scale"] = (1.0 + make_weight(1, k, torch.float32, seed + 9)[0]).to(torch.bfloat16)
        plain["pre_quant_scale"] = out["pre_quant_scale"]
    return out, plain


def fp8_layer(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    w = make_weight(n, k, torch.float32, seed)
    scale = w.abs().amax() / 448.0
    return {
        "weight": (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn),
        "weight_scale": scale.reshape(()),
        "input_scale": torch.tensor(0.05),
        "bias": torch.zeros(n, dtype=torch.bfloat16),
    }


def modelopt_file(
    path,
    layers: dict[str, dict[str, torch.Tensor]],
    algo: str,
    layer_map: bool = True,
    extra: dict[str, torch.Tensor] | None = None,
) -> str:
    sd = {f"{p}.{s}": t.contiguous() for p, ts in layers.items() for s, t in ts.items()}
    sd.update(extra or {})
    config = {
        "config_groups": {"group_0": {"targets": ["Linear"]}},
        "ignore": [],
        "quant_algo": algo,
        "producer": {"name": "modelopt", "version": "0.41.0"},
        "quant_method": "modelopt",
    }
    meta = {"quantization_config": json.dumps(config)}
    if layer_map:
        meta["_quantization_metadata"] = json.dumps(
            {"format_version": "1.0", "layers": {p: {"format": algo.lower()} for p, ts in layers.items() if "weight_scale" in ts}}
        )
    save_file(sd, str(path), metadata=meta)
    return str(path)


def nvfp4_file(tmp_path, name: str, swizzle: bool, padding: str | None, shapes=SHAPES, **kw):
    built = {p: modelopt_layer(n, k, i, swizzle=swizzle, padding=padding, **kw) for i, (p, (n, k)) in enumerate(shapes.items())}
    path = modelopt_file(tmp_path / name, {p: b[0] for p, b in built.items()}, "NVFP4")
    return path, {p: b[1] for p, b in built.items()}


LAYOUTS = [(True, "row"), (False, None), (True, "row_col"), (False, "row_col"), (True, None)]


@pytest.mark.parametrize("swizzle,padding", LAYOUTS)
def test_nvfp4_migrates_by_permutation_and_dequantizes_bit_exactly(tmp_path, swizzle, padding):
    path, plain = nvfp4_file(tmp_path, "mo.safetensors", swizzle, padding)
    claim, found = detect_claim(path, "modelopt")
    assert found.name == "modelopt"
    assert {t.verdict for t in claim.layers.values()} == {PERMUTATION}
    layout = "blocked" if swizzle else "linear"
    assert claim.layers["blocks.0.qkv"].unsettled and layout in claim.unsettled[0]
    comfy = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, comfy)
    for prefix, (n, k) in SHAPES.items():
        reference = dequantize_nvfp4(plain[prefix]["weight"], plain[prefix]["weight_scale"], plain[prefix]["weight_scale_2"])
        c = stored(comfy, prefix)
        dense = ck_dequantize_nvfp4(c["weight"], c["weight_scale_2"], c["weight_scale"], torch.float32)
        assert same_bits(dense[:n, :k], reference)
        assert not dense[n:].any() and not dense[:, k:].any()
        source = stored(path, prefix)
        assert same_bits(claim.layers[prefix].decoder(source)[:, :k], reference)
        assert same_bits(codecs.get("nvfp4").decode(c, {"format": "nvfp4"}, dtype=torch.float32)[:, :k], reference)
    with open_checkpoint([comfy]) as ckpt:
        assert registry.detect(ckpt).name == "comfy"
        assert "quantization_config" not in ckpt.metadata()
        report = check_checkpoint(ckpt, target="comfyui")
    assert report.verdicts["comfyui"].loads, report.findings


@pytest.mark.parametrize("swizzle,padding", LAYOUTS)
def test_round_trip_modelopt_comfy_modelopt_is_byte_identical(tmp_path, swizzle, padding):
    path, _ = nvfp4_file(tmp_path, "mo.safetensors", swizzle, padding)
    claim, _ = detect_claim(path, "modelopt")
    comfy = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, comfy)
    exported = export_claim(comfy, "modelopt")
    assert {t.verdict for t in exported.layers.values()} == {PERMUTATION}
    back = str(tmp_path / "back.safetensors")
    write_claim(comfy, exported, back)
    assert raw_tensors(back) == raw_tensors(path)
    with open_checkpoint([back]) as a, open_checkpoint([path]) as b:
        assert a.metadata()["quantization_config"] == b.metadata()["quantization_config"]
        assert json.loads(a.metadata()["_quantization_metadata"]) == json.loads(b.metadata()["_quantization_metadata"])


def test_all_coinciding_shapes_are_refused_not_guessed(tmp_path):
    shapes = {"a": (128, 64), "b": (256, 128)}
    path, _ = nvfp4_file(tmp_path, "mo.safetensors", True, "row", shapes=shapes)
    claim, _ = detect_claim(path, "modelopt")
    for tr in claim.layers.values():
        assert tr.verdict == REFUSED and "enable_swizzle_layout" in tr.why and "fits both" in tr.why


def test_comfy_exports_to_modelopt_and_back_with_its_layout_recorded(tmp_path):
    kl = [
        make_layer("nvfp4", prefix=f"l{i}", n=n, k=k, seed=i, marker="comfyui")
        for i, (n, k) in enumerate([(128, 64), (256, 128)])
    ]
    src = write_layers(tmp_path / "kitchen.safetensors", kl, marker_mode="header")
    exported = export_claim(src, "modelopt")
    mo = str(tmp_path / "mo.safetensors")
    write_claim(src, exported, mo)
    with open_checkpoint([mo]) as ckpt:
        assert json.loads(ckpt.metadata()["quantization_config"])["quant_method"] == "modelopt"
        assert json.loads(ckpt.metadata()["_quantization_metadata"])["layers"]["l0"] == {"format": "nvfp4"}
    for x in kl:
        m = stored(mo, x.prefix)
        assert m["weight_scale"].shape == (x.n, x.k // 16)  # ModelOpt's plain (linear) layout
        assert same_bits(
            dequantize_nvfp4(m["weight"], m["weight_scale"], m["weight_scale_2"]),
            ck_dequantize_nvfp4(x.tensors["weight"], x.tensors["weight_scale_2"], x.tensors["weight_scale"], torch.float32)[
                : x.n
            ],
        )
    # every layer's shapes coincide: the layout the export recorded decides
    claim, _ = detect_claim(mo, "modelopt")
    assert {t.verdict for t in claim.layers.values()} == {PERMUTATION}
    assert "comfyquant.modelopt_layout" in claim.unsettled[0]
    again = str(tmp_path / "again.safetensors")
    write_claim(mo, claim, again)
    assert raw_tensors(again) == raw_tensors(src)


def test_layers_that_disagree_leave_the_coinciding_ones_refused(tmp_path):
    lin, _ = modelopt_layer(48, 80, 1, swizzle=False, padding=None)
    blk, _ = modelopt_layer(48, 80, 2, swizzle=True, padding=None)
    both, _ = modelopt_layer(128, 64, 3, swizzle=True, padding=None)
    path = modelopt_file(tmp_path / "mixed.safetensors", {"lin": lin, "blk": blk, "both": both}, "NVFP4")
    claim, _ = detect_claim(path, "modelopt")
    assert claim.layers["both"].verdict == REFUSED and "disagree" in claim.layers["both"].why
    # a layer whose shape tells is read as its shape says
    assert claim.layers["lin"].verdict == PERMUTATION and claim.layers["blk"].verdict == PERMUTATION
    assert "linear [48, 5]" in claim.layers["lin"].why and "blocked [128, 8] -> blocked" in claim.layers["blk"].why


def test_fp8_layers_are_exact_with_a_comfy_marker(tmp_path):
    layer = fp8_layer(32, 64, 4)
    path = modelopt_file(tmp_path / "fp8.safetensors", {"blocks.0.mlp": layer}, "FP8")
    with open_checkpoint([path]) as ckpt:
        claim = registry.detect(ckpt).claim("modelopt")
        tr = claim.layers["blocks.0.mlp"]
        assert tr.verdict == EXACT and tr.format == "float8_e4m3fn" and tr.marker == {"format": "float8_e4m3fn"}
        assert "'fp8'" in tr.why
        assert claim_violations(ckpt, claim, "comfyui") == []  # the profile says it:
    first = comfyquant.check(path, target="comfyui").verdicts["comfyui"].first
    assert (first.exception, first.message) == ("KeyError", "'fp8'")
    out = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, out)
    c = stored(out, "blocks.0.mlp")
    assert all(torch.equal(c[s].reshape(-1).view(torch.uint8), layer[s].reshape(-1).view(torch.uint8)) for s in layer)
    assert same_bits(
        codecs.get("float8_e4m3fn").decode(c, {"format": "float8_e4m3fn"}, dtype=torch.float32),
        layer["weight"].float() * layer["weight_scale"],
    )
    with open_checkpoint([out]) as ckpt:
        report = check_checkpoint(ckpt)
    assert all(v.loads for v in report.verdicts.values()), report.findings


def test_pre_quant_scale_is_kept(tmp_path):
    path, plain = nvfp4_file(tmp_path, "awq.safetensors", True, "row", shapes={"x": (48, 80)}, pre_quant_scale=True)
    claim, _ = detect_claim(path, "modelopt")
    out = str(tmp_path / "comfy.safetensors")
    write_claim(path, claim, out)
    c = stored(out, "x")
    assert torch.equal(c["pre_quant_scale"], plain["x"]["pre_quant_scale"])
    reference = (
        dequantize_nvfp4(plain["x"]["weight"], plain["x"]["weight_scale"], plain["x"]["weight_scale_2"])
        * plain["x"]["pre_quant_scale"].float()
    )
    assert same_bits(codecs.get("nvfp4").decode(c, {"format": "nvfp4"}, dtype=torch.float32), reference)
    assert same_bits(claim.layers["x"].decoder(stored(path, "x")), reference)


def test_scale_padding_that_holds_values_is_refused_by_settle(tmp_path):
    layer, _ = modelopt_layer(48, 80, 6, swizzle=False, padding="row_col")
    s = layer["weight_scale"].view(torch.uint8).clone()
    s[3, 12] = 0x38  # a value in a padding column
    layer["weight_scale"] = s.view(torch.float8_e4m3fn)
    path = modelopt_file(tmp_path / "bad.safetensors", {"x": layer}, "NVFP4")
    with open_checkpoint([path]) as ckpt:
        claim = registry.detect(ckpt).claim("modelopt")
        assert claim.layers["x"].verdict == PERMUTATION
        findings = registry.DIALECTS["modelopt"].settle(ckpt, claim)
    assert claim.layers["x"].verdict == REFUSED and "not zero" in claim.layers["x"].why
    assert [f.layer for f in findings] == ["x"]


def test_svdquant_residual_is_refused(tmp_path):
    layer, _ = modelopt_layer(48, 80, 7, swizzle=True, padding="row")
    path = modelopt_file(
        tmp_path / "svd.safetensors",
        {"x": layer},
        "NVFP4_SVD",
        extra={"x.svdquant_lora_a": torch.zeros(4, 80), "x.svdquant_lora_b": torch.zeros(48, 4)},
    )
    claim, _ = detect_claim(path, "modelopt")
    assert claim.layers["x"].verdict == REFUSED and "svdquant_lora_a" in claim.layers["x"].why


def test_runtime_models_comfyui_on_the_raw_export(tmp_path):
    """The dialect adds what the runtime profiles cannot see (the nibble order) and nothing they
    already say (from_blocked's reshape error for linear scales)."""
    path, _ = nvfp4_file(tmp_path, "mo.safetensors", False, None, shapes={"lin": (48, 80), "both": (128, 64)})
    with open_checkpoint([path]) as ckpt:
        claim = registry.detect(ckpt).claim("modelopt")
        out = {v.layer: v for v in claim_violations(ckpt, claim, "comfyui")}
        sglang = {v.layer: v for v in claim_violations(ckpt, claim, "sglang")}
    assert set(out) == {"both"} and set(sglang) == {"both", "lin"}
    assert not out["both"].blocking and out["both"].fails and "low nibble" in out["both"].message
    verdict = comfyquant.check(path, target="comfyui").verdicts["comfyui"]
    by_layer: dict = {}
    for v in verdict.violations:
        by_layer.setdefault(v.layer, []).append(v)
    assert [v.exception for v in by_layer["lin"]] == ["RuntimeError"] and "invalid" in by_layer["lin"][0].message
    assert [v.rule for v in by_layer["both"]] == ["comfyui.modelopt"]


def test_unmarked_modelopt_export_is_claimed_and_bfl_claims_nothing(tmp_path):
    layer, _ = modelopt_layer(48, 80, 8, swizzle=False, padding=None)
    fp8 = fp8_layer(16, 32, 9)
    path = modelopt_file(tmp_path / "plain.safetensors", {"x": layer, "f": fp8}, "MIXED_PRECISION", layer_map=False)
    claim, found = detect_claim(path, "modelopt")
    assert found.name == "modelopt" and set(claim.layers) == {"x", "f"}
    assert "no marker" in claim.layers["x"].why and claim.layers["f"].verdict == EXACT
    with open_checkpoint([path]) as ckpt:
        comfyui = claim_violations(ckpt, registry.detect(ckpt).claim("modelopt"), "comfyui")
    assert {v.layer: v.fails for v in comfyui} == {"x": True, "f": True}


def test_per_channel_fp8_is_lossy(tmp_path):
    layer = fp8_layer(16, 32, 10)
    layer["weight_scale"] = torch.full((16,), float(layer["weight_scale"]))
    path = modelopt_file(tmp_path / "pc.safetensors", {"f": layer}, "FP8")
    claim, _ = detect_claim(path, "modelopt")
    tr = claim.layers["f"]
    assert tr.verdict == LOSSY and tr.lossy.format == "float8_e4m3fn"
    assert same_bits(tr.decoder(stored(path, "f")), layer["weight"].float() * layer["weight_scale"][:, None])


def _random_layer(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A packed-FP4 or FP8 layer with shapes drawn to hit every branch: consistent, padded,
    swizzled, inconsistent, odd rows, missing or malformed companions."""

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    n, cb = pick([1, 13, 16, 48, 128, 130]), pick([1, 8, 24, 32, 40])
    out: dict[str, torch.Tensor] = {}
    if pick([True, False]):
        kb = max(1, 2 * cb // 16)
        out["weight"] = torch.randint(0, 256, (n, cb), dtype=torch.uint8, generator=gen)
        rows, cols = pick([(n, kb), (_ceil(n, 128), _ceil(kb, 4)), (n, _ceil(kb, 16)), (n + 1, kb), (n, kb + 3)])
        out["weight_scale"] = torch.randint(0, 120, (rows, cols), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)
        out["weight_scale_2"] = pick([torch.tensor(0.5), torch.tensor([0.5]), torch.ones(2)])
    else:
        out["weight"] = torch.randint(0, 120, (n, cb), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)
        out["weight_scale"] = pick([torch.tensor(0.1), torch.full((n,), 0.1), torch.ones(n, 2), torch.ones(3)])
    if pick([True, False]):
        out["input_scale"] = pick([torch.tensor(0.2), torch.ones(2)])
    if pick([True, False]):
        out["bias"] = pick([torch.zeros(n), torch.zeros(n + 5), torch.zeros(max(1, n - 3))])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_layers_never_break_detection_and_moves_fill_their_shapes(tmp_path, seed):
    """Whatever the shapes, detection answers (no exception) and every translation that is not
    refused writes exactly the bytes its moves declare; ``bfl`` sees the same layers without the
    ModelOpt header."""
    gen = torch.Generator().manual_seed(seed)
    layers = {f"l{i}": _random_layer(gen) for i in range(8)}
    for name, header in (("mo", True), ("bfl", False)):
        path = modelopt_file(tmp_path / f"{name}.safetensors", layers, "MIXED_PRECISION", layer_map=header)
        if not header:  # no quantization_config either
            from safetensors import safe_open

            with safe_open(path, "pt") as f:
                sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            save_file(sd, path)
        with open_checkpoint([path]) as ckpt:
            found = registry.detect(ckpt)
            for claim in found.claims:
                dialect = registry.DIALECTS[claim.dialect]
                for target in ("comfyui", "sglang", "kitchen"):
                    claim_violations(ckpt, claim, target)
                if dialect.settle is not None:
                    dialect.settle(ckpt, claim)
            for tr in found.layers.values():
                assert tr.why
                if tr.verdict in (REFUSED, LOSSY):
                    continue
                for m in tr.moves:
                    data = ckpt.read_bytes(ckpt.tensors[m.source])
                    data = m.transform(data) if m.transform is not None else data
                    size = {"U8": 1, "F8_E4M3": 1, "F32": 4, "BF16": 2, "F16": 2}[m.dtype]
                    numel = 1
                    for d in m.shape:
                        numel *= d
                    assert len(data) == numel * size, (tr, m)


# -- end to end, through the commands ----------------------------------------------------------

needs_migrate = pytest.mark.skipif(not hasattr(comfyquant, "migrate"), reason="migrate is wired on main")


def dense(path: str, tmp_path, name: str) -> dict[str, torch.Tensor]:
    out = str(tmp_path / f"{name}.dense.safetensors")
    comfyquant.dequantize(path, out, dtype="f32", progress=False)
    return load_file(out)


def test_cli_inspect_and_check_name_the_modelopt_layout(tmp_path, capsys):
    path, _ = nvfp4_file(tmp_path, "mo.safetensors", True, "row")
    assert main(["inspect", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dialect"] == "modelopt"
    rows = {r["layer"]: r for r in data["layers"]}
    assert {rows[p]["dialect"] for p in SHAPES} == {"modelopt (nvfp4)"}
    assert {rows[p]["verdict"] for p in SHAPES} == {PERMUTATION}
    report = comfyquant.check(path, target="comfyui")
    assert not report.verdicts["comfyui"].loads and "low nibble" in report.verdicts["comfyui"].first.message


@needs_migrate
@pytest.mark.parametrize("swizzle,padding", [(True, "row"), (False, "row_col")])
def test_cli_migrate_modelopt_to_comfy_and_back(tmp_path, swizzle, padding):
    path, plain = nvfp4_file(tmp_path, "mo.safetensors", swizzle, padding)
    out = str(tmp_path / "comfy.safetensors")
    assert main(["migrate", path, "-o", out, "--target", "comfyui"]) == 0
    assert main(["check", "--target", "comfyui", out]) == 0
    before, after = dense(path, tmp_path, "before"), dense(out, tmp_path, "after")
    for prefix, (_n, k) in SHAPES.items():
        reference = dequantize_nvfp4(plain[prefix]["weight"], plain[prefix]["weight_scale"], plain[prefix]["weight_scale_2"])
        assert same_bits(before[f"{prefix}.weight"][:, :k], reference)
        assert same_bits(after[f"{prefix}.weight"], before[f"{prefix}.weight"])
    back = str(tmp_path / "back.safetensors")
    assert main(["migrate", out, "--to", "modelopt", "-o", back]) == 0
    assert raw_tensors(back) == raw_tensors(path)


@needs_migrate
def test_cli_migrate_refuses_a_layout_no_layer_tells(tmp_path):
    path, _ = nvfp4_file(tmp_path, "mo.safetensors", True, "row", shapes={"a": (128, 64)})
    out = str(tmp_path / "comfy.safetensors")
    assert main(["migrate", path, "-o", out, "--target", "comfyui"]) == 2  # refused: nothing written
    assert not os.path.exists(out)


@needs_migrate
def test_cli_migrate_modelopt_fp8_is_exact(tmp_path):
    layer = fp8_layer(32, 64, 12)
    path = modelopt_file(tmp_path / "fp8.safetensors", {"blocks.0.mlp": layer}, "FP8")
    assert main(["check", "--target", "comfyui", path]) == 1
    out = str(tmp_path / "comfy.safetensors")
    assert main(["migrate", path, "-o", out, "--target", "comfyui"]) == 0
    assert main(["check", "--target", "comfyui", out]) == 0
    assert same_bits(dense(out, tmp_path, "after")["blocks.0.mlp.weight"], layer["weight"].float() * layer["weight_scale"])
