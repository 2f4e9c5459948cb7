"""Grouped findings print the message once with ``<layer>`` for the layer's name: only where
the name stands as a whole name, never inside other words (a layer named ``a``)."""

from __future__ import annotations

from builders import int8_layer, write
from comfyquant.cli import main


def test_a_one_letter_layer_name_does_not_mangle_the_message(tmp_path, capsys):
    path = write(tmp_path / "m.safetensors", int8_layer("a", marker=False), int8_layer("b", marker=False))
    assert main(["check", path, "--target", "sglang"]) == 1
    out = capsys.readouterr().out
    assert "Quantized weights are missing comfy_quant metadata" in out
    assert "Qu<layer>ntized" not in out and "<layer>re missing" not in out
