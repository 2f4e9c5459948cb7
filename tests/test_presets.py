"""``quantize --preset``: family keep-dense lists, detection from tensor names, all-in-one checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import comfyquant
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.quantizer.presets import PRESETS, SOURCES, detect
from kitchen_fixtures import make_weight

H = 128


def _save(path, shapes: dict[str, tuple], extra: dict | None = None, prefix: str = "") -> str:
    """A dense BF16 file: each ``name -> shape`` as ``<name>.weight`` (plus a bias for 2-D ones)."""
    sd = {}
    for i, (name, shape) in enumerate(shapes.items()):
        if len(shape) == 2:
            sd[f"{prefix}{name}.weight"] = make_weight(*shape, seed=i)
            sd[f"{prefix}{name}.bias"] = torch.zeros(shape[0], dtype=torch.bfloat16)
        else:
            sd[f"{prefix}{name}" + ("" if name.endswith("modulation") else ".weight")] = torch.zeros(shape, dtype=torch.bfloat16)
    sd.update(extra or {})
    save_file(sd, str(path))
    return str(path)


FLUX = {
    "img_in": (H, 64),
    "txt_in": (H, 256),
    "time_in.in_layer": (H, 256),
    "time_in.out_layer": (H, H),
    "vector_in.in_layer": (H, 256),
    "vector_in.out_layer": (H, H),
    "guidance_in.in_layer": (H, 256),
    "guidance_in.out_layer": (H, H),
    **{
        f"double_blocks.{b}.{s}": (n, H)
        for b in range(2)
        for s, n in (
            ("img_attn.qkv", 3 * H),
            ("img_attn.proj", H),
            ("img_mlp.0", 4 * H),
            ("img_mod.lin", 6 * H),
            ("txt_attn.qkv", 3 * H),
            ("txt_mlp.0", 4 * H),
            ("txt_mod.lin", 6 * H),
        )
    },
    **{f"double_blocks.{b}.img_attn.norm.key_norm": (16,) for b in range(2)},
    **{f"single_blocks.{b}.{s}": (n, H) for b in range(2) for s, n in (("linear1", 7 * H), ("modulation.lin", 3 * H))},
    "final_layer.linear": (64, H),
    "final_layer.adaLN_modulation.1": (2 * H, H),
}
FLUX_KEPT = {
    "img_in",
    "txt_in",
    "time_in.in_layer",
    "time_in.out_layer",
    "vector_in.in_layer",
    "vector_in.out_layer",
    "guidance_in.in_layer",
    "guidance_in.out_layer",
    "final_layer.linear",
    "final_layer.adaLN_modulation.1",
}

WAN = {
    "patch_embedding": (H, 16, 1, 2, 2),
    "text_embedding.0": (H, 256),
    "text_embedding.2": (H, H),
    "time_embedding.0": (H, 256),
    "time_embedding.2": (H, H),
    "time_projection.1": (6 * H, H),
    **{
        f"blocks.{b}.{s}": (H, H)
        for b in range(2)
        for s in (
            "self_attn.q",
            "self_attn.k",
            "self_attn.v",
            "self_attn.o",
            "cross_attn.q",
            "cross_attn.k",
            "cross_attn.v",
            "cross_attn.o",
        )
    },
    **{f"blocks.{b}.ffn.0": (4 * H, H) for b in range(2)},
    **{f"blocks.{b}.self_attn.norm_q": (H,) for b in range(2)},
    "blocks.0.modulation": (1, 6, H),
    "head.head": (64, H),
    "head.modulation": (1, 2, H),
}
WAN_KEPT = {"text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2", "time_projection.1", "head.head"}

QWEN = {
    "img_in": (H, 64),
    "txt_in": (H, 256),
    "txt_norm": (256,),
    "time_text_embed.timestep_embedder.linear_1": (H, 256),
    "time_text_embed.timestep_embedder.linear_2": (H, H),
    **{
        f"transformer_blocks.{b}.{s}": (n, H)
        for b in range(2)
        for s, n in (
            ("img_mod.1", 6 * H),
            ("txt_mod.1", 6 * H),
            ("attn.to_q", H),
            ("attn.add_q_proj", H),
            ("attn.to_out.0", H),
            ("img_mlp.net.0.proj", 4 * H),
        )
    },
    "norm_out.linear": (2 * H, H),
    "proj_out": (64, H),
}
QWEN_KEPT = {
    "img_in",
    "txt_in",
    "time_text_embed.timestep_embedder.linear_1",
    "time_text_embed.timestep_embedder.linear_2",
    "norm_out.linear",
    "proj_out",
    "transformer_blocks.0.img_mod.1",
}


def _plan(path, **kw):
    return comfyquant.quantize(path, dry_run=True, **kw)


def _split(result) -> tuple[set, set]:
    quantized = {lp.name for lp in result.plan.layers if lp.action == "quantize"}
    dense = {lp.name for lp in result.plan.layers if lp.action == "dense"}
    return quantized, dense


@pytest.mark.parametrize(
    "shapes,kept,family,evidence",
    [
        (FLUX, FLUX_KEPT, "flux", "double_blocks, single_blocks, img_in"),
        (WAN, WAN_KEPT, "wan", "blocks, text_embedding, head"),
        (QWEN, QWEN_KEPT, "qwen-image", "transformer_blocks, txt_norm, img_in"),
    ],
)
def test_detected_preset_keeps_the_family_list_dense(tmp_path, capsys, shapes, kept, family, evidence):
    src = _save(tmp_path / "m.safetensors", shapes)
    r = _plan(src)
    quantized, dense = _split(r)
    linear = {n for n, s in shapes.items() if len(s) == 2}
    assert dense & linear == kept  # exactly the family's list among the 2-D linears
    assert quantized == linear - kept
    assert {lp.format for lp in r.plan.quantized} == {"float8_e4m3fn"}  # the presets' default format
    for lp in r.plan.layers:
        if lp.name in kept:
            assert lp.reason.startswith(f"kept by preset {family} '*") and "(" in lp.reason, lp.reason
    sel = r.doc["selection"]
    assert sel["preset"] == family and sel["how"] == "detected"
    assert all(url in SOURCES.values() for url in sel["sources"].values()) and sel["sources"]
    # the CLI says so on stderr, and --dry-run shows which preset rule kept each layer
    assert main(["quantize", src, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert f"preset {family} detected from tensor names ({evidence})" in err
    some = sorted(kept)[0]
    assert any(some in line and f"kept by preset {family}" in line for line in out.splitlines())


def test_preset_none_given_and_overrides(tmp_path, capsys):
    src = _save(tmp_path / "flux.safetensors", FLUX)
    linear = {n for n, s in FLUX.items() if len(s) == 2}
    # --preset none: every linear gets --format
    q, _ = _split(_plan(src, format="fp8", preset="none"))
    assert q == linear
    # no --format and presets off: nothing to do, as before presets existed
    with pytest.raises(InputError, match=r"give format=\.\.\. or rules=\.\.\."):  # the API names its keywords
        _plan(src, preset="none")
    # --format replaces the preset's format, the keep list stays
    r = _plan(src, format="nvfp4", target="comfyui")
    assert {lp.format for lp in r.plan.quantized} == {"nvfp4"} and _split(r)[0] == linear - FLUX_KEPT
    # a rule the user states beats the preset's keep list; --exclude beats everything
    rules = tmp_path / "r.toml"
    rules.write_text('[[rules]]\nmatch = "img_in"\nformat = "fp8"\n')
    q, d = _split(_plan(src, format="fp8", rules=str(rules), exclude=[r"^double_blocks\.0\.img_attn\.qkv$"]))
    assert "img_in" in q and "txt_in" in d and "double_blocks.0.img_attn.qkv" in d
    # a preset given by name on another family's names: only its own list applies
    r = _plan(src, preset="wan")
    assert _split(r)[0] == linear and r.doc["selection"]["how"] == "given"
    # unknown names are refused in one line
    assert main(["quantize", src, "--preset", "sdxl", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown preset" in err and "flux" in err


def test_unknown_family_needs_a_format(tmp_path, capsys):
    src = _save(tmp_path / "m.safetensors", {"blocks.0.attn.qkv": (3 * H, H), "blocks.0.mlp.fc1": (4 * H, H)})
    assert main(["quantize", src, "--dry-run"]) == 2
    assert "give --format F or --rules FILE (or --preset NAME: no preset matches the tensor names)" in capsys.readouterr().err
    q, _ = _split(_plan(src, format="fp8"))
    assert q == {"blocks.0.attn.qkv", "blocks.0.mlp.fc1"}


# tensor names of each family as their reference layouts spell them (a few per family)
FAMILY_NAMES = {
    "flux2": [
        "double_blocks.0.img_attn.qkv.weight",
        "single_blocks.0.linear1.weight",
        "img_in.weight",
        "double_stream_modulation_img.lin.weight",
        "single_stream_modulation.lin.weight",
    ],
    "chroma": [
        "double_blocks.0.img_attn.qkv.weight",
        "single_blocks.0.linear1.weight",
        "img_in.weight",
        "distilled_guidance_layer.in_proj.weight",
    ],
    "hunyuan-video": [
        "double_blocks.0.img_attn_qkv.weight",
        "single_blocks.0.linear1.weight",
        "img_in.proj.weight",
        "txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight",
        "vector_in.in_layer.weight",
    ],
    "flux": [
        "double_blocks.0.img_attn.qkv.weight",
        "single_blocks.0.linear1.weight",
        "img_in.weight",
        "vector_in.in_layer.weight",
        "guidance_in.in_layer.weight",
    ],
    "wan": ["blocks.0.self_attn.q.weight", "text_embedding.0.weight", "head.head.weight", "head.modulation"],
    "qwen-image": ["img_in.weight", "txt_norm.weight", "transformer_blocks.0.img_mod.1.weight"],
    "z-image": [
        "cap_embedder.1.weight",
        "context_refiner.0.attention.qkv.weight",
        "noise_refiner.0.attention.qkv.weight",
        "layers.0.attention.qkv.weight",
        "x_embedder.weight",
    ],
    "ltx2": [
        "adaln_single.emb.timestep_embedder.linear_1.weight",
        "audio_adaln_single.linear.weight",
        "transformer_blocks.0.attn1.to_q.weight",
        "patchify_proj.weight",
    ],
}


@pytest.mark.parametrize("family", sorted(FAMILY_NAMES))
def test_detection_picks_the_most_specific_family(family):
    found = detect(FAMILY_NAMES[family])
    assert found is not None and found[0].name == family


def test_detection_needs_every_signature():
    assert detect(["double_blocks.0.img_attn.qkv.weight", "img_in.weight"]) is None  # no single_blocks
    assert detect(["blocks.0.attn.qkv.weight", "head.weight"]) is None


def _header(path) -> dict:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n))


def test_all_in_one_quantizes_the_diffusion_model_only(tmp_path, capsys):
    te = "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q"
    vae = "vae.decoder.mid.attn.q"
    extra = {
        f"{te}.weight": make_weight(H, H, seed=50),
        f"{vae}.weight": make_weight(H, H, seed=51),
        "first_stage_model.decoder.conv_in.weight": torch.zeros(8, 4, 3, 3, dtype=torch.bfloat16),
        "cond_stage_model.clip_l.transformer.text_model.encoder.layers.0.mlp.fc1.weight": make_weight(H, H, seed=52),
    }
    src = _save(tmp_path / "aio.safetensors", FLUX, extra, prefix="model.diffusion_model.")
    r = _plan(src)
    q, d = _split(r)
    inner = {n for n, s in FLUX.items() if len(s) == 2}
    pre = "model.diffusion_model."
    assert q == {pre + n for n in inner - FLUX_KEPT}  # the preset matched the stripped names
    assert {pre + n for n in FLUX_KEPT} <= d and te in d and vae in d
    reasons = {lp.name: lp.reason for lp in r.plan.layers}
    assert "--include text-encoders" in reasons[te] and "--include vae" in reasons[vae]
    assert r.doc["selection"]["all_in_one"] and r.doc["selection"]["preset"] == "flux"
    # --include widens; the preset's globs still apply inside the diffusion model only
    q2, _ = _split(_plan(src, include=["text-encoders"]))
    assert q2 == q | {te, "cond_stage_model.clip_l.transformer.text_model.encoder.layers.0.mlp.fc1"}
    q3, _ = _split(_plan(src, include=["text-encoders,vae"]))
    assert vae in q3
    # the written names stay as in the file
    out = tmp_path / "aio.fp8.safetensors"
    assert main(["quantize", src, str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "all-in-one checkpoint" in err and "preset flux detected" in err
    h = _header(out)
    assert f"{pre}double_blocks.0.img_attn.qkv.comfy_quant" in h and f"{pre}img_in.weight" in h
    assert h[f"{pre}img_in.weight"]["dtype"] == "BF16" and h[f"{te}.weight"]["dtype"] == "BF16"
    assert h[f"{pre}double_blocks.0.img_attn.qkv.weight"]["dtype"] == "F8_E4M3"


def test_prefixed_diffusion_model_alone(tmp_path):
    """A file holding only model.diffusion_model.*: the prefix is stripped for the preset, and
    nothing is an all-in-one part to leave out."""
    src = _save(tmp_path / "dm.safetensors", FLUX, prefix="model.diffusion_model.")
    r = _plan(src)
    inner = {n for n, s in FLUX.items() if len(s) == 2}
    assert _split(r)[0] == {"model.diffusion_model." + n for n in inner - FLUX_KEPT}
    assert r.doc["selection"]["preset"] == "flux" and not r.doc["selection"]["all_in_one"]
    assert not any("all-in-one" in n for n in r.plan.notes)


def test_include_needs_an_all_in_one_checkpoint(tmp_path, capsys):
    src = _save(tmp_path / "flux.safetensors", FLUX)
    assert main(["quantize", src, "--include", "text-encoders", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an all-in-one checkpoint" in err
    assert main(["quantize", src, "--include", "unet", "--dry-run"]) == 2
    assert "choose from text-encoders, vae, all" in capsys.readouterr().err


def test_help_states_each_list_and_its_source(capsys):
    try:
        rc = main(["quantize", "--help"])
    except SystemExit as exc:
        rc = exc.code
    text = capsys.readouterr().out
    assert rc == 0
    assert max(len(line) for line in text.splitlines()) <= 100
    for name, preset in PRESETS.items():
        assert f"  {name}: " in text
        for sub, _src in preset.keep:
            assert sub in text
    for where in SOURCES.values():
        assert where.split()[0] in text  # the repository
    for key in SOURCES:
        assert f"[{key}]" in text


def test_preset_data_is_complete():
    """presets.toml: every preset's format is one quantize writes, every list names a known
    source with its repository, and the data file ships with the package."""
    from comfyquant.quantizer.params import resolve_format

    for p in PRESETS.values():
        assert resolve_format(p.format) and p.keep and p.title
        assert all(src in SOURCES for _name, src in p.keep)
    assert all(where.startswith("https://github.com/") for where in SOURCES.values())
    assert sum(1 for p in PRESETS.values() if p.detect) >= 8
    with open(Path(__file__).parents[1] / "pyproject.toml", encoding="utf-8") as fh:
        assert "quantizer/presets.toml" in fh.read()
