"""The options objects of the writing commands: each option is a field, a keyword of its API
function and a flag of its command, and the command line and the API build equal objects.

``quantize``/``convert`` (``comfyquant.quantizer.options``) and ``fix``/``migrate``
(``comfyquant.repair.options``) parse into a frozen dataclass that the run takes whole; these
tests hold the three spellings of an option together, so adding one is adding a field, its
keyword and its flag, with nothing to copy in between.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

import comfyquant
from comfyquant.cli import _build_parser
from comfyquant.commands.common import IO_ARGUMENTS, SHOWN, options_from_args
from comfyquant.commands.quantize import PARAM_PREFIX, options_of
from comfyquant.quantizer import api
from comfyquant.quantizer.options import ConvertKeywords, ConvertOptions, EncodeOptions, QuantizeKeywords, QuantizeOptions
from comfyquant.repair import migration
from comfyquant.repair import run as repair_run
from comfyquant.repair.options import FixOptions, MigrateKeywords, MigrateOptions

COMMANDS = {"quantize": QuantizeOptions, "convert": ConvertOptions, "fix": FixOptions, "migrate": MigrateOptions}
API = {"quantize": comfyquant.quantize, "convert": comfyquant.convert, "fix": comfyquant.fix, "migrate": comfyquant.migrate}
DEPRECATED = {"fix": {"force"}}
"""API keywords that are another spelling of a field (``fix(force=...)`` is ``overwrite``)."""


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = _build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _options(command: str, argv: list[str]):
    """The options object the command line ``comfyquant COMMAND ARGV`` runs with."""
    args = _build_parser(command).parse_args([command, *argv])
    cls = COMMANDS[command]
    if issubclass(cls, EncodeOptions):
        return options_of(cls, args)
    return options_from_args(cls, args)


def _field_of(dest: str) -> str | None:
    """The field a parsed argument fills (None: it only changes what is printed)."""
    if dest in SHOWN:
        return None
    if dest in IO_ARGUMENTS:
        return "out" if dest in ("out", "out_option") else "paths"
    if dest.startswith(PARAM_PREFIX):
        return "params"
    return dest


def _cli_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("cli", True)}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_a_field_and_every_field_a_flag(command):
    cls = COMMANDS[command]
    fields = {f.name for f in dataclasses.fields(cls)}
    reached = set()
    for action in _subparser(command)._actions:
        if action.dest == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        field = _field_of(action.dest)
        if field is None:
            continue
        assert field in fields, (
            f"{command} {'/'.join(action.option_strings) or action.dest}: no field {field!r} in {cls.__name__}"
        )
        reached.add(field)
    assert reached == _cli_fields(cls), f"{cls.__name__}: fields without a flag: {sorted(_cli_fields(cls) - reached)}"


@pytest.mark.parametrize("command", COMMANDS)
def test_api_keywords_are_the_fields(command):
    """The API function's keywords are the fields, with the same defaults (so the command line
    and Python agree on what an option left out means)."""
    cls = COMMANDS[command]
    signature = inspect.signature(API[command]).parameters
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(signature) - DEPRECATED.get(command, set()) == set(fields)
    for name, field in fields.items():
        if field.default is dataclasses.MISSING:
            assert signature[name].default is inspect.Parameter.empty, name
        else:
            assert signature[name].default == field.default, name


TYPED_KEYWORDS = {"quantize": QuantizeKeywords, "convert": ConvertKeywords, "migrate": MigrateKeywords}
"""The ``TypedDict`` that types an API function's ``**kwargs`` (what type checkers and IDEs complete)."""


@pytest.mark.parametrize("command", TYPED_KEYWORDS)
def test_typed_keywords_are_the_fields(command):
    """The typed ``**kwargs`` name every field the function's own parameters leave, with the
    field's type: an IDE completes the same options the run takes."""
    code = inspect.unwrap(API[command]).__code__  # the function as written, not its keyword check
    own = set(code.co_varnames[: code.co_argcount])
    typed = {name: getattr(hint, "__forward_arg__", hint) for name, hint in TYPED_KEYWORDS[command].__annotations__.items()}
    fields = {f.name: f.type for f in dataclasses.fields(COMMANDS[command]) if f.name not in own}
    assert typed == fields


@pytest.fixture
def captured(monkeypatch) -> list:
    """The options objects the runs are handed (each run stops there, with ``SystemExit``)."""
    seen: list = []

    def capture(options):
        seen.append(options)
        raise SystemExit(0)

    monkeypatch.setattr(api, "run", capture)
    monkeypatch.setattr(repair_run, "run_fix", capture)
    monkeypatch.setattr(migration, "run_migrate", capture)
    return seen


@pytest.mark.parametrize("command", TYPED_KEYWORDS)
def test_a_keyword_left_out_takes_the_field_default(command, captured):
    """The API function builds its options from the keywords given; one left out is the field's default."""
    with pytest.raises(SystemExit):
        API[command]("in.safetensors")
    assert captured == [COMMANDS[command](paths="in.safetensors")]
    with pytest.raises(TypeError, match=rf"^{command}\(\) got an unexpected keyword argument 'no_such_option'$"):
        API[command]("in.safetensors", no_such_option=1)


def _value_for(parser: argparse.ArgumentParser, command: str, action: argparse.Action) -> list[str] | None:
    """Command-line words that give ``action`` a value other than its default (None: none found)."""
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return [flag]
    candidates = [str(c) for c in action.choices if c != action.default] if action.choices else ["3", "0.5", "comfyui", "x"]
    for text in candidates:
        try:
            _build_parser(command).parse_args([command, "in.safetensors", flag, text])
        except SystemExit:
            continue
        return [flag, text]
    return None


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_reaches_the_options(command, capsys):
    """Each flag, given alone, changes the options object the run gets: none is parsed and dropped."""
    bare = _options(command, ["in.safetensors"])
    parser = _subparser(command)
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction) or _field_of(action.dest) is None:
            continue
        words = _value_for(parser, command, action)
        assert words is not None, f"{command} {action.option_strings}: no value found to try"
        given = _options(command, ["in.safetensors", *words])
        field = _field_of(action.dest)
        assert getattr(given, field) != getattr(bare, field), f"{command} {' '.join(words)} did not reach {field}"
    capsys.readouterr()  # the refused candidate values' usage lines


def test_command_line_and_api_build_equal_options(captured):
    """The same run asked for on the command line and in Python: equal options objects."""
    seen = captured
    cases = [
        (
            "quantize",
            "in.safetensors out.safetensors -f int8 --rules r.toml --exclude a --exclude b --target comfyui -j 2 "
            "--report rep --reference dense.safetensors --max-error 0.1 --dry-run --keep-bad --overwrite --no-progress "
            "--preset flux --include vae --like good.safetensors",
            lambda: comfyquant.quantize(
                ["in.safetensors"],
                "out.safetensors",
                "int8",
                {},
                rules="r.toml",
                exclude=["a", "b"],
                target="comfyui",
                jobs="2",
                report="rep",
                reference="dense.safetensors",
                max_error=0.1,
                dry_run=True,
                keep_bad=True,
                overwrite=True,
                progress=False,
                preset="flux",
                include=["vae"],
                like="good.safetensors",
            ),
        ),
        (
            "convert",
            "a.safetensors b.safetensors -o out --to nvfp4 --group-size 16",
            lambda: comfyquant.convert(["a.safetensors", "b.safetensors"], "out", "nvfp4", {"group_size": 16}, jobs="auto"),
        ),
        (
            "fix",
            "in.safetensors -o out.safetensors --target sglang --allow-lossy --prefer tensor --convrot-groupsize 64 "
            "--reference d.safetensors --max-error 0.2 --force",
            lambda: comfyquant.fix(
                ["in.safetensors"],
                out="out.safetensors",
                target="sglang",
                allow_lossy=True,
                prefer="tensor",
                convrot_groupsize=64,
                reference="d.safetensors",
                max_error=0.2,
                overwrite=True,
            ),
        ),
        (
            "migrate",
            "in.gguf --in-place --dry-run --to bfl",
            lambda: comfyquant.migrate(["in.gguf"], in_place=True, dry_run=True, to="bfl"),
        ),
    ]
    for command, line, call in cases:
        seen.clear()
        with pytest.raises(SystemExit):
            _module_run(command, line.split())
        with pytest.raises(SystemExit):
            call()
        from_cli, from_api = seen
        assert from_cli == from_api, command
        assert type(from_cli) is COMMANDS[command]


def _module_run(command: str, argv: list[str]) -> None:
    from importlib import import_module

    args = _build_parser(command).parse_args([command, *argv])
    import_module(f"comfyquant.commands.{command}").run(args)


def test_options_are_frozen():
    options = QuantizeOptions(paths="in.safetensors", format="int8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.format = "fp8"


def test_a_parsed_argument_without_a_field_is_refused():
    """A flag added to a parser without its field fails every run instead of being ignored."""
    args = argparse.Namespace(paths=["in.safetensors"], out=None, new_flag=True)
    with pytest.raises(TypeError, match="new_flag"):
        options_from_args(MigrateOptions, args)
