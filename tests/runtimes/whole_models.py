"""A generated space of whole tiny models, quantized by comfy-kitchen and broken in realistic
ways, deterministic from a seed: what the whole-model ComfyUI oracle (``comfyui_models``) runs.

Each model is built with ComfyUI's own classes from the source under test (``comfy.ldm.flux``
and ``comfy.ldm.wan``, instantiated on the meta device): the parameter names, shapes and
registration order are the model's, their values seeded random numbers scaled so activations
stay near unit size, stored dense in BF16 under the key names ComfyUI detects.  Each format
then quantizes the linear layers of the transformer blocks with comfy-kitchen 0.2.40's own
layouts (``kitchen_fixtures.quantize``), markers as ``.comfy_quant`` tensors (or the header
map); embeddings, norms and the head stay dense.

The space (``generate``) holds, for each model and format, the valid file and its defects:

* ``valid``: the dense model, and each format's file as written (an asymmetric W4A8 file
  carries comfy-kitchen's ``weight_correction``, which ComfyUI never reads; AWQ, which
  ComfyUI refuses);
* ``prefix``: the checkpoint prefix on every key, a foreign prefix, a prefix on one block, a
  packed quantized weight in a key detection reads its dimensions from;
* ``shape``: a weight transposed, padded, too wide or too narrow, a bias mis-sized;
* ``missing``: a bias, a scale or a weight missing;
* ``marker``: every marker dropped, one layer's marker dropped;
* ``multi``: several of these in one file at different layers;
* ``value``: a reciprocal FP8 scale, a changed ConvRot group size or flag, an NVFP4 block
  scale in linear layout, a stale scale after a LoRA merge, a NaN scale, E5M2 bytes under an
  E4M3 marker, a dropped W4A8 codebook;
* ``tolerated``: storage ComfyUI reads anyway (INT8 codes relabelled U8 or stored as BF16, FP8
  upcast to BF16, U8 scales, (N, 1) FP8 scales, 1-D INT8 row scales).

Run in ComfyUI's environment (``python -m runtimes.whole_models SOURCE SEED OUT``) it writes
the space into ``OUT`` with ``manifest.json`` last (the models' skeletons are read in a child
process: importing ComfyUI replaces comfy-kitchen's layout classes with its own, so the
quantizing process never imports it); ``space(seed)`` does that once per seed and
source hash into the test cache and returns the manifest.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# -- the models ---------------------------------------------------------------------------------

FLUX_SIZES = ((128, 2, 2), (256, 1, 2), (128, 1, 1), (256, 2, 1))
"""(hidden size, double blocks, single blocks): a multiple of 128, the sum of ``axes_dim``."""
WAN_SIZES = ((128, 256, 2), (256, 512, 1), (128, 384, 1), (256, 256, 2))
"""(dim, ffn dim, layers): dim a multiple of 128 (``num_heads = dim // 128``)."""


def model_configs(seed: int) -> dict[str, dict]:
    """The two models of ``seed``'s space, as ComfyUI's constructors take them: seed 0 is the
    smallest (the agreement test's), other seeds draw other sizes."""
    rng = random.Random(f"sizes-{seed}")
    hidden, depth, single = FLUX_SIZES[0] if seed == 0 else rng.choice(FLUX_SIZES)
    dim, ffn, layers = WAN_SIZES[0] if seed == 0 else rng.choice(WAN_SIZES)
    flux = dict(
        image_model="flux",
        in_channels=16,
        out_channels=16,
        vec_in_dim=32,
        context_in_dim=64,
        hidden_size=hidden,
        mlp_ratio=4.0,
        num_heads=hidden // 128,
        depth=depth,
        depth_single_blocks=single,
        axes_dim=[16, 56, 56],
        theta=10000,
        patch_size=2,
        qkv_bias=True,
        guidance_embed=True,
        txt_ids_dims=[],
    )
    wan = dict(
        model_type="t2v",
        patch_size=(1, 2, 2),
        in_dim=16,
        dim=dim,
        ffn_dim=ffn,
        freq_dim=256,
        text_dim=4096,
        out_dim=16,
        num_heads=dim // 128,
        num_layers=layers,
        window_size=(-1, -1),
        qk_norm=True,
        cross_attn_norm=True,
        eps=1e-6,
    )
    return {"flux": flux, "wan": wan}


QUANTIZED = {
    "flux": re.compile(r"^(double_blocks|single_blocks)\.\d+\."),
    "wan": re.compile(r"^blocks\.\d+\.(self_attn\.[qkvo]|cross_attn\.[qkvo]|ffn\.[02])$"),
}
"""The linear layers a quantizer converts: the transformer blocks' (as real quantized
checkpoints do); embeddings, norms, modulation vectors and the head stay dense."""


@dataclass
class Skeleton:
    """A model's parameters as ComfyUI's class registers them."""

    shapes: dict[str, tuple[int, ...]]
    """Parameter name -> shape, in module-registration order."""
    linears: list[str]
    """The names of the model's Linear modules, in registration order."""


def skeleton(model: str, config: dict) -> Skeleton:
    """Instantiate ComfyUI's class for ``model`` on the meta device (ComfyUI must be importable)."""
    import comfy.ops
    import torch

    if model == "flux":
        import comfy.ldm.flux.model

        net = comfy.ldm.flux.model.Flux(dtype=torch.float32, device="meta", operations=comfy.ops.manual_cast, **config)
    else:
        import comfy.ldm.wan.model

        net = comfy.ldm.wan.model.WanModel(dtype=torch.float32, device="meta", operations=comfy.ops.manual_cast, **config)
    shapes = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    linears = [name for name, mod in net.named_modules() if isinstance(mod, torch.nn.Linear)]
    return Skeleton(shapes, linears)


def dense_weights(sk: Skeleton, seed: int) -> dict:
    """Seeded values for every parameter, BF16: matrices ``N(0, 1/fan_in)`` (unit-size
    activations through each layer), norm scales near 1, biases and modulation tables small."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in sk.shapes.items():
        if "norm" in name and len(shape) == 1:
            data = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("modulation"):
            data = 0.1 * torch.randn(shape, generator=gen)
        elif len(shape) >= 2:
            data = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
        else:
            data = 0.02 * torch.randn(shape, generator=gen)
        out[name] = data.to(torch.bfloat16).contiguous()
    return out


# -- the formats --------------------------------------------------------------------------------

FORMATS = ("fp8", "int8", "int8_convrot", "w4a4", "w4a8", "w4a8_asym", "w4a8_uniform", "nvfp4", "mxfp8", "awq")
"""The formats of the space, by the comfy-kitchen variant (``kitchen_fixtures.VARIANTS``)
each is written with; ``awq`` is written by hand (comfy-kitchen has no AWQ quantizer)."""

VARIANT = {
    "fp8": "fp8",
    "int8": "int8_rowwise",
    "int8_convrot": "int8_convrot",
    "w4a4": "w4a4",
    "w4a8": "w4a8_codebook",
    "w4a8_asym": "w4a8_asym",
    "w4a8_uniform": "w4a8_uniform",
    "nvfp4": "nvfp4",
    "mxfp8": "mxfp8",
}

PACKED = ("w4a4", "w4a8", "w4a8_asym", "w4a8_uniform", "nvfp4")
"""Formats that store two 4-bit codes a byte (the weight is ``[N, K / 2]``)."""


def rotation_size(k: int) -> int:
    """The ConvRot group size a writer picks for a layer of ``k`` inputs: comfy-kitchen's
    default 256 where it divides ``k``, else the largest smaller power of 4 that does."""
    for size in (256, 64, 16):
        if k % size == 0:
            return size
    return 4


def quantize_layer(fmt: str, weight, seed: int) -> tuple[dict, dict]:
    """(tensors by suffix, ComfyUI marker) of ``weight`` [N, K] in ``fmt``."""
    import torch

    if fmt == "awq":
        n, k = weight.shape
        group = 64
        gen = torch.Generator().manual_seed(seed)
        codes = torch.randint(-128, 128, (n, k // 2), generator=gen, dtype=torch.int16).to(torch.int8)
        scale = (weight.float().reshape(n, k // group, group).abs().amax(-1).t() / 7).to(torch.bfloat16)
        zeros = (torch.rand(k // group, n, generator=gen) * -0.05).to(torch.bfloat16)
        return {"weight": codes, "weight_scale": scale.contiguous(), "weight_zeros": zeros}, {
            "format": "awq_w4a16",
            "group_size": group,
        }
    from kitchen_fixtures import markers_for, quantize

    size = rotation_size(weight.shape[1])
    tensors = quantize(VARIANT[fmt], weight, 16, size)
    marker, _ = markers_for(VARIANT[fmt], 16, size)
    return tensors, marker


# -- a file -------------------------------------------------------------------------------------


@dataclass
class Draft:
    """One file of the space being made: its tensors in write order, markers by layer, and the
    dense layers the runtime's output is measured against where they are not the model's."""

    model: str
    fmt: str
    tensors: dict
    markers: dict[str, dict]
    """Layer -> marker (written as ``<layer>.comfy_quant`` or in the header map)."""
    quantized: list[str]
    marker_mode: str = "tensor"
    metadata: dict = field(default_factory=dict)
    dense: dict = field(default_factory=dict)
    """The model's dense tensors (shared, never changed)."""
    reference: dict = field(default_factory=dict)
    """Layer weight/bias name -> the dense tensor the layer is meant to compute with, where a
    defect changed it (a LoRA merged into the weight)."""
    prefix: dict[str, str] = field(default_factory=dict)
    """Key prefix -> rule (``all`` or a key prefix) applied when written."""
    header_prefix: str | None = None
    """The prefix the header map's layer names carry, when not the keys' (None: the keys')."""
    notes: list[str] = field(default_factory=list)

    def copy(self) -> Draft:
        return Draft(
            self.model,
            self.fmt,
            dict(self.tensors),
            {k: dict(v) for k, v in self.markers.items()},
            list(self.quantized),
            self.marker_mode,
            dict(self.metadata),
            self.dense,
            dict(self.reference),
            dict(self.prefix),
            self.header_prefix,
            list(self.notes),
        )

    def layer(self, name: str) -> dict:
        """The tensors of layer ``name`` by suffix."""
        return {
            k[len(name) + 1 :]: t for k, t in self.tensors.items() if k.startswith(name + ".") and "." not in k[len(name) + 1 :]
        }

    def set(self, layer: str, suffix: str, tensor) -> None:
        key = f"{layer}.{suffix}"
        if tensor is None:
            self.tensors.pop(key, None)
        else:
            self.tensors[key] = tensor.contiguous() if tensor.dim() else tensor

    def state(self) -> tuple[dict, dict | None]:
        """The tensors and header metadata to write."""
        import torch

        out = {}
        for name, t in self.tensors.items():
            out[name] = t
            layer = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and layer in self.markers and self.marker_mode in ("tensor", "both"):
                raw = json.dumps(self.markers[layer]).encode()
                out[f"{layer}.comfy_quant"] = torch.tensor(list(raw), dtype=torch.uint8)
        meta = dict(self.metadata)
        if self.marker_mode in ("header", "both") and self.markers:
            meta["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": self.markers})
        for prefix, rule in self.prefix.items():
            out = {(prefix + k if rule == "all" or k.startswith(rule) else k): t for k, t in out.items()}
            if "_quantization_metadata" in meta and self.header_prefix is None:
                parsed = json.loads(meta["_quantization_metadata"])
                parsed["layers"] = {
                    (prefix + k if rule == "all" or (k + ".").startswith(rule) else k): v for k, v in parsed["layers"].items()
                }
                meta["_quantization_metadata"] = json.dumps(parsed)
        if self.header_prefix and "_quantization_metadata" in meta:
            parsed = json.loads(meta["_quantization_metadata"])
            parsed["layers"] = {self.header_prefix + k: v for k, v in parsed["layers"].items()}
            meta["_quantization_metadata"] = json.dumps(parsed)
        return out, meta or None


def quantized_model(model: str, fmt: str, dense: dict, sk: Skeleton, seed: int) -> Draft:
    """The dense model with its block layers quantized in ``fmt``."""
    tensors: dict = {}
    markers, quantized = {}, []
    targets = {name for name in sk.linears if QUANTIZED[model].match(name)}
    for name, t in dense.items():
        layer, _, suffix = name.rpartition(".")
        if layer in targets and suffix == "weight":
            q, marker = quantize_layer(fmt, t, seed + len(quantized))
            for s, qt in q.items():
                tensors[f"{layer}.{s}"] = qt
            markers[layer] = marker
            quantized.append(layer)
        else:
            tensors[name] = t
    return Draft(model, fmt, tensors, markers, quantized, dense=dense)


# -- defects ------------------------------------------------------------------------------------


def _resize(t, dim: int, size: int):
    import torch

    if size <= t.shape[dim]:
        return t.narrow(dim, 0, size).contiguous()
    pad = list(t.shape)
    pad[dim] = size - t.shape[dim]
    return torch.cat([t, torch.zeros(pad, dtype=t.dtype)], dim)


def _block_of(layer: str) -> str:
    parts = layer.split(".")
    return ".".join(parts[:2]) + "."


def _scales(draft: Draft, layer: str) -> list[str]:
    return [s for s in draft.layer(layer) if s not in ("weight", "bias")]


def d_transposed(d: Draft, layer: str, rng) -> str:
    w = d.layer(layer)["weight"]
    if w.shape[0] == w.shape[1]:
        return ""
    d.set(layer, "weight", w.t())
    return "weight stored transposed"


def d_padded(d: Draft, layer: str, rng) -> str:
    w = d.layer(layer)["weight"]
    rows = (w.shape[0] // 256 + 1) * 256
    d.set(layer, "weight", _resize(w, 0, rows))
    return f"weight rows padded to {rows}"


def d_wide(d: Draft, layer: str, rng) -> str:
    w = d.layer(layer)["weight"]
    extra = 16 if d.fmt in PACKED else 32
    d.set(layer, "weight", _resize(w, 1, w.shape[1] + extra))
    return f"weight {extra} columns too wide"


def d_narrow(d: Draft, layer: str, rng) -> str:
    w = d.layer(layer)["weight"]
    less = 16 if d.fmt in PACKED else 32
    d.set(layer, "weight", _resize(w, 1, w.shape[1] - less))
    return f"weight {less} columns too narrow"


def d_bias(d: Draft, layer: str, rng) -> str:
    b = d.layer(layer).get("bias")
    if b is None:
        return ""
    size = rng.choice((b.shape[0] + 1, b.shape[0] - 1, 2 * b.shape[0], b.shape[0] // 2))
    d.set(layer, "bias", _resize(b, 0, size))
    return f"bias of {size}"


def d_missing_bias(d: Draft, layer: str, rng) -> str:
    if "bias" not in d.layer(layer):
        return ""
    d.set(layer, "bias", None)
    return "bias missing"


def d_missing_scale(d: Draft, layer: str, rng) -> str:
    scales = [s for s in _scales(d, layer) if s not in ("weight_codebook", "weight_correction")]
    if not scales:
        return ""
    s = rng.choice(scales)
    d.set(layer, s, None)
    return f"{s} missing"


def d_missing_weight(d: Draft, layer: str, rng) -> str:
    d.set(layer, "weight", None)
    return "weight missing"


def d_missing_norm(d: Draft, layer: str, rng) -> str:
    """A norm scale of the layer's block missing (a converter that renamed ``.scale`` keys
    and lost some): in the first block it is a key detection looks for."""
    block = _block_of(layer)
    norms = [k for k in d.tensors if k.startswith(block) and "norm" in k and d.tensors[k].dim() == 1]
    if not norms:
        return ""
    key = rng.choice(norms)
    del d.tensors[key]
    return f"norm {key} missing"


def d_marker_one(d: Draft, layer: str, rng) -> str:
    if layer not in d.markers:
        return ""
    del d.markers[layer]
    return "marker dropped"


def d_markers_all(d: Draft, layer: str, rng) -> str:
    if not d.markers:
        return ""
    d.markers.clear()
    return "every marker dropped"


SHAPE = {"transposed": d_transposed, "padded": d_padded, "wide": d_wide, "narrow": d_narrow, "bias": d_bias}
MISSING = {"no-bias": d_missing_bias, "no-scale": d_missing_scale, "no-weight": d_missing_weight, "no-norm": d_missing_norm}
MARKER = {"marker-one": d_marker_one, "markers-all": d_markers_all}


def _fp8_scale(d: Draft, layer: str) -> str | None:
    lay = d.layer(layer)
    return "weight_scale" if "weight_scale" in lay and d.fmt == "fp8" else None


def v_reciprocal(d: Draft, layer: str, rng) -> str:
    if _fp8_scale(d, layer) is None:
        return ""
    d.set(layer, "weight_scale", 1.0 / d.layer(layer)["weight_scale"])
    return "FP8 scale stored as its reciprocal"


def v_rotation_size(d: Draft, layer: str, rng) -> str:
    marker = d.markers.get(layer)
    if marker is None or "convrot_groupsize" not in marker:
        return ""
    k = d.layer(layer)["weight"].shape[1] * (2 if d.fmt in PACKED else 1)
    choices = [s for s in (16, 64, 256) if s != marker["convrot_groupsize"] and k % s == 0]
    if not choices:
        return ""
    marker["convrot_groupsize"] = rng.choice(choices)
    return f"ConvRot group size {marker['convrot_groupsize']} in the marker"


def v_rotation_flag(d: Draft, layer: str, rng) -> str:
    marker = d.markers.get(layer)
    if marker is None or not marker.get("convrot"):
        return ""
    marker["convrot"] = False
    return "ConvRot flag false on rotated weights"


def v_linear_block_scale(d: Draft, layer: str, rng) -> str:
    if d.fmt != "nvfp4":
        return ""
    from comfy_kitchen import from_blocked

    lay = d.layer(layer)
    n, k = lay["weight"].shape[0], lay["weight"].shape[1] * 2
    blocked = lay["weight_scale"]
    linear = from_blocked(blocked, n, k // 16)
    d.set(layer, "weight_scale", _resize(_resize(linear, 0, blocked.shape[0]), 1, blocked.shape[1]).contiguous())
    return "NVFP4 block scale in linear layout"


def v_nan_scale(d: Draft, layer: str, rng) -> str:
    import torch

    scales = [s for s in _scales(d, layer) if s in ("weight_scale", "weight_scale_2", "weight_s_channel")]
    if not scales:
        return ""
    s = rng.choice(scales)
    t = d.layer(layer)[s].clone()
    if t.dtype == torch.float8_e8m0fnu:
        t.view(torch.uint8).reshape(-1)[0] = 255
    else:
        t.reshape(-1)[0] = float("nan")
    d.set(layer, s, t)
    return f"NaN in {s}"


def v_e5m2_bytes(d: Draft, layer: str, rng) -> str:
    import torch

    if d.fmt != "fp8":
        return ""
    lay = d.layer(layer)
    w = lay["weight"].float() * lay["weight_scale"].float()
    scale = w.abs().amax() / 57344.0
    d.set(layer, "weight", (w / scale).to(torch.float8_e5m2).view(torch.float8_e4m3fn))
    d.set(layer, "weight_scale", scale.reshape(()).float())
    return "E5M2 bytes under an E4M3 marker"


def v_no_codebook(d: Draft, layer: str, rng) -> str:
    if "weight_codebook" not in d.layer(layer):
        return ""
    d.set(layer, "weight_codebook", None)
    return "W4A8 codebook dropped"


def v_stale_scale(d: Draft, layer: str, rng, seed: int = 0) -> str:
    """A LoRA merged into the weight: the codes are re-quantized from the merged weight, the
    scales left as they were (the merged weight is what the layer is meant to compute)."""
    import torch

    if d.fmt == "awq":
        return ""
    dense = d.dense[f"{layer}.weight"]
    n, k = dense.shape
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    a = torch.randn(4, k, generator=gen) / math.sqrt(k)
    b = torch.randn(n, 4, generator=gen) * rng.choice((0.5, 1.0, 2.0))
    merged = (dense.float() + b @ a).to(torch.bfloat16)
    q, _ = quantize_layer(d.fmt, merged, seed)
    for s, t in q.items():
        if s == "weight":
            d.set(layer, s, t)
    d.reference[f"{layer}.weight"] = merged
    return "stale scales after a LoRA merge"


VALUE = {
    "reciprocal": v_reciprocal,
    "rotation-size": v_rotation_size,
    "rotation-flag": v_rotation_flag,
    "linear-block-scale": v_linear_block_scale,
    "nan-scale": v_nan_scale,
    "e5m2-bytes": v_e5m2_bytes,
    "no-codebook": v_no_codebook,
    "stale-scale": v_stale_scale,
}


def t_int8_u8(d: Draft) -> str:
    import torch

    if d.fmt not in ("int8", "int8_convrot"):
        return ""
    for layer in d.quantized:
        d.set(layer, "weight", d.layer(layer)["weight"].view(torch.uint8))
    return "INT8 codes relabelled U8"


def t_int8_bf16(d: Draft) -> str:
    import torch

    if d.fmt not in ("int8", "int8_convrot"):
        return ""
    for layer in d.quantized:
        d.set(layer, "weight", d.layer(layer)["weight"].to(torch.bfloat16))
    return "INT8 codes stored as BF16"


def t_fp8_bf16(d: Draft) -> str:
    import torch

    if d.fmt != "fp8":
        return ""
    for layer in d.quantized:
        d.set(layer, "weight", d.layer(layer)["weight"].to(torch.bfloat16))
    return "FP8 codes upcast to BF16"


def t_u8_scales(d: Draft) -> str:
    import torch

    suffix = {"w4a8": "weight_s_rel", "w4a8_uniform": "weight_s_rel", "w4a8_asym": "weight_s_rel", "nvfp4": "weight_scale"}
    if d.fmt not in suffix:
        return ""
    for layer in d.quantized:
        d.set(layer, suffix[d.fmt], d.layer(layer)[suffix[d.fmt]].view(torch.uint8))
    return f"{suffix[d.fmt]} stored as U8"


def t_fp8_row_scale(d: Draft) -> str:
    if d.fmt != "fp8":
        return ""
    for layer in d.quantized:
        lay = d.layer(layer)
        d.set(layer, "weight_scale", lay["weight_scale"].reshape(1, 1).expand(lay["weight"].shape[0], 1).contiguous())
    return "FP8 scale stored (N, 1)"


def t_int8_1d(d: Draft) -> str:
    if d.fmt not in ("int8", "int8_convrot"):
        return ""
    for layer in d.quantized:
        d.set(layer, "weight_scale", d.layer(layer)["weight_scale"].reshape(-1))
    return "INT8 row scales stored 1-D"


TOLERATED = {
    "int8-u8": t_int8_u8,
    "int8-bf16": t_int8_bf16,
    "fp8-bf16": t_fp8_bf16,
    "u8-scales": t_u8_scales,
    "fp8-row-scale": t_fp8_row_scale,
    "int8-1d-scale": t_int8_1d,
}


# -- the space ----------------------------------------------------------------------------------


@dataclass
class Entry:
    """One file of the space, as the manifest records it."""

    id: str
    model: str
    fmt: str
    group: str
    file: str
    notes: list[str]
    reference: str | None = None
    """The file of dense tensors overriding the model's (``<id>.reference.safetensors``)."""


DETECTION_KEYS = {"flux": ("img_in", "txt_in", "vector_in.in_layer"), "wan": ("text_embedding.0", "blocks.0.ffn.0")}


def generate(seed: int, out: Path, sks: dict[str, Skeleton]) -> list[Entry]:
    """Write ``seed``'s space into ``out`` from the models' skeletons (``skeletons``) and return
    its entries."""
    from safetensors.torch import save_file

    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    entries: list[Entry] = []

    def write(cid: str, d: Draft, group: str) -> None:
        tensors, meta = d.state()
        path = out / f"{cid}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        reference = None
        if d.reference:
            reference = f"{cid}.reference.safetensors"
            save_file({k: v.contiguous() for k, v in d.reference.items()}, str(out / reference))
        entries.append(Entry(cid, d.model, d.fmt, group, path.name, d.notes, reference))

    for model in ("flux", "wan"):
        sk = sks[model]
        dense = dense_weights(sk, seed * 100 + (1 if model == "flux" else 2))
        base_dense = Draft(model, "dense", dict(dense), {}, [], dense=dense)
        save_file(dense, str(out / f"{model}.dense.safetensors"))
        write(f"{model}.dense.valid", base_dense, "valid")
        for fi, fmt in enumerate(FORMATS):
            base = quantized_model(model, fmt, dense, sk, seed * 1000 + fi * 50)
            layers = base.quantized

            name = f"{model}.{fmt}"
            d = base.copy()
            d.notes.append("as written")
            write(f"{name}.valid", d, "valid")
            if fmt == "awq":
                continue
            if fmt in ("fp8", "nvfp4") or rng.random() < 0.2:
                d = base.copy()
                d.marker_mode = rng.choice(("header", "both"))
                d.notes.append(f"markers in the header map ({d.marker_mode})")
                write(f"{name}.valid-{d.marker_mode}", d, "valid")
            for group, table in (("shape", SHAPE), ("missing", MISSING), ("marker", MARKER), ("value", VALUE)):
                for tag, fn in table.items():
                    d = base.copy()
                    layer = rng.choice(layers)
                    note = fn(d, layer, rng)
                    if not note:
                        continue
                    d.notes.append(f"{layer}: {note}" if tag != "markers-all" else note)
                    write(f"{name}.{tag}.{layer}", d, group)
            for tag, fn in TOLERATED.items():
                d = base.copy()
                note = fn(d)
                if note:
                    d.notes.append(note)
                    write(f"{name}.{tag}", d, "tolerated")
            # detection & prefix: on a share of the formats
            for tag, prefix, rule in (
                ("prefix-ldm", "model.diffusion_model.", "all"),
                ("prefix-diffusion_model", "diffusion_model.", "all"),
                ("prefix-transformer", "transformer.", "all"),
                ("prefix-one-block", "model.diffusion_model.", None),
                ("prefix-one-block-foreign", rng.choice(("transformer.", "diffusion_model.")), None),
                ("prefix-one-layer", "model.diffusion_model.", "layer"),
            ):
                if rng.random() >= 0.4 and fmt not in ("fp8", "nvfp4"):
                    continue
                d = base.copy()
                picked = rng.choice(layers)
                where = {"all": "all", "layer": picked + "."}.get(rule or "", _block_of(picked))
                d.prefix[prefix] = where
                d.notes.append(f"prefix {prefix!r} on {'every key' if where == 'all' else where + '*'}")
                write(f"{name}.{tag}{'' if where == 'all' else '.' + where.rstrip('.')}", d, "prefix")
            if fmt in ("fp8", "nvfp4", "int8_convrot") or rng.random() < 0.3:
                # markers only in the header map, its layer names and the keys prefixed alike or differently
                for tag, keys, header in (
                    ("prefix-keys-not-header", "model.diffusion_model.", ""),
                    ("prefix-header-not-keys", None, "model.diffusion_model."),
                    ("prefix-keys-and-header", "model.diffusion_model.", "model.diffusion_model."),
                ):
                    d = base.copy()
                    d.marker_mode = "header"
                    if keys:
                        d.prefix[keys] = "all"
                    d.header_prefix = header
                    d.notes.append(f"markers in the header map named with {header!r}, keys with {keys or ''!r}")
                    write(f"{name}.{tag}", d, "prefix")
            if fmt in PACKED:
                for key in DETECTION_KEYS[model]:
                    if key in layers:
                        continue
                    d = base.copy()
                    try:
                        q, marker = quantize_layer(fmt, dense[f"{key}.weight"], seed)
                    except ValueError:  # comfy-kitchen refuses the layer's size in this format
                        continue
                    rebuilt = {}
                    for k, v in d.tensors.items():
                        if k == f"{key}.weight":
                            rebuilt.update({f"{key}.{s}": qt for s, qt in q.items()})
                        else:
                            rebuilt[k] = v
                    d.tensors = rebuilt
                    d.markers[key] = marker
                    d.notes.append(f"{key}: quantized ({fmt}) in a key detection reads")
                    write(f"{name}.detect-key.{key}", d, "prefix")
            if fmt == "fp8" and model == "wan":
                key = "blocks.0.ffn.0"
                d = base.copy()
                d.set(key, "weight", d.layer(key)["weight"].t())
                d.notes.append(f"{key}: weight stored transposed")
                write(f"{name}.detect-key-transposed.{key}", d, "prefix")
        # several defects in one file
        singles = list(SHAPE.items()) + list(MISSING.items()) + list(MARKER.items())[:1] + list(VALUE.items())
        for i in range(12):
            fmt = rng.choice([f for f in FORMATS if f != "awq"])
            base = quantized_model(model, fmt, dense, sk, seed * 1000 + 7)
            d = base.copy()
            picked = rng.sample(base.quantized, rng.choice((2, 2, 3)))
            ids = []
            for layer in picked:
                for _ in range(8):
                    tag, fn = rng.choice(singles)
                    note = fn(d, layer, rng)
                    if note:
                        d.notes.append(f"{layer}: {note}")
                        ids.append(f"{tag}@{layer}")
                        break
            write(f"{model}.{fmt}.multi{i}." + "+".join(ids), d, "multi")
    return entries


def skeletons(source: Path, seed: int) -> dict[str, Skeleton]:
    """Both models' skeletons, read in a child process: importing ComfyUI re-registers
    comfy-kitchen's layout classes with its own (its FP8 layout quantizes with a scale of 1),
    so the process that quantizes must never import it."""
    proc = subprocess.run(
        [sys.executable, "-m", "runtimes.whole_models", "--skeletons", str(source), str(seed)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT.parent), os.environ.get("PYTHONPATH", "")) if p)),
    )
    if proc.returncode:
        raise RuntimeError(f"ComfyUI's models could not be built:\n{proc.stderr[-3000:]}")
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    return {m: Skeleton({k: tuple(v) for k, v in sk["shapes"]}, sk["linears"]) for m, sk in raw.items()}


def _print_skeletons(source: Path, seed: int) -> None:
    sys.path.insert(0, str(source))
    import logging

    logging.disable(logging.CRITICAL)
    import comfy.options

    sys.argv = [sys.argv[0], "--cpu"]
    comfy.options.enable_args_parsing()
    out = {}
    for model, config in model_configs(seed).items():
        sk = skeleton(model, config)
        out[model] = {"shapes": [[k, list(v)] for k, v in sk.shapes.items()], "linears": sk.linears}
    print(json.dumps(out))


def main(argv: list[str]) -> None:
    if argv[0] == "--skeletons":
        _print_skeletons(Path(argv[1]), int(argv[2]))
        return
    source, seed, out = Path(argv[0]), int(argv[1]), Path(argv[2])
    if "comfy" in sys.modules:
        raise RuntimeError("the space must be quantized in a process that has not imported ComfyUI")
    entries = generate(seed, out, skeletons(source, seed))
    if any(name == "comfy" or name.startswith("comfy.") for name in sys.modules):
        raise RuntimeError("ComfyUI was imported while quantizing: its layouts replace comfy-kitchen's")
    manifest = {"seed": seed, "configs": model_configs(seed), "entries": [e.__dict__ for e in entries]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def source_hash() -> str:
    """What the written space depends on: this generator and the kitchen helpers it uses."""
    h = hashlib.sha256()
    for path in (ROOT / "whole_models.py", ROOT.parent / "kitchen_fixtures.py"):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


STALE = 2 * 86400
"""Seconds after which a space an earlier generator wrote (another source hash) is removed
(not at once: another checkout may still be running it)."""


def _drop_stale(folder: Path, seed: int) -> None:
    import shutil
    import time

    for old in folder.parent.glob(f"seed{seed}-*"):
        manifest = old / "manifest.json"
        if old != folder and manifest.is_file() and time.time() - manifest.stat().st_mtime > STALE:
            shutil.rmtree(old, ignore_errors=True)


def space(seed: int = 0) -> tuple[Path, dict] | str:
    """The folder and manifest of ``seed``'s space, written once into the test cache (keyed by
    the seed and ``source_hash``); a one-line reason instead when ComfyUI cannot be had."""
    sys.path.insert(0, str(ROOT.parent))
    import comfyui_env
    import runtime_sources

    python = comfyui_env.comfyui_python()
    if python is None:
        return comfyui_env.MISSING
    folder = runtime_sources.cache_dir() / "whole-models" / f"seed{seed}-{source_hash()}"
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        with runtime_sources._Locked(f"whole-models-{seed}"):
            if not manifest.is_file():
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT.parent), env.get("PYTHONPATH", "")) if p)
                proc = subprocess.run(
                    [str(python), "-m", "runtimes.whole_models", str(runtime_sources.comfyui_source()), str(seed), str(folder)],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    raise RuntimeError(f"the whole-model space of seed {seed} could not be written:\n{proc.stderr[-3000:]}")
                _drop_stale(folder, seed)
    return folder, json.loads(manifest.read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
