"""Full-size, sparse Comfy-quantized checkpoint layouts for benchmarks.

Each layout is an exact safetensors container (8-byte header length + compact JSON padded to
8 bytes, tensors tiling the data area in the order the Rust ``safetensors`` writer uses), but
the tensor data are file holes: only the header and the ``.comfy_quant`` marker bytes are
written, then the file is truncated to its full size.  A 14B checkpoint costs a few hundred
kilobytes of disk.

Models (tensor names as in the original / ComfyUI state dicts, no ``model.diffusion_model.``):

- ``flux``: Flux.1-dev, 12B (19 double + 38 single blocks, hidden 3072, MLP 12288).
- ``qwen``: Qwen-Image, 20B (60 transformer blocks, hidden 3072, MLP 12288).
- ``wan``: Wan 2.x 14B (40 blocks, dim 5120, FFN 13824), optionally with more blocks.

Formats of the quantized linears: ``w4a8`` (asym_w4a8_int8 variant A, codebook), ``fp8``
(float8_e4m3fn) and ``int8`` (int8_tensorwise ConvRot).  Embeddings, norms, modulation and
the final layers stay in BF16/F32 as real exports keep them.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

MARKERS = {
    "w4a8": {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True},
    "fp8": {"format": "float8_e4m3fn"},
    "int8": {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256},
}

DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1}
# Rust safetensors sorts tensors by dtype (enum order, descending), then by name.
_DTYPE_RANK = {d: i for i, d in enumerate(["U8", "I8", "F8_E5M2", "F8_E4M3", "F16", "BF16", "F32", "F64"])}


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple
    data: bytes | None = None
    """Real bytes to write (markers only); None means a hole."""

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass
class Layout:
    name: str
    model: str
    fmt: str
    shards: int
    header_markers: bool
    tensors: list[Tensor] = field(default_factory=list)
    quant_layers: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


# -- tensor sets ----------------------------------------------------------------------------


def _dense(out: list[Tensor], prefix: str, n: int, k: int, bias: bool = True, dtype: str = "BF16") -> None:
    out.append(Tensor(prefix + ".weight", dtype, (n, k)))
    if bias:
        out.append(Tensor(prefix + ".bias", dtype, (n,)))


def _quant(out: list[Tensor], layers: list[str], fmt: str, prefix: str, n: int, k: int) -> None:
    """One quantized linear ``[N, K]`` with bias and a tensor marker."""
    layers.append(prefix)
    marker = json.dumps(MARKERS[fmt]).encode()
    if fmt == "w4a8":
        out += [
            Tensor(prefix + ".weight", "I8", (n, k // 2)),
            Tensor(prefix + ".weight_s_rel", "F8_E4M3", (n, k // 16)),
            Tensor(prefix + ".weight_s_channel", "F32", (n,)),
            Tensor(prefix + ".weight_codebook", "F32", (16,)),
        ]
    elif fmt == "fp8":
        out += [Tensor(prefix + ".weight", "F8_E4M3", (n, k)), Tensor(prefix + ".weight_scale", "F32", ())]
    elif fmt == "int8":
        out += [Tensor(prefix + ".weight", "I8", (n, k)), Tensor(prefix + ".weight_scale", "F32", (n, 1))]
    else:
        raise ValueError(fmt)
    out.append(Tensor(prefix + ".bias", "BF16", (n,)))
    out.append(Tensor(prefix + ".comfy_quant", "U8", (len(marker),), marker))


def flux_tensors(fmt: str, double: int = 19, single: int = 38) -> tuple[list[Tensor], list[str]]:
    h, mlp, out, layers = 3072, 12288, [], []
    q = lambda p, n, k: _quant(out, layers, fmt, p, n, k)  # noqa: E731
    _dense(out, "img_in", h, 64)
    for p, k in (("time_in", 256), ("vector_in", 768), ("guidance_in", 256)):
        _dense(out, p + ".in_layer", h, k)
        _dense(out, p + ".out_layer", h, h)
    _dense(out, "txt_in", h, 4096)
    for i in range(double):
        b = f"double_blocks.{i}"
        for s in ("img", "txt"):
            q(f"{b}.{s}_mod.lin", 6 * h, h)
            q(f"{b}.{s}_attn.qkv", 3 * h, h)
            out.append(Tensor(f"{b}.{s}_attn.norm.query_norm.scale", "BF16", (128,)))
            out.append(Tensor(f"{b}.{s}_attn.norm.key_norm.scale", "BF16", (128,)))
            q(f"{b}.{s}_attn.proj", h, h)
            q(f"{b}.{s}_mlp.0", mlp, h)
            q(f"{b}.{s}_mlp.2", h, mlp)
    for i in range(single):
        b = f"single_blocks.{i}"
        q(f"{b}.linear1", 3 * h + mlp, h)
        q(f"{b}.linear2", h, h + mlp)
        out.append(Tensor(f"{b}.norm.query_norm.scale", "BF16", (128,)))
        out.append(Tensor(f"{b}.norm.key_norm.scale", "BF16", (128,)))
        q(f"{b}.modulation.lin", 3 * h, h)
    _dense(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    _dense(out, "final_layer.linear", 64, h)
    return out, layers


def qwen_tensors(fmt: str, blocks: int = 60) -> tuple[list[Tensor], list[str]]:
    h, mlp, out, layers = 3072, 12288, [], []
    q = lambda p, n, k: _quant(out, layers, fmt, p, n, k)  # noqa: E731
    _dense(out, "img_in", h, 64)
    out.append(Tensor("txt_norm.weight", "BF16", (3584,)))
    _dense(out, "txt_in", h, 3584)
    _dense(out, "time_text_embed.timestep_embedder.linear_1", h, 256)
    _dense(out, "time_text_embed.timestep_embedder.linear_2", h, h)
    for i in range(blocks):
        b = f"transformer_blocks.{i}"
        q(f"{b}.img_mod.1", 6 * h, h)
        q(f"{b}.txt_mod.1", 6 * h, h)
        for p in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            q(f"{b}.attn.{p}", h, h)
        for p in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            out.append(Tensor(f"{b}.attn.{p}.weight", "BF16", (128,)))
        for s in ("img", "txt"):
            q(f"{b}.{s}_mlp.net.0.proj", mlp, h)
            q(f"{b}.{s}_mlp.net.2", h, mlp)
    _dense(out, "norm_out.linear", 2 * h, h)
    _dense(out, "proj_out", 64, h)
    return out, layers


def wan_tensors(fmt: str, blocks: int = 40) -> tuple[list[Tensor], list[str]]:
    d, ffn, out, layers = 5120, 13824, [], []
    q = lambda p, n, k: _quant(out, layers, fmt, p, n, k)  # noqa: E731
    out.append(Tensor("patch_embedding.weight", "BF16", (d, 16, 1, 2, 2)))
    out.append(Tensor("patch_embedding.bias", "BF16", (d,)))
    _dense(out, "text_embedding.0", d, 4096)
    _dense(out, "text_embedding.2", d, d)
    _dense(out, "time_embedding.0", d, 256)
    _dense(out, "time_embedding.2", d, d)
    _dense(out, "time_projection.1", 6 * d, d)
    for i in range(blocks):
        b = f"blocks.{i}"
        out.append(Tensor(f"{b}.modulation", "F32", (1, 6, d)))
        for a in ("self_attn", "cross_attn"):
            for p in ("q", "k", "v", "o"):
                q(f"{b}.{a}.{p}", d, d)
            out.append(Tensor(f"{b}.{a}.norm_q.weight", "BF16", (d,)))
            out.append(Tensor(f"{b}.{a}.norm_k.weight", "BF16", (d,)))
        out.append(Tensor(f"{b}.norm3.weight", "BF16", (d,)))
        out.append(Tensor(f"{b}.norm3.bias", "BF16", (d,)))
        q(f"{b}.ffn.0", ffn, d)
        q(f"{b}.ffn.2", d, ffn)
    _dense(out, "head.head", 64, d)
    out.append(Tensor("head.modulation", "F32", (1, 2, d)))
    return out, layers


MODELS = {"flux": flux_tensors, "qwen": qwen_tensors, "wan": wan_tensors}


def make_layout(name: str, model: str, fmt: str, shards: int = 1, header_markers: bool = False, **kw) -> Layout:
    tensors, layers = MODELS[model](fmt, **kw)
    return Layout(name, model, fmt, shards, header_markers, tensors, layers)


# -- writing --------------------------------------------------------------------------------


def _split(tensors: list[Tensor], shards: int) -> list[list[Tensor]]:
    """State-dict order, cut by cumulative size (like HF's size-based sharding)."""
    total = sum(t.nbytes for t in tensors)
    groups: list[list[Tensor]] = [[] for _ in range(shards)]
    pos = 0
    for t in tensors:
        groups[min(shards - 1, pos * shards // total)].append(t)
        pos += t.nbytes
    return [g for g in groups if g]


def write_safetensors(path: str, tensors: list[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write header + marker bytes, leave the rest as a hole.  Returns the file size."""
    ordered = sorted(tensors, key=lambda t: (-_DTYPE_RANK[t.dtype], t.name))
    header: dict = {}
    if metadata:
        header["__metadata__"] = metadata
    pos = 0
    spans = []
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        spans.append((pos, t))
        pos += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    base = 8 + len(raw)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for off, t in spans:
            if t.data is not None:
                fh.seek(base + off)
                fh.write(t.data)
        fh.truncate(base + pos)
    return base + pos


def write_layout(layout: Layout, folder: str) -> str:
    """Write ``layout`` into ``folder`` (created).  Returns the path to pass to ``check``:
    the single file, or the folder holding the shards and ``model.safetensors.index.json``."""
    os.makedirs(folder, exist_ok=True)
    groups = _split(layout.tensors, layout.shards)
    marker_of = {p: MARKERS[layout.fmt] for p in layout.quant_layers}
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        meta = {"format": "pt"}
        if layout.header_markers:
            here = {t.name[: -len(".weight")] for t in group if t.name.endswith(".weight")}
            layers = {p: m for p, m in marker_of.items() if p in here}
            if layers:
                meta["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": layers})
        write_safetensors(os.path.join(folder, fname), group, meta)
        for t in group:
            weight_map[t.name] = fname
    if len(groups) == 1:
        return os.path.join(folder, "model.safetensors")
    index = {"metadata": {"total_size": layout.total_bytes}, "weight_map": weight_map}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
    return folder


def shard_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))
    return [path]
