"""``comfyquant inspect``: per-layer table of formats, shapes and sizes (local paths or URLs)."""

from __future__ import annotations

import json

HELP = "per-layer table of formats, shapes, sizes"


def add_parser(sub) -> None:
    from .check import PATHS_HELP, add_remote_arguments

    i = sub.add_parser("inspect", help=HELP, description=HELP)
    i.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
    i.add_argument("--json", action="store_true", help="print the inventory as JSON (with requests and bytes read per file)")
    i.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P")
    add_remote_arguments(i)


def run(args) -> int:
    from ..checkpoint import open_checkpoint
    from ..inspection import inventory
    from .check import remote_options
    from .common import name_mapper

    with open_checkpoint(args.paths, name_mapper=name_mapper(args.strip_prefix),
                         remote=remote_options(args, args.paths)) as ckpt:
        inv = inventory(ckpt)
        io = ckpt.io_stats()
    if args.json:
        print(json.dumps({**inv.to_dict(), "io": io}, indent=1))
    else:
        from ..render import render_inventory

        print(render_inventory(inv))
    return 0
