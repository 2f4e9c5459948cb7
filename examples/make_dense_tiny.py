"""Write ``examples/dense_tiny.safetensors``: a small dense BF16 model for the quantize quickstart.

Seeded, so re-running reproduces the file byte for byte::

    python examples/make_dense_tiny.py            # writes next to this script
    python examples/make_dense_tiny.py OUT_DIR    # writes elsewhere

One transformer-like block (attention and MLP linears with biases, two norms), an input
projection whose K=48 no ConvRot size divides (it stays dense), a token embedding (stays
dense), a final norm and an output projection: every kind of layer quantize meets, < 1 MB.
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import save_file

FILE = "dense_tiny.safetensors"

LINEARS = (  # (layer, [N, K]) -- weights are [out_features, in_features]
    ("img_in", (256, 48)),
    ("blocks.0.attn.qkv", (256, 256)),
    ("blocks.0.attn.out", (256, 256)),
    ("blocks.0.mlp.fc1", (256, 256)),
    ("blocks.0.mlp.fc2", (256, 1024)),
    ("proj_out", (64, 256)),
)
NORMS = ("blocks.0.norm1", "blocks.0.norm2", "final_norm")


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(6)
    out: dict[str, torch.Tensor] = {}
    for name, (n, k) in LINEARS:
        out[f"{name}.weight"] = (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)
        out[f"{name}.bias"] = (torch.randn(n, generator=gen) * 0.01).to(torch.bfloat16)
    for name in NORMS:
        out[f"{name}.weight"] = (1.0 + 0.05 * torch.randn(256, generator=gen)).to(torch.bfloat16)
    out["token_embed.weight"] = (torch.randn(32, 256, generator=gen) * 0.02).to(torch.bfloat16)
    return out


def main(folder: str) -> str:
    path = os.path.join(folder, FILE)
    save_file(tensors(), path, metadata={"format": "pt"})
    return path


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    print(main(target))
