"""The whole model ComfyUI 0.33.0 builds from a file: detection, prefix, true sizes, orders.

Files are written by the tests (header and zero data: the verdicts read headers only); the
architecture descriptions themselves are compared with ComfyUI's own classes where its source
and Python can be had (``comfyui_architectures``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from builders import fp8_layer, int8_layer, w4a8_layer, write, zeros
from comfyquant import check, inspect
from comfyquant.architectures.registry import comfyui_prefix, resolve
from comfyquant.cli import main

HERE = Path(__file__).resolve().parent
H = 256  # two heads of 128 (the head size of both architectures)


def dense(name: str, k: int, n: int, bias: bool = True) -> dict:
    t = {f"{name}.weight": zeros("BF16", (n, k))}
    if bias:
        t[f"{name}.bias"] = zeros("BF16", (n,))
    return t


def flux_tensors(h: int = H, depth: int = 1, single: int = 1, prefix: str = "", skip: tuple = ()) -> dict:
    """The keys and shapes of a Flux checkpoint (ComfyUI 0.33.0 comfy/ldm/flux), dense BF16."""
    mlp = 4 * h
    t: dict = {}
    t |= dense("img_in", 64, h) | dense("time_in.in_layer", 256, h) | dense("time_in.out_layer", h, h)
    t |= dense("vector_in.in_layer", 32, h) | dense("vector_in.out_layer", h, h)
    t |= dense("guidance_in.in_layer", 256, h) | dense("guidance_in.out_layer", h, h) | dense("txt_in", 64, h)
    for i in range(depth):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}"
            t |= dense(f"{p}_mod.lin", h, 6 * h) | dense(f"{p}_attn.qkv", h, 3 * h) | dense(f"{p}_attn.proj", h, h)
            t |= dense(f"{p}_mlp.0", h, mlp) | dense(f"{p}_mlp.2", mlp, h)
            t[f"{p}_attn.norm.query_norm.scale"] = zeros("BF16", (128,))
            t[f"{p}_attn.norm.key_norm.scale"] = zeros("BF16", (128,))
    for i in range(single):
        p = f"single_blocks.{i}"
        t |= dense(f"{p}.linear1", h, 3 * h + mlp) | dense(f"{p}.linear2", h + mlp, h) | dense(f"{p}.modulation.lin", h, 3 * h)
        t[f"{p}.norm.query_norm.scale"] = zeros("BF16", (128,))
        t[f"{p}.norm.key_norm.scale"] = zeros("BF16", (128,))
    t |= dense("final_layer.linear", h, 64) | dense("final_layer.adaLN_modulation.1", h, 2 * h)
    return {prefix + k: v for k, v in t.items() if not any(k.startswith(s) for s in skip)}


def wan_tensors(d: int = H, ffn: int = 256, layers: int = 1, i2v: bool = False, in_dim: int | None = None) -> dict:
    """The keys and shapes of a Wan 2.1 checkpoint (ComfyUI 0.33.0 comfy/ldm/wan/model.py)."""
    in_dim = in_dim if in_dim is not None else (36 if i2v else 16)
    t: dict = {"patch_embedding.weight": zeros("BF16", (d, in_dim, 1, 2, 2)), "patch_embedding.bias": zeros("BF16", (d,))}
    t |= dense("text_embedding.0", 4096, d) | dense("text_embedding.2", d, d)
    t |= dense("time_embedding.0", 256, d) | dense("time_embedding.2", d, d) | dense("time_projection.1", d, 6 * d)
    for i in range(layers):
        p = f"blocks.{i}"
        t[f"{p}.modulation"] = zeros("BF16", (1, 6, d))
        for a in ("self_attn", "cross_attn"):
            for x in ("q", "k", "v", "o"):
                t |= dense(f"{p}.{a}.{x}", d, d)
            t[f"{p}.{a}.norm_q.weight"] = zeros("BF16", (d,))
            t[f"{p}.{a}.norm_k.weight"] = zeros("BF16", (d,))
        if i2v:
            t |= dense(f"{p}.cross_attn.k_img", d, d) | dense(f"{p}.cross_attn.v_img", d, d)
            t[f"{p}.cross_attn.norm_k_img.weight"] = zeros("BF16", (d,))
        t[f"{p}.norm3.weight"] = zeros("BF16", (d,))
        t[f"{p}.norm3.bias"] = zeros("BF16", (d,))
        t |= dense(f"{p}.ffn.0", d, ffn) | dense(f"{p}.ffn.2", ffn, d)
    t["head.modulation"] = zeros("BF16", (1, 2, d))
    t |= dense("head.head", d, 64)
    if i2v:
        t["img_emb.proj.0.weight"] = zeros("BF16", (1280,))
        t["img_emb.proj.0.bias"] = zeros("BF16", (1280,))
        t |= dense("img_emb.proj.1", 1280, 1280) | dense("img_emb.proj.3", 1280, d)
        t["img_emb.proj.4.weight"] = zeros("BF16", (d,))
        t["img_emb.proj.4.bias"] = zeros("BF16", (d,))
    return t


def quantized(t: dict, layers: dict) -> dict:
    """``t`` with each of ``layers`` (name -> builder) replaced by the builder's tensors at its size."""
    out = dict(t)
    for name, build in layers.items():
        n, k = t[f"{name}.weight"][1]
        for suffix in ("weight", "bias"):
            out.pop(f"{name}.{suffix}", None)
        out |= build(name, n=n, k=k)
        if f"{name}.bias" in t:
            out[f"{name}.bias"] = t[f"{name}.bias"]
    return out


def comfyui(path) -> dict:
    return check(str(path), target="comfyui").verdicts["comfyui"].to_dict()


def shapes(t: dict) -> dict:
    return {k: v[1] for k, v in t.items()}


# -- detection --------------------------------------------------------------------------------


def test_flux_is_detected_from_the_header_with_its_dimensions(tmp_path):
    v = comfyui(write(tmp_path / "flux.safetensors", flux_tensors(depth=2, single=3)))
    assert v["loads"]
    arch = v["architecture"]
    assert (arch["name"], arch["model_class"], arch["prefix"]) == ("flux", "Flux", "")
    dims = arch["dims"]
    assert (dims["hidden_size"], dims["num_heads"], dims["in_channels"], dims["context_in_dim"]) == (H, 2, 16, 64)
    assert (dims["depth"], dims["depth_single_blocks"], dims["vec_in_dim"], dims["guidance_embed"]) == (2, 3, 32, True)
    assert arch["read"] == {"img_in.weight": [H, 64], "txt_in.weight": [H, 64], "vector_in.in_layer.weight": [H, 32]}


def test_wan_t2v_and_i2v_are_detected(tmp_path):
    t2v = comfyui(write(tmp_path / "t2v.safetensors", wan_tensors(layers=2)))["architecture"]
    assert (t2v["name"], t2v["model_class"], t2v["dims"]["model_type"]) == ("wan2.1", "WAN21_T2V", "t2v")
    assert (t2v["dims"]["dim"], t2v["dims"]["ffn_dim"], t2v["dims"]["num_layers"], t2v["dims"]["out_dim"]) == (H, 256, 2, 16)
    i2v = comfyui(write(tmp_path / "i2v.safetensors", wan_tensors(i2v=True)))["architecture"]
    assert (i2v["model_class"], i2v["dims"]["model_type"], i2v["dims"]["in_dim"]) == ("WAN21_I2V", "i2v", 36)


def test_prefix_is_the_one_more_than_five_keys_carry():
    names = [f"model.diffusion_model.k{i}" for i in range(6)] + [f"net.k{i}" for i in range(5)]
    assert comfyui_prefix(names) == "model.diffusion_model."
    assert comfyui_prefix(names[:5] + names[6:]) == "model."
    res = resolve(shapes(flux_tensors(prefix="model.diffusion_model.")), quantized=False)
    assert res.prefix == "model.diffusion_model." and res.detected is not None and not res.dropped


def test_foreign_prefix_ends_in_comfyuis_detection_error(tmp_path):
    path = write(tmp_path / "flux.safetensors", flux_tensors(prefix="transformer."))
    v = comfyui(path)
    assert (v["exception"], v["error"]) == ("RuntimeError", f"ERROR: Could not detect model type of: {path}\n")
    assert v["architecture"]["name"] is None and v["architecture"]["resembles"] == "flux"
    lora = write(tmp_path / "my_lora.safetensors", flux_tensors(prefix="transformer."))
    assert comfyui(lora)["error"].endswith(
        "\n\nHINT: This seems to be a Lora file and Lora files should be put in the lora folder and loaded with a lora loader node.."
    )


def test_prefix_on_one_block_only_drops_the_rest_and_fails_detection(tmp_path):
    t = flux_tensors()
    t = {("model.diffusion_model." + k if k.startswith("double_blocks.0.") else k): v for k, v in t.items()}
    v = comfyui(write(tmp_path / "flux.safetensors", t))
    assert v["exception"] == "RuntimeError" and v["error"].startswith("ERROR: Could not detect model type of: ")


def test_an_earlier_check_wins(tmp_path):
    t = flux_tensors() | {"joint_blocks.0.context_block.attn.qkv.weight": zeros("BF16", (3 * H, H))}
    arch = comfyui(write(tmp_path / "f.safetensors", t))["architecture"]
    assert arch["name"] == "mmdit" and not arch["modelled"]


def test_unknown_architecture_keeps_the_per_layer_reading(tmp_path, capsys):
    path = write(tmp_path / "one.safetensors", int8_layer("blocks.0", n=32, k=256))
    v = comfyui(path)
    assert v["loads"]
    assert v["architecture"]["note"] == "architecture not recognised: layers judged at the sizes the file records"
    assert main(["check", path, "--target", "comfyui"]) == 0
    assert "architecture: architecture not recognised" in capsys.readouterr().out


def test_wan_detection_reads_keys_without_testing_for_them(tmp_path):
    t = {k: v for k, v in wan_tensors().items() if not k.startswith("head.head.")}
    v = comfyui(write(tmp_path / "w.safetensors", t))
    assert (v["exception"], v["error"]) == ("KeyError", "'head.head.weight'")


def test_wan_i2v_of_another_input_width_matches_no_model_class(tmp_path):
    t = wan_tensors(i2v=True, in_dim=20)
    v = comfyui(write(tmp_path / "dense.safetensors", t))
    assert v["exception"] == "RuntimeError" and v["error"].startswith("ERROR: Could not detect model type of: ")
    q = quantized(t, {"blocks.0.ffn.0": int8_layer})
    v = comfyui(write(tmp_path / "q.safetensors", q))
    assert (v["exception"], v["error"]) == ("AttributeError", "'NoneType' object has no attribute 'quant_config'")


# -- the model's true sizes, missing tensors and markers --------------------------------------


def test_missing_bias_is_undefined_output(tmp_path):
    t = quantized(flux_tensors(), {"double_blocks.0.img_attn.qkv": int8_layer})
    del t["double_blocks.0.img_attn.proj.bias"]
    v = comfyui(write(tmp_path / "f.safetensors", t))
    assert not v["loads"] and v["exception"] is None and v["rule"] == "comfyui.missing"
    assert v["error"].startswith("unet missing: ['double_blocks.0.img_attn.proj.bias']")
    assert "undefined output" in v["error"]


def test_missing_weight_of_a_quantized_model_fails_its_forward(tmp_path):
    t = quantized(flux_tensors(), {"double_blocks.0.img_attn.qkv": int8_layer})
    del t["single_blocks.0.linear2.weight"]
    v = comfyui(write(tmp_path / "f.safetensors", t))
    assert (v["exception"], v["error"], v["layer"]) == (
        "AttributeError",
        "'NoneType' object has no attribute 'device'",
        "single_blocks.0.linear2",
    )


def test_every_marker_gone_fails_at_load_in_registration_order(tmp_path):
    layers = {"double_blocks.0.img_attn.qkv": w4a8_layer, "double_blocks.0.img_mod.lin": w4a8_layer}
    t = quantized(flux_tensors(), {k: lambda p, n, k, b=b: b(p, n=n, k=k, marker=False) for k, b in layers.items()})
    v = comfyui(write(tmp_path / "f.safetensors", t))
    assert v["exception"] == "RuntimeError"
    lines = v["error"].split("\n\t")
    assert lines == [
        f"size mismatch for double_blocks.0.img_mod.lin.weight: copying a param with shape torch.Size([{6 * H}, {H // 2}]) "
        f"from checkpoint, the shape in current model is torch.Size([{6 * H}, {H}]).",
        f"size mismatch for double_blocks.0.img_attn.qkv.weight: copying a param with shape torch.Size([{3 * H}, {H // 2}]) "
        f"from checkpoint, the shape in current model is torch.Size([{3 * H}, {H}]).",
    ]


def test_one_marker_gone_fails_the_first_forward_in_execution_order(tmp_path):
    t = quantized(
        flux_tensors(),
        {
            "double_blocks.0.img_attn.qkv": lambda p, n, k: w4a8_layer(p, n=n, k=k, marker=False),
            "double_blocks.0.txt_mod.lin": lambda p, n, k: w4a8_layer(p, n=n, k=k, marker=False),
            "double_blocks.0.img_attn.proj": w4a8_layer,
        },
    )
    v = comfyui(write(tmp_path / "f.safetensors", t))
    # by name img_attn.qkv sorts first; the model runs txt_mod.lin before it
    assert (v["exception"], v["layer"]) == ("RuntimeError", "double_blocks.0.txt_mod.lin")
    assert v["error"].startswith("mat1 and mat2 shapes cannot be multiplied (") and v["error"].endswith(
        f"x{H} and {H // 2}x{6 * H})"
    )


def test_bias_is_checked_against_the_models_size(tmp_path):
    t = quantized(flux_tensors(), {"double_blocks.0.img_attn.proj": int8_layer})
    t["double_blocks.0.img_attn.proj.weight"] = zeros("I8", (H + 1, H))
    t["double_blocks.0.img_attn.proj.weight_scale"] = zeros("F32", (H + 1, 1))
    t["double_blocks.0.img_attn.proj.bias"] = zeros("BF16", (H + 1,))
    v = comfyui(write(tmp_path / "f.safetensors", t))
    assert v["error"].startswith(
        f"size mismatch for double_blocks.0.img_attn.proj.bias: copying a param with shape torch.Size([{H + 1}]) "
        f"from checkpoint, the shape in current model is torch.Size([{H}])."
    )


def test_quantized_layer_outside_the_prefix_is_dropped(tmp_path):
    t = quantized(flux_tensors(), {"single_blocks.0.linear1": int8_layer, "single_blocks.0.linear2": int8_layer})
    t = {(k if k.startswith("single_blocks.0.linear1.") else "model.diffusion_model." + k): v for k, v in t.items()}
    path = write(tmp_path / "f.safetensors", t)
    v = comfyui(path)
    assert any("single_blocks.0.linear1' lies outside the prefix 'model.diffusion_model.'" in w for w in v["warnings"])
    assert v["architecture"]["dropped"] == 4  # weight, weight_scale, marker, bias
    # a quantized model: the layer it builds there has no weight, and its forward fails
    assert (v["error"], v["layer"]) == (
        "'NoneType' object has no attribute 'device'",
        "model.diffusion_model.single_blocks.0.linear1",
    )
    # with no other marked layer the model is a plain one: the layer runs uninitialised
    plain = {k: v for k, v in t.items() if not k.startswith("model.diffusion_model.single_blocks.0.linear2")}
    plain |= {"model.diffusion_model." + k: v for k, v in dense("single_blocks.0.linear2", H + 4 * H, H).items()}
    v = comfyui(write(tmp_path / "plain.safetensors", plain))
    assert v["rule"] == "comfyui.missing" and "'single_blocks.0.linear1.weight'" in v["error"]


def test_markers_and_dense_files_that_fit_still_load(tmp_path):
    t = quantized(wan_tensors(), {"blocks.0.self_attn.q": int8_layer, "blocks.0.ffn.2": w4a8_layer})
    v = comfyui(write(tmp_path / "w.safetensors", t))
    assert v["loads"], v["error"]
    assert comfyui(write(tmp_path / "d.safetensors", flux_tensors(prefix="model.diffusion_model.")))["loads"]


def test_check_and_inspect_show_the_architecture(tmp_path, capsys):
    path = write(tmp_path / "w.safetensors", quantized(wan_tensors(), {"blocks.0.self_attn.q": int8_layer}))
    assert main(["check", path, "--target", "comfyui"]) == 0
    out = capsys.readouterr().out
    assert "architecture: wan2.1 as WAN21_T2V (dim 256, out_dim 16, num_heads 2, ffn_dim 256, num_layers 1" in out
    assert main(["check", path, "--target", "comfyui", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"]["comfyui"]["architecture"]["name"] == "wan2.1"
    inv = inspect(path)
    assert inv.architecture["name"] == "wan2.1"
    assert main(["inspect", path]) == 0
    assert "ComfyUI architecture: wan2.1 as WAN21_T2V" in capsys.readouterr().out


# -- the descriptions against ComfyUI's own classes -------------------------------------------


@pytest.fixture(scope="module")
def comfyui_models(tmp_path_factory):
    import comfyui_env
    import runtime_sources

    python = comfyui_env.comfyui_python()
    if python is None:
        pytest.skip(comfyui_env.MISSING)
    source = runtime_sources.comfyui_source()
    if source is None:
        pytest.skip("ComfyUI's source cannot be had here")
    out = tmp_path_factory.mktemp("arch") / "models.json"
    subprocess.run([str(python), str(HERE / "comfyui_architectures.py"), str(source), str(out)], check=True, capture_output=True)
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["flux", "wan_t2v", "wan_i2v"])
def test_descriptions_are_comfyuis_models(comfyui_models, name):
    real = comfyui_models[name]
    res = resolve({k: tuple(s) for k, s in real["stored"]}, quantized=False)
    d = res.detected
    assert d is not None and d.model is not None
    assert d.model_class == real["model_class"]
    assert {k: v for k, v in d.dims.items() if k in real["config"]} == {k: v for k, v in real["config"].items() if k in d.dims}
    # every parameter at its true size, in the order load_state_dict visits them
    assert [[p.name, list(p.shape)] for p in d.model.params] == real["state_dict"]
    # every Linear in the order the first forward runs it
    assert d.model.execution == real["execution"]


def test_a_norm_of_another_size_fails_at_load_under_the_models_name(tmp_path):
    t = flux_tensors()
    t["double_blocks.0.img_attn.norm.key_norm.scale"] = zeros("BF16", (H,))  # the head size is 128
    v = comfyui(write(tmp_path / "f.safetensors", t))
    assert (v["exception"], v["error"]) == (
        "RuntimeError",
        f"size mismatch for double_blocks.0.img_attn.norm.key_norm.weight: copying a param with shape torch.Size([{H}]) "
        "from checkpoint, the shape in current model is torch.Size([128]).",
    )


def _asym(p, n, k):
    return w4a8_layer(p, n=n, k=k, correction=zeros("F32", (k // 16, n)))


def test_dropped_w4a8_correction_is_garbage_through_a_whole_model(tmp_path):
    flux = comfyui(write(tmp_path / "f.safetensors", quantized(flux_tensors(), {"double_blocks.0.img_attn.qkv": _asym})))
    assert (flux["loads"], flux["exception"], flux["layer"]) == (False, None, "double_blocks.0.img_attn.qkv")
    assert "ComfyUI does not load weight_correction" in flux["error"] and "output is garbage" in flux["error"]
    wan = comfyui(write(tmp_path / "w.safetensors", quantized(wan_tensors(), {"blocks.0.ffn.0": _asym})))
    assert (wan["loads"], wan["exception"], wan["layer"]) == (False, None, "blocks.0.ffn.0")


L = "double_blocks.0.img_attn.proj"


def _int8(p, n, k):
    return int8_layer(p, n=n, k=k, marker={"format": "int8_tensorwise"})


@pytest.mark.parametrize(
    "build, n, k, expected",
    [
        # FP8, NVFP4 and MXFP8 are dequantized on CPU and cut to the model's size
        ("fp8", H, H + 64, None),
        ("fp8", H + 64, H, None),
        ("nvfp4", H, H + 64, None),
        ("mxfp8", H, H + 64, None),
        ("fp8", H, H - 64, ("RuntimeError", f"mat1 and mat2 shapes cannot be multiplied (Mx{H} and {H - 64}x{H})")),
        ("int8", H, H + 64, ("ValueError", f"Input and weight inner dimensions must match, got {H} and {H + 64}")),
        (
            "int8",
            H + 64,
            H,
            (
                "RuntimeError",
                f"The size of tensor a ({H + 64}) must match the size of tensor b ({H}) at non-singleton dimension 1",
            ),
        ),
        ("w4a8", H + 64, H, ("ValueError", f"scale must have shape ({H}, {H // 16}), got ({H + 64}, {H // 16})")),
        ("w4a8", H, 2 * H, ("ValueError", f"scale must have shape ({H}, {H // 16}), got ({H}, {H // 8})")),
    ],
)
def test_a_quantized_weight_meets_the_models_size(tmp_path, build, n, k, expected):
    from builders import fp8_layer, mxfp8_layer, nvfp4_layer

    builders = {"fp8": fp8_layer, "nvfp4": nvfp4_layer, "mxfp8": mxfp8_layer, "int8": _int8, "w4a8": w4a8_layer}
    t = quantized(flux_tensors(), {"double_blocks.0.img_attn.qkv": int8_layer})
    del t[f"{L}.weight"]
    t |= builders[build](L, n=n, k=k)
    t[f"{L}.bias"] = zeros("BF16", (H,))  # the model's size
    v = comfyui(write(tmp_path / "f.safetensors", t))
    if expected is None:
        assert v["loads"], v["error"]
    else:
        assert (v["exception"], v["error"], v["layer"]) == (*expected, L)


def test_detection_reads_a_packed_weight_and_builds_the_layer_narrower(tmp_path):
    from builders import nvfp4_layer

    # img_in's columns are read as 4x the input channels: a packed NVFP4 weight halves them
    nv = comfyui(write(tmp_path / "nv.safetensors", quantized(flux_tensors(), {"img_in": nvfp4_layer})))
    assert nv["architecture"]["dims"]["in_channels"] == 8
    assert (nv["exception"], nv["error"], nv["layer"]) == (
        "RuntimeError",
        f"mat1 and mat2 shapes cannot be multiplied (Mx64 and 32x{H})",
        "img_in",
    )
    w = comfyui(write(tmp_path / "w.safetensors", quantized(flux_tensors(), {"img_in": w4a8_layer})))
    assert (w["exception"], w["layer"]) == ("ValueError", "img_in")
    assert w["error"].startswith("K=32 must be divisible by 16, group_size=16, and convrot_groupsize=256")


@pytest.mark.parametrize("marked", [1, 6])
def test_a_header_map_prefixed_where_the_keys_are_not_fails_detection(tmp_path, marked):
    """ComfyUI adds the header map's markers as keys under the names the map gives them before
    it picks the prefix: names under ``model.diffusion_model.`` (or any ``model.`` name, the
    default prefix) over bare tensor names leave only the markers after stripping, and
    detection finds no model, however few layers the map names."""
    names = [
        f"double_blocks.0.{m}" for m in ("img_mod.lin", "img_attn.qkv", "img_attn.proj", "img_mlp.0", "img_mlp.2", "txt_mod.lin")
    ]
    t = quantized(flux_tensors(), {name: fp8_layer for name in names[:marked]})
    t = {k: v for k, v in t.items() if not k.endswith(".comfy_quant")}
    layers = {f"model.diffusion_model.{name}": {"format": "float8_e4m3fn"} for name in names[:marked]}
    meta = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    path = write(tmp_path / "flux.safetensors", t, metadata=meta)
    v = comfyui(path)
    assert (v["exception"], v["error"]) == ("RuntimeError", f"ERROR: Could not detect model type of: {path}\n")
    # the same map named as the keys loads
    bare = {
        "_quantization_metadata": json.dumps(
            {"format_version": "1.0", "layers": {n[len("model.diffusion_model.") :]: m for n, m in layers.items()}}
        )
    }
    assert comfyui(write(tmp_path / "bare.safetensors", t, metadata=bare))["loads"]


def test_a_file_safetensors_refuses_names_no_architecture(tmp_path):
    """ComfyUI opens the file before it detects anything: a header safetensors refuses (a
    repeated field here) ends there, and the verdict names no architecture."""
    path = write(tmp_path / "flux.safetensors", flux_tensors())
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].decode()
    first = header.index('"dtype":')
    header = header[:first] + '"dtype":"BF16",' + header[first:]
    data = raw[8 + n :]
    body = header.encode()
    with open(path, "wb") as fh:
        fh.write(len(body).to_bytes(8, "little") + body + data)
    v = check(str(path), target="comfyui").verdicts["comfyui"]
    assert v.first is not None and "duplicate field `dtype`" in v.first.message
    assert v.architecture is None and "architecture" not in v.to_dict()
