"""``comfyquant dequantize``: write a dense copy of a quantized checkpoint.

The module top imports nothing heavy: torch and the codecs load when the command runs.
"""

from __future__ import annotations

import json

from .common import add_io_arguments, inputs_and_output

HELP = "write a dense (unquantized) copy of a quantized checkpoint"


def add_parser(sub) -> None:
    d = sub.add_parser(
        "dequantize",
        help=HELP,
        description=HELP + ". Layers are decoded one at a time; "
        "tensors that are not quantized are copied byte for byte; the checkpoint is checked first.",
    )
    add_io_arguments(
        d,
        "file(s), shards, folder or *.safetensors.index.json",
        "output .safetensors file, or a folder to keep the input's shards",
        "<name>.dense.safetensors next to the input, <folder>.dense for shards",
    )
    d.add_argument(
        "--dtype",
        choices=["bf16", "f16", "f32"],
        help="dtype of the dense weights (default: each layer's model dtype: marker orig_dtype, "
        "else its bias's dtype, else bf16)",
    )
    d.add_argument("--json", action="store_true", help="print the summary as JSON")
    bar = d.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always show the progress bar (default: when stderr is a terminal)",
    )
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")


def run(args) -> int:
    from ..dequantizer import dequantize

    inputs, out = inputs_and_output(args)
    src = inputs[0] if len(inputs) == 1 else inputs
    summary = dequantize(src, out, dtype=args.dtype, progress=args.progress, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    else:
        print(summary.render())
    return 0
