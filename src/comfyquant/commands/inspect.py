"""``comfyquant inspect``: per-layer table of formats, shapes and sizes (local paths or URLs).

A folder of separate checkpoints (``comfyquant.io.shards``) gets one table per checkpoint."""

from __future__ import annotations

import json

from .streams import say

HELP = "per-layer table of formats, shapes, sizes"


def add_parser(sub) -> None:
    from .check import PATHS_HELP, add_remote_arguments

    i = sub.add_parser("inspect", help=HELP, description=HELP)
    i.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
    i.add_argument("--json", action="store_true", help="print the inventory as JSON (with requests and bytes read per file)")
    i.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P")
    i.add_argument("--metadata", action="store_true", help="also show each file's __metadata__")
    i.add_argument("--tensors", action="store_true", help="also list every tensor (name, dtype, shape, bytes, layer)")
    i.add_argument(
        "--wide",
        action="store_true",
        help="every column, however wide (default on a terminal: fit its width, least useful columns first)",
    )
    add_remote_arguments(i)


def run(args) -> int:
    from ..dialects.containers import open_any
    from ..inspection import inventory
    from ..io.shards import SeparateCheckpoints
    from .check import remote_options
    from .common import name_mapper

    mapper = name_mapper(args.strip_prefix)
    remote = remote_options(args, args.paths)
    try:
        ckpt = open_any(args.paths, name_mapper=mapper, remote=remote)
    except SeparateCheckpoints as separate:
        return _run_each(args, separate, mapper, remote)
    with ckpt:
        inv = inventory(ckpt)
        io = ckpt.io_stats()
    if args.json:
        print(json.dumps({**inv.to_dict(args.metadata, args.tensors), "io": io}, indent=1))
    else:
        print(_text(inv, args))
    return 1 if inv.damage else 0  # a damaged file is a defect found, as check says


def _text(inv, args) -> str:
    import shutil
    import sys

    from ..render import render_inventory

    width = None if args.wide or not sys.stdout.isatty() else shutil.get_terminal_size().columns
    return render_inventory(inv, width=width, metadata=args.metadata, tensors=inv.tensors if args.tensors else None)


def _run_each(args, separate, mapper, remote) -> int:
    """One inventory per checkpoint (JSON: ``{"note", "checkpoints": [...]}``, each with its
    ``checkpoint`` label, or its ``error``); exit 2 when one cannot be read, else 1 when one
    is damaged."""

    from ..checker.batch import open_group
    from ..errors import InputError
    from ..inspection import inventory

    sections = []
    damaged = False
    if not args.json:
        print(separate.note)
    for grp in separate.groups:
        try:
            ckpt = open_group(grp, name_mapper=mapper, remote=remote)
        except InputError as exc:
            say(f"comfyquant: {exc}")
            sections.append({"checkpoint": grp.label, "error": str(exc)})
            if not args.json:
                print(f"\n== {grp.label} ==\nERROR {exc}", flush=True)
            continue
        with ckpt:
            inv = inventory(ckpt)
            io = ckpt.io_stats()
        damaged = damaged or bool(inv.damage)
        sections.append({"checkpoint": grp.label, "error": None, **inv.to_dict(args.metadata, args.tensors), "io": io})
        if not args.json:
            print(f"\n== {grp.label} ==\n{_text(inv, args)}", flush=True)
    if args.json:
        from ..inspection import SCHEMA

        print(json.dumps({"schema": SCHEMA, "note": separate.note, "checkpoints": sections}, indent=1))
    return 2 if any(s["error"] for s in sections) else 1 if damaged else 0
