"""``comfyquant check``: every defect, and each runtime's verdict."""

from __future__ import annotations

import json

HELP = "find every defect and predict each runtime's verdict"


def add_parser(sub) -> None:
    c = sub.add_parser("check", help=HELP, description=HELP)
    c.add_argument("paths", nargs="+", metavar="PATH", help="file(s), folder or *.safetensors.index.json")
    c.add_argument("--target", default="all", choices=["sglang", "comfyui", "comfy-kitchen", "all"],
                   help="runtime(s) whose rules decide severity (default: all)")
    c.add_argument("--deep", action="store_true", help="also read scales, codebooks and corrections (never weights)")
    c.add_argument("--json", action="store_true", help="print the report as JSON (schema 1)")
    c.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P (e.g. model.diffusion_model.)")
    c.add_argument("-v", "--verbose", action="store_true", help="also list info findings and I/O counts")


def run(args) -> int:
    from ..checker.run import check
    from .common import name_mapper

    report = check(args.paths, target=args.target, deep=args.deep, name_mapper=name_mapper(args.strip_prefix))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        from ..render import render_report

        print(render_report(report, verbose=args.verbose))
    return 0 if report.ok else 1
