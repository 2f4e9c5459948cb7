"""``repair.memory.repaired``: a checkpoint read as ``fix``/``migrate`` would write it, with
nothing written -- the same tensors, bytes and markers as the file they write."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.repair.memory import RepairRefused, repaired
from test_dialect_legacy import legacy_file

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


@pytest.fixture(scope="module")
def fp8(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("fp8") / "fp8.safetensors")
    comfyquant.quantize(os.path.join(EXAMPLES, "dense_tiny.safetensors"), out, "float8_e4m3fn", progress=False)
    return out


def _load(path: str) -> tuple[dict, dict]:
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def _broken(fp8: str, tmp_path, how: str) -> str:
    sd, meta = _load(fp8)
    layer = sorted(json.loads(meta["_quantization_metadata"])["layers"])[1]
    if how == "no markers":
        meta.pop("_quantization_metadata")
        sd = {k: v for k, v in sd.items() if not k.endswith(".comfy_quant")}
    elif how == "U8 weight":
        sd[f"{layer}.weight"] = sd[f"{layer}.weight"].view(torch.uint8)
    elif how == "BF16 scale":
        sd[f"{layer}.weight_scale"] = sd[f"{layer}.weight_scale"].to(torch.bfloat16)
    path = str(tmp_path / f"{how.replace(' ', '_')}.safetensors")
    save_file(sd, path, metadata=meta)
    return path


def _same_as_file(view, path: str) -> None:
    with open_checkpoint(path) as written:
        assert set(view.tensors) == set(written.tensors)
        for name, entry in view.tensors.items():
            other = written.tensors[name]
            assert (entry.dtype, tuple(entry.shape)) == (other.dtype, tuple(other.shape)), name
            assert view.read_bytes(entry) == written.read_bytes(other), name


@pytest.mark.parametrize("how", ["no markers", "U8 weight", "BF16 scale"])
def test_the_view_is_what_fix_writes(fp8, tmp_path, how):
    broken = _broken(fp8, tmp_path, how)
    before = os.stat(broken)
    fixed = str(tmp_path / "fixed.safetensors")
    comfyquant.fix(broken, out=fixed)
    with repaired(broken, target="comfyui") as result:
        assert result.changed and result.notes()
        assert result.after.verdicts["comfyui"].loads
        _same_as_file(result.view, fixed)
        _, meta = _load(fixed)
        assert result.quant_map() == json.loads(meta["_quantization_metadata"])["layers"]
    assert os.stat(broken).st_mtime_ns == before.st_mtime_ns and sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(broken), "fixed.safetensors"]
    )  # nothing written beside them


def test_a_clean_file_is_read_as_stored(fp8):
    with repaired(fp8) as result:
        assert not result.changed and result.notes() == []
        _same_as_file(result.view, fp8)


def test_another_layout_is_what_migrate_writes(tmp_path):
    src = str(tmp_path / "legacy.safetensors")
    legacy_file(src, prefix="model.diffusion_model.", scale_input=0.5)
    migrated = str(tmp_path / "migrated.safetensors")
    comfyquant.migrate(src, out=migrated)
    with repaired(src, target="comfyui") as result:
        assert any("migrate comfy-legacy-fp8" in line for line in result.notes())
        _same_as_file(result.view, migrated)


def test_a_lossy_layer_is_refused_in_one_line_unless_allowed(tmp_path):
    src = str(tmp_path / "legacy.safetensors")
    legacy_file(src, per_channel=True)
    with pytest.raises(RepairRefused) as refused:
        with repaired(src):
            pass
    message = str(refused.value)
    assert message.startswith(f"refusing to load {src}: layer 'blocks.0.mlp.fc1': ") and "\n" not in message
    with repaired(src, allow_lossy=True) as result:
        assert result.after.verdicts["comfyui"].loads
        assert any("re-quantize" in line for line in result.notes())


def test_what_nothing_repairs_is_refused_with_the_checks_words(fp8, tmp_path):
    sd, meta = _load(fp8)
    layers = json.loads(meta["_quantization_metadata"])["layers"]
    layer = sorted(layers)[0]
    layers[layer] = {"format": "no_such_format"}  # ComfyUI raises KeyError; nothing says what it was
    meta["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": layers})
    sd[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(layers[layer]).encode()), dtype=torch.uint8)
    bad = str(tmp_path / "bad.safetensors")
    save_file(sd, bad, metadata=meta)
    report = comfyquant.check(bad, target="comfyui")
    first = next(f for f in report.findings if f.severity == "error")
    with pytest.raises(RepairRefused) as refused:
        with repaired(bad):
            pass
    assert str(refused.value).startswith(f"refusing to load {bad}: ") and first.message in str(refused.value)
