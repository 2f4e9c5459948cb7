"""``comfyquant.diffusers.load_transformer`` on tiny diffusers models.

For each class a tiny-config model with random weights is written as a ComfyUI/BFL-named
single file (this file's own inverse of diffusers' converter, checked by running diffusers'
converter on it), quantized by ``comfyquant quantize`` in every format the shapes allow, and
loaded.  The assertions:

* no key dropped or orphaned: the report has nothing unexpected or missing, and every
  tensor of the file (scales and markers included) is in ``report.loaded``;
* every quantized layer is a ``QuantLinear``;
* the forward is bit-identical to an independent reference: the original dense model whose
  quantized linears are replaced by comfy-kitchen ``QuantizedTensor`` layers (what ComfyUI
  runs, activation quantization included) built from the file's stored tensors, split and
  swapped *by this test* as comfy-kitchen lays the tensors out -- rows of the row-following tensors, columns of W4A8's
  correction, whole shared scalars and codebooks, blocked scales through comfy-kitchen's own
  ``from_blocked``/``to_blocked`` -- with the test's own name map.  Only the build of one
  ``QuantizedTensor`` from one layer's tensors is shared with the code under test
  (``comfyquant.torch.kitchen.build``, itself checked against comfy-kitchen's ``from_float`` in
  ``test_torch_run.py``).  Splitting the reference's stored tensors (rather than running the
  fused layer and slicing its output) keeps the comparison free of any assumption that a
  GEMM's rounding is independent of its row count.
* the relative error against the dense model stays within the format's expected error;
  with ``full_precision_matrix_mult`` (weight-only compute) the model equals diffusers'
  ``from_single_file`` of ``comfyquant dequantize``'s output within summation-order tolerance.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("comfy_kitchen")

import comfyquant  # noqa: E402
from comfyquant.diffusers import SUPPORTED, ComfyQuantParameter, load_transformer  # noqa: E402
from comfyquant.formats.registry import FORMATS  # noqa: E402
from comfyquant.torch import LoadError, QuantLinear  # noqa: E402
from comfyquant.torch import kitchen as kitchen_model  # noqa: E402
from test_codecs_vs_kitchen import kitchen_linear  # noqa: E402

if not diffusers.__version__.startswith(SUPPORTED):
    pytest.skip(f"diffusers {diffusers.__version__} is not a supported version", allow_module_level=True)

from comfy_kitchen.float_utils import from_blocked, to_blocked  # noqa: E402
from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES  # noqa: E402

DTYPE = torch.bfloat16

# -- formats: `comfyquant quantize` arguments, the kitchen_fixtures variant the reference runs,
#    and the relative output error a random tiny model shows at most (measured x ~3) ------------
QUANT = {
    "fp8": ("float8_e4m3fn", {}, "fp8", 0.15),
    "int8": ("int8_tensorwise", {"convrot": False}, "int8_rowwise", 0.08),
    "int8_convrot": ("int8_tensorwise", {}, "int8_convrot", 0.08),
    "w4a8": ("asym_w4a8_int8", {}, "w4a8_codebook", 0.35),
    "w6a8": ("asym_w4a8_int8", {"bits": 6, "codebook": False}, "w6a8", 0.15),
    "w4a4": ("convrot_w4a4", {}, "w4a4", 0.6),
    "nvfp4": ("nvfp4", {}, "nvfp4", 0.45),
    "mxfp8": ("mxfp8", {}, "mxfp8", 0.15),
}

BLOCKED = {"nvfp4": 16, "mxfp8": 32}
"""Formats whose ``weight_scale`` is in the blocked layout: K elements per scale."""


# -- name maps: diffusers key -> [(ComfyUI key, rows of the diffusers tensor or None)] ---------

QK_NORMS = [
    ("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"),
    ("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"),
    ("attn.norm_q.weight", "img_attn.norm.query_norm.scale"),
    ("attn.norm_k.weight", "img_attn.norm.key_norm.scale"),
]
"""diffusers' QK-norm weights -> BFL's, the same in Flux.1 and Flux.2 double blocks."""


def _sub(key: str, pairs) -> str:
    for a, b in pairs:
        key = key.replace(a, b)
    return key


def flux1_names(key: str, config: dict) -> list[tuple[str, int, tuple | None]]:
    """(Comfy key, order in the fused tensor, rows of this diffusers tensor taken)."""
    m = re.match(r"transformer_blocks\.(\d+)\.(.*)", key)
    if m:
        i, rest = m.groups()
        fused = {
            "attn.to_q": ("img_attn.qkv", 0),
            "attn.to_k": ("img_attn.qkv", 1),
            "attn.to_v": ("img_attn.qkv", 2),
            "attn.add_q_proj": ("txt_attn.qkv", 0),
            "attn.add_k_proj": ("txt_attn.qkv", 1),
            "attn.add_v_proj": ("txt_attn.qkv", 2),
        }
        mod, suffix = rest.rsplit(".", 1)
        if mod in fused:
            name, order = fused[mod]
            return [(f"double_blocks.{i}.{name}.{suffix}", order, None)]
        rest = _sub(
            rest,
            [
                ("norm1_context.linear", "txt_mod.lin"),
                ("norm1.linear", "img_mod.lin"),
                *QK_NORMS,
                ("ff_context.net.0.proj", "txt_mlp.0"),
                ("ff_context.net.2", "txt_mlp.2"),
                ("ff.net.0.proj", "img_mlp.0"),
                ("ff.net.2", "img_mlp.2"),
                ("attn.to_out.0", "img_attn.proj"),
                ("attn.to_add_out", "txt_attn.proj"),
            ],
        )
        return [(f"double_blocks.{i}.{rest}", 0, None)]
    m = re.match(r"single_transformer_blocks\.(\d+)\.(.*)", key)
    if m:
        i, rest = m.groups()
        mod, suffix = rest.rsplit(".", 1)
        order = {"attn.to_q": 0, "attn.to_k": 1, "attn.to_v": 2, "proj_mlp": 3}.get(mod)
        if order is not None:
            return [(f"single_blocks.{i}.linear1.{suffix}", order, None)]
        rest = _sub(
            rest,
            [
                ("norm.linear", "modulation.lin"),
                ("attn.norm_q.weight", "norm.query_norm.scale"),
                ("attn.norm_k.weight", "norm.key_norm.scale"),
                ("proj_out", "linear2"),
            ],
        )
        return [(f"single_blocks.{i}.{rest}", 0, None)]
    if key.startswith("norm_out.linear."):
        return _swapped("final_layer.adaLN_modulation.1." + key.rsplit(".", 1)[1], config)
    return [
        (
            _sub(
                key,
                [
                    ("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                    ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                    ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
                    ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
                    ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                    ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
                    ("context_embedder", "txt_in"),
                    ("x_embedder", "img_in"),
                    ("proj_out", "final_layer.linear"),
                ],
            ),
            0,
            None,
        )
    ]


def _swapped(comfy_key: str, config: dict) -> list:
    """diffusers' [scale, shift] is the file's [shift, scale]: the file's first half is the
    diffusers tensor's second half."""
    h = config["num_attention_heads"] * config["attention_head_dim"]
    return [(comfy_key, 0, (h, 2 * h)), (comfy_key, 1, (0, h))]


def flux2_names(key: str, config: dict) -> list:
    m = re.match(r"transformer_blocks\.(\d+)\.(.*)", key)
    if m:
        i, rest = m.groups()
        mod, suffix = rest.rsplit(".", 1)
        fused = {
            "attn.to_q": ("img_attn.qkv", 0),
            "attn.to_k": ("img_attn.qkv", 1),
            "attn.to_v": ("img_attn.qkv", 2),
            "attn.add_q_proj": ("txt_attn.qkv", 0),
            "attn.add_k_proj": ("txt_attn.qkv", 1),
            "attn.add_v_proj": ("txt_attn.qkv", 2),
        }
        if mod in fused:
            return [(f"double_blocks.{i}.{fused[mod][0]}.{suffix}", fused[mod][1], None)]
        rest = _sub(
            rest,
            [
                *QK_NORMS,
                ("attn.to_out.0", "img_attn.proj"),
                ("attn.to_add_out", "txt_attn.proj"),
                ("ff_context.linear_in", "txt_mlp.0"),
                ("ff_context.linear_out", "txt_mlp.2"),
                ("ff.linear_in", "img_mlp.0"),
                ("ff.linear_out", "img_mlp.2"),
            ],
        )
        return [(f"double_blocks.{i}.{rest}", 0, None)]
    m = re.match(r"single_transformer_blocks\.(\d+)\.(.*)", key)
    if m:
        i, rest = m.groups()
        rest = _sub(
            rest,
            [
                ("attn.to_qkv_mlp_proj", "linear1"),
                ("attn.to_out", "linear2"),
                ("attn.norm_q.weight", "norm.query_norm.scale"),
                ("attn.norm_k.weight", "norm.key_norm.scale"),
            ],
        )
        return [(f"single_blocks.{i}.{rest}", 0, None)]
    if key.startswith("norm_out.linear."):
        return _swapped("final_layer.adaLN_modulation.1." + key.rsplit(".", 1)[1], config)
    return [
        (
            _sub(
                key,
                [
                    ("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                    ("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                    ("time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                    ("time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
                    ("modulation_img.linear", "modulation_img.lin"),
                    ("modulation_txt.linear", "modulation_txt.lin"),
                    ("single_stream_modulation.linear", "single_stream_modulation.lin"),
                    ("context_embedder", "txt_in"),
                    ("x_embedder", "img_in"),
                    ("proj_out", "final_layer.linear"),
                ],
            ),
            0,
            None,
        )
    ]


def zimage_names(key: str, config: dict) -> list:
    m = re.match(r"(.*)\.attention\.to_([qkv])\.(\w+)$", key)
    if m:
        return [(f"{m.group(1)}.attention.qkv.{m.group(3)}", "qkv".index(m.group(2)), None)]
    return [
        (
            _sub(
                key,
                [
                    ("all_final_layer.2-1.", "final_layer."),
                    ("all_x_embedder.2-1.", "x_embedder."),
                    (".attention.to_out.0.", ".attention.out."),
                    (".attention.norm_k.", ".attention.k_norm."),
                    (".attention.norm_q.", ".attention.q_norm."),
                ],
            ),
            0,
            None,
        )
    ]


def wan_names(key: str, config: dict) -> list:
    key = re.sub(r"^scale_shift_table$", "head.modulation", key)
    key = re.sub(r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation", key)
    return [
        (
            _sub(
                key,
                [
                    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
                    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
                    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
                    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
                    ("condition_embedder.time_proj", "time_projection.1"),
                    ("attn2", "cross_attn"),
                    ("attn1", "self_attn"),
                    (".to_out.0.", ".o."),
                    (".to_q.", ".q."),
                    (".to_k.", ".k."),
                    (".to_v.", ".v."),
                    ("proj_out", "head.head"),
                    ("ffn.net.0.proj", "ffn.0"),
                    ("ffn.net.2", "ffn.2"),
                    ("norm2", "norm3"),
                ],
            ),
            0,
            None,
        )
    ]


def qwen_names(key: str, config: dict) -> list:
    return [(key, 0, None)]  # the identity converter: the file holds diffusers names (ComfyUI's prefix added)


# -- inputs -----------------------------------------------------------------------------------


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def flux1_inputs(c):
    g = _g(1)
    return dict(
        hidden_states=torch.randn(1, 16, c["in_channels"], generator=g).to(DTYPE),
        encoder_hidden_states=torch.randn(1, 8, c["joint_attention_dim"], generator=g).to(DTYPE),
        pooled_projections=torch.randn(1, c["pooled_projection_dim"], generator=g).to(DTYPE),
        timestep=torch.tensor([0.5]),
        img_ids=torch.randint(0, 4, (16, 3), generator=g).float(),
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )


def flux2_inputs(c):
    g = _g(1)
    return dict(
        hidden_states=torch.randn(1, 16, c["in_channels"], generator=g).to(DTYPE),
        encoder_hidden_states=torch.randn(1, 8, c["joint_attention_dim"], generator=g).to(DTYPE),
        timestep=torch.tensor([0.5]),
        img_ids=torch.randint(0, 4, (16, 4), generator=g).float(),
        txt_ids=torch.zeros(8, 4),
        guidance=torch.tensor([3.5]),
        return_dict=False,
    )


def zimage_inputs(c):
    g = _g(1)
    return dict(
        x=[torch.randn(c["in_channels"], 1, 8, 8, generator=g).to(DTYPE)],
        t=torch.tensor([0.5]),
        cap_feats=[torch.randn(8, c["cap_feat_dim"], generator=g).to(DTYPE)],
        return_dict=False,
    )


def wan_inputs(c):
    g = _g(1)
    return dict(
        hidden_states=torch.randn(1, c["in_channels"], 1, 8, 8, generator=g).to(DTYPE),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, c["text_dim"], generator=g).to(DTYPE),
        return_dict=False,
    )


def qwen_inputs(c):
    g = _g(1)
    return dict(
        hidden_states=torch.randn(1, 16, c["in_channels"], generator=g).to(DTYPE),
        encoder_hidden_states=torch.randn(1, 8, c["joint_attention_dim"], generator=g).to(DTYPE),
        encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
        timestep=torch.tensor([0.5]),
        img_shapes=[(1, 4, 4)],
        return_dict=False,
    )


@dataclass
class Case:
    cls: str
    config: dict
    names: object
    inputs: object
    formats: tuple = tuple(QUANT)
    exclude: tuple = ()
    prefix: str = "model.diffusion_model."
    extra: dict = field(default_factory=dict)


CASES = {
    # diffusers' Flux.1 converter hard-codes inner_dim 3072 and mlp_ratio 4 when it splits
    # single_blocks.N.linear1: one double and one single block at width 3072; only the layers the
    # converter splits or swaps (and one plain one) are quantized, which keeps the test quick
    "flux1": Case(
        "FluxTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=64,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=256,
            pooled_projection_dim=256,
            guidance_embeds=False,
            axes_dims_rope=(16, 56, 56),
        ),
        flux1_names,
        flux1_inputs,
        formats=("fp8", "int8", "w4a8", "nvfp4"),
        exclude=(r"^(?!.*(img_attn\.qkv|single_blocks\.0\.linear1|final_layer\.adaLN|txt_attn\.proj)).*",),
        # NVFP4 (a slow encoder) quantizes only the swapped adaLN (chunk + cat: the join whose
        # shared weight_scale_2 must match); Flux.2 covers W4A8's swap and every format's QKV chunk
        extra={"nvfp4": (r"^(?!final_layer\.adaLN).*",)},
        prefix="",
    ),
    "flux2": Case(
        "Flux2Transformer2DModel",
        dict(
            patch_size=1,
            in_channels=64,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=128,
            num_attention_heads=2,
            joint_attention_dim=256,
            timestep_guidance_channels=256,
            mlp_ratio=3.0,
            axes_dims_rope=(32, 32, 32, 32),
            guidance_embeds=True,
        ),
        flux2_names,
        flux2_inputs,
    ),
    "zimage": Case(
        "ZImageTransformer2DModel",
        dict(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=16,
            dim=256,
            n_layers=1,
            n_refiner_layers=1,
            n_heads=2,
            n_kv_heads=2,
            cap_feat_dim=256,
            axes_dims=[32, 48, 48],
            axes_lens=[64, 32, 32],
        ),
        # t_embedder stays dense as `--preset z-image` keeps it: Z-Image casts the timestep features
        # to t_embedder.mlp[0].weight.dtype, which for a quantized layer is the stored dtype
        # w6a8 keeps the 256x682 w2 dense (6-bit rows need K % 32 == 0): the loader sees a mix
        zimage_names,
        zimage_inputs,
        formats=tuple(QUANT),
        exclude=(r"pad_token", r"t_embedder"),
    ),
    "wan": Case(
        "WanTransformer3DModel",
        dict(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=256,
            freq_dim=256,
            ffn_dim=512,
            num_layers=1,
            rope_max_seq_len=64,
        ),
        wan_names,
        wan_inputs,
    ),
    "qwen": Case(
        "QwenImageTransformer2DModel",
        dict(
            patch_size=2,
            in_channels=64,
            out_channels=16,
            num_layers=1,
            attention_head_dim=128,
            num_attention_heads=2,
            joint_attention_dim=256,
            axes_dims_rope=(16, 56, 56),
        ),
        qwen_names,
        qwen_inputs,
    ),
}


# -- writing the ComfyUI-named file -----------------------------------------------------------


def comfy_state(case: Case, sd: dict) -> tuple[dict, dict]:
    """The file's tensors, and per diffusers module the (Comfy layer, [(rows of the Comfy
    layer)]) its weight comes from -- the test's own map, used for the reference too."""
    groups: dict[str, list] = {}
    for key, t in sd.items():
        for ckey, order, rows in case.names(key, case.config):
            groups.setdefault(ckey, []).append((order, key, rows, t))
    out, sources = {}, {}
    for ckey, parts in groups.items():
        parts.sort(key=lambda p: p[0])
        out[case.prefix + ckey] = torch.cat([t if rows is None else t[rows[0] : rows[1]] for _, _, rows, t in parts]).contiguous()
        start = 0
        for _, key, rows, t in parts:
            n = (rows[1] - rows[0]) if rows is not None else t.shape[0]
            if key.endswith(".weight"):
                mod = key[: -len(".weight")]
                sources.setdefault(mod, (case.prefix + ckey[: -len(".weight")], []))[1].append((start, start + n, rows))
            start += n
    return out, sources


def build_case(name: str, tmp_path_factory, cache: dict):
    if name in cache:
        return cache[name]
    case = CASES[name]
    cls = getattr(diffusers, case.cls)
    torch.manual_seed(0)
    model = cls.from_config(case.config).to(DTYPE).eval()
    with torch.no_grad():
        for p in model.parameters():  # random weights of a realistic spread (norm weights stay near 1)
            if p.dim() >= 2:
                p.normal_(0, 0.02)
            elif p.numel() > 1:
                p.copy_(torch.randn_like(p) * 0.05 + (1.0 if torch.all(p == 1) else 0.0))
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state, sources = comfy_state(case, sd)
    folder = tmp_path_factory.mktemp(name)
    dense = folder / "dense.safetensors"
    save_file(state, str(dense))
    # the inverse is right: diffusers' own converter gives back the model's state dict
    conv = SINGLE_FILE_LOADABLE_CLASSES[case.cls]["checkpoint_mapping_fn"]
    ck = {
        k[len("model.diffusion_model.") :] if k.startswith("model.diffusion_model.") else k: v
        for k, v in load_file(str(dense)).items()
    }
    back = conv(checkpoint=ck, config=case.config)
    assert set(back) == set(sd), set(back) ^ set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    (folder / "config").mkdir()
    (folder / "config" / "config.json").write_text(json.dumps(dict(case.config, _class_name=case.cls)))
    y_dense = run(model, case)
    cache[name] = (case, model, dense, sources, folder, y_dense)
    return cache[name]


def quantized_file(folder, dense, case: Case, fmt_key: str, **extra) -> str:
    fmt, params, _variant, _bound = QUANT[fmt_key]
    params = dict(params, **extra)
    out = folder / f"{fmt_key}{'_fpmm' if extra else ''}.safetensors"
    if not out.exists():
        exclude = list(case.extra.get(fmt_key, case.exclude))
        comfyquant.quantize(
            str(dense),
            str(out),
            format=fmt,
            params=params,
            exclude=exclude,
            preset="none",
            target="comfy-kitchen",
            progress=False,
        )
    return str(out)


# -- the reference: comfy-kitchen QuantizedTensor layers from the test's own splits -------------


def _rows_of(fmt: str, suffix: str, t: torch.Tensor, n: int, k: int, rows: list[tuple[int, int]]) -> torch.Tensor:
    """The tensor of a layer holding ``rows`` (in order) of the stored layer."""
    if suffix == "weight_codebook" or t.dim() == 0 or (fmt == "int8_tensorwise" and t.shape[0] != n):
        return t  # shared by every part
    if suffix == "weight_correction":  # (K // group, N): columns follow the rows
        return torch.cat([t[:, a:b] for a, b in rows], dim=1)
    if suffix == "weight_scale" and fmt in BLOCKED:
        cols = k // BLOCKED[fmt]
        plain = from_blocked(t, n, cols)
        part = torch.cat([plain[a:b] for a, b in rows])
        return to_blocked(part, flatten=False)
    return torch.cat([t[a:b] for a, b in rows])


class KitchenReference(torch.nn.Module):
    """What ComfyUI runs for one linear: comfy-kitchen's QuantizedTensor in the input's dtype."""

    def __init__(self, variant: str, fmt: str, stored: dict, marker: dict, bias, n: int, k: int) -> None:
        super().__init__()
        self.variant, self.fmt, self.stored, self.marker, self.n, self.k = variant, fmt, stored, marker, n, k
        self.bias = bias
        self.weight = stored["weight"]  # what model code reads (z-image reads mlp[0].weight.dtype)
        spec = kitchen_model.LAYOUTS[fmt]
        self.q = kitchen_model.build(spec, stored, FORMATS[fmt].params(marker), (n, k), DTYPE)

    def forward(self, x):
        x2 = x.reshape(-1, self.k)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.marker.get("full_precision_matrix_mult"):
            y = torch.nn.functional.linear(x2, self.q.to(x.dtype).dequantize(), bias)
        elif bias is None:
            y = (
                kitchen_linear(self.variant, self.q.to(x.dtype), self.stored, x2, torch.zeros(self.n, dtype=x.dtype))
                if self.fmt in BLOCKED
                else kitchen_linear(self.variant, self.q.to(x.dtype), self.stored, x2, None)
            )
        else:
            y = kitchen_linear(self.variant, self.q.to(x.dtype), self.stored, x2, bias)
        return y.reshape(*x.shape[:-1], self.n)


def reference_model(case: Case, dense_model, path: str, sources: dict, variant: str):
    """The dense model with every linear the file quantized replaced by a KitchenReference."""
    import copy

    ref = copy.deepcopy(dense_model)
    with safe_open(path, "pt") as f:
        stored_all = {k: f.get_tensor(k) for k in f.keys()}
    quantized = 0
    for mod, (layer, spans) in sources.items():
        marker_t = stored_all.get(f"{layer}.comfy_quant")
        if marker_t is None:
            continue
        marker = json.loads(bytes(marker_t.tolist()).decode())
        fmt = marker["format"]
        tensors = {
            k[len(layer) + 1 :]: v
            for k, v in stored_all.items()
            if k.startswith(layer + ".") and k[len(layer) + 1 :] not in ("comfy_quant", "bias")
        }
        n, k = stored_all[f"{layer}.weight"].shape[0], _model_k(ref, mod)
        # the diffusers tensor's rows in the stored layer's rows, in the diffusers order
        rows = [(a, b) for a, b, _within in spans]
        if len(spans) > 1:  # swapped halves: the diffusers tensor's first half is the file's second
            rows = [(a, b) for a, b, _within in sorted(spans, key=lambda s: s[2][0])]
        part = {s: _rows_of(fmt, s, t, n, k, rows) for s, t in tensors.items()}
        linear = ref.get_submodule(mod)
        out_n = sum(b - a for a, b in rows)
        layer_ref = KitchenReference(variant, fmt, part, marker, linear.bias, out_n, k)
        parent, _, leaf = mod.rpartition(".")
        setattr(ref.get_submodule(parent) if parent else ref, leaf, layer_ref)
        quantized += 1
    assert quantized, "the file has no quantized layer"
    return ref


def _model_k(model, mod: str) -> int:
    return model.get_submodule(mod).in_features


def run(model, case: Case) -> torch.Tensor:
    """The model's output on the case's inputs (Z-Image returns a list per sample)."""
    with torch.no_grad():
        y = model(**case.inputs(case.config))[0]
    return y[0] if isinstance(y, list) else y


def file_keys(path: str) -> set[str]:
    with safe_open(path, "pt") as f:
        return set(f.keys())


# -- the tests --------------------------------------------------------------------------------

PARAMS = [(c, f) for c in CASES for f in CASES[c].formats]


@pytest.fixture(scope="module")
def cache():
    """The built models of this module, their files removed when it ends (Flux.1 at its true
    width writes about 4.5 GB, which the rest of the run does not need)."""
    built: dict = {}
    yield built
    for entry in built.values():
        shutil.rmtree(entry[4], ignore_errors=True)


@pytest.mark.parametrize("case_name,fmt_key", PARAMS)
def test_load_is_exact_and_complete(tmp_path_factory, cache, case_name, fmt_key):
    case, dense_model, dense, sources, folder, y_dense = build_case(case_name, tmp_path_factory, cache)
    path = quantized_file(folder, dense, case, fmt_key)
    cls = getattr(diffusers, case.cls)
    config = dict(case.config) if case_name != "wan" else str(folder / "config")  # a dict and a local folder
    model = load_transformer(path, cls, config=config, torch_dtype=DTYPE)
    report = model.comfyquant_report
    assert report.ok, report.summary()
    assert set(report.loaded) == file_keys(path)  # every scale and marker consumed, nothing orphaned
    fmt = QUANT[fmt_key][0]
    markers = {k for k in file_keys(path) if k.endswith(".comfy_quant")}
    assert markers and all(v == fmt for v in report.quantized.values())
    quant_modules = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert quant_modules == set(report.quantized)
    # every quantized file layer lands on QuantLinears: one per diffusers module it maps to
    expected = {mod for mod, (layer, _) in sources.items() if f"{layer}.comfy_quant" in markers}
    assert quant_modules == expected
    assert not any(t.is_meta for t in model.state_dict().values())

    ref = reference_model(case, dense_model, path, sources, QUANT[fmt_key][2])
    y, y_ref = run(model, case), run(ref, case)
    assert y.dtype == y_ref.dtype and torch.equal(y, y_ref), (case_name, fmt_key, (y.float() - y_ref.float()).abs().max())
    rel = ((y.float() - y_dense.float()).norm() / y_dense.float().norm()).item()
    print(f"{case_name} {fmt_key}: relative output error against the dense model {rel:.4f}")
    assert rel < QUANT[fmt_key][3], rel


@pytest.mark.parametrize("case_name", ["flux2", "zimage"])
def test_weight_only_compute_matches_dequantized_from_single_file(tmp_path_factory, cache, case_name):
    """``full_precision_matrix_mult`` layers run the dequantized weight: the model equals the
    one diffusers' own ``from_single_file`` builds from ``comfyquant dequantize``'s output."""
    case, dense_model, dense, sources, folder, y_dense = build_case(case_name, tmp_path_factory, cache)
    path = quantized_file(folder, dense, case, "w4a8", full_precision_matrix_mult=True)
    deq = str(folder / "w4a8_fpmm.dequantized.safetensors")
    comfyquant.dequantize(path, deq, dtype="bf16", progress=False)
    cls = getattr(diffusers, case.cls)
    model = load_transformer(path, cls, config=str(folder / "config"), torch_dtype=DTYPE)
    assert all(isinstance(model.get_submodule(n), QuantLinear) for n in model.comfyquant_report.quantized)
    assert set(model.comfyquant_report.fallbacks) == set(model.comfyquant_report.quantized)
    # diffusers' Flux.2 converter does not strip ComfyUI's prefix itself (load_transformer does)
    save_file({k.removeprefix("model.diffusion_model."): v for k, v in load_file(deq).items()}, deq)
    plain = cls.from_single_file(deq, config=str(folder / "config"), torch_dtype=DTYPE)
    y, y_plain = run(model, case).float(), run(plain, case).float()
    assert torch.allclose(y, y_plain, rtol=2e-2, atol=2e-3 * y_plain.abs().max().item()), (y - y_plain).abs().max()


def test_forbidden_fuse_raises_naming_the_layer(tmp_path):
    """Parts quantized on their own (NVFP4: different weight_scale_2; W4A8: different
    codebooks) cannot become one layer: torch.cat raises, naming both layers."""
    from comfyquant import codecs

    for fmt, kw, differs in (
        ("nvfp4", {}, "weight_scale_2"),
        ("asym_w4a8_int8", {}, "weight_codebook"),
        ("float8_e4m3fn", {}, "weight_scale"),
    ):
        parts = []
        for i in range(2):
            enc = dict(codecs.get(fmt).encode(torch.randn(256, 256, generator=_g(i)).to(DTYPE) * (1 + i), **kw))
            marker = codecs.get(fmt).encode(torch.ones(16, 256, dtype=DTYPE), **kw).marker
            if differs == "weight_codebook" and i:
                enc["weight_codebook"] = enc["weight_codebook"].flip(0).neg()  # another codebook
            parts.append(ComfyQuantParameter.from_layer(enc, marker, f"blocks.{i}.attn.to_q", DTYPE))
        with pytest.raises(LoadError, match=rf"blocks\.0\.attn\.to_q.*blocks\.1\.attn\.to_q.*{differs} differs"):
            torch.cat(parts, dim=0)
        assert torch.equal(torch.cat([parts[0]] * 2).dequantize(), torch.cat([parts[0].dequantize()] * 2))


def test_inexact_operations_raise_naming_the_layer():
    from comfyquant import codecs

    enc = codecs.get("nvfp4").encode(torch.randn(384, 256, generator=_g()).to(DTYPE))
    p = ComfyQuantParameter.from_layer(dict(enc), enc.marker, "double_blocks.0.img_attn.qkv", DTYPE)
    for op, words in (
        (lambda: torch.chunk(p, 2, dim=1), "dim 1"),
        (lambda: p.T, "T is not"),
        (lambda: p * 2, "not an exact"),
        (lambda: torch.split(p, [64, 320]), "128-row tiles"),
        (lambda: p[:, :128], "only a row range"),
        (lambda: p.reshape(-1), "not an exact"),
    ):
        with pytest.raises(LoadError, match=r"double_blocks\.0\.img_attn\.qkv.*" + words):
            op()
    q, k, v = torch.chunk(p, 3, dim=0)
    assert [tuple(t.shape) for t in (q, k, v)] == [(128, 256)] * 3
    assert torch.equal(torch.cat([v, q]).dequantize(), torch.cat([p.dequantize()[256:], p.dequantize()[:128]]))


def test_bfl_dialect_file_loads_like_the_comfy_file(tmp_path_factory, cache, tmp_path):
    """A Flux.2 file in BFL's own NVFP4 layout (``comfyquant migrate --to bfl``: BFL's tensor
    names and scale layout, no Comfy markers) loads through its Comfy view: the same layers,
    bit-identical output.  (BFL's naming of the Flux blocks is what every case here writes.)"""
    case, dense_model, dense, sources, folder, y_dense = build_case("flux2", tmp_path_factory, cache)
    sd = load_file(quantized_file(folder, dense, case, "nvfp4"))
    for key in [k for k in sd if k.endswith(".comfy_quant")]:  # BFL's NVFP4 carries a static input scale
        sd[key[: -len("comfy_quant")] + "input_scale"] = torch.tensor(0.02, dtype=torch.float32)
    comfy = str(tmp_path / "comfy.safetensors")
    save_file(sd, comfy)
    bfl = str(tmp_path / "bfl.safetensors")
    comfyquant.migrate(comfy, bfl, to="bfl")
    assert not any(k.endswith(".comfy_quant") for k in file_keys(bfl)) and file_keys(bfl) != file_keys(comfy)
    cls = getattr(diffusers, case.cls)
    model = load_transformer(bfl, cls, config=dict(case.config), torch_dtype=DTYPE)
    base = load_transformer(comfy, cls, config=dict(case.config), torch_dtype=DTYPE)
    # the report names the tensors of the file's Comfy view: the Comfy file's names, all consumed
    assert model.comfyquant_report.ok and model.comfyquant_report.loaded == base.comfyquant_report.loaded
    assert set(base.comfyquant_report.loaded) == file_keys(comfy)
    assert model.comfyquant_report.quantized == base.comfyquant_report.quantized
    assert torch.equal(run(model, case), run(base, case))


def test_legacy_scaled_fp8_file_loads_like_its_comfy_migration(tmp_path_factory, cache, tmp_path):
    case, dense_model, dense, sources, folder, y_dense = build_case("flux2", tmp_path_factory, cache)
    comfy = quantized_file(folder, dense, case, "fp8")
    sd = load_file(comfy)
    legacy = {}
    for k, v in sd.items():
        if k.endswith(".comfy_quant"):
            continue
        if k.endswith(".weight_scale"):
            legacy[k[: -len("weight_scale")] + "scale_weight"] = v.reshape(1) if False else v
        else:
            legacy[k] = v
    legacy["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    path = tmp_path / "legacy.safetensors"
    save_file(legacy, str(path))
    cls = getattr(diffusers, case.cls)
    model = load_transformer(str(path), cls, config=dict(case.config), torch_dtype=DTYPE)
    base = load_transformer(comfy, cls, config=dict(case.config), torch_dtype=DTYPE)
    assert model.comfyquant_report.quantized == base.comfyquant_report.quantized
    assert torch.equal(run(model, case), run(base, case))


def test_unsupported_diffusers_version_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(diffusers, "__version__", "0.43.0")
    with pytest.raises(LoadError, match=r"supports diffusers 0\.42\.x, this is diffusers 0\.43\.0"):
        load_transformer(tmp_path / "missing.safetensors", "FluxTransformer2DModel")


def test_diffusers_missing_is_one_line(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "diffusers", None)
    with pytest.raises(LoadError, match=r"needs diffusers 0\.42\.x: pip install"):
        load_transformer(tmp_path / "x.safetensors", "FluxTransformer2DModel")


def test_no_config_and_no_cache_is_one_line(tmp_path_factory, cache, monkeypatch, tmp_path):
    case, dense_model, dense, sources, folder, y_dense = build_case("flux2", tmp_path_factory, cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(LoadError, match=r"cannot read diffusers' default config .* without network"):
        load_transformer(quantized_file(folder, dense, case, "fp8"), diffusers.Flux2Transformer2DModel)


def test_wrong_class_is_one_line(tmp_path_factory, cache):
    case, dense_model, dense, sources, folder, y_dense = build_case("wan", tmp_path_factory, cache)
    path = quantized_file(folder, dense, case, "fp8")
    with pytest.raises(LoadError, match=r"FluxTransformer2DModel converter failed .* is this a FluxTransformer2DModel"):
        load_transformer(path, "FluxTransformer2DModel", config=dict(CASES["flux1"].config))


def test_strict_names_dropped_keys_and_non_strict_loads_the_rest(tmp_path_factory, cache, tmp_path):
    """A tensor Flux.1's converter does not pop would be dropped silently by diffusers: here it
    is reported by its file name (strict refuses)."""
    case, dense_model, dense, sources, folder, y_dense = build_case("flux1", tmp_path_factory, cache)
    path = quantized_file(folder, dense, case, "fp8")
    sd = load_file(path)
    sd["double_blocks.0.img_attn.extra.weight"] = torch.zeros(4, 4, dtype=DTYPE)
    odd = tmp_path / "odd.safetensors"
    save_file(sd, str(odd))
    with pytest.raises(LoadError, match=r"1 unexpected key: double_blocks\.0\.img_attn\.extra\.weight"):
        load_transformer(str(odd), "FluxTransformer2DModel", config=dict(case.config))
    model = load_transformer(str(odd), "FluxTransformer2DModel", config=dict(case.config), strict=False)
    assert model.comfyquant_report.unexpected == ["double_blocks.0.img_attn.extra.weight"]


def test_qwen_image_needs_config(tmp_path_factory, cache):
    """diffusers cannot infer Qwen-Image's config from a file: the refusal says to pass config=."""
    case, dense_model, dense, sources, folder, y_dense = build_case("qwen", tmp_path_factory, cache)
    with pytest.raises(LoadError, match=r"pass config="):
        load_transformer(quantized_file(folder, dense, case, "fp8"), "QwenImageTransformer2DModel")


def test_padded_nvfp4_layer_keeps_the_model_rows():
    """An NVFP4 layer whose rows are padded to 16 in storage poses as the model's shape (read
    from its bias, as every reader does) and splits at the model's rows."""
    from comfyquant import codecs

    w = torch.randn(200, 256, generator=_g(3)).to(DTYPE)
    enc = codecs.get("nvfp4").encode(w)
    assert enc["weight"].shape[0] == 208  # stored rows padded to 16
    p = ComfyQuantParameter.from_layer(dict(enc), enc.marker, "proj", DTYPE, bias=torch.zeros(200, dtype=DTYPE))
    assert tuple(p.shape) == (200, 256)
    full = p.dequantize()
    assert torch.equal(
        full, codecs.get("nvfp4").decode(dict(enc, bias=torch.zeros(200, dtype=DTYPE)), enc.marker, dtype=DTYPE)[:200]
    )
    with pytest.raises(LoadError, match=r"proj.*128-row tiles"):
        torch.split(p, [100, 100])
