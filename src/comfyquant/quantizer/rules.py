"""Rules files: which format (and parameters) each layer gets, most specific match first.

A rules file is TOML::

    [default]                  # optional: layers no rule matches (what --format does)
    format = "w4a8"
    group_size = 16

    [[rules]]
    match = "*.attn.*"         # glob over layer names (no ".weight"); a list of globs works too
    format = "w4a8"
    group_size = 32

    [[rules]]
    match = ["final_layer.*", "*.adaLN_modulation.*"]
    format = "keep"            # stay as they are (dense)

Of the rules that match a layer, the most specific wins: an exact name beats any glob, then
the glob with more literal characters; between equally specific globs, the later rule wins
(so a file reads top to bottom like overrides).  ``--exclude`` beats every rule.  Keeping
the choice per layer explicit and deterministic is the point: the plan printed by
``--dry-run`` says which rule decided each layer.
"""

from __future__ import annotations

import fnmatch
import re
import sys

from ..errors import InputError
from ..formats.params import Params
from .params import DECODE, KEEP, resolve_format, validate

_WILDCARDS = re.compile(r"[*?\[\]]")


class Choice:
    """What a layer gets: a format with its validated, frozen ``Params`` (None for ``keep``);
    ``source`` says which rule (or option) decided it."""

    __slots__ = ("format", "params", "source")

    def __init__(self, fmt: str, params: Params | None, source: str) -> None:
        self.format = fmt
        self.params = params
        self.source = source

    @property
    def keep(self) -> bool:
        """No format is written: the layer stays as stored, or (``dense``) is decoded."""
        return self.format in (KEEP, DECODE)

    @property
    def encoding(self) -> Params:
        """The parameters of a choice that writes a format (any but ``keep`` and ``dense``)."""
        if self.params is None:
            raise ValueError(f"{self.source}: {self.format!r} writes no format, so it has no parameters")
        return self.params

    @property
    def decode(self) -> bool:
        """``format = "dense"``: ``convert`` decodes the layer to a dense weight."""
        return self.format == DECODE

    def __repr__(self) -> str:
        return f"Choice({self.format!r}, {self.params}, {self.source!r})"


class Rule:
    """One ``[[rules]]`` entry: its patterns (compiled globs) and its choice."""

    __slots__ = ("patterns", "choice", "index", "_compiled")

    def __init__(self, patterns: list[str], choice: Choice, index: int) -> None:
        self.patterns = patterns
        self.choice = choice
        self.index = index
        self._compiled = [(p, re.compile(fnmatch.translate(p))) for p in patterns]

    def specificity(self, name: str) -> tuple[int, int] | None:
        """(exact?, literal characters) of the most specific pattern that matches, or None."""
        best = None
        for text, rx in self._compiled:
            if rx.fullmatch(name):
                score = (1 if not _WILDCARDS.search(text) else 0, len(_WILDCARDS.sub("", text)))
                best = score if best is None or score > best else best
        return best


class Rules:
    """An ordered list of rules plus the default choice (None: unmatched layers stay dense)."""

    def __init__(self, rules: list[Rule] | None = None, default: Choice | None = None, path: str | None = None) -> None:
        self.rules = rules or []
        self.default = default
        self.path = path

    def choose(self, name: str) -> Choice | None:
        """The choice for layer ``name``: the most specific matching rule, else the default."""
        best: tuple | None = None
        chosen = None
        for rule in self.rules:
            score = rule.specificity(name)
            if score is not None and (best is None or (score, rule.index) > best):
                best = (score, rule.index)
                chosen = rule.choice
        return chosen if chosen is not None else self.default

    def formats(self) -> set[str]:
        out = {r.choice.format for r in self.rules}
        if self.default is not None:
            out.add(self.default.format)
        return out - {KEEP}


_RULE_KEYS = {"match", "format"}


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:  # pragma: no cover - a declared dependency on Python 3.10
        raise InputError("reading rules files on Python 3.10 needs tomli (pip install tomli)") from None
    return tomli


def load_rules(path: str) -> Rules:
    """Parse and validate a rules file; every problem is one line naming the file and entry."""
    from ..io.text import read_text_file

    toml = _toml()
    text = read_text_file(path, "a rules file")
    try:
        doc = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: not a rules file (its TOML nests too deeply to read)") from None
    return parse_rules(doc, path)


def parse_rules(doc: dict, path: str = "rules") -> Rules:
    """Rules from an already decoded TOML document (tests build them from dicts)."""
    unknown = set(doc) - {"default", "rules"}
    if unknown:
        raise InputError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}; use [default] and [[rules]]")
    default = None
    if "default" in doc:
        entry = doc["default"]
        if not isinstance(entry, dict):
            raise InputError(f"{path}: [default] must be a table with format = ...")
        default = _choice(entry, f"{path}: [default]", "default of the rules file", patterns=False)
    raw = doc.get("rules", [])
    if not isinstance(raw, list):
        raise InputError(f"{path}: rules must be an array of tables ([[rules]])")
    rules = []
    for i, entry in enumerate(raw):
        where = f"{path}: rules[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: must be a table with match = ... and format = ...")
        patterns = entry.get("match")
        if isinstance(patterns, str):
            patterns = [patterns]
        if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise InputError(f"{where}: match must be a layer name or glob, or a list of them")
        label = f"rule {patterns[0]!r}" if len(patterns) == 1 else f"rule {patterns!r}"
        rules.append(Rule(patterns, _choice(entry, where, f"{path} {label}"), i))
    return Rules(rules, default, path)


def _choice(entry: dict, where: str, source: str, patterns: bool = True) -> Choice:
    if "format" not in entry:
        raise InputError(f'{where}: needs format = "<format>" (or "keep")')
    fmt = resolve_format(entry["format"], where, allow_keep=True)
    params = {k: v for k, v in entry.items() if k not in _RULE_KEYS}
    if not patterns and "match" in entry:
        raise InputError(f"{where}: [default] takes no match (it applies to layers no rule matches)")
    if fmt in (KEEP, DECODE):
        if params:
            raise InputError(f'{where}: format = "{fmt}" takes no parameters, got {", ".join(sorted(params))}')
        return Choice(fmt, None, source)
    return Choice(fmt, validate(fmt, params, where), source)
