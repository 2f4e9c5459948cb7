"""The three orders among formats, as the commands show and use them.

The listing order (``inspect``, the formats page, every table of formats), the order in which
an unmarked layer's tensors are matched against each format's signature (the first match
wins, so the more specific signatures come first) and the order in which ``quantize`` offers
the formats it writes (the recommended one first; its parameter flags follow it) are pinned
here by name.  A change to any of them is a change the user sees, so it shows up as an edit
of this file.
"""

from __future__ import annotations

from comfyquant.formats import registry
from comfyquant.quantizer.params import format_names, writable

LISTING = [
    "float8_e4m3fn",
    "float8_e5m2",
    "int8_tensorwise",
    "asym_w4a8_int8",
    "convrot_w4a4",
    "nvfp4",
    "mxfp8",
    "awq_w4a16",
    "svdquant_w4a4",
    "rowwise-float8_e4m3fn",
    "float8_e4m3fn_rowwise",
    "float8_e4m3fn_blockwise",
    "int8_blockwise",
]

INFERENCE = [
    "asym_w4a8_int8",
    "awq_w4a16",
    "svdquant_w4a4",
    "nvfp4",
    "mxfp8",
    "convrot_w4a4",
    "int8_tensorwise",
    "float8_e4m3fn",
    "float8_e5m2",
]

WRITING = [
    "asym_w4a8_int8",
    "int8_tensorwise",
    "convrot_w4a4",
    "nvfp4",
    "mxfp8",
    "float8_e4m3fn",
    "float8_e5m2",
    "rowwise-float8_e4m3fn",
]


def test_the_listing_order():
    assert list(registry.FORMATS) == LISTING


def test_the_inference_order():
    assert [f.name for f in registry._INFERENCE_ORDER] == INFERENCE


def test_the_order_quantize_offers_the_formats_in():
    assert writable() == WRITING
    assert format_names() == (
        "asym_w4a8_int8 (w4a8), int8_tensorwise (int8), convrot_w4a4 (w4a4), nvfp4, mxfp8, "
        "float8_e4m3fn (fp8), float8_e5m2 (fp8_e5m2), rowwise-float8_e4m3fn (rowwise-fp8)"
    )


def test_the_parameter_flags_follow_the_formats_order():
    from comfyquant.commands.quantize import param_flags

    assert [flag for flag, _, _ in param_flags()] == [
        "--group-size",
        "--convrot-groupsize",
        "--bits",
        "--asymmetric",
        "--no-codebook",
        "--scale-dtype",
        "--full-precision-matmul",
        "--no-convrot",
        "--scalar-scale",
        "--linear-dtype",
    ]
