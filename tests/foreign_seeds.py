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


BUILDERS = {
    "legacy": _legacy,
    "musubi": _musubi,
    "modelopt": _modelopt,
    "modelopt-padded": _modelopt_padded,
    "bfl": _bfl,
    "int8-fast": _int8_fast,
    "c2q": _c2q,
    "nunchaku": _nunchaku,
}


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
