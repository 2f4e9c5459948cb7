"""Wan 2.1 as ComfyUI 0.33.0 detects and builds it (``comfy/model_detection.py``,
``comfy/ldm/wan/model.py``).

Detection fires on ``head.modulation``; it reads the hidden size from that table's last
dimension, the output channels from ``head.head.weight``'s rows over the 1x2x2 patch, the FFN
size from ``blocks.0.ffn.0.weight``'s rows and the input channels from ``patch_embedding.weight``
(each read without a test: a missing one raises ``KeyError``).  The heads are the hidden size
over 128; ``img_emb.proj.0.bias`` makes it image-to-video.  The text (4096) and time (256)
embedding widths are fixed.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Builder, Model, count_blocks

NAME = "wan2.1"
SIGNATURE = (
    "patch_embedding.weight",
    "head.modulation",
    "head.head.weight",
    "time_projection.1.weight",
    "text_embedding.0.weight",
    "blocks.0.self_attn.q.weight",
    "blocks.0.cross_attn.q.weight",
    "blocks.0.ffn.0.weight",
    "blocks.0.modulation",
)
TRIGGER = "head.modulation"
READS = ("head.modulation", "head.head.weight", "blocks.0.ffn.0.weight", "patch_embedding.weight")
"""The keys detection reads without testing for them, in its order."""
DROPPED_CORRECTION = "garbage"
"""What ComfyUI's Wan computes without its asymmetric W4A8 layers' ``weight_correction``:
garbage (measured on a tiny Wan 2.1 of two blocks: its layers' relative error 1.45, the model
output's 0.41)."""
PATCH = (1, 2, 2)
TEXT_DIM = 4096
FREQ_DIM = 256
CLIP_DIM = 1280
VARIANTS = (
    ("vace_patch_embedding.weight", "vace"),
    ("control_adapter.conv.weight", "camera"),
    ("casual_audio_encoder.encoder.final_linear.weight", "s2v"),
    ("audio_proj.audio_proj_glob_1.layer.bias", "humo"),
    ("face_adapter.fuser_blocks.0.k_norm.weight", "animate"),
    ("patch_embedding_mask.weight", "scail2"),
    ("patch_embedding_pose.weight", "scail"),
    ("patch_embedding_global.weight", "wandancer"),
)


def fires(keys) -> bool:
    return TRIGGER in keys


def missing_read(keys) -> str | None:
    """The first key detection reads that the file lacks (ComfyUI raises ``KeyError`` on it)."""
    return next((k for k in READS if k not in keys), None)


def configure(shapes: Mapping[str, tuple[int, ...]]) -> tuple[str, dict, dict]:
    read = {k: shapes[k] for k in READS}
    dim = shapes["head.modulation"][-1] if shapes["head.modulation"] else 0
    dims: dict[str, object] = {
        "dim": dim,
        "out_dim": (shapes["head.head.weight"][0] if shapes["head.head.weight"] else 0) // 4,
        "num_heads": dim // 128,
        "ffn_dim": shapes["blocks.0.ffn.0.weight"][0] if shapes["blocks.0.ffn.0.weight"] else 0,
        "num_layers": count_blocks(shapes, "blocks.", "ffn.0.weight"),
        "in_dim": shapes["patch_embedding.weight"][1] if len(shapes["patch_embedding.weight"]) > 1 else 0,
    }
    model_type = next((t for k, t in VARIANTS if k in shapes), None)
    if model_type == "camera" and "img_emb.proj.0.bias" not in shapes:
        model_type = "camera_2.2"
    if model_type is None:
        model_type = "i2v" if "img_emb.proj.0.bias" in shapes else "t2v"
    dims["model_type"] = model_type
    return NAME, dims, read


def model_class(image_model: str, dims: dict) -> str | None:
    """The ``supported_models`` class ComfyUI's list matches first (None: no class matches)."""
    t, in_dim = dims.get("model_type"), dims.get("in_dim")
    if t == "t2v":
        return "WAN22_T2V" if dims.get("out_dim") == 48 else "WAN21_T2V"
    if t == "i2v":
        return {36: "WAN21_I2V", 48: "WAN21_FunControl2V"}.get(in_dim) if isinstance(in_dim, int) else None
    return None


def build(image_model: str, dims: dict) -> Model | None:
    """Every parameter ComfyUI's ``WanModel`` registers for t2v and i2v, at its true size."""
    model_type = dims.get("model_type")
    if model_type not in ("t2v", "i2v"):
        return None
    d = int(dims["dim"])
    ffn = int(dims["ffn_dim"])
    out = int(dims["out_dim"]) * PATCH[0] * PATCH[1] * PATCH[2]
    if int(dims["num_heads"]) == 0:
        return None
    b = Builder()
    b.param("patch_embedding.weight", (d, int(dims["in_dim"]), *PATCH))
    b.param("patch_embedding.bias", (d,))
    b.linear("text_embedding.0", TEXT_DIM, d)
    b.linear("text_embedding.2", d, d)
    b.linear("time_embedding.0", FREQ_DIM, d)
    b.linear("time_embedding.2", d, d)
    b.linear("time_projection.1", d, 6 * d)
    execution = ["time_embedding.0", "time_embedding.2", "time_projection.1", "text_embedding.0", "text_embedding.2"]
    if model_type == "i2v":
        execution += ["img_emb.proj.1", "img_emb.proj.3"]
    for i in range(int(dims["num_layers"])):
        p = f"blocks.{i}"
        b.param(f"{p}.modulation", (1, 6, d))
        for attn in ("self_attn", "cross_attn"):
            for x in ("q", "k", "v", "o"):
                b.linear(f"{p}.{attn}.{x}", d, d)
            b.norm(f"{p}.{attn}.norm_q", d)
            b.norm(f"{p}.{attn}.norm_k", d)
            if attn == "cross_attn" and model_type == "i2v":
                b.linear(f"{p}.cross_attn.k_img", d, d)
                b.linear(f"{p}.cross_attn.v_img", d, d)
                b.norm(f"{p}.cross_attn.norm_k_img", d)
            if attn == "self_attn":
                b.norm(f"{p}.norm3", d, bias=True)
        b.linear(f"{p}.ffn.0", d, ffn)
        b.linear(f"{p}.ffn.2", ffn, d)
        cross = ["q", "k", "v"] + (["k_img", "v_img"] if model_type == "i2v" else []) + ["o"]
        execution += [f"{p}.self_attn.{x}" for x in ("q", "k", "v", "o")]
        execution += [f"{p}.cross_attn.{x}" for x in cross]
        execution += [f"{p}.ffn.0", f"{p}.ffn.2"]
    b.param("head.modulation", (1, 2, d))
    b.linear("head.head", d, out)
    execution.append("head.head")
    if model_type == "i2v":
        b.norm("img_emb.proj.0", CLIP_DIM, bias=True)
        b.linear("img_emb.proj.1", CLIP_DIM, CLIP_DIM)
        b.linear("img_emb.proj.3", CLIP_DIM, d)
        b.norm("img_emb.proj.4", d, bias=True)
    return b.model(execution, ("text_embedding.0", "img_emb.proj.1"))
