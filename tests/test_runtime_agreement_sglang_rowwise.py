"""SGLang's rowwise FP8 format (``rowwise-float8_e4m3fn``) against SGLang 0.5.23's own reader.

* The generated rowwise space (``runtimes/rowwise_cases.py``: valid files and every class of
  defect SGLang's ``RowwiseFp8Error`` names, plus seeded two-defect files) and its held-out
  geometry: comfyquant's SGLang verdict equals what SGLang's own
  ``get_quant_config_from_safetensors_metadata`` (executed from the wheel, ``sglang_driver``)
  does with each file: the same exception type and message, or a ``RowwiseFp8Config``.
* ``comfyquant quantize --format rowwise-fp8`` writes a file SGLang's reader builds a config
  from, whose weights SGLang's own ``dequantize_rowwise_fp8_weight`` turns into the dense layer
  comfyquant's codec decodes (bit for bit) and close to the source.

Skipped with one line when the wheel cannot be downloaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="SGLang's reader opens files through torch")

from runtimes import rowwise_cases, sglang_driver  # noqa: E402
from runtimes.agreement import compare, running, summary, table  # noqa: E402

TARGET = "sglang"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runtime():
    with running(sglang_driver) as drv:
        yield drv


def _written(folder: Path, shapes) -> list:
    cases = rowwise_cases.generate(0, shapes)
    for case in cases:
        case.write(folder)
    return cases


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    return _written(tmp_path_factory.mktemp("rowwise"), rowwise_cases.SHAPES)


@pytest.mark.parametrize("group", rowwise_cases.GROUPS)
def test_verdicts_agree(space, runtime, group):
    rows = compare(runtime, TARGET, [c for c in space if c.group == group])
    assert rows
    bad = [r for r in rows if r.why is not None]
    print(f"{group}: {summary(rows)}")
    assert not bad, f"{sglang_driver.VERSION}: {summary(rows)}\n{table(bad)}"


def test_held_out_geometry_agrees(tmp_path, runtime):
    rows = compare(runtime, TARGET, _written(tmp_path, rowwise_cases.HELD_OUT))
    bad = [r for r in rows if r.why is not None]
    print(summary(rows))
    assert not bad, f"{sglang_driver.VERSION}: {summary(rows)}\n{table(bad)}"


def test_space_covers_every_reader_failure(space, runtime):
    """Each failure SGLang's rowwise reader has is met by some case, so agreement proves it."""
    messages = {runtime.run(c.path).message for c in space if c.group != "valid"}
    starts = (
        "unsupported quantization format_version",
        "_quantization_metadata has no 'layers' map",
        "unknown quant format",
        "_quantization_metadata declares no quantized layers",
        "missing quant_configs[",
        "unsupported FP8 scale_recipe",
        "FP8 layer 'blocks.0.attn.qkv' missing weight tensor",
        "FP8 layer 'blocks.0.attn.qkv' missing weight_scale tensor",
        "blocks.0.attn.qkv.weight: expected dtype F8_E4M3",
        "blocks.0.attn.qkv.weight: expected 2-D weight",
        "blocks.0.attn.qkv.weight_scale: expected dtype F32",
        "blocks.0.attn.qkv.weight_scale: row-wise scale must have shape",
        "blocks.0.attn.qkv.input_scale: static input_scale must be float32 shape [1]",
        "unexpected quantization tensor",
    )
    missing = [s for s in starts if not any(m.startswith(s) for m in messages)]
    assert not missing


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])


def test_quantize_writes_what_sglang_reads_and_computes(tmp_path, runtime):
    from safetensors.torch import load_file

    import comfyquant
    from comfyquant.formats.rowwise_fp8.codec import CODECS

    src = ROOT / "examples" / "dense_tiny.safetensors"
    out = tmp_path / "tiny.rowwise.safetensors"
    comfyquant.quantize(str(src), str(out), format="rowwise-fp8", target="sglang")
    header = _header(out)
    qmap = json.loads(header["__metadata__"]["_quantization_metadata"])
    assert qmap["format_version"] == "1.1"
    assert qmap["quant_configs"] == {"rowwise-float8_e4m3fn": {"scale_recipe": "rowwise"}}
    assert not [n for n in header if n.endswith(".comfy_quant")]

    result = runtime.oracle.outcome([out])
    assert (result.stage, result.config) == ("ok", "RowwiseFp8Config")
    assert comfyquant.check(str(out), target=TARGET).verdicts[TARGET].to_dict()["loads"]

    stored, dense = load_file(str(out)), load_file(str(src))
    layers = [p for p, v in qmap["layers"].items() if v == "rowwise-float8_e4m3fn"]
    assert layers
    for prefix in layers:
        w, s = stored[f"{prefix}.weight"], stored[f"{prefix}.weight_scale"]
        theirs = runtime.oracle.dequantize_rowwise_fp8_weight(w, s, torch.float32)
        ours = CODECS["rowwise-float8_e4m3fn"].decode({"weight": w, "weight_scale": s}, dtype=torch.float32)
        assert torch.equal(theirs, ours), prefix
        ref = dense[f"{prefix}.weight"].float()
        rel = ((theirs - ref).norm() / ref.norm()).item()
        assert rel < 0.05, (prefix, rel)


@pytest.mark.parametrize("target", ["comfyui", "comfy-kitchen"])
def test_comfyui_and_kitchen_verdicts_on_rowwise_files(space, target):
    """What ComfyUI 0.33.0 (its own loader, from the source cache) and comfy-kitchen 0.2.40 do
    with SGLang's rowwise FP8 files: comfyquant's verdicts for them agree, except the cases
    ``known/comfyui.rowwise.txt`` lists (and none of those may agree)."""
    from runtimes.agreement import driver_module, known_disagreements, known_path

    with running(driver_module(target)) as drv:
        rows = compare(drv, target, space)
    known = known_disagreements(target, "rowwise")
    print(f"{target}: {summary(rows)}")
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    assert not new, f"{summary(rows)}\n{table(new)}"
    fixed = sorted(r.case.id for r in rows if r.why is None and r.case.id in known)
    assert not fixed, f"these cases now agree: take them off {known_path(target, 'rowwise').name}: {fixed}"
