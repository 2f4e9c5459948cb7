"""ComfyUI-INT8-Fast files (dialect ``int8-fast``).

Files are built as the writers build them:
* BobJohnson24/ComfyUI-INT8-Fast ``int8_save.py::INT8ModelSave.save``: ``comfy.sd.save_checkpoint``
  puts the model under ``model.diffusion_model.``, the node adds ``model.<module>.comfy_quant``
  (``{"quarot": ...}`` in the first saves, commit 4ea43bc; ``{"convrot", "per_row"}`` later;
  ``{"format": "int8_tensorwise", ...}`` last) and a scalar ``weight_scale`` as
  ``torch.tensor(float)``; row scales are ``int8_quant.py::quantize_int8_axiswise``'s ``[N, 1]``;
  the header keeps ``int8_quantized``/``int8_model_type``;
* Winnougan/WINT8-ComfyUI ``wint8_model_quantizer.py::_quantize_builtin``: per-row INT8 after an
  optional Sylvester-Hadamard rotation (``wint8_quarot.py``), ``input_scale`` 1.0, flag tensors.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import comfyquant
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.dialects import registry
from comfyquant.dialects.base import EXACT, LOSSY, REFUSED
from comfyquant.dialects.report import claim_violations
from comfyquant.errors import InputError

NAME = "int8-fast"
ROOT = "model.diffusion_model."


def marker(d: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(d).encode("utf-8")), dtype=torch.uint8)


def weight(n=64, k=256, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.02


def int8_rowwise(w: torch.Tensor):
    """``quantize_int8_axiswise(w, dim=1)``: F32 ``[N, 1]`` scales."""
    scale = (w.abs().amax(dim=1, keepdim=True).float() / 127.0).clamp(min=1e-30)
    return w.float().mul(1.0 / scale).round_().clamp_(-128.0, 127.0).to(torch.int8), scale


def int8_scalar(w: torch.Tensor):
    """``quantize_int8_tensorwise``; the save node writes ``torch.tensor(module._weight_scale_scalar)``."""
    scale = (w.abs().max().float() / 127.0).clamp(min=1e-30)
    return w.float().mul(1.0 / scale).round_().clamp_(-128.0, 127.0).to(torch.int8), torch.tensor(scale.item())


def sylvester(size: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / size**0.5


def save(path, layers: dict, metadata=None, extra=None) -> str:
    """``layers``: module name -> (q, scale, marker dict or None, extra tensors by suffix)."""
    sd = {}
    for name, (q, s, m, more) in layers.items():
        sd[f"{ROOT}{name}.weight"] = q
        sd[f"{ROOT}{name}.weight_scale"] = s
        sd[f"{ROOT}{name}.bias"] = torch.zeros(q.shape[0], dtype=torch.bfloat16)
        if m is not None:
            sd[f"model.diffusion_model.{name}.comfy_quant"] = marker(m)  # "model." + module name
        for sfx, t in (more or {}).items():
            sd[f"{ROOT}{name}.{sfx}"] = t
    sd.update(extra or {})
    save_file(sd, str(path), metadata=metadata)
    return str(path)


META = {"int8_quantized": "true", "int8_model_type": "flux2"}


def detect(path):
    with open_checkpoint(path) as ck:
        return registry.detect(ck)


def moved(path, tr) -> dict:
    with open_checkpoint(path) as ck:
        out = {}
        for m in tr.moves:
            data = ck.read_bytes(ck.tensors[m.source])
            out[m.suffix] = (m.dtype, m.shape, m.transform(data) if m.transform else data)
        return out


GENERATIONS = [
    # (marker as saved, rotated, expected variant)
    ({"quarot": False}, False, "per-row, no format"),
    ({"quarot": True, "quarot_groupsize": 256}, True, "convrot, no format"),
    ({"convrot": False, "per_row": True}, False, "per-row, no format"),
    ({"convrot": True, "convrot_groupsize": 64, "per_row": True}, True, "convrot, no format"),
    ({"format": "int8_tensorwise", "convrot": False, "per_row": True}, False, "per-row"),
    ({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256, "per_row": True}, True, "convrot"),
]


@pytest.mark.parametrize("saved, rotated, variant", GENERATIONS, ids=lambda x: json.dumps(x) if isinstance(x, dict) else None)
def test_every_marker_generation_becomes_canonical_int8_exactly(tmp_path, saved, rotated, variant):
    q, s = int8_rowwise(weight())
    path = save(tmp_path / "i8.safetensors", {"blocks.0.qkv": (q, s, saved, None)}, META)
    det = detect(path)
    assert det.name == NAME
    tr = det.layers[ROOT + "blocks.0.qkv"]
    assert (tr.verdict, tr.variant, tr.format) == (EXACT, variant, "int8_tensorwise")
    size = saved.get("convrot_groupsize", saved.get("quarot_groupsize"))
    expected = {"format": "int8_tensorwise", **({"convrot": True, "convrot_groupsize": size} if rotated else {})}
    assert tr.marker == expected  # per_row / quarot gone, format added
    assert tr.out_prefix == tr.prefix  # ComfyUI's checkpoint prefix stays
    out = moved(path, tr)
    assert out["weight"] == ("I8", (64, 256), q.numpy().tobytes())
    assert out["weight_scale"] == ("F32", (64, 1), s.numpy().tobytes())
    assert sorted(out) == ["bias", "weight", "weight_scale"]


def test_scalar_scale_and_flat_row_scale_are_reshaped_exactly(tmp_path):
    w = weight()
    q1, s1 = int8_scalar(w)
    q2, s2 = int8_rowwise(w)
    path = save(
        tmp_path / "i8.safetensors",
        {
            "a": (q1, s1, {"convrot": False, "per_row": False}, None),
            "b": (q2, s2.reshape(64), {"format": "int8_tensorwise", "per_row": True}, None),
            "c": (q1.clone(), s1.clone().reshape(1), {"format": "int8_tensorwise", "per_row": False}, None),
        },
        META,
    )
    det = detect(path)
    a, b, c = (det.layers[ROOT + x] for x in "abc")
    assert [t.verdict for t in (a, b, c)] == [EXACT] * 3
    assert moved(path, a)["weight_scale"] == ("F32", (), s1.numpy().tobytes())
    assert moved(path, b)["weight_scale"] == ("F32", (64, 1), s2.numpy().tobytes())
    assert moved(path, c)["weight_scale"] == ("F32", (), s1.numpy().tobytes())
    assert "[64] -> [64, 1]" in b.why


def test_the_format_less_marker_is_claimed_without_the_header_flags(tmp_path):
    q, s = int8_rowwise(weight())
    path = save(tmp_path / "i8.safetensors", {"x": (q, s, {"convrot": False, "per_row": True}, None)})
    assert detect(path).name == NAME


def test_other_writers_int8_layers_are_not_claimed(tmp_path):
    q, s = int8_rowwise(weight())
    path = save(
        tmp_path / "i8.safetensors",
        {
            # ComfyUI / comfyquant: the canonical marker
            "a": (q, s, {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}, None),
            # convert_to_quant: per_row together with orig_dtype
            "b": (q.clone(), s.clone(), {"format": "int8_tensorwise", "per_row": True, "orig_dtype": "bfloat16"}, None),
        },
    )
    assert NAME not in detect(path).names


def test_canonical_layers_in_a_flagged_file_are_comfys(tmp_path):
    """What ``migrate`` writes keeps INT8-Fast's header flags; its layers are canonical and
    nothing claims them any more."""
    q, s = int8_rowwise(weight())
    path = save(
        tmp_path / "i8.safetensors",
        {
            "a": (q, s, {"format": "int8_tensorwise"}, None),
            "b": (q.clone(), s.clone(), {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}, None),
        },
        META,
    )
    assert detect(path).names == ["comfy"]


def test_wint8_sylvester_rotation_is_lossy_and_decodes_to_the_unrotated_weight(tmp_path):
    w = weight()
    h = sylvester(128)
    rotated = (w.view(64, 2, 128) @ h.T).reshape(64, 256)  # wint8_quarot.rotate_weight
    amax = rotated.abs().amax(dim=1, keepdim=True)
    scale = (amax / 127.0).clamp(min=1e-8)
    q = (rotated / scale).round().clamp(-128, 127).to(torch.int8)
    m = {"format": "int8_tensorwise", "per_row": True, "convrot": True, "convrot_groupsize": 128}
    path = save(
        tmp_path / "w.safetensors",
        {"x": (q, scale, m, {"input_scale": torch.tensor(1.0)})},
        extra={
            "int8_quantized": torch.tensor(1, dtype=torch.uint8),
            "int8_model_type": torch.tensor(list(b"flux2"), dtype=torch.uint8),
        },
    )
    det = detect(path)
    assert sorted(det.claim(NAME).drop) == ["int8_model_type", "int8_quantized"]  # WINT8's marks go with its rotation
    tr = det.layers[ROOT + "x"]
    assert tr.verdict == LOSSY and "Sylvester" in tr.variant and tr.format is None
    assert tr.lossy.format == "int8_tensorwise"
    dense = tr.decoder({"weight": q, "weight_scale": scale})
    reference = ((q.double() * scale.double()).view(64, 2, 128) @ sylvester(128).double()).reshape(64, 256)
    assert dense.dtype == torch.float32 and torch.allclose(dense.double(), reference, rtol=1e-6, atol=1e-12)
    # the un-rotated decode is the original weight up to INT8 rounding, the rotated one is not
    assert (dense - w).abs().max() < 0.01 * w.abs().max()
    assert (q.float() * scale - w).abs().max() > 0.1 * w.abs().max()


def test_the_hadamard_is_scipys(tmp_path):
    scipy_linalg = pytest.importorskip("scipy.linalg")
    assert torch.equal(sylvester(64) * 8, torch.tensor(scipy_linalg.hadamard(64), dtype=torch.float32))


def test_a_wint8_power_of_4_rotation_is_still_sylvester(tmp_path):
    q, s = int8_rowwise(weight())
    m = {"format": "int8_tensorwise", "per_row": True, "convrot": True, "convrot_groupsize": 64}
    path = save(
        tmp_path / "w.safetensors",
        {"x": (q, s, m, {"input_scale": torch.tensor(1.0)})},
        extra={"int8_quantized": torch.tensor(1, dtype=torch.uint8)},
    )
    assert detect(path).layers[ROOT + "x"].verdict == LOSSY


def test_unrotated_wint8_layers_drop_input_scale_exactly(tmp_path):
    q, s = int8_rowwise(weight())
    path = save(
        tmp_path / "w.safetensors",
        {"x": (q, s, {"format": "int8_tensorwise", "per_row": True}, {"input_scale": torch.tensor(1.0)})},
        extra={"int8_quantized": torch.tensor(1, dtype=torch.uint8)},
    )
    tr = detect(path).layers[ROOT + "x"]
    assert tr.verdict == EXACT and tr.drops == [ROOT + "x.input_scale"]
    assert "input_scale" not in [m.suffix for m in tr.moves]


@pytest.mark.parametrize(
    "m, why",
    [
        ({"convrot": True, "convrot_groupsize": 96, "per_row": True}, "not a power of 2"),
        ({"convrot": True, "convrot_groupsize": "x", "per_row": True}, "not a positive size"),
    ],
)
def test_impossible_rotations_are_refused(tmp_path, m, why):
    q, s = int8_rowwise(weight())
    tr = detect(save(tmp_path / "i8.safetensors", {"x": (q, s, m, None)})).layers[ROOT + "x"]
    assert tr.verdict == REFUSED and why in tr.why


def test_runtime_models(tmp_path):
    q, s = int8_rowwise(weight())
    path = save(
        tmp_path / "i8.safetensors",
        {
            "blocks.0.qkv": (q, s, {"convrot": False, "per_row": True}, None),
            "blocks.1.qkv": (q.clone(), s.clone(), {"format": "int8_tensorwise", "convrot": False, "per_row": True}, None),
        },
        META,
    )
    with open_checkpoint(path) as ck:
        det = registry.detect(ck)
        claim = det.claim(NAME)
        comfy = claim_violations(ck, claim, "comfyui")
        sglang = claim_violations(ck, claim, "sglang")
    # the profiles judge marked layers by their markers (a missing format, per_row ignored):
    # nothing is left for the dialect to add on these layers
    assert comfy == [] and sglang == []


def test_sylvester_layers_fail_in_comfyui(tmp_path):
    q, s = int8_rowwise(weight())
    path = save(
        tmp_path / "w.safetensors",
        {
            "a": (
                q,
                s,
                {"format": "int8_tensorwise", "per_row": True, "convrot": True, "convrot_groupsize": 128},
                {"input_scale": torch.tensor(1.0)},
            ),
            "b": (
                q.clone(),
                s.clone(),
                {"format": "int8_tensorwise", "per_row": True, "convrot": True, "convrot_groupsize": 64},
                {"input_scale": torch.tensor(1.0)},
            ),
        },
        extra={"int8_quantized": torch.tensor(1, dtype=torch.uint8)},
    )
    with open_checkpoint(path) as ck:
        det = registry.detect(ck)
        comfy = claim_violations(ck, det.claim(NAME), "comfyui")
    by_layer = {v.layer: v for v in comfy}
    assert by_layer[ROOT + "a"].blocking and "power of 4, got 128" in by_layer[ROOT + "a"].message
    assert by_layer[ROOT + "b"].fails and not by_layer[ROOT + "b"].blocking  # 64: the other Hadamard, silently
    assert "Sylvester" in by_layer[ROOT + "b"].message


# -- end to end (the commands, once main wires the dialects) -------------------------------

wired = pytest.mark.skipif(not hasattr(comfyquant, "migrate"), reason="the commands' dialect wiring is on main")


def dense(path) -> dict[str, torch.Tensor]:
    out = str(path) + ".dense.safetensors"
    comfyquant.dequantize(str(path), out, "f32", overwrite=True)
    return load_file(out)


def int8_fast_file(tmp_path) -> str:
    w = weight()
    q1, s1 = int8_rowwise(w)
    q2, s2 = int8_scalar(w)
    return save(
        tmp_path / "i8.safetensors",
        {
            "blocks.0.qkv": (q1, s1, {"convrot": False, "per_row": True}, None),
            "blocks.1.qkv": (q2, s2, {"format": "int8_tensorwise", "convrot": False, "per_row": False}, None),
        },
        META,
    )


@wired
def test_inspect_and_check(tmp_path, capsys):
    path = int8_fast_file(tmp_path)
    assert main(["inspect", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dialect"] == NAME
    rows = {r["layer"]: r for r in out["layers"]}
    assert rows[ROOT + "blocks.0.qkv"]["dialect"] == "int8-fast (per-row, no format)"
    assert rows[ROOT + "blocks.0.qkv"]["verdict"] == EXACT
    report = comfyquant.check(path)
    first = report.verdicts["comfyui"].first
    assert first.exception == "ValueError" and first.message.startswith("Unknown quantization format for layer")
    assert first.layer == ROOT + "blocks.0.qkv"
    assert "None" in report.verdicts["sglang"].first.message


@wired
def test_migrate_is_an_exact_round_trip(tmp_path):
    src = int8_fast_file(tmp_path)
    out = str(tmp_path / "comfy.safetensors")
    with pytest.raises(InputError, match="embedding-only"):  # SGLang loads plain INT8 on embeddings only
        comfyquant.migrate(src, out)
    result = comfyquant.migrate(src, out, target="comfyui")
    assert result.ok, result.to_dict()
    assert {r["verdict"] for r in result.to_dict()["layers"]} == {EXACT}
    with open_checkpoint(out) as ck:
        assert registry.detect(ck).names == ["comfy"]
        for p in ("blocks.0.qkv", "blocks.1.qkv"):
            assert ck.layers[ROOT + p].marker == {"format": "int8_tensorwise"}  # per_row gone, format there
        assert ck.metadata().get("int8_model_type") == "flux2"
    before, after = dense(src), dense(out)
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    assert comfyquant.check(out).verdicts["comfyui"].loads


@wired
def test_wint8_sylvester_layers_migrate_with_allow_lossy(tmp_path):
    w = weight()
    rotated = (w.view(64, 2, 128) @ sylvester(128).T).reshape(64, 256)
    scale = (rotated.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
    q = (rotated / scale).round().clamp(-128, 127).to(torch.int8)
    m = {"format": "int8_tensorwise", "per_row": True, "convrot": True, "convrot_groupsize": 128}
    src = save(
        tmp_path / "w.safetensors",
        {"x": (q, scale, m, {"input_scale": torch.tensor(1.0)})},
        extra={"int8_quantized": torch.tensor(1, dtype=torch.uint8)},
    )
    out = str(tmp_path / "comfy.safetensors")
    with pytest.raises(InputError, match="allow-lossy"):
        comfyquant.migrate(src, out, target="comfyui")
    result = comfyquant.migrate(src, out, target="comfyui", allow_lossy=True)
    assert result.ok, result.to_dict()
    with open_checkpoint(out) as ck:
        assert registry.detect(ck).names == ["comfy"]  # the WINT8 mark went with the Sylvester rotation
        assert "int8_quantized" not in ck.tensors and ROOT + "x.input_scale" not in ck.tensors
        assert ck.layers[ROOT + "x"].marker["convrot"] is True
    before, after = dense(src)[ROOT + "x.weight"], dense(out)[ROOT + "x.weight"]
    assert (before - w).abs().max() < 0.01 * w.abs().max()
    assert (after - before).abs().max() < 0.05 * w.abs().max()


@wired
def test_the_migrated_file_has_nothing_to_migrate(tmp_path, capsys):
    src = int8_fast_file(tmp_path)
    out = tmp_path / "comfy.safetensors"
    comfyquant.migrate(src, str(out), target="comfyui")
    assert main(["migrate", str(out), "-o", str(tmp_path / "again.safetensors"), "--target", "comfyui"]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert not (tmp_path / "again.safetensors").exists()
