"""A convert whose output the target would not load names the layers that make the mix and
why each stayed in its input format; ``--dry-run`` prints the whole plan before the refusal
Rules can keep such a layer as stored (``keep``: the refused mix again) or make it dense
(``dense``: ``convert`` decodes it into its model dtype and writes no marker)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.cli import main


@pytest.fixture
def nvfp4_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(2):
        sd[f"double_blocks.{i}.img_attn.qkv.weight"] = torch.randn(256, 256, generator=g).bfloat16()
        sd[f"double_blocks.{i}.img_attn.qkv.bias"] = torch.zeros(256).bfloat16()
    sd["double_blocks.0.txt_mod.weight"] = torch.randn(256, 320, generator=g).bfloat16()  # K=320: no W4A8
    sd["double_blocks.0.txt_mod.bias"] = torch.zeros(256).bfloat16()
    dense = tmp_path / "dense.safetensors"
    save_file(sd, str(dense))
    out = tmp_path / "nvfp4.safetensors"
    comfyquant.quantize(str(dense), str(out), "nvfp4", preset="none", progress=False)
    return str(out)


def test_refusal_names_the_layer_left_behind_and_why(nvfp4_file, tmp_path, capsys):
    out = str(tmp_path / "w4a8.safetensors")
    assert main(["convert", nvfp4_file, out, "--to", "w4a8"]) == 2
    err = capsys.readouterr().err
    assert "double_blocks.0.txt_mod stays nvfp4" in err and "K=320 must be a multiple of 256" in err
    assert "rules file" in err


def test_dry_run_prints_the_plan_then_the_refusal(nvfp4_file, tmp_path, capsys):
    out = str(tmp_path / "w4a8.safetensors")
    assert main(["convert", nvfp4_file, out, "--to", "w4a8", "--dry-run"]) == 1
    text = capsys.readouterr().out
    plan_at = text.index("double_blocks.1.img_attn.qkv")
    refusal_at = text.index("refusing: the output")
    assert plan_at < refusal_at and "the run would be refused" in text
    # for a target that loads the mix, the same convert is planned and runs
    assert main(["convert", nvfp4_file, out, "--to", "w4a8", "--target", "comfyui"]) == 0


def test_dense_rule_decodes_the_layer_left_behind(nvfp4_file, tmp_path, capsys):
    src = nvfp4_file
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nmatch = "double_blocks.0.txt_mod"\nformat = "dense"\n')
    out = str(tmp_path / "w4a8.safetensors")
    assert main(["convert", src, out, "--to", "w4a8", "--rules", str(rules), "--no-progress"]) == 0
    assert "decoded (1): decoded to dense by" in capsys.readouterr().out
    written = load_file(out)
    assert "double_blocks.0.txt_mod.comfy_quant" not in written
    assert written["double_blocks.0.txt_mod.weight"].dtype == torch.bfloat16
    # the dense weight is exactly what dequantize makes of the NVFP4 layer
    ref = str(tmp_path / "ref.safetensors")
    comfyquant.dequantize(src, ref, progress=False)
    want = load_file(ref)["double_blocks.0.txt_mod.weight"]
    assert torch.equal(written["double_blocks.0.txt_mod.weight"].view(torch.int16), want.view(torch.int16))
    assert comfyquant.check(out).ok
    # "keep" leaves it as stored: the mix SGLang refuses
    rules.write_text('[[rules]]\nmatch = "double_blocks.0.txt_mod"\nformat = "keep"\n')
    assert main(["convert", src, str(tmp_path / "k.safetensors"), "--to", "w4a8", "--rules", str(rules)]) == 2
