"""A test-only ComfyUI node: runs a loaded MODEL on fixed inputs and reports its output.

The tests install it beside comfyquant's nodes in the test server's ``custom_nodes``.  Two
loads of the same weights give the same digest of the output's bytes; the report also counts
the model's quantized weights (comfy-kitchen ``QuantizedTensor``s, as ComfyUI 0.33.0
comfy/ops.py holds a quantized layer), so a load that silently dequantized is seen.
"""

import hashlib
import json

import torch


class ComfyQuantTestProbe:
    CATEGORY = "testing"
    FUNCTION = "probe"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def probe(self, model):
        import comfy.model_management

        comfy.model_management.load_models_gpu([model])
        base = model.model
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 16, 8, 8, generator=g)
        context = torch.randn(1, 4, 64, generator=g)
        y = torch.randn(1, 32, generator=g)
        with torch.no_grad():
            out = base.apply_model(x, torch.tensor([0.5]), c_crossattn=context, y=y, guidance=torch.tensor([3.5])).float()
        quantized = sorted(
            name
            for name, module in base.diffusion_model.named_modules()
            if type(getattr(module, "weight", None)).__name__ == "QuantizedTensor"
        )
        report = {
            "sha256": hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest(),
            "finite": bool(torch.isfinite(out).all()),
            "mean_abs": float(out.abs().mean()),
            "quantized": quantized,
        }
        text = json.dumps(report)
        return {"ui": {"text": [text]}, "result": (text,)}


NODE_CLASS_MAPPINGS = {"ComfyQuantTestProbe": ComfyQuantTestProbe}
