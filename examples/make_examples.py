"""Write the small example checkpoints bundled under ``examples/``.

Every file is quantized with comfy-kitchen 0.2.40 (CPU eager) from seeded random weights, so
re-running this script reproduces the committed files byte for byte::

    python examples/make_examples.py            # writes next to this script
    python examples/make_examples.py OUT_DIR    # writes elsewhere

Files (each well under 300 KB):

* ``seed_broken_w4a8.safetensors``: three W4A8 layers with SGLang-style markers; the MLP layer
  is the asymmetric variant whose ``weight_correction`` is stored transposed ``(N, K//G)`` in
  BF16 (the defect of the seed error record).  SGLang: "has an incompatible correction tensor".
* ``w4a8_sglang.safetensors``: codebook and uniform symmetric W4A8 layers with biases, plus a
  dense norm; markers in tensors and header (identical).  Loads in SGLang, ComfyUI and ck.
* ``mixed_comfyui.safetensors``: one layer per format ComfyUI loads (ComfyUI-style markers).
  ComfyUI and ck load it; SGLang rejects the mix of formats.
* ``sharded/``: a two-shard W4A8 checkpoint with ``model.safetensors.index.json`` and
  ``model.diffusion_model.`` prefixed names.  Loads everywhere.
* ``legacy_scaled_fp8.safetensors``: ComfyUI's legacy "scaled FP8" layout (dialect
  ``comfy-legacy-fp8``, written with the safetensors library as those exports are): two FP8
  linears with a scalar ``scale_weight`` (one with ``scale_input`` 1.0), a BF16 linear with a
  placeholder ``scale_weight``, a norm and the ``scaled_fp8`` sentinel; no markers.  SGLang
  refuses it; ``comfyquant migrate`` rewrites it as a Comfy checkpoint, exactly.
* ``moe_banks_comfyui.safetensors``: MoE expert banks (spec 3.9) of 4 experts, one W4A8 (read
  flattened, as ComfyUI does) and one FP8 (stacked experts, ``[E]`` scales), plus a dense
  norm.  ComfyUI loads it; SGLang has no expert-bank loader.

The quantize/write helpers live in ``tests/kitchen_fixtures.py`` (one copy, shared with the
tests).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from kitchen_fixtures import dense_layer, make_layer, moe_bank_layer, seed_defect, write_layers, write_sharded  # noqa: E402

SEED_FILE = "seed_broken_w4a8.safetensors"
W4A8_FILE = "w4a8_sglang.safetensors"
MIXED_FILE = "mixed_comfyui.safetensors"
SHARDED_DIR = "sharded"
MOE_FILE = "moe_banks_comfyui.safetensors"
LEGACY_FILE = "legacy_scaled_fp8.safetensors"

K = 256  # in_features of every example layer


def seed_broken_layers():
    return [
        make_layer("w4a8_codebook", "blocks.0.attn.qkv", n=96, k=K, seed=1),
        make_layer("w4a8_uniform", "blocks.0.attn.out", n=32, k=K, seed=2),
        seed_defect(make_layer("w4a8_asym", "blocks.0.mlp.fc1", n=64, k=K, seed=3)),
    ]


def w4a8_sglang_layers():
    return [
        dense_layer("blocks.0.norm1", (K,), seed=4, bias=True),
        make_layer("w4a8_codebook", "blocks.0.attn.qkv", n=96, k=K, seed=5),
        make_layer("w4a8_uniform", "blocks.0.attn.out", n=32, k=K, seed=6),
        make_layer("w4a8_codebook", "blocks.0.mlp.fc1", n=64, k=K, seed=7),
    ]


# One layer per format ComfyUI loads (awq_w4a16 has no comfy-kitchen quantizer).
MIXED = (
    ("fp8", "blocks.0.attn.qkv"),
    ("fp8_e5m2", "blocks.0.attn.out"),
    ("int8_convrot", "blocks.0.mlp.fc1"),
    ("w4a8_codebook", "blocks.0.mlp.fc2"),
    ("w4a4", "blocks.1.attn.qkv"),
    ("nvfp4", "blocks.1.attn.out"),
    ("mxfp8", "blocks.1.mlp.fc1"),
)


def mixed_comfyui_layers():
    # N=128 for NVFP4: SGLang's F4 shape check then passes and its first error is the mix itself.
    return [
        make_layer(v, prefix, n=128 if v == "nvfp4" else 64, k=K, seed=10 + i, marker="comfyui")
        for i, (v, prefix) in enumerate(MIXED)
    ]


def sharded_layers():
    root = "model.diffusion_model."
    first = [
        make_layer("w4a8_codebook", root + "blocks.0.attn.qkv", n=96, k=K, seed=20),
        make_layer("w4a8_uniform", root + "blocks.0.attn.out", n=32, k=K, seed=21),
    ]
    second = [
        make_layer("w4a8_codebook", root + "blocks.1.attn.qkv", n=96, k=K, seed=22),
        make_layer("w4a8_uniform", root + "blocks.1.attn.out", n=32, k=K, seed=23),
        dense_layer(root + "norm_out", (K,), seed=24, bias=True),
    ]
    return [first, second]


def moe_bank_layers():
    w4a8, _ = moe_bank_layer("w4a8_codebook", "blocks.0.moe.experts.gate_up", experts=4, n=32, k=K, seed=30)
    fp8, _ = moe_bank_layer("fp8", "blocks.0.moe.experts.down", experts=4, n=32, k=K, seed=31)
    return [w4a8, fp8, dense_layer("blocks.0.norm", (K,), seed=32)]


def write_legacy_scaled_fp8(path: str) -> str:
    """The legacy scaled-FP8 example, by the layout's one writer in the tests
    (``tests/test_dialect_legacy.py``, which follows ComfyUI 0.33.0's comfy/ops.py and
    comfy/model_detection.py)."""
    from test_dialect_legacy import legacy_file

    legacy_file(path, n=32, k=64, scale_input=1.0, seed=40)
    return path


def build(out_dir: str = HERE) -> list[str]:
    """Write every example under ``out_dir``; return the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    written = [
        write_layers(os.path.join(out_dir, SEED_FILE), seed_broken_layers()),
        write_layers(os.path.join(out_dir, W4A8_FILE), w4a8_sglang_layers(), marker_mode="both"),
        write_layers(os.path.join(out_dir, MIXED_FILE), mixed_comfyui_layers()),
        write_layers(os.path.join(out_dir, MOE_FILE), moe_bank_layers()),
        write_legacy_scaled_fp8(os.path.join(out_dir, LEGACY_FILE)),
    ]
    folder = os.path.join(out_dir, SHARDED_DIR)
    written += write_sharded(folder, sharded_layers(), marker_mode="both")
    written.append(os.path.join(folder, "model.safetensors.index.json"))
    for path in written:
        os.chmod(path, 0o644)  # safetensors creates files 0600
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = os.path.abspath(argv[0]) if argv else HERE
    for path in build(out_dir):
        print(f"wrote {os.path.relpath(path, out_dir)} ({os.path.getsize(path):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
