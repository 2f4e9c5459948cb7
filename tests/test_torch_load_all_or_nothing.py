"""``load_quantized`` into the models users have: all or nothing, markers checked, any input dtype.

* A model whose layers hold more than a weight and a bias (a ``Linear`` subclass with an extra
  parameter, an FP8-style ``Linear`` with a ``weight_scale`` buffer of its own, a submodule) is
  refused in one line naming the layer and the attribute, and left exactly as it was; a
  tensor never lands in a slot it does not belong to (a dense ``fc.weight_scale`` never
  overwrites a quantized layer's scale); a failure while reading leaves the model unchanged;
  hooks and training mode move to the ``QuantLinear``.
* Every marker field the loader reads, of the wrong JSON type, ends in one line naming the
  layer (``format`` a list, a number, null, an object; ``convrot_groupsize`` a list ...).
* Every quantized layer class runs BF16, F16 and F32 inputs, whatever dtype its scales are
  stored in, and gives the dense layer's result at that dtype within the format's tolerance.
* A bounded fuzz over generated user models and checkpoints (``user_models``; the long run is
  ``tools/fuzz_load_quantized.py``).
"""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from torch import nn

import comfyquant
from comfyquant.formats.registry import FORMATS
from comfyquant.torch import LoadError, QuantLinear, QuantWeight, load_quantized
from comfyquant.torch import kitchen as kitchen_model
from comfyquant.torch import load as load_module
from kitchen_fixtures import VARIANTS, make_layer, marker_tensor, write_layers
from test_codecs_vs_kitchen import svdquant_tensors
from user_models import (
    GatedLinear,
    LoraLinear,
    OwnFP8Linear,
    build_pool,
    judge,
    make_case,
    snapshot,
    unchanged,
)

K = 256
N = 32


class Model(nn.Module):
    def __init__(self, linear=nn.Linear, n: int = N) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleDict({"fc": linear(K, n)})])
        self.norm = nn.LayerNorm(K)


def fp8_file(tmp_path, extra: dict | None = None, name: str = "m.safetensors", prefix: str = "") -> str:
    layer = make_layer("fp8", prefix=prefix + "blocks.0.fc", n=N, k=K, marker="comfyui", seed=1)
    path = tmp_path / name
    sd = {f"{layer.prefix}.{s}": t.contiguous() for s, t in layer.tensors.items()}
    sd[f"{layer.prefix}.comfy_quant"] = marker_tensor(layer.marker)
    sd[prefix + "norm.weight"] = torch.randn(K)
    sd[prefix + "norm.bias"] = torch.randn(K)
    sd.update(extra or {})
    save_file(sd, str(path))
    return str(path)


def refused(model: nn.Module, path: str, **kw) -> str:
    before = snapshot(model)
    with pytest.raises(LoadError) as exc:
        load_quantized(model, path, **kw)
    assert unchanged(before, model) == []
    text = str(exc.value)
    assert "\n" not in text and path in text
    return text


# -- class 3: the model's own state in a swapped layer -------------------------------------------


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "real"])
def test_linear_subclass_with_an_extra_parameter_is_refused_naming_it(tmp_path, meta):
    path = fp8_file(tmp_path, {"blocks.0.fc.gate": torch.ones(1)})
    with torch.device("meta" if meta else "cpu"):
        model = Model(GatedLinear)
    text = refused(model, path, strict=False)
    assert "'blocks.0.fc'" in text and "parameter 'gate'" in text
    assert type(model.blocks[0]["fc"]) is GatedLinear


def test_fp8_style_linear_with_its_own_weight_scale_is_refused(tmp_path):
    # the file's layer scale is ~0.0002; a dense 1000.0 under a name that strips onto the
    # layer must never become the quantized layer's scale
    prefix = "model.diffusion_model."
    path = fp8_file(tmp_path, {"blocks.0.fc.weight_scale": torch.tensor(1000.0)}, prefix=prefix)
    model = Model(OwnFP8Linear)
    text = refused(model, path, strip_prefix=prefix, strict=False)
    assert "buffer 'weight_scale'" in text and "'blocks.0.fc'" in text
    assert model.blocks[0]["fc"].weight_scale.item() == 1000.0

    plain = Model()  # a plain Linear: the stray scale has nowhere to go, the layer keeps the file's
    report = load_quantized(plain, path, strip_prefix=prefix, strict=False)
    ql = plain.blocks[0]["fc"]
    stored = load_file(path)[prefix + "blocks.0.fc.weight_scale"]
    assert isinstance(ql, QuantLinear) and torch.equal(ql.weight_scale, stored) and stored.item() < 0.01
    assert report.unexpected == ["blocks.0.fc.weight_scale"]


def test_a_submodule_in_the_linear_is_refused(tmp_path):
    text = refused(Model(LoraLinear), fp8_file(tmp_path), strict=False)
    assert "submodule 'lora_down'" in text


def test_a_dense_tensor_into_a_replaced_module_is_refused(tmp_path):
    prefix = "model.diffusion_model."
    path = fp8_file(tmp_path, {"blocks.0.fc.bias": torch.full((N,), 1000.0)}, prefix=prefix)
    text = refused(Model(), path, strip_prefix=prefix, strict=False)
    assert "'blocks.0.fc.bias'" in text and "replaces" in text


def test_two_tensors_into_one_place_are_refused(tmp_path):
    prefix = "model.diffusion_model."
    path = fp8_file(tmp_path, {"norm.weight": torch.ones(K)}, prefix=prefix)
    text = refused(Model(), path, strip_prefix=prefix, strict=False)
    assert "'model.diffusion_model.norm.weight'" in text and "'norm.weight'" in text and "both load" in text


def test_wrong_kind_of_dtype_is_refused(tmp_path):
    path = fp8_file(tmp_path, {"norm.weight": torch.arange(K, dtype=torch.int32)})
    text = refused(Model(), path)
    assert "'norm.weight'" in text and "I32" in text


def test_a_read_failure_midway_leaves_the_model_unchanged(tmp_path, monkeypatch):
    path = fp8_file(tmp_path)
    model = Model()
    reads = []
    real = load_module.read_tensor

    def failing(ckpt, entry, *a, **kw):
        reads.append(entry.name)
        if entry.name == "norm.bias":  # after the quantized layer is built
            raise LoadError(f"{path}: file ended early while reading tensor 'norm.bias' (truncated?)")
        return real(ckpt, entry, *a, **kw)

    monkeypatch.setattr(load_module, "read_tensor", failing)
    refused(model, path)
    assert "blocks.0.fc.weight" in reads and type(model.blocks[0]["fc"]) is nn.Linear


def test_edits_are_undone_when_one_fails():
    from comfyquant.torch.edits import Edits

    class Locked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x = nn.Parameter(torch.zeros(1))
            self.locked = True

        def __setattr__(self, name, value):
            if name == "x" and self.__dict__.get("locked"):
                raise RuntimeError("locked")
            super().__setattr__(name, value)

    model = Model()
    model.extra = Locked()
    before = snapshot(model)
    edits = Edits()
    edits.set(model, "norm", nn.LayerNorm(K))
    edits.set(model.blocks[0]["fc"], "weight", nn.Parameter(torch.zeros(N, K)))
    edits.set(model.extra, "x", nn.Parameter(torch.ones(1)))
    with pytest.raises(RuntimeError, match="locked"):
        edits.apply()
    assert unchanged(before, model) == []


def test_hooks_and_training_mode_move_to_the_quantized_layer(tmp_path):
    path = fp8_file(tmp_path)
    model = Model().eval()
    seen = []
    handle = model.blocks[0]["fc"].register_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    report = load_quantized(model, path)
    ql = model.blocks[0]["fc"]
    assert isinstance(ql, QuantLinear) and not ql.training
    assert report.carried == {"blocks.0.fc": ["1 forward hook"]}
    ql(torch.randn(2, K))
    assert seen == ["QuantLinear"]
    handle.remove()
    ql(torch.randn(2, K))
    assert seen == ["QuantLinear"]


def test_a_bias_the_file_lacks_stays_the_models_own(tmp_path):
    layer = make_layer("fp8", prefix="blocks.0.fc", n=N, k=K, marker="comfyui", bias=False)
    path = write_layers(tmp_path / "nobias.safetensors", [layer])
    model = Model()
    model.norm = nn.Identity()
    own = model.blocks[0]["fc"].bias
    report = load_quantized(model, path, strict=False)
    assert report.missing == ["blocks.0.fc.bias"]
    assert model.blocks[0]["fc"].bias is own


def test_loading_again_into_quantized_layers_reports_nothing_missing(tmp_path):
    path = fp8_file(tmp_path)
    model = Model()
    load_quantized(model, path)
    first = model.blocks[0]["fc"]
    report = load_quantized(model, path)
    assert report.ok and isinstance(model.blocks[0]["fc"], QuantLinear) and model.blocks[0]["fc"] is not first


# -- class 4: marker fields of the wrong type ------------------------------------------------


@pytest.mark.parametrize("bad", [[1], 3, None, {"a": 1}, True, 2.5], ids=repr)
def test_a_marker_format_that_is_not_a_string_is_refused_naming_the_layer(tmp_path, bad):
    layer = make_layer("fp8", prefix="blocks.0.fc", n=N, k=K, marker="comfyui")
    path = write_layers(tmp_path / "bad.safetensors", [layer.with_marker({"format": bad})])
    text = refused(Model(), path, strict=False)
    assert "layer 'blocks.0.fc'" in text and "'format'" in text
    with pytest.raises(comfyquant.errors.ComfyQuantError):  # dequantize refuses the same file too
        comfyquant.dequantize(path, str(tmp_path / "out.safetensors"), progress=False)


def _field_cases():
    for variant in ("fp8", "int8_convrot", "w4a8_codebook", "w4a4", "nvfp4", "mxfp8"):
        fmt = FORMATS[VARIANTS[variant].format]
        for key in fmt.keys:
            if key.name == "format":
                continue
            wrong = [[16], None, {"a": 1}, "16" if int in key.types else 1]
            for bad in wrong:
                yield pytest.param(variant, key.name, bad, id=f"{variant}-{key.name}-{json.dumps(bad)}")


@pytest.mark.parametrize("variant,key,bad", list(_field_cases()))
def test_every_marker_field_of_the_wrong_type_is_refused_naming_the_layer(tmp_path, variant, key, bad):
    layer = make_layer(variant, prefix="blocks.0.fc", n=N, k=K, marker="comfyui")
    path = write_layers(tmp_path / "bad.safetensors", [layer.with_marker(dict(layer.marker, **{key: bad}))])
    model = Model(n=N)
    before = snapshot(model)
    try:
        load_quantized(model, path, strict=False)
    except LoadError as exc:
        text = str(exc)
        assert "\n" not in text and "blocks.0.fc" in text and unchanged(before, model) == []
        if not text.startswith("refusing to load"):  # not the checker's gate: the loader's own words
            assert f"'{key}'" in text and json.dumps(bad) in text
        return
    # loaded: only where the file's layout is a dialect whose Comfy view drops the key (the
    # ComfyUI-INT8-Fast layout's per_row), so nothing reads the wrong value
    ql = model.blocks[0]["fc"]
    assert isinstance(ql, QuantLinear) and key not in ql.marker
    assert any(f.code == "F001" for f in comfyquant.check(path).findings)


def test_quant_weight_refuses_a_wrong_typed_field_too():
    layer = make_layer("int8_convrot", n=N, k=K, marker="comfyui")
    t = {s: v for s, v in layer.tensors.items() if s != "bias"}
    with pytest.raises(
        comfyquant.errors.ComfyQuantError, match=r"^fc \(int8_tensorwise\): marker 'convrot_groupsize' is \[256\] \(a list\)"
    ):
        QuantWeight(t, dict(layer.marker, convrot_groupsize=[256]), "fc")


# -- class 5: every layer class runs every input dtype -----------------------------------------

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOLERANCE = {
    # relative error of the layer against the dense layer (dequantized weight, same input
    # dtype): the activation quantization of each format (FP8 E4M3 3 mantissa bits, E5M2 2,
    # INT8 rows, 4-bit activations) with a margin; AWQ quantizes no activation
    "float8_e4m3fn": 0.07,
    "float8_e5m2": 0.13,
    "int8_tensorwise": 0.025,
    "asym_w4a8_int8": 0.025,
    "convrot_w4a4": 0.25,
    "nvfp4": 0.25,
    "mxfp8": 0.07,
    "awq_w4a16": 0.01,
    "svdquant_w4a4": 0.25,
}


def _awq(dtype):
    g = torch.Generator().manual_seed(3)
    n, gs = 48, 64
    t = {
        "weight": torch.randint(-128, 128, (n, K // 2), dtype=torch.int8, generator=g),
        "weight_scale": (torch.rand(K // gs, n, generator=g) * 0.01).to(dtype),
        "weight_zeros": (torch.randn(K // gs, n, generator=g) * 0.01).to(dtype),
    }
    return t, {"format": "awq_w4a16", "group_size": gs}


def _layers():
    for stored in DTYPES:
        sname = str(stored).replace("torch.", "")
        for variant in VARIANTS:
            yield pytest.param(variant, stored, id=f"{variant}-{sname}")
        yield pytest.param("awq", stored, id=f"awq-{sname}")
        yield pytest.param("svdquant", stored, id=f"svdquant-{sname}")


def _layer(variant, stored):
    if variant == "awq":
        t, marker = _awq(stored)
        bias = torch.randn(48).to(stored) * 0.01
    elif variant == "svdquant":
        t, marker = svdquant_tensors(stored, 128, K), {"format": "svdquant_w4a4"}
        bias = torch.randn(128).to(stored) * 0.01
    else:
        layer = make_layer(variant, n=N, k=K, dtype=stored, marker="comfyui", seed=2)
        t = dict(layer.tensors)
        bias, marker = t.pop("bias"), layer.marker
    return QuantLinear(QuantWeight(t, marker, "layer"), bias), bias


def _check_every_input_dtype(ql, bias):
    g = torch.Generator().manual_seed(9)
    x32 = torch.randn(3, 5, K, generator=g)
    if "input_scale" in ql.suffixes:  # a static activation scale: inputs in its range
        x32 = x32 * float(ql.input_scale) * 100
    for dtype in DTYPES:
        x = x32.to(dtype)
        y = ql(x)
        assert y.dtype == dtype and y.shape == (3, 5, ql.out_features)
        dense = F.linear(x, ql.dequantize(dtype), bias.to(dtype))
        err = ((y.float() - dense.float()).norm() / dense.float().norm()).item()
        assert err < TOLERANCE[ql.format], (ql.format, dtype, err)


@pytest.mark.parametrize("variant,stored", list(_layers()))
def test_every_layer_class_runs_every_input_dtype(variant, stored):
    ql, bias = _layer(variant, stored)
    _check_every_input_dtype(ql, bias)


@pytest.fixture
def no_kitchen(monkeypatch):
    for name in [m for m in sys.modules if m == "comfy_kitchen" or m.startswith("comfy_kitchen.")]:
        monkeypatch.setitem(sys.modules, name, None)
    kitchen_model.available.cache_clear()
    yield
    kitchen_model.available.cache_clear()


@pytest.mark.parametrize("variant,stored", [p for p in _layers() if p.values[0] in ("awq", "svdquant", "fp8", "w4a8_codebook")])
def test_every_input_dtype_without_comfy_kitchen(variant, stored, no_kitchen):
    ql, bias = _layer(variant, stored)
    assert ql.compute()[0] == "codec"
    _check_every_input_dtype(ql, bias)


# -- the fuzz, bounded --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return build_pool(str(tmp_path_factory.mktemp("pool")), count=16, seed=1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzz_load_into_generated_user_models(pool, seed):
    case = make_case(pool, random.Random(seed))
    try:
        outcome, problems = judge(case)
    finally:
        for h in case.hooks:
            h.remove()
    assert problems == [], (outcome, problems)
