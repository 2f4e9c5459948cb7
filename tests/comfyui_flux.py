"""A tiny Flux made with ComfyUI's own classes, for the tests that run a real ComfyUI.

ComfyUI detects a Flux from its tensors' names and shapes (ComfyUI 0.33.0
comfy/model_detection.py: ``double_blocks.0.img_attn.norm.key_norm``, ``img_in``; the
head size is the sum of ``axes_dim``, 128), so a model of width 256 with two heads and one
block of each kind is a real model ComfyUI loads and runs.  Its weights are seeded random
numbers in BF16 (norm scales near 1, so the output is not dominated by one layer).

Run with ComfyUI's Python: ``python comfyui_flux.py COMFYUI_SOURCE OUT.safetensors``.
"""

from __future__ import annotations

import sys

CONFIG = dict(
    image_model="flux",
    in_channels=16,
    out_channels=16,
    vec_in_dim=32,
    context_in_dim=64,
    hidden_size=256,
    mlp_ratio=4.0,
    num_heads=2,
    depth=1,
    depth_single_blocks=1,
    axes_dim=[16, 56, 56],
    theta=10000,
    patch_size=2,
    qkv_bias=True,
    guidance_embed=True,
    txt_ids_dims=[],
)


def build(source: str, out: str) -> None:
    sys.path.insert(0, source)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # as ``main.py --cpu``: ComfyUI's device probe must not ask CUDA
    import comfy.ldm.flux.model
    import comfy.ops
    import comfy.utils
    import torch

    torch.manual_seed(0)
    model = comfy.ldm.flux.model.Flux(dtype=torch.float32, device="cpu", operations=comfy.ops.manual_cast, **CONFIG)
    g = torch.Generator().manual_seed(1)
    sd = {}
    for name, value in model.state_dict().items():
        if name.endswith(".scale") or "norm" in name:
            data = 1.0 + 0.1 * torch.randn(value.shape, generator=g)
        elif value.dim() >= 2:
            data = torch.randn(value.shape, generator=g) / value.shape[-1] ** 0.5
        else:
            data = 0.02 * torch.randn(value.shape, generator=g)
        sd[name] = data.to(torch.bfloat16).contiguous()
    comfy.utils.save_torch_file(sd, out)


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2])
