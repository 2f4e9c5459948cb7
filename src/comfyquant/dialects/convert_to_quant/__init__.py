"""convert_to_quant's own formats (silveroxides/convert_to_quant).

``ctq`` writes Comfy markers, and for a few layouts format names that only its own ops know
(``convert_to_quant/constants.py`` ``VALID_QUANT_FORMATS``, ``comfy/quant_ops.py`` ``QUANT_ALGOS``):

* ``float8_e4m3fn_rowwise`` (``RowWiseFP8Layout``): F8_E4M3 ``[N, K]``, F32 dequant scale ``[N]``:
  ``W = q * scale[:, None]``;
* ``float8_e4m3fn_blockwise`` (``BlockWiseFP8Layout``) and ``int8_blockwise``
  (``BlockWiseINT8Layout``, weights): F8_E4M3 / I8 ``[N, K]``, F32 scale ``[N/B, K/B]`` over B x B
  tiles (``group_size``, default 64 / 128): ``W[i, j] = q[i, j] * scale[i // B, j // B]``;
* ``float8_e4m3fn_block3d`` (``format_migration.py``, legacy ``block3d`` mode): scale ``[N, K/B, 1]``
  over B-wide blocks of each row, musubi's block layout;
* ``hybrid_mxfp8`` (``formats/hybrid_mxfp8_conversion.py``): an ``mxfp8`` layer, bytes untouched,
  plus ``<layer>.weight_scalar`` (F32 ``[]``, the largest E8M0 block scale or another file's
  per-tensor scale) for a per-tensor FP8 fallback matmul on GPUs without MXFP8.

What they become: ``hybrid_mxfp8`` is Comfy ``mxfp8`` exactly: its weight and block scales are
the MXFP8 layer they were, and ``weight_scalar`` is not folded into them (it only feeds the
fallback path), so dropping it changes no number of the MXFP8 decode.  No Comfy format has
per-row or block FP8 scales or block INT8 scales: the others are lossy (decoded by ctq's own
formula in F32, requantized with ``--allow-lossy``).

No runtime model: no runtime but ctq's own custom node registers these names, and the runtime
profiles judge marked layers by their markers (ComfyUI indexes ``QUANT_ALGOS[format]``, a bare
``KeyError``; comfy-kitchen has no layout; SGLang refuses the format set): the dialect knows
nothing more about what they do.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ...formats.registry import FORMATS
from ...shapes import fmt_shape
from ..base import EXACT, LOSSY, REFUSED, Claim, Dialect, Lossy, Translation, refused
from ..common import copy
from ..decoders import scaled_fp8

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint
    from ...io.header import TensorEntry

NAME = "convert-to-quant"
_refused = partial(refused, NAME)
SCALAR = "weight_scalar"
"""hybrid_mxfp8's fallback scale: not a layer suffix the registry knows (a non-layer tensor)."""
MARKER_TENSOR = "comfy_quant"
ROWWISE, BLOCKWISE, BLOCK3D = "float8_e4m3fn_rowwise", "float8_e4m3fn_blockwise", "float8_e4m3fn_block3d"
INT8_BLOCKWISE, HYBRID = "int8_blockwise", "hybrid_mxfp8"
WEIGHT_DTYPE = {ROWWISE: "F8_E4M3", BLOCKWISE: "F8_E4M3", BLOCK3D: "F8_E4M3", INT8_BLOCKWISE: "I8", HYBRID: "F8_E4M3"}
DEFAULT_BLOCK = {BLOCKWISE: 64, INT8_BLOCKWISE: 128}
"""ctq's ``QUANT_ALGOS`` fallback ``group_size`` when the marker names none."""
TARGET = {
    "F8_E4M3": Lossy(
        "float8_e4m3fn", why="re-quantized with one scale per tensor: no Comfy FP8 format keeps per-row or block scales"
    ),
    "I8": Lossy(
        "int8_tensorwise",
        why="re-quantized as int8_tensorwise (quantize's default INT8 layout): no Comfy INT8 format keeps 2-D block scales",
    ),
}


def scalars(ckpt: Checkpoint) -> dict[str, TensorEntry]:
    cut = len(SCALAR) + 1
    return {n[:-cut]: ckpt.tensors[n] for n in ckpt.other_tensors if n.endswith("." + SCALAR)}


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    extra = scalars(ckpt)
    layers: dict[str, Translation] = {}
    counts: dict[str, int] = {}
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker
        fmt = marker.get("format") if marker is not None else None
        if marker is None or prefix in claimed or not isinstance(fmt, str) or fmt not in WEIGHT_DTYPE:
            continue
        t = dict(layer.tensors)
        if prefix in extra:
            t[SCALAR] = extra[prefix]
        tr = _translate(prefix, t, marker)
        if tr.verdict == REFUSED and fmt in FORMATS:
            continue  # tensors that do not fit a described format: the canonical rules diagnose them
        layers[prefix] = tr
        counts[fmt] = counts.get(fmt, 0) + 1
    if not layers:
        return None
    notes = ["convert_to_quant formats: " + ", ".join(f"{n} {f}" for f, n in sorted(counts.items()))]
    return Claim(NAME, layers, notes=notes)


def _lossy_fp8(prefix: str, t: dict, fmt: str, lossy: Lossy, why: str) -> Translation:
    """A layer whose scales no Comfy FP8 format can hold: it becomes scaled FP8 through its
    dense weight (row and block3d scales take this one road)."""
    return Translation(prefix, NAME, fmt, t, verdict=LOSSY, decoder=scaled_fp8(scale_suffix="weight_scale"), lossy=lossy, why=why)


def _translate(prefix: str, t: dict, marker: dict) -> Translation:
    fmt = marker["format"]
    w, s = t.get("weight"), t.get("weight_scale")
    if w is None or s is None:
        return _refused(prefix, t, variant=fmt, why=f"{fmt} layer without {'weight' if w is None else 'weight_scale'}")
    if w.dtype != WEIGHT_DTYPE[fmt] or len(w.shape) != 2:
        return _refused(
            prefix, t, variant=fmt, why=f"{fmt} needs a 2-D {WEIGHT_DTYPE[fmt]} weight, got {w.dtype} {fmt_shape(w.shape)}"
        )
    if fmt == HYBRID:
        return _hybrid(prefix, t, marker)
    if s.dtype != "F32":
        return _refused(prefix, t, variant=fmt, why=f"weight_scale is {s.dtype}: ctq writes F32 dequant scales")
    n, k = w.shape
    lossy = TARGET[w.dtype]
    if fmt == ROWWISE:
        if s.shape not in ((n,), (n, 1)):
            return _refused(
                prefix, t, variant=fmt, why=f"row scale {fmt_shape(s.shape)} is not [{n}] for weight {fmt_shape(w.shape)}"
            )
        return _lossy_fp8(
            prefix, t, fmt, lossy, f"one scale per row {fmt_shape(s.shape)}: no Comfy FP8 format has per-row scales"
        )
    if fmt == BLOCK3D:
        if len(s.shape) != 3 or s.shape[0] != n or s.shape[2] != 1 or not s.shape[1] or k % s.shape[1]:
            return _refused(
                prefix,
                t,
                variant=fmt,
                why=f"block3d scale {fmt_shape(s.shape)} is not [{n}, K/B, 1] for weight {fmt_shape(w.shape)}",
            )
        return _lossy_fp8(
            prefix,
            t,
            fmt,
            lossy,
            f"per-row block scales {fmt_shape(s.shape)} (blocks of {k // s.shape[1]}): no Comfy FP8 format has block scales",
        )
    size = marker.get("group_size", DEFAULT_BLOCK[fmt])
    if type(size) is not int or size <= 0 or n % size or k % size or s.shape != (n // size, k // size):
        return _refused(
            prefix,
            t,
            variant=fmt,
            why=f"scale {fmt_shape(s.shape)} is not one per {size!r} x {size!r} tile of weight {fmt_shape(w.shape)}",
        )
    kind = "FP8" if w.dtype == "F8_E4M3" else "INT8"
    return Translation(
        prefix,
        NAME,
        f"{fmt} {size}x{size}",
        t,
        verdict=LOSSY,
        decoder=tile_decoder(size),
        lossy=lossy,
        why=f"one scale per {size}x{size} tile {fmt_shape(s.shape)}: no Comfy {kind} format has 2-D block scales",
    )


def _hybrid(prefix: str, t: dict, marker: dict) -> Translation:
    new = dict(marker)
    new["format"] = "mxfp8"
    moves = [copy(e, sfx) for sfx, e in t.items() if sfx not in (SCALAR, MARKER_TENSOR)]
    drops = [t[SCALAR].name] if SCALAR in t else []
    why = "format hybrid_mxfp8 -> mxfp8 (weight and E8M0 block scales unchanged)"
    if drops:
        why += f", drop {SCALAR}"
    return Translation(
        prefix,
        NAME,
        HYBRID,
        t,
        verdict=EXACT,
        why=why,
        format="mxfp8",
        marker=new,
        moves=moves,
        drops=drops,
        dropped_why=f"{SCALAR}: the per-tensor fallback scale; the MXFP8 numbers do not "
        "use it (ctq's hybrid conversion adds it next to the unchanged layer)",
    )


def tile_decoder(size: int):
    """ctq's ``BlockWiseFP8Layout``/``BlockWiseINT8Layout`` weight dequantize: every B x B tile of
    ``q`` times its scale (one F32 multiply per element)."""

    def decode(stored: dict):
        import torch

        q = stored["weight"].to(torch.float32)
        s = stored["weight_scale"].to(torch.float32)
        n, k = q.shape
        tiles = q.reshape(n // size, size, k // size, size) * s.reshape(n // size, 1, k // size, 1)
        return tiles.reshape(n, k)

    return decode


DIALECTS = (
    Dialect(
        NAME,
        "convert_to_quant's own formats (row/block FP8, block INT8, hybrid MXFP8)",
        writer="silveroxides/convert_to_quant (ctq)",
        source="convert_to_quant comfy/quant_ops.py (RowWiseFP8Layout, "
        "BlockWiseFP8Layout, BlockWiseINT8Layout), formats/hybrid_mxfp8_conversion.py, "
        "formats/format_migration.py",
        detect=detect,
        order=40,
    ),
)
