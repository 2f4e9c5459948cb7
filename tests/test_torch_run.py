"""``comfyquant.torch``: QuantLinear, load_quantized, quantize_ / save_quantized.

References are comfy-kitchen 0.2.40's own objects on CPU: ``QuantizedTensor.from_float`` of
the original dense weight (or, for formats without a quantizer, ``QuantizedTensor`` built from
random stored tensors) cast to the input's dtype as ComfyUI casts its weights, and the forward
ComfyUI runs with it (``test_codecs_vs_kitchen.kitchen_linear``: the activation quantized by
the layout for FP8, comfy-kitchen's own primitives for the NVFP4/MXFP8 GEMM it cannot run on
CPU).  Layers come from files written by comfy-kitchen (``kitchen_fixtures``) and by
``comfyquant quantize``, loaded through ``load_quantized`` into meta-device models.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.awq_w4a16 import TensorCoreAWQW4A16Layout
from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
from comfy_kitchen.tensor.svdquant_w4a4 import TensorCoreSVDQuantW4A4Layout
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import comfyquant
from comfyquant import codecs
from comfyquant.torch import LoadError, QuantLinear, QuantWeight, load_quantized, quantize_, save_quantized
from comfyquant.torch import kitchen as kitchen_model
from kitchen_fixtures import VARIANTS, make_layer, make_weight, same_bits, write_layers
from test_codecs_vs_kitchen import kitchen_linear, kitchen_qtensor, svdquant_tensors
from test_dialect_legacy import legacy_file

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
N, K = 48, 512

QUANTIZE_ARGS = {
    # kitchen_fixtures variant -> what `comfyquant quantize` is asked for to write the same layer
    "fp8": ("float8_e4m3fn", {}),
    "fp8_e5m2": ("float8_e5m2", {}),
    "int8_scalar": ("int8_tensorwise", {"convrot": False, "per_channel": False}),
    "int8_rowwise": ("int8_tensorwise", {"convrot": False}),
    "int8_convrot": ("int8_tensorwise", {"convrot_groupsize": 256}),
    "w4a8_codebook": ("asym_w4a8_int8", {"group_size": 16, "convrot_groupsize": 256}),
    "w4a8_uniform": ("asym_w4a8_int8", {"group_size": 16, "convrot_groupsize": 256, "codebook": False}),
    "w4a8_asym": ("asym_w4a8_int8", {"group_size": 16, "convrot_groupsize": 256, "codebook": False, "symmetric": False}),
    "w6a8": ("asym_w4a8_int8", {"group_size": 16, "convrot_groupsize": 256, "codebook": False, "bits": 6}),
    "w4a4": ("convrot_w4a4", {"convrot_groupsize": 256}),
    "w4a4_int8": ("convrot_w4a4", {"convrot_groupsize": 256, "linear_dtype": "int8"}),
    "nvfp4": ("nvfp4", {}),
    "mxfp8": ("mxfp8", {}),
}


def inputs(k: int, dtype: torch.dtype, seed: int = 1) -> list[torch.Tensor]:
    """Batch 1 and a batch of many rows with two leading dimensions."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, k, generator=g).to(dtype), torch.randn(3, 7, k, generator=g).to(dtype)]


def comfyui_forward(variant: str, q: QuantizedTensor, sd: dict, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What ComfyUI runs: weight and bias cast to the input's dtype (for a QuantizedTensor only
    its compute dtype changes), then the layout's forward on the 2-D input."""
    x2 = x.reshape(-1, x.shape[-1])
    y = kitchen_linear(variant, q.to(x.dtype), sd, x2, bias.to(x.dtype))
    return y.reshape(*x.shape[:-1], y.shape[-1])


class TwoLayers(nn.Module):
    def __init__(self, n: int = N, k: int = K) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleDict({"proj": nn.Linear(k, n)})])
        self.norm = nn.LayerNorm(k)


def meta_model(cls=TwoLayers, **kw) -> nn.Module:
    with torch.device("meta"):
        return cls(**kw)


# -- every format comfy-kitchen writes, from files written by comfy-kitchen -------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_bit_identical_to_kitchen_on_kitchen_files(tmp_path, variant):
    w = make_weight(N, K, torch.bfloat16, seed=3)
    q = kitchen_qtensor(variant, w)
    sd = q.state_dict("weight")
    layer = make_layer(variant, prefix="blocks.0.proj", n=N, k=K, marker="comfyui", seed=3)
    assert all(same_bits(layer.tensors[s], sd[s]) for s in sd)  # the layer is comfy-kitchen's own
    dense = {"norm.weight": torch.ones(K), "norm.bias": torch.zeros(K)}
    path = tmp_path / "m.safetensors"
    sd_file = {
        **{f"blocks.0.proj.{s}": t for s, t in layer.tensors.items()},
        "blocks.0.proj.comfy_quant": torch.tensor(list(json.dumps(layer.marker).encode()), dtype=torch.uint8),
        **dense,
    }
    save_file(sd_file, str(path))
    model = meta_model()
    report = load_quantized(model, path)
    ql = model.blocks[0]["proj"]
    assert isinstance(ql, QuantLinear) and ql.format == VARIANTS[variant].format
    assert report.ok and report.quantized == {"blocks.0.proj": ql.format}
    ref_sd = dict(sd, **({"input_scale": layer.tensors["input_scale"]} if "input_scale" in layer.tensors else {}))
    for dtype in DTYPES:
        for x in inputs(K, dtype):
            y = ql(x)
            ref = comfyui_forward(variant, q, ref_sd, x, layer.tensors["bias"])
            assert y.dtype == dtype and y.shape == (*x.shape[:-1], N)
            assert same_bits(y, ref), (variant, dtype, tuple(x.shape))
    assert same_bits(ql.dequantize(torch.bfloat16), q.dequantize())


# -- and from files written by `comfyquant quantize` ------------------------------------------


@pytest.mark.parametrize("variant", list(QUANTIZE_ARGS))
def test_forward_bit_identical_to_kitchen_on_quantize_output(tmp_path, variant):
    fmt, params = QUANTIZE_ARGS[variant]
    w = make_weight(N, K, torch.bfloat16, seed=5)
    bias = (torch.randn(N, generator=torch.Generator().manual_seed(6)) * 0.1).to(torch.bfloat16)
    dense = tmp_path / "dense.safetensors"
    save_file(
        {"blocks.0.proj.weight": w, "blocks.0.proj.bias": bias, "norm.weight": torch.ones(K), "norm.bias": torch.zeros(K)},
        str(dense),
    )
    out = tmp_path / "q.safetensors"
    comfyquant.quantize(str(dense), str(out), format=fmt, params=params, target="comfy-kitchen", progress=False)
    q = kitchen_qtensor(variant, w)
    sd = q.state_dict("weight")
    stored = load_file(str(out))
    for s in sd:  # comfy-kitchen's own tensors (a BF16 W4A8 correction is stored exactly upcast to F32)
        t = stored[f"blocks.0.proj.{s}"]
        assert same_bits(t, sd[s]) or (t.dtype == torch.float32 and same_bits(t, sd[s].float())), s

    model = meta_model()
    report = load_quantized(model, out)
    ql = model.blocks[0]["proj"]
    assert report.ok and isinstance(ql, QuantLinear)
    assert not any(t.is_meta for t in model.state_dict().values())
    for dtype in DTYPES:
        for x in inputs(K, dtype, seed=7):
            assert same_bits(ql(x), comfyui_forward(variant, q, sd, x, bias)), (variant, dtype, tuple(x.shape))


# -- weight-only and calibrated formats (no quantizer): random stored tensors ------------------


def _awq(dtype):
    g = torch.Generator().manual_seed(3)
    n, k, gs = 48, 256, 64
    t = {
        "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=g),
        "weight_scale": (torch.rand(k // gs, n, generator=g) * 0.01).to(dtype),
        "weight_zeros": (torch.randn(k // gs, n, generator=g) * 0.01).to(dtype),
    }
    p = TensorCoreAWQW4A16Layout.Params(
        scale=t["weight_scale"], orig_dtype=dtype, orig_shape=(n, k), zeros=t["weight_zeros"], group_size=gs
    )
    return t, {"format": "awq_w4a16", "group_size": gs}, QuantizedTensor(t["weight"], "TensorCoreAWQW4A16Layout", p)


def _svdquant(dtype):
    t = svdquant_tensors(dtype, 128, 256)
    p = TensorCoreSVDQuantW4A4Layout.Params(
        scale=t["weight_scale"],
        orig_dtype=dtype,
        orig_shape=(128, 256),
        proj_down=t["weight_proj_down"],
        proj_up=t["weight_proj_up"],
        smooth_factor=t["weight_smooth_factor"],
    )
    return t, {"format": "svdquant_w4a4"}, QuantizedTensor(t["weight"], "TensorCoreSVDQuantW4A4Layout", p)


@pytest.mark.parametrize("build", [_awq, _svdquant], ids=["awq_w4a16", "svdquant_w4a4"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_bit_identical_for_calibrated_formats(build, dtype):
    t, marker, q = build(dtype)
    n, k = q.shape
    bias = torch.randn(n, generator=torch.Generator().manual_seed(8)).to(dtype)
    ql = QuantLinear(QuantWeight(t, marker, "layer"), bias)
    for x in inputs(k, dtype):
        ref = F.linear(x.reshape(-1, k), q, bias).reshape(*x.shape[:-1], n)
        assert same_bits(ql(x), ref)
    assert ql.compute()[0] == "comfy-kitchen"


# -- without comfy-kitchen: the codecs ---------------------------------------------------------


@pytest.fixture
def no_kitchen(monkeypatch):
    """comfy-kitchen made unimportable for the code under test."""
    for name in [m for m in sys.modules if m == "comfy_kitchen" or m.startswith("comfy_kitchen.")]:
        monkeypatch.setitem(sys.modules, name, None)
    kitchen_model.available.cache_clear()
    yield
    kitchen_model.available.cache_clear()


def _kitchen_refs(variants):
    out = {}
    for v in variants:
        layer = make_layer(v, n=N, k=K, marker="comfyui", seed=11)
        t = dict(layer.tensors)
        bias = t.pop("bias")
        q = kitchen_qtensor(v, make_weight(N, K, torch.bfloat16, seed=11))
        refs = {(dt, i): comfyui_forward(v, q, t, x, bias) for dt in DTYPES for i, x in enumerate(inputs(K, dt, seed=12))}
        out[v] = (t, layer.marker, bias, refs)
    return out


REFS = {}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_without_kitchen_uses_the_codecs(variant, no_kitchen):
    t, marker, bias, refs = REFS[variant]
    with pytest.raises(ImportError):
        import comfy_kitchen.tensor  # noqa: F401
    ql = QuantLinear(QuantWeight(t, marker, "layer"), bias)
    path, why = ql.compute()
    assert path == ("dense" if marker.get("full_precision_matrix_mult") else "codec") and "not installed" in why
    for dt in DTYPES:
        for i, x in enumerate(inputs(K, dt, seed=12)):
            y = ql(x)
            expected = codecs.get(marker["format"]).linear(x, dict(t, bias=bias), marker, bias.to(dt))
            assert same_bits(y, expected)
            assert same_bits(y, refs[(dt, i)])  # the codecs are comfy-kitchen's arithmetic
    assert "compute=codec" in repr(ql)


@pytest.fixture(autouse=True, scope="module")
def _build_refs():
    REFS.update(_kitchen_refs(VARIANTS))
    yield


def test_full_precision_marker_runs_the_dequantized_weight():
    layer = make_layer("w4a8_codebook", n=N, k=K, marker="comfyui")
    t = dict(layer.tensors)
    bias = t.pop("bias")
    marker = dict(layer.marker, full_precision_matrix_mult=True)
    ql = QuantLinear(QuantWeight(t, marker, "l"), bias)
    assert ql.compute()[0] == "dense"
    x = inputs(K, torch.bfloat16)[1]
    assert same_bits(ql(x), F.linear(x, ql.dequantize(torch.bfloat16), bias))


def test_module_casts_keep_the_stored_tensors():
    layer = make_layer("fp8", n=N, k=K)
    t = dict(layer.tensors)
    bias = t.pop("bias")
    ql = QuantLinear(QuantWeight(t, layer.marker, "l"), bias)
    x = inputs(K, torch.float16)[1]
    before = ql(x)
    ql.to(torch.float16)
    assert ql.weight.dtype == torch.float8_e4m3fn and ql.weight_scale.dtype == torch.float32
    assert ql.bias.dtype == torch.float16
    assert same_bits(ql(x), before)  # ComfyUI casts the bias to the input dtype anyway
    assert "format=float8_e4m3fn" in ql.extra_repr() and "in_features=512" in ql.extra_repr()
    # a cast never converts a stored tensor, not even to throw the result away: the function
    # sees the stored tensors only as empty probes of their dtype
    seen: list[tuple] = []

    def cast(t):
        seen.append((t.dtype, t.numel()))
        return t.to(torch.bfloat16) if t.is_floating_point() else t

    ql._apply(cast)
    stored = {(b.dtype, b.numel()) for b in ql.buffers()}
    assert not [s for s in seen if s in stored and s[1] > 0], seen
    assert ql.weight.dtype == torch.float8_e4m3fn and ql.bias.dtype == torch.bfloat16


# -- load_quantized ---------------------------------------------------------------------------


class Block(nn.Module):
    """A transformer-like block: attention projections, an MLP, norms, an embedding."""

    def __init__(self, d: int = 256, hidden: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, d)
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 16.0, dim=-1) @ v
        h = h + self.proj(att)
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


def dense_block(tmp_path, prefix: str = "", dtype=torch.bfloat16) -> tuple[str, Block]:
    torch.manual_seed(0)
    model = Block().to(dtype)
    path = tmp_path / "dense.safetensors"
    save_file({prefix + k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path), model


@pytest.mark.parametrize("fmt", ["w4a8", "float8_e4m3fn", "nvfp4", "int8_tensorwise"])
def test_load_quantized_on_a_meta_model(tmp_path, fmt):
    dense, ref_model = dense_block(tmp_path, prefix="model.diffusion_model.")
    out = str(tmp_path / "q.safetensors")
    comfyquant.quantize(dense, out, format=fmt, progress=False)
    model = meta_model(Block)
    report = load_quantized(model, out, strip_prefix="model.diffusion_model.")
    assert report.ok and report.missing == [] and report.unexpected == []
    assert set(report.quantized) == {"qkv", "proj", "fc1", "fc2"}
    with safe_open(out, "pt") as f:
        assert sorted(report.loaded) == sorted(f.keys())  # every key, markers included
    assert isinstance(model.embed, nn.Embedding) and not model.embed.weight.is_meta
    assert not any(t.is_meta for t in model.state_dict().values())
    ids = torch.arange(12).reshape(2, 6)
    y, y_ref = model(ids), ref_model(ids)
    assert y.dtype == torch.bfloat16
    err = ((y.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
    assert 0 < err < 0.1, err
    if fmt == "nvfp4":  # no NVFP4 GEMM in comfy-kitchen on CPU: listed, with why
        assert set(report.fallbacks) == set(report.quantized)
        assert all("emulated" in why for why in report.fallbacks.values())
    else:
        assert report.fallbacks == {}


def test_load_quantized_dtype_and_non_meta_model(tmp_path):
    dense, _ = dense_block(tmp_path)
    out = str(tmp_path / "q.safetensors")
    comfyquant.quantize(dense, out, format="w4a8", progress=False)
    model = Block()  # real (F32) model: its tensors are replaced
    load_quantized(model, out, dtype=torch.float16)
    assert model.norm1.weight.dtype == torch.float16 and model.qkv.bias.dtype == torch.float16
    assert model.qkv.weight.dtype == torch.int8
    assert model(torch.arange(4)[None]).dtype == torch.float16


def test_strict_refuses_missing_and_unexpected_keys_by_name(tmp_path):
    dense, _ = dense_block(tmp_path)
    out = str(tmp_path / "q.safetensors")
    comfyquant.quantize(dense, out, format="w4a8", progress=False)
    sd = load_file(out)
    sd["extra.weight"] = torch.zeros(3)
    del sd["norm2.weight"]
    with safe_open(out, "pt") as f:
        meta = f.metadata()
    broken = str(tmp_path / "b.safetensors")
    save_file(sd, broken, metadata=meta)
    with pytest.raises(LoadError) as exc:
        load_quantized(meta_model(Block), broken)
    text = str(exc.value)
    assert "extra.weight" in text and "norm2.weight" in text and "\n" not in text
    model = meta_model(Block)
    report = load_quantized(model, broken, strict=False)
    assert report.unexpected == ["extra.weight"] and report.missing == ["norm2.weight"]
    assert model.norm2.weight.is_meta and not model.norm1.weight.is_meta
    assert isinstance(model.fc1, QuantLinear)


def test_shape_mismatch_is_refused_naming_the_layer(tmp_path):
    dense, _ = dense_block(tmp_path)
    out = str(tmp_path / "q.safetensors")
    comfyquant.quantize(dense, out, format="w4a8", progress=False)

    class Wider(Block):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(256, 1024)

    with pytest.raises(LoadError, match=r"'fc1'.*nn.Linear\(256, 1024\)"):
        load_quantized(meta_model(Wider), out)


def test_checkpoint_with_findings_is_refused_with_them(tmp_path):
    good = make_layer("w4a8_codebook", prefix="fc1", n=512, k=256, marker="comfyui")
    s_rel = good.tensors["weight_s_rel"]
    bad = good.with_tensor("weight_s_rel", s_rel[:, :-1].contiguous())  # one group scale short per row
    path = write_layers(tmp_path / "bad.safetensors", [bad])
    report = comfyquant.check(path, target="comfy-kitchen")
    errors = [f for f in report.findings if f.severity == "error"]
    assert errors
    with pytest.raises(LoadError) as exc:
        load_quantized(meta_model(Block), path, strict=False)
    text = str(exc.value)
    assert text.startswith(f"refusing to load {path}: ") and f"[{errors[0].code}]" in text and "fc1" in text
    assert "\n" not in text


def test_dialect_file_loads_through_its_comfy_view(tmp_path):
    path = tmp_path / "legacy.safetensors"
    sd = legacy_file(path, prefix="model.diffusion_model.", scale_input=0.5)

    class Legacy(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                [
                    nn.ModuleDict(
                        {"attn": nn.ModuleDict({"qkv": nn.Linear(256, 64)}), "mlp": nn.ModuleDict({"fc1": nn.Linear(256, 64)})}
                    )
                ]
            )
            self.final_layer = nn.ModuleDict({"linear": nn.Linear(256, 16, bias=False)})
            self.norm = nn.LayerNorm(256, bias=False)

    model = meta_model(Legacy)
    report = load_quantized(model, path, strip_prefix="model.diffusion_model.")
    assert report.ok and set(report.quantized) == {"blocks.0.attn.qkv", "blocks.0.mlp.fc1"}
    assert torch.equal(model.final_layer["linear"].weight, sd["model.diffusion_model.final_layer.linear.weight"])
    for name, s_x in (("blocks.0.attn.qkv", 0.5), ("blocks.0.mlp.fc1", 1.0)):
        raw = {s: sd[f"model.diffusion_model.{name}.{s}"] for s in ("weight", "scale_weight", "bias")}
        ql = model.get_submodule(name)
        for dtype in DTYPES:
            for x in inputs(256, dtype):
                # ComfyUI's legacy path: scale_weight is the FP8 layout's scale, scale_input the activation's
                w = QuantizedTensor(
                    raw["weight"],
                    "TensorCoreFP8Layout",
                    TensorCoreFP8Layout.Params(scale=raw["scale_weight"].float(), orig_dtype=dtype, orig_shape=(64, 256)),
                )
                xq, p = TensorCoreFP8Layout.quantize(x.reshape(-1, 256), scale=torch.tensor(s_x), dtype=torch.float8_e4m3fn)
                ref = F.linear(QuantizedTensor(xq, "TensorCoreFP8Layout", p), w, raw["bias"].to(dtype))
                assert same_bits(ql(x), ref.reshape(*x.shape[:-1], 64)), (name, dtype)


# -- quantize_ + save_quantized ---------------------------------------------------------------

TARGET = "comfyui,comfy-kitchen"
RULES = {
    "default": {"format": "w4a8", "group_size": 32},
    "rules": [{"match": "fc2", "format": "keep"}, {"match": "proj", "format": "float8_e4m3fn"}],
}


def test_quantize_save_check_load_round_trip(tmp_path):
    dense, model = dense_block(tmp_path)
    with pytest.raises(comfyquant.errors.InputError, match="sglang: Unsupported"):  # the command's own refusal
        quantize_(model, rules=RULES)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
    done = quantize_(model, rules=RULES, target=TARGET)
    assert isinstance(model.qkv, QuantLinear) and model.qkv.marker["group_size"] == 32
    assert isinstance(model.proj, QuantLinear) and model.proj.format == "float8_e4m3fn"
    assert type(model.fc2) is nn.Linear and "kept" in done["fc2"]
    ids = torch.arange(10).reshape(2, 5)
    y = model(ids)
    path = str(tmp_path / "saved.safetensors")
    assert save_quantized(model, path, target=TARGET) == path
    assert [f for f in comfyquant.check(path, target=TARGET).findings if f.severity == "error"] == []

    # the same rules through the command write the same tensors and markers
    rules_path = tmp_path / "rules.toml"
    rules_path.write_text(
        '[default]\nformat = "w4a8"\ngroup_size = 32\n[[rules]]\nmatch = "fc2"\nformat = "keep"\n'
        '[[rules]]\nmatch = "proj"\nformat = "float8_e4m3fn"\n'
    )
    cmd = str(tmp_path / "cmd.safetensors")
    comfyquant.quantize(dense, cmd, rules=str(rules_path), target=TARGET, progress=False)
    mine, theirs = load_file(path), load_file(cmd)
    assert sorted(mine) == sorted(theirs)
    assert all(same_bits(mine[k], theirs[k]) for k in mine)

    loaded = meta_model(Block)
    report = load_quantized(loaded, path)
    assert report.ok and set(report.quantized) == {"qkv", "proj", "fc1"}
    assert same_bits(loaded(ids), y)


def test_quantize_refuses_like_the_command():
    model = Block()
    with pytest.raises(comfyquant.errors.InputError, match="group_size"):
        quantize_(model, format="w4a8", group_size=7)
    with pytest.raises(comfyquant.errors.InputError, match="format= or rules="):
        quantize_(model)
    done = quantize_(model, format="nvfp4", exclude=["^fc"])
    assert isinstance(model.qkv, QuantLinear) and type(model.fc1) is nn.Linear and "excluded" in done["fc1"]


# -- memory -----------------------------------------------------------------------------------

PEAK_CHILD = r"""
import json, sys, torch
from torch import nn
import comfyquant.torch.load, comfyquant.torch.linear, comfyquant.formats.codec, comfy_kitchen.tensor
import comfyquant.checker.run, comfyquant.dialects.view, comfyquant.gate

def rss():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4096, 4096, dtype=torch.bfloat16) for _ in range(4)])

before = rss()["VmRSS"]
with torch.device("meta"):
    model = Stack()
report = comfyquant.torch.load_quantized(model, sys.argv[1])
assert len(report.quantized) == 4
print(json.dumps({"before": before, "peak": rss()["VmHWM"]}))
"""


def test_load_peak_memory_is_the_quantized_bytes_plus_a_layer(tmp_path):
    """The load holds the quantized bytes and one tensor in flight: never a dense copy of the
    model (4 layers of 4096x4096: BF16 128 MiB, the FP8 file 64 MiB)."""
    import os
    import subprocess

    torch.manual_seed(0)
    dense = {f"layers.{i}.weight": (torch.randn(4096, 4096) * 0.02).to(torch.bfloat16) for i in range(4)}
    dense.update({f"layers.{i}.bias": torch.zeros(4096, dtype=torch.bfloat16) for i in range(4)})
    src, out = str(tmp_path / "d.safetensors"), str(tmp_path / "q.safetensors")
    save_file(dense, src)
    del dense
    comfyquant.quantize(src, out, format="float8_e4m3fn", progress=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", PEAK_CHILD, out], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    m = json.loads(done.stdout.strip().splitlines()[-1])
    grown = m["peak"] - m["before"]
    layer_dense = 4096 * 4096 * 2
    assert grown <= os.path.getsize(out) + layer_dense + 48 * 2**20, grown / 2**20
