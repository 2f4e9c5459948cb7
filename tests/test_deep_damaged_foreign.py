"""``check --deep`` on damaged files in every layout ends with a report or a one-line refusal.

The seeds are written by the layouts' own test writers (``foreign_seeds``: ComfyUI's legacy
scaled FP8, musubi, ModelOpt, BFL, INT8-Fast, convert_to_quant, nunchaku), by comfy-kitchen
0.2.40 (``kitchen``) and by the ``gguf`` package's writer; each damage changes one tensor and
keeps the rest of the container whole, so the readers behind ``--deep`` (the dialects' settle
hooks, the value checks, the measurements) meet the damage itself.  Every run must end with exit
0, 1 or 2 -- never an internal error, never a numpy warning on stderr -- and a tensor whose bytes
are not what its header says is never read for its values: what only its values can tell stays
open, and says so.
"""

from __future__ import annotations

import json
import random
import warnings
from importlib.metadata import version

import pytest

import foreign_seeds as fs
from comfyquant.cli import main

pytestmark = pytest.mark.needs_torch


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep-seeds")
    return {name: fs.seed(name, folder) for name in fs.DEEP_SEEDS}


def _damaged(tmp_path, src: str, *specs, name: str = "d.safetensors") -> str:
    header, data = fs.read(src)
    rand = random.Random(0)
    for spec in specs:
        header, data = fs.damage_tensor(header, data, spec, rand)
    return fs.write_raw(str(tmp_path / name), header, data)


def _index(src: str, tensor: str) -> int:
    header, _ = fs.read(src)
    return fs.tensors_of(header).index(tensor)


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("kind", ["short", "long"])
@pytest.mark.parametrize("suffix", ["wscales", "wzeros"])
def test_a_nunchaku_awq_layer_with_a_short_or_long_scale_span_is_reported_not_read(tmp_path, capsys, seeds, suffix, kind):
    src = seeds["nunchaku"]
    tensor = f"transformer_blocks.0.norm1.linear.{suffix}"
    path = _damaged(tmp_path, src, (kind, _index(src, tensor)))
    rc, out, err = _cli(capsys, "check", path, "--deep", "--json", "-v")
    assert rc == 1 and err == "", err
    findings = json.loads(out)["findings"]
    assert any(f["code"] == "C001" and f["tensor"] == tensor for f in findings)
    open_ = [f for f in findings if f["code"] == "F003"]
    assert len(open_) == 1 and "cannot be read" in open_[0]["message"] and "wzeros + 8 * wscales" in open_[0]["message"]


def test_modelopt_padded_block_scales_of_the_wrong_size_are_reported_not_read(tmp_path, capsys, seeds):
    src = seeds["modelopt-padded"]
    tensor = "blocks.0.proj.weight_scale"
    path = _damaged(tmp_path, src, ("short", _index(src, tensor)))
    rc, out, err = _cli(capsys, "check", path, "--deep", "--json", "-v")
    assert rc == 1 and err == "", err
    findings = json.loads(out)["findings"]
    assert any(f["code"] == "C001" and f["tensor"] == tensor for f in findings)
    assert any(f["code"] == "F003" and "the padding the translation drops is zero" in f["message"] for f in findings)


def test_a_gguf_type_gguf_cannot_decode_is_one_line_naming_gguf_and_its_version(tmp_path, capsys):
    pytest.importorskip("gguf")
    path = fs.gguf_seeds(tmp_path)["gguf-q8_1"]
    rc, out, err = _cli(capsys, "check", path, "--deep")
    assert rc == 2 and out == ""
    assert err == (
        f"comfyquant: {path}: tensor 'blocks.0.weight' has ggml type Q8_1, which gguf {version('gguf')} cannot dequantize\n"
    )


def test_non_finite_values_and_scales_are_findings_never_warnings_on_stderr(tmp_path, capsys, seeds):
    """NaN/Inf in a legacy cast, a nunchaku AWQ scale and a W4A8 group scale: findings (and
    measurements that say they are undefined), nothing on stderr."""
    legacy = seeds["legacy"]
    cases = [
        _damaged(tmp_path, legacy, ("values", _index(legacy, "final_layer.linear.weight"), "inf"), name="legacy.safetensors"),
        _damaged(
            tmp_path, seeds["nunchaku"], ("values", _index(seeds["nunchaku"], "transformer_blocks.0.norm1.linear.wscales"), "nan")
        ),
        _damaged(tmp_path, seeds["kitchen"], ("values", _index(seeds["kitchen"], "blocks.0.proj.weight_s_rel"), "nan")),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in cases:
            rc, out, err = _cli(capsys, "check", path, "--deep")
            assert rc in (0, 1) and err == "", (path, err)


PER_TENSOR = [
    ("shape", 0),
    ("shape", 4),
    ("shape", 8),
    ("shape", 11),
    ("dtype", "F32"),
    ("dtype", "I8"),
    ("dtype", "F8_E8M0"),
    ("short",),
    ("long",),
    ("missing",),
    ("extra", "weight_scale", "F32", "nan", 1),
    ("extra", "wzeros", "BF16", "random", 0),
    ("values", "nan"),
    ("values", "-inf"),
    ("values", "zero"),
    ("values", "neg"),
    ("values", "tiny"),
    ("group", 7),
    ("retype",),
]
"""Every damage a tensor can have, each applied to every tensor of a seed in turn."""


@pytest.mark.parametrize("seed", fs.DEEP_SEEDS)
def test_every_damage_to_every_tensor_gives_findings_or_a_refusal(tmp_path, seeds, seed):
    header, _ = fs.read(seeds[seed])
    count = len(fs.tensors_of(header))
    failures, exits = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(count):
            for damage in PER_TENSOR:
                path = _damaged(tmp_path, seeds[seed], (damage[0], i, *damage[1:]))
                code, problem = fs.deep_outcome(path)
                exits.add(code)
                if problem is not None:
                    failures.append(f"{seed} tensor {i} {damage}: {problem}")
    assert not failures, "\n".join(failures[:10])
    assert exits <= {0, 1, 2} and 1 in exits  # the damages are found


def test_every_damage_to_a_gguf_file_gives_findings_or_a_refusal(tmp_path):
    pytest.importorskip("gguf")
    failures, exits = [], set()
    rand = random.Random(0)
    specs = [("type", t, code) for t in range(5) for code in (0, 1, 2, 8, 9, 12, 14, 16, 39, 40, 41, 99)]
    specs += [("dim", t, d, v) for t in range(5) for d in range(2) for v in (0, 1, 33, 256, 1 << 40)]
    specs += [("offset", t, delta) for t in range(5) for delta in (-32, 32, 1 << 20)]
    specs += [("values", at, how) for at in range(0, 4096, 256) for how in ("nan", "inf", "max", "random")]
    specs += [("truncate", n) for n in (1, 32, 300)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, src in fs.gguf_seeds(tmp_path).items():
            with open(src, "rb") as fh:
                raw = fh.read()
            fields = fs.gguf_tensor_fields(raw)
            for spec in specs:
                path = tmp_path / "d.gguf"
                path.write_bytes(fs.damage_gguf(raw, fields, spec, rand))
                code, problem = fs.deep_outcome(str(path))
                exits.add(code)
                if problem is not None:
                    failures.append(f"{name} {spec}: {problem}")
    assert not failures, "\n".join(failures[:10])
    assert exits == {1, 2}
