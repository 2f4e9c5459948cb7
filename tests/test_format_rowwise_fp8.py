"""SGLang's rowwise FP8 (``rowwise-float8_e4m3fn``): one format package (``formats/rowwise_fp8``),
SGLang's reader modelled in ``targets/sglang_rowwise`` (proven against the wheel in
``test_runtime_agreement_sglang_rowwise.py``), the ``sglang-rowwise`` layout for ``migrate``.
Every command on files comfyquant writes: quantize, check, inspect, migrate both ways."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.errors import InputError
from comfyquant.formats import registry

NAME = "rowwise-float8_e4m3fn"
ROOT = Path(__file__).resolve().parent.parent
DENSE = ROOT / "examples" / "dense_tiny.safetensors"
LAYER = "blocks.0.attn.qkv"


def _map(path) -> dict:
    raw = Path(path).read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    return json.loads(header["__metadata__"]["_quantization_metadata"])


def _file(tmp_path, name="rw", qmap=None, scale=None, input_scale=None, n=32, k=64, extra=None) -> str:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=g) * 0.05
    s = (w.abs().amax(dim=1) / 448).float() if scale is None else scale
    t = {f"{LAYER}.weight": (w / s.reshape(-1, 1)[: w.shape[0]]).to(torch.float8_e4m3fn), f"{LAYER}.weight_scale": s}
    if input_scale is not None:
        t[f"{LAYER}.input_scale"] = input_scale
    t["blocks.0.proj.weight"] = torch.randn(k, k, generator=g).to(torch.bfloat16)
    t.update(extra or {})
    if qmap is None:
        qmap = {
            "format_version": "1.1",
            "layers": {LAYER: NAME, "blocks.0.proj": "bf16"},
            "quant_configs": {NAME: {"scale_recipe": "rowwise"}},
        }
    path = tmp_path / f"{name}.safetensors"
    save_file(t, str(path), metadata={"_quantization_metadata": json.dumps(qmap)})
    return str(path)


def _first(path) -> tuple[str | None, str]:
    v = comfyquant.check(path, target="sglang").verdicts["sglang"].first
    return (None, "") if v is None else (v.exception, v.message)


def test_the_format_lives_in_its_own_package():
    fmt = registry.FORMATS[NAME]
    assert fmt.codec_module == "comfyquant.formats.rowwise_fp8.codec"
    assert registry.lookup("rowwise-fp8") is fmt
    assert fmt.loaders == frozenset({"sglang"})


def test_quantize_writes_sglangs_map_and_the_verdicts(tmp_path):
    out = tmp_path / "q.safetensors"
    comfyquant.quantize(str(DENSE), str(out), format="rowwise-fp8", target="sglang")
    qmap = _map(out)
    assert qmap["format_version"] == "1.1" and qmap["quant_configs"] == {NAME: {"scale_recipe": "rowwise"}}
    assert set(qmap["layers"].values()) == {NAME}
    stored = load_file(str(out))
    assert not [n for n in stored if n.endswith(".comfy_quant")]
    for prefix in qmap["layers"]:
        assert stored[f"{prefix}.weight_scale"].shape == (stored[f"{prefix}.weight"].shape[0],)
    report = comfyquant.check(str(out))
    assert report.verdicts["sglang"].loads
    # ComfyUI 0.33.0 turns each string entry into a marker and calls .get on it (its real loader, run in
    # test_runtime_agreement_sglang_rowwise.py); comfy-kitchen reads no map
    assert report.verdicts["comfyui"].first.message == "'str' object has no attribute 'get'"
    assert report.verdicts["comfy-kitchen"].loads
    assert comfyquant.inspect(str(out)).to_dict()["dialect"] == "sglang-rowwise"


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (
            {"qmap": {"format_version": "1.0", "layers": {LAYER: NAME}}},
            "unsupported quantization format_version '1.0'; expected one of ['1.1']",
        ),
        ({"qmap": {"format_version": "1.1", "layers": {LAYER: NAME, "x": "fp16"}}}, "unknown quant format 'fp16' for layer 'x'"),
        (
            {"qmap": {"format_version": "1.1", "layers": {LAYER: NAME}}},
            "missing quant_configs['rowwise-float8_e4m3fn'] layout descriptor",
        ),
        (
            {"qmap": {"format_version": "1.1", "layers": {LAYER: NAME}, "quant_configs": {NAME: {"scale_recipe": "tensorwise"}}}},
            "unsupported FP8 scale_recipe 'tensorwise'; only 'rowwise' is supported",
        ),
        ({"scale": torch.ones(32, 1)}, f"{LAYER}.weight_scale: row-wise scale must have shape [32], got [32, 1]"),
        ({"scale": torch.ones(32, dtype=torch.bfloat16)}, f"{LAYER}.weight_scale: expected dtype F32, got BF16"),
        (
            {"input_scale": torch.tensor(0.5)},
            f"{LAYER}.input_scale: static input_scale must be float32 shape [1], got dtype=F32 shape=[]",
        ),
        (
            {"extra": {"blocks.0.proj.weight_scale": torch.ones(64)}},
            "unexpected quantization tensor 'blocks.0.proj.weight_scale' for a non-FP8 layer",
        ),
    ],
)
def test_check_gives_sglangs_message_for_each_defect(tmp_path, kwargs, expected):
    assert _first(_file(tmp_path, **kwargs)) == ("RowwiseFp8Error", expected)


def test_a_static_input_scale_loads(tmp_path):
    assert _first(_file(tmp_path, input_scale=torch.tensor([0.5]))) == (None, "")


def test_check_and_inspect_import_no_torch(tmp_path):
    path = _file(tmp_path)
    code = (
        "import sys, comfyquant; comfyquant.check(sys.argv[1]); comfyquant.inspect(sys.argv[1]); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True)


def test_migrate_refuses_rows_with_different_scales_naming_the_layer(tmp_path):
    path = _file(tmp_path)
    with pytest.raises(InputError) as err:
        comfyquant.migrate(path, out=str(tmp_path / "out.safetensors"))
    text = str(err.value)
    assert "\n" not in text and f"'{LAYER}'" in text and "one scale per tensor" in text
    lossy = comfyquant.migrate(path, out=str(tmp_path / "lossy.safetensors"), allow_lossy=True)
    assert lossy.ok
    assert comfyquant.check(str(tmp_path / "lossy.safetensors")).verdicts["comfyui"].loads


def test_migrate_both_ways_is_exact_for_comfy_fp8(tmp_path):
    fp8, rw, back = (tmp_path / f"{n}.safetensors" for n in ("fp8", "rw", "back"))
    comfyquant.quantize(str(DENSE), str(fp8), format="fp8")
    assert comfyquant.migrate(str(fp8), out=str(rw), to="sglang-rowwise").ok
    qmap = _map(rw)
    assert qmap["format_version"] == "1.1" and NAME in qmap["layers"].values()
    assert comfyquant.check(str(rw), target="sglang").verdicts["sglang"].loads
    assert comfyquant.migrate(str(rw), out=str(back)).ok
    a, b = load_file(str(fp8)), load_file(str(back))
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name].reshape(-1).view(torch.uint8), b[name].reshape(-1).view(torch.uint8)), name


def test_migrate_to_rowwise_refuses_other_formats_naming_the_layer(tmp_path):
    w4a8 = tmp_path / "w4a8.safetensors"
    comfyquant.quantize(str(DENSE), str(w4a8), format="int8")
    with pytest.raises(InputError) as err:
        comfyquant.migrate(str(w4a8), out=str(tmp_path / "o.safetensors"), to="sglang-rowwise")
    text = str(err.value)
    assert "\n" not in text and "only rowwise-float8_e4m3fn and bf16 layers" in text and "layer '" in text


def test_convert_writes_rowwise_from_a_comfy_file(tmp_path):
    fp8, out = tmp_path / "fp8.safetensors", tmp_path / "rw.safetensors"
    comfyquant.quantize(str(DENSE), str(fp8), format="fp8")
    assert comfyquant.convert(str(fp8), str(out), to="rowwise-fp8", target="sglang").ok
    assert set(_map(out)["layers"].values()) == {NAME}
    assert comfyquant.check(str(out), target="sglang").verdicts["sglang"].loads
