"""Lossy repairs (``fix --allow-lossy``): re-quantize a W4A8 layer the selected runtime
cannot use as stored, from its own decoded weights, and measure what that costs.

* 6-bit rows for SGLang (which reads every W4A8 row as 4-bit) -> 4-bit, same group size;
* an asymmetric layer for ComfyUI (which drops the correction) -> symmetric;
* F32 ``weight_s_rel`` for SGLang (which needs FP8 group scales) -> FP8.

The layer is decoded with its codec, encoded with comfy-kitchen's reference quantizer
(codebook decision included), and the relative L2 error of the new decoded weight against
the old one is reported.  torch is imported only here, only when such a repair runs.
"""

from __future__ import annotations

from ..formats.w4a8 import ASYM_W4A8_INT8

W4A8_TENSORS = ("weight", "weight_s_rel", "weight_s_channel", "weight_codebook", "weight_correction")


class Requant:
    """One layer to re-quantize: why, encode parameters, the output tensors' (dtype, shape)."""

    __slots__ = ("prefix", "why", "params", "specs", "marker", "error", "change", "outputs", "_after")

    def __init__(self, prefix: str, why: str, params: dict, specs: dict[str, tuple], marker: dict) -> None:
        self.prefix = prefix
        self.why = why
        self.params = params
        self.specs = specs
        self.marker = marker
        self.error: float | None = None
        self.change = None
        self.outputs: dict[str, bytes] | None = None
        """The re-quantized bytes, kept when computed before writing (``--reference``)."""
        self._after: str | None = None


def lossy_need(env: dict, tensors: dict, target: str) -> tuple[str, dict] | None:
    """(why, encode params) when the layer needs a lossy re-quantization for ``target``."""
    sglang = target in ("sglang", "all")
    s_rel = tensors.get("weight_s_rel")
    if sglang and env.get("bits") == 6:
        return "6-bit rows -> 4-bit (SGLang reads W4A8 rows as 4-bit)", {}
    if sglang and s_rel is not None and s_rel.dtype == "F32":
        return "F32 group scales -> FP8 (SGLang needs FP8 weight_s_rel)", {}
    if target == "comfyui" and "weight_correction" in tensors:
        return "asymmetric -> symmetric (ComfyUI drops the correction)", {}
    return None


def plan_requant(prefix: str, env: dict, tensors: dict, target: str) -> Requant | None:
    need = lossy_need(env, tensors, target)
    if need is None:
        return None
    why, extra = need
    n, k, g, c = env["N"], env["K"], env["group_size"], env["convrot_groupsize"]
    params = {"group_size": g, "convrot_groupsize": c, "bits": 4, "symmetric": True, "codebook": True, **extra}
    specs = {
        "weight": ("I8", (n, k // 2)),
        "weight_s_rel": ("F8_E4M3", (n, k // g)),
        "weight_s_channel": ("F32", (n,)),
        "weight_codebook": ("F32", (16,)),
    }
    marker = {"format": ASYM_W4A8_INT8.name, "group_size": g, "convrot_groupsize": c, "convrot": True}
    return Requant(prefix, why, params, specs, marker)


def requantize(ckpt, op: Requant, keep: bool = False) -> dict[str, bytes]:
    """Decode the stored layer, re-encode it, record the error; returns new bytes by suffix.
    With ``keep`` the bytes stay on ``op`` and the next call returns them (computed once)."""
    if op.outputs is not None:
        out, op.outputs = op.outputs, None
        return out
    import torch

    from ..codecs import get
    from ..numerics.dtypes import dtype_name, from_bytes, to_bytes

    layer = ckpt.layers[op.prefix]
    stored = {s: from_bytes(ckpt.read_bytes(e), e.dtype, e.shape) for s, e in layer.tensors.items()
              if s in W4A8_TENSORS}
    codec = get(ASYM_W4A8_INT8.name)
    old = codec.decode(stored, layer.marker, dtype=torch.float32, layer=op.prefix)
    encoded = codec.encode(old, layer=op.prefix, **dict(op.params))
    new = codec.decode(dict(encoded), encoded.marker, dtype=torch.float32, layer=op.prefix)
    denom = torch.linalg.vector_norm(old).item() or 1.0
    op.error = torch.linalg.vector_norm(new - old).item() / denom
    if op.change is not None:
        if op._after is None:
            op._after = op.change.after
        op.change.after = op._after + f"; relative L2 error {op.error:.4f}"
    out = {}
    for suffix, (dtype, shape) in op.specs.items():
        t = encoded[suffix]
        if tuple(t.shape) != shape or dtype_name(t.dtype) != dtype:
            raise ValueError(f"{op.prefix}.{suffix}: re-quantized {dtype_name(t.dtype)} {tuple(t.shape)} "
                             f"!= planned {dtype} {shape}")
        out[suffix] = bytes(to_bytes(t))
    if keep:
        op.outputs = dict(out)
    return out
