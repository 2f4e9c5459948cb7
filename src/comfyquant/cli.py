"""The ``comfyquant`` command line.  Thin: parse arguments, call the API, render, exit.

Exit codes: 0 no errors (warnings allowed), 1 errors found, 2 unreadable input or usage error.
Imports stay minimal here: ``check`` of a 14B checkpoint must finish in well under 100 ms.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .errors import ComfyQuantError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: one line, exit 2
        self.print_usage(sys.stderr)
        sys.stderr.write(f"comfyquant: error: {message}\n")
        raise SystemExit(2)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="comfyquant", description="Check, inspect and repair Comfy quantized safetensors checkpoints.")
    p.add_argument("--version", action="version", version=f"comfyquant {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("check", help="find every defect and predict each runtime's verdict")
    c.add_argument("paths", nargs="+", metavar="PATH", help="file(s), folder or *.safetensors.index.json")
    c.add_argument("--target", default="all", choices=["sglang", "comfyui", "comfy-kitchen", "all"],
                   help="runtime(s) whose rules decide severity (default: all)")
    c.add_argument("--deep", action="store_true", help="also read scales, codebooks and corrections (never weights)")
    c.add_argument("--json", action="store_true", help="print the report as JSON (schema 1)")
    c.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P (e.g. model.diffusion_model.)")
    c.add_argument("-v", "--verbose", action="store_true", help="also list info findings and I/O counts")

    i = sub.add_parser("inspect", help="per-layer table of formats, shapes, sizes")
    i.add_argument("paths", nargs="+", metavar="PATH")
    i.add_argument("--json", action="store_true")
    i.add_argument("--strip-prefix", metavar="P")
    return p


def _mapper(prefix: str | None):
    if not prefix:
        return None
    from .checker.run import strip_prefix_mapper

    return strip_prefix_mapper(prefix)


def cmd_check(args) -> int:
    from .checker.run import check

    report = check(args.paths, target=args.target, deep=args.deep, name_mapper=_mapper(args.strip_prefix))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        from .render import render_report

        print(render_report(report, verbose=args.verbose))
    return 0 if report.ok else 1


def cmd_inspect(args) -> int:
    from .inspection import inspect

    inv = inspect(args.paths, name_mapper=_mapper(args.strip_prefix))
    if args.json:
        print(json.dumps(inv.to_dict(), indent=1))
    else:
        from .render import render_inventory

        print(render_inventory(inv))
    return 0


COMMANDS = {"check": cmd_check, "inspect": cmd_inspect}


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except ComfyQuantError as exc:
        sys.stderr.write(f"comfyquant: {exc}\n")
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("comfyquant: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
