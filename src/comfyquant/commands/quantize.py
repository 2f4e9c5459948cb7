"""``comfyquant quantize``: dense checkpoint -> Comfy quantized checkpoint, with a quality report.

The format parameters (``--group-size`` ...) are shared with ``convert``; torch loads only
when the command runs, never when the parser is built.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeVar

from .common import IO_ARGUMENTS, add_io_arguments, add_target_argument, inputs_and_output, options_from_args
from .streams import say

if TYPE_CHECKING:
    import argparse

    from ..quantizer.api import Result
    from ..quantizer.options import EncodeOptions

E = TypeVar("E", bound="EncodeOptions")

HELP = "quantize a dense checkpoint (W4A8, W4A4, INT8, FP8, NVFP4, MXFP8) with a per-layer quality report"


def param_flags() -> list[tuple[str, str, dict]]:
    """The format-parameter flags, as the writable formats' Params declare them (each once, in
    the order quantize offers the formats, the recommended one first; a ``{default}`` in a help text becomes the declaring field's default).
    Imports the Params modules: only the quantize and convert parsers are built with them."""
    from dataclasses import fields

    from ..formats.registry import FORMATS
    from ..quantizer.params import writable

    out: dict[str, tuple[str, str, dict]] = {}
    for cls in (FORMATS[name].params_class() for name in writable()):
        defaults = {f.name: f.default for f in fields(cls)}
        for flag, dest, kw in cls.FLAGS:
            if flag not in out:
                kw = dict(kw, help=kw["help"].replace("{default}", str(defaults.get(dest))))
                out[flag] = (flag, dest, kw)
    return list(out.values())


def add_common_arguments(p: argparse.ArgumentParser, format_flag: str) -> None:
    """Arguments ``quantize`` and ``convert`` share."""
    add_io_arguments(
        p,
        "file(s), folder or *.safetensors.index.json",
        "output file, or folder for sharded inputs",
        f"<name>.<format>.safetensors next to the input, <folder>.<format> for shards, <format> being "
        f"{format_flag}'s full name, or '{'quantized' if format_flag == '--format' else 'converted'}' "
        "with --rules alone",
    )
    g = p.add_argument_group("format parameters (for the default format; rules files carry their own)")
    for flag, dest, kw in param_flags():
        g.add_argument(flag, dest=f"param_{dest}", default=None, **kw)
    p.add_argument("--rules", metavar="FILE", help="TOML rules: layer-name globs -> format and parameters, or keep")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="keep layers whose name matches REGEX as they are (repeatable)",
    )
    add_target_argument(p, "runtime(s) the output must load in")
    p.add_argument(
        "-j",
        "--jobs",
        default="auto",
        metavar="N",
        help="compute on N cores: 1 = this process, one torch thread; N > 1 = N worker processes. "
        "Default auto: every core, worker processes when slow encoders (W4A8, W4A4) dominate",
    )
    p.add_argument("--report", metavar="FILE", help="write the quality report: FILE.json and FILE.png (needs the plot extra)")
    p.add_argument(
        "--reference",
        metavar="DENSE",
        help="the original dense checkpoint: measure every quantized layer against its weights too",
    )
    p.add_argument(
        "--max-error",
        type=float,
        metavar="X",
        help="quality gate: a layer's relative L2 weight error above X (against --reference, else the "
        "source) exits 1 and keeps the output as <name>.over-max-error.safetensors, not at OUT",
    )
    p.add_argument("--dry-run", action="store_true", help="print the per-layer plan, compute and write nothing")
    p.add_argument("--keep-bad", action="store_true", help="keep layers with NaN/Inf weights as they are instead of refusing")
    p.add_argument("--json", action="store_true", help="print the report document as JSON")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always redraw the progress line on stderr (default: redrawn on a terminal, a plain line every 10 s in a log)",
    )
    shown.add_argument("--no-progress", dest="progress", action="store_false", help="no progress on stderr")
    p.add_argument("-v", "--verbose", action="store_true", help="print the full per-layer plan")


def add_parser(sub: argparse._SubParsersAction) -> None:
    import argparse

    from ..quantizer.presets import PRESETS, help_text

    q = sub.add_parser(
        "quantize", help=HELP, description=HELP, epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    q.add_argument("-f", "--format", metavar="F", help=f"format of every layer no rule names: {writable_names()}")
    add_common_arguments(q, "--format")
    g = q.add_argument_group("model presets and recipes")
    g.add_argument(
        "--preset",
        metavar="NAME",
        help=f"keep the layers a model family keeps dense ({', '.join(PRESETS)}; the lists and their "
        f"sources are below); others get --format, else the preset's format; default: detected from "
        "the tensor names; none: no preset",
    )
    g.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PARTS",
        help="in a ComfyUI all-in-one checkpoint, quantize these parts too (text-encoders, vae, all; "
        "comma list): by default only the diffusion model (model.diffusion_model.*)",
    )
    g.add_argument(
        "--like",
        metavar="GOOD",
        help="give every layer the format and parameters it has in the quantized checkpoint GOOD "
        "(what comfyquant recipe GOOD prints)",
    )


def writable_names() -> str:
    """The formats quantize writes, as the registry lists them (each by its first short name)."""
    from ..formats.registry import FORMATS

    return ", ".join(f.aliases[0] if f.aliases else n for n, f in FORMATS.items() if f.writable) + " (or the full names)"


PARAM_PREFIX = "param_"
"""The parsed arguments of the format parameters: ``param_<field>``."""


def params_of(args: argparse.Namespace) -> dict[str, object]:
    """The format parameters the command line set (``param_<name>`` destinations)."""
    return {
        name[len(PARAM_PREFIX) :]: value
        for name, value in vars(args).items()
        if name.startswith(PARAM_PREFIX) and value is not None
    }


def options_of(cls: type[E], args: argparse.Namespace) -> E:
    """The ``quantize``/``convert`` options object the command line asks for: the paths and the
    format parameters gathered, every other argument by the field of its name."""
    inputs, out = inputs_and_output(args)
    params = [name for name in vars(args) if name.startswith(PARAM_PREFIX)]
    return options_from_args(cls, args, read=(*IO_ARGUMENTS, *params), paths=inputs, out=out, params=params_of(args))


def run(args: argparse.Namespace) -> int:
    from ..quantizer.api import run as execute
    from ..quantizer.options import QuantizeOptions

    return show(execute(options_of(QuantizeOptions, args)), args)


def show(result: Result, args: argparse.Namespace) -> int:
    """Print a run's outcome (text or JSON); the exit code."""
    for note in getattr(result.plan, "notes", None) or ():  # preset detected, --like differences
        say(note)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0 if result.ok else 1
    from ..quantizer.report import render_plan, render_result

    if result.plan is None:  # convert --to dense
        if result.dense_summary is not None:
            print(result.dense_summary.render())
        return 0
    print(render_plan(result.plan, full=args.dry_run or args.verbose))
    if args.dry_run:
        if result.plan.refusal:
            print(result.plan.refusal)
            print("dry run: nothing computed or written; the run would be refused")
            return 1
        print("dry run: nothing computed or written")
        return 0
    print(render_result(result.to_dict(), result.check))
    for path in result.outputs:
        print(f"wrote {path}")
    if result.report_files:
        print(f"report: {', '.join(result.report_files)}")
    return 0 if result.ok else 1
