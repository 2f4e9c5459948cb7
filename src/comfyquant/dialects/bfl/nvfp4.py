"""NVFP4 layers of another layout as Comfy ``nvfp4`` layers, and back: the moves both NVFP4
dialects (``bfl``, ``modelopt``) share.

A foreign NVFP4 layer is described by its nibble order, its scale layout and how many logical
scale columns it stores (``numerics.nvfp4_layouts``); the Comfy layer gets the same
numbers high nibble first, rows zero-padded to the format's multiple (``Format.pad``) and the
scales blocked.  Nothing here imports torch: the byte transforms run on numpy when a move is
written, the decoder imports torch when it runs.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ...findings import Finding
from ...formats.registry import FORMATS
from ...numerics import nvfp4_layouts as lay
from ...numerics.blocked import blocked_shape, ceil_to
from ...shapes import fmt_shape
from ..base import EXACT, PERMUTATION, REFUSED, Move, Translation
from ..common import copy, is_scalar_float, scalar_scale
from ..reading import read_sound

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

COMFY = "nvfp4"
HANDLED = ("weight", "weight_scale", "weight_scale_2", "input_scale", "comfy_quant")
SCALE_DTYPES = ("F8_E4M3", "U8")
PADDING_UNSETTLED = "the padding the translation drops is zero"
"""What stays open for a layer whose padded tensor cannot be read as its header says."""
"""E4M3 block scales (U8: the same bytes under another label)."""


class Packing(NamedTuple):
    """How a dialect stores its NVFP4 layers: the dialect and variant its translations are
    labelled with, the nibble order and the scale layout (``numerics.nvfp4_layouts``).  One
    value describes both directions (``to_comfy`` and ``from_comfy``)."""

    dialect: str
    variant: str
    nibbles: str
    layout: str

    def refuse(self, prefix: str, t: dict, why: str, **more: Any) -> Translation:
        """The layer is not translated, and ``why``."""
        return Translation(prefix, self.dialect, self.variant, t, verdict=REFUSED, why=why, **more)


class Dropping(Move):
    """A move whose transform drops bytes as zero padding (and raises
    ``PaddingNotZero`` when they are not zero):
    ``check_padding`` runs it on the stored data before anything is written."""

    __slots__ = ()


def comfy_pad() -> tuple[int, int]:
    """The multiples Comfy's NVFP4 pads a stored weight to (rows, columns of elements)."""
    return FORMATS[COMFY].pad


def nvfp4_tensors(t: dict) -> bool:
    """A packed-FP4 layer: U8 2-D weight, 2-D E4M3 block scales, a scalar tensor scale."""
    w, s, s2 = t.get("weight"), t.get("weight_scale"), t.get("weight_scale_2")
    return (
        w is not None
        and w.dtype == "U8"
        and len(w.shape) == 2
        and s is not None
        and s.dtype in SCALE_DTYPES
        and len(s.shape) == 2
        and is_scalar_float(s2)
    )


def fits(t: dict) -> dict[str, int]:
    """The scale layouts the layer's shapes fit (layout -> logical scale columns); empty when
    the packed width is no whole number of 16-blocks."""
    rows, cb = t["weight"].shape
    if cb <= 0 or (2 * cb) % lay.BLOCK:
        return {}
    return lay.scale_layouts(rows, 2 * cb // lay.BLOCK, tuple(t["weight_scale"].shape))


def model_rows(t: dict, rows: int) -> int | None:
    """The model's N: the bias length when the stored rows are that length padded to 16 (or
    equal), else the stored rows; None when the bias contradicts the weight."""
    bias = t.get("bias")
    if bias is None:
        return rows
    if len(bias.shape) == 1 and bias.shape[0] > 0 and rows in (bias.shape[0], ceil_to(bias.shape[0], comfy_pad()[0])):
        return bias.shape[0]
    return None


def to_comfy(
    prefix: str, t: dict, packing: Packing, *, scale_cols: int, source: str, unsettled: list[str] | None = None
) -> Translation:
    """The Comfy ``nvfp4`` translation of a packed-FP4 layer stored as ``packing`` says, with
    ``scale_cols`` logical scale columns (``source`` says who writes it so)."""
    w, s, si = t["weight"], t["weight_scale"], t.get("input_scale")
    rows, cb = w.shape
    kblocks = 2 * cb // lay.BLOCK
    pad_rows, pad_cols = comfy_pad()
    n_model = model_rows(t, rows)
    nibbles, layout = packing.nibbles, packing.layout
    refuse = partial(packing.refuse, prefix, t, unsettled=unsettled)
    if (2 * cb) % pad_cols:
        return refuse(
            why=f"packed weight {fmt_shape(w.shape)} holds K = {2 * cb}, not a multiple of {pad_cols}: "
            "Comfy nvfp4 pads K, and nothing would record the model's K"
        )
    if n_model is None:
        return refuse(why=f"bias {fmt_shape(t['bias'].shape)} does not fit weight {fmt_shape(w.shape)}")
    if rows % pad_rows and "bias" not in t:
        return refuse(
            why=f"N = {rows} rows, not a multiple of {pad_rows}: Comfy nvfp4 pads them to "
            f"{ceil_to(rows, pad_rows)} and, without a bias, nothing in the Comfy file would keep N"
        )
    if si is not None and not is_scalar_float(si):
        return refuse(why=f"input_scale {si.dtype} {fmt_shape(si.shape)} is not one float")
    out_rows = ceil_to(rows, pad_rows)
    what = []
    if nibbles == lay.LOW_FIRST:
        what.append("nibbles low-first -> high-first")
    if out_rows != rows:
        what.append(f"rows {rows} -> {out_rows} (zero padding)")
    weight = Move(
        "weight",
        w.name,
        "U8",
        (out_rows, cb),
        partial(lay.weight_to_comfy, rows=rows, cols=cb, out_rows=out_rows, out_cols=cb, nibbles=nibbles),
        PERMUTATION if what else EXACT,
        ", ".join(what),
    )
    s_what = [f"{layout} {fmt_shape(s.shape)} -> blocked {fmt_shape(blocked_shape(rows, kblocks))}"]
    if scale_cols != kblocks:
        s_what.append(f"scale columns {scale_cols} -> {kblocks} (zero padding dropped)")
    if s.dtype == "U8":
        s_what.append("U8 -> F8_E4M3 (same bytes)")
    drops = tuple(s.shape) != (rows, kblocks)  # blocked padding, or row_col scale columns
    if drops and layout == lay.BLOCKED:
        s_what.append("the blocked layout's zero padding dropped")
    scale = (Dropping if drops else Move)(
        "weight_scale",
        s.name,
        "F8_E4M3",
        blocked_shape(rows, kblocks),
        partial(lay.scales_to_comfy, layout=layout, rows=rows, cols=scale_cols, kblocks=kblocks),
        PERMUTATION,
        ", ".join(s_what),
    )
    why = ", ".join(what + s_what[:1]) + f" ({source})"
    pre = t.get("pre_quant_scale")
    k_model = pre.shape[0] if pre is not None and len(pre.shape) == 1 else 2 * cb
    decoder = partial(_decode, nibbles=nibbles, layout=layout, scale_cols=scale_cols, rows=n_model, cols=k_model)
    return _repacked(
        prefix,
        t,
        packing,
        weight,
        scale,
        why,
        format=COMFY,
        marker={"format": COMFY},
        unsettled=unsettled,
        decoder=decoder,
    )


def _repacked(prefix: str, t: dict, packing: Packing, weight: Move, scale: Move, why: str, **kw) -> Translation:
    """The translation of an NVFP4 layer whose weight and block scales are repacked into
    another layout (``to_comfy`` and ``from_comfy``): the two global scales stay scalars, the
    other tensors are copied, and ``kw`` carries what the direction adds (format, marker...)."""
    moves = [weight, scale, scalar_scale(t["weight_scale_2"], prefix, "weight_scale_2")]
    si = t.get("input_scale")
    if si is not None:
        moves.append(scalar_scale(si, prefix, "input_scale"))
    moves += [copy(e, suffix) for suffix, e in t.items() if suffix not in HANDLED]
    return Translation(prefix, packing.dialect, packing.variant, t, verdict=PERMUTATION, why=why, moves=moves, **kw)


def _decode(stored: dict, *, nibbles: str, layout: str, scale_cols: int, rows: int, cols: int):
    return lay.decode(
        stored["weight"],
        stored["weight_scale"],
        stored["weight_scale_2"],
        nibbles=nibbles,
        layout=layout,
        scale_cols=scale_cols,
        rows=rows,
        cols=cols,
        pre_quant_scale=stored.get("pre_quant_scale"),
    )


def from_comfy(
    prefix: str,
    t: dict,
    packing: Packing,
    *,
    keep_rows: bool,
    pad_scale_cols: bool,
    marker: dict | None,
    require_input_scale: str = "",
) -> Translation:
    """A Comfy ``nvfp4`` layer in the layout ``packing`` says (nibble order, scales), rows cut
    to the model's N (the bias length) unless ``keep_rows``, packed and scale columns padded to
    16 when ``pad_scale_cols`` (ModelOpt's ``row_col``).  Dropped padding must be zero (the
    transforms check it when they run).  ``require_input_scale``: why the layout needs one."""
    w, s, s2, si = t["weight"], t["weight_scale"], t["weight_scale_2"], t.get("input_scale")
    rows, cb = w.shape
    kblocks = 2 * cb // lay.BLOCK
    nibbles, layout = packing.nibbles, packing.layout
    refuse = partial(packing.refuse, prefix, t)
    if (
        (2 * cb) % lay.BLOCK
        or tuple(s.shape) != blocked_shape(rows, kblocks)
        or not is_scalar_float(s2)
        or s.dtype not in SCALE_DTYPES
    ):
        return refuse(why=f"not a Comfy nvfp4 layer: weight {fmt_shape(w.shape)}, weight_scale {s.dtype} {fmt_shape(s.shape)}")
    if si is None and require_input_scale:
        return refuse(why=require_input_scale)
    if si is not None and not is_scalar_float(si):
        return refuse(why=f"input_scale {si.dtype} {fmt_shape(si.shape)} is not one float")
    n_model = model_rows(t, rows)
    if n_model is None:
        return refuse(why=f"bias {fmt_shape(t['bias'].shape)} does not fit weight {fmt_shape(w.shape)}")
    out_rows = rows if keep_rows else n_model
    out_cb = ceil_to(cb, 16) if pad_scale_cols else cb
    out_sc = ceil_to(kblocks, 16) if pad_scale_cols else kblocks
    what = ["nibbles high-first -> low-first"] if nibbles == lay.LOW_FIRST else []
    if out_rows != rows:
        what.append(f"rows {rows} -> {out_rows} (zero padding dropped)")
    if out_cb != cb:
        what.append(f"packed columns {cb} -> {out_cb} (zero padding)")
    weight = (Dropping if out_rows < rows else Move)(
        "weight",
        w.name,
        "U8",
        (out_rows, out_cb),
        partial(lay.weight_from_comfy, rows=rows, cols=cb, out_rows=out_rows, out_cols=out_cb, nibbles=nibbles),
        PERMUTATION,
        ", ".join(what),
    )
    s_shape = (out_rows, out_sc) if layout == lay.LINEAR else blocked_shape(out_rows, out_sc)
    scale = (Dropping if out_rows < rows or tuple(s.shape) != (rows, kblocks) else Move)(
        "weight_scale",
        s.name,
        "F8_E4M3",
        s_shape,
        partial(lay.scales_from_comfy, rows=rows, kblocks=kblocks, out_rows=out_rows, out_cols=out_sc, layout=layout),
        PERMUTATION,
        f"blocked {fmt_shape(s.shape)} -> {layout} {fmt_shape(s_shape)}",
    )
    return _repacked(
        prefix,
        t,
        packing,
        weight,
        scale,
        ", ".join(what + [scale.what]),
        format=None,
        marker=marker,
        drops=[t["comfy_quant"].name] if "comfy_quant" in t else [],
        dropped_why="the layout has no comfy_quant marker",
    )


def check_padding(ckpt: Checkpoint, tr: Translation) -> str | None:
    """Run the translation's ``Dropping`` moves on the stored bytes: the bytes they drop
    as padding must be zero.  When they are not, the layer is refused (its verdict and why
    say so) and the reason is returned."""
    for move in tr.moves:
        transform = move.transform
        if not isinstance(move, Dropping) or transform is None:
            continue
        data = read_sound(ckpt, [ckpt.tensors[move.source]]).get(move.source)
        if data is None:  # bytes that are not what the header says (C001/C002 name them): unsettled
            if PADDING_UNSETTLED not in tr.unsettled:
                tr.unsettled.append(PADDING_UNSETTLED)
            continue
        try:
            transform(data)
        except lay.PaddingNotZero as exc:
            tr.verdict = REFUSED
            tr.format = tr.marker = None
            tr.moves = []
            tr.decoder = None
            tr.why = f"{exc}: dropping them would lose these values"
            return str(exc)
    return None


def settle(ckpt: Checkpoint, claim) -> list[Finding]:
    """``--deep`` (and ``migrate``) for the NVFP4 layers of a claim: padding a translation drops
    must be zero (``check_padding``)."""
    findings: list[Finding] = []
    for tr in claim.layers.values():
        if tr.verdict == PERMUTATION and tr.format == COMFY:
            problem = check_padding(ckpt, tr)
            if problem is not None:
                findings.append(
                    Finding(
                        "F004",
                        f"layer {tr.prefix}: {problem}",
                        layer=tr.prefix,
                        cause=f"a {claim.dialect} NVFP4 layer whose padding holds values",
                        fix="re-export the layer from its writer, or dequantize it",
                    )
                )
    return findings
