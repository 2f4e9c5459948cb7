"""``comfyquant fix``: repair a checkpoint safely (streaming, atomic, verified)."""

from __future__ import annotations

import argparse
import json

HELP = "repair a broken checkpoint: streaming, atomic, verified"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from .common import add_overwrite_argument, add_target_argument, number

    f = sub.add_parser("fix", help=HELP, description=HELP)
    f.add_argument("paths", nargs="+", metavar="IN", help="file(s), folder or *.safetensors.index.json")
    f.add_argument(
        "-o",
        "--output",
        dest="out",
        metavar="OUT",
        help="output file (or folder for shards); default: <name>.fixed.safetensors / <folder>.fixed",
    )
    f.add_argument("--in-place", action="store_true", help="replace the input, only after the new file is verified")
    add_target_argument(f, "runtime(s) the repaired file must load in")
    f.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    f.add_argument("--json", action="store_true", help="print the result as JSON")
    f.add_argument("--allow-lossy", action="store_true", help="also apply repairs that change values (reported with their error)")
    f.add_argument("--prefer", choices=["header", "tensor"], help="which marker wins when header and tensor markers disagree")
    f.add_argument(
        "--convrot-groupsize",
        type=number(int, 1),
        metavar="C",
        help="ConvRot size for markers that lack one (16, 64 or 256); never guessed",
    )
    f.add_argument(
        "--reference",
        metavar="DENSE",
        help="the original dense checkpoint: measure every repaired layer against it and refuse a repair "
        "whose error is not that of its format (needs torch)",
    )
    f.add_argument(
        "--max-error",
        type=float,
        metavar="X",
        help="with --reference: a repaired layer's relative L2 error above X exits 1 and keeps the output "
        "as <name>.over-max-error.safetensors, not at OUT (nor over the input)",
    )
    add_overwrite_argument(f)
    # The flag's name before every writing command took --overwrite: kept so scripts keep working.
    f.add_argument("--force", dest="overwrite", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from ..repair.options import FixOptions
    from ..repair.run import run_fix
    from .common import options_from_args

    result = run_fix(options_from_args(FixOptions, args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        from ..render import render_fix

        print(render_fix(result))
    if result.plan.empty and not result.before.ok:
        return 1
    return 0 if result.ok else 1
