"""MkDocs hook: the documentation's reference tables, generated from the code they describe.

A page asks for a table with an HTML comment on a line of its own, ``<!-- generated: KIND
[ARG] -->``; the hook replaces it while the page is built, so the site cannot drift from the
package:

* ``cli COMMAND``: the command's usage line and one row per option, from the argparse parser
  ``comfyquant.cli`` builds for the command line;
* ``rules``: the canonical rule codes with their default severity, from ``findings.RULES``;
* ``formats``: every format package's description (slots, dtypes, shapes, marker keys and
  their defaults), from ``formats.registry.FORMATS``, and the formats' relative orders
  (listing, inference, what ``quantize`` offers first), from ``formats.ordering``;
* ``dialects``: every dialect package (name, writer, source), from ``dialects.registry.DIALECTS``;
* ``sglangreleases``: what each SGLang release group reads of Comfy formats, from
  ``targets.sglang_releases.GROUPS``.
* ``releases comfyui``: per format and marker form, the first ComfyUI release that loads it, and
  the release groups, from ``targets.comfyui_releases``.
* ``releases comfy-kitchen``: per format, the first comfy-kitchen release that runs it, and the
  release groups, from ``targets.kitchen_releases``.

It also serves the bundled example images and workflows (``examples/*.png``, ``*.json``) at
``examples/`` in the site, so pages show and link the very files the repository ships.  Only header-level modules are imported:
no torch, and a build takes seconds.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # document this tree's package, not another install

MARKER = re.compile(r"^<!-- generated: (?P<kind>[a-z]+)(?: (?P<arg>[\w-]+))? -->$", re.MULTILINE)


def _cell(text: object) -> str:
    """Text fit for a Markdown table cell: one line, pipes escaped, and ``<``, ``>``, ``&``
    outside code spans escaped (a help text's ``<name>.fixed.safetensors`` is no HTML tag)."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = html.escape(parts[i], quote=False)
    return "`".join(parts).replace("|", "\\|")


def _code(text: object) -> str:
    return f"`{text}`" if text not in ("", None) else ""


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- command-line options ----------------------------------------------------------------------


def _subparser(command: str) -> argparse.ArgumentParser:
    from comfyquant.cli import _build_parser

    parser = _build_parser(only=command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if isinstance(action.default, list) and not action.default:
        return ""
    return _code(action.default)


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action.choices, dict):
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return _code(metavar)


def render_cli(command: str) -> str:
    """The usage line and the options table of ``comfyquant COMMAND``."""
    parser = _subparser(command)
    usage = parser.format_usage().replace("usage: ", "", 1).strip()
    usage = re.sub(r"\s+", " ", usage)
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}` (positional)"
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        rows.append((names, _argument(action), _default(action), _cell(help_text)))
    table = _table(("option", "argument", "default", "what it does"), rows)
    description = _cell(parser.description) if parser.description else ""
    parts = ["```text", usage, "```", ""]
    if description:
        parts += [description, ""]
    parts.append(table)
    return "\n".join(parts)


# -- rule codes --------------------------------------------------------------------------------

_RULE_GROUPS = {
    "C": "Container: the safetensors file, shards and index",
    "M": "Markers: the per-layer JSON and the header map",
    "L": "Layers: tensors against the format description",
    "F": "Foreign layouts (dialects)",
    "D": "Tensor values (`check --deep`)",
}


def render_rules(_: str | None = None) -> str:
    from comfyquant.findings import RULES

    out = []
    for letter, title in _RULE_GROUPS.items():
        rows = [(f"`{r.code}`", r.severity, _cell(r.title)) for r in RULES.values() if r.code.startswith(letter)]
        if rows:
            out += [f"### {title}", "", _table(("code", "default severity", "rule"), rows), ""]
    return "\n".join(out)


# -- formats -----------------------------------------------------------------------------------


def _types(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def render_formats(_: str | None = None) -> str:
    from comfyquant.formats.registry import _INFERENCE_ORDER, FORMATS, WRITING_ORDER

    inferred = {fmt.name: i for i, fmt in enumerate(_INFERENCE_ORDER, 1)}
    offered = {fmt.name: i for i, fmt in enumerate(WRITING_ORDER, 1)}
    summary = []
    for fmt in FORMATS.values():
        loaders = ", ".join(sorted(fmt.loaders)) or "none"
        aliases = ", ".join(f"`{a}`" for a in fmt.aliases)
        summary.append(
            (
                f"[`{fmt.name}`](#{fmt.name})",
                _cell(fmt.title),
                aliases,
                loaders,
                str(inferred.get(fmt.name, "–")),
                str(offered.get(fmt.name, "–")),
            )
        )
    head = ("format", "what it is", "short names", "runtimes that load it", "tried unmarked", "quantize offers")
    out = [_table(head, summary), ""]
    out += [
        "Rows are in listing order. *tried unmarked*: the place of the format's tensor signature "
        "when a layer without a marker is matched against every format (the first match wins, so "
        "the more specific signatures come first). *quantize offers*: where `quantize` lists the "
        "formats it writes, the recommended one first. The three orders are one table in "
        "`src/comfyquant/formats/ordering.py`.",
        "",
    ]
    for fmt in FORMATS.values():
        out += [f"### {fmt.name} {{ #{fmt.name} }}", "", _cell(fmt.title) + ".", ""]
        facts = [f"rotation: {fmt.rotation}"]
        if fmt.bits_text:
            facts.append(f"bits per weight: {fmt.bits_text}")
        if fmt.pad != (1, 1):
            facts.append(f"stored weight padded to multiples of {fmt.pad[0]} rows and {fmt.pad[1]} columns")
        if fmt.quant_format:
            facts.append(f"file-level `quant_format={fmt.quant_format}` marks its unmarked layers for SGLang")
        if fmt.bank_rows:
            facts.append("MoE banks flattened over " + ", ".join(f"`{s}`" for s in fmt.bank_rows))
        if fmt.converter_only:
            facts.append("converter-only: no runtime loads it")
        facts.append("quantize writes it" if fmt.params_module else "quantize does not write it")
        out += ["; ".join(facts) + ".", ""]
        slot_rows = []
        for slot in fmt.slots:
            condition = []
            if slot.when:
                condition.append(f"when `{slot.when}`")
            if slot.forbidden:
                condition.append(f"forbidden when `{slot.forbidden}`")
            slot_rows.append(
                (
                    f"`{slot.suffix}`",
                    slot.dtype if slot.dtype != "float" else "F16, BF16 or F32",
                    f"`{slot.shape}`",
                    slot.kind,
                    "yes" if slot.required else "no",
                    _cell("; ".join(condition + ([slot.meaning] if slot.meaning else []))),
                )
            )
        out += [_table(("tensor", "dtype", "shape", "kind", "required", "notes"), slot_rows), ""]
        if fmt.keys:
            key_rows = []
            for key in fmt.keys:
                allowed = key.allowed_text or (f"`{key.allowed}`" if key.allowed else "")
                key_rows.append(
                    (
                        f"`{key.name}`",
                        _types(key.types),
                        _code(repr(key.default)) if key.default is not None else "",
                        _cell(allowed),
                        "yes" if key.explicit is True else (f"when `{key.explicit}`" if key.explicit else "no"),
                    )
                )
            out += [_table(("marker key", "type", "default", "allowed", "written explicitly"), key_rows), ""]
        if fmt.constraints:
            out += ["Constraints: " + "; ".join(f"`{c.expr}`" for c in fmt.constraints) + ".", ""]
    return "\n".join(out)


# -- dialects ----------------------------------------------------------------------------------


def render_dialects(_: str | None = None) -> str:
    from comfyquant.dialects.registry import DIALECTS

    rows = [(f"`{d.name}`", _cell(d.title), _cell(d.writer), _cell(d.source)) for d in DIALECTS.values()]
    return _table(("dialect", "layout", "written by", "source"), rows)


# -- SGLang releases ---------------------------------------------------------------------------


def render_sglangreleases(_: str | None = None) -> str:
    from comfyquant.targets.sglang_releases import FORMATS, GROUPS, NEWEST, first_reading_release

    rows = []
    for g in GROUPS:
        reads = "<br>".join(f"`{f}`: {_cell(how)}" for f, how in g.reads.items())
        refuses = "<br>".join(f"`{f}`: {_cell(how)}" for f, how in g.refuses.items()) or "—"
        differ = [f"`{a}` → `{b}`" for a, b in g.messages] + [f"config `{a}` → `{b}`" for a, b in g.configs.items()]
        rows.append((", ".join(g.releases), f"`{g.digest}`", g.reader, reads, refuses, "<br>".join(differ) or "—"))
    head = ("releases", "reader files", "reader", "reads", "fails on", f"text that differs from {NEWEST}")
    firsts = [(f"`{f}`", first_reading_release(f) or "none") for f in FORMATS]
    return _table(("format", "read from SGLang"), firsts) + "\n\n" + _table(head, rows)


# -- ComfyUI releases --------------------------------------------------------------------------


def render_comfyui_releases(_: str | None = None) -> str:
    from comfyquant.targets.comfyui_releases import GROUPS, HEADER, NEWEST, TENSOR, first_loading

    def first(fmt: str, marker: str) -> str:
        group = first_loading(fmt, marker)
        return f"{group.first} ({group.kitchen_text})" if group else "none"

    rows = [(f"`{fmt}`", first(fmt, HEADER), first(fmt, TENSOR)) for fmt in NEWEST.formats]
    out = [_table(("format", f"marked in the {HEADER}", f"marked by {TENSOR}"), rows), ""]
    group_rows = [
        (", ".join(g.releases), g.kitchen_text, ", ".join(f"`{f}`" for f in g.formats), f"`{g.unknown[0]}: {g.unknown[1]}`")
        for g in GROUPS
    ]
    out.append(_table(("releases (one group)", "comfy-kitchen", "formats", "on another format"), group_rows))
    return "\n".join(out)


# -- comfy-kitchen releases ---------------------------------------------------------------------


def render_kitchen_releases() -> str:
    from comfyquant.targets.kitchen_releases import GROUPS, LAYOUTS, first_running

    def first(fmt: str) -> str:
        group = first_running(fmt)
        return group.first if group else "none"

    rows = [(f"`{fmt}`", f"`{layout}`", first(fmt)) for fmt, layout in LAYOUTS.items()]
    rows.append(("`asym_w4a8_int8` stored 6-bit", f"`{LAYOUTS['asym_w4a8_int8']}`", first("asym_w4a8_int8/6-bit")))
    out = [_table(("format", "layout", "runs from comfy-kitchen"), rows), ""]
    group_rows = [
        (
            ", ".join(g.releases),
            f"`{g.digest}`",
            ", ".join(f"`{f}`" for f in g.formats),
            "by name" if g.by_name else "by class",
            "yes" if g.six_bit else ("no" if "asym_w4a8_int8" in g.formats else "—"),
        )
        for g in GROUPS
    ]
    out.append(_table(("releases (one group)", "deciding code", "layouts", "layout taken", "6-bit W4A8"), group_rows))
    return "\n".join(out)


def render_releases(arg: str | None) -> str:
    return render_kitchen_releases() if arg == "comfy-kitchen" else render_comfyui_releases(arg)


RENDERERS: dict[str, Callable[[str | None], str]] = {
    "cli": render_cli,
    "rules": render_rules,
    "formats": render_formats,
    "dialects": render_dialects,
    "sglangreleases": render_sglangreleases,
    "releases": render_releases,
}


# -- MkDocs events -----------------------------------------------------------------------------


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind = match.group("kind")
        if kind not in RENDERERS:
            raise ValueError(f"{page.file.src_path}: unknown generated table {kind!r}")
        return RENDERERS[kind](match.group("arg"))

    return MARKER.sub(replace, markdown)


def on_files(files, config):
    from mkdocs.structure.files import File  # imported here: the renderers serve tests without mkdocs

    shipped = [*(ROOT / "examples").glob("*.png"), *(ROOT / "examples").glob("*.json")]
    for path in sorted(shipped):
        files.append(File(f"examples/{path.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
