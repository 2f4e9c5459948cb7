"""Every finding that says ``check --deep measures`` something gets the measured value from
``--deep``: in its text block (``measured relative error 0.718``) and as the JSON ``measured``
object, on a file that triggers it.  The promises are found in the product's source (every
message built with ``findings.DEEP_MEASURES``), so a new promise without a case here fails.

Files are written by comfy-kitchen 0.2.40 (``kitchen_fixtures``) and by the legacy layout's
writer helper; the values are checked against torch's own casts and against the output error
the ComfyUI driver measured for a dropped W4A8 correction (``test_deep_measured_values``:
0.10, 0.72 and 0.95 for corrections of 0.1, 1 and 3 times the weight's size)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file  # noqa: E402

from comfyquant.cli import main  # noqa: E402
from comfyquant.findings import DEEP_MEASURES  # noqa: E402
from kitchen_fixtures import make_layer, make_weight, write_layers  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "comfyquant"
PREFIX = "blocks.0.mlp.fc1"


def _promises_in_source() -> list[str]:
    """Every message in the product that promises a --deep measurement (file: line)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            said = "{DEEP_MEASURES}" in line or re.search(r"--deep (measures|reads them)", line)
            if said and not line.lstrip().startswith(("#", '"""', "DEEP_MEASURES =")):
                out.append(f"{path.relative_to(SRC)}:{n}")
    return out


def _correction(tmp_path, share: float) -> str:
    layer = make_layer("w4a8_codebook", PREFIX, 64, 256, seed=5)
    size = float(make_weight(64, 256, torch.bfloat16, 5).float().pow(2).mean().sqrt())
    correction = torch.randn(256 // 16, 64, generator=torch.Generator().manual_seed(1)) * share * size
    layer = replace(layer, tensors=dict(layer.tensors, weight_correction=correction.float()))
    return write_layers(tmp_path / f"correction-{share}.safetensors", [layer])


def _cast(tmp_path, dtype) -> tuple[str, float]:
    """An INT8 layer whose weight is stored as ``dtype``; the relative error of torch's cast of
    the stored values to int8 (what ComfyUI does at load)."""
    layer = make_layer("int8_rowwise", PREFIX, 32, 256, seed=2, marker="comfyui")
    codes = layer.tensors["weight"]
    stored = codes.to(dtype) if dtype == torch.int16 else make_weight(32, 256, torch.float32, 2)
    layer = replace(layer, tensors=dict(layer.tensors, weight=stored))
    v = stored.double()
    error = float((stored.to(torch.int8).double() - v).norm() / v.norm())
    return write_layers(tmp_path / f"cast-{dtype}.safetensors", [layer]), error


def _legacy(tmp_path, e5m2: bool) -> tuple[str, str, float]:
    """A legacy file whose FP8 weight is E5M2 (ComfyUI re-casts it to E4M3), or whose dense BF16
    weight carries a dummy scale 1.0 (ComfyUI casts it to E4M3): the tensor, torch's relative error."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 256, generator=g) * 0.05
    if e5m2:
        name, stored = "blocks.0.attn.qkv.weight", (w / (w.abs().amax() / 448.0)).to(torch.float8_e5m2)
        scale = (w.abs().amax() / 448.0).reshape(())
    else:
        name, stored, scale = "blocks.0.attn.qkv.weight", w.to(torch.bfloat16), torch.ones(())
    path = tmp_path / f"legacy-{e5m2}.safetensors"
    save_file(
        {name: stored, "blocks.0.attn.qkv.scale_weight": scale.float(), "scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)},
        str(path),
    )
    v = stored.double()
    return str(path), name, float((stored.to(torch.float8_e4m3fn).double() - v).norm() / v.norm())


def _run(capsys, path: str, *extra) -> tuple[str, list[dict]]:
    assert main(["check", path, "--deep", *extra]) in (0, 1)
    text = capsys.readouterr().out
    assert main(["check", path, "--deep", "--json", *extra]) in (0, 1)
    return text, json.loads(capsys.readouterr().out)["findings"]


def _promising(findings: list[dict]) -> list[dict]:
    return [f for f in findings if DEEP_MEASURES in f["message"]]


def _shown(text: str, f: dict) -> bool:
    """The text report prints the finding's measurement in its block."""
    m = f["measured"]
    return f"  measured relative error {m['value']:.3g}\n" in text + "\n"


def test_every_promise_in_the_source_is_one_of_the_cases_here():
    """Four messages promise a --deep measurement: ComfyUI's W4A8 correction, ComfyUI's value
    cast of a weight stored in another dtype, and the legacy layout's two value casts."""
    promises = _promises_in_source()
    assert len(promises) == 4, promises
    assert sorted(p.split(":")[0] for p in promises) == [
        "dialects/comfy_legacy_fp8/__init__.py",
        "dialects/comfy_legacy_fp8/__init__.py",
        "targets/comfyui.py",
        "targets/comfyui.py",
    ]


@pytest.mark.parametrize(("share", "comfyui_measured"), [(0.1, 0.10), (1.0, 0.72), (3.0, 0.95)])
def test_a_dropped_correction_is_measured_in_text_and_json(tmp_path, capsys, share, comfyui_measured):
    text, findings = _run(capsys, _correction(tmp_path, share))
    promised = _promising(findings)
    assert [f["code"] for f in promised] == ["comfyui.correction"]
    m = promised[0]["measured"]
    assert m["quantity"] == "relative error" and abs(m["value"] - comfyui_measured) <= 0.02, m
    assert _shown(text, promised[0]), text
    d010 = [f for f in findings if f["code"] == "D010"]
    assert [f["measured"] for f in d010] == ([m] if share == 3.0 else [])  # the garbage finding rests on it


def test_header_only_check_prints_the_promise_and_no_measurement(tmp_path, capsys):
    path = _correction(tmp_path, 1.0)
    assert main(["check", path, "--json"]) in (0, 1)
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["measured"] for f in _promising(findings)] == [None]


@pytest.mark.parametrize("dtype", [torch.int16, torch.float32])
def test_a_comfy_weight_value_cast_is_measured(tmp_path, capsys, dtype):
    path, error = _cast(tmp_path, dtype)
    text, findings = _run(capsys, path)
    promised = _promising(findings)
    assert [f["code"] for f in promised] == ["comfyui.cast"]
    m = promised[0]["measured"]
    assert m["quantity"] == "relative error" and m["value"] == pytest.approx(error, abs=1e-6)
    assert (m["value"] == 0.0) is (dtype == torch.int16)  # codes stored wide survive the cast
    assert _shown(text, promised[0]), text
    d008 = [f for f in findings if f["code"] == "D008"]
    assert [f["measured"] for f in d008] == ([] if dtype == torch.int16 else [m])


@pytest.mark.parametrize("e5m2", [True, False])
def test_a_legacy_value_cast_is_measured(tmp_path, capsys, e5m2):
    path, tensor, error = _legacy(tmp_path, e5m2)
    text, findings = _run(capsys, path, "--target", "comfyui")
    promised = _promising(findings)
    assert [(f["code"], f["tensor"]) for f in promised] == [("comfyui.legacy", tensor)]
    m = promised[0]["measured"]
    assert m["quantity"] == "relative error" and m["value"] == pytest.approx(error, abs=1e-3)
    assert _shown(text, promised[0]), text


def test_a_promise_deep_cannot_keep_says_why(tmp_path, capsys):
    """A correction beside a weight stored as I16 (not the layout's packed bytes): the share
    cannot be computed, and the finding says so instead of staying silent."""
    layer = make_layer("w4a8_asym", PREFIX, 32, 256, seed=1)
    layer = replace(layer, tensors=dict(layer.tensors, weight=layer.tensors["weight"].to(torch.int16)))
    path = write_layers(tmp_path / "odd.safetensors", [layer])
    text, findings = _run(capsys, path)
    promised = {f["code"]: f for f in _promising(findings)}
    assert sorted(promised) == ["comfyui.cast", "comfyui.correction"]
    assert promised["comfyui.cast"]["measured"]["value"] == 0.0  # the I16 values are the codes: the cast keeps them
    m = promised["comfyui.correction"]["measured"]
    assert m["value"] is None and m["why"]
    assert f"  measured relative error not measured: {m['why']}" in text
