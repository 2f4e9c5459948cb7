"""Small valid checkpoints in other writers' layouts, and the damage a download, a copy or a
careless editor does to them, for the tests of the commands' input gate and the fuzz campaign.

Each seed is built with its dialect's own test helpers (the layouts as the writers store them):
ComfyUI's legacy scaled FP8, musubi-tuner, ModelOpt, BFL, ComfyUI-INT8-Fast, convert_to_quant,
nunchaku (safetensors) and GGUF (its own container).  The damages work on the file's bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import torch

SEEDS = ("legacy", "musubi", "modelopt", "bfl", "int8-fast", "c2q", "nunchaku")
"""The safetensors layouts; ``gguf_seed`` makes the GGUF one (when ``gguf`` is installed)."""


def seed(name: str, folder) -> str:
    """A small valid file of layout ``name`` in ``folder`` (its path)."""
    path = os.path.join(str(folder), f"{name}.safetensors")
    BUILDERS[name](path)
    return path


def _legacy(path: str) -> None:
    from test_dialect_legacy import legacy_file

    legacy_file(path, n=32, k=64)


def _musubi(path: str) -> None:
    from test_dialect_musubi import musubi_quantize, weight, write

    w = weight(32, 128).float()
    write(path, {"t": musubi_quantize(w, "tensor"), "b": musubi_quantize(w, "block", two_level=True)})


def _modelopt(path: str) -> None:
    from test_dialect_modelopt import modelopt_file, modelopt_layer

    layers = {"blocks.0.proj": modelopt_layer(48, 64, 0, swizzle=False, padding=None)[0]}
    modelopt_file(path, layers, "NVFP4")


def _modelopt_padded(path: str) -> None:
    from test_dialect_modelopt import modelopt_file, modelopt_layer

    layers = {"blocks.0.proj": modelopt_layer(40, 80, 0, swizzle=True, padding="row_col")[0]}
    modelopt_file(path, layers, "NVFP4")


def _bfl(path: str) -> None:
    from test_dialect_bfl import bfl_nvfp4, write

    write(path, {"blocks.0.proj": bfl_nvfp4(48, 80, seed=1)})


def _int8_fast(path: str) -> None:
    from test_dialect_int8_fast import META, int8_rowwise, int8_scalar, save, weight

    w = weight(32, 64)
    (q1, s1), (q2, s2) = int8_rowwise(w), int8_scalar(w)
    save(
        path,
        {
            "blocks.0.qkv": (q1, s1, {"convrot": False, "per_row": True}, None),
            "blocks.1.qkv": (q2, s2, {"format": "int8_tensorwise", "convrot": False, "per_row": False}, None),
        },
        META,
    )


def _c2q(path: str) -> None:
    from kitchen_fixtures import make_layer
    from test_dialect_c2q import hybrid, save

    mx = make_layer("mxfp8", prefix="x", n=128, k=64, marker="comfyui")
    save(path, {"x": hybrid(mx.tensors, mx.marker)})


def _nunchaku(path: str) -> None:
    from safetensors.torch import save_file

    from test_dialect_nunchaku import FLUX_META, awq_layer, svdq_layer

    stored, _ = svdq_layer(128, 128)
    tensors = {f"transformer_blocks.0.attn.to_out.0.{s}": t.contiguous() for s, t in stored.items()}
    awq, _ = awq_layer(128, 128)
    tensors.update({f"transformer_blocks.0.norm1.linear.{s}": t.contiguous() for s, t in awq.items()})
    tensors["x_embedder.weight"] = torch.zeros(128, 64, dtype=torch.bfloat16)
    save_file(tensors, path, metadata=FLUX_META)


def _kitchen(path: str) -> None:
    """The Comfy layout as comfy-kitchen 0.2.40 writes it, one layer of each value-bearing kind
    ``check --deep`` reads (group scales, a codebook, a correction ComfyUI drops, block scales)."""
    from kitchen_fixtures import make_layer, write_layers

    variants = {"w4a8_asym": 32, "w4a8_codebook": 32, "int8_rowwise": 32, "fp8_static": 32, "nvfp4": 32, "mxfp8": 32}
    layers = [make_layer(v, f"blocks.{i}.proj", n, 256, seed=i, marker="comfyui") for i, (v, n) in enumerate(variants.items())]
    write_layers(path, layers)


BUILDERS = {
    "legacy": _legacy,
    "musubi": _musubi,
    "modelopt": _modelopt,
    "modelopt-padded": _modelopt_padded,
    "bfl": _bfl,
    "int8-fast": _int8_fast,
    "c2q": _c2q,
    "nunchaku": _nunchaku,
    "kitchen": _kitchen,
}
DEEP_SEEDS = (*SEEDS, "modelopt-padded", "kitchen")
"""What ``check --deep`` is fuzzed on: the foreign layouts, a ModelOpt layer whose translation
drops padding (``settle`` reads it) and comfy-kitchen's own layers (the values ``--deep`` judges)."""


def gguf_seed(folder) -> str | None:
    """A small GGUF file (a Q8_0 weight and its bias), or None without the ``gguf`` package."""
    try:
        from gguf import GGMLQuantizationType as T

        from test_dialect_gguf import write_gguf
    except Exception:  # noqa: BLE001 -- the gguf package (or its test module) is not installed
        return None
    path = os.path.join(str(folder), "g.gguf")
    write_gguf(path, [("blocks.0.weight", T.Q8_0, (4, 64), False), ("blocks.0.bias", T.F32, (4,), False)])
    return path


# -- the file as bytes -------------------------------------------------------------------------


def read(path: str) -> tuple[dict, bytes]:
    """(header object, data area) of a safetensors file."""
    with open(path, "rb") as fh:
        raw = fh.read()
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_raw(path: str, header: dict | str, data: bytes) -> str:
    text = (header if isinstance(header, str) else json.dumps(header)).encode("utf-8", "surrogatepass")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data)
    return path


def tensors_of(header: dict) -> list[str]:
    """Tensor names in data order."""
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def quantized_weight(header: dict) -> str:
    """The first stored weight whose dtype is not a float (the quantized one the dialect claims)."""
    names = tensors_of(header)
    floats = ("F32", "F16", "BF16", "F64")
    found = [n for n in names if header[n]["dtype"] not in floats and not n.endswith("comfy_quant")]
    return (found or names)[0]


def scale_of(header: dict) -> str:
    names = tensors_of(header)
    found = [n for n in names if "scale" in n.rsplit(".", 1)[-1]]
    return (found or names)[0]


def bias_of(header: dict) -> str:
    names = tensors_of(header)
    found = [n for n in names if n.endswith(".bias")]
    return (found or names)[0]


def damage(src: str, kind: str, dst: str) -> str:
    """``src`` with one kind of damage, written as ``dst``:

    * ``truncated``: the last 100 bytes gone (a download cut short);
    * ``span``: a quantized weight's shape one column short of its bytes (dtype x shape no
      longer matches the span);
    * ``empty-dtype``: a scale's dtype is ``""``;
    * ``f64-bias``: a bias re-typed to F64, with trailing bytes after the data;
    * ``offsets``: a quantized weight's span starts 8 bytes later (overlapping its neighbour)."""
    header, data = read(src)
    if kind == "truncated":
        with open(src, "rb") as fh:
            raw = fh.read()
        with open(dst, "wb") as fh:
            fh.write(raw[:-100])
        return dst
    if kind == "span":
        entry = header[quantized_weight(header)]
        entry["shape"] = [*entry["shape"][:-1], entry["shape"][-1] - 1]
    elif kind == "empty-dtype":
        header[scale_of(header)]["dtype"] = ""
    elif kind == "f64-bias":
        header[bias_of(header)]["dtype"] = "F64"
        data += bytes(24)
    elif kind == "offsets":
        entry = header[quantized_weight(header)]
        a, b = entry["data_offsets"]
        entry["data_offsets"] = [a + 8, b + 8]
    else:
        raise ValueError(kind)
    return write_raw(dst, header, data)


DAMAGES = ("truncated", "span", "empty-dtype", "f64-bias", "offsets")


def deep_metadata(src: str, key: str, dst: str, depth: int = 50_000) -> str:
    """``src`` whose metadata ``key`` holds JSON nested ``depth`` deep."""
    header, data = read(src)
    meta = dict(header.get("__metadata__") or {})
    meta[key] = '{"format_version": "1.0", "layers": ' + "[" * depth + "]" * depth + "}"
    header["__metadata__"] = meta
    return write_raw(dst, header, data)


def split_shards(src: str, folder: str, index: bool = True) -> list[str]:
    """``src`` as two shards ``model-0000i-of-00002.safetensors`` in ``folder`` (created), with an
    index when ``index``; returns the shard paths."""
    header, data = read(src)
    meta = header.get("__metadata__")
    names = tensors_of(header)
    half = max(1, len(names) // 2)
    os.makedirs(folder, exist_ok=True)
    paths, weight_map = [], {}
    for i, part in enumerate((names[:half], names[half:])):
        out: dict = {"__metadata__": meta} if meta else {}
        blob = b""
        for name in part:
            a, b = header[name]["data_offsets"]
            out[name] = {**header[name], "data_offsets": [len(blob), len(blob) + b - a]}
            blob += data[a:b]
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        paths.append(write_raw(os.path.join(folder, shard), out, blob))
        weight_map.update(dict.fromkeys(part, shard))
    if index:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
            json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    return paths


def lose_shard(paths: list[str], how: str) -> None:
    """Make the second shard missing: ``gone`` (deleted) or ``loop`` (a symbolic link to itself)."""
    os.unlink(paths[1])
    if how == "loop":
        os.symlink(os.path.basename(paths[1]), paths[1])


def snapshot(folder) -> dict[str, bytes]:
    """Every entry under ``folder`` (links as their target text), to prove nothing changed."""
    out = {}
    for root, dirs, files in os.walk(str(folder)):
        for name in dirs + files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                out[p] = ("link:" + os.readlink(p)).encode()
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    out[p] = fh.read()
            else:
                out[p] = b"<dir>"
    return out


def copy(src: str, dst: str) -> str:
    shutil.copyfile(src, dst)
    return dst


# -- one tensor damaged, the container kept whole ----------------------------------------------

WIDTHS = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
"""Bytes per element of the dtypes a damaged tensor is re-typed to."""
LAYER_SUFFIXES = (
    "weight", "weight_scale", "weight_scale_2", "input_scale", "weight_s_rel", "weight_s_channel",
    "weight_codebook", "weight_correction", "weight_zeros", "bias", "scale_weight", "scale_input",
    "scale_weight_tensor", "qweight", "wscales", "wzeros", "smooth_factor", "proj_down", "proj_up",
    "wcscales", "wtscale", "pre_quant_scale", "weight_scalar",
)  # fmt: skip
"""Suffixes an extra tensor is added under: every layer tensor a layout reads."""
FILLS = ("nan", "inf", "-inf", "zero", "neg", "one", "big", "tiny", "random", "max")
"""Values a tensor is filled with (``fill``)."""
DAMAGE_KINDS = ("shape", "dtype", "short", "long", "missing", "extra", "values", "group", "retype")


def fill(dtype: str, count: int, how: str, rand) -> bytes:
    """``count`` elements of ``dtype`` holding ``how`` (NaN, Inf, zero, negative, one, huge,
    subnormal, the dtype's largest value, or random bytes); ``rand`` is a ``random.Random``."""
    import numpy as np

    width = WIDTHS.get(dtype, 1)
    if how == "random" or dtype not in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"):
        if how == "random":
            return rand.randbytes(count * width)
        byte = {"zero": 0, "one": 1, "neg": 0xFF, "max": 0x7F, "big": 0x7F}.get(how, rand.randrange(256))
        return bytes([byte]) * (count * width)
    if dtype in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
        e4m3 = {"nan": 0x7F, "inf": 0x7F, "-inf": 0xFF, "zero": 0, "neg": 0xB8, "one": 0x38, "big": 0x7E, "tiny": 1, "max": 0x7E}
        e5m2 = {"nan": 0x7F, "inf": 0x7C, "-inf": 0xFC, "zero": 0, "neg": 0xBC, "one": 0x3C, "big": 0x7B, "tiny": 1, "max": 0x7B}
        e8m0 = {"nan": 0xFF, "inf": 0xFF, "-inf": 0xFF, "zero": 0, "neg": 0, "one": 127, "big": 254, "tiny": 1, "max": 254}
        table = {"F8_E4M3": e4m3, "F8_E5M2": e5m2, "F8_E8M0": e8m0}[dtype]
        return bytes([table[how]]) * count
    value = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "zero": 0.0, "neg": -0.5, "one": 1.0, "big": 1e30}.get(how)
    if how == "tiny":
        value = {"F64": 1e-310, "F32": 1e-40, "F16": 1e-7, "BF16": 1e-40}[dtype]
    if how == "max":
        value = {"F64": 1.7e308, "F32": 3.4e38, "F16": 65504.0, "BF16": 3.3e38}[dtype]
    with np.errstate(all="ignore"):
        if dtype == "BF16":
            return (np.full(count, value, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
        return np.full(count, value, {"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).tobytes()


def _tensor_items(header: dict, data: bytes) -> list[list]:
    return [
        [n, header[n]["dtype"], list(header[n]["shape"]), data[header[n]["data_offsets"][0] : header[n]["data_offsets"][1]]]
        for n in tensors_of(header)
    ]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _wrong_shape(shape: list, how: int) -> list:
    """One of the shapes a damaged header gives a tensor: one short or long along a dimension,
    halved, doubled, transposed, flattened, unsqueezed, empty or scalar."""
    s = list(shape) or [1]
    options = [
        [*s[:-1], max(0, s[-1] - 1)],
        [*s[:-1], s[-1] + 1],
        [max(0, s[0] - 1), *s[1:]],
        [s[0] + 1, *s[1:]],
        [*s[:-1], max(1, s[-1] // 2)],
        [*s[:-1], s[-1] * 2],
        [s[0] * 2, *s[1:]],
        list(reversed(s)),
        [_numel(s)],
        [1, *s],
        [0],
        [],
        [3],
        [7, 5],
    ]
    return options[how % len(options)]


def damage_tensor(header: dict, data: bytes, spec: tuple, rand) -> tuple[dict, bytes]:
    """``header``/``data`` with one tensor damaged as ``spec`` says, the container rebuilt so
    that only the named damage is wrong (``short``/``long`` break the span on purpose):

    * ``("shape", i, how)``: tensor ``i`` gets a wrong shape (``_wrong_shape``), bytes to match;
    * ``("dtype", i, dtype)``: another dtype, bytes to match (random);
    * ``("short", i)`` / ``("long", i)``: its span is shorter / longer than dtype x shape;
    * ``("missing", i)``: it is gone; ``("extra", i, suffix, dtype, fill, how)``: a tensor of
      ``suffix`` is added beside it (its layer's prefix), of a wrong shape (``_wrong_shape``);
    * ``("values", i, fill)``: its values are ``fill`` (``FILLS``), dtype and shape kept;
    * ``("group", i, size)``: its layer's marker gets another ``group_size``;
    * ``("retype", i)``: another dtype of the same width, the same bytes.

    ``i`` picks a tensor modulo their number; ``rand`` (``random.Random``) draws random bytes."""
    items = _tensor_items(header, data)
    meta = header.get("__metadata__")
    if not items:
        return header, data
    kind, i = spec[0], spec[1] % len(items)
    item = items[i]
    name, dtype, shape, raw = item
    width = WIDTHS.get(dtype, 1)
    if kind == "shape":
        item[2] = _wrong_shape(shape, spec[2])
        item[3] = fill(dtype, _numel(item[2]), "random", rand)
    elif kind == "dtype":
        item[1] = spec[2]
        item[3] = fill(spec[2], _numel(shape), "random", rand)
    elif kind == "short":
        item[3] = raw[: max(0, len(raw) - max(1, len(raw) // 2))]
    elif kind == "long":
        item[3] = raw + rand.randbytes(max(width, len(raw) // 2))
    elif kind == "missing":
        del items[i]
    elif kind == "extra":
        prefix = name.rsplit(".", 1)[0] if "." in name else name
        new = f"{prefix}.{spec[2]}"
        if new not in header:
            new_shape = _wrong_shape(shape, spec[5])
            items.append([new, spec[3], new_shape, fill(spec[3], _numel(new_shape), spec[4], rand)])
    elif kind == "values":
        if dtype in WIDTHS and not name.endswith("comfy_quant"):
            item[3] = fill(dtype, _numel(shape), spec[2], rand)
    elif kind == "group":
        if name.endswith(".comfy_quant"):
            try:
                marker = json.loads(raw)
            except ValueError:
                marker = None
            if isinstance(marker, dict):
                marker["group_size"] = spec[2]
                item[3] = json.dumps(marker).encode()
                item[2] = [len(item[3])]
    elif kind == "retype":
        same = [d for d, w in WIDTHS.items() if w == width and d != dtype]
        if same and dtype in WIDTHS:
            item[1] = same[rand.randrange(len(same))]
    else:
        raise ValueError(kind)
    out: dict = {"__metadata__": meta} if meta is not None else {}
    blob = bytearray()
    for n, d, s, b in items:
        out[n] = {"dtype": d, "shape": list(s), "data_offsets": [len(blob), len(blob) + len(b)]}
        blob += b
    return out, bytes(blob)


def random_damage(rand) -> tuple:
    """One ``damage_tensor`` spec drawn with ``rand`` (``random.Random``)."""
    kind = rand.choice(DAMAGE_KINDS)
    i = rand.randrange(64)
    if kind == "shape":
        return (kind, i, rand.randrange(64))
    if kind == "dtype":
        return (kind, i, rand.choice(list(WIDTHS)))
    if kind == "extra":
        return (kind, i, rand.choice(LAYER_SUFFIXES), rand.choice(list(WIDTHS)), rand.choice(FILLS), rand.randrange(64))
    if kind == "values":
        return (kind, i, rand.choice(FILLS))
    if kind == "group":
        return (kind, i, rand.choice([0, 1, 3, 7, 8, 16, 32, 64, 128, 100000, -16]))
    return (kind, i)


# -- GGUF: the tensor infos a damage rewrites --------------------------------------------------

_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensor_fields(raw: bytes) -> list[dict]:
    """Where each tensor info of a well-formed GGUF file sits: the byte offsets of its dims,
    ggml type and data offset, and its rank (parsed by the file format's own layout)."""
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)

    def value(pos: int, vtype: int) -> int:
        if vtype in _GGUF_SCALARS:
            return pos + _GGUF_SCALARS[vtype]
        if vtype == 8:
            return pos + 8 + struct.unpack_from("<Q", raw, pos)[0]
        item, count = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        for _ in range(count):
            pos = value(pos, item)
        return pos

    for _ in range(n_kv):
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
        vtype = struct.unpack_from("<I", raw, pos)[0]
        pos = value(pos + 4, vtype)
    out = []
    for _ in range(n_tensors):
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
        rank = struct.unpack_from("<I", raw, pos)[0]
        dims = pos + 4
        out.append({"rank": rank, "dims": dims, "type": dims + 8 * rank, "offset": dims + 8 * rank + 4})
        pos = dims + 8 * rank + 12
    return out


def gguf_seeds(folder) -> dict[str, str]:
    """GGUF files written by the ``gguf`` package's own writer (empty without it): the fuzz
    seed, every quantized ggml type the test helpers write, and one type gguf cannot decode."""
    try:
        import numpy as np
        from gguf import GGML_QUANT_SIZES, GGUFWriter
        from gguf import GGMLQuantizationType as T

        from test_dialect_gguf import write_gguf
    except Exception:  # noqa: BLE001 -- the gguf package (or its test module) is not installed
        return {}
    out = {}
    main = gguf_seed(folder)
    if main is not None:
        out["gguf"] = main
    many = os.path.join(str(folder), "types.gguf")
    write_gguf(
        many,
        [
            ("blocks.0.weight", T.Q4_K, (2, 256), False),
            ("blocks.1.weight", T.Q6_K, (2, 256), False),
            ("blocks.2.weight", T.Q4_0, (2, 2, 64), True),
            ("blocks.3.weight", T.MXFP4, (2, 64), False),
            ("blocks.3.bias", T.F16, (2,), False),
        ],
    )
    out["gguf-types"] = many
    undecodable = os.path.join(str(folder), "q8_1.gguf")
    writer = GGUFWriter(undecodable, arch="flux")
    block, size = GGML_QUANT_SIZES[T.Q8_1]
    writer.add_tensor("blocks.0.weight", np.zeros((4, 64 // block * size), np.uint8), raw_dtype=T.Q8_1)
    writer.add_tensor("blocks.0.bias", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out["gguf-q8_1"] = undecodable
    return out


def damage_gguf(raw: bytes, fields: list[dict], spec: tuple, rand) -> bytes:
    """A GGUF file's bytes with one damage: ``("type", i, code)`` tensor ``i``'s ggml type;
    ``("dim", i, d, value)`` one of its dimensions; ``("offset", i, delta)`` its data offset;
    ``("values", at, fill)`` 64 bytes of its data area (its scales: NaN, Inf, ...);
    ``("truncate", n)`` the last ``n`` bytes gone."""
    out = bytearray(raw)
    kind = spec[0]
    if kind == "truncate":
        return bytes(out[: max(0, len(out) - spec[1])])
    if kind == "values":
        start = fields and max(f["offset"] + 8 for f in fields) or 0
        at = start + spec[1] % max(1, len(out) - start)
        out[at : at + 64] = fill("F16", 32, spec[2], rand)[: len(out) - at]
        return bytes(out)
    f = fields[spec[1] % len(fields)] if fields else None
    if f is None or f["offset"] + 8 > len(out):  # the file already ends before its tensor infos
        return bytes(out)
    if kind == "type":
        struct.pack_into("<I", out, f["type"], spec[2])
    elif kind == "dim":
        struct.pack_into("<Q", out, f["dims"] + 8 * (spec[2] % f["rank"]), spec[3])
    elif kind == "offset":
        old = struct.unpack_from("<Q", out, f["offset"])[0]
        struct.pack_into("<Q", out, f["offset"], max(0, old + spec[2]))
    else:
        raise ValueError(kind)
    return bytes(out)


def random_gguf_damage(rand) -> tuple:
    """One ``damage_gguf`` spec drawn with ``rand`` (``random.Random``)."""
    kind = rand.choice(("type", "dim", "offset", "values", "values", "truncate"))
    if kind == "type":
        return (kind, rand.randrange(8), rand.choice([*range(0, 42), 1 << 20]))
    if kind == "dim":
        return (kind, rand.randrange(8), rand.randrange(4), rand.choice([0, 1, 2, 31, 32, 63, 64, 65, 256, 1 << 40]))
    if kind == "offset":
        return (kind, rand.randrange(8), rand.choice([-64, -32, -1, 1, 32, 64, 1 << 20]))
    if kind == "values":
        return (kind, rand.randrange(1 << 20), rand.choice(FILLS))
    return (kind, rand.choice([1, 7, 32, 100, 1000]))


# -- what check --deep must do with any of them ------------------------------------------------


def deep_outcome(path: str) -> tuple[int, str | None]:
    """``check --deep`` on ``path`` in-process, as the command line ends: (exit code, what is
    wrong or None).  It must end with a report (exit 0 or 1) or a one-line refusal (2); the
    report must render as text and as strict JSON, every finding name a known rule (or a
    runtime's), and every finding that promises a ``--deep`` measurement carry it (or why it
    could not be made)."""
    from comfyquant import check
    from comfyquant.errors import ComfyQuantError
    from comfyquant.findings import DEEP_MEASURES, RULES
    from comfyquant.render import render_report

    try:
        report = check(path, deep=True)
    except ComfyQuantError as exc:
        text = f"comfyquant: {exc}"
        return 2, None if "\n" not in text and text.strip() else f"refusal not one line: {text!r}"
    except Exception as exc:  # noqa: BLE001 -- what the command line calls an internal error
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        return 3, f"internal error {type(exc).__name__}: {exc} at {where.filename}:{where.lineno}"
    try:
        render_report(report)
        json.dumps(report.to_dict(), allow_nan=False)
    except Exception as exc:  # noqa: BLE001
        return 3, f"the report does not render: {type(exc).__name__}: {exc}"
    for f in report.findings:
        if f.code not in RULES and "." not in f.code:
            return 3, f"unknown rule {f.code}: {f.message}"
        if DEEP_MEASURES in f.message and not (f.measured and (f.measured["value"] is not None or f.measured["why"])):
            return 3, f"promised measurement missing: {f.code} {f.tensor}: {f.message}"
    return (0 if report.ok else 1), None
