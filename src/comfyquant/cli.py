"""The ``comfyquant`` command line.  Thin: parse arguments, call the API, render, exit.

Each command is a module in ``commands/``.  Exit codes (``EXIT_CODES``, the epilog of every
``--help``): 0 no errors (warnings allowed), 1 errors found, 2 unreadable input or usage
error, 3 internal error, 130 interrupted.  Imports stay minimal: ``check`` of a 14B checkpoint
must finish in well under 100 ms.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands import COMMANDS
from .commands.common import EXIT_CODES, add_exit_codes
from .commands.streams import OutputError, guarded_stdout, say
from .errors import ComfyQuantError, command_line
from .installing import extra_command
from .numerics.waits import prefer_passive_waits
from .version import __version__


class _Parser(argparse.ArgumentParser):
    command: str | None = None
    """The command chosen on the command line (set on the top parser), for its error lines."""

    def error(self, message: str):  # usage errors: one line, exit 2
        prog = self.prog if self.command is None or self.prog != "comfyquant" else f"comfyquant {self.command}"
        say(f"{prog}: error: {message} (see {prog} --help)")
        raise SystemExit(2)


OPTIONAL_MODULES = {"torch": "torch", "safetensors": "torch", "fsspec": "remote", "matplotlib": "plot"}
"""Modules of the optional extras (pyproject): a command that needs one names the extra."""


def _module(name: str):
    return importlib.import_module(f".commands.{name.replace('-', '_')}", __package__)


def _build_parser(only: str | None = None) -> _Parser:
    p = _Parser(
        prog="comfyquant",
        description="Check, inspect, repair, quantize and dequantize Comfy quantized safetensors checkpoints.",
        epilog=EXIT_CODES,
    )
    p.add_argument("--version", action="version", version=f"comfyquant {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        if only is None or name == only:
            _module(name).add_parser(sub)
            add_exit_codes(sub.choices[name])
        else:
            sub.add_parser(name, help=getattr(_module(name), "HELP", None))
    return p


def _tolerant_output() -> None:
    """Names from a checkpoint may hold lone UTF-16 surrogates (``"\\ud800"`` in its JSON,
    reported as C006) and paths undecodable bytes (kept as surrogates by Python): print them
    escaped (``\\ud800``) instead of failing with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a test's replacement may have none
        if reconfigure is None:
            continue
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass  # not a text stream we can adjust (a closed stream)


DECODING_COMMANDS = ("dequantize", "convert", "quantize")


def _judge_input_first(args) -> None:
    """On an install without torch, a decoding command still judges its input (readable, and
    passing the input gate, both torch-free) before it says which extra it needs: a bad input
    gets the same one line on every install."""
    if args.command not in DECODING_COMMANDS:
        return
    from .commands.common import inputs_and_output
    from .dialects.containers import open_any
    from .dialects.view import viewed
    from .gate import check_input

    inputs, _out = inputs_and_output(args)
    with open_any(inputs[0] if len(inputs) == 1 else inputs) as raw, viewed(raw, args.command) as ckpt:
        check_input(ckpt, args.command)


def _allocation_failed(exc: BaseException) -> bool:
    """torch reports a CPU allocation it could not make as a ``RuntimeError`` (its allocator's
    "can't allocate memory"), not as ``MemoryError``: the machine's limit, not a bug."""
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _tolerant_output()
    try:
        with guarded_stdout(), command_line():
            return _main(argv)
    except OutputError as exc:  # raised by the final flush, after the command returned
        say(f"comfyquant: {exc}")
        return 2
    except BrokenPipeError:
        return 0


def _main(argv: list[str]) -> int:
    prefer_passive_waits()  # before any command imports torch (numerics/waits.py says why)
    # Build only the chosen command's full parser: importing every command's module costs time.
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(first if first in COMMANDS else None)
    parser.command = first if first in COMMANDS else None
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    if not args.command:
        parser.print_help()
        return 2
    try:
        return _module(args.command).run(args)
    except ComfyQuantError as exc:
        say(f"comfyquant: {exc}")
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        say("comfyquant: interrupted")
        return 130
    except MemoryError:
        say("comfyquant: out of memory")
        return 2
    except Exception as exc:  # a bug: one line, the traceback on request
        if _allocation_failed(exc):
            say("comfyquant: out of memory")
            return 2
        module = (getattr(exc, "name", None) or "").partition(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
        if module in OPTIONAL_MODULES:  # not a bug: a light install running a command that needs an extra
            try:
                _judge_input_first(args)
            except ComfyQuantError as bad:
                say(f"comfyquant: {bad}")
                return 2
            say(f"comfyquant {args.command}: needs {module}, which is not installed ({extra_command(OPTIONAL_MODULES[module])})")
            return 2
        import os

        if os.environ.get("COMFYQUANT_DEBUG"):
            raise
        say(
            f"comfyquant: internal error: {type(exc).__name__}: {exc} "
            f"(set COMFYQUANT_DEBUG=1 for the traceback; please report it)"
        )
        return 3


def run() -> None:
    """Console-script entry: run, flush, and skip interpreter teardown (freeing a large
    checkpoint's object graph and the modules costs ~15 ms of a ~100 ms budget)."""
    import os

    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # main() has reported a failed stdout already
        pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
