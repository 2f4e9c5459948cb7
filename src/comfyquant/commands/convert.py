"""``comfyquant convert``: a quantized checkpoint to another format or parameters, or to dense."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

HELP = "re-encode a quantized checkpoint in another format or with other parameters (or --to dense)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from .quantize import add_common_arguments

    c = sub.add_parser("convert", help=HELP, description=HELP)
    c.add_argument(
        "-t",
        "--to",
        metavar="F",
        help="new format of every quantized layer no rule names (w4a8, w4a4, int8, fp8, nvfp4, mxfp8 ...), or dense",
    )
    c.add_argument("--dtype", choices=["bf16", "f16", "f32"], help="with --to dense: dtype of the decoded weights")
    add_common_arguments(c, "--to")


def run(args: argparse.Namespace) -> int:
    from ..quantizer.api import run as execute
    from ..quantizer.options import ConvertOptions
    from .quantize import options_of, show

    return show(execute(options_of(ConvertOptions, args)), args)
