"""The CLI contract: exit codes, the check --json schema, inspect, usage errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from builders import W4A8_MARKER, dense_layer, int8_layer, nvfp4_layer, w4a8_layer, write, zeros
from comfyquant.cli import main
from comfyquant.findings import RULES

P = "blocks.0.attn.qkv"
FINDING_KEYS = {"code", "severity", "layer", "tensor", "expected", "actual", "cause", "fix", "message"}
TARGET_KEYS = {"loads", "error", "exception", "proven_for", "modelled"}


def run(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_exit_codes(tmp_path, capsys):
    good = write(tmp_path / "good.safetensors", w4a8_layer(P), dense_layer("norm"))
    warn = write(
        tmp_path / "warn.safetensors",
        w4a8_layer(P, marker=dict(W4A8_MARKER, convrot_groupsize=256)),
        metadata={"_quantization_metadata": json.dumps({"layers": {}})},
    )
    bad = write(tmp_path / "bad.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))
    assert run(capsys, "check", good)[0] == 0
    assert run(capsys, "check", warn)[0] == 0  # info/warnings only
    assert run(capsys, "check", bad)[0] == 1
    assert run(capsys, "check", tmp_path / "missing.safetensors")[0] == 2
    rc, _, err = run(capsys, "check", good, "--target", "nope")
    assert rc == 2 and "unknown target 'nope'" in err and "choose from sglang, comfyui, comfy-kitchen, all" in err
    assert err.count("\n") == 1 and err.startswith("comfyquant check: error: ") and "(see comfyquant check --help)" in err
    rc, _, err = run(capsys, "convert", good, str(tmp_path / "o.safetensors"), "-f", "fp8")  # convert takes -t
    assert rc == 2 and err == "comfyquant convert: error: unrecognized arguments: -f fp8 (see comfyquant convert --help)\n"
    assert run(capsys, "inspect", good)[0] == 0


def test_check_json_schema(tmp_path, capsys):
    bad = write(tmp_path / "bad.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))), nvfp4_layer("x", n=32))
    rc, out, _ = run(capsys, "check", bad, "--json")
    assert rc == 1
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["paths"] == [bad] and doc["ok"] is False and doc["layers"] == 2
    assert set(doc["targets"]) == {"sglang", "comfyui", "comfy-kitchen"}
    for t in doc["targets"].values():
        assert TARGET_KEYS <= set(t)
        assert isinstance(t["loads"], bool)
    assert doc["targets"]["sglang"] == {
        **doc["targets"]["sglang"],
        "loads": False,
        "exception": "ValueError",
        "error": f"Comfy W4A8 layer '{P}' has an incompatible correction tensor",
    }
    assert doc["findings"]
    for f in doc["findings"]:
        assert FINDING_KEYS <= set(f)
        assert f["severity"] in ("error", "warning", "info")
        base = f["code"].split(".")[0]
        assert f["code"] in RULES or base in ("sglang", "comfyui", "comfy-kitchen")
    rc, out, _ = run(capsys, "check", bad, "--json", "--target", "comfyui")
    doc = json.loads(out)
    assert set(doc["targets"]) == {"comfyui"}


def test_text_output_groups_repeated_findings(tmp_path, capsys):
    layers = {}
    for i in range(12):
        layers.update(
            w4a8_layer(f"blocks.{i}.q", marker={"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256})
        )
    p = write(tmp_path / "many.safetensors", layers)
    rc, out, _ = run(capsys, "check", p)
    assert rc == 1
    assert out.count("M036") == 1 and "layers   12: blocks.0.q" in out and "and 4 more" in out
    assert "sglang         FAILS  ValueError: Serialized W4A8 layer 'blocks.0.q' must set convrot=true" in out


def test_inspect_table_and_json(tmp_path, capsys):
    p = write(tmp_path / "m.safetensors", w4a8_layer(P, n=64, k=512), int8_layer("b.int8"), dense_layer("norm"))
    rc, out, _ = run(capsys, "inspect", p)
    assert rc == 0
    assert "asym_w4a8_int8" in out and "64x512" in out and "codebook 4-bit G=16 C=256" in out
    assert "compression" in out
    rc, out, _ = run(capsys, "inspect", p, "--json")
    doc = json.loads(out)
    rows = {r["layer"]: r for r in doc["layers"]}
    assert rows[P]["format"] == "asym_w4a8_int8" and rows[P]["N"] == 64 and rows[P]["K"] == 512
    # 4-bit codes + FP8 group scale per 16 + F32 row scale + codebook
    expected_bytes = 64 * 256 + 64 * 32 + 64 * 4 + 64
    assert rows[P]["bytes"] == expected_bytes
    assert rows[P]["bits_per_weight"] == round(8 * expected_bytes / (64 * 512), 3)
    assert rows["norm"]["format"] == "dense"
    assert doc["totals"]["int8_tensorwise"]["layers"] == 1
    assert doc["compression_vs_bf16"] > 1


def test_console_script_runs_without_torch(tmp_path):
    """`check` must not import torch (or numpy) at all."""
    p = write(tmp_path / "m.safetensors", int8_layer("a"))
    code = (
        f"import sys; from comfyquant.cli import main; rc = main(['check', {p!r}]);"
        "bad = [m for m in ('torch', 'numpy', 'safetensors', 'rich') if m in sys.modules];"
        "print('HEAVY', bad); sys.exit(rc)"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_docs_document_every_rule_code_and_the_readme_starts_with_the_set_up_commands():
    """The rule codes page is generated from RULES (docs/hooks/generated.py), so every code
    is documented; the README's first lines are the two set-up commands."""
    root = os.path.join(os.path.dirname(__file__), "..")
    page = open(os.path.join(root, "docs", "rules.md"), encoding="utf-8").read()
    assert "<!-- generated: rules -->" in page
    hook = importlib.util.spec_from_file_location("docs_generated", os.path.join(root, "docs", "hooks", "generated.py"))
    generated = importlib.util.module_from_spec(hook)
    hook.loader.exec_module(generated)
    rendered = generated.on_page_markdown(page, None, None, None)
    missing = [code for code in RULES if f"`{code}`" not in rendered]
    assert not missing, f"rule codes missing from docs/rules.md: {missing}"
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    first_lines = readme.splitlines()[:6]
    assert any("comfyquant check examples/seed_broken_w4a8.safetensors" in line for line in first_lines)
    assert any(".ci/run" in line for line in first_lines)


def test_every_code_a_bundled_example_raises_is_in_the_rule_registry(capsys):
    """The registry is what the rule codes page lists: a canonical code the checker emits
    (L010 for MoE expert banks, M036 for a marker key left to its default) must be in it."""
    examples = os.path.join(os.path.dirname(__file__), "..", "examples")
    codes = set()
    for name in sorted(os.listdir(examples)):
        if name.endswith(".safetensors"):
            main(["check", "--json", os.path.join(examples, name)])
            codes |= {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}
    canonical = {code for code in codes if "." not in code}
    assert "L010" in canonical
    assert canonical <= set(RULES), sorted(canonical - set(RULES))


def test_commands_that_need_an_extra_say_which(tmp_path):
    """On a light install (no torch), quantize/dequantize name the extra to install instead
    of reporting an internal error; check still works."""
    import subprocess
    import sys

    src = os.path.join(os.path.dirname(__file__), "..", "examples", "mixed_comfyui.safetensors")
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch now fails as on a light install
        "from comfyquant.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "dequantize", src, str(tmp_path / "d.safetensors")], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stderr == "comfyquant dequantize: needs torch, which is not installed (pip install 'comfyquant[torch]')\n"
    r = subprocess.run([sys.executable, "-c", code, "check", src], capture_output=True, text=True)
    assert r.returncode in (0, 1) and r.stderr == "" and "targets:" in r.stdout


def test_a_failed_torch_allocation_is_out_of_memory_not_an_internal_error(tmp_path, monkeypatch, capsys):
    """torch raises RuntimeError ("DefaultCPUAllocator: can't allocate memory") where Python
    raises MemoryError: a machine's limit, reported in one line as such, not as a bug."""
    torch = pytest.importorskip("torch")

    from comfyquant import cli
    from comfyquant.commands import dequantize as command

    def too_big(args):
        return torch.empty(1 << 60, dtype=torch.uint8)  # torch's own failure, as a huge layer gets it

    monkeypatch.setattr(command, "run", too_big)
    src = os.path.join(os.path.dirname(__file__), "..", "examples", "mixed_comfyui.safetensors")
    rc = cli.main(["dequantize", src, str(tmp_path / "d.safetensors")])
    err = capsys.readouterr().err
    assert rc == 2 and err == "comfyquant: out of memory\n"
