"""The relative order of the formats, in one table: where each is listed, when its tensor
signature is tried on an unmarked layer, and where ``quantize`` offers it.

Each of these orders only means something against the other formats, so it is written here
once, as a sequence of formats from first to last, and not as numbers scattered over the
format packages: placing a format is inserting it in a sequence, with no numbers to keep apart.
The registry reads the table when it collects the packages and derives each format's
``order`` (its listing position) and ``infer_rank`` (its place in the inference order) from it,
and ``quantize``'s offer from the third sequence.

The table names formats by the identifiers their packages define (``p.w4a8.ASYM_W4A8_INT8``),
reached through the packages the registry discovered on disk (``p``), not by import
statements: the modules every format package builds on (``formats.codec``, ``formats.params``,
``formats.validation``) look formats up in the registry, so importing the packages from the
registry's side would close an import cycle through them.  The dependency is the registry's
discovery of the packages, which exists anyway; a name that no longer exists fails the import of
the registry, so the table cannot go stale.

A package the table does not name still registers (a new package needs no other edit to be
checked): it keeps the ``order`` and ``infer_rank`` it declares (by default: listed after every
format here, never inferred), and ``quantize`` offers it after the formats here.  A format the
table names must not declare either number itself; the registry refuses it.
"""

from __future__ import annotations

from types import SimpleNamespace

from .base import Format


class Orders:
    """The three orders, each a sequence of formats from first to last.

    ``listing``: ``inspect``, the formats page and every table of formats; the formats
    ``quantize`` writes, then the ones it only reads, the converter-only ones last.
    ``inference``: the order ``recognize`` is tried on a layer without a marker; the first
    match wins, so a signature that another format's tensors can also show comes after that
    format.  ``writing``: the formats ``quantize`` writes as it offers them, the recommended
    one first; the format-parameter flags of ``quantize`` and ``convert`` follow this order."""

    __slots__ = ("listing", "inference", "writing")

    def __init__(self, listing: tuple[Format, ...], inference: tuple[Format, ...], writing: tuple[Format, ...]) -> None:
        self.listing = listing
        self.inference = inference
        self.writing = writing


def orders(p: SimpleNamespace) -> Orders:
    """The table, over the discovered format packages ``p`` (package name -> module)."""
    return Orders(
        listing=(
            p.fp8.FLOAT8_E4M3FN,
            p.float8_e5m2.FLOAT8_E5M2,
            p.int8.INT8_TENSORWISE,
            p.w4a8.ASYM_W4A8_INT8,
            p.w4a4.CONVROT_W4A4,
            p.nvfp4.NVFP4,
            p.mxfp8.MXFP8,
            p.awq.AWQ_W4A16,
            p.svdquant.SVDQUANT_W4A4,
            p.rowwise_fp8.ROWWISE_FLOAT8_E4M3FN,
            p.fp8.FLOAT8_E4M3FN_ROWWISE,
            p.fp8.FLOAT8_E4M3FN_BLOCKWISE,
            p.int8.INT8_BLOCKWISE,
        ),
        inference=(
            # the slots only one format has: W4A8's s_rel, AWQ's zeros, SVDQuant's low-rank pair
            p.w4a8.ASYM_W4A8_INT8,
            p.awq.AWQ_W4A16,
            p.svdquant.SVDQUANT_W4A4,
            p.nvfp4.NVFP4,
            # MXFP8's weight is FP8 E4M3 too: its block scales tell it from per-tensor FP8
            p.mxfp8.MXFP8,
            # W4A4's I8 weight with [N] scales before INT8's looser I8 signature, which a
            # one-row W4A4 layer (its scale a single element) also shows
            p.w4a4.CONVROT_W4A4,
            p.int8.INT8_TENSORWISE,
            p.fp8.FLOAT8_E4M3FN,
            p.float8_e5m2.FLOAT8_E5M2,
        ),
        writing=(
            p.w4a8.ASYM_W4A8_INT8,
            p.int8.INT8_TENSORWISE,
            p.w4a4.CONVROT_W4A4,
            p.nvfp4.NVFP4,
            p.mxfp8.MXFP8,
            p.fp8.FLOAT8_E4M3FN,
            p.float8_e5m2.FLOAT8_E5M2,
            p.rowwise_fp8.ROWWISE_FLOAT8_E4M3FN,
        ),
    )
