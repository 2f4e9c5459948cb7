"""Model-family presets: which layers of a diffusion model stay dense, and where that list comes from.

A preset is data (``presets.toml`` next to this module): per family, keep-dense name lists,
each with its source, and the format of every other layer.  It becomes a rules set in the
rules-file machinery (``Rules`` of ``keep`` choices), so ``--dry-run`` says which
preset rule kept each layer.  Each keep list is the one a published quantizer uses for that
family, matched the way that source matches it: a *substring* of the layer name (the glob
``*NAME*``).  The sources (``[sources]`` in the data file):

* ComfyUI-INT8-Fast (BobJohnson24), ``int8_unet_loader.py``: the per-``model_type``
  ``excluded_names`` its INT8 loader keeps in BF16;
* ComfyUI-GGUF (city96), ``tools/lcpp.patch``: the names its llama.cpp quantize patch keeps in
  F32/F16 (``img_in.``, ``time_in.``, ``vector_in.``, ``guidance_in.``, ``txt_in.``, ``final_layer.``);
* convert_to_quant (silveroxides), ``convert_to_quant/constants.py``: the per-model
  ``highprec``/``exclude`` name lists of ``MODEL_FILTERS``.

Which family a file is, is read from its tensor names (``detect``: globs that must all match
some tensor name, most specific family first), as ComfyUI's model detection and GGUF's
``convert.py`` do.  A ComfyUI all-in-one checkpoint (``model.diffusion_model.*`` next to text
encoders and a VAE) is quantized in its diffusion model only unless ``include`` widens it; the
``model.diffusion_model.`` prefix is stripped for matching the preset's globs, as ComfyUI strips
it, while the written names stay as in the file.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from typing import TYPE_CHECKING

from ..errors import InputError, option
from .params import KEEP
from .rules import Choice, Rule, Rules

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

DATA = "presets.toml"
"""The presets, in this package (a data file: formats are named in data, never in code)."""

DIFFUSION_PREFIX = "model.diffusion_model."
"""The diffusion model's prefix in a ComfyUI all-in-one checkpoint (stripped by ComfyUI's loader)."""

COMPONENTS = (
    ("text_encoders.", "text-encoders"),
    ("cond_stage_model.", "text-encoders"),
    ("conditioner.", "text-encoders"),
    ("first_stage_model.", "vae"),
    ("vae.", "vae"),
)
"""The other components of an all-in-one checkpoint, by prefix: what ``--include`` names them."""

INCLUDE = ("text-encoders", "vae", "all")


class Preset:
    """One family: ``keep`` is (substring, source) in the source's order; ``detect`` the tensor
    name globs that identify the family (all must match; empty: never auto-detected);
    ``format`` the format of the layers it does not keep."""

    __slots__ = ("name", "title", "keep", "detect", "format")

    def __init__(
        self, name: str, title: str, keep: tuple[tuple[str, str], ...], detect: tuple[str, ...] = (), format: str = ""
    ) -> None:
        self.name = name
        self.title = title
        self.keep = keep
        self.detect = detect
        self.format = format

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(src for _s, src in self.keep))

    def globs(self) -> list[str]:
        return [f"*{s}*" for s, _src in self.keep]

    def rules(self) -> Rules:
        """The keep-dense rules: one rule per name, its source in the choice's text (what
        ``--dry-run`` shows as the reason a layer stays dense)."""
        rules = []
        for i, (sub, src) in enumerate(self.keep):
            glob = f"*{sub}*"
            rules.append(Rule([glob], Choice(KEEP, None, f"preset {self.name} {glob!r} ({src})"), i))
        return Rules(rules, None, f"preset {self.name}")


def _load() -> tuple[dict[str, Preset], dict[str, str]]:
    """The presets and sources of the data file (shipped with the package: a problem in it is a bug)."""
    from importlib import resources

    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - a declared dependency on Python 3.10
        import tomli as toml
    doc = toml.loads(resources.files(__package__).joinpath(DATA).read_text(encoding="utf-8"))
    sources = dict(doc["sources"])
    presets = {}
    for entry in doc["preset"]:
        keep = tuple((name, group["source"]) for group in entry["keep"] for name in group["names"])
        unknown = {src for _n, src in keep} - set(sources)
        if unknown:  # pragma: no cover - checked by the tests
            raise RuntimeError(f"{DATA}: preset {entry['name']} names unknown sources {sorted(unknown)}")
        presets[entry["name"]] = Preset(entry["name"], entry["title"], keep, tuple(entry["detect"]), entry["format"])
    return presets, sources


PRESETS, SOURCES = _load()
"""Every preset, in detection order; source name -> where it is (repository, file, what)."""


def help_text(width: int = 79) -> str:
    """The presets as ``quantize --help`` lists them: name, title, kept names, source (wrapped
    to ``width`` columns)."""
    import textwrap

    formats = sorted({p.format for p in PRESETS.values()})
    lines = textwrap.wrap(
        "presets (--preset NAME): layers whose name contains one of these names stay dense; other "
        f"layers get {' or '.join(formats)} (as listed) unless --format or a rules [default] says "
        "otherwise.",
        width,
    )
    for p in PRESETS.values():
        by_source: dict[str, list[str]] = {}
        for sub, src in p.keep:
            by_source.setdefault(src, []).append(sub)
        kept = "; ".join(f"{', '.join(subs)} [{src}]" for src, subs in by_source.items())
        lines += textwrap.wrap(
            f"{p.name}: {p.title}, else {p.format}: {kept}",
            width,
            initial_indent="  ",
            subsequent_indent="      ",
            break_on_hyphens=False,
        )
    lines.append("sources:")
    for key, where in SOURCES.items():
        lines += textwrap.wrap(
            f"[{key}] {where}",
            width,
            initial_indent="  ",
            subsequent_indent="      ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    return "\n".join(lines)


def resolve_preset(name: str | None) -> str | None:
    """``None``/``auto`` (detect), ``none`` (off) or a preset name; refuses others in one line."""
    if name is None:
        return None
    key = name.strip().lower()
    if key in ("auto", ""):
        return None
    if key in ("none", "off"):
        return "none"
    if key not in PRESETS:
        raise InputError(f"{option('--preset ', 'preset=')}{name!r}: unknown preset; choose from {', '.join(PRESETS)}, or none")
    return key


def resolve_include(values) -> frozenset[str]:
    out: set[str] = set()
    for value in values or ():
        for part in str(value).split(","):
            key = part.strip().lower()
            if not key:
                continue
            if key not in INCLUDE:
                raise InputError(f"{option('--include ', 'include=')}{part.strip()!r}: choose from {', '.join(INCLUDE)}")
            out.add(key)
    if "all" in out:
        out = {"text-encoders", "vae", "other"}
    return frozenset(out)


def component(name: str) -> str:
    """What part of an all-in-one checkpoint a name outside the diffusion model belongs to."""
    for prefix, kind in COMPONENTS:
        if name.startswith(prefix):
            return kind
    return "other"


def detect(names) -> tuple[Preset, list[str]] | None:
    """(preset, evidence) of the first family whose every signature glob matches a name."""
    names = list(names)
    for p in PRESETS.values():
        if not p.detect:
            continue
        if all(any(rx.fullmatch(n) for n in names) for rx in (re.compile(fnmatch.translate(g)) for g in p.detect)):
            return p, [g.split(".", 1)[0] for g in p.detect]
    return None


class Selection:
    """What decides a layer before the format: the all-in-one scope and the preset's keep rules.

    ``choose(name)`` gives a ``keep`` choice (with its reason) or None (the default applies);
    the user's own rules come first (``plan.Options``), ``--exclude`` before everything."""

    def __init__(
        self,
        preset: Preset | None,
        how: str,
        evidence: list[str],
        all_in_one: bool,
        include: frozenset[str],
        prefixed: bool = False,
    ) -> None:
        self.preset = preset
        self.how = how  # "detected", "given", "none" (disabled), "undetected"
        self.evidence = evidence
        self.all_in_one = all_in_one  # model.diffusion_model.* next to other parts
        self.prefixed = prefixed or all_in_one  # model.diffusion_model.* names (stripped for the globs)
        self.include = include
        self.rules = preset.rules() if preset is not None else None
        self.notes: list[str] = []
        if preset is not None and how == "detected":
            self.notes.append(
                f"preset {preset.name} detected from tensor names ({', '.join(evidence)}); --preset none disables it"
            )
        elif preset is not None:
            self.notes.append(f"preset {preset.name} (--preset)")
        elif how == "undetected":
            self.notes.append("no preset: the tensor names match no known model family (--preset NAME to choose one)")
        if all_in_one:
            widened = ", ".join(sorted(include)) or "nothing else"
            self.notes.append(
                f"all-in-one checkpoint: quantizing the diffusion model ({DIFFUSION_PREFIX}*) and "
                f"{widened}; --include text-encoders,vae widens"
            )

    def default_choice(self) -> Choice | None:
        """The preset's format for layers nothing else decides (None without a preset)."""
        if self.preset is None:
            return None
        from .params import resolve_format, validate

        where = f"preset {self.preset.name}"
        name = resolve_format(self.preset.format, where)
        return Choice(name, validate(name, {}, where), f"{where} default")

    def choose(self, name: str) -> Choice | None:
        inner = name
        if self.prefixed:
            if name.startswith(DIFFUSION_PREFIX):
                inner = name[len(DIFFUSION_PREFIX) :]
            elif self.all_in_one:
                kind = component(name)
                if kind in self.include:
                    return None
                flag = f"--include {kind}" if kind != "other" else "--include all"
                return Choice(
                    KEEP,
                    None,
                    f"all-in-one checkpoint: {kind if kind != 'other' else 'not the diffusion model'} ({flag} quantizes it)",
                )
        if self.rules is not None:
            chosen = self.rules.choose(inner)
            if chosen is not None:
                return chosen
        return None

    def to_dict(self) -> dict:
        return {
            "preset": self.preset.name if self.preset is not None else None,
            "how": self.how,
            "evidence": self.evidence,
            "keep": self.preset.globs() if self.preset is not None else [],
            "sources": {s: SOURCES[s] for s in self.preset.sources} if self.preset is not None else {},
            "all_in_one": self.all_in_one,
            "include": sorted(self.include),
            "notes": self.notes,
        }


def select(names, preset: str | None = None, include=()) -> Selection:
    """The selection for a checkpoint with tensor ``names``: ``preset`` None detects the
    family, ``"none"`` disables presets, a name forces one; ``include``: the components of an
    all-in-one checkpoint to quantize besides the diffusion model."""
    names = list(names)
    chosen = resolve_preset(preset)
    wanted = resolve_include(include)
    prefixed = any(n.startswith(DIFFUSION_PREFIX) for n in names)
    all_in_one = prefixed and any(not n.startswith(DIFFUSION_PREFIX) for n in names)
    if wanted and not all_in_one:
        raise InputError(
            f"--include {', '.join(sorted(wanted - {'other'}))}: not an all-in-one checkpoint "
            f"({DIFFUSION_PREFIX}* next to text encoders or a VAE): every layer is already quantized"
        )
    inner = [n[len(DIFFUSION_PREFIX) :] for n in names if n.startswith(DIFFUSION_PREFIX)] if prefixed else names
    if chosen == "none":
        return Selection(None, "none", [], all_in_one, wanted, prefixed)
    if chosen is not None:
        return Selection(PRESETS[chosen], "given", [], all_in_one, wanted, prefixed)
    found = detect(inner)
    if found is None:
        return Selection(None, "undetected", [], all_in_one, wanted, prefixed)
    return Selection(found[0], "detected", found[1], all_in_one, wanted, prefixed)


class Request:
    """What a ``quantize`` call asked of the selection (``preset``, ``include``, ``like``),
    checked before the input is opened; ``apply`` then reads the checkpoint's names."""

    def __init__(self, like, rules, default: Choice | None, preset: str | None, include) -> None:
        self.preset = resolve_preset(preset)
        self.include = resolve_include(include)
        self.recipe = None
        self.rules = None
        self.selection: Selection | None = None
        if like is not None:
            if rules is not None or default is not None or self.preset not in (None, "none") or self.include:
                raise InputError(
                    "--like GOOD gives every layer its format and parameters: it does not combine with "
                    "--format, format parameters, --rules, --preset or --include"
                )
            from .recipe import read_recipe

            self.recipe = read_recipe(like)
            self.rules = self.recipe.rules()
            self.preset = "none"
        self.may_default = self.recipe is None and self.preset != "none"
        """Whether a preset may still supply the format when the call gives none."""

    def apply(self, ckpt: Checkpoint) -> Selection | None:
        if self.recipe is not None:
            return None
        self.selection = select(list(ckpt.tensors), self.preset, self.include)
        return self.selection

    def default(self, default: Choice | None, rules, selection: Selection) -> Choice | None:
        """The format of layers nothing decides: the call's, else (no rules file) the preset's."""
        if default is not None or rules is not None:
            return default
        found = selection.default_choice()
        if found is None:
            why = "no preset matches the tensor names" if selection.how == "undetected" else "presets are off"
            give = option("--format F or --rules FILE (or --preset NAME", "format=... or rules=... (or preset=...")
            raise InputError(f"nothing to do: give {give}: {why})")
        return found

    def annotate(self, plan) -> None:
        """Attach what decided the plan, and how a ``--like`` plan differs from GOOD."""
        plan.selection = self.selection
        if self.selection is not None:
            plan.notes += self.selection.notes
        if self.recipe is not None:
            diffs = self.recipe.differences(plan)
            good = self.recipe.paths[0]
            if diffs:
                shown = "; ".join(diffs[:5]) + (f"; ... ({len(diffs)} layers)" if len(diffs) > 5 else "")
                plan.notes.append(f"warning: --like {good}: {len(diffs)} layers differ from it: {shown}")
            else:
                same = sum(1 for c in self.recipe.choices.values() if not c.why)
                plan.notes.append(f"--like {good}: the plan repeats its choices for all {same} layers")
            for c in self.recipe.unreproducible:
                plan.notes.append(f"warning: --like {good}: {c.name} cannot be reproduced ({c.why}); kept dense")

    def to_dict(self, plan) -> dict:
        out = self.selection.to_dict() if self.selection is not None else {"preset": None, "how": "none"}
        if self.recipe is not None:
            out["like"] = {
                "inputs": self.recipe.paths,
                "differences": self.recipe.differences(plan),
                "unreproducible": [c.name for c in self.recipe.unreproducible],
            }
        out["notes"] = list(plan.notes)
        return out
