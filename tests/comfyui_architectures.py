"""Tiny Flux and Wan 2.1 models built with ComfyUI's own classes, described as ComfyUI sees them.

Run with ComfyUI's Python: ``python comfyui_architectures.py COMFYUI_SOURCE OUT.json``.  For each
model it writes the keys and shapes of its state dict in ComfyUI's order, the configuration
ComfyUI's ``detect_unet_config`` derives from that state dict, the ``supported_models`` class it
matches, and the order the first forward runs its ``Linear`` modules (forward hooks), so the
tests compare comfyquant's architecture descriptions with ComfyUI itself.
"""

from __future__ import annotations

import json
import sys

FLUX = dict(
    image_model="flux",
    in_channels=16,
    out_channels=16,
    vec_in_dim=32,
    context_in_dim=64,
    hidden_size=256,
    mlp_ratio=4.0,
    num_heads=2,
    depth=2,
    depth_single_blocks=2,
    axes_dim=[16, 56, 56],
    theta=10000,
    patch_size=2,
    qkv_bias=True,
    guidance_embed=True,
    txt_ids_dims=[],
)
WAN = {
    "t2v": dict(model_type="t2v", dim=256, ffn_dim=512, num_heads=2, num_layers=2, in_dim=16, out_dim=16),
    "i2v": dict(model_type="i2v", dim=256, ffn_dim=384, num_heads=2, num_layers=3, in_dim=36, out_dim=16),
}


def _describe(torch, model, state_dict_keys_as_stored, run) -> dict:
    import comfy.model_detection

    order: list[str] = []
    for name, module in model.named_modules():
        if type(module).__name__ == "Linear":
            module.register_forward_hook(lambda m, i, o, name=name: order.append(name))
    sd = {k: v for k, v in model.state_dict().items()}
    stored = {state_dict_keys_as_stored(k): v for k, v in sd.items()}
    config = comfy.model_detection.detect_unet_config(stored, "")
    cls = comfy.model_detection.model_config_from_unet_config(config, stored, "")
    with torch.inference_mode():
        run(model)
    return {
        "state_dict": [[k, list(v.shape)] for k, v in sd.items()],
        "stored": [[k, list(v.shape)] for k, v in stored.items()],
        "config": {k: v for k, v in config.items() if isinstance(v, (int, float, str, bool, type(None)))},
        "model_class": type(cls).__name__ if cls is not None else None,
        "execution": order,
    }


def main(source: str, out: str) -> None:
    sys.path.insert(0, source)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # as ``main.py --cpu``
    import comfy.ldm.flux.model
    import comfy.ldm.wan.model
    import comfy.ops
    import torch

    torch.manual_seed(0)
    ops = comfy.ops.manual_cast
    result = {}
    flux = comfy.ldm.flux.model.Flux(dtype=torch.float32, device="cpu", operations=ops, **FLUX)
    for p in flux.parameters():
        torch.nn.init.normal_(p, std=0.02)

    def run_flux(m):
        x = torch.randn(1, 16, 8, 8)
        m(x, torch.tensor([0.5]), torch.randn(1, 8, 64), y=torch.randn(1, 32), guidance=torch.tensor([3.5]))

    def as_stored(k: str) -> str:  # Flux files keep the norms' scale under ``.scale``
        return k[: -len(".weight")] + ".scale" if k.endswith("_norm.weight") else k

    result["flux"] = _describe(torch, flux, as_stored, run_flux)
    for variant, config in WAN.items():
        wan = comfy.ldm.wan.model.WanModel(device="cpu", dtype=torch.float32, operations=ops, **config)
        for p in wan.parameters():
            torch.nn.init.normal_(p, std=0.02)

        def run_wan(m, config=config):
            kw = {"clip_fea": torch.randn(1, 257, 1280)} if config["model_type"] == "i2v" else {}
            m(torch.randn(1, config["in_dim"], 1, 8, 8), torch.tensor([0.5]), torch.randn(1, 8, 4096), **kw)

        result[f"wan_{variant}"] = _describe(torch, wan, lambda k: k, run_wan)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
