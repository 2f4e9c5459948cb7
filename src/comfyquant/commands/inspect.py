"""``comfyquant inspect``: per-layer table of formats, shapes and sizes."""

from __future__ import annotations

import json

HELP = "per-layer table of formats, shapes, sizes"


def add_parser(sub) -> None:
    i = sub.add_parser("inspect", help=HELP, description=HELP)
    i.add_argument("paths", nargs="+", metavar="PATH", help="file(s), folder or *.safetensors.index.json")
    i.add_argument("--json", action="store_true", help="print the inventory as JSON")
    i.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P")


def run(args) -> int:
    from ..inspection import inspect
    from .common import name_mapper

    inv = inspect(args.paths, name_mapper=name_mapper(args.strip_prefix))
    if args.json:
        print(json.dumps(inv.to_dict(), indent=1))
    else:
        from ..render import render_inventory

        print(render_inventory(inv))
    return 0
