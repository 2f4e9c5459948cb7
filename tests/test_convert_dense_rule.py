"""Rules can keep a layer as stored (``keep``) or make it dense (``dense``): for ``convert``,
``dense`` decodes the quantized layer into its model dtype and writes it without a marker,
which is how a layer the new format cannot take leaves a mix the target refuses (issue 16)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.cli import main


def test_dense_rule_decodes_the_layer_left_behind(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(2):
        sd[f"double_blocks.{i}.img_attn.qkv.weight"] = torch.randn(256, 256, generator=g).bfloat16()
        sd[f"double_blocks.{i}.img_attn.qkv.bias"] = torch.zeros(256).bfloat16()
    sd["double_blocks.0.txt_mod.weight"] = torch.randn(256, 320, generator=g).bfloat16()  # K=320: no W4A8
    sd["double_blocks.0.txt_mod.bias"] = torch.zeros(256).bfloat16()
    dense = tmp_path / "dense.safetensors"
    save_file(sd, str(dense))
    src = str(tmp_path / "nvfp4.safetensors")
    comfyquant.quantize(str(dense), src, "nvfp4", preset="none", progress=False)
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
