"""``comfyquant compare``: per-layer error of one checkpoint against another (the reference)."""

from __future__ import annotations

import json

HELP = "per-layer relative L2 error, cosine and max error of a checkpoint against a reference (e.g. the dense original)"


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare",
        help=HELP,
        description=HELP + ". Either file may be dense or quantized "
        "(any format or foreign layout); quantized layers are decoded one at a time.",
    )
    c.add_argument("a", metavar="A", help="the checkpoint to measure: file, folder or *.safetensors.index.json")
    c.add_argument("b", metavar="B", help="the reference (relative L2 = ||A-B|| / ||B||), e.g. the dense original")
    c.add_argument(
        "--layers",
        action="append",
        metavar="GLOB",
        help="compare only layers whose name matches GLOB (repeatable), e.g. 'blocks.1*'",
    )
    c.add_argument(
        "--dtype",
        choices=["bf16", "f16", "f32"],
        help="decode quantized layers to this dtype (default: each layer's model dtype, as dequantize does)",
    )
    c.add_argument(
        "--sort",
        choices=["model", "error"],
        default="model",
        help="table order: model order (default) or worst relative L2 first",
    )
    c.add_argument("--json", action="store_true", help="print every figure as JSON")
    c.add_argument("--plot", metavar="PNG", help="draw the errors per layer into PNG (needs the plot extra)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing --plot file (never an input)")
    c.add_argument(
        "--max-error",
        type=float,
        metavar="X",
        help="exit 1 when a layer's relative L2 error is above X (the layers above it are named, worst first)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def run(args) -> int:
    from ..comparison import check_limit, compare, over_limit, write_png

    limit = check_limit(args.max_error) if args.max_error is not None else None
    if args.plot:
        from ..io.outputs import claim_files
        from ..io.plots import require_matplotlib

        require_matplotlib("--plot")
        # the output rule every command follows, before any work: never an input, an existing
        # file only with --overwrite, never a folder, device, FIFO or socket
        claim_files([args.plot], [args.a, args.b], overwrite=args.overwrite)
    result = compare(args.a, args.b, layers=args.layers, dtype=args.dtype, progress=False if args.no_progress else None)
    if args.plot:
        write_png(result, args.plot)
    # every compared layer has its figure (NaN/Inf when not finite); None is a refused layer's
    errors = {r.layer: r.rel_l2 for r in result.compared if r.rel_l2 is not None}
    over = over_limit(errors, limit) if limit is not None else []
    if args.json:
        doc = result.to_dict()
        if limit is not None:
            doc["max_error"] = {"limit": limit, "ok": not over, "over": [{"layer": n, "rel_l2": _finite(e)} for n, e in over]}
        print(json.dumps(doc, indent=1))
    else:
        print(result.render(args.sort))
        if args.plot:
            print(f"plot: {args.plot}")
        if limit is not None:
            shown = ", ".join(f"{n} {e:.4f}" for n, e in over[:10]) + (f", ... ({len(over)} layers)" if len(over) > 10 else "")
            print(
                f"max-error {limit:g}: "
                + (f"FAILED: {len(over)} layer{'s' * (len(over) != 1)} above it (worst first): {shown}" if over else "passed")
            )
    return 1 if over else 0


def _finite(x: float) -> float | None:
    import math

    return x if math.isfinite(x) else None
