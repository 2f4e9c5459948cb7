"""``comfyquant convert``: a quantized checkpoint to another format or parameters, or to dense."""

from __future__ import annotations

HELP = "re-encode a quantized checkpoint in another format or with other parameters (or --to dense)"


def add_parser(sub) -> None:
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


def run(args) -> int:
    from ..quantizer.api import convert
    from .common import inputs_and_output
    from .quantize import common_options, params_of, show

    inputs, out = inputs_and_output(args)
    result = convert(
        inputs,
        out,
        args.to,
        params_of(args),
        **common_options(args),
        dtype=args.dtype,
    )
    return show(result, args)
