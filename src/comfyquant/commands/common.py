"""Helpers shared by several commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable

    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

EXIT_CODES = (
    "exit codes: 0 done, nothing wrong found (warnings allowed); 1 defects found; "
    "2 unreadable input, usage error or output that cannot be written; "
    "3 internal error (a bug: please report it); 130 interrupted (Ctrl-C)"
)
"""Every command's exit codes, shown at the end of every ``--help`` (docs/names-and-messages.md
lists them with the same meanings)."""


def add_exit_codes(parser) -> None:
    """End ``parser``'s help with ``EXIT_CODES``, after the epilog it has (a command's own
    lists stay first); wrapped here, since a raw-text help prints it as it is."""
    import textwrap

    codes = textwrap.fill(EXIT_CODES, 79, break_on_hyphens=False)
    parser.epilog = f"{parser.epilog}\n\n{codes}" if parser.epilog else codes


def name_mapper(prefix: str | None):
    """The ``--strip-prefix`` mapping, or None."""
    if not prefix:
        return None
    from ..checker.run import strip_prefix_mapper

    return strip_prefix_mapper(prefix)


def number(kind: type, least: float, most: float | None = None):
    """An argparse type: ``kind`` (int or float) from the text, finite and within
    ``[least, most]``, else a one-line usage error.  ``nan``, ``inf`` and ``1e308`` are numbers
    to ``float()`` but mean nothing as a count, a size or a number of seconds."""
    import argparse
    import math

    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not {'a whole number' if kind is int else 'a number'}: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g}, got {text}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {text}")
        return value

    return parse


def target_list(text: str) -> str:
    """argparse type of ``--target``: one runtime, ``all`` or a comma list, refused in one line
    (the command then passes the text on; ``parse_targets`` reads it)."""
    import argparse

    from ..checker.run import parse_targets

    try:
        parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_target_argument(p, help: str, releases: bool = False) -> None:
    """``--target``: the same values on every command (one runtime, ``all`` or a comma list);
    ``releases``: the command also takes release specs (``check``)."""
    specs = ", each with an optional release spec (comfyui==0.31.0, 'sglang>=0.5.19', 'comfy-kitchen<0.2.36')"
    p.add_argument(
        "--target",
        default="all",
        type=target_list,
        metavar="RUNTIMES",
        help=f"{help}: sglang, comfyui, comfy-kitchen, a comma list of them{specs if releases else ''}, or all (default: all)",
    )


OVERWRITE_HELP = "replace existing output files (never an input)"


def add_overwrite_argument(p) -> None:
    """``--overwrite``, the same flag with the same words on every writing command
    (``comfyquant.io.outputs`` applies it)."""
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def add_io_arguments(p, inputs_help: str, out_help: str, default_help: str) -> None:
    """``IN... OUT`` positionals, or ``IN... -o OUT`` (as ``fix`` takes it): the last path is
    the output unless ``-o`` names it; one path alone is the input, and the output gets its
    default name (``default_help`` says which); ``--overwrite``."""
    p.add_argument("inputs", nargs="+", metavar="IN", help=inputs_help)
    p.add_argument("out", nargs="?", metavar="OUT", help=f"{out_help} (or give it with -o; default: {default_help})")
    p.add_argument("-o", "--output", dest="out_option", metavar="OUT", help="the output, instead of the last path")
    add_overwrite_argument(p)


IO_ARGUMENTS = ("inputs", "out", "out_option")
"""The parsed arguments ``add_io_arguments`` adds (``inputs_and_output`` reads them)."""


def inputs_and_output(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(input paths, output path or None for the default name) from ``add_io_arguments``'s
    arguments."""
    paths = list(args.inputs) + ([args.out] if args.out is not None else [])
    if args.out_option is not None:
        return paths, args.out_option
    if len(paths) < 2:
        return paths, None
    return paths[:-1], paths[-1]


SHOWN = frozenset({"command", "json", "verbose"})
"""Parsed arguments that choose how a result is printed (and which command runs), not what is done:
no options object has a field for them."""


def options_from_args(cls: type[T], args: argparse.Namespace, read: Iterable[str] = (), **given: object) -> T:
    """The command's options object (a frozen dataclass) from its parsed arguments: each field
    from the argument of its name, ``given`` fields as the command computed them from the
    arguments named in ``read`` (the paths of ``add_io_arguments``, the format parameters).

    A parsed argument that lands nowhere is a bug, refused on every run of the command: a flag
    added to a parser without its field cannot be silently ignored."""
    from dataclasses import fields

    names = {f.name for f in fields(cls)}
    parsed = vars(args)
    read = set(read)
    unplaced = set(parsed) - names - read - SHOWN
    if unplaced:
        raise TypeError(f"{cls.__name__} has no field for the parsed argument(s) {', '.join(sorted(unplaced))}")
    values = {name: parsed[name] for name in names if name in parsed and name not in read}
    values.update(given)
    return cls(**values)
