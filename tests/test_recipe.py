"""``comfyquant recipe GOOD`` and ``quantize --like GOOD``: a quantized file's per-layer choices,
written as a rules file, reproduce it exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.quantizer.recipe import read_recipe
from kitchen_fixtures import make_layer, make_weight, write_layers

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

H = 256


def _dense(path, names: dict[str, tuple[int, int]], skip: set = frozenset()) -> str:
    sd = {}
    for i, (name, (n, k)) in enumerate(names.items()):
        if name in skip:
            continue
        sd[f"{name}.weight"] = make_weight(n, k, seed=i)
        sd[f"{name}.bias"] = (torch.arange(n, dtype=torch.float32) / 1000).to(torch.bfloat16)
    sd["double_blocks.0.img_attn.norm.key_norm.scale"] = torch.ones(64, dtype=torch.bfloat16)
    sd["single_blocks.0.norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    save_file(sd, str(path))
    return str(path)


FLUX = {
    "img_in": (H, 64),
    "txt_in": (H, H),
    "time_in.in_layer": (H, H),
    "time_in.out_layer": (H, H),
    **{
        f"double_blocks.{b}.{s}": (n, k)
        for b in range(3)
        for s, n, k in (
            ("img_attn.qkv", 3 * H, H),
            ("img_attn.proj", H, H),
            ("img_mlp.0", 2 * H, H),
            ("img_mlp.2", H, 2 * H),
            ("img_mod.lin", 2 * H, H),
            ("txt_attn.qkv", 3 * H, H),
            ("txt_attn.proj", H, H),
            ("txt_mlp.0", 2 * H, H),
            ("txt_mlp.2", H, 2 * H),
            ("txt_mod.lin", 2 * H, H),
        )
    },
    **{
        f"single_blocks.{b}.{s}": (n, k)
        for b in range(3)
        for s, n, k in (("linear1", 3 * H, H), ("linear2", H, 2 * H), ("modulation.lin", 2 * H, H))
    },
    "final_layer.linear": (64, H),
    "final_layer.adaLN_modulation.1": (2 * H, H),
}

RULES = """
[default]
format = "w4a8"
group_size = 32

[[rules]]
match = "*_mlp.*"
format = "int8"

[[rules]]
match = "*.txt_mlp.*"
format = "int8"
convrot = false

[[rules]]
match = "single_blocks.*.linear2"
format = "nvfp4"

[[rules]]
match = "*.modulation.lin"
format = "mxfp8"

[[rules]]
match = "double_blocks.1.txt_attn.qkv"
format = "fp8"

[[rules]]
match = ["*.img_mod.*", "double_blocks.2.img_attn.proj"]
format = "keep"
"""
"""Several formats and parameters, a keep glob, and two layers that differ from every sibling."""


def _layers(plan) -> dict:
    return {
        lp.name: (
            lp.action,
            lp.format if lp.action == "quantize" else None,
            lp.params.as_dict() if lp.action == "quantize" else None,
        )
        for lp in plan.layers
    }


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipe")
    src = _dense(d / "dense.safetensors", FLUX)
    rules = d / "rules.toml"
    rules.write_text(RULES)
    good = str(d / "good.safetensors")
    # presets off: GOOD quantizes txt_in, time_in.*, final_layer.*, which the Flux preset keeps
    r = comfyquant.quantize(src, good, rules=str(rules), target="comfyui", progress=False, preset="none")
    assert r.ok
    return d, src, good, r


def test_recipe_then_like_reproduces_the_file(made, capsys):
    d, src, good, made_by = made
    formats = {lp.format for lp in made_by.plan.quantized}
    assert len(formats) >= 5  # the GOOD file really mixes formats (w4a8, int8 x2, nvfp4, mxfp8, fp8)
    assert main(["recipe", good]) == 0
    text = capsys.readouterr().out
    doc = tomllib.loads(text)  # what it prints is a rules file
    assert "default" not in doc and doc["rules"][0]["match"] == "*"
    (d / "recipe.toml").write_text(text)
    # the plan --like makes equals the plan that wrote GOOD, layer by layer (format and parameters)
    like = comfyquant.quantize(src, like=good, target="comfyui", dry_run=True)
    assert _layers(like.plan) == _layers(made_by.plan)
    assert any("repeats its choices" in n for n in like.plan.notes)
    # and the file it writes is GOOD, byte for byte (the encoders are deterministic)
    out = d / "like.safetensors"
    assert main(["quantize", src, str(out), "--like", good, "--target", "comfyui", "--no-progress"]) == 0
    assert out.read_bytes() == open(good, "rb").read()
    # the printed file works as --rules too, although the Flux preset is detected on these names
    again = comfyquant.quantize(src, rules=str(d / "recipe.toml"), target="comfyui", dry_run=True)
    assert again.doc["selection"]["preset"] == "flux"
    assert _layers(again.plan) == _layers(made_by.plan)
    assert _layers(again.plan)["txt_in"][0] == "quantize"
    # which is why the catch-all is a "*" rule: as a [default] the preset's keep list would win
    first = doc["rules"][0]
    as_default = {"default": {k: v for k, v in first.items() if k != "match"}, "rules": doc["rules"][1:]}
    from comfyquant.quantizer.rules import parse_rules

    other = comfyquant.quantize(src, rules=parse_rules(as_default), target="comfyui", dry_run=True)
    assert _layers(other.plan)["txt_in"][0] == "dense"


def test_recipe_groups_into_globs_and_names_the_exceptions(made):
    _d, _src, good, made_by = made
    recipe = read_recipe(good)
    # the layers no glob can single out are named exactly: each differs from every sibling
    assert {"double_blocks.1.txt_attn.qkv", "double_blocks.2.img_attn.proj"} <= set(recipe.exact)
    assert "double_blocks.0.txt_attn.qkv" not in recipe.exact and "double_blocks.0.img_mlp.2" not in recipe.exact
    assert len(recipe.exact) <= 4  # those two, and img_in/txt_in: single-component names have no glob
    entries = recipe.doc()["rules"]
    exact = [
        e for e in entries if e["match"] in recipe.exact or (isinstance(e["match"], list) and set(e["match"]) & set(recipe.exact))
    ]
    assert exact
    assert len(entries) < len({lp.name for lp in made_by.plan.layers}) // 4  # globs, not a list of names
    # every layer quantize can decide is in the recipe with GOOD's format and parameters
    for lp in made_by.plan.layers:
        c = recipe.choices.get(lp.name)
        if lp.action == "quantize":
            assert c.format == lp.format and c.params == lp.params
        elif c is not None:
            assert c.format == "keep"
    assert "double_blocks.0.img_attn.norm.key_norm" not in recipe.choices  # nothing to decide there
    js = recipe.to_dict()
    assert js["layers"]["double_blocks.1.txt_attn.qkv"] == {"format": "float8_e4m3fn"}
    assert js["layers"]["double_blocks.0.txt_mlp.2"] == {"format": "int8_tensorwise", "convrot": False}


def test_recipe_is_header_only(made):
    _d, _src, good, _r = made
    code = (
        "import sys; from comfyquant.cli import main; rc = main(['recipe', sys.argv[1], '--json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    p = subprocess.run([sys.executable, "-c", code, good], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["rules"][0]["match"] == "*"


def test_like_says_how_the_dense_file_differs(made, tmp_path, capsys):
    _d, _src, good, _r = made
    src = _dense(tmp_path / "other.safetensors", {**FLUX, "extra_proj": (H, H)}, skip={"double_blocks.1.txt_attn.qkv"})
    assert main(["quantize", src, "--like", good, "--target", "comfyui", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "warning: --like" in err and "2 layers differ" in err
    assert "double_blocks.1.txt_attn.qkv: quantized in GOOD, not in this checkpoint" in err
    assert "extra_proj: not in GOOD" in err


def test_like_refuses_other_choices(made, capsys):
    _d, src, good, _r = made
    for extra in (["--format", "fp8"], ["--preset", "flux"], ["--rules", good]):
        assert main(["quantize", src, "--like", good, "--dry-run", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--like GOOD gives every layer" in err


def test_recipe_of_a_dense_file_is_refused(tmp_path, capsys):
    src = _dense(tmp_path / "d.safetensors", {"img_in": (H, 64)})
    assert main(["recipe", src]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no quantized layer" in err
    with pytest.raises(InputError):
        read_recipe(src)


KITCHEN = [
    ("int8_convrot", "sglang"),
    ("int8_rowwise", "comfyui"),
    ("nvfp4", "sglang"),
    ("fp8", "comfyui"),
    ("w4a8_codebook", "sglang"),
    ("w6a8", "sglang"),
    ("w4a8_uniform", "comfyui"),
    ("mxfp8", "comfyui"),
    ("w4a4", "comfyui"),
]


def test_recipe_of_a_comfy_kitchen_file(tmp_path, capsys):
    """GOOD written by comfy-kitchen's layouts (both marker styles): --like gives the same
    markers and bit-identical tensors (comfyquant's encoders are comfy-kitchen's)."""
    layers = [make_layer(v, prefix=f"blocks.{i}.attn.qkv", n=64, k=256, seed=i, marker=m) for i, (v, m) in enumerate(KITCHEN)]
    dense_kept = make_weight(64, 256, seed=77)
    good = write_layers(tmp_path / "good.safetensors", layers)
    sd = load_file(good)
    sd["blocks.9.mlp.fc.weight"] = dense_kept  # a dense linear in GOOD: kept
    save_file(sd, good)
    dense = {}
    for i, layer in enumerate(layers):
        dense[f"{layer.prefix}.weight"] = make_weight(64, 256, seed=i)
        dense[f"{layer.prefix}.bias"] = layer.tensors["bias"]
    dense["blocks.9.mlp.fc.weight"] = dense_kept
    src = str(tmp_path / "dense.safetensors")
    save_file(dense, src)
    assert main(["recipe", good]) == 0
    capsys.readouterr()
    out = tmp_path / "like.safetensors"
    # comfy-kitchen: GOOD holds a 6-bit W4A8 layer, which ComfyUI 0.33.0's pinned comfy-kitchen
    # (0.2.31) cannot run, so a ComfyUI target refuses it (test_params, test_quantize)
    assert main(["quantize", src, str(out), "--like", good, "--target", "comfy-kitchen", "--no-progress"]) == 0
    assert "repeats its choices for all 10 layers" in capsys.readouterr().err
    got, want = load_file(str(out)), load_file(good)
    for layer in layers:
        for suffix in layer.tensors:
            name = f"{layer.prefix}.{suffix}"
            a = got[name]
            b = want[name].float() if suffix == "weight_correction" else want[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name
        from comfyquant.formats.registry import FORMATS

        mine = json.loads(bytes(got[f"{layer.prefix}.comfy_quant"].tolist()))
        fmt = FORMATS[layer.marker["format"]]
        have, written = fmt.params(layer.marker), fmt.params(mine)
        if "convrot" not in layer.marker and fmt.name == "asym_w4a8_int8":
            # ComfyUI's W4A8 marker omits convrot (W4A8 always rotates); quantize always writes it
            assert written.pop("convrot") is True and have.pop("convrot") is not True
        assert written == have, layer.variant
    assert got["blocks.9.mlp.fc.weight"].dtype == torch.bfloat16


def test_unreproducible_layers_are_said(tmp_path, capsys):
    layers = [
        make_layer("fp8_static" if i == 0 else "fp8", prefix=f"blocks.{i}.q", n=64, k=256, seed=i, marker="comfyui")
        for i in range(2)
    ]
    good = write_layers(tmp_path / "good.safetensors", layers)
    assert main(["recipe", good]) == 1
    out, err = capsys.readouterr()
    assert "blocks.0.q: cannot be reproduced by quantize" in err and "input_scale" in err
    assert "NOT REPRODUCIBLE, kept dense: blocks.0.q" in out
    from comfyquant.quantizer.rules import parse_rules

    rules = parse_rules(tomllib.loads(out))
    assert rules.choose("blocks.0.q").format == "keep" and rules.choose("blocks.1.q").format == "float8_e4m3fn"
    assert read_recipe(good).to_dict()["unreproducible"][0]["layer"] == "blocks.0.q"


def test_mutated_checkpoints_never_crash_recipe(capsys):
    """The fuzz campaign of ``test_fuzz_commands`` on ``recipe``: a verdict or one line, never a traceback."""
    import os
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from test_fuzz_commands import EXAMPLES, build, digest, mutation

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(mutation, min_size=1, max_size=3), st.sampled_from([["recipe"], ["recipe", "--json"]]))
    def run(mutations, command):
        with tempfile.TemporaryDirectory() as folder:
            src = os.path.join(folder, "in.safetensors")
            build(src, mutations)
            before = digest(src)
            rc = main([command[0], src, *command[1:]])
            out, err = capsys.readouterr()
            assert rc in (0, 1, 2), f"{command}: exit {rc}: {err} ({mutations})"
            assert "internal error" not in err and "Traceback" not in err, err
            if rc == 2:
                assert err.count("\n") == 1, err
            elif "--json" not in command:
                from comfyquant.quantizer.rules import parse_rules

                parse_rules(tomllib.loads(out))  # whatever it prints is a rules file
            assert digest(src) == before

    run()


def test_recipe_of_a_legacy_scaled_fp8_file(tmp_path, capsys):
    """Another layout is read as the Comfy file it translates to; a layer no Comfy format holds
    exactly (per-channel legacy scales) is quantized but not reproducible, and said so."""
    from test_dialect_legacy import legacy_file

    src = tmp_path / "legacy.safetensors"
    legacy_file(src)
    assert main(["recipe", str(src), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"] == {
        "blocks.0.attn.qkv": {"format": "float8_e4m3fn"},
        "blocks.0.mlp.fc1": {"format": "float8_e4m3fn"},
        "final_layer.linear": {"format": "keep"},
    }
    lossy = tmp_path / "channel.safetensors"
    legacy_file(lossy, per_channel=True)
    assert main(["recipe", str(lossy)]) == 1
    out, err = capsys.readouterr()
    assert "blocks.0.mlp.fc1: cannot be reproduced by quantize: stored as" in err
    from comfyquant.quantizer.rules import parse_rules

    rules = parse_rules(tomllib.loads(out))
    assert rules.choose("blocks.0.attn.qkv").format == "float8_e4m3fn" and rules.choose("blocks.0.mlp.fc1").keep
