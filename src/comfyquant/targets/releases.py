"""What every runtime with modelled releases shares: release specs (``comfyui>=0.27``,
``sglang==0.5.21``) and the summary lines of a file's verdict across the releases.

A runtime's releases are an ordered tuple, oldest first, cut into runs that load a file alike
(its release groups); each runtime module knows its own groups and how they fail, this one only
how versions compare and how a loads/fails sequence reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .base import Verdict, outcome

OPERATORS = ("==", ">=", "<=", ">", "<")

Run = tuple[tuple[str, ...], bool, Any]
"""(a group's releases, whether the file loads on them, the group's verdict)."""


def version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0"`` -> ``(0, 31, 0)``; a shorter version compares as its zero-padded form."""
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def split_release(text: str, examples: Mapping[str, str] | None = None) -> tuple[str, tuple[str, str] | None]:
    """``"comfyui>=0.27"`` -> ``("comfyui", (">=", "0.27"))``; a bare name has no spec.  A
    version that is not dotted numbers is refused in one line, with the runtime's example spec
    from ``examples`` (name -> spec)."""
    for op in OPERATORS:
        name, sep, version = text.partition(op)
        if sep:
            name, version = name.strip(), version.strip()
            if not version or not all(p.isdigit() for p in version.split(".")):
                example = (examples or {}).get(name, f"{name}==0.31.0")
                raise ValueError(f"target {text!r}: {version!r} is not a release number (e.g. {example})")
            return name, (op, version)
    return text, None


def matches(release: str, spec: tuple[str, str]) -> bool:
    """Whether ``release`` is one ``spec`` names: ``==0.31`` names the 0.31 releases,
    ``==0.31.0`` exactly one; the other operators compare versions."""
    op, version = spec
    a, b = version_key(release), version_key(version)
    if op == "==":
        return a[: len(version.split("."))] == b[: len(version.split("."))] if len(version.split(".")) < 3 else a == b
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]


def select(runtime: str, releases: tuple[str, ...], spec: tuple[str, str] | None) -> tuple[str, ...]:
    """The releases of ``runtime`` a spec names, oldest first (all for None); none is refused in
    one line that lists the known ones."""
    if spec is None:
        return releases
    found = tuple(r for r in releases if matches(r, spec))
    if not found:
        raise ValueError(
            f"no {runtime} release {''.join(spec)} is modelled: choose from {releases[0]} .. {releases[-1]} ({', '.join(releases)})"
        )
    return found


def first_loading(runs: Sequence[Run]) -> str | None:
    """The first release of the newest run of releases that load the file (None: the newest
    release does not)."""
    first = None
    for releases, loads, _ in runs:
        if loads:
            first = first or releases[0]
        else:
            first = None
    return first


def summary(
    runtime: str,
    runs: Sequence[Run],
    selected: tuple[str, ...],
    failure: Callable[[Any], str],
    chosen: str = "",
    fails_everywhere: str = "",
) -> list[str]:
    """The lines a check prints under a runtime's verdict: ``loads from SGLang 0.5.19 on; fails
    before: <its error>`` (or loads on every release, or fails on every one), and the releases
    where the file stopped or started loading before; after a spec that selects fewer than every
    release, the release whose verdict is shown and the releases checked first.

    ``runs``: every group, oldest first; ``failure``: a failing group verdict's text;
    ``chosen``: said after the release whose verdict is shown (ComfyUI: its comfy-kitchen);
    ``fails_everywhere``: said after the line of a file no release loads."""
    releases = tuple(r for rs, _, _ in runs for r in rs)
    lines = []
    if selected != releases:
        span = selected[0] if len(selected) == 1 else f"{selected[0]} .. {selected[-1]}"
        lines.append(f"verdict of {runtime} {selected[-1]}{chosen}; releases checked: {span}")
    oldest, newest = releases[0], releases[-1]
    first = first_loading(runs)
    if first is None:
        last = next((rs[-1] for rs, loads, _ in reversed(runs) if loads), None)
        if last is None:
            return [*lines, f"fails on every {runtime} release {oldest} .. {newest}{fails_everywhere}"]
        after = releases[releases.index(last) + 1] if last != newest else last
        return [*lines, f"fails from {runtime} {after} on; last loads on {last}"]
    if first == oldest:
        return [*lines, f"loads on every {runtime} release {oldest} .. {newest}"]
    at = next(i for i, (rs, _, _) in enumerate(runs) if rs[0] == first)
    lines.append(f"loads from {runtime} {first} on; fails before: {failure(runs[at - 1][2])}")
    for i in range(1, at):
        if runs[i][1] != runs[i - 1][1]:
            lines.append(f"{'starts' if runs[i][1] else 'stops'} loading at {runtime} {runs[i][0][0]}")
    return lines


def failure(verdict: Any) -> str:
    """``Type: message`` of what a group's verdict fails with (the message alone when the runtime
    raises none of its own; ``loads`` when it does not fail)."""
    first = verdict.first
    if first is None:
        return "loads"
    return f"{first.exception}: {first.message}" if first.exception else first.message


def chosen_dicts(chosen: Sequence[tuple[Any, tuple[str, ...], Any]]) -> list[dict]:
    """The JSON's ``releases``: per group with a selected release, its facts (``to_dict``), its
    selected releases and what its verdict fails with."""
    return [{**group.to_dict(), "releases": list(releases), **outcome(verdict.first)} for group, releases, verdict in chosen]


class ReleasedVerdict(Verdict):
    """A runtime's verdict with the file's verdict on each of its releases (``releases``: an
    object with ``lines()`` and ``to_dict()``): the text report's lines and the JSON's
    ``releases``."""

    __slots__ = ("releases",)
    releases: Any

    def release_lines(self) -> list[str]:
        return self.releases.lines()

    def to_dict(self) -> dict:
        return {**super().to_dict(), "releases": self.releases.to_dict()}


def group_of(runtime: str, groups: Sequence[Any], release: str) -> Any:
    """The group of ``groups`` (each with ``releases``) that holds ``release``; a release none
    holds is a LookupError that names the known ones."""
    for g in groups:
        if release in g.releases:
            return g
    known = ", ".join(r for g in groups for r in g.releases)
    raise LookupError(f"{runtime} {release} is not a known release (known: {known})")


# -- what the release models read of a checkpoint alike, once per check --------------------------

DIFFUSION_PREFIX = "model.diffusion_model."


class MarkerReading(NamedTuple):
    """Every parsed marker object of the file, by marker form, keyed by its layer's name without
    the diffusion-model prefix (ComfyUI matches both): ``header`` and ``tensor`` give each
    layer's ``format`` value, ``objects`` the object ComfyUI reads (the header map's replacing
    the tensor's).  ``plain_header``: every header-map object's ``format`` is a string."""

    header: dict[str, object]
    tensor: dict[str, object]
    objects: dict[str, dict]
    plain_header: bool
    refused_tensor: bool
    """Some tensor marker is not read as JSON by comfyquant (Python's ``json`` may read it)."""
    odd: bool
    """Some marker (of either form) is not a JSON object: the readings above leave it out."""
    header_prefixed: frozenset
    """The header map's layers named with the diffusion-model prefix (names without it), its
    entries that are no object included."""


def marker_reading(ckpt) -> MarkerReading:
    """The file's ``MarkerReading``: one pass over its marker records, made once per check and
    shared by every release model that reads it."""
    found = ckpt.shared.get("marker_reading")
    if found is None:
        found = ckpt.shared["marker_reading"] = _read_markers(ckpt.markers.records)
    return found


def _read_markers(records) -> MarkerReading:
    header: dict[str, object] = {}
    tensor: dict[str, object] = {}
    header_objects: dict[str, dict] = {}
    tensor_objects: dict[str, dict] = {}
    plain = True
    refused = False
    odd = False
    prefixed: set[str] = set()
    # the prefix is cut only in a file that has it (one search of the joined names tells)
    cut = len(DIFFUSION_PREFIX) if ("\n" + "\n".join([r.prefix for r in records])).find("\n" + DIFFUSION_PREFIX) >= 0 else 0
    for rec in records:  # once per marker: the cheapest tests first (a marker is nearly always a plain dict)
        obj = rec.obj
        if obj.__class__ is dict or isinstance(obj, dict):
            prefix = rec.prefix
            if cut and prefix.startswith(DIFFUSION_PREFIX):
                prefix = prefix[cut:]
                if rec.kind == "header":
                    prefixed.add(prefix)
            fmt = obj.get("format")
            if rec.kind == "header":
                header[prefix] = fmt
                header_objects[prefix] = obj
                if plain and fmt.__class__ is not str and not isinstance(fmt, str):
                    plain = False
            else:
                tensor[prefix] = fmt
                tensor_objects[prefix] = obj
        else:
            odd = True
            if rec.kind != "header":
                refused = refused or obj is None
            elif cut and rec.prefix.startswith(DIFFUSION_PREFIX):
                prefixed.add(rec.prefix[cut:])  # an entry that is no object still names its layer
    objects = {**tensor_objects, **header_objects} if header_objects else tensor_objects
    return MarkerReading(header, tensor, objects, plain, refused, odd, frozenset(prefixed))


class LayerClass(NamedTuple):
    """One class of the file's marked layers (``memo``: equal marker text and tensor signature,
    so every per-layer rule agrees on them): its first layer in the file's order, that layer's
    marker and format."""

    prefix: str
    layer: Any
    marker: dict
    format: str


def layer_classes(ckpt) -> list[LayerClass]:
    """The classes of the layers whose checkpoint marker (``Layer.marker``) names a format, in
    the order of their first layers: made once per check and shared by the release models,
    which judge a class once where a rule's result is the same for all its layers."""
    found = ckpt.shared.get("layer_classes")
    if found is None:
        found = ckpt.shared["layer_classes"] = _classes(ckpt)
    return found


def _classes(ckpt) -> list[LayerClass]:
    class_id = ckpt.memo.class_id
    firsts: dict[int, LayerClass] = {}
    for prefix, layer in ckpt.layers.items():
        marker, name = layer.marker, layer.format_name
        if marker is None or name is None:
            continue
        cached = layer.class_ids  # the class the check's own rules gave the layer, inline
        hit = cached.get(id(marker)) if cached is not None else None
        cid = hit[1] if hit is not None and hit[0] is marker else class_id(marker, layer)
        if cid not in firsts:
            firsts[cid] = LayerClass(prefix, layer, marker, name)
    return list(firsts.values())
