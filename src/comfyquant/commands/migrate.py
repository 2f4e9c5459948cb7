"""``comfyquant migrate``: rewrite another writer's layout as a Comfy quantized checkpoint."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

HELP = "rewrite a file of another layout (legacy scaled FP8, musubi, ModelOpt, BFL, ...) as a Comfy checkpoint"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from .common import add_overwrite_argument, add_target_argument

    m = sub.add_parser(
        "migrate",
        help=HELP,
        description=HELP + ": a verdict per layer (exact, byte-permutation, "
        "lossy, refused); streaming, atomic, verified like fix",
    )
    m.add_argument("paths", nargs="+", metavar="IN", help="file(s), folder or *.safetensors.index.json (or a .gguf)")
    m.add_argument(
        "-o", "--output", dest="out", metavar="OUT", help="output file (or folder for shards); default: <name>.comfy.safetensors"
    )
    m.add_argument("--in-place", action="store_true", help="replace the input, only after the new file is verified")
    add_target_argument(m, "runtime(s) the migrated file must load in")
    m.add_argument("--dry-run", action="store_true", help="print the verdict per layer, write nothing")
    m.add_argument("--json", action="store_true", help="print the result as JSON")
    m.add_argument(
        "--allow-lossy",
        action="store_true",
        help="re-quantize layers that have no exact Comfy form (each with its measured error; needs torch)",
    )
    m.add_argument("--to", metavar="DIALECT", help="write the Comfy layers in another layout instead (e.g. bfl, modelopt)")
    add_overwrite_argument(m)


def run(args: argparse.Namespace) -> int:
    from ..repair.migration import run_migrate
    from ..repair.options import MigrateOptions
    from .common import options_from_args

    result = run_migrate(options_from_args(MigrateOptions, args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        from ..render import render_migrate

        print(render_migrate(result))
    if result.nothing and not result.before.ok:
        return 1  # a Comfy file with errors: migrate has nothing to do, fix has (the line says so)
    return 0 if result.ok else 1
