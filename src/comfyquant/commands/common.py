"""Helpers shared by several commands."""

from __future__ import annotations


def name_mapper(prefix: str | None):
    """The ``--strip-prefix`` mapping, or None."""
    if not prefix:
        return None
    from ..checker.run import strip_prefix_mapper

    return strip_prefix_mapper(prefix)


def add_io_arguments(p, inputs_help: str, out_help: str) -> None:
    """``IN... OUT`` positionals, or ``IN... -o OUT`` (as ``fix`` takes it): the last path is
    the output unless ``-o`` names it."""
    p.add_argument("inputs", nargs="+", metavar="IN", help=inputs_help)
    p.add_argument("out", nargs="?", metavar="OUT", help=out_help + " (or give it with -o)")
    p.add_argument("-o", "--output", dest="out_option", metavar="OUT", help="the output, instead of the last path")


def inputs_and_output(args) -> tuple[list[str], str]:
    """(input paths, output path) from :func:`add_io_arguments`'s arguments."""
    from ..errors import InputError

    paths = list(args.inputs) + ([args.out] if args.out is not None else [])
    if args.out_option is not None:
        return paths, args.out_option
    if len(paths) < 2:
        raise InputError(f"{args.command}: give the output after the input(s), or with -o OUT")
    return paths[:-1], paths[-1]
