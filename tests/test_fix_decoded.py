"""fix: every lossless repair leaves the decoded weight unchanged.

Each case starts from a real layer quantized by comfy-kitchen 0.2.40, damages it the way a
tool or a hand-written script does (the defects the checker names), repairs it with
``comfyquant fix`` and decodes the repaired layer with comfyquant's codec.  The dense weight
must be bit-identical to the decode of the undamaged layer -- or, where the damage itself
rounded a tensor (a codebook downcast to F16), to the decode of the layer with exactly those
rounded values, which is all a lossless repair can keep.
"""

from __future__ import annotations

import pytest
import torch

from comfyquant import check, codecs
from comfyquant.numerics.blocked import from_blocked
from comfyquant.repair.run import fix
from kitchen_fixtures import KitchenLayer, decoded_layer, make_layer, seed_defect, write_layers

P = "blocks.0.attn.qkv"


def _unblocked_nvfp4(layer: KitchenLayer) -> KitchenLayer:
    scale = layer.tensors["weight_scale"]
    rows = layer.tensors["weight"].shape[0]  # the padded rows the scales cover
    logical = from_blocked(scale.view(torch.uint8), rows, layer.k // 16).contiguous()
    return layer.with_tensor("weight_scale", logical.view(torch.float8_e4m3fn))


def _f16_codebook(layer: KitchenLayer) -> tuple[KitchenLayer, KitchenLayer]:
    rounded = layer.tensors["weight_codebook"].to(torch.float16)
    return layer.with_tensor("weight_codebook", rounded), layer.with_tensor("weight_codebook", rounded.to(torch.float32))


def _marker(layer: KitchenLayer, **changes) -> KitchenLayer:
    marker = {k: v for k, v in layer.marker.items() if k not in changes}
    marker.update({k: v for k, v in changes.items() if v is not None})
    return layer.with_marker(marker)


# (case, kitchen variant, make_layer kwargs, damage: layer -> damaged or (damaged, reference), fix kwargs);
# a fix kwarg "metadata" is written into the damaged file's header instead of passed to fix
CASES = [
    ("seed: correction transposed and BF16", "w4a8_asym", {}, seed_defect, {}),
    (
        "s_rel stored as U8",
        "w4a8_codebook",
        {},
        lambda x: x.with_tensor("weight_s_rel", x.tensors["weight_s_rel"].view(torch.uint8)),
        {},
    ),
    ("codebook downcast to F16", "w4a8_codebook", {}, _f16_codebook, {}),
    ("W4A8 marker without convrot", "w4a8_uniform", {}, lambda x: _marker(x, convrot=None), {}),
    ("W4A8 marker without sizes", "w4a8_codebook", {}, lambda x: _marker(x, group_size=None, convrot_groupsize=None), {}),
    (
        "int8 ConvRot row scales [N]",
        "int8_convrot",
        {},
        lambda x: x.with_tensor("weight_scale", x.tensors["weight_scale"].reshape(-1)),
        {},
    ),
    (
        "int8 embedding scale [1]",
        "int8_scalar",
        {"prefix": "txt_embed"},
        lambda x: x.with_tensor("weight_scale", x.tensors["weight_scale"].reshape(1)),
        {"target": "sglang"},
    ),
    (
        "int8 ConvRot in nested params",
        "int8_convrot",
        {},
        lambda x: x.with_marker({"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 256}}),
        {},
    ),
    ("int8 ConvRot without its size", "int8_convrot", {}, lambda x: _marker(x, convrot_groupsize=None), {}),
    (
        "NVFP4 scale stored as U8",
        "nvfp4",
        {"n": 128},
        lambda x: x.with_tensor("weight_scale", x.tensors["weight_scale"].view(torch.uint8)),
        {"target": "sglang"},
    ),
    ("NVFP4 scale not blocked", "nvfp4", {"n": 40}, _unblocked_nvfp4, {"target": "comfy-kitchen"}),
    (
        "MXFP8 E8M0 scales under SGLang's quant_format",
        "mxfp8",
        {"n": 128, "k": 128},
        lambda x: x.with_marker(None),
        {"target": "sglang", "metadata": {"quant_format": "mxfp8"}},
    ),
    ("FP8 without a marker", "fp8", {}, lambda x: x.with_marker(None), {}),
]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("case, variant, kwargs, damage, fix_kwargs", CASES, ids=[c[0] for c in CASES])
def test_lossless_repair_keeps_the_decoded_weight(tmp_path, case, variant, kwargs, damage, fix_kwargs):
    layer = make_layer(variant, **{"prefix": P, "seed": len(case), **kwargs})
    damaged = damage(layer)
    damaged, reference = damaged if isinstance(damaged, tuple) else (damaged, layer)
    fix_kwargs = dict(fix_kwargs)
    target = fix_kwargs.get("target", "all")
    src = write_layers(tmp_path / "in.safetensors", [damaged], metadata=fix_kwargs.pop("metadata", None))
    assert [f for f in check(src, target=target).findings if f.severity in ("error", "warning")], "the damage is a defect"
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest, **fix_kwargs)
    assert result.ok, [f.message for f in result.remaining]
    assert not [f for f in check(dest, target=target).findings if f.severity == "error"]
    want = codecs.get(reference.marker["format"]).decode(reference.tensors, reference.marker)
    got = decoded_layer(dest, layer.prefix)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _bits(got) == _bits(want)
