"""``load_transformer`` on a Flux whose width is not 3072: diffusers' Flux converter fixes the
width of its single-block split, comfyquant says so in one line and splits at the file's width.

A tiny Flux of width 256 (two heads of 128), one double and two single blocks, built with
diffusers' own ``FluxTransformer2DModel``, written as a ComfyUI/BFL single file (the inverse
name map of ``test_diffusers_load``), quantized by comfyquant (the fused ``linear1`` of the
single blocks included: the tensor the converter splits) and loaded.  The output equals an
independent comfy-kitchen reference bit for bit and diffusers' dense model within the format's
tolerance."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

diffusers = pytest.importorskip("diffusers")

from comfyquant.diffusers import load_transformer  # noqa: E402
from comfyquant.torch import LoadError, QuantLinear  # noqa: E402
from test_diffusers_load import (  # noqa: E402
    DTYPE,
    QUANT,
    Case,
    comfy_state,
    file_keys,
    flux1_inputs,
    flux1_names,
    quantized_file,
    reference_model,
    run,
)


def narrow_case(heads: int) -> Case:
    return Case(
        "FluxTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=64,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=128,
            num_attention_heads=heads,
            joint_attention_dim=256,
            pooled_projection_dim=256,
            guidance_embeds=False,
            axes_dims_rope=(16, 56, 56),
        ),
        flux1_names,
        flux1_inputs,
        exclude=(r"^(?!.*(img_attn\.qkv|single_blocks\.\d+\.linear1|txt_attn\.proj)).*",),
        prefix="model.diffusion_model.",
    )


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """(case, the dense diffusers model, the dense file, the name map, folder, its output)."""
    case = narrow_case(heads=2)
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel.from_config(case.config).to(DTYPE).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
            elif p.numel() > 1:
                p.copy_(torch.randn_like(p) * 0.05 + (1.0 if torch.all(p == 1) else 0.0))
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state, sources = comfy_state(case, sd)
    folder = tmp_path_factory.mktemp("flux256")
    dense = folder / "dense.safetensors"
    save_file(state, str(dense))
    return case, model, dense, sources, folder, run(model, case)


def test_diffusers_converter_alone_fails_at_this_width(narrow):
    """The premise: diffusers' converter cannot split this file by itself."""
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES
    from safetensors.torch import load_file

    case, _model, dense, *_ = narrow
    convert = SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]["checkpoint_mapping_fn"]
    with pytest.raises(RuntimeError, match="split"):
        convert(checkpoint=load_file(str(dense)), config=case.config)


def test_the_dense_file_loads_exactly(narrow):
    case, model, dense, _sources, _folder, y_dense = narrow
    with pytest.warns(UserWarning, match=r"assumes width 3072; this file's is 256") as seen:
        loaded = load_transformer(str(dense), "FluxTransformer2DModel", config=dict(case.config), torch_dtype=DTYPE)
    assert len([w for w in seen if "width" in str(w.message)]) == 1
    assert len(str(seen[0].message).splitlines()) == 1
    assert loaded.comfyquant_report.ok
    assert set(loaded.comfyquant_report.loaded) == file_keys(str(dense))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(run(loaded, case), y_dense)


@pytest.mark.parametrize("fmt_key", ["fp8", "int8", "w4a8"])
def test_a_quantized_narrow_flux_loads_and_matches(narrow, fmt_key):
    case, model, dense, sources, folder, y_dense = narrow
    path = quantized_file(folder, dense, case, fmt_key)
    with pytest.warns(UserWarning, match="this file's is 256"):
        loaded = load_transformer(path, "FluxTransformer2DModel", config=dict(case.config), torch_dtype=DTYPE)
    report = loaded.comfyquant_report
    assert report.ok, report.summary()
    assert set(report.loaded) == file_keys(path)  # every scale and marker consumed
    split = {f"single_transformer_blocks.{i}.{p}" for i in (0, 1) for p in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")}
    quant = {n for n, m in loaded.named_modules() if isinstance(m, QuantLinear)}
    assert split <= quant == set(report.quantized)
    for name in split:
        assert loaded.get_submodule(name).in_features == 256
    ref = reference_model(case, model, path, sources, QUANT[fmt_key][2])
    y, y_ref = run(loaded, case), run(ref, case)
    assert torch.equal(y, y_ref), (y.float() - y_ref.float()).abs().max()
    rel = ((y.float() - y_dense.float()).norm() / y_dense.float().norm()).item()
    assert rel < QUANT[fmt_key][3], rel


def test_a_linear1_too_short_for_the_width_is_one_line(narrow, tmp_path):
    from safetensors.torch import load_file

    case, _model, dense, *_ = narrow
    state = load_file(str(dense))
    for key in [k for k in state if ".linear1." in k]:
        state[key] = state[key][: 3 * 256 - 8].contiguous()
    odd = tmp_path / "short.safetensors"
    save_file(state, str(odd))
    with pytest.raises(LoadError, match=r"short\.safetensors: .*single_blocks\.0\.linear1\.(weight|bias) has 760 rows"):
        load_transformer(str(odd), "FluxTransformer2DModel", config=dict(case.config), torch_dtype=DTYPE)


def test_width_3072_is_left_to_the_converter():
    from comfyquant.diffusers import flux_width

    def convert_flux_transformer_checkpoint_to_diffusers():
        pass

    full = {"img_in.weight": torch.empty(3072, 64, device="meta"), "single_blocks.0.linear1.weight": torch.empty(21504, 3072)}
    assert flux_width.stand_in(convert_flux_transformer_checkpoint_to_diffusers, dict(full), "f") is None
    other = {"img_in.weight": torch.empty(256, 64)}
    assert flux_width.stand_in(lambda **kw: None, other, "f") is None  # another class's converter
