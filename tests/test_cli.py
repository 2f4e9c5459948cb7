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
from comfyquant.installing import extra_command

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
    assert r.stderr == f"comfyquant dequantize: needs torch, which is not installed ({extra_command('torch')})\n"
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


NOT_CHECKPOINTS = {
    "README.md": b"# comfyquant\n\nCheck, inspect, repair quantized checkpoints.\n",
    "model.safetensors": b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 12345\n",  # a Git LFS pointer
    "page.safetensors": b"<!DOCTYPE html><html><body>Sign in</body></html>",
}
"""Files that are no checkpoint by their content, whatever their names say."""


@pytest.mark.parametrize("name", sorted(NOT_CHECKPOINTS))
@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["check", "--json"],
        ["inspect"],
        ["recipe"],
        ["fix", "-o", "{out}"],
        ["migrate", "-o", "{out}"],
        pytest.param(["dequantize", "-o", "{out}"], marks=pytest.mark.needs_torch),
        pytest.param(["convert", "-t", "fp8", "-o", "{out}"], marks=pytest.mark.needs_torch),
        pytest.param(["quantize", "-f", "fp8", "-o", "{out}"], marks=pytest.mark.needs_torch),
        pytest.param(["compare", "{other}"], marks=pytest.mark.needs_torch),
    ],
)
def test_a_file_that_is_no_checkpoint_is_refused_alike_by_every_command(tmp_path, capsys, name, command):
    """What is not a checkpoint (by content: text where a safetensors file has its header
    length) gets the same one line and exit 2 from every command, check and inspect included;
    nothing is written."""
    path = tmp_path / name
    path.write_bytes(NOT_CHECKPOINTS[name])
    other = write(tmp_path / "other.safetensors", dense_layer("a"))
    out = tmp_path / "out.safetensors"
    args = [command[0], str(path), *(a.format(out=out, other=other) for a in command[1:])]
    rc, text, err = run(capsys, *args)
    first = NOT_CHECKPOINTS[name].decode().splitlines()[0]
    shown = first[:40] + ("..." if len(first) > 40 else "")
    assert (rc, text) == (2, "") and err == (
        f"comfyquant: {path}: not a checkpoint: it starts with text ({shown!r}), so it is not a safetensors file, "
        "a GGUF file or a *.safetensors.index.json\n"
    )
    assert not out.exists()


def test_a_damaged_safetensors_file_is_still_reported_by_check(tmp_path, capsys):
    """A safetensors file whose header is damaged (its length field intact) is a report
    (C009, exit 1), not the refusal of a file that is no checkpoint."""
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    rc, text, err = run(capsys, "check", str(path))
    assert rc == 1 and "C009" in text and err == ""


INTERRUPT_AFTER_FIRST_TENSOR = """
import os, signal, sys
import comfyquant.io.writer as writer

# As in a terminal: a shell that starts a job in the background has it ignore SIGINT.
signal.signal(signal.SIGINT, signal.default_int_handler)

real = writer.write_safetensors

def write_then_ctrl_c(path, tensors, metadata=None, **kw):
    # Ctrl-C arrives once the first tensor of the output is on disk: a real SIGINT, mid-run.
    kw["on_tensor"] = lambda *_: os.kill(os.getpid(), signal.SIGINT)
    return real(path, tensors, metadata, **kw)

writer.write_safetensors = write_then_ctrl_c
from comfyquant.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.needs_torch
@pytest.mark.parametrize("command", [["dequantize"], ["fix"]])
def test_ctrl_c_during_a_long_command_exits_130_in_one_line_and_leaves_nothing(tmp_path, command):
    """A SIGINT while the output is being written: exit 130 (the code every ``--help`` and the
    docs list), one line, no traceback, nothing at the output path and no temporary file."""
    broken = {k: v for k, v in W4A8_MARKER.items() if k != "convrot"}
    src = write(tmp_path / "in.safetensors", w4a8_layer(P, marker=broken), dense_layer("norm"), dense_layer("head"))
    out = tmp_path / "out.safetensors"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            p for p in (os.path.dirname(os.path.dirname(__file__)) + "/src", os.environ.get("PYTHONPATH")) if p
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AFTER_FIRST_TENSOR, *command, src, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "comfyquant: interrupted\n" and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]


@pytest.mark.parametrize("command", [None, "check", "fix", "quantize", "comfyui"])
def test_every_help_lists_the_exit_codes_130_included(capsys, command):
    args = [command, "--help"] if command else ["--help"]
    if command == "comfyui":
        args = ["comfyui", "install", "--help"]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 done" in text and "3 internal error" in text and "130 interrupted (Ctrl-C)" in text


def test_every_docs_page_that_lists_exit_codes_lists_130():
    """Wherever the docs list the exit codes, 130 is among them."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    pages = [os.path.join(root, "names-and-messages.md")]
    pages += [os.path.join(root, "commands", n) for n in sorted(os.listdir(os.path.join(root, "commands")))]
    listed = []
    for page in pages:
        with open(page, encoding="utf-8") as fh:
            text = fh.read()
        if "Exit codes" in text:
            listed.append(os.path.basename(page))
            assert "130" in text, page
    assert "names-and-messages.md" in listed and "check.md" in listed and "fix.md" in listed


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_migrate_on_a_broken_comfy_file_points_to_fix_and_check(capsys):
    """A Comfy file has nothing to migrate; when check finds defects in it, the line says
    which command repairs them and which lists them (exit 1: defects found)."""
    seed = os.path.join(EXAMPLES, "seed_broken_w4a8.safetensors")
    rc, out, err = run(capsys, "migrate", seed)
    assert rc == 1 and err == ""
    assert out == (
        "nothing to migrate: the file's layout is comfy (already a Comfy quantized checkpoint); but check finds "
        f"1 error and 1 warning in it: comfyquant fix {seed} repairs what has a repair (comfyquant check {seed} lists them)\n"
    )
    rc, _out, err = run(capsys, "migrate", seed, "--target", "comfyui")  # a repair it would need is lossy: refused
    assert rc == 2 and err.count("\n") == 1
    assert err.rstrip().endswith(
        f"it is a Comfy checkpoint: comfyquant fix {seed} repairs it (comfyquant check {seed} lists its defects)"
    )
    rc, out, _err = run(capsys, "migrate", seed, "--target", "comfyui", "--allow-lossy")  # a warning for ComfyUI only
    assert rc == 0 and out.endswith(
        f"but check finds 1 warning in it: comfyquant fix {seed} --target comfyui repairs what has a repair "
        f"(comfyquant check {seed} --target comfyui lists them)\n"
    )
    clean = os.path.join(EXAMPLES, "w4a8_sglang.safetensors")
    rc, out, _err = run(capsys, "migrate", clean)
    assert rc == 0 and out == "nothing to migrate: the file's layout is comfy (already a Comfy quantized checkpoint)\n"


@pytest.mark.needs_torch
def test_the_bundled_legacy_example_migrates_exactly_and_then_passes_check(tmp_path, capsys):
    """``examples/legacy_scaled_fp8.safetensors`` (ComfyUI's legacy scaled-FP8 layout) is what a
    new user tries ``migrate`` on: check names the layout and fails for SGLang; migrate rewrites
    it, every layer exact; the result passes check for every runtime, and its FP8 weights and
    scales are the legacy file's own bytes and values."""
    from safetensors.torch import load_file

    legacy = os.path.join(EXAMPLES, "legacy_scaled_fp8.safetensors")
    rc, out, _ = run(capsys, "check", legacy)
    assert rc == 1 and "layout: 3 layers in the ComfyUI legacy scaled FP8 layout (comfy-legacy-fp8)" in out
    assert "-> comfyquant migrate" in out
    migrated = tmp_path / "legacy_scaled_fp8.comfy.safetensors"
    rc, out, _ = run(capsys, "migrate", legacy, "-o", migrated)
    assert rc == 0 and out.startswith("layout: comfy-legacy-fp8 -> comfy\n") and f"wrote {migrated}" in out
    assert {line.split()[0] for line in out.splitlines()[1:] if line.startswith("  ") and line.split()[0].isalpha()} == {"exact"}
    rc, out, _ = run(capsys, "check", migrated)
    assert rc == 0 and out.rstrip().endswith("0 errors, 0 warnings, 0 info: OK")
    before, after = load_file(legacy), load_file(str(migrated))
    for layer in ("blocks.0.attn.qkv", "blocks.0.mlp.fc1"):
        assert torch_equal(before[f"{layer}.weight"], after[f"{layer}.weight"])
        assert torch_equal(before[f"{layer}.scale_weight"], after[f"{layer}.weight_scale"])


def torch_equal(a, b) -> bool:
    import torch

    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )
