"""Real comfy-kitchen layers for tests and examples.

Every helper quantizes a seeded random weight ``[N, K]`` with comfy-kitchen 0.2.40's CPU eager
layouts and returns the tensors exactly as the layout's ``state_dict`` names them (``weight``,
``weight_scale``, ``weight_s_rel`` ...), together with two markers:

* ``comfyui_marker``: what ComfyUI writes (W4A8 without ``convrot``);
* ``sglang_marker``: the marker comfy-kitchen's layers need to load in SGLang 0.5.23 too (W4A8 with
  ``"convrot": true`` and explicit ``group_size``/``convrot_groupsize``; INT8 ConvRot with an
  explicit ``convrot_groupsize``).

Files are written with the real ``safetensors.torch.save_file`` so the reader is exercised on
files produced by the library everyone uses.  ``examples/make_examples.py`` imports this module
(one copy of the quantize helpers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch
from comfy_kitchen.tensor import QuantizedTensor
from safetensors.torch import save_file

PREFIX = "blocks.0.attn.qkv"

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass(frozen=True)
class Variant:
    """One storage variant comfy-kitchen can write: layout class, quantize kwargs, marker."""

    name: str
    format: str
    layout: str
    kwargs: dict = field(default_factory=dict)
    marker_keys: tuple[tuple[str, object], ...] = ()
    """ComfyUI marker keys after ``format`` (values may be the strings 'G' / 'C': group sizes)."""
    sglang_extra: tuple[tuple[str, object], ...] = ()
    """Keys the SGLang-compatible profile adds after the ComfyUI keys."""
    input_scale: bool = False
    """Add a static ``input_scale`` (F32 []) as FP8 writers do for static activations."""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("fp8", "float8_e4m3fn", "TensorCoreFP8Layout"),
        Variant("fp8_static", "float8_e4m3fn", "TensorCoreFP8Layout", input_scale=True),
        Variant("fp8_e5m2", "float8_e5m2", "TensorCoreFP8Layout", {"dtype": torch.float8_e5m2}),
        Variant("int8_scalar", "int8_tensorwise", "TensorWiseINT8Layout"),
        Variant("int8_rowwise", "int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True}),
        Variant(
            "int8_convrot",
            "int8_tensorwise",
            "TensorWiseINT8Layout",
            {"per_channel": True, "convrot": True},
            (("convrot", True), ("convrot_groupsize", "C")),
        ),
        Variant(
            "w4a8_codebook",
            "asym_w4a8_int8",
            "AsymW4A8Int8Layout",
            {},
            (("group_size", "G"), ("convrot_groupsize", "C")),
            (("convrot", True),),
        ),
        Variant(
            "w4a8_uniform",
            "asym_w4a8_int8",
            "AsymW4A8Int8Layout",
            {"codebook": False},
            (("group_size", "G"), ("convrot_groupsize", "C")),
            (("convrot", True),),
        ),
        Variant(
            "w4a8_asym",
            "asym_w4a8_int8",
            "AsymW4A8Int8Layout",
            {"codebook": False, "symmetric": False},
            (("group_size", "G"), ("convrot_groupsize", "C")),
            (("convrot", True),),
        ),
        Variant(
            "w6a8",
            "asym_w4a8_int8",
            "AsymW4A8Int8Layout",
            {"codebook": False, "bits": 6},
            (("group_size", "G"), ("convrot_groupsize", "C")),
            (("convrot", True),),
        ),
        Variant("w4a4", "convrot_w4a4", "TensorCoreConvRotW4A4Layout", {}, (("convrot_groupsize", "C"),)),
        Variant(
            "w4a4_int8",
            "convrot_w4a4",
            "TensorCoreConvRotW4A4Layout",
            {"linear_dtype": "int8"},
            (("convrot_groupsize", "C"), ("linear_dtype", "int8")),
        ),
        Variant("nvfp4", "nvfp4", "TensorCoreNVFP4Layout"),
        Variant("mxfp8", "mxfp8", "TensorCoreMXFP8Layout"),
    )
}


@dataclass
class KitchenLayer:
    """One layer: tensors by suffix, the marker to write and both marker styles."""

    prefix: str
    tensors: dict[str, torch.Tensor]
    comfyui_marker: dict | None
    sglang_marker: dict | None
    marker: dict | None
    variant: str | None = None
    n: int = 0
    k: int = 0

    def named(self) -> dict[str, torch.Tensor]:
        return {f"{self.prefix}.{s}": t for s, t in self.tensors.items()}

    def with_marker(self, marker: dict | None) -> KitchenLayer:
        return replace(self, marker=None if marker is None else dict(marker))

    def with_tensor(self, suffix: str, tensor: torch.Tensor | None) -> KitchenLayer:
        tensors = dict(self.tensors)
        if tensor is None:
            tensors.pop(suffix, None)
        else:
            tensors[suffix] = tensor
        return replace(self, tensors=tensors)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes: bit-identical, NaN payloads and signed zeros included."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def make_weight(n: int, k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0, std: float = 0.02) -> torch.Tensor:
    """A seeded Gaussian weight ``[n, k]`` (generated in F32, then cast)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen, dtype=torch.float32) * std).to(dtype)


def quantize(
    variant: str | Variant, weight: torch.Tensor, group_size: int = 16, convrot_groupsize: int = 256
) -> dict[str, torch.Tensor]:
    """comfy-kitchen's state dict for ``weight``, keyed by suffix (``weight``, ``weight_scale`` ...)."""
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    kwargs = dict(v.kwargs)
    if v.format == "asym_w4a8_int8":
        kwargs.update(group_size=group_size, convrot_groupsize=convrot_groupsize)
    elif v.format == "convrot_w4a4" or kwargs.get("convrot"):
        kwargs["convrot_groupsize"] = convrot_groupsize
    q = QuantizedTensor.from_float(weight, v.layout, **kwargs)
    out = {suffix: t.detach().contiguous().clone() for suffix, t in q.state_dict("weight").items()}
    if v.input_scale:
        out["input_scale"] = torch.tensor(float(weight.float().abs().amax()) / 448.0, dtype=torch.float32)
    return out


def markers_for(variant: str | Variant, group_size: int = 16, convrot_groupsize: int = 256) -> tuple[dict, dict]:
    """(ComfyUI-style marker, SGLang-compatible marker), keys in the writers' order."""
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    sizes = {"G": group_size, "C": convrot_groupsize}
    comfy = {"format": v.format}
    for key, value in v.marker_keys:
        comfy[key] = sizes.get(value, value) if isinstance(value, str) else value
    sglang = dict(comfy)
    for key, value in v.sglang_extra:
        sglang[key] = value
    return comfy, sglang


def make_layer(
    variant: str,
    prefix: str = PREFIX,
    n: int = 32,
    k: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    marker: str = "sglang",
    bias: bool = True,
    group_size: int = 16,
    convrot_groupsize: int = 256,
) -> KitchenLayer:
    """Quantize a seeded ``[n, k]`` weight with ``variant``; ``marker`` picks "sglang" or "comfyui"."""
    if marker not in ("sglang", "comfyui"):
        raise ValueError(f"marker must be 'sglang' or 'comfyui', got {marker!r}")
    weight = make_weight(n, k, dtype, seed)
    tensors = quantize(variant, weight, group_size, convrot_groupsize)
    if bias:
        gen = torch.Generator().manual_seed(seed + 10_000)
        tensors["bias"] = (torch.randn(n, generator=gen) * 0.01).to(dtype)
    comfy, sglang = markers_for(variant, group_size, convrot_groupsize)
    chosen = sglang if marker == "sglang" else comfy
    return KitchenLayer(prefix, tensors, comfy, sglang, dict(chosen), variant, n, k)


BANK_ROWS = ("weight", "weight_scale", "weight_s_rel", "weight_s_channel", "bias")
"""The tensors ComfyUI flattens from [E, out, ...] to [E*out, ...] in W4A8 and row-scaled INT8
banks (ComfyUI 0.33.0 ``MoEExperts``)."""


def moe_bank_layer(
    variant: str, prefix: str, experts: int = 4, n: int = 32, k: int = 256, seed: int = 0, marker: str = "comfyui"
) -> tuple[KitchenLayer, dict[str, torch.Tensor]]:
    """A MoE expert bank of ``experts`` experts of ``[n, k]`` (as ComfyUI 0.33.0 ``MoEExperts`` reads it), quantized by comfy-kitchen.

    W4A8 and row-scaled INT8 banks are one layer of ``experts * n`` rows, quantized as such and
    stored ``[E, n, ...]``; other formats quantize each expert on its own and stack its tensors
    (per-tensor scales become ``[E]``).  Returns the bank layer (its marker has ``num_experts``)
    and the reference: the flattened layer's tensors, or expert by expert a list of them."""
    v = VARIANTS[variant]
    gen = torch.Generator().manual_seed(seed + 10_000)
    bias = (torch.randn(experts * n, generator=gen) * 0.01).to(torch.bfloat16)
    comfy, sglang = markers_for(variant)
    chosen = dict(sglang if marker == "sglang" else comfy, num_experts=experts)
    if v.format == "asym_w4a8_int8" or v.kwargs.get("per_channel"):
        flat = quantize(variant, make_weight(experts * n, k, seed=seed))
        flat["bias"] = bias
        stored = {s: (t.reshape(experts, n, *t.shape[1:]) if s in BANK_ROWS else t).contiguous() for s, t in flat.items()}
        reference = flat
    else:
        reference = [quantize(variant, make_weight(n, k, seed=seed + e)) for e in range(experts)]
        stored = {s: torch.stack([r[s] for r in reference]).contiguous() for s in reference[0]}
        stored["bias"] = bias.reshape(experts, n).contiguous()
        for e, r in enumerate(reference):
            r["bias"] = stored["bias"][e]
    layer = KitchenLayer(
        prefix, stored, dict(comfy, num_experts=experts), dict(sglang, num_experts=experts), chosen, variant, n, k
    )
    return layer, reference


def dense_layer(
    prefix: str, shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16, seed: int = 0, bias: bool = False
) -> KitchenLayer:
    """An unquantized layer (e.g. a norm): ``weight`` of ``shape`` and optionally a bias."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"weight": (1.0 + 0.01 * torch.randn(*shape, generator=gen)).to(dtype)}
    if bias:
        tensors["bias"] = torch.zeros(shape[0], dtype=dtype)
    return KitchenLayer(prefix, tensors, None, None, None, None, shape[0], shape[-1])


def marker_tensor(marker: dict) -> torch.Tensor:
    """The ``.comfy_quant`` tensor writers produce (ComfyUI, convert_to_quant, comfy-kitchen-based tools)."""
    return torch.tensor(list(json.dumps(marker).encode("utf-8")), dtype=torch.uint8)


def header_markers(layers: Iterable[KitchenLayer]) -> str:
    """The ``_quantization_metadata`` string (read by ComfyUI 0.33.0 ``convert_old_quants``)."""
    return json.dumps({"format_version": "1.0", "layers": {x.prefix: x.marker for x in layers if x.marker is not None}})


def state_dict(layers: Iterable[KitchenLayer], marker_mode: str = "tensor") -> dict[str, torch.Tensor]:
    if marker_mode not in ("tensor", "header", "both"):
        raise ValueError(f"marker_mode must be 'tensor', 'header' or 'both', got {marker_mode!r}")
    out: dict[str, torch.Tensor] = {}
    for layer in layers:
        for name, t in layer.named().items():
            if name in out:
                raise ValueError(f"tensor {name!r} given twice")
            out[name] = t.contiguous()
        if layer.marker is not None and marker_mode in ("tensor", "both"):
            out[f"{layer.prefix}.comfy_quant"] = marker_tensor(layer.marker)
    return out


def file_metadata(layers: Iterable[KitchenLayer], marker_mode: str, metadata: dict | None) -> dict[str, str] | None:
    layers = list(layers)
    meta = dict(metadata or {})
    if marker_mode in ("header", "both") and any(x.marker is not None for x in layers):
        meta["_quantization_metadata"] = header_markers(layers)
    return meta or None


def write_layers(path, layers: Iterable[KitchenLayer], marker_mode: str = "tensor", metadata: dict | None = None) -> str:
    """Save ``layers`` with ``safetensors.torch.save_file``; markers as tensors, header map or both."""
    layers = list(layers)
    save_file(state_dict(layers, marker_mode), str(path), metadata=file_metadata(layers, marker_mode, metadata))
    return str(path)


def write_sharded(
    folder, shards: list[list[KitchenLayer]], marker_mode: str = "tensor", metadata: dict | None = None, basename: str = "model"
) -> list[str]:
    """Write one file per group of layers plus ``<basename>.safetensors.index.json``."""
    os.makedirs(folder, exist_ok=True)
    total = len(shards)
    weight_map: dict[str, str] = {}
    paths = []
    size = 0
    for i, group in enumerate(shards, start=1):
        fname = f"{basename}-{i:05d}-of-{total:05d}.safetensors"
        sd = state_dict(group, marker_mode)
        save_file(sd, os.path.join(folder, fname), metadata=file_metadata(group, marker_mode, metadata))
        for name, t in sd.items():
            weight_map[name] = fname
            size += t.numel() * t.element_size()
        paths.append(os.path.join(folder, fname))
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(folder, f"{basename}.safetensors.index.json"), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=2)
        fh.write("\n")
    return paths


def seed_defect(layer: KitchenLayer) -> KitchenLayer:
    """The seed record's defect: ck's BF16 correction stored transposed as ``(N, K // G)``."""
    corr = layer.tensors["weight_correction"]
    return layer.with_tensor("weight_correction", corr.t().contiguous().to(torch.bfloat16))


def decoded_layer(path: str, prefix: str) -> torch.Tensor:
    """The dense weight of layer ``prefix`` of the file ``path``, decoded with comfyquant's
    codec under the marker the checker reads (how the fix tests compare repaired layers)."""
    from safetensors import safe_open

    from comfyquant import codecs, open_checkpoint

    with open_checkpoint(path) as ck:
        layer = ck.layers[prefix]
        marker, names = layer.marker, {s: e.name for s, e in layer.tensors.items()}
    with safe_open(path, framework="pt") as f:
        tensors = {s: f.get_tensor(n) for s, n in names.items()}
    return codecs.get(marker["format"]).decode(tensors, marker)


def int_mm_is_exact() -> bool:
    """Whether this CPU's ``torch._int_mm`` (the runtime's INT8 GEMM) gives the exact product:
    VNNI kernels do; oneDNN's AVX2 kernel saturates pair sums in int16 (a row of 127s times a
    column of 127s then gives 1020, not 8 x 127 x 127)."""
    a = torch.full((1, 8), 127, dtype=torch.int8)
    return int(torch._int_mm(a, a.t().repeat(1, 8))[0, 0]) == 8 * 127 * 127
