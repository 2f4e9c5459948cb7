"""The ComfyUI Check node says what ``comfyquant check`` says, on every kind of file.

The node's own method (``ComfyQuantCheck.check``, its file looked up in a test folder instead of
ComfyUI's ``diffusion_models``) runs in this process; ``comfyquant check FILE --target T`` runs
as the command a user types. Their texts must be equal: on a valid file, on a file of each
defect class the header shows (container, marker, layer, another writer's layout), on headers
that cannot be read (not JSON, truncated, a repeated key, a length out of range, an empty
file), and on files of another container. A file ``check`` refuses (exit 2, one line) makes the
node fail with that very line. Both go through one report builder: the static test at the end
shows that no other caller assembles a report itself.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders import (
    W4A8_MARKER,
    dense_layer,
    fp8_layer,
    header_markers,
    ones,
    raw_file,
    w4a8_layer,
    write,
    zeros,
)
from comfyquant.comfyui import nodes

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "comfyquant"
P = "blocks.0.attn.qkv"


def valid(folder: Path) -> str:
    return write(
        folder / "valid.safetensors",
        w4a8_layer(P),
        dense_layer("final_layer.linear"),
        metadata=header_markers({P: W4A8_MARKER}),
    )


def container_trailing_bytes(folder: Path) -> str:
    """C004: bytes after the last tensor (safetensors refuses the file)."""
    path = valid(folder)
    out = folder / "container.trailing.safetensors"
    out.write_bytes(Path(path).read_bytes() + bytes(24))
    return str(out)


def container_span(folder: Path) -> str:
    """C001: a tensor whose bytes are not its dtype x shape."""
    header = {"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 30]}}
    return raw_file(folder / "container.span.safetensors", json.dumps(header), bytes(30))


def marker_without_format(folder: Path) -> str:
    """M030: a marker with no ``format`` key."""
    marker = {k: v for k, v in W4A8_MARKER.items() if k != "format"}
    return write(folder / "marker.noformat.safetensors", w4a8_layer(P, marker=marker))


def marker_map_not_json(folder: Path) -> str:
    """M010: ``_quantization_metadata`` that is not JSON."""
    return write(folder / "marker.map.safetensors", w4a8_layer(P), metadata={"_quantization_metadata": "{layers"})


def layer_transposed_correction(folder: Path) -> str:
    """L004: a W4A8 correction transposed and downcast."""
    return write(folder / "layer.correction.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))


def layer_wrong_scale_shape(folder: Path) -> str:
    """L003: an FP8 layer whose scale has a shape the format does not allow."""
    layer = fp8_layer(P)
    layer[f"{P}.weight_scale"] = ones("F32", (3,))
    return write(folder / "layer.scale.safetensors", layer)


def foreign_legacy_fp8(folder: Path) -> str:
    """F001: ComfyUI's legacy scaled-FP8 layout (``scale_weight``, a ``scaled_fp8`` sentinel)."""
    return write(
        folder / "foreign.legacy.safetensors",
        {f"{P}.weight": ones("F8_E4M3", (32, 256)), f"{P}.scale_weight": ones("F32", ())},
        {"scaled_fp8": zeros("F8_E4M3", (0,))},
        dense_layer("final_layer.linear"),
    )


def header_not_json(folder: Path) -> str:
    """C009: the header is not JSON."""
    return raw_file(folder / "header.notjson.safetensors", "{not json at all")


def header_truncated(folder: Path) -> str:
    """C009: a download cut short inside the header."""
    data = Path(valid(folder)).read_bytes()
    out = folder / "header.truncated.safetensors"
    out.write_bytes(data[:200])
    return str(out)


def data_truncated(folder: Path) -> str:
    """A download cut short in the data: the header is whole, the last tensor's bytes are not."""
    data = Path(valid(folder)).read_bytes()
    out = folder / "data.truncated.safetensors"
    out.write_bytes(data[:-100])
    return str(out)


def header_duplicate_keys(folder: Path) -> str:
    """C016: a tensor entry that repeats its ``dtype``: Python's JSON reads it, safetensors refuses it."""
    entry = '{"dtype": "BF16", "dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}'
    return raw_file(folder / "header.duplicate.safetensors", f'{{"w": {entry}}}', bytes(4))


def header_duplicate_names(folder: Path) -> str:
    """A tensor name given twice, both entries valid: safetensors reads it (the last one wins)."""
    entry = '{"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}'
    return raw_file(folder / "header.duplicate-names.safetensors", f'{{"w": {entry}, "w": {entry}}}', bytes(4))


def header_length_out_of_range(folder: Path) -> str:
    """C009: a header length larger than the file."""
    return raw_file(folder / "header.length.safetensors", "{}", length=1 << 40)


def empty_file(folder: Path) -> str:
    out = folder / "empty.safetensors"
    out.write_bytes(b"")
    return str(out)


def not_a_checkpoint(folder: Path) -> str:
    """Text: no checkpoint at all, which check refuses in one line."""
    out = folder / "notes.safetensors"
    out.write_text("not a checkpoint at all\n")
    return str(out)


def gguf_file(folder: Path) -> str:
    """Another container: a small GGUF file (a Q8_0 weight and its bias)."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as T

    from test_dialect_gguf import write_gguf

    path = str(folder / "g.gguf")
    write_gguf(path, [("blocks.0.weight", T.Q8_0, (4, 64), False), ("blocks.0.bias", T.F32, (4,), False)])
    return path


FILES = [
    valid,
    container_trailing_bytes,
    container_span,
    marker_without_format,
    marker_map_not_json,
    layer_transposed_correction,
    layer_wrong_scale_shape,
    foreign_legacy_fp8,
    header_not_json,
    header_truncated,
    data_truncated,
    header_duplicate_keys,
    header_duplicate_names,
    header_length_out_of_range,
    empty_file,
    not_a_checkpoint,
]
TARGETS = ["all", "sglang,comfy-kitchen"]


def cli(path: str, targets: str) -> subprocess.CompletedProcess:
    """``comfyquant check PATH --target TARGETS`` from this tree, as a user runs it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "comfyquant", "check", path, "--target", targets], capture_output=True, text=True, env=env
    )


def node_says(path: str, targets: str, monkeypatch) -> tuple[str | None, str | None]:
    """The Check node's (report, None), or (None, the one line it fails with)."""
    monkeypatch.setattr(nodes, "model_path", lambda name: path)
    try:
        out = nodes.ComfyQuantCheck().check(os.path.basename(path), targets)
    except nodes.NodeError as exc:
        return None, str(exc)
    (text,) = out["ui"]["text"]
    assert out["result"] == (text,)
    return text, None


def assert_same(path: str, targets: str, monkeypatch) -> str:
    report, error = node_says(path, targets, monkeypatch)
    proc = cli(path, targets)
    if proc.returncode == 2:  # refused: one line on stderr, which the node shows as its error
        assert proc.stdout == "" and report is None
        assert proc.stderr == f"comfyquant: {error}\n"
        return "refused"
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stderr == "" and error is None, error
    assert report == proc.stdout.rstrip("\n")
    return report


@pytest.mark.parametrize("targets", TARGETS)
@pytest.mark.parametrize("make", FILES, ids=lambda f: f.__name__)
def test_node_text_is_checks_text(tmp_path, monkeypatch, make, targets):
    assert_same(make(tmp_path), targets, monkeypatch)


def test_the_files_cover_each_defect_class_and_broken_headers(tmp_path, monkeypatch):
    """The set above is what it says: each class's finding shows up in the node's report, and
    every broken header is a report (C009/C016, with what each runtime raises), not a refusal."""
    shown = {
        container_trailing_bytes: " C004 ",
        container_span: " C001 ",
        marker_without_format: " M030 ",
        marker_map_not_json: " M010 ",
        layer_transposed_correction: " L004 ",
        layer_wrong_scale_shape: " L003 ",
        foreign_legacy_fp8: "(comfy-legacy-fp8)",  # F001 is info: the layout line names it
        header_not_json: " C009 ",
        header_truncated: " C009 ",
        header_duplicate_keys: " C016 ",
        header_length_out_of_range: " C009 ",
    }
    for make, code in shown.items():
        folder = tmp_path / make.__name__
        folder.mkdir()
        report, error = node_says(make(folder), "all", monkeypatch)
        assert error is None and report is not None, (make.__name__, error)
        assert code in report, (make.__name__, report)
        if code == " C009 ":  # what safetensors raises, for each runtime
            assert report.count("FAILS  SafetensorError") == 3, (make.__name__, report)
    report, _ = node_says(valid(tmp_path), "all", monkeypatch)
    assert report is not None and report.endswith("0 errors, 0 warnings, 0 info: OK"), report


def test_gguf_node_text_is_checks_text(tmp_path, monkeypatch):
    report = assert_same(gguf_file(tmp_path), "all", monkeypatch)
    assert "gguf" in report.lower()


@pytest.mark.needs_torch
@pytest.mark.parametrize("seed", ["legacy", "musubi", "modelopt", "bfl", "int8-fast", "c2q", "nunchaku"])
def test_foreign_layouts_node_text_is_checks_text(tmp_path, monkeypatch, seed):
    """Every other writer's layout, written by its dialect's own test helpers, and the same
    file cut short."""
    from foreign_seeds import SEEDS, damage
    from foreign_seeds import seed as make_seed

    assert seed in SEEDS
    path = make_seed(seed, tmp_path)
    assert_same(path, "all", monkeypatch)
    assert_same(damage(path, "truncated", str(tmp_path / "cut.safetensors")), "comfyui", monkeypatch)


# -- one builder -------------------------------------------------------------------------------

CALLERS = {
    "commands/check.py": "run",
    "comfyui/checking.py": "report_text",
    "checker/batch.py": "check_group",
    "checker/run.py": "check",
}
"""Each way a check report is asked for, and the function of it that builds one."""
ASSEMBLY = {"check_checkpoint", "open_any", "open_checkpoint", "open_group", "gc"}
"""What building a report is made of: opening, the rules, the GC tuning. Only the builder uses
them."""


def names_used(func: ast.FunctionDef) -> set[str]:
    out = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            out.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


@pytest.mark.parametrize("module, function", CALLERS.items())
def test_every_check_calls_the_one_report_builder(module, function):
    tree = ast.parse((SRC / module).read_text())
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    used = names_used(funcs[function])
    assert "build_report" in used, f"{module}:{function} does not call build_report"
    assert not used & ASSEMBLY, f"{module}:{function} assembles a report itself: {sorted(used & ASSEMBLY)}"
    for name, func in funcs.items():
        if name != "build_report":
            assert "check_checkpoint" not in names_used(func), f"{module}:{name} runs the rules outside build_report"
