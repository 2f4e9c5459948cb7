"""The documentation's reference tables are generated from the code (docs/hooks/generated.py):
every option of every command, every format with its slots and marker keys, every dialect.
The hook is loaded by path and called as MkDocs calls it, without MkDocs."""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest

from comfyquant.cli import _build_parser
from comfyquant.commands import COMMANDS
from comfyquant.dialects.registry import DIALECTS
from comfyquant.formats.registry import FORMATS

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _hook():
    spec = importlib.util.spec_from_file_location("docs_generated", os.path.join(ROOT, "docs", "hooks", "generated.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_page_lists_every_option_of_its_parser(command):
    page = open(os.path.join(ROOT, "docs", "commands", f"{command}.md"), encoding="utf-8").read()
    assert f"<!-- generated: cli {command} -->" in page
    rendered = _hook().on_page_markdown(page, None, None, None)
    sub = next(a for a in _build_parser(only=command)._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    for action in sub._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            assert all(f"| `{o}`" not in rendered for o in action.option_strings), action.option_strings  # no row
            continue
        for option in action.option_strings:
            assert f"| `{option}`" in rendered or f", `{option}`" in rendered, (command, option)  # a table row


def test_the_formats_page_shows_every_format_its_slots_and_marker_keys():
    rendered = _hook().render_formats()
    for fmt in FORMATS.values():
        assert f"### {fmt.name} {{ #{fmt.name} }}" in rendered
        section = rendered.split(f"### {fmt.name} ", 1)[1].split("\n### ", 1)[0]
        for slot in fmt.slots:
            assert f"`{slot.suffix}`" in section and f"`{slot.shape}`" in section, (fmt.name, slot.suffix)
        for key in fmt.keys:
            assert f"`{key.name}`" in section, (fmt.name, key.name)


def test_the_dialects_page_lists_every_dialect_package():
    rendered = _hook().render_dialects()
    for name in DIALECTS:
        assert f"`{name}`" in rendered


def test_an_unknown_generated_table_stops_the_build():
    with pytest.raises(ValueError, match="unknown generated table"):
        _hook().on_page_markdown(
            "<!-- generated: nothing -->", type("Page", (), {"file": type("F", (), {"src_path": "x.md"})()})(), None, None
        )


def test_the_runtimes_page_names_the_first_comfyui_release_per_format():
    from comfyquant.targets.comfyui_releases import GROUPS, NEWEST, TENSOR, first_loading

    page = open(os.path.join(ROOT, "docs", "runtimes.md"), encoding="utf-8").read()
    assert "<!-- generated: releases comfyui -->" in page
    rendered = _hook().on_page_markdown(page, None, None, None)
    for fmt in NEWEST.formats:
        row = next(line for line in rendered.splitlines() if line.startswith(f"| `{fmt}` |"))
        assert f"| {first_loading(fmt, TENSOR).first} (" in row, row
    for group in GROUPS:
        assert f"| {', '.join(group.releases)} | {group.kitchen_text} |" in rendered
