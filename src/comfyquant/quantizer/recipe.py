"""``recipe``: the rules file that reproduces a quantized checkpoint's per-layer choices.

Read from the headers alone (no torch): every quantized layer's format and the ``Params``
that make ``quantize`` write exactly its marker and its tensors (dtypes and shapes), every
dense 2-D linear layer as ``keep``.  Layers ``quantize`` never quantizes (norms, embeddings,
convolutions, no weight) need no rule.  The choices are then written as few rules as stay
exact under the rules' own precedence (``rules``: exact name, then the glob with more
literal characters, then the later rule): a ``"*"`` rule for the commonest choice, globs
found greedily (a numbered block as ``*``, a leading or trailing run of name components),
exact names where nothing shorter is exact.  The result is verified by parsing it back and
choosing every layer; ``quantize --like GOOD`` applies it.

The catch-all is a ``[[rules]] match = "*"`` rather than ``[default]`` on purpose: a rule a
file states beats a preset's keep list and ``--format`` (``Options``), so the
recipe reproduces the file the same way under ``--rules`` as under ``--like``.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
from dataclasses import fields

from ..errors import InputError
from .params import KEEP
from .rules import Choice, Rule, parse_rules

SCHEMA = 1
MAX_COMBINATIONS = 4096
"""Parameter combinations tried per layer when reading a quantized layer's parameters."""
MAX_GLOBS = 256
"""Glob rules the grouping looks for at most (then the rest are exact names): a bound on the
time an unstructured file costs (2000 layers of random choices: ~8 s)."""


class LayerChoice:
    """What ``quantize`` must do with one layer of GOOD: ``format`` (or ``keep``) and the
    parameters it must be given (``given``: only the non-default ones, as a rules file states
    them); ``why`` says why a layer cannot be reproduced (then it is kept dense)."""

    __slots__ = ("name", "format", "params", "given", "why")

    def __init__(self, name: str, fmt: str, params=None, given: dict | None = None, why: str | None = None) -> None:
        self.name = name
        self.format = fmt
        self.params = params
        self.given = given or {}
        self.why = why

    @property
    def key(self) -> tuple:
        return (self.format, tuple(sorted(self.given.items())))

    def entry(self) -> dict:
        return {"format": self.format, **self.given}


class Recipe:
    """The choices of every layer that needs one, and the rules that reproduce them."""

    def __init__(self, paths: list[str], choices: dict[str, LayerChoice], free: list[str]) -> None:
        self.paths = paths
        self.choices = choices
        self.free = free  # layers quantize copies dense whatever a rule says
        self.entries, self.exact = _group(choices)
        for name in _mismatches(self.entries, choices):  # only names with glob characters can be
            choices[name].why = "its name holds glob characters no rules pattern matches exactly"
        self.unreproducible = [c for c in choices.values() if c.why]

    def doc(self) -> dict:
        return {
            "rules": [
                {"match": patterns if len(patterns) > 1 else patterns[0], **choice.entry()} for patterns, choice in self.entries
            ]
        }

    def rules(self):
        """The ``Rules`` ``quantize --like`` applies."""
        return parse_rules(self.doc(), f"recipe of {self.paths[0]}")

    def toml(self) -> str:
        counts: dict[str, int] = {}
        for c in self.choices.values():
            counts[c.format] = counts.get(c.format, 0) + 1
        summary = ", ".join(f"{n} {f}" for f, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "no layers"
        lines = [
            f"# comfyquant recipe of {', '.join(self.paths)}",
            f"# {len(self.choices)} layers: {summary}; {len(self.free)} more are never quantized (norms, embeddings, ...)",
            "# apply: comfyquant quantize --like GOOD DENSE  (or --rules THIS_FILE)",
        ]
        for c in self.unreproducible:
            lines.append(f"# NOT REPRODUCIBLE, kept dense: {_comment(c.name)}: {_comment(c.why or '')}")
        for patterns, choice in self.entries:
            lines += ["", "[[rules]]"]
            if len(patterns) == 1:
                lines.append(f"match = {_toml_str(patterns[0])}")
            else:
                lines.append("match = [")
                lines += [f"  {_toml_str(p)}," for p in patterns]
                lines.append("]")
            for key, value in choice.entry().items():
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "inputs": self.paths,
            **self.doc(),
            "layers": {
                n: (c.entry() if not c.why else {"format": KEEP, "unreproducible": c.why}) for n, c in self.choices.items()
            },
            "never_quantized": self.free,
            "exact_names": self.exact,
            "unreproducible": [{"layer": c.name, "why": c.why} for c in self.unreproducible],
        }

    def differences(self, plan) -> list[str]:
        """How a ``quantize`` plan differs from GOOD, one line per layer (empty: identical)."""
        from .plan import QUANTIZE

        out = []
        seen = set()
        for lp in plan.layers:
            seen.add(lp.name)
            want = self.choices.get(lp.name)
            if want is None:
                if lp.action == QUANTIZE and lp.name not in self.free:
                    out.append(f"{lp.name}: not in GOOD, planned {lp.params.describe()}")
                continue
            if want.why:
                continue
            if want.format == KEEP:
                if lp.action == QUANTIZE:
                    out.append(f"{lp.name}: dense in GOOD, planned {lp.params.describe()}")
            elif lp.action != QUANTIZE:
                out.append(f"{lp.name}: {want.params.describe()} in GOOD, planned dense ({lp.reason})")
            elif lp.params != want.params:
                out.append(f"{lp.name}: {want.params.describe()} in GOOD, planned {lp.params.describe()}")
        missing = [n for n, c in self.choices.items() if n not in seen and c.format != KEEP]
        out += [f"{n}: quantized in GOOD, not in this checkpoint" for n in missing]
        return out


# -- reading GOOD -------------------------------------------------------------------------------


def read_recipe(paths) -> Recipe:
    """The recipe of a quantized checkpoint (file, shards, folder or index; another layout is
    read as the Comfy file it translates to).  Header reads only."""
    from ..dialects.base import LOSSY
    from ..dialects.registry import detect
    from ..gate import open_input
    from .plan import natural_key, unquantizable

    paths = [paths] if isinstance(paths, str) or hasattr(paths, "__fspath__") else list(paths)
    paths = [str(p) for p in paths]
    choices: dict[str, LayerChoice] = {}
    free: list[str] = []
    with open_input(paths, "read a recipe of", check=False) as (raw, ckpt):
        # layers of another layout that no Comfy format holds exactly read as their dense decode:
        # they were quantized, but nothing quantize writes reproduces them
        lossy = (
            {tr.out_prefix: tr.label for claim in detect(raw).claims for tr in claim.layers.values() if tr.verdict == LOSSY}
            if ckpt is not raw
            else {}
        )
        if not lossy and not any(layer.marker is not None or layer.inferred for layer in ckpt.layers.values()):
            raise InputError(f"{paths[0]}: no quantized layer (no comfy_quant marker): a recipe describes a quantized checkpoint")
        for prefix in sorted(ckpt.layers, key=natural_key):
            layer = ckpt.layers[prefix]
            if prefix in lossy:
                choices[prefix] = LayerChoice(
                    prefix, KEEP, why=f"stored as {lossy[prefix]}, which no format quantize writes holds exactly"
                )
                continue
            if layer.marker is None and not layer.inferred:
                if unquantizable(layer) is not None:
                    free.append(prefix)
                else:
                    choices[prefix] = LayerChoice(prefix, KEEP)
                continue
            choices[prefix] = layer_choice(layer)
    return Recipe(paths, choices, free)


def layer_choice(layer) -> LayerChoice:
    """The format and parameters that make ``quantize`` write this quantized layer's marker
    and tensors, found among the values its marker, tensors and the parameters' choices allow."""
    from ..formats import registry
    from ..formats.base import GeometryError
    from ..formats.planned import PlanError, planned_tensors

    name = layer.prefix
    marker = layer.marker
    fmt_name = layer.format_name or (marker or {}).get("format")
    fmt = registry.FORMATS.get(fmt_name) if isinstance(fmt_name, str) else None
    if fmt is None:
        return LayerChoice(name, KEEP, why=f"format {fmt_name!r} is not one comfyquant knows")
    if marker is None:
        return LayerChoice(name, KEEP, why=f"no marker (its tensors look like {fmt.name}); run comfyquant fix first")
    if layer.bank is not None:
        return LayerChoice(name, KEEP, why="a MoE expert bank: quantize writes 2-D layers only")
    cls = fmt.params_class()
    if cls is None:
        return LayerChoice(name, KEEP, why=f"{fmt.name} is not written by quantize (calibrated offline)")
    have = fmt.params(marker)
    try:
        env = fmt.geometry(layer.tensors, have)
    except GeometryError as exc:
        return LayerChoice(name, KEEP, why=f"{fmt.name} tensors do not fit its marker ({exc})")
    n, k = env.get("N"), env.get("K")
    if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0):
        return LayerChoice(name, KEEP, why=f"{fmt.name} tensors give no weight shape")
    stored = {s: (e.dtype, tuple(e.shape)) for s, e in layer.tensors.items() if s not in ("bias", "comfy_quant")}
    specs = list(fields(cls))
    # a parameter quantize always writes one way (one allowed value) is no choice: GOOD's
    # marker may leave it out (ComfyUI's W4A8 markers omit ``convrot``), the output states it
    fixed = {spec.name for spec in specs if len(spec.metadata.get("choices", ())) == 1}
    have = {key: value for key, value in have.items() if key not in fixed}
    options = [_candidates(spec, have, env) for spec in specs]
    combos = itertools.islice(itertools.product(*options), MAX_COMBINATIONS)
    for combo in combos:
        given = {spec.name: value for spec, value in zip(specs, combo) if value != spec.default}
        try:
            params = cls.validate(given, name)
            planned = planned_tensors(params, n, k)
        except (InputError, PlanError):
            continue
        written = {key: value for key, value in fmt.params(params.marker()).items() if key not in fixed}
        if written == have and planned == stored:
            return LayerChoice(name, fmt.name, params, given)
    try:
        extra = sorted(set(stored) - set(planned_tensors(cls.validate({}, name), n, k)))
    except (InputError, PlanError):
        extra = []
    detail = f" (it stores {', '.join(extra)})" if extra else ""
    return LayerChoice(name, KEEP, why=f"no {fmt.name} parameters of quantize write its marker and tensors{detail}")


def _candidates(spec, marker_params: dict, env: dict) -> list:
    """Values a parameter may have had: the marker's when it is a marker key, else the field's
    choices, both booleans, or what the layer's geometry says; the default first."""
    default = spec.default
    if spec.name in marker_params:
        return [marker_params[spec.name]]
    choices = list(spec.metadata.get("choices", ()))
    if choices:
        return sorted(choices, key=lambda v: v != default)
    if isinstance(default, bool):
        return [default, not default]
    if spec.name in env and env[spec.name] != default:
        return [env[spec.name], default]
    return [default]


# -- grouping -----------------------------------------------------------------------------------


def _patterns(name: str) -> list[str]:
    """Candidate globs for a layer name: numbered components as ``*``, leading and trailing runs
    of components, one inner component."""
    parts = name.split(".")
    if any(_WILD.search(p) for p in parts):
        return []
    gen = ["*" if p.isdigit() else p for p in parts]
    out = [".".join(gen)]
    m = len(parts)
    for i in range(1, m):
        out += [".".join(parts[:i]) + ".*", ".".join(gen[:i]) + ".*", "*." + ".".join(parts[i:]), "*." + ".".join(gen[i:])]
    out += [f"*.{p}.*" for p in parts[1:-1] if not p.isdigit()]
    return [p for p in dict.fromkeys(out) if p != name and p != "*"]


_WILD = re.compile(r"[*?\[\]]")


def _escape(name: str) -> str:
    return re.sub(r"([*?\[\]])", r"[\1]", name)


def _spec(pattern: str, example: str) -> tuple[int, int]:
    """How specific ``pattern`` is on ``example``, a name it matches."""
    spec = Rule([pattern], Choice(KEEP, None, ""), 0).specificity(example)
    if spec is None:
        raise ValueError(f"{pattern!r} does not match {example!r}")
    return spec


def _group(choices: dict[str, LayerChoice]) -> tuple[list[tuple[list[str], LayerChoice]], list[str]]:
    """[(patterns, choice)] in rule order, and the layers that needed their exact name."""
    names = list(choices)
    if not names:
        return [], []
    label = [choices[n].key for n in names]
    by_key = {c.key: c for c in choices.values()}
    counts: dict[tuple, int] = {}
    for key in label:
        counts[key] = counts.get(key, 0) + 1
    common = max(counts, key=lambda key: counts[key])  # the first commonest, in model order
    rules: list[tuple[str, tuple]] = [("*", common)]
    cur = [common] * len(names)
    cur_spec = [(0, 0)] * len(names)
    matches: dict[str, tuple[list[int], tuple[int, int]]] = {}
    patterns_of: dict[int, list[str]] = {}

    def matched(pattern: str) -> tuple[list[int], tuple[int, int]]:
        """The names ``pattern`` matches, and its specificity on them (they share it)."""
        found = matches.get(pattern)
        if found is None:
            rx = re.compile(fnmatch.translate(pattern))
            idx = [i for i, n in enumerate(names) if rx.fullmatch(n)]
            found = matches[pattern] = (idx, _spec(pattern, names[idx[0]]) if idx else (0, 0))
        return found

    while True:
        wrong = [i for i in range(len(names)) if cur[i] != label[i]]
        if not wrong:
            break
        best = None
        for i in wrong:
            if i not in patterns_of:
                patterns_of[i] = _patterns(names[i])
        for pattern in dict.fromkeys(p for i in wrong for p in patterns_of[i]):
            idx, spec = matched(pattern)
            if not idx:
                continue
            for key in dict.fromkeys(label[i] for i in idx if cur[i] != label[i]):
                gain = 0
                for i in idx:
                    if spec >= cur_spec[i]:
                        gain += (key == label[i]) - (cur[i] == label[i])
                rank = (gain, len(idx), -len(pattern))
                if best is None or rank > best[0]:
                    best = (rank, pattern, key, spec, idx)
        if best is None or best[0][0] <= 1 or len(rules) > MAX_GLOBS:
            break
        _rank, pattern, key, spec, idx = best
        rules.append((pattern, key))
        for i in idx:
            if spec >= cur_spec[i]:
                cur[i], cur_spec[i] = key, spec
    exact = [names[i] for i in range(len(names)) if cur[i] != label[i]]
    # consecutive rules of one choice share an entry (their order against other choices stays);
    # exact names beat every glob, so they go last, one entry per choice
    entries: list[tuple[list[str], tuple]] = []
    for pattern, key in rules:
        if entries and entries[-1][1] == key and pattern != "*" and entries[-1][0] != ["*"]:
            entries[-1][0].append(pattern)
        else:
            entries.append(([pattern], key))
    tail: dict[tuple, list[str]] = {}
    for n in exact:
        tail.setdefault(choices[n].key, []).append(_escape(n))
    entries += [(pats, key) for key, pats in tail.items()]
    out = [(pats, by_key[key]) for pats, key in entries]
    if not _verify(out, choices):
        # cannot happen by construction; fall back to the commonest choice plus every other name
        tail = {}
        for n, c in choices.items():
            if c.key != common:
                tail.setdefault(c.key, []).append(_escape(n))
        out = [(["*"], by_key[common])] + [(pats, by_key[key]) for key, pats in tail.items()]
        exact = [n for n, c in choices.items() if c.key != common]
    return out, exact


def _verify(entries, choices: dict[str, LayerChoice]) -> bool:
    return not _mismatches(entries, choices)


def _mismatches(entries, choices: dict[str, LayerChoice]) -> list[str]:
    """The layers whose choice the rules, parsed back as a rules file, do not give."""
    if not entries:
        return list(choices)
    doc = {"rules": [{"match": pats, **choice.entry()} for pats, choice in entries]}
    rules = parse_rules(doc, "recipe")
    out = []
    for name, c in choices.items():
        got = rules.choose(name)
        if got is None or got.format != c.format or (c.format != KEEP and got.params != c.params):
            out.append(name)
    return out


# -- TOML text ----------------------------------------------------------------------------------


def _toml_str(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return _toml_str(str(value))


def _comment(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in str(text))
