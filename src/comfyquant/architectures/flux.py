"""Flux as ComfyUI 0.33.0 detects and builds it (``comfy/model_detection.py``,
``comfy/ldm/flux/model.py`` and ``layers.py``).

Detection fires on ``double_blocks.0.img_attn.norm.key_norm.{weight,scale}`` with ``img_in.weight``
(or Chroma's ``distilled_guidance_layer``); ``double_stream_modulation_img.lin.weight`` makes it
Flux 2 and ``distilled_guidance_layer`` Chroma, which are named, not described.  The hidden size
is read from ``img_in.weight``'s rows, then ``txt_in.weight``'s rows (the later read wins); the
input channels from ``img_in.weight``'s columns over the 2x2 patch; the heads are the hidden size
over 128 (the rotary axes 16+56+56); the MLP ratio is fixed at 4.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Builder, Model, any_suffix, count_blocks

NAME = "flux"
SIGNATURE = (
    "img_in.weight",
    "txt_in.weight",
    "time_in.in_layer.weight",
    "double_blocks.0.img_attn.qkv.weight",
    "double_blocks.0.img_mod.lin.weight",
    "double_blocks.0.img_mlp.0.weight",
    "single_blocks.0.linear1.weight",
    "single_blocks.0.modulation.lin.weight",
    "final_layer.linear.weight",
)
"""Keys that show a file holds this architecture, whatever ComfyUI's detection makes of it."""
DROPPED_CORRECTION = "garbage"
"""What ComfyUI's model computes when its asymmetric W4A8 layers lose their ``weight_correction``
(ComfyUI does not load it): each layer is off by the correction's share, and through the double
and single blocks the model's output is garbage (measured on tiny Flux models of two blocks of each
kind: the model output's relative error 0.99 to 1.04, its layers' 2.1)."""
AXES = 16 + 56 + 56
PATCH = 2


def fires(keys) -> bool:
    """ComfyUI's test for the Flux family (Flux, Flux 2, Chroma)."""
    return any_suffix(keys, "double_blocks.0.img_attn.norm.key_norm.") and (
        "img_in.weight" in keys or any_suffix(keys, "distilled_guidance_layer.norms.0.")
    )


def configure(shapes: Mapping[str, tuple[int, ...]]) -> tuple[str, dict, dict]:
    """(image model, the dimensions detection derives, the keys it read a size from)."""
    keys = shapes
    read: dict[str, tuple[int, ...]] = {}
    if "double_stream_modulation_img.lin.weight" in keys:
        image_model, axes, patch = "flux2", 128, 1
    else:
        image_model, axes, patch = "flux", AXES, PATCH
    dims: dict[str, object] = {"in_channels": 16, "hidden_size": 3072, "context_in_dim": 4096}
    w = shapes.get("img_in.weight")
    if w is not None and len(w) >= 2:
        read["img_in.weight"] = w
        dims["in_channels"] = w[1] // (patch * patch)
        dims["hidden_size"] = w[0]
    w = shapes.get("txt_in.weight")
    if w is not None and len(w) >= 2:
        read["txt_in.weight"] = w
        dims["context_in_dim"] = w[1]
        dims["hidden_size"] = w[0]
    w = shapes.get("vector_in.in_layer.weight")
    if w is not None and len(w) >= 2:
        read["vector_in.in_layer.weight"] = w
    dims["vec_in_dim"] = w[1] if w is not None and len(w) >= 2 else None
    hidden = dims["hidden_size"]
    assert isinstance(hidden, int)
    dims["num_heads"] = hidden // axes
    dims["mlp_ratio"] = 3.0 if image_model == "flux2" else 4.0
    dims["depth"] = count_blocks(keys, "double_blocks.", "img_attn.qkv.weight")
    dims["depth_single_blocks"] = count_blocks(keys, "single_blocks.", "linear1.weight")
    if any_suffix(keys, "distilled_guidance_layer.0.norms.0.") or any_suffix(keys, "distilled_guidance_layer.norms.0."):
        image_model = "chroma_radiance" if any_suffix(keys, "nerf_blocks.0.norm.") else "chroma"
    elif image_model == "flux":
        dims["guidance_embed"] = "guidance_in.in_layer.weight" in keys
        dims["yak_mlp"] = "double_blocks.0.img_mlp.gate_proj.weight" in keys
        dims["txt_norm"] = any_suffix(keys, "txt_norm.")
    return image_model, dims, read


def model_class(image_model: str, dims: dict) -> str | None:
    """The ``supported_models`` class ComfyUI's list matches first."""
    if image_model == "flux2":
        return "Flux2"
    if image_model in ("chroma", "chroma_radiance"):
        return "Chroma" if image_model == "chroma" else "ChromaRadiance"
    if dims.get("guidance_embed"):
        return "FluxInpaint" if dims.get("in_channels") == 96 else "Flux"
    if dims.get("vec_in_dim") is None and dims.get("context_in_dim") == 3584:
        return "LongCatImage"
    return "FluxSchnell"


def build(image_model: str, dims: dict) -> Model | None:
    """Every parameter ComfyUI's Flux registers, at its true size (Flux with the classic MLP
    only: the other members of the family are named, not described)."""
    if image_model != "flux" or dims.get("yak_mlp") or dims.get("txt_norm"):
        return None
    h = int(dims["hidden_size"])
    heads = int(dims["num_heads"])
    if heads == 0:
        return None
    head_dim = h // heads
    mlp = int(h * 4.0)
    b = Builder()
    b.linear("img_in", int(dims["in_channels"]) * PATCH * PATCH, h)
    b.linear("time_in.in_layer", 256, h)
    b.linear("time_in.out_layer", h, h)
    vec = dims.get("vec_in_dim")
    if vec is not None:
        b.linear("vector_in.in_layer", int(vec), h)
        b.linear("vector_in.out_layer", h, h)
    if dims.get("guidance_embed"):
        b.linear("guidance_in.in_layer", 256, h)
        b.linear("guidance_in.out_layer", h, h)
    b.linear("txt_in", int(dims["context_in_dim"]), h)
    execution = ["img_in", "time_in.in_layer", "time_in.out_layer"]
    if dims.get("guidance_embed"):
        execution += ["guidance_in.in_layer", "guidance_in.out_layer"]
    if vec is not None:
        execution += ["vector_in.in_layer", "vector_in.out_layer"]
    execution.append("txt_in")
    for i in range(int(dims["depth"])):
        p = f"double_blocks.{i}"
        for s in ("img", "txt"):
            b.linear(f"{p}.{s}_mod.lin", h, 6 * h)
            b.linear(f"{p}.{s}_attn.qkv", h, 3 * h)
            for norm in ("query_norm", "key_norm"):
                b.norm(f"{p}.{s}_attn.norm.{norm}", head_dim, aliases=(f"{p}.{s}_attn.norm.{norm}.scale",))
            b.linear(f"{p}.{s}_attn.proj", h, h)
            b.linear(f"{p}.{s}_mlp.0", h, mlp)
            b.linear(f"{p}.{s}_mlp.2", mlp, h)
        execution += [
            f"{p}.img_mod.lin",
            f"{p}.txt_mod.lin",
            f"{p}.img_attn.qkv",
            f"{p}.txt_attn.qkv",
            f"{p}.img_attn.proj",
            f"{p}.img_mlp.0",
            f"{p}.img_mlp.2",
            f"{p}.txt_attn.proj",
            f"{p}.txt_mlp.0",
            f"{p}.txt_mlp.2",
        ]
    for i in range(int(dims["depth_single_blocks"])):
        p = f"single_blocks.{i}"
        b.linear(f"{p}.linear1", h, 3 * h + mlp)
        b.linear(f"{p}.linear2", h + mlp, h)
        for norm in ("query_norm", "key_norm"):
            b.norm(f"{p}.norm.{norm}", head_dim, aliases=(f"{p}.norm.{norm}.scale",))
        b.linear(f"{p}.modulation.lin", h, 3 * h)
        execution += [f"{p}.modulation.lin", f"{p}.linear1", f"{p}.linear2"]
    b.linear("final_layer.linear", h, 16 * PATCH * PATCH)
    b.linear("final_layer.adaLN_modulation.1", h, 2 * h)
    execution += ["final_layer.adaLN_modulation.1", "final_layer.linear"]
    # vector_in's input is cut to the model's vec_in_dim (``y[:, :vec_in_dim]``): not the data's width
    return b.model(execution, ("img_in", "txt_in"))
