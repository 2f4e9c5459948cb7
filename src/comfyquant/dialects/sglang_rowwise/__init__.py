"""SGLang's rowwise FP8 files (``formats.rowwise_fp8``) as a layout of their own, for ``check``,
``inspect`` and ``migrate``.

The header map (``format_version`` "1.1", layers ``"rowwise-float8_e4m3fn"`` / ``"bf16"``) is
SGLang 0.5.23's; ComfyUI takes each of its entries for a marker object and fails
(``AttributeError: 'str' object has no attribute 'get'``) and comfy-kitchen reads no map, so for
them the file needs the Comfy layout. Both directions, and when each is exact:

* rowwise -> Comfy ``float8_e4m3fn``: exact when every row of ``weight_scale`` holds the same
  F32 value (a one-row layer always does): the codes are kept and that value becomes the
  per-tensor scale. Rows with different scales have no exact Comfy form (Comfy's FP8 has one
  scale per tensor): ``migrate`` refuses such a layer, ``--allow-lossy`` re-quantizes it per
  tensor. Only the data tells which (``settle`` reads the scales; ``migrate`` always does).
  A static ``input_scale`` [1] becomes the Comfy scalar ``input_scale``.
* Comfy ``float8_e4m3fn`` -> rowwise (``migrate --to sglang-rowwise``): always exact (the
  per-tensor scale repeated per row, ``input_scale`` [] -> [1]); a file with layers of any other
  Comfy format, or in several shards, is refused (SGLang's map holds only rowwise FP8 and bf16
  layers, and each shard's map is checked against that shard's own tensors).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ...findings import Finding
from ...formats.rowwise_fp8 import ROWWISE_FP8, declared_format, declares_rowwise, header_map
from ...markers import MARKER_MAP as META_KEY
from ...markers import marker_map_text
from ...numerics.bytewise import to_f32
from ...numerics.nvfp4_layouts import broadcast_rows
from ..base import EXACT, LOSSY, REFUSED, Claim, Dialect, Lossy, Move, Translation, exact
from ..common import copy, is_scalar_float, scalar_scale
from ..decoders import scaled_fp8
from ..reading import read_sound

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "sglang-rowwise"
COMFY = "float8_e4m3fn"
UNSETTLED = "whether every row of weight_scale holds the same value (then the layer is exactly Comfy float8_e4m3fn)"


def _rowwise_tensors(t: dict) -> bool:
    w, s, i = t.get("weight"), t.get("weight_scale"), t.get("input_scale")
    return (
        w is not None
        and w.dtype == "F8_E4M3"
        and len(w.shape) == 2
        and s is not None
        and s.dtype == "F32"
        and tuple(s.shape) == (w.shape[0],)
        and (i is None or (i.dtype == "F32" and tuple(i.shape) == (1,)))
    )


def declared_layers(ckpt: Checkpoint) -> dict[str, str]:
    """Prefix -> file of each layer a shard's SGLang rowwise map declares rowwise FP8."""
    out: dict[str, str] = {}
    for h in ckpt.headers:
        raw = h.metadata.get(META_KEY)
        if not raw or ROWWISE_FP8 not in raw:
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and declares_rowwise(obj) and isinstance(obj.get("layers"), dict):
            for prefix, entry in obj["layers"].items():
                if declared_format(entry) == ROWWISE_FP8:
                    out[prefix] = h.file
    return out


def _others(t: dict) -> list[Move]:
    return [copy(e, s) for s, e in t.items() if s not in ("weight", "weight_scale", "input_scale", "comfy_quant")]


def _exact(prefix: str, t: dict, why: str) -> Translation:
    w, s, i = t["weight"], t["weight_scale"], t.get("input_scale")
    moves = [copy(w, "weight"), Move("weight_scale", s.name, "F32", (), lambda b: bytes(b[:4]), EXACT, "first row's scale")]
    if i is not None:
        moves.append(scalar_scale(i, prefix, "input_scale"))
    return exact(NAME, prefix, t, "rowwise", COMFY, why, moves=moves + _others(t), declared=ROWWISE_FP8)


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    layers: dict[str, Translation] = {}
    for prefix in declared_layers(ckpt):
        layer = ckpt.layers.get(prefix)
        if layer is None or prefix in claimed or layer.marker is not None:
            continue
        t = layer.tensors
        if not _rowwise_tensors(t):
            layers[prefix] = Translation(
                prefix,
                NAME,
                "rowwise",
                t,
                verdict=REFUSED,
                why="not a valid rowwise FP8 layer (check names SGLang's error)",
                declared=ROWWISE_FP8,
            )
        elif t["weight"].shape[0] == 1:
            layers[prefix] = _exact(prefix, t, "one row: its row scale is a per-tensor scale")
        else:
            layers[prefix] = Translation(
                prefix,
                NAME,
                "rowwise",
                t,
                verdict=LOSSY,
                why=f"per-row weight_scale [{t['weight'].shape[0]}]: exactly Comfy FP8 only if every row has the same scale "
                "(migrate reads them)",
                moves=_others(t),
                unsettled=[UNSETTLED],
                decoder=scaled_fp8("weight", "weight_scale"),
                lossy=Lossy(COMFY, why="re-quantized with one scale per tensor"),
                declared=ROWWISE_FP8,
            )
    if not layers:
        return None
    notes = ["SGLang 0.5.23 reads this rowwise FP8 map; ComfyUI and comfy-kitchen need the Comfy layout (comfyquant migrate)"]
    return Claim(NAME, layers, notes=notes)


def settle(ckpt: Checkpoint, claim: Claim) -> list[Finding]:
    """Read the row scales: a layer whose rows all hold the same F32 value is exactly Comfy FP8."""
    open_ = [tr for tr in claim.layers.values() if tr.verdict == LOSSY and UNSETTLED in tr.unsettled]
    values = read_sound(ckpt, [tr.inputs["weight_scale"] for tr in open_])
    exact = []
    for tr in open_:
        data = values.get(tr.inputs["weight_scale"].name)
        if data is None:
            continue  # bytes the header misdescribes: the container findings name them
        tr.unsettled = []
        tr.why = (
            f"per-row weight_scale [{tr.inputs['weight'].shape[0]}] with different values: Comfy's FP8 has one scale per tensor"
        )
        if len(data) >= 4 and data == data[:4] * (len(data) // 4):
            claim.layers[tr.prefix] = _exact(tr.prefix, tr.inputs, "every row has the same scale: a per-tensor scale")
            exact.append(tr.prefix)
    claim.unsettled = []
    if exact:
        return [
            Finding(
                "F004",
                f"{len(exact)} rowwise FP8 layer(s) have one scale for every row (e.g. {exact[0]}): exactly Comfy float8_e4m3fn",
                severity="info",
                cause="the values, not the header, decide whether the layer has an exact Comfy form",
                fix="nothing to do; comfyquant migrate writes them exactly",
            )
        ]
    return []


def failures(ckpt: Checkpoint, claim: Claim) -> list:
    """Nothing beyond the profiles: SGLang's reader is modelled in ``targets.sglang_rowwise``,
    ComfyUI fails on the map's first string entry (its header-map rule), comfy-kitchen reads
    the tensors without a map."""
    return []


def export(ckpt: Checkpoint, claimed: set) -> Claim | None:
    """Comfy ``float8_e4m3fn`` layers as SGLang rowwise FP8, with SGLang's header map."""
    layers: dict[str, Translation] = {}
    fp8: list[str] = []
    for prefix, layer in ckpt.layers.items():
        if prefix in claimed or layer.marker is None or layer.inferred:
            continue
        t = layer.tensors
        w, s = t.get("weight"), t.get("weight_scale")
        if len(ckpt.files) > 1:
            why = "a sharded checkpoint: SGLang checks each shard's rowwise map against that shard's own tensors"
        elif layer.format_name != COMFY or layer.bank is not None:
            why = f"{layer.format_name}: SGLang's rowwise FP8 map holds only rowwise-float8_e4m3fn and bf16 layers"
        elif w is None or w.dtype != "F8_E4M3" or len(w.shape) != 2 or not is_scalar_float(s):
            why = "not a per-tensor FP8 E4M3 layer with a 2-D weight and one float scale"
        else:
            layers[prefix] = _to_rowwise(prefix, t)
            fp8.append(prefix)
            continue
        layers[prefix] = Translation(prefix, NAME, "rowwise", t, verdict=REFUSED, why=why)
    if not layers:
        return None
    meta = {META_KEY: marker_map_text(*header_map(fp8))} if fp8 else {}
    return Claim(NAME, layers, metadata_set=meta)


def _to_rowwise(prefix: str, t: dict) -> Translation:
    w, s, i = t["weight"], t["weight_scale"], t.get("input_scale")
    rows = w.shape[0]

    def per_row(data: bytes, dtype: str = s.dtype) -> bytes:
        return broadcast_rows(to_f32(data, dtype), rows)

    def as_f32(data: bytes, dtype: str = i.dtype if i is not None else "F32") -> bytes:
        return to_f32(data, dtype)

    moves = [
        copy(w, "weight"),
        Move(
            "weight_scale",
            s.name,
            "F32",
            (rows,),
            per_row,
            EXACT,
            f"per-tensor scale -> the same value for each of {rows} rows",
        ),
    ]
    if i is not None:
        moves.append(Move("input_scale", i.name, "F32", (1,), as_f32, EXACT, "[] -> [1]"))
    drops = [t["comfy_quant"].name] if "comfy_quant" in t else []
    return Translation(
        prefix,
        NAME,
        "rowwise",
        t,
        verdict=EXACT,
        why="per-tensor weight_scale repeated per row; the layer is declared in SGLang's rowwise map",
        moves=moves + _others(t),
        drops=drops,
        dropped_why="SGLang's rowwise map declares the layer (no marker)",
    )


DIALECTS = (
    Dialect(
        NAME,
        "SGLang rowwise FP8 (format_version 1.1 header map)",
        writer="SGLang's rowwise FP8 exports; comfyquant quantize --format rowwise-fp8",
        source="SGLang 0.5.23 runtime/layers/quantization/rowwise_fp8.py",
        detect=detect,
        failures=failures,
        settle=settle,
        export=export,
        order=35,
    ),
)
