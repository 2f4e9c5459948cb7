"""Grouped findings print the message once, as the first finding says it: real names, never a
placeholder standing for them, and never a name replaced inside other words (a layer named
``a``)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from comfyquant.cli import main


def test_a_one_letter_layer_name_does_not_mangle_the_message(tmp_path, capsys):
    # a legacy scaled-FP8 file: SGLang's "missing comfy_quant metadata" is then one finding per
    # layer (no canonical finding covers it), printed once for the group
    sd = {"scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}
    for name in ("a", "b"):
        sd[f"{name}.weight"] = torch.ones(32, 64).to(torch.float8_e4m3fn)
        sd[f"{name}.scale_weight"] = torch.tensor(0.5)
    path = str(tmp_path / "m.safetensors")
    save_file(sd, path)
    assert main(["check", path, "--target", "sglang"]) == 1
    out = capsys.readouterr().out
    assert "uantized weights are missing comfy_quant metadata" in out, out
    assert "Qu<layer>ntized" not in out and "<layer>re missing" not in out
    assert "<layer>" not in out and "<tensor>" not in out
    assert "missing comfy_quant metadata: ['a', 'b']" in out  # the message SGLang raises, as it raises it
