"""What each SGLang release from 0.5.14 to 0.5.23 does with a Comfy quantized checkpoint.

Releases whose Comfy reader code is byte-identical form one group (``GROUPS``): the module that
reads Comfy checkpoints (``runtime/utils/quantization_utils.py``) and every quantization module it
imports, hashed together (``digest``). Two generations of reader exist:

* ``metadata`` (0.5.14 to 0.5.18): no marker reader. A config is chosen from the first file's
  ``_quantization_metadata`` (SGLang's generic FP8 config when a header layer names a ``float8``
  format) or from the tensors (ModelOpt's NVFP4 config when a layer has U8 weights and 2-D FP8 block
  scales); any other Comfy layer is built unquantized, which its quantized weights do not fit.
* ``markers`` (0.5.19 on): ``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization``,
  which ``targets.sglang`` models for 0.5.23. A group's verdict is 0.5.23's with the group's own
  messages (``messages``) and the config checks that differ (``_older_resolve``); a file 0.5.23's
  row-wise FP8 reader takes goes through the Comfy path in the groups without that reader.

Each group's behaviour is proven against that release's own functions on the generated
single-layer space and SGLang's row-wise FP8 space (tests/test_sglang_releases.py); what SGLang
does after choosing a config (building layers, loading weights) is modelled as for 0.5.23 and not
run.  ``check`` reports them (``releases_for``, ``released``): the first release that loads the
file under 0.5.23's verdict, or a selected release's verdict (``--target sglang==0.5.21``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from ..markers import HEADER, MARKER_MAP, VERSION_KEY
from .base import Verdict, Violation, outcome
from .releases import ReleasedVerdict, marker_reading, select, summary
from .releases import group_of as shared_group_of

NEWEST = "0.5.23"
FORMATS = ("float8_e4m3fn", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4", "mxfp8", "rowwise-float8_e4m3fn")
"""The Comfy formats an SGLang release may read (row-wise FP8 through its own reader, from 0.5.23)."""

UNQUANTIZED = "no quantization config: the layer is built unquantized and its quantized weights do not fit it"


class ReleaseGroup:
    """Releases whose Comfy reader files are byte-identical, and what they do with Comfy formats
    (a plain class: ``check`` imports this module, and stays clear of ``dataclasses``)."""

    __slots__ = ("releases", "digest", "reader", "reads", "refuses", "messages", "configs")

    def __init__(
        self,
        releases: tuple[str, ...],
        digest: str,
        reader: str,
        reads: Mapping[str, str],
        refuses: Mapping[str, str],
        messages: tuple[tuple[str, str], ...] = (),
        configs: Mapping[str, str] | None = None,
    ) -> None:
        self.releases = releases
        self.digest = digest
        """The first 12 hex digits of SHA-256 over the reader files (name and bytes, in name order)."""
        self.reader = reader
        """``metadata`` (a config chosen from header metadata and tensors) or ``markers`` (Comfy markers read)."""
        self.reads = reads
        """Format -> how the release reads it."""
        self.refuses = refuses
        """Format -> how the release fails on it."""
        self.messages = messages
        """(text in 0.5.23's message, this group's text): the messages that differ, as the release raises them."""
        self.configs: Mapping[str, str] = configs or {}
        """0.5.23's config class -> this group's, where it differs."""

    @property
    def name(self) -> str:
        return self.releases[0] if len(self.releases) == 1 else f"{self.releases[0]}-{self.releases[-1]}"

    def __repr__(self) -> str:
        return f"ReleaseGroup({self.name})"


_OLD_READS = {
    "float8_e4m3fn": "only when the header's _quantization_metadata names the layer: SGLang's generic FP8 config",
    "nvfp4": "ModelOpt's NVFP4 config, built from the tensors (U8 weights, 2-D FP8 block scales)",
}
_OLD_REFUSES = {
    "float8_e4m3fn": "marked only in tensors: " + UNQUANTIZED,
    "int8_tensorwise": UNQUANTIZED,
    "asym_w4a8_int8": UNQUANTIZED,
    "convrot_w4a4": UNQUANTIZED,
    "mxfp8": UNQUANTIZED,
}
_ROWWISE = {"rowwise-float8_e4m3fn": "NotImplementedError: Unsupported Comfy quantization format(s): rowwise-float8_e4m3fn"}
_KITCHEN_INT8 = (("Serialized convrot_int8 layer", "Serialized kitchen_int8 layer"),)
_MARKER_READS = {
    "float8_e4m3fn": "ComfyFp8Config",
    "int8_tensorwise": "ConvRot INT8 linears, INT8 embeddings",
    "asym_w4a8_int8": "KitchenW4A8Config (with INT8 embeddings)",
    "convrot_w4a4": "KitchenW4A4Config (with INT8 layers)",
    "nvfp4": "ComfyNvfp4Config (with INT8 embeddings)",
    "mxfp8": "MXFP8Config",
}

GROUPS: tuple[ReleaseGroup, ...] = (
    ReleaseGroup(("0.5.14",), "f6a9316059fe", "metadata", _OLD_READS, _OLD_REFUSES),
    ReleaseGroup(("0.5.15",), "4f28d65212dc", "metadata", _OLD_READS, _OLD_REFUSES),
    ReleaseGroup(("0.5.16", "0.5.17", "0.5.18"), "bbc05b362914", "metadata", _OLD_READS, _OLD_REFUSES),
    ReleaseGroup(
        ("0.5.19",),
        "298f23ce9b46",
        "markers",
        {
            **_MARKER_READS,
            "int8_tensorwise": "ConvRot INT8 linears (KitchenInt8Config); INT8 embeddings only beside NVFP4 or W4A8",
            "nvfp4": "ComfyNvfp4Config, only layers whose marker sets full_precision_matrix_mult: true",
        },
        {
            **_ROWWISE,
            "int8_tensorwise": "a marker without convrot: true in an INT8-only checkpoint: "
            "ValueError: Serialized kitchen_int8 layer '<layer>' must set convrot=true",
            "nvfp4": "without full_precision_matrix_mult: true: "
            "ValueError: Comfy NVFP4 layer '<layer>' must request full_precision_matrix_mult",
        },
        _KITCHEN_INT8,
        {"ConvRotInt8Config": "KitchenInt8Config"},
    ),
    ReleaseGroup(
        ("0.5.20", "0.5.21"),
        "1038ca1bb5ef",
        "markers",
        {**_MARKER_READS, "int8_tensorwise": "KitchenInt8Config: ConvRot INT8 linears, INT8 embeddings"},
        _ROWWISE,
        _KITCHEN_INT8,
        {"ConvRotInt8Config": "KitchenInt8Config"},
    ),
    ReleaseGroup(("0.5.22",), "340aefa5ed52", "markers", _MARKER_READS, _ROWWISE),
    ReleaseGroup(
        ("0.5.23",),
        "bed97966732f",
        "markers",
        {**_MARKER_READS, "rowwise-float8_e4m3fn": "its row-wise FP8 reader (layers/quantization/rowwise_fp8.py)"},
        {},
    ),
)
RELEASES = tuple(r for g in GROUPS for r in g.releases)


class ReleaseVerdict(NamedTuple):
    """One release group's verdict on a checkpoint (``error``/``exception``: what it fails with;
    ``exception`` None with an ``error``: it fails without a message of its own)."""

    group: ReleaseGroup
    loads: bool
    error: str | None = None
    exception: str | None = None
    how: str = ""
    rule: str | None = None
    """The rule of ``targets.sglang`` the failure comes from (0.5.23's, or ``sglang.R1``/``sglang.R8``
    for the older config checks, ``sglang.legacy`` for the readers before 0.5.19)."""
    layer: str | None = None
    """The layer the failure names (None: the file as a whole)."""

    def __repr__(self) -> str:
        return f"ReleaseVerdict({self.group.name}, loads={self.loads}, {self.exception}: {self.error})"

    def to_dict(self) -> dict:
        return {
            "releases": list(self.group.releases),
            "reader": self.group.reader,
            "loads": self.loads,
            "error": self.error,
            "exception": self.exception,
            "rule": self.rule,
            "layer": self.layer,
            "how": self.how,
        }


class Facts:
    """What the release verdicts need beyond 0.5.23's verdict: the markers as 0.5.23 reads them
    (with the keys it derives, ``_is_rowwise``...), and what the releases before 0.5.19 choose
    (``legacy``: ``fp8``, ``modelopt_fp4``, None, or ``raises Type: message``)."""

    __slots__ = ("markers", "legacy", "quantized", "comfy", "_formats")

    def __init__(
        self,
        markers: Mapping[str, Mapping[str, Any]],
        legacy: str | None,
        quantized: bool,
        comfy: Mapping[str, Any] | None = None,
    ) -> None:
        self.markers = markers
        self.legacy = legacy
        self.quantized = quantized
        self.comfy = comfy
        """When 0.5.23's row-wise FP8 reader takes the file: the verdict (``brief``) of its Comfy
        path, which the marker readers without that reader (0.5.19 to 0.5.22) take instead."""
        self._formats: tuple[str, ...] | None = None

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats the markers name, sorted (worked out once for every group)."""
        if self._formats is None:
            markers = self.markers.raw if isinstance(self.markers, Merged) else self.markers  # derived keys name no format
            self._formats = tuple(sorted({str(m.get("format")) for m in markers.values()}))
        return self._formats


class Merged(Mapping[str, Mapping[str, Any]]):
    """Each marker with the keys 0.5.23 derives for it laid over it, merged when read (most
    verdicts read no marker but their formats)."""

    __slots__ = ("raw", "derived")

    def __init__(self, raw: Mapping[str, Mapping[str, Any]], derived: Mapping[str, Mapping[str, Any]]) -> None:
        self.raw = raw
        self.derived = derived

    def __getitem__(self, prefix: str) -> Mapping[str, Any]:
        marker, keys = self.raw[prefix], self.derived.get(prefix)
        return {**marker, **keys} if keys else marker

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


_LEGACY_CONFIGS = {
    "fp8": ("float8_e4m3fn", "SGLang's generic FP8 config, chosen from the header's _quantization_metadata"),
    "modelopt_fp4": ("nvfp4", "ModelOpt's NVFP4 config, built from the NVFP4 tensors"),
}
"""The configs of the readers before 0.5.19: the end of the Comfy format names each serves (FP8's
takes E4M3 weights with a tensor or row scale), and how it is chosen."""

_INSPECT_LATER = ("R", "B")
"""0.5.23 rules from its config constructors (R) and layer building (B): a failure of these, or
none, means the markers passed inspection, where older config checks take over."""


def _after_inspect(verdict: Mapping[str, Any]) -> bool:
    if verdict.get("loads"):
        return True
    rule = str(verdict.get("rule") or "").split(".", 1)[-1]
    return rule == "incomplete" or (rule[:1] in _INSPECT_LATER and rule[1:].isdigit())


def _older_resolve(group: ReleaseGroup, facts: Facts) -> tuple[str, str, str, str] | None:
    """The config checks of 0.5.19 that later releases relaxed: (exception, message, rule, layer) or None."""
    markers, formats = facts.markers, facts.formats
    if group.releases != ("0.5.19",) or not markers:
        return None
    if formats == ("int8_tensorwise",):
        for prefix, m in markers.items():
            if m.get("convrot") is not True:
                return "ValueError", f"Serialized kitchen_int8 layer {prefix!r} must set convrot=true", "sglang.R1", prefix
            c = m.get("convrot_groupsize")
            if c not in (16, 64, 256):
                return (
                    "ValueError",
                    f"Serialized kitchen_int8 layer {prefix!r} must declare convrot_groupsize in (16, 64, 256), got {c!r}",
                    "sglang.R2",
                    prefix,
                )
    if formats in (("nvfp4",), ("int8_tensorwise", "nvfp4")):
        for prefix, m in markers.items():
            fmt = m.get("format")
            if fmt == "int8_tensorwise" and m.get("_is_rowwise"):
                continue
            if fmt != "nvfp4":
                return "ValueError", f"Unsupported Comfy NVFP4 companion for {prefix!r}: {fmt!r}", "sglang.R8", prefix
            if m.get("full_precision_matrix_mult") is not True:
                return "ValueError", f"Comfy NVFP4 layer {prefix!r} must request full_precision_matrix_mult", "sglang.R9", prefix
    return None


def _renamed(group: ReleaseGroup, text: str | None) -> str | None:
    if text is None:
        return None
    for newest, own in group.messages:
        text = text.replace(newest, own)
    return text


def group_verdict(group: ReleaseGroup, verdict: Mapping[str, Any], facts: Facts) -> ReleaseVerdict:
    """One group's verdict from 0.5.23's (``Verdict.to_dict()`` of ``targets.sglang``) and ``facts``."""
    if group.reader == "metadata":
        legacy = facts.legacy
        if legacy is not None and legacy.startswith("raises "):
            exception, _, message = legacy.removeprefix("raises ").partition(": ")
            return ReleaseVerdict(group, False, message, exception, rule="sglang.legacy")
        if legacy in _LEGACY_CONFIGS:
            serves, how = _LEGACY_CONFIGS[legacy]
            others = [f for f in facts.formats if not f.endswith(serves)]
            if others:
                return ReleaseVerdict(
                    group,
                    False,
                    f"(no SGLang message) SGLang {group.name} builds the quantized layers with {how}: "
                    f"the {', '.join(others)} layers do not fit it",
                    rule="sglang.legacy",
                )
            if str(verdict.get("rule") or "").endswith(".values"):  # a value it reads as 0.5.23 does (``--deep``)
                return ReleaseVerdict(
                    group, False, verdict.get("error"), None, rule=verdict.get("rule"), layer=verdict.get("layer")
                )
            return ReleaseVerdict(group, True, how=how)
        if not facts.quantized:
            return ReleaseVerdict(group, True, how="no quantized layers")
        return ReleaseVerdict(
            group, False, f"(no SGLang message) SGLang {group.name} reads no Comfy markers: {UNQUANTIZED}", rule="sglang.legacy"
        )
    if facts.comfy is not None and group.releases[-1] != NEWEST:
        verdict = facts.comfy
    formats = facts.formats
    newest_reader = str(verdict.get("rule") or "").split(".", 1)[-1].startswith("RW")
    if (
        group.releases[-1] != NEWEST
        and (newest_reader or _after_inspect(verdict))
        and any(f.startswith("rowwise-") for f in formats)
    ):
        # no row-wise FP8 reader (what 0.5.23's reader refuses never reaches theirs): the
        # format is one their resolve does not serve
        message = "Unsupported Comfy quantization format(s): " + ", ".join(formats)
        return ReleaseVerdict(group, False, message, "NotImplementedError", rule="sglang.R0")
    if _after_inspect(verdict) and (older := _older_resolve(group, facts)) is not None:
        return ReleaseVerdict(group, False, older[1], older[0], rule=older[2], layer=older[3])
    if verdict.get("loads"):
        return ReleaseVerdict(group, True, how="Comfy markers")
    error = _renamed(group, verdict.get("error"))
    return ReleaseVerdict(group, False, error, verdict.get("exception"), rule=verdict.get("rule"), layer=verdict.get("layer"))


def release_verdicts(verdict: Mapping[str, Any], facts: Facts) -> list[ReleaseVerdict]:
    """Every release group's verdict, oldest first."""
    return [group_verdict(g, verdict, facts) for g in GROUPS]


def first_loading_release(verdicts: Iterable[ReleaseVerdict]) -> str | None:
    """The first release from which every later one loads the file (None: the newest does not)."""
    first = None
    for v in verdicts:
        if not v.loads:
            first = None
        elif first is None:
            first = v.group.releases[0]
    return first


def first_reading_release(fmt: str) -> str | None:
    """The first release from which every later group reads the Comfy format ``fmt`` (under the
    conditions ``ReleaseGroup.reads`` names); None when the newest does not."""
    first = None
    for g in GROUPS:
        if fmt not in g.reads:
            first = None
        elif first is None:
            first = g.releases[0]
    return first


def group_of(release: str) -> ReleaseGroup:
    """The group of one release; LookupError names the known ones."""
    return shared_group_of("SGLang", GROUPS, release)


# -- a check's verdicts per release -----------------------------------------------------------


def selected_releases(spec: tuple[str, str] | None) -> tuple[str, ...]:
    """The releases a spec (``("==", "0.5.21")``) names, oldest first (all for None); none is
    refused in one line listing the known ones."""
    return select("SGLang", RELEASES, spec)


class Releases:
    """The file's verdict on each SGLang release group, oldest first, and the releases a target
    selects (all by default)."""

    __slots__ = ("verdicts", "selected")

    def __init__(self, verdicts: list[ReleaseVerdict], selected: tuple[str, ...]) -> None:
        self.verdicts = verdicts
        """Every group's: the first loading release is a fact of all of them."""
        self.selected = selected

    @property
    def runs(self) -> list:
        """(releases, loads, verdict) per group, oldest first (``releases.summary``)."""
        return [(v.group.releases, v.loads, v) for v in self.verdicts]

    @property
    def chosen(self) -> list[tuple[ReleaseVerdict, tuple[str, ...]]]:
        """The verdicts of the groups with a selected release, with only those releases."""
        chosen = set(self.selected)
        out = []
        for v in self.verdicts:
            mine = tuple(r for r in v.group.releases if r in chosen)
            if mine:
                out.append((v, mine))
        return out

    @property
    def first_loading(self) -> str | None:
        """The first release from which every later one loads the file (None: the newest does not)."""
        return first_loading_release(self.verdicts)

    def lines(self) -> list[str]:
        """``loads from SGLang 0.5.19 on; fails before: <its error>`` and the releases where the
        file stopped or started loading before (after a spec: the release whose verdict is shown)."""
        return summary("SGLang", self.runs, self.selected, failure_text)

    def to_dict(self) -> dict:
        return {
            "first_loading": self.first_loading,
            "summary": self.lines(),
            "releases": [{**v.to_dict(), "releases": list(mine)} for v, mine in self.chosen],
        }


def failure_text(verdict: ReleaseVerdict) -> str:
    """``Type: message`` of a failing group verdict (the message alone when SGLang has none)."""
    if verdict.loads:
        return "loads"
    return f"{verdict.exception}: {verdict.error}" if verdict.exception else str(verdict.error)


def releases_for(ckpt, newest: Verdict, spec: tuple[str, str] | None) -> Releases:
    """The file's verdict on every release group from its SGLang 0.5.23 verdict ``newest``
    (``facts_from_checkpoint`` read once), and the releases ``spec`` selects."""
    facts = facts_from_checkpoint(ckpt, getattr(newest, "read", None), getattr(newest, "rowwise", None))
    return Releases(release_verdicts(brief(newest), facts), selected_releases(spec))


def brief(verdict: Verdict) -> dict[str, Any]:
    """What ``group_verdict`` reads of a verdict (the keys of ``Verdict.to_dict`` it uses)."""
    return outcome(verdict.first)


def released(newest: Verdict, releases: Releases) -> ReleasedVerdict:
    """The SGLang verdict a check reports: by default 0.5.23's (the proven one); after a spec,
    the newest selected release's. Either carries the file's verdict on every release."""
    if releases.selected[-1] == NEWEST:
        last = newest
    else:
        chosen = releases.chosen[-1][0]
        last = as_verdict(chosen, newest, _loading_after(releases.verdicts, chosen.group))
    out = ReleasedVerdict(last.target, last.violations, last.architecture)
    out.releases = releases
    return out


def _loading_after(verdicts: list[ReleaseVerdict], group: ReleaseGroup) -> str | None:
    """The first release after ``group`` from which every later one loads the file."""
    later = [v for v in verdicts if RELEASES.index(v.group.releases[0]) > RELEASES.index(group.releases[-1])]
    return first_loading_release(later)


def as_verdict(verdict: ReleaseVerdict, newest: Verdict, fixed: str | None) -> Verdict:
    """One older group's verdict as a ``Verdict`` of the check: 0.5.23's violations where the
    group fails alike (in the group's words) or loads, else the group's own failure (``fixed``:
    the first release from which later ones load the file, which the fix names)."""
    group = verdict.group
    if verdict.loads:
        return Verdict("sglang", [v for v in newest.violations if not v.fails], newest.architecture)
    first = newest.first
    if first is not None and (verdict.rule, verdict.exception, verdict.error) == (
        first.rule,
        first.exception,
        _renamed(group, first.message),
    ):
        if not group.messages:
            return newest
        renamed = [_in_words_of(group, v) for v in newest.violations]
        return Verdict("sglang", renamed, newest.architecture)
    if verdict.rule == "sglang.legacy" and verdict.exception is not None:
        cause = f"SGLang {group.name} reads each file's header with Python's own struct and json first"
    elif verdict.rule == "sglang.legacy":
        cause = f"SGLang {group.name} reads no Comfy markers: it picks a quantization config from the header's metadata and the tensors"
    elif verdict.rule == "sglang.R0":
        cause = f"SGLang {group.name} has no reader for the row-wise FP8 layout"
    else:
        cause = f"SGLang {group.name} checks the markers more strictly than later releases"
    fix = f"load it with SGLang {fixed} or newer" if fixed else None
    own = Violation(
        verdict.rule or "sglang.release", verdict.error or "", verdict.exception, verdict.layer, None, True, cause, fix
    )
    return Verdict("sglang", [own], newest.architecture)


def _in_words_of(group: ReleaseGroup, v: Violation) -> Violation:
    """0.5.23's violation ``v`` with the message ``group`` raises instead."""
    out = Violation(
        v.rule, _renamed(group, v.message) or "", v.exception, v.layer, v.tensor, v.blocking, v.cause, v.fix, v.severity, v.file
    )
    out.covers = v.covers
    return out


# -- the readers before 0.5.19 -----------------------------------------------------------------


Tensors = Mapping[str, tuple[str, tuple[int, ...]]]
"""One file's tensors: name -> (dtype, shape)."""


def legacy_choice(
    files: Sequence[tuple[Mapping[str, str], Tensors | Callable[[], Tensors]]], inert: Collection[str] = ()
) -> str | None:
    """What SGLang 0.5.14-0.5.18 choose for a checkpoint whose files are ``(metadata, {tensor:
    (dtype, shape)})`` (or a function that makes the tensors, called when they are read): the
    quantization method named in the first file's header (``fp8``), else ``modelopt_fp4`` when
    the files hold NVFP4 tensors whose group size the shapes tell, else None; ``raises Type:
    message`` when their code raises on the header.  ``inert``: header maps known to parse to an
    object with a ``layers`` object that names no config (``inert_maps``), left unparsed."""
    parsed: dict[str, tuple[Any, Exception | None]] = {}

    def parse(text: str) -> Any:
        # each file's map is parsed once (as their json.loads parses it), for both readers
        if text in inert:
            return {"layers": {}}  # what both readers make of such a map: no config, no NVFP4 layer
        if text not in parsed:
            try:
                parsed[text] = (json.loads(text), None)
            except Exception as error:  # re-raised to each reader, which handles it as its own code does
                parsed[text] = (None, error)
        obj, failed = parsed[text]
        if failed is not None:
            raise failed
        return obj

    try:
        method = _metadata_method(files[0][0], parse) if files else None
        return method if method is not None else _nvfp4_method(files, parse)
    except Exception as exc:  # what their own code raises on such a header
        return f"raises {type(exc).__name__}: {exc}"


def _metadata_method(metadata: Mapping[str, str], parse: Callable[[str], Any] = json.loads) -> str | None:
    if not metadata:
        return None
    config: Any = None
    text = metadata.get(MARKER_MAP)
    if text:
        try:
            config = parse(text)
        except Exception:
            config = None
    if config is None:
        text = metadata.get("quantization_config")
        if not text:
            return None
        try:
            config = parse(text)
        except Exception:
            return None
    if not config:
        return None
    if "quant_method" not in config and VERSION_KEY in config and "layers" in config:
        layers = config.get("layers", {})
        if any(isinstance(v, dict) and "float8" in v.get("format", "") for v in layers.values()):
            config["quant_method"] = "fp8"
    method = config.get("quant_method")
    return str(method) if method and method != "modelopt" else None


def _nvfp4_method(
    files: Sequence[tuple[Mapping[str, str], Tensors | Callable[[], Tensors]]], parse: Callable[[str], Any] = json.loads
) -> str | None:
    group_size = None
    signal = False
    for metadata, listed in files:
        tensors = listed() if callable(listed) else listed
        config = None
        signals = False
        text = (metadata or {}).get(MARKER_MAP)
        if text:
            try:
                config = parse(text)
            except json.JSONDecodeError:
                config = None
            else:
                algo = str(config.get("quant_algo", "")).upper()
                kind = str(config.get("quant_type", "")).upper()
                signals = "NVFP4" in algo or "FP4" in algo or "NVFP4" in kind
        modules: set[str] = set()
        if config is not None and VERSION_KEY in config and "layers" in config:
            modules.update(k for k, v in config.get("layers", {}).items() if isinstance(v, dict) and v.get("format") == "nvfp4")
        for key in tensors:
            if key.endswith(".weight_scale"):
                module = key[: -len(".weight_scale")]
                w, s = tensors.get(f"{module}.weight"), tensors[key]
                if w is not None and w[0].upper() == "U8" and "F8_E4M3" in s[0].upper() and len(s[1]) >= 2:
                    modules.add(module)
        if modules or signals:
            signal = True
        if group_size is None:
            for module in sorted(modules):
                weight, scale = tensors.get(f"{module}.weight"), tensors.get(f"{module}.weight_scale")
                if weight is not None and scale is not None:
                    group_size = _group_size(weight[1], scale[1])
                    if group_size is not None:
                        break
    return "modelopt_fp4" if signal and group_size is not None else None


def _group_size(weight: tuple[int, ...], scale: tuple[int, ...]) -> int | None:
    if len(weight) < 2:
        return None
    k = int(weight[1]) * 2
    if k <= 0:
        return None
    if len(scale) >= 2:
        groups = [int(scale[-1])]
    elif len(scale) == 1:
        groups = ([1] if int(scale[0]) == int(weight[0]) else []) + [int(scale[0])]
    else:
        groups = [1]
    for n in groups:
        if n > 0 and k % n == 0:
            return k // n
    return None


_HUGE = 1 << 48
"""A header length no machine allocates: reading that many bytes raises MemoryError."""


def _python_header_error(path: str) -> str | None:
    """What reading ``path``'s header as the releases before 0.5.19 do raises (``raises Type:
    message``), or None: the first 8 bytes as a little-endian length, that many bytes as JSON,
    and its ``__metadata__`` entry popped."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length >= _HUGE:
                raise MemoryError()
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
    except Exception as exc:  # their own code raises it
        return f"raises {type(exc).__name__}: {exc}"
    return None


def facts_from_checkpoint(ckpt, read: tuple[dict, dict] | None = None, rowwise: bool | None = None) -> Facts:
    """``Facts`` of an opened checkpoint (``checkpoint.open_checkpoint``): its markers as
    ``targets.sglang`` reads them for 0.5.23 (or, when its row-wise FP8 reader takes the file, as
    the releases without it read them), and what the releases before 0.5.19 choose.  ``read``
    and ``rowwise``: what a check's SGLang verdict inspected and whether its row-wise reader took
    the file (``targets.sglang.SGLangVerdict``; worked out here when None)."""
    from ..markers import FILE_LEVEL_DTYPES
    from .base import Verdict
    from .container import EXCEPTION, container_errors
    from .sglang import run_all

    comfy = None
    if read is None:
        found: list = []
        if not rowwise:
            run_all(ckpt, read=found)
        if found:
            read = found[0]
        else:  # 0.5.23's row-wise reader took the file: the releases without it inspect the Comfy markers
            violations = run_all(ckpt, read=found, rowwise_reader=False)[2]
            read, comfy = found[0], brief(Verdict("sglang", violations))
    markers, derived = read
    merged = Merged(markers, derived) if derived else markers
    quantized = bool(markers) or any(
        (w := layer.stored.get("weight")) is not None and w.dtype in FILE_LEVEL_DTYPES for layer in ckpt.layers.values()
    )
    damaged = container_errors(ckpt)
    for path in ckpt.files if damaged else ():
        # their NVFP4 scan reads each file's header with Python's struct and json, then opens the
        # file with safetensors: a damaged file raises at the first of these its damage breaks
        error = _python_header_error(path)
        if error is not None:
            return Facts(merged, error, quantized, comfy)
        if path in damaged:
            return Facts(merged, f"raises {EXCEPTION}: {damaged[path]}", quantized, comfy)
    legacy = legacy_choice([(h.metadata, partial(_scales, h.tensors)) for h in ckpt.headers], inert_maps(ckpt))
    return Facts(merged, legacy, quantized, comfy)


_CONFIG_WORDS = ("quant_method", "quant_algo", "quant_type", "float8", "nvfp4", "\\")
"""What a header map must contain for the releases before 0.5.19 to take a config from it: the
keys and format names they read (a backslash may escape any of them)."""


def inert_maps(ckpt) -> set[str]:
    """The header maps (``_quantization_metadata`` texts) that parse to an object with a
    ``layers`` object (the check's own parse, Python's ``json`` refusing only non-finite numbers
    besides, found nothing wrong), whose layer objects' formats are strings (their FP8 test,
    ``"float8" in format``, raises ``TypeError`` on a number or null) and that contain no word of
    ``_CONFIG_WORDS``: the releases before 0.5.19 take no config from them and raise nothing on
    them, so they need not parse them again."""
    odd = (
        set()
        if marker_reading(ckpt).plain_header  # the check's one pass over the markers found no such object
        else {
            r.file
            for r in ckpt.markers.records
            if r.kind == HEADER and isinstance(r.obj, dict) and not isinstance(r.obj.get("format", ""), str)
        }
    )
    return {
        hm.raw
        for hm in ckpt.markers.headers
        if hm.error is None and hm.raw and hm.file not in odd and not any(w in hm.raw for w in _CONFIG_WORDS)
    }


_SCALE = ".weight_scale"


def _scales(tensors: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of the tensors the NVFP4 scan of the releases before 0.5.19 reads: each
    ``.weight_scale`` and the ``.weight`` beside it."""
    if _SCALE + "\n" not in "\n".join(tensors) + "\n":  # most files have none: one search of the joined names tells
        return {}
    out = {}
    for name in [n for n in tensors if n.endswith(_SCALE)]:
        t = tensors[name]
        out[name] = (t.dtype, tuple(t.shape))
        w = tensors.get(name[: -len(_SCALE)] + ".weight")
        if w is not None:
            out[name[: -len(_SCALE)] + ".weight"] = (w.dtype, tuple(w.shape))
    return out
