"""Apply a dialect's claim the way ``migrate`` writes it, for dialect-level tests.

``write_claim`` reads the input file's raw bytes, runs every ``Move`` of every claimed
layer (its transform on the stored bytes), copies what no layer claims, drops what the claim
drops, writes the markers into the header map and the claim's metadata edits, and saves the
result with ``safetensors.torch.save_file``.  The dialect tests use it to round-trip files
before (and independently of) the CLI wiring.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from comfyquant.checkpoint import open_checkpoint

TORCH = {
    "U8": torch.uint8,
    "I8": torch.int8,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


def as_tensor(dtype: str, shape: tuple, data: bytes) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return raw.view(TORCH[dtype]).reshape(shape).clone()


def raw_tensors(path: str) -> dict[str, tuple[str, tuple, bytes]]:
    """Every tensor of a file as (dtype, shape, bytes)."""
    with open_checkpoint([path]) as ckpt:
        return {n: (e.dtype, tuple(e.shape), ckpt.read_bytes(e)) for n, e in ckpt.tensors.items()}


def write_claim(src: str, claim, dst: str) -> dict[str, tuple[str, tuple, bytes]]:
    """Write ``claim`` applied to ``src`` as ``dst``; returns the written tensors (raw)."""
    with open_checkpoint([src]) as ckpt:
        out: dict[str, tuple[str, tuple, bytes]] = {}
        consumed: set[str] = set(claim.drop)
        markers: dict[str, dict | None] = {}
        for tr in claim.layers.values():
            for m in tr.moves:
                data = ckpt.read_bytes(ckpt.tensors[m.source])
                if m.transform is not None:
                    data = m.transform(data)
                out[f"{tr.out_prefix}.{m.suffix}"] = (m.dtype, tuple(m.shape), data)
            consumed.update(e.name for e in tr.inputs.values())
            consumed.update(tr.drops)
            markers[tr.out_prefix] = tr.marker
        for name, e in ckpt.tensors.items():
            if name not in consumed and name not in out:
                out[name] = (e.dtype, tuple(e.shape), ckpt.read_bytes(e))
        meta = dict(ckpt.metadata())
    layer_map = json.loads(meta.get("_quantization_metadata", "null") or "null") or {"format_version": "1.0", "layers": {}}
    for prefix, marker in markers.items():
        if marker is None:
            layer_map["layers"].pop(prefix, None)
        else:
            layer_map["layers"][prefix] = marker
    for key in claim.metadata_drop:
        meta.pop(key, None)
    meta.update(claim.metadata_set)
    if layer_map["layers"]:
        meta["_quantization_metadata"] = json.dumps(layer_map)
    else:
        meta.pop("_quantization_metadata", None)
    save_file({n: as_tensor(*v) for n, v in out.items()}, dst, metadata=meta or None)
    return out


def detect_claim(path: str, dialect: str):
    """(the dialect's claim, the detection) of a file."""
    from comfyquant.dialects import registry

    ckpt = open_checkpoint([path])
    found = registry.detect(ckpt)
    claim = found.claim(dialect)
    ckpt.close()
    return claim, found


def export_claim(path: str, dialect: str):
    from comfyquant.dialects import registry

    with open_checkpoint([path]) as ckpt:
        return registry.DIALECTS[dialect].export(ckpt, set())


def stored(path: str, prefix: str) -> dict[str, torch.Tensor]:
    """A layer's tensors by suffix, as stored (torch)."""
    return {
        n[len(prefix) + 1 :]: as_tensor(*v)
        for n, v in raw_tensors(path).items()
        if n.startswith(prefix + ".") and "." not in n[len(prefix) + 1 :]
    }
