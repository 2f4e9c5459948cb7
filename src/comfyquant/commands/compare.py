"""``comfyquant compare``: per-layer error of one checkpoint against another (the reference)."""

from __future__ import annotations

import json

HELP = "per-layer relative L2 error, cosine and max error of a checkpoint against a reference (e.g. the dense original)"


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help=HELP, description=HELP + ". Either file may be dense or quantized "
                       "(any format or foreign layout); quantized layers are decoded one at a time.")
    c.add_argument("a", metavar="A", help="the checkpoint to measure: file, folder or *.safetensors.index.json")
    c.add_argument("b", metavar="B", help="the reference (relative L2 = ||A-B|| / ||B||), e.g. the dense original")
    c.add_argument("--layers", action="append", metavar="GLOB",
                   help="compare only layers whose name matches GLOB (repeatable), e.g. 'blocks.1*'")
    c.add_argument("--dtype", choices=["bf16", "f16", "f32"],
                   help="decode quantized layers to this dtype (default: each layer's model dtype, as dequantize does)")
    c.add_argument("--sort", choices=["model", "error"], default="model",
                   help="table order: model order (default) or worst relative L2 first")
    c.add_argument("--json", action="store_true", help="print every figure as JSON")
    c.add_argument("--plot", metavar="PNG", help="draw the errors per layer into PNG (needs the plot extra)")
    c.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def run(args) -> int:
    from ..comparison import compare, require_matplotlib, write_png

    if args.plot:
        require_matplotlib()
    result = compare(args.a, args.b, layers=args.layers, dtype=args.dtype,
                     progress=False if args.no_progress else None)
    if args.plot:
        write_png(result, args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(result.render(args.sort))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
