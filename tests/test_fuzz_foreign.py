"""A fuzz campaign over every command on seeds in other writers' layouts (legacy scaled FP8,
musubi, ModelOpt, BFL, INT8-Fast, convert_to_quant, nunchaku, GGUF): the seed's header
(dtypes, shapes, offsets, names, dialect metadata and markers), its bytes and its shard set are
mutated, and every command must end with exit 0, 1 or 2 -- never an internal error --, leave the
input as it was, no temporary file, and either no output or a complete one (a refusal leaves
none).

``check --deep`` also meets one to three damaged tensors with the container kept whole
(``foreign_seeds.damage_tensor``, GGUF's ``damage_gguf``): findings or a one-line refusal,
nothing on stderr, strict JSON.

Sized for CI (a few examples per command); ``COMFYQUANT_FUZZ_EXAMPLES=500`` runs a campaign;
``tools/fuzz_deep.py`` runs the ``--deep`` damages in-process by the 100,000.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import foreign_seeds as fs
from comfyquant.cli import main

pytestmark = pytest.mark.needs_torch

EXAMPLES = int(os.environ.get("COMFYQUANT_FUZZ_EXAMPLES", "5"))
"""Examples per command: a few seconds in CI; set COMFYQUANT_FUZZ_EXAMPLES=500 for a campaign."""

COMMANDS = {
    "check": ["check", "{src}", "--deep", "--json"],
    "inspect": ["inspect", "{src}"],
    "fix": ["fix", "{src}", "-o", "{out}"],
    "migrate": ["migrate", "{src}", "-o", "{out}", "--allow-lossy"],
    "dequantize": ["dequantize", "{src}", "{out}", "--no-progress"],
    "convert": ["convert", "{src}", "-t", "fp8", "-o", "{out}", "--no-progress"],
    "compare": ["compare", "{src}", "{ref}", "--no-progress"],
    "recipe": ["recipe", "{src}"],
    "quantize": ["quantize", "{src}", "-f", "int8", "-o", "{out}", "--no-progress"],
}
WRITES = {"fix", "migrate", "dequantize", "convert", "quantize"}

DTYPES = ["", "F64", "F32", "F16", "BF16", "U8", "I8", "I32", "I64", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "X"]
SUFFIXES = [
    "weight",
    "weight_scale",
    "weight_scale_2",
    "scale_weight",
    "scale_weight_tensor",
    "scale_input",
    "input_scale",
    "bias",
    "comfy_quant",
    "qweight",
    "wscales",
    "wzeros",
    "smooth_factor",
    "proj_down",
    "weight_scalar",
    "",
]
META_KEYS = [
    "_quantization_metadata",
    "quantization_config",
    "_quantization_layout",
    "comfy_config",
    "config",
    "model_class",
    "format",
    "int8_quantized",
    "int8_model_type",
    "comfy.gguf.types",
    "_comfyquant",
    "quant_format",
]
FORMATS = ["float8_e4m3fn", "nvfp4", "mxfp8", "int8_tensorwise", "hybrid_mxfp8", "int8_blockwise", "svdq", "awq", "", None, 3]
json_scalars = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-1", "0", "1e400", "true", "null", '""', '"x"', "16", "1" + "0" * 30]),
    st.sampled_from(FORMATS).map(json.dumps),
    st.integers(-5, 1 << 20).map(str),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.dictionaries(
            st.sampled_from(['"format"', '"layers"', '"group_size"', '"quant_algo"', '"scales"', '"a"']), inner, max_size=3
        ).map(lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"),
    ),
    max_leaves=6,
)
deep = st.integers(60, 3000).map(lambda n: "[" * n + "]" * n)
dims = st.one_of(st.integers(0, 4), st.integers(5, 300), st.sampled_from([1 << 31, 1 << 40]))

header_mutation = st.one_of(
    st.tuples(st.just("dtype"), st.integers(0, 99), st.sampled_from(DTYPES)),
    st.tuples(st.just("shape"), st.integers(0, 99), st.lists(dims, max_size=4)),
    st.tuples(st.just("dim"), st.integers(0, 99), st.integers(0, 3), st.integers(-3, 3)),
    st.tuples(st.just("offsets"), st.integers(0, 99), st.integers(-16, 16), st.integers(-16, 16)),
    st.tuples(st.just("reshape"), st.integers(0, 99), st.sampled_from(["swap", "flat", "split", "unsqueeze"])),
    st.tuples(st.just("retype"), st.integers(0, 99), st.integers(0, 5)),
    st.tuples(st.just("drop"), st.integers(0, 99)),
    st.tuples(st.just("rename"), st.integers(0, 99), st.sampled_from(SUFFIXES)),
    st.tuples(st.just("metadata"), st.sampled_from(META_KEYS), json_values | deep | st.text(max_size=8)),
    st.tuples(st.just("layer-map"), st.integers(0, 99), json_values),
    st.tuples(st.just("marker"), st.integers(0, 99), json_values),
)
byte_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(1, 400)),
    st.tuples(st.just("trailing"), st.integers(1, 40)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
)
shard_mutation = st.sampled_from(["none", "index", "no-index", "lose", "loop", "bad-index", "deep-index", "stray-index"])


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign-seeds")
    out = {name: fs.seed(name, folder) for name in fs.SEEDS}
    gguf = fs.gguf_seed(folder)
    if gguf is not None:
        out["gguf"] = gguf
    return out


SAME_WIDTH = {
    **dict.fromkeys(["F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8", "BOOL"], ["F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8"]),
    **dict.fromkeys(["BF16", "F16", "I16", "U16"], ["BF16", "F16", "I16", "U16"]),
    **dict.fromkeys(["F32", "I32", "U32"], ["F32", "I32", "U32"]),
    **dict.fromkeys(["F64", "I64", "U64"], ["F64", "I64", "U64"]),
}
"""Dtypes of one width: a re-type that keeps every span valid."""


def _reshaped(shape: list[int], how: str) -> list[int]:
    """``shape`` with the same element count, rearranged."""
    if how == "swap" and len(shape) >= 2:
        return [*shape[:-2], shape[-1], shape[-2]]
    if how == "flat":
        n = 1
        for d in shape:
            n *= d
        return [n]
    if how == "split" and shape and shape[-1] % 2 == 0:
        return [*shape[:-1], 2, shape[-1] // 2]
    return [1, *shape]


def mutate_header(header: dict, data: bytes, mutations) -> tuple[dict, bytes]:
    names = fs.tensors_of(header)
    meta = dict(header.get("__metadata__") or {})
    for m in mutations:
        kind = m[0]
        name = names[m[1] % len(names)] if kind not in ("metadata",) and names else None
        entry = header.get(name) if name else None
        if kind == "dtype" and entry:
            entry["dtype"] = m[2]
        elif kind == "shape" and entry:
            entry["shape"] = list(m[2])
        elif kind == "dim" and entry and entry["shape"]:
            i = m[2] % len(entry["shape"])
            entry["shape"][i] = max(0, entry["shape"][i] + m[3])
        elif kind == "offsets" and entry:
            a, b = entry["data_offsets"]
            entry["data_offsets"] = [max(0, a + m[2]), max(0, b + m[3])]
        elif kind == "reshape" and entry:  # the same bytes, another shape: the container stays valid
            entry["shape"] = _reshaped(entry["shape"], m[2])
        elif kind == "retype" and entry:  # another dtype of the same width: the container stays valid
            same = [d for d in SAME_WIDTH.get(entry["dtype"], []) if d != entry["dtype"]]
            if same:
                entry["dtype"] = same[m[2] % len(same)]
        elif kind == "drop" and entry:
            del header[name]
            names.remove(name)
        elif kind == "rename" and entry:
            prefix = name.rsplit(".", 1)[0]
            new = f"{prefix}.{m[2]}" if m[2] else prefix
            if new not in header:
                header[new] = header.pop(name)
                names[names.index(name)] = new
        elif kind == "metadata":
            meta[m[1]] = m[2]
        elif kind == "layer-map" and name:
            prefix = name.rsplit(".", 1)[0]
            meta["_quantization_metadata"] = '{"format_version": "1.0", "layers": {' + json.dumps(prefix) + ": " + m[2] + "}}"
        elif kind == "marker" and name:
            prefix = name.rsplit(".", 1)[0]
            blob = m[2].encode("utf-8")
            header[f"{prefix}.comfy_quant"] = {
                "dtype": "U8",
                "shape": [len(blob)],
                "data_offsets": [len(data), len(data) + len(blob)],
            }
            data += blob
    if meta:
        header["__metadata__"] = meta
    return header, data


def build(folder: str, seed: str, header_mutations, byte_mutations, shards: str) -> str:
    """The mutated input in ``folder``; returns what to name on the command line."""
    src = os.path.join(folder, "in" + (".gguf" if seed.endswith(".gguf") else ".safetensors"))
    if seed.endswith(".gguf"):
        shutil.copyfile(seed, src)
    else:
        header, data = fs.read(seed)
        header, data = mutate_header(header, data, header_mutations)
        fs.write_raw(src, header, data)
    with open(src, "rb") as fh:
        raw = bytearray(fh.read())
    for m in byte_mutations:
        if m[0] == "truncate":
            del raw[max(8, len(raw) - m[1]) :]
        elif m[0] == "trailing":
            raw += bytes(m[1])
        elif m[0] == "flip" and len(raw) > 8:
            raw[min(len(raw) - 1, 8 + int(m[1] * (len(raw) - 8)))] = m[2]
    with open(src, "wb") as fh:
        fh.write(raw)
    if shards == "none" or seed.endswith(".gguf"):
        return src
    try:
        fs.read(src)
    except Exception:  # noqa: BLE001 -- a header too broken to split: the file stands alone
        return src
    model = os.path.join(folder, "model")
    try:
        paths = fs.split_shards(src, model, index=shards not in ("no-index",))
    except Exception:  # noqa: BLE001 -- offsets the splitter cannot follow
        shutil.rmtree(model, ignore_errors=True)
        return src
    os.unlink(src)
    index = os.path.join(model, "model.safetensors.index.json")
    if shards in ("lose", "loop"):
        fs.lose_shard(paths, "loop" if shards == "loop" else "gone")
    elif shards == "bad-index":
        with open(index, "w", encoding="utf-8") as fh:
            fh.write('{"weight_map": {"x.weight": "../escape.safetensors"}}')
    elif shards == "deep-index":
        with open(index, "w", encoding="utf-8") as fh:
            fh.write('{"weight_map": ' + "[" * 50_000 + "]" * 50_000 + "}")
    elif shards == "stray-index":
        with open(index, encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["weight_map"]["ghost.weight"] = "model-00002-of-00002.safetensors"
        with open(index, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    return model


def complete(path: str) -> bool:
    """A written safetensors file holds every byte its header promises, and no more."""
    with open(path, "rb") as fh:
        raw = fh.read()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + n])
    end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    return len(raw) == 8 + n + end


def outputs(out: str) -> list[str]:
    if os.path.isdir(out):
        return [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".safetensors")]
    return [out] if os.path.exists(out) else []


def run_one(capsys, seeds, command, seed_name, header_mutations, byte_mutations, shards):
    with tempfile.TemporaryDirectory() as folder:
        src = build(folder, seeds[seed_name], header_mutations, byte_mutations, shards)
        ref = os.path.join(folder, "ref" + os.path.splitext(seeds[seed_name])[1])
        shutil.copyfile(seeds[seed_name], ref)
        before = fs.snapshot(folder)
        out = os.path.join(folder, "out.safetensors")
        args = [a.replace("{src}", src).replace("{out}", out).replace("{ref}", ref) for a in COMMANDS[command]]
        rc = main(args)
        _stdout, err = capsys.readouterr()
        event(f"exit {rc}")  # --hypothesis-show-statistics: how the campaign's runs ended
        what = f"{args}: seed {seed_name}, {header_mutations}, {byte_mutations}, shards {shards}: exit {rc}: {err}"
        assert rc in (0, 1, 2) and "internal error" not in err, what
        written = outputs(out)
        if rc == 2:
            assert err.count("\n") == 1, what
            assert not written, f"refused but wrote: {what}"
        for path in written:
            assert complete(path), f"incomplete output {path}: {what}"
        after = fs.snapshot(folder)
        for path in list(after):
            if path == out or path.startswith(out + os.sep):
                del after[path]
        assert after == before, f"the input changed or a file was left: {sorted(set(after) ^ set(before))}: {what}"


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_foreign_checkpoints_never_crash_any_command(capsys, seeds, command, data):
    seed_name = data.draw(st.sampled_from(sorted(seeds)), label="seed")
    header_mutations = data.draw(st.lists(header_mutation, max_size=3), label="header")
    byte_mutations = data.draw(st.lists(byte_mutation, max_size=2), label="bytes")
    shards = data.draw(shard_mutation, label="shards")
    run_one(capsys, seeds, command, seed_name, header_mutations, byte_mutations, shards)


# -- check --deep on one damaged tensor, the container kept whole --------------------------------

DEEP_EXAMPLES = int(os.environ.get("COMFYQUANT_FUZZ_EXAMPLES", "25"))
"""Damaged files for ``check --deep`` (tools/fuzz_deep.py runs the same damages by the 100,000)."""
tensor_damage = st.one_of(
    st.tuples(st.just("shape"), st.integers(0, 99), st.integers(0, 63)),
    st.tuples(st.just("dtype"), st.integers(0, 99), st.sampled_from(list(fs.WIDTHS))),
    st.tuples(st.sampled_from(["short", "long", "missing", "retype"]), st.integers(0, 99)),
    st.tuples(
        st.just("extra"),
        st.integers(0, 99),
        st.sampled_from(fs.LAYER_SUFFIXES),
        st.sampled_from(list(fs.WIDTHS)),
        st.sampled_from(fs.FILLS),
        st.integers(0, 63),
    ),
    st.tuples(st.just("values"), st.integers(0, 99), st.sampled_from(fs.FILLS)),
    st.tuples(st.just("group"), st.integers(0, 99), st.sampled_from([0, 1, 3, 7, 8, 16, 32, 64, 128, 100_000, -16])),
)
gguf_damage = st.one_of(
    st.tuples(st.just("type"), st.integers(0, 7), st.integers(0, 45)),
    st.tuples(st.just("dim"), st.integers(0, 7), st.integers(0, 3), st.sampled_from([0, 1, 31, 32, 64, 65, 256, 1 << 40])),
    st.tuples(st.just("offset"), st.integers(0, 7), st.sampled_from([-64, -1, 1, 32, 1 << 20])),
    st.tuples(st.just("values"), st.integers(0, 1 << 16), st.sampled_from(fs.FILLS)),
    st.tuples(st.just("truncate"), st.integers(1, 1000)),
)


@pytest.fixture(scope="module")
def deep_seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep-seeds")
    out = {name: fs.seed(name, folder) for name in fs.DEEP_SEEDS}
    out.update(fs.gguf_seeds(folder))
    return out


def _strict(text: str):
    """JSON as the standard reads it: NaN and Infinity are not JSON."""

    def refuse(word):
        raise ValueError(f"{word} in the JSON report")

    return json.loads(text, parse_constant=refuse)


@settings(max_examples=DEEP_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damaged_tensors_in_any_layout_give_deep_findings_or_a_one_line_refusal(capsys, deep_seeds, data):
    import random

    name = data.draw(st.sampled_from(sorted(deep_seeds)), label="seed")
    rand = random.Random(data.draw(st.integers(0, 1 << 32), label="bytes"))
    with tempfile.TemporaryDirectory() as folder:
        if deep_seeds[name].endswith(".gguf"):
            with open(deep_seeds[name], "rb") as fh:
                raw = fh.read()
            fields = fs.gguf_tensor_fields(raw)
            damages = data.draw(st.lists(gguf_damage, min_size=1, max_size=2), label="damages")
            for spec in damages:
                raw = fs.damage_gguf(raw, fields, spec, rand)
            src = os.path.join(folder, "in.gguf")
            with open(src, "wb") as fh:
                fh.write(raw)
        else:
            header, body = fs.read(deep_seeds[name])
            damages = data.draw(st.lists(tensor_damage, min_size=1, max_size=3), label="damages")
            for spec in damages:
                header, body = fs.damage_tensor(header, body, spec, rand)
            src = fs.write_raw(os.path.join(folder, "in.safetensors"), header, body)
        before = fs.snapshot(folder)
        for args in (["check", src, "--deep"], ["check", src, "--deep", "--json"]):
            rc = main(args)
            out, err = capsys.readouterr()
            event(f"exit {rc}")
            what = f"{args}: seed {name}, damages {damages}: exit {rc}: {err}"
            assert rc in (0, 1, 2) and "internal error" not in err, what
            if rc == 2:
                assert err.count("\n") == 1 and out == "", what
            else:
                assert err == "", what  # nothing on stderr: no warning, no partial line
                if "--json" in args:
                    _strict(out)
        assert fs.snapshot(folder) == before
