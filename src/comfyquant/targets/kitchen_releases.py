"""What each comfy-kitchen release from 0.1.2 to 0.2.40 does with a Comfy quantized layer.

Releases whose deciding code is byte-identical form one group (``GROUPS``): the modules that
build a layer's layout and run its first forward on the eager backend (``comfy_kitchen/tensor``,
``comfy_kitchen/backends/eager`` but for its rotary, neighbourhood-attention and AdaLN modules,
``registry.py``, ``constraints.py``, ``exceptions.py``, ``float_utils.py``), hashed together
(``digest``; ``tests/test_kitchen_releases.py`` recomputes it from the wheels).  Per group:

* ``formats``: the formats whose layout class the release's ``comfy_kitchen.tensor`` has; a
  layer of another format fails at load, where the layout is looked up by its name
  (``AttributeError: module 'comfy_kitchen.tensor' has no attribute '<layout>'``);
* ``by_name``: whether ``QuantizedTensor`` takes its layout by name, as ComfyUI hands it over.
  The releases before 0.2.0 take a class: every layer they build fails its first forward
  (``AttributeError: 'str' object has no attribute '__mro__'``);
* ``scale_cast``: whether its FP8 and NVFP4 layouts cast the per-tensor scale to F32 when they
  are built; 0.2.0 and before do not, and their dequantize refuses a scale stored in another
  dtype at the first forward (``NoCapableBackendError``);
* ``scale_to``: whether its NVFP4 dequantize converts the per-tensor scale before multiplying by
  it; up to 0.2.2 a missing one is multiplied as None (``TypeError``);
* ``six_bit``: whether its W4A8 layout stores 6-bit codes (3K/4 bytes a row).  The W4A8
  releases before 0.2.36 read any row as 4-bit codes (K = twice the row's bytes), and their
  eager linear refuses a 6-bit layer at its first forward;
* ``int8_checks``: whether its INT8 linear checks the input's K and the scale's length before
  computing; 0.2.11 to 0.2.13 do not, and fail inside the computation in torch's words
  (``kitchen_int8.unchecked_int8_linear``).

Otherwise a release's verdict is 0.2.40's (``targets.kitchen``), as running each group on every
format's valid layer shows (``tests/test_kitchen_releases_run.py``).  No torch: ``check`` reads
these tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .base import LAYER, Verdict, Violation
from .dialect_failures import DialectViolation
from .releases import ReleasedVerdict, chosen_dicts, failure, first_loading, layer_classes, marker_reading, select, summary
from .releases import group_of as shared_group_of

LAYOUTS: dict[str, str] = {
    "float8_e4m3fn": "TensorCoreFP8Layout",
    "float8_e5m2": "TensorCoreFP8Layout",
    "nvfp4": "TensorCoreNVFP4Layout",
    "mxfp8": "TensorCoreMXFP8Layout",
    "awq_w4a16": "TensorCoreAWQW4A16Layout",
    "svdquant_w4a4": "TensorCoreSVDQuantW4A4Layout",
    "int8_tensorwise": "TensorWiseINT8Layout",
    "convrot_w4a4": "TensorCoreConvRotW4A4Layout",
    "asym_w4a8_int8": "AsymW4A8Int8Layout",
}
"""The layout class comfy-kitchen builds for each format (the name ComfyUI hands it over by)."""

FP8 = ("float8_e4m3fn", "float8_e5m2", "nvfp4")
MX = (*FP8, "mxfp8")
AWQ = (*MX, "awq_w4a16", "svdquant_w4a4")
INT8 = (*AWQ, "int8_tensorwise")
W4A4 = (*INT8, "convrot_w4a4")
W4A8 = (*W4A4, "asym_w4a8_int8")


class ReleaseGroup(NamedTuple):
    """Releases whose deciding code is byte-identical, and what they do differently from 0.2.40
    (a named tuple: check imports this module, and must start without ``dataclasses``)."""

    releases: tuple[str, ...]
    digest: str
    """The first 12 hex digits of SHA-256 over the deciding modules (path and bytes, in path order)."""
    formats: tuple[str, ...]
    """The formats whose layout the release has."""
    by_name: bool = True
    """False: ``QuantizedTensor`` takes a layout class, not the name ComfyUI gives."""
    six_bit: bool = False
    """True: its W4A8 layout stores 6-bit codes too."""
    scale_cast: bool = True
    """True: its FP8 and NVFP4 layouts cast the per-tensor scale to F32 when they are built;
    False: the dequantize refuses a scale stored otherwise."""
    scale_to: bool = True
    """True: its NVFP4 dequantize converts the per-tensor scale (``.to``) before multiplying;
    False: it multiplies a missing one as None."""
    int8_checks: bool = True
    """True: its INT8 linear checks the input's K and the scale's length first; False: the
    computation fails where they do not fit."""

    @property
    def first(self) -> str:
        return self.releases[0]

    @property
    def name(self) -> str:
        return self.releases[0] if len(self.releases) == 1 else f"{self.releases[0]}-{self.releases[-1]}"

    def to_dict(self) -> dict:
        return {"releases": list(self.releases), "digest": self.digest, "formats": list(self.formats)}


def _g(
    releases: str,
    digest: str,
    formats: tuple[str, ...],
    by_name: bool = True,
    six_bit: bool = False,
    cast: bool = True,
    to: bool = True,
    checks: bool = True,
) -> ReleaseGroup:
    return ReleaseGroup(tuple(releases.split()), digest, formats, by_name, six_bit, cast, to, checks)


GROUPS: tuple[ReleaseGroup, ...] = (
    _g("0.1.2 0.1.3", "de60d5f645a3", FP8, by_name=False, cast=False, to=False),
    _g("0.1.4", "89308aecd409", FP8, by_name=False, cast=False, to=False),
    _g("0.1.5 0.1.6", "3591dd75e80b", FP8, by_name=False, cast=False, to=False),
    _g("0.2.0", "719334a40537", FP8, cast=False, to=False),
    _g("0.2.1", "562c881a5790", FP8, to=False),
    _g("0.2.2", "054bacc51a6d", FP8, to=False),
    _g("0.2.3 0.2.4", "c307c71de66f", FP8),
    _g("0.2.5", "bf90b45e346c", FP8),
    _g("0.2.6", "113d21d762be", FP8),
    _g("0.2.7", "c33cbb0a28a8", FP8),
    _g("0.2.8", "0aee453efde9", MX),
    _g("0.2.9", "9bd7304a63a7", AWQ),
    _g("0.2.10", "433bb97acc9e", AWQ),
    _g("0.2.11 0.2.12", "ee9a42c6bc28", INT8, checks=False),
    _g("0.2.13", "d925b3fc8b91", INT8, checks=False),
    _g("0.2.14", "1d833d5573cd", INT8),
    _g("0.2.15 0.2.16", "25ae0ecef9d2", INT8),
    _g("0.2.17 0.2.18", "4984e4063d07", W4A4),
    _g("0.2.19 0.2.20 0.2.21 0.2.22", "75b38e47cfe1", W4A4),
    _g("0.2.23 0.2.24 0.2.25 0.2.26", "0ecb6dbea08b", W4A4),
    _g("0.2.27", "d040069faba8", W4A8),
    _g("0.2.28 0.2.30 0.2.31", "84b47a24c424", W4A8),
    _g("0.2.32", "93ac35a1f14a", W4A8),
    _g("0.2.33", "a53490724fa2", W4A8),
    _g("0.2.34 0.2.35", "696b5ee973e2", W4A8),
    _g("0.2.36", "fe70bb6327ae", W4A8, six_bit=True),
    _g("0.2.37", "c5c56344bae1", W4A8, six_bit=True),
    _g("0.2.38 0.2.39", "553f621ad2d0", W4A8, six_bit=True),
    _g("0.2.40", "81c6b0e22f5b", W4A8, six_bit=True),
)
"""Every group, oldest first: every comfy-kitchen release on the package index (0.2.29 was
never published)."""

RELEASES: tuple[str, ...] = tuple(r for g in GROUPS for r in g.releases)
NEWEST = GROUPS[-1]


def group_of(release: str) -> ReleaseGroup:
    """The group of one release; LookupError names the known ones."""
    return shared_group_of("comfy-kitchen", GROUPS, release)


def first_running(fmt: str) -> ReleaseGroup | None:
    """The oldest group from which every later one has ``fmt``'s layout and builds it by name
    (None: the newest does not); for W4A8 stored 6-bit, pass ``asym_w4a8_int8/6-bit``."""
    first = None
    base, _, six = fmt.partition("/")
    for g in GROUPS:
        runs = base in g.formats and g.by_name and (not six or g.six_bit)
        if not runs:
            first = None
        elif first is None:
            first = g
    return first


# -- selection ----------------------------------------------------------------------------------


def selected_releases(spec: tuple[str, str] | None) -> tuple[str, ...]:
    """The releases a spec names, oldest first (all for None); none is refused in one line."""
    return select("comfy-kitchen", RELEASES, spec)


# -- verdicts per release -----------------------------------------------------------------------


_LACKING: dict[str, list[Violation]] = {}


def _lacking(fmt: str) -> list[Violation]:
    """The load template of a layer of ``fmt`` in a release without its layout (made once)."""
    if fmt not in _LACKING:
        _LACKING[fmt] = [_lacking_violation(fmt)]
    return _LACKING[fmt]


def _lacking_violation(fmt: str) -> Violation:
    first = first_running(fmt)
    fix = f"load it with comfy-kitchen {first.first} or newer" if first else "convert the layer (comfyquant convert)"
    return Violation(
        "comfy-kitchen.release",
        f"module 'comfy_kitchen.tensor' has no attribute '{LAYOUTS[fmt]}'",
        "AttributeError",
        LAYER,
        "comfy_quant",
        True,
        f"this comfy-kitchen release has no {LAYOUTS[fmt]} ({fmt})",
        fix,
    )


BY_CLASS = Violation(
    "comfy-kitchen.release",
    "'str' object has no attribute '__mro__'",
    "AttributeError",
    LAYER,
    None,
    True,
    "comfy-kitchen before 0.2.0 takes a layout class, not the layout name ComfyUI hands over",
    "load it with comfy-kitchen 0.2.0 or newer",
)
"""What the first forward of any layer a release before 0.2.0 builds raises."""
_BY_CLASS = [BY_CLASS]


def four_bit_template(marker: dict, tensors: dict) -> Violation | None:
    """What the first forward of a W4A8 layer raises in a release that reads only 4-bit codes,
    where 0.2.40 reads it otherwise: its eager linear takes K as twice the row's bytes and
    refuses that K, or the group scales' shape, in its own words (None: it refuses neither, as
    for a layer stored 4-bit)."""
    from .kitchen import marker_ints

    w, s_rel = tensors.get("weight"), tensors.get("weight_s_rel")
    if w is None or s_rel is None or len(w.shape) != 2 or len(s_rel.shape) != 2:
        return None
    read, refused = marker_ints("asym_w4a8_int8", marker)
    group_size, convrot = read.get("group_size", 16), read.get("convrot_groupsize", 256)
    if refused is not None or not isinstance(group_size, int) or not isinstance(convrot, int) or group_size <= 0 or convrot == 0:
        return None  # the marker's own errors decide (a negative size divides as Python's modulo does)
    n, row = w.shape
    k = 2 * row
    if group_size < 4 or k % 16 or k % group_size or k % convrot or (16 % group_size and group_size % 16):
        message = (
            f"K={k} must be divisible by 16, group_size={group_size}, and convrot_groupsize={convrot}; "
            f"group_size must be >=4 and divide 16 or be a multiple of 16"
        )
    elif tuple(s_rel.shape) != (n, k // group_size):
        message = f"s_rel must have shape {(n, k // group_size)}, got {tuple(s_rel.shape)}"
    else:
        return None
    first = first_running("asym_w4a8_int8/6-bit")
    return Violation(
        "comfy-kitchen.release",
        message,
        "ValueError",
        LAYER,
        "weight",
        True,
        f"this comfy-kitchen release reads every W4A8 row as 4-bit codes (K = 2 x {row} bytes), with no 6-bit storage",
        f"load it with comfy-kitchen {first.first if first else NEWEST.first} or newer, or re-quantize 4-bit (comfyquant fix --allow-lossy)",
    )


UNCAST: dict[str, tuple[str, str, str]] = {
    "float8_e4m3fn": ("dequantize_per_tensor_fp8", "scale", "weight_scale"),
    "float8_e5m2": ("dequantize_per_tensor_fp8", "scale", "weight_scale"),
    "nvfp4": ("dequantize_nvfp4", "per_tensor_scale", "weight_scale_2"),
}
"""Format -> (the op of its first forward, its per-tensor scale operand, the tensor holding it)."""
_UNCAST: dict[tuple[str, str | None], list[Violation]] = {}


def _uncast_scale(group: ReleaseGroup, name: str, scale, forward: list[Violation]) -> list[Violation] | None:
    """What the first forward of an FP8 or NVFP4 layer raises in a release whose layout does not
    cast its per-tensor scale (the op checks its operands' dtypes in turn, 0.2.40's first dtype
    violation first, the scale F32 only), or whose NVFP4 dequantize multiplies a missing scale."""
    if forward and forward[0].rule == "comfy-kitchen.dtype":
        return None
    op, operand, suffix = UNCAST[name]
    dtype = None if scale is None else scale.dtype
    if dtype is None and (name != "nvfp4" or group.scale_to):
        return None
    if dtype is not None and (dtype == "F32" or group.scale_cast):
        return None
    key = (name, dtype)
    if key not in _UNCAST:
        from .torch_text import TORCH_DTYPES

        fix = f"store {suffix} as F32 (comfyquant fix), or load it with comfy-kitchen 0.2.1 or newer"
        if dtype is None:
            v = Violation(
                "comfy-kitchen.release",
                "unsupported operand type(s) for *: 'NoneType' and 'Tensor'",
                "TypeError",
                LAYER,
                suffix,
                True,
                f"{suffix} is missing: comfy-kitchen 0.2.2 and before multiply by it as None",
                "re-export the layer with all its tensors",
            )
        else:
            v = Violation(
                "comfy-kitchen.release",
                f"No backend can handle '{op}': eager: {operand}: dtype torch.{TORCH_DTYPES.get(dtype, dtype)} "
                "not in {torch.float32}",
                "NoCapableBackendError",
                LAYER,
                suffix,
                True,
                f"{suffix} stored as {dtype}: comfy-kitchen 0.2.0 and before do not cast the per-tensor scale to F32",
                fix,
            )
        _UNCAST[key] = [v]
    return _UNCAST[key]


class Facts:
    """What the file holds that the releases differ on, read once per check: the kitchen
    formats of its marked layers, and whether a W4A8 layer is one a release reading only 4-bit
    codes refuses (``six``: stored 6-bit, or of a row 0.2.40 reads otherwise), whether an FP8
    or NVFP4 per-tensor scale is stored other than F32 (``uncast``), whether an NVFP4 one is
    missing (``unscaled``) and whether an INT8 layer fails the releases whose INT8 linear runs
    unchecked (``unchecked``)."""

    __slots__ = ("formats", "six", "uncast", "unscaled", "unchecked")

    def __init__(self, ckpt) -> None:
        from .kitchen import python_json_markers

        formats: set[str] = set()
        six = uncast = unscaled = unchecked = False
        # one layer per class (the rules below read only its marker and tensors), and the layers
        # comfy-kitchen is handed with a marker only Python's json reads (``kitchen.marked_layers``)
        marked: list[tuple[Any, dict, str]] = [(c.layer, c.marker, c.format) for c in layer_classes(ckpt)]
        if marker_reading(ckpt).refused_tensor:
            for prefix, marker in python_json_markers(ckpt).items():
                layer = ckpt.layers.get(prefix)
                name = marker.get("format")
                if layer is not None and layer.marker is None and isinstance(name, str):
                    marked.append((layer, marker, name))
        for layer, marker, name in marked:
            formats.add(name)
            if name in UNCAST:
                scale = layer.tensors.get(UNCAST[name][2])
                uncast = uncast or (scale is not None and scale.dtype != "F32")
                unscaled = unscaled or (scale is None and name == "nvfp4")
            elif name == "asym_w4a8_int8" and not six:
                six = ckpt.memo.get(
                    "comfy-kitchen.release.four", marker, layer, lambda m=marker, lay=layer: four_bit_template(m, lay.tensors)
                ) is not None  # fmt: skip
            elif name == "int8_tensorwise" and not unchecked:
                unchecked = _unchecked(ckpt, marker, layer) is not None
        self.formats = frozenset(formats)
        self.six = six
        self.uncast = uncast
        self.unscaled = unscaled
        self.unchecked = unchecked

    def key(self, group: ReleaseGroup) -> tuple:
        """What the group's verdict on this file depends on: groups of one key share it."""
        lacking = frozenset(f for f in self.formats & LAYOUTS.keys() if f not in group.formats)
        by_name = group.by_name or not (self.formats & set(group.formats))
        four_bit = self.six and "asym_w4a8_int8" in group.formats and not group.six_bit
        uncast = (self.uncast and not group.scale_cast, self.unscaled and not group.scale_to)
        unchecked = self.unchecked and "int8_tensorwise" in group.formats and not group.int8_checks
        return (lacking, by_name, four_bit, uncast, unchecked)


def _unchecked(ckpt, marker: dict, layer) -> Violation | None:
    """``unchecked_int8_linear`` of a layer, once per layer class."""
    from .kitchen import marker_ints
    from .kitchen_int8 import unchecked_int8_linear

    def made() -> Violation | None:
        read, refused = marker_ints("int8_tensorwise", marker)
        return None if refused is not None else unchecked_int8_linear("comfy-kitchen.release", read, layer.tensors)

    return ckpt.memo.get("comfy-kitchen.release.int8", marker, layer, made)


def _adjuster(group: ReleaseGroup, ckpt) -> Callable:
    def adjust(name: str, marker: dict, layer, load: list, forward: list) -> tuple[list, list]:
        if name in LAYOUTS and name not in group.formats:
            # the marker's sizes are read (int()) before the layout is looked up
            return (load, []) if load and load[0].rule == "comfy-kitchen.marker" else (_lacking(name), [])
        if not group.by_name and name in LAYOUTS:
            return load, [] if any(v.blocking for v in load) else _BY_CLASS
        if name in UNCAST and not (group.scale_cast and group.scale_to) and not any(v.blocking for v in load):
            uncast = _uncast_scale(group, name, layer.tensors.get(UNCAST[name][2]), forward)
            if uncast is not None:
                return load, uncast
        if name == "asym_w4a8_int8" and not group.six_bit and not any(v.blocking for v in load):
            # the op's operand dtypes are checked before its geometry
            if forward and forward[0].rule == "comfy-kitchen.dtype":
                return load, forward
            four = ckpt.memo.get("comfy-kitchen.release.four", marker, layer, lambda: four_bit_template(marker, layer.tensors))
            if four is not None:
                return load, [four]
        if name == "int8_tensorwise" and not group.int8_checks and not any(v.blocking for v in load):
            # the op's operand dtypes are checked before the linear runs
            if forward and forward[0].rule == "comfy-kitchen.dtype":
                return load, forward
            unchecked = _unchecked(ckpt, marker, layer)
            if unchecked is not None:
                return load, [unchecked]
        return load, forward

    return adjust


def release_verdict(group: ReleaseGroup, ckpt, newest: Verdict) -> Verdict:
    """The group's verdict: 0.2.40's rules with the group's layer templates (``_adjuster``), and
    the dialect violations ``check`` adds to 0.2.40's verdict, placed as it places them."""
    from .kitchen import kitchen_verdict

    own = kitchen_verdict(ckpt, _adjuster(group, ckpt)).violations
    whole, rest = _dialect_extra(newest)
    if whole:
        at = next((i for i, v in enumerate(own) if v.file is None), len(own))
        own[at:at] = whole
    own.extend(rest)
    return Verdict("comfy-kitchen", own, newest.architecture)


def _dialect_extra(newest: Verdict) -> tuple[list[Violation], list[Violation]]:
    """The dialect violations of 0.2.40's verdict: those that stop the whole file (placed after
    the file's own), and the others (placed last)."""
    extra: list[Violation] = [v for v in newest.violations if isinstance(v, DialectViolation)]
    whole = [v for v in extra if v.blocking and v.layer is None]
    return whole, [v for v in extra if not (v.blocking and v.layer is None)]


class GroupVerdict:
    """A group's verdict worked out as far as it is read: what the release fails with
    (``first``, ``loads``) from the layers' templates, finding the first failing layer in module
    order without ordering them all; every violation (``violations``) only when a release spec
    shows this group's verdict (``release_verdict``)."""

    __slots__ = ("target", "architecture", "_group", "_ckpt", "_newest", "_violations", "_first", "_known")

    def __init__(self, group: ReleaseGroup, ckpt, newest: Verdict) -> None:
        self.target = "comfy-kitchen"
        self.architecture = newest.architecture
        self._group, self._ckpt, self._newest = group, ckpt, newest
        self._violations: list[Violation] | None = None
        self._first: Violation | None = None
        self._known = False

    @property
    def violations(self) -> list[Violation]:
        if self._violations is None:
            self._violations = release_verdict(self._group, self._ckpt, self._newest).violations
        return self._violations

    @property
    def first(self) -> Violation | None:
        if not self._known:
            self._first = self._find_first()
            self._known = True
        return self._first

    @property
    def loads(self) -> bool:
        return self.first is None

    def to_dict(self) -> dict:
        return Verdict(self.target, self.violations, self.architecture).to_dict()

    def _find_first(self) -> Violation | None:
        """``release_verdict``'s first blocking violation: the file's own and the dialects'
        whole-file ones, then the least failing layer's at load, then at the first forward,
        then the dialects' per-layer ones; with none, the first silent error of the whole verdict."""
        from .base import bind, container_violations, least_in_module_order
        from .kitchen import layer_templates

        whole, rest = _dialect_extra(self._newest)
        head = container_violations("comfy-kitchen", self._ckpt)
        at = next((i for i, v in enumerate(head) if v.file is None), len(head))
        found = next((v for v in head[:at] + whole + head[at:] if v.blocking), None)
        if found is not None:
            return found
        load: dict[str, list[Violation]] = {}
        forward: dict[str, list[Violation]] = {}
        for prefix, loading, running in layer_templates(self._ckpt, _adjuster(self._group, self._ckpt)):
            if any(v.blocking for v in loading):
                load[prefix] = loading
            if any(v.blocking for v in running):
                forward[prefix] = running
        for failing in (load, forward):
            if failing:
                layer = least_in_module_order(list(failing))[0]
                return next(v for v in bind(failing[layer], layer) if v.blocking)
        found = next((v for v in rest if v.blocking), None)
        if found is not None:
            return found
        return Verdict(self.target, self.violations).first


class Releases:
    """The file's verdict on each comfy-kitchen release group, oldest first, and the releases a
    target selects."""

    __slots__ = ("verdicts", "selected")

    def __init__(self, verdicts: list[tuple[ReleaseGroup, Verdict | GroupVerdict]], selected: tuple[str, ...]) -> None:
        self.verdicts = verdicts
        self.selected = selected

    @property
    def chosen(self) -> list[tuple[ReleaseGroup, tuple[str, ...], Verdict | GroupVerdict]]:
        """The groups with a selected release, with only those releases."""
        chosen = set(self.selected)
        out = []
        for group, verdict in self.verdicts:
            mine = tuple(r for r in group.releases if r in chosen)
            if mine:
                out.append((group, mine, verdict))
        return out

    @property
    def runs(self) -> list[tuple[tuple[str, ...], bool, Verdict | GroupVerdict]]:
        return [(group.releases, v.loads, v) for group, v in self.verdicts]

    @property
    def first_loading(self) -> str | None:
        """The first release of the newest run of releases that load the file (None: 0.2.40 does not)."""
        return first_loading(self.runs)

    def lines(self) -> list[str]:
        """``loads from comfy-kitchen 0.2.27 on; fails before: AttributeError: ...`` and the
        releases where it stopped or started loading before."""
        return summary("comfy-kitchen", self.runs, self.selected, failure)

    def to_dict(self) -> dict:
        return {
            "first_loading": self.first_loading,
            "summary": self.lines(),
            "releases": chosen_dicts(self.chosen),
        }


def releases_for(ckpt, newest: Verdict, spec: tuple[str, str] | None) -> Releases:
    """The file's verdict on every group (``newest``: 0.2.40's, shared by every group whose
    differences the file does not meet), and the releases ``spec`` selects."""
    selected = selected_releases(spec)
    facts = Facts(ckpt)
    plain = facts.key(NEWEST)
    memo: dict[tuple, Verdict | GroupVerdict] = {plain: newest}
    verdicts = []
    for group in GROUPS:
        key = facts.key(group)
        verdict = memo.get(key)
        if verdict is None:
            verdict = memo[key] = GroupVerdict(group, ckpt, newest)
        verdicts.append((group, verdict))
    return Releases(verdicts, selected)


def released(newest: Verdict, releases: Releases) -> ReleasedVerdict:
    """The verdict a check reports: 0.2.40's by default, the newest selected release's for a
    spec, carrying the file's verdict on every release."""
    last = newest if releases.selected == RELEASES else releases.chosen[-1][2]
    out = ReleasedVerdict(last.target, last.violations, last.architecture)
    out.releases = releases
    return out
