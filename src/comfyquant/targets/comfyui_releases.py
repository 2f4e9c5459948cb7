"""ComfyUI's releases as groups that load quantized files alike, and each group's facts.

A group is a run of releases whose deciding code (the definitions of ComfyUI's single-layer
loading path in ``comfy/quant_ops.py``, ``comfy/float.py``, ``comfy/ops.py``,
``comfy/utils.py``, ``comfy/sd.py``, ``comfy/model_detection.py``,
``comfy/model_management.py`` and ``BaseModel.load_model_weights``) is byte-identical and
which name the same comfy-kitchen: ``fingerprint`` is the digest of that code, and
``tests/test_comfyui_releases.py`` recomputes every group from the releases' sources.  Per
group: the comfy-kitchen it runs with (``==`` a pin; ``>=`` a minimum, the release then runs
with whatever newer one is installed; none before 0.8.0, whose layouts are ComfyUI's own), the
marker forms it reads, the formats its ``QUANT_ALGOS`` (``QUANT_FORMAT_MIXINS`` in 0.3.68)
knows, and what it raises on a layer of a format it does not know, as running the release
raised it.  No torch: ``check`` reads these tables.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial

from .base import Verdict, Violation, module_order, outcome
from .base import least_in_module_order as _least
from .comfyui_model import CUT_ON_CPU, NEWEST_READING, WHOLE_MODEL, Reading
from .comfyui_plain import plain_size
from .releases import ReleasedVerdict as SharedReleasedVerdict
from .releases import chosen_dicts, failure, layer_classes, marker_reading, select, split_release, summary, version_key  # noqa: F401 (split_release, version_key: named here too)
from .releases import first_loading as first_loading_of
from .releases import group_of as shared_group_of

HEADER = "header map"
TENSOR = ".comfy_quant tensors"

FP8 = ("float8_e4m3fn",)
KITCHEN_08 = (*FP8, "float8_e5m2", "nvfp4")
MX = (*KITCHEN_08, "mxfp8")
INT8 = (*MX, "int8_tensorwise")
W4A4 = (*INT8, "convrot_w4a4")
W4A8 = (*W4A4, "asym_w4a8_int8")


class ReleaseGroup:
    """Releases that load every file alike (see the module docstring)."""

    __slots__ = ("releases", "kitchen", "pinned", "markers", "formats", "unknown", "fingerprint")

    def __init__(
        self,
        releases: tuple[str, ...],
        kitchen: str | None,
        pinned: bool,
        markers: tuple[str, ...],
        formats: tuple[str, ...],
        unknown: tuple[str, str],
        fingerprint: str,
    ) -> None:
        self.releases = releases
        self.kitchen = kitchen
        """The comfy-kitchen release its requirements name (None: it runs without one)."""
        self.pinned = pinned
        """True: ``kitchen`` is pinned exactly; False: a minimum (``comfy-kitchen>=``)."""
        self.markers = markers
        self.formats = formats
        self.unknown = unknown
        """(exception, message with ``{format}``) raised loading a layer of a format it lacks."""
        self.fingerprint = fingerprint

    @property
    def first(self) -> str:
        return self.releases[0]

    @property
    def kitchen_text(self) -> str:
        """``comfy-kitchen 0.2.31``, ``comfy-kitchen >= 0.2.8`` or ``no comfy-kitchen``."""
        if self.kitchen is None:
            return "no comfy-kitchen"
        return f"comfy-kitchen {self.kitchen}" if self.pinned else f"comfy-kitchen >= {self.kitchen}"

    def to_dict(self) -> dict:
        return {
            "releases": list(self.releases),
            "comfy_kitchen": self.kitchen,
            "comfy_kitchen_pinned": self.pinned,
            "markers": list(self.markers),
            "formats": list(self.formats),
        }


_KEY_ERROR = ("KeyError", "'{format}'")
_BOTH = (HEADER, TENSOR)


def _g(releases: str, kitchen: str | None, pinned: bool, markers, formats, fingerprint: str, unknown=_KEY_ERROR) -> ReleaseGroup:
    return ReleaseGroup(tuple(releases.split()), kitchen, pinned, markers, formats, unknown, fingerprint)


GROUPS: tuple[ReleaseGroup, ...] = (
    _g("0.3.68", None, False, (HEADER,), FP8, "62d40d12b89a207f"),
    _g("0.3.76", None, False, (HEADER,), FP8, "8d3c02a3b6781a69"),
    _g("0.4.0", None, False, _BOTH, FP8, "3499a3812164e407"),
    _g("0.5.1 0.6.0 0.7.0", None, False, _BOTH, FP8, "a4eb2c1591de6acf"),
    _g("0.8.2", "0.2.5", False, _BOTH, KITCHEN_08, "a64f879f48591f72"),
    _g("0.9.2", "0.2.6", False, _BOTH, KITCHEN_08, "549a8526895e4795"),
    _g("0.10.0", "0.2.7", False, _BOTH, KITCHEN_08, "e8b317d976f4e7bc"),
    _g("0.11.1", "0.2.7", False, _BOTH, KITCHEN_08, "5dcd76961cfb4168"),
    _g("0.12.3", "0.2.7", False, _BOTH, KITCHEN_08, "0ac8bb354270afd8"),
    _g("0.13.0", "0.2.7", False, _BOTH, KITCHEN_08, "7ab5be75e6edfb0b"),
    _g("0.14.1", "0.2.7", False, _BOTH, KITCHEN_08, "b327cff035c20fca"),
    _g("0.15.1", "0.2.7", False, _BOTH, KITCHEN_08, "6e5fbc15b0768955"),
    _g("0.16.4", "0.2.7", False, _BOTH, KITCHEN_08, "d18b57e6c8942340"),
    _g("0.17.0", "0.2.8", False, _BOTH, KITCHEN_08, "aeca95f77f343fcd"),
    _g("0.18.1", "0.2.8", False, _BOTH, MX, "f31a16115e09dd2b"),
    _g("0.19.3", "0.2.8", False, _BOTH, MX, "874ecebfcf81729f"),
    _g("0.20.1", "0.2.8", False, _BOTH, MX, "430b5fee341444c8"),
    _g("0.21.1", "0.2.8", False, _BOTH, MX, "15f9ad4cc11cbed3"),
    _g("0.22.0", "0.2.8", False, _BOTH, MX, "dfb1027486b6a3d4"),
    _g("0.23.0 0.24.0", "0.2.10", True, _BOTH, MX, "2f81e12beb743f4d"),
    _g("0.25.0 0.26.0", "0.2.10", True, _BOTH, MX, "0cd051fc7f2f8777"),
    _g("0.27.0", "0.2.16", True, _BOTH, INT8, "477328e3afe0ce1d"),
    _g("0.28.0", "0.2.20", True, _BOTH, W4A4, "5c483ab14eee092b"),
    _g("0.29.0", "0.2.22", True, _BOTH, W4A4, "f0415ee279840023"),
    _g("0.30.0", "0.2.26", True, _BOTH, W4A4, "db4e1ee0d00038e2"),
    _g("0.31.0", "0.2.28", True, _BOTH, W4A8, "f4ba3c38cb6dca1e"),
    _g("0.32.0", "0.2.30", True, _BOTH, W4A8, "94f61ca080016b61"),
    _g("0.33.0", "0.2.31", True, _BOTH, W4A8, "ce01bc8f777c3a53"),
)
"""Every group, oldest first: the releases 0.3.68 (the first that reads
``_quantization_metadata``) to 0.33.0."""

RELEASES: tuple[str, ...] = tuple(r for g in GROUPS for r in g.releases)
NEWEST = GROUPS[-1]


def group_of(release: str) -> ReleaseGroup:
    """The group of one release; LookupError names the known ones."""
    return shared_group_of("ComfyUI", GROUPS, release)


# -- selection ----------------------------------------------------------------------------------


def selected_releases(spec: tuple[str, str] | None) -> tuple[str, ...]:
    """The releases a spec names, oldest first (all for None); none is refused in one line."""
    return select("ComfyUI", RELEASES, spec)


# -- verdicts per release -----------------------------------------------------------------------

DIFFUSION_PREFIX = "model.diffusion_model."


def _bare(prefix: str) -> str:
    return prefix[len(DIFFUSION_PREFIX) :] if prefix.startswith(DIFFUSION_PREFIX) else prefix


def marked_formats(ckpt) -> tuple[dict[str, object], dict[str, object], dict[str, dict]]:
    """(header map, tensor markers, markers read): each layer's ``format`` as each marker form
    gives it, and each layer's marker as ComfyUI reads it (the header map's replacing the
    tensor's), keyed by the layer's name without the diffusion-model prefix (ComfyUI matches
    both), from the check's one pass over the markers (``releases.marker_reading``).  A tensor
    marker is read as Python's ``json`` reads it (``NaN`` and ``Infinity`` in it, which
    comfyquant refuses, still make an object); a marker that is not an object still marks its
    layer, and a header entry that is not one still replaces the layer's tensor marker (ComfyUI
    writes it into the layer's marker tensor and fails parsing it as the layer loads): their
    format is None."""
    found = marker_reading(ckpt)
    if not found.odd:
        return found.header, found.tensor, found.objects
    header: dict[str, object] = dict(found.header)  # the shared reading stays as it is
    tensor: dict[str, object] = dict(found.tensor)
    objects = dict(found.objects)
    for rec in ckpt.markers.records:
        if isinstance(rec.obj, dict):
            continue
        prefix = _bare(rec.prefix)
        if rec.kind == "header":
            header[prefix] = None
            objects.pop(prefix, None)
        else:
            tensor.setdefault(prefix, None)
    if found.refused_tensor:
        from .kitchen import python_json_markers

        for full, obj in python_json_markers(ckpt).items():
            prefix = _bare(full)
            tensor[prefix] = obj.get("format")
            if prefix not in found.header:
                objects[prefix] = obj
    return header, tensor, objects


def _formats(values) -> tuple[set, bool]:
    """The formats among marker values that may be any JSON value (unhashable ones included),
    and whether every value is one."""
    try:
        found = set(values)
    except TypeError:  # a list or an object among them
        return {f for f in values if isinstance(f, str)}, False
    named = {f for f in found if isinstance(f, str)}
    return named, len(named) == len(found)


def first_knowing(fmt: str) -> ReleaseGroup | None:
    """The oldest group whose ComfyUI knows ``fmt`` (None: no release does)."""
    return next((g for g in GROUPS if fmt in g.formats), None)


class Marked:
    """The file's markers as ComfyUI's releases read them, worked out once per check: each
    layer's format with both marker forms (the header map's replacing the tensor's) and with
    the header map alone, the formats each names, and the layers a tensor alone marks."""

    __slots__ = (
        "both",
        "header",
        "tensor",
        "objects",
        "both_formats",
        "header_formats",
        "exact",
        "exact_formats",
        "unread",
        "_whole",
        "_keys",
        "_load_order",
        "_last",
        "_firsts",
        "_done",
    )

    def __init__(self, ckpt) -> None:
        header, tensor, self.objects = marked_formats(ckpt)
        """``objects``: each layer's marker as ComfyUI reads it (``marked_formats``)."""
        self.header = header
        self.tensor = tensor
        self.both = {**tensor, **header} if header else tensor
        self.both_formats, every = _formats(self.both.values())
        self.header_formats, every_header = _formats(header.values())
        self._whole = {
            id(self.both): self.both_formats if every else None,
            id(header): self.header_formats if every_header else None,
        }
        """A read's formats when every value is a format (then a layer is named by its format alone)."""
        prefixed = marker_reading(ckpt).header_prefixed
        self.exact = {p: f for p, f in header.items() if p not in prefixed} if prefixed else header
        """The header map's entries a release reading only the map matches to a layer: those named
        as the loaded model names its layers, without the diffusion-model prefix (which the
        loader cuts from the tensors' names, not from the map's)."""
        self.exact_formats = self.header_formats
        self.unread = [p for p in tensor if p not in self.exact] if self.exact else list(tensor)
        """The layers such a release loads as plain ``Linear``s: those a tensor alone marks, and
        those only a prefixed map entry names."""
        if self.exact is not header:
            self.exact_formats, every_exact = _formats(self.exact.values())
            self._whole[id(self.exact)] = self.exact_formats if every_exact else None
            self.unread += [p for p in header if p in prefixed and p not in tensor and _layer(ckpt, p) is not None]
        self._keys: dict[str, tuple] = {}
        """Each layer's ``order`` key, made once per check and only when asked."""
        whole = ckpt.shared.get(WHOLE_MODEL)
        self._load_order: dict[str, int] = whole.registration if whole is not None else {}
        self._last: tuple[list[str], str, bool] | None = None
        """The names ``least`` was last asked about, its answer, and whether no other name ties it."""
        self._firsts: dict[tuple, str] = {}
        self._done: dict[Hashable, object] = {}
        """Results that do not depend on the release (``once``)."""

    def order(self, name: str) -> tuple:
        """Where the layer ``name`` loads: its place among the modules of the model ComfyUI
        builds, when the file is one it describes (``comfyui_model.WHOLE_MODEL``), then
        ``module_order(name)``; made once per check."""
        found = self._keys.get(name)
        if found is None:
            found = self._keys[name] = (self._load_order.get(name, len(self._load_order)), module_order(name))
        return found

    def least(self, names: list[str]) -> str:
        """The first of ``names`` in module order (the first listed of equals): the layers a
        tensor alone marks are often those of the first unknown format, asked again."""
        last = self._last
        if last is not None and last[0] == names:
            return last[1]
        if last is not None and last[2] and len(last[0]) == len(names) and set(last[0]).issuperset(names):
            return last[1]  # the same names in another order (the header map's and the tensors'): no tie decides
        found, alone = _least(names, self.order)
        self._last = (names, found, alone)
        return found

    def first(self, read: dict, formats: set) -> str:
        """The first layer, in module order, that ``read`` marks with one of ``formats``."""
        key = (id(read), frozenset(formats))
        found = self._firsts.get(key)
        if found is None:
            whole = self._whole.get(id(read))
            if whole is not None and whole <= formats:  # every layer it reads
                named = list(read)
            else:
                named = [p for p, f in read.items() if isinstance(f, str) and f in formats]  # a format may be any JSON value
            found = self._firsts[key] = self.least(named)
        return found

    def once(self, name: Hashable, make):
        """``make()``, worked out once per check (``name``: what it is of)."""
        if name not in self._done:
            self._done[name] = make()
        return self._done[name]

    def read(self, group: ReleaseGroup) -> tuple[dict, set]:
        if TENSOR not in group.markers:
            return self.exact, self.exact_formats
        if self.exact is not self.header and map_after_prefix(group):
            return self.once("after-prefix-read", self._after_prefix)
        return self.both, self.both_formats

    def _after_prefix(self) -> tuple[dict, set]:
        """Each layer's format as a release that folds the header map in after stripping the
        prefix reads it: the tensor markers, replaced by the map entries named without it."""
        read = {**self.tensor, **self.exact}
        formats, every = _formats(read.values())
        self._whole[id(read)] = formats if every else None
        return read, formats


def release_verdict(group: ReleaseGroup, marked: Marked, newest, ckpt):
    """What ComfyUI ``group`` does with the file whose verdict with ComfyUI 0.33.0 and
    comfy-kitchen 0.2.40 is ``newest``: the format it lacks on the first layer it loads raises
    its own error; a layer marked only by a tensor marker, which a release that reads only the
    header map does not see, loads its stored weight as a plain one; otherwise ``newest``
    (modelled: the releases' per-format messages are those of ComfyUI 0.33.0), with the W4A8
    first forward of the comfy-kitchen the release pins (``_pinned``)."""
    read, formats = marked.read(group)
    reading = _reading(group, marked, read, ckpt)
    if reading is not NEWEST_READING:
        newest = marked.once(reading, lambda: _read_otherwise(ckpt, newest, reading, marked, read))
    if group is NEWEST:  # it knows every format and reads both marker forms
        pinned = _pinned(group, ckpt, newest, read, formats, marked)
        return newest if pinned is None else Verdict("comfyui", pinned, newest.architecture)
    undetected = _undetected(group, ckpt, newest)
    if undetected is not None:
        return Verdict("comfyui", [*(v for v in newest.violations if v.file is not None), undetected], newest.architecture)
    built = bool(newest.architecture and newest.architecture.get("name"))
    base = _adjusted(group, newest.violations, read, built)
    event = _load_event(group, marked, read, formats, ckpt)
    if event is not None and event.layer is not None and not _precedes(_first(base), event.layer, marked):
        return Verdict("comfyui", [event], newest.architecture)
    out = []
    if TENSOR not in group.markers:
        if base is newest.violations:  # as every group meets it: worked out once per check and reading
            base = marked.once(("header-only", id(newest)), lambda: _header_only_map(ckpt, base))
        else:  # as this group's own code changed it
            base = _header_only_map(ckpt, base)
        first = _first(base)
        if first is not None and first.blocking and first.layer is None:  # reading the file or its map: before any layer
            return Verdict("comfyui", base, newest.architecture)
        indexed = next((v for v in base if v.rule == LAYERS_NOT_A_MAP), None)
        if indexed is not None:  # raised inside the loading of a layer: before torch's collected size mismatches
            return Verdict("comfyui", [*(v for v in base if v.file is not None), indexed], newest.architecture)
        if marked.unread:
            out.append(marked.once("unread", lambda: _unread(ckpt, marked)))
            plain = set(marked.unread)  # plain ``Linear``s: nothing the newest release does with their markers happens
            base = [v for v in base if v.layer is None or _bare(v.layer) not in plain]
        legacy = marked.once("legacy", lambda: _legacy_scales(ckpt))
        if legacy is not None:  # loading fails before any forward
            return Verdict("comfyui", [legacy], newest.architecture)
    for (release, fmt), error in FORWARD_ERRORS.items():
        if release != group.first or fmt not in formats:
            continue
        holder = next((p for p, f in read.items() if f == fmt and error[0] in _tensors(ckpt, p)), None)
        if holder is not None:
            out.append(Violation("comfyui.release", error[2], error[1], holder, error[0], True,
                                 f"ComfyUI {release} cannot run a {fmt} layer with {error[0]}",
                                 "load it with a newer ComfyUI release"))  # fmt: skip
    pinned = _pinned(group, ckpt, newest, read, formats, marked)
    return Verdict("comfyui", out + (base if pinned is None else pinned), newest.architecture)


MAP_BEFORE_PREFIX_FROM = "0.19.3"
"""The first group that folds the header map into the state dict before it strips the
diffusion-model prefix, and again after (``convert_old_quants`` twice in
``load_diffusion_model_state_dict``): a map entry names its layer with or without the prefix.
The groups from 0.4.0 fold it once, after stripping: an entry named with the prefix matches no
layer (its key is left over), and the map's keys play no part in choosing the prefix."""


def map_after_prefix(group: ReleaseGroup) -> bool:
    """Whether ``group`` folds the header map in only after stripping the prefix."""
    return TENSOR in group.markers and version_key(group.first) < version_key(MAP_BEFORE_PREFIX_FROM)


OWN_FP8 = frozenset({"0.3.68", "0.3.76", "0.4.0", "0.5.1"})
"""The groups whose FP8 layout is ComfyUI's own (no comfy-kitchen): on CPU it dequantizes the
stored weight whole, without cutting it to the model's size, so a weight stored padded or wider
than the model's layer meets the input at its stored size."""


def _reading(group: ReleaseGroup, marked: Marked, read: dict, ckpt) -> Reading:
    """How ``group`` reads the file where that changes the newest release's whole-model verdict
    (``NEWEST_READING``: it does not)."""
    after = TENSOR in group.markers and read is not marked.both  # a prefixed map entry matches no layer
    uncut = group.first in OWN_FP8 and _fp8_at_another_size(ckpt, read)
    if not after and not uncut:
        return NEWEST_READING
    cut = CUT_ON_CPU - {"float8_e4m3fn", "float8_e5m2"} if uncut else CUT_ON_CPU
    return Reading(after, cut)


def _fp8_at_another_size(ckpt, read: dict) -> bool:
    """Whether an FP8 layer's weight is stored at another size than the model ComfyUI 0.33.0
    builds gives it."""
    whole = ckpt.shared.get(WHOLE_MODEL)
    if whole is None or whole.model is None:
        return False
    for name, fmt in read.items():
        if fmt not in ("float8_e4m3fn", "float8_e5m2"):
            continue
        layer = _layer(ckpt, name)
        true = whole.linear(layer.prefix) if layer is not None else None
        w = layer.tensors.get("weight") if layer is not None else None
        if true is not None and w is not None and tuple(w.shape) != (true.n, true.k):
            return True
    return False


def _read_otherwise(ckpt, newest, reading: Reading, marked: Marked, read: dict) -> Verdict:
    """The newest release's verdict as a group that reads the file otherwise meets it
    (``comfyui.comfyui_verdict``), with the silent errors ``--deep`` added to ``newest`` from
    the tensors' values on the layers both read alike.  A layer a prefixed map entry alone
    marked loads its stored weight as a plain one; where ComfyUI describes no model, the size
    it is built at is the one the file records, and a weight of another width fails the first
    forward (``_unfit_forward``)."""
    from .comfyui import comfyui_verdict

    out = comfyui_verdict(ckpt, reading)
    changed = {p for p, f in marked.both.items() if p not in read or read[p] != f}
    out.violations.extend(
        v for v in newest.violations if v.rule.endswith(".values") and (v.layer is None or _bare(v.layer) not in changed)
    )
    whole = ckpt.shared.get(WHOLE_MODEL)
    if reading.map_after_prefix and (whole is None or whole.model is None):
        cause = "ComfyUI 0.4.0 to 0.18.1 match the header map's names after cutting the prefix from the tensors' names only"
        fix = "name the header map's layers without the model.diffusion_model. prefix, or load it with ComfyUI 0.19.3 or newer"
        for name in sorted((p for p in changed if p not in read), key=marked.order):
            unfit = _unfit_forward(ckpt, name, cause, fix)
            if unfit is not None:
                out.violations.append(unfit)
    return out


def _header_only_map(ckpt, violations: list[Violation]) -> list[Violation]:
    """``violations`` as a release that reads only the header map meets a malformed one: its
    model detection parses the map and raises ``ValueError: Invalid quantization metadata
    format`` unless it is an object with ``layers`` (before any layer loads, after the file
    opened); a ``layers`` of null leaves the model unquantized (nothing about the map fails)."""
    import json

    for hm in ckpt.markers.headers:
        if hm.error not in ("M011", "M012"):
            continue
        try:
            obj = json.loads(hm.raw)
        except (ValueError, RecursionError):
            continue
        kept = [v for v in violations if v.rule != "comfyui.header"]
        at = next((i for i, v in enumerate(kept) if v.file is None), len(kept))
        if not (isinstance(obj, dict) and "layers" in obj):
            refused = Violation("comfyui.release", "Invalid quantization metadata format", "ValueError", None, None, True,
                                "ComfyUI before 0.4.0 reads the header marker map only as an object with layers",
                                "rewrite the header markers (comfyquant fix)")  # fmt: skip
            return [*kept[:at], refused, *kept[at:]]
        layers = obj["layers"]
        if isinstance(layers, dict) and layers:
            return violations
        if not layers:  # null, empty, 0, false: no layer is quantized
            return kept
        return [*kept[:at], *_layers_not_a_map(ckpt, layers), *kept[at:]]
    return violations


LAYERS_NOT_A_MAP = "comfyui.release.layers"


def _layers_not_a_map(ckpt, layers) -> list[Violation]:
    """What a release before 0.4.0 raises on a header map whose ``layers`` is a non-empty value
    other than an object: its model detection counts the layers (``len()``: a number has none),
    then each layer as it loads asks whether its name is ``in`` the value and, if so, indexes the
    value by that name (a list or a string refuses a name as index); the first such layer in
    module order fails.  Nothing is raised where no layer's name is in it."""
    cause = "ComfyUI before 0.4.0 reads the header map's layers as an object of layer names"
    fix = "rewrite the header markers (comfyquant fix)"
    if not isinstance(layers, (list, str)):
        kind = type(layers).__name__
        return [Violation("comfyui.release", f"object of type '{kind}' has no len()", "TypeError", None, None, True, cause, fix)]
    named = [bare for p, layer in ckpt.layers.items() if "weight" in layer.tensors and (bare := _bare(p)) in layers]
    if not named:
        return []
    message = (
        "list indices must be integers or slices, not str"
        if isinstance(layers, list)
        else "string indices must be integers, not 'str'"
    )
    first = min(named, key=module_order)
    return [Violation(LAYERS_NOT_A_MAP, message, "TypeError", first, "comfy_quant", True, cause, fix)]


NORM_WEIGHT_FROM = "0.14.1"
"""The first group whose model detection takes Flux's attention norms stored as ``.weight`` as
well as ``.scale`` (the key it tests is ``double_blocks.0.img_attn.norm.key_norm.scale``
before it)."""

FLUX_NORM = "double_blocks.0.img_attn.norm.key_norm."


def _undetected(group: ReleaseGroup, ckpt, newest) -> Violation | None:
    """What detection raises in ``group`` on a file the newest release detects as Flux from
    norms stored as ``.weight`` (None: it detects the file as the newest does)."""
    arch = newest.architecture
    if arch is None or arch.get("name") != "flux" or version_key(group.first) >= version_key(NORM_WEIGHT_FROM):
        return None
    prefix = arch.get("prefix") or ""
    if prefix + FLUX_NORM + "scale" in ckpt.tensors or prefix + FLUX_NORM + "weight" not in ckpt.tensors:
        return None
    from ..architectures.registry import failure_message

    path = ckpt.paths[0] if ckpt.paths else ""
    return Violation("comfyui.detect", failure_message("ERROR: Could not detect model type of: {path}\n{hint}", path),
                     "RuntimeError", None, None, True,
                     f"ComfyUI before {NORM_WEIGHT_FROM} detects Flux only from attention norms stored as .scale; "
                     "this file stores them as .weight",
                     f"load it with ComfyUI {NORM_WEIGHT_FROM} or newer, or store the norms as .scale")  # fmt: skip


def _first(violations: list[Violation]) -> Violation | None:
    return Verdict("comfyui", violations).first


SMOOTHING_FROM = "0.30.0"
"""The first group that reads a layer's ``pre_quant_scale``; the older ones leave it unread
(``load_state_dict`` is not strict), so nothing about it can fail there."""

NO_WEIGHT_ATTRIBUTE = frozenset(
    {"0.9.2", "0.10.0", "0.11.1", "0.12.3", "0.13.0", "0.14.1", "0.15.1", "0.16.4", "0.17.0", "0.18.1"}
)
"""The groups whose quantized ``Linear`` returns from loading a layer without its weight before
setting any: its first forward raises ``'Linear' object has no attribute 'weight'``."""

SCALE_MULTIPLIED = {
    "0.3.68": "unsupported operand type(s) for *: 'Tensor' and 'NoneType'",
    "0.3.76": "mul_(): argument 'other' (position 1) must be Tensor, not NoneType",
    "0.4.0": "mul_(): argument 'other' (position 1) must be Tensor, not NoneType",
    "0.5.1": "mul_(): argument 'other' (position 1) must be Tensor, not NoneType",
}
"""The groups without comfy-kitchen, by first release: their own FP8 layout multiplies by the
weight scale as it dequantizes (0.3.68 with ``*``, later in place with ``mul_``), so a missing
``weight_scale`` fails the first forward with this ``TypeError``."""

NONE_DEVICE = "'NoneType' object has no attribute 'device'"


STORED_FP8_KEPT = frozenset({"0.3.76"})
"""The groups whose own FP8 layout takes a quantized layer's stored weight as it is, without the
cast to the format's dtype the others apply as they load it: FP8 codes of the other FP8 dtype
dequantize to their own values, so what that cast would change (``D008``) computes right."""


SCALE_IN_STATE_DICT = frozenset({"0.4.0", "0.5.1"})
"""The groups whose own FP8 layout returns its weight scale from the layer's ``state_dict``:
a missing one is None there, and building the whole model (``ModelPatcher`` counting its size
with ``module_size``) raises ``'NoneType' object has no attribute 'nelement'`` before any
forward."""


def _adjusted(group: ReleaseGroup, violations: list[Violation], read: dict, built: bool) -> list[Violation]:
    """The newest release's violations as ``group`` raises them where its own code differs
    (``SMOOTHING_FROM``, ``STORED_FP8_KEPT``, ``NO_WEIGHT_ATTRIBUTE``, ``SCALE_MULTIPLIED``, ``SCALE_IN_STATE_DICT``
    where ``built``: ComfyUI detects a model and builds it whole); the same list when nothing
    does."""
    if group is NEWEST or not violations:
        return violations
    out = []
    loading: list[Violation] = []  # raised as the whole model loads, after every load_state_dict error
    changed = False
    for v in violations:
        if v.tensor == "pre_quant_scale" and version_key(group.first) < version_key(SMOOTHING_FROM):
            changed = True
            continue
        if group.first in STORED_FP8_KEPT and _fp8_codes_cast(v):
            changed = True
            continue
        if group.first in NO_WEIGHT_ATTRIBUTE and v.rule == "comfyui.weight" and v.message == NONE_DEVICE:
            v = _reworded(
                v,
                "AttributeError",
                "'Linear' object has no attribute 'weight'",
                "the quantized Linear of ComfyUI 0.9.2 to 0.18.1 sets no weight for a layer the file has no weight for"
                + (", and loading the whole model reads every layer's weight" if built else ""),
            )
            changed = True
            if built:  # ModelPatcher.load reads each layer's weight after load_state_dict, before any forward
                v.stage = None
                loading.append(v)
                continue
        elif (
            group.first in SCALE_MULTIPLIED
            and v.rule == "comfyui.missing"
            and v.tensor == "weight_scale"
            and v.layer is not None
            and read.get(_bare(v.layer)) == "float8_e4m3fn"
        ):
            if built and group.first in SCALE_IN_STATE_DICT:  # counted as the whole model is built
                v = _reworded(
                    v,
                    "AttributeError",
                    "'NoneType' object has no attribute 'nelement'",
                    "the FP8 layout of ComfyUI 0.4.0 to 0.7.0 puts the missing weight scale in the model's state_dict, "
                    "whose size ComfyUI counts as it loads the model",
                )
            else:
                v = _reworded(
                    v,
                    "TypeError",
                    SCALE_MULTIPLIED[group.first],
                    "the FP8 layout of ComfyUI before 0.8.0 (no comfy-kitchen) multiplies by the missing weight scale",
                )
                v.stage = "forward"
            changed = True
        out.append(v)
    if loading:
        at = next((i for i, v in enumerate(out) if v.stage == "forward"), len(out))
        out[at:at] = loading
    return out if changed else violations


def _fp8_codes_cast(v: Violation) -> bool:
    """Whether ``v`` is the garbage of a weight stored as FP8 codes that the cast to its
    format's FP8 dtype changes (``--deep``'s ``D008`` on an ``F8_*`` weight)."""
    f = getattr(v, "covers", None)
    return f is not None and f.code == "D008" and (f.actual or "").startswith("F8_") and (f.expected or "").startswith("F8_")


def _reworded(v: Violation, exception: str, message: str, cause: str) -> Violation:
    out = Violation(v.rule, message, exception, v.layer, v.tensor, True, cause, v.fix, file=v.file)
    out.stage, out.covers = v.stage, v.covers
    return out


MISSING_WEIGHT_RAISES = frozenset({"0.3.68", "0.3.76", "0.4.0", "0.5.1", "0.8.2"})
"""The groups (by first release) whose quantized operations raise ``ValueError: Missing weight
for layer <name>`` loading a layer the file holds without its weight; later ones log it and
leave the weight None (the layer's first forward fails)."""


def _load_event(group: ReleaseGroup, marked: Marked, read: dict, formats: set, ckpt) -> Violation | None:
    """What loading the layers raises in ``group`` before the format's own loading code runs,
    on the first such layer in module order: a layer without its weight (``Missing weight``,
    in the groups that raise it, for every layer of a quantized model), or a layer of a format
    the group lacks (its ``QUANT_ALGOS`` lookup); a layer without its weight returns before the
    lookup in the others.  None: no layer raises either."""
    unknown = frozenset(formats - set(group.formats))
    raises_missing = (
        group.first in MISSING_WEIGHT_RAISES and bool(read) and bool(marked.once("weightless", lambda: _weightless(ckpt)))
    )
    if not unknown and not raises_missing:
        return None
    key = ("event", id(read), unknown, raises_missing, group.unknown)  # groups lacking the same formats share it
    return marked.once(key, lambda: _first_event(group, marked, read, unknown, raises_missing, ckpt))


def _first_event(group: ReleaseGroup, marked: Marked, read: dict, unknown: frozenset, raises_missing: bool, ckpt):
    weightless = marked.once("weightless", lambda: _weightless(ckpt))
    named = [p for p, f in read.items() if isinstance(f, str) and f in unknown and p not in weightless] if unknown else []
    if raises_missing:
        named += [p for p in weightless if p not in named]
    if not named:
        return None
    layer = marked.least(named)
    if _layer(ckpt, layer) is None:  # a map entry naming no layer of the file loads nothing
        named = [p for p in named if _layer(ckpt, p) is not None]
        if not named:
            return None
        layer = marked.least(named)
    if layer in weightless:
        return Violation("comfyui.release", f"Missing weight for layer {layer}", "ValueError", layer, "weight", True,
                         "ComfyUI up to 0.8.2 raises loading a quantized model's layer that has no weight",
                         "store the layer's weight, or load it with ComfyUI 0.9.2 or newer")  # fmt: skip
    fmt = read[layer]
    exc, message = group.unknown
    knows = first_knowing(fmt)
    fix = f"load it with ComfyUI {knows.first} or newer" if knows else "convert the layer (comfyquant convert)"
    cause = f"ComfyUI before {knows.first} does not know format {fmt!r}" if knows else f"no ComfyUI release knows {fmt!r}"
    return Violation("comfyui.release", message.format(format=fmt), exc, layer, "comfy_quant", True, cause, fix)


def _weightless(ckpt) -> set[str]:
    """The layers the file holds without a ``weight`` (names without the diffusion-model prefix)
    that load as ``Linear``s: where ComfyUI builds a model comfyquant describes, the model's
    ``Linear`` layers only (a norm without its weight is not one)."""
    whole = ckpt.shared.get(WHOLE_MODEL)
    model = whole.model if whole is not None else None
    return {
        _bare(p)
        for p, layer in ckpt.layers.items()
        if "weight" not in layer.tensors and (model is None or whole.linear(p) is not None)
    }


def _precedes(first: Violation | None, layer: str, marked: Marked) -> bool:
    """Whether ``first`` (the newest release's first failure) is raised before loading reaches
    ``layer``: reading the file and its header map come before any layer loads (no layer), a
    layer's loading before the next one's (module order), and every first forward after the
    whole model loaded."""
    if first is None or not first.blocking or first.stage == "forward":
        return False
    if first.layer is None:
        return True
    return marked.order(_bare(first.layer)) < marked.order(layer)


def _memo_key(group: ReleaseGroup, plain: bool) -> tuple:
    """What a group's verdict depends on besides the file: groups with the same key share it.
    ``plain``: the file gives the group's own ways with a failure nothing to act on (the newest
    release finds nothing wrong, no layer lacks its weight, detection is the newest's)."""
    forward = group.first if any(release == group.first for release, _ in FORWARD_ERRORS) else None
    kitchen = group.kitchen if group.kitchen in FOUR_BIT_ONLY else None
    folded = (map_after_prefix(group), group.first in OWN_FP8)
    if plain:
        return (group is NEWEST, group.markers, group.formats, group.unknown, kitchen, forward, folded)
    adjusted = (
        version_key(group.first) < version_key(SMOOTHING_FROM),
        group.first in NO_WEIGHT_ATTRIBUTE,
        SCALE_MULTIPLIED.get(group.first),
        group.first in STORED_FP8_KEPT,
        group.first in MISSING_WEIGHT_RAISES,
        version_key(group.first) < version_key(NORM_WEIGHT_FROM),
    )
    return (group is NEWEST, group.markers, group.formats, group.unknown, kitchen, forward, folded, adjusted)


FOUR_BIT_ONLY = frozenset({"0.2.28", "0.2.30", "0.2.31"})
"""The comfy-kitchen releases ComfyUI's W4A8 groups pin whose W4A8 linear differs from 0.2.40's
(``comfyui_pinned``): 4-bit codes only (K = 2 x the row's bytes), dtypes checked first."""


PINNED_CAUSE = (
    "the comfy-kitchen ComfyUI 0.31.0 to 0.33.0 pin (0.2.28 to 0.2.31) reads every W4A8 row as 4-bit codes "
    "(K = 2 x the row's bytes) and checks the operands' dtypes first"
)


def _pinned(group: ReleaseGroup, ckpt, newest, read: dict, formats: set, marked: Marked):
    """``newest``'s violations with each W4A8 layer's first forward as the group's comfy-kitchen
    runs it (``comfyui_pinned``), or None when that changes nothing.  Decided once per check
    (the groups pinning these comfy-kitchens share it) and once per W4A8 layer class."""
    if group.kitchen not in FOUR_BIT_ONLY or "asym_w4a8_int8" not in formats:
        return None

    def make():
        from .comfyui_pinned import FORWARD_RULES, pinned_violations

        if not any(v.blocking and v.rule in FORWARD_RULES for v in newest.violations) and _pinned_run(ckpt, read, marked.objects):
            return None  # no forward error to replace, and none to add
        forwards, keys = _pinned_forwards(ckpt, read, marked.objects)
        return pinned_violations(newest.violations, forwards, keys, PINNED_CAUSE) if forwards else None

    return marked.once("pinned", make)


def _pinned_run(ckpt, read: dict, markers: dict[str, dict]) -> bool:
    """Whether every W4A8 layer ComfyUI reads runs its first forward under the pinned
    comfy-kitchen, judged once per layer class (``releases.layer_classes``): True only when
    each such layer is read with its checkpoint marker (the classes are of those) and no class
    of W4A8 layers raises; False also when that is not known so (``_pinned_forwards`` tells)."""
    from .comfyui_pinned import FORMAT, first_forward

    get = ckpt.layers.get
    for p, f in read.items():
        if f == FORMAT:
            layer = get(p)
            if layer is None:
                layer = get(DIFFUSION_PREFIX + p)
                if layer is None:
                    continue
            if layer.marker is not markers.get(p):
                return False
    memo = ckpt.memo
    for c in layer_classes(ckpt):
        if c.format == FORMAT:
            if memo.get("comfyui.release.w4a8", c.marker, c.layer, partial(first_forward, c.marker, c.layer.tensors)) is not None:
                return False
    return True


def _pinned_forwards(ckpt, read: dict, markers: dict[str, dict]) -> tuple[dict, dict]:
    """Each W4A8 layer's pinned first forward (file layer name -> violation or None), and each
    such layer's module-order key; ``markers``: each layer's marker as ComfyUI reads it."""
    from .comfyui_pinned import FORMAT, bound, first_forward

    forwards: dict = {}
    keys: dict = {}
    effective = ckpt.markers.effective
    for p, f in read.items():
        if f != FORMAT:
            continue
        layer = ckpt.layers.get(p) or ckpt.layers.get(DIFFUSION_PREFIX + p)
        marker = markers.get(p)
        if layer is None or marker is None:
            continue
        merged = effective.get(layer.prefix)
        if merged is not None and merged is not marker and merged == marker:
            marker = merged  # the object the other rules classed the layer with: its class is known
        template = ckpt.memo.get("comfyui.release.w4a8", marker, layer, partial(first_forward, marker, layer.tensors))
        forwards[layer.prefix] = bound(template, layer.prefix)
        if template is not None:
            keys[layer.prefix] = module_order(layer.prefix)
    return forwards, keys


FORWARD_ERRORS = {
    ("0.3.68", "float8_e4m3fn"): (
        "input_scale",
        "TypeError",
        "TensorCoreFP8Layout.quantize() got an unexpected keyword argument 'fp8_dtype'",
    ),
}
"""(release group, format) -> (tensor, exception, message): what a release's first forward
raises on a layer of a format it knows, holding that tensor (as running the release raised it)."""


def _legacy_scales(ckpt):
    """A legacy scaled-FP8 file (its ``scaled_fp8`` key) in a release before 0.4.0: the scaled
    FP8 operations hold ``scale_weight`` and ``scale_input`` as scalars, so a stored vector
    fails ``load_state_dict`` (torch's size mismatch, every such tensor, in module order)."""
    if "scaled_fp8" not in ckpt.tensors and DIFFUSION_PREFIX + "scaled_fp8" not in ckpt.tensors:
        return None
    lines = []
    for prefix in sorted(ckpt.layers, key=module_order):
        for suffix in ("scale_weight", "scale_input"):
            e = ckpt.layers[prefix].tensors.get(suffix)
            if e is not None and tuple(e.shape) != ():
                have = ", ".join(str(d) for d in e.shape)
                name = _bare(prefix)
                lines.append(
                    f"size mismatch for {name}.{suffix}: copying a param with shape torch.Size([{have}]) from checkpoint, "
                    "the shape in current model is torch.Size([])."
                )
    if not lines:
        return None
    return Violation("comfyui.release", "\n\t".join(lines), "RuntimeError", None, None, True,
                     "ComfyUI before 0.4.0 holds legacy scaled-FP8 scales as scalars",
                     "store the scales as scalars, or load it with ComfyUI 0.4.0 or newer")  # fmt: skip


def _layer(ckpt, bare: str):
    """The file's layer of a name without the diffusion-model prefix (stored with it or not), or None."""
    return ckpt.layers.get(bare) or ckpt.layers.get(DIFFUSION_PREFIX + bare)


def _tensors(ckpt, bare: str) -> dict:
    layer = _layer(ckpt, bare)
    return layer.tensors if layer is not None else {}


def _unread(ckpt, marked: Marked):
    """A layer marked by a tensor alone, in a release that reads only the header map: its
    stored weight loads into a plain ``Linear``; a weight stored in another shape than the
    model's (packed codes) fails ``load_state_dict`` (torch lists every such tensor, in module
    order: the message is written when it is read), one of the model's shape computes garbage."""
    cause = f"ComfyUI before 0.4.0 reads quantization markers only from the {HEADER}"
    fix = "add the header map (comfyquant fix) or load it with ComfyUI 0.4.0 or newer"
    unread = marked.unread
    mixed = bool(marked.header)  # a map of layers: its mixed-precision Linear takes a plain weight as stored
    least = marked.least(unread)
    failing: str | None = least
    if _mismatch(ckpt, least, mixed) is None:  # else the first in module order of those that fail, if any: no sort
        bad = [n for n in unread if _mismatch(ckpt, n, mixed) is not None]
        failing = _least(bad, marked.order)[0] if bad else None
    if failing is not None:
        v = _Mismatches("comfyui.release", "", "RuntimeError", failing, "bias" if mixed else "weight", True, cause, fix)
        # the message's closure keeps no ``marked`` (which keeps this violation): no cycle holds the checkpoint
        v.lines = lambda: [m for m in (_mismatch(ckpt, n, mixed) for n in sorted(unread, key=module_order)) if m is not None]
        return v
    if mixed:
        for name in sorted(unread, key=module_order):
            unfit = _unfit_forward(ckpt, name, cause, fix)
            if unfit is not None:
                return unfit
    return Violation(
        "comfyui.release",
        f"layer '{least}': ComfyUI before 0.4.0 reads only the header map, not the .comfy_quant "
        f"tensor marker: the stored codes load as a plain weight (garbage output, no error)",
        None,
        least,
        "comfy_quant",
        False,
        cause,
        fix,
        severity="error",
    )


class _Mismatches(Violation):
    """torch's size mismatches of the layers a release loads as plain ``Linear``s: its message
    (one line per tensor) is made when it is first read."""

    __slots__ = ("lines", "_text")
    lines: Callable[[], list[str]]
    _text: str | None

    @property
    def message(self) -> str:
        if self._text is None:
            self._text = "\n\t".join(self.lines())
        return self._text

    @message.setter
    def message(self, value: str) -> None:
        self._text = value if value else None


def _plain_model(ckpt, name: str):
    """(the layer, the (N, K) of the plain ``Linear`` built for it: ``comfyui_plain.plain_size``),
    or None.  A release builds a layer plain when it reads no header map entry for it, so only
    the layer's own tensor marker says in which format its tensors record its size."""
    from ..markers import TENSOR as TENSOR_RECORD
    from .kitchen import python_json_markers

    layer = _layer(ckpt, name)
    if layer is None or "weight" not in layer.tensors:
        return None
    records = ckpt.markers.sources.get(layer.prefix, ())
    marker = next((r.obj for r in records if r.kind == TENSOR_RECORD and isinstance(r.obj, dict)), None)
    if marker is None and marker_reading(ckpt).refused_tensor:
        marker = python_json_markers(ckpt).get(layer.prefix)  # NaN sizes: the format still says the size
    model = ckpt.memo.get("comfyui.release.size", marker, layer, partial(plain_size, layer, marker))
    return None if model is None else (layer, model)


def _unfit_forward(ckpt, name: str, cause: str, fix: str) -> Violation | None:
    """The first forward of a plain layer whose weight was taken as stored: a 2-D weight of
    another width than the model's K meets the input of shape [4, K] (torch's matmul error)."""
    found = _plain_model(ckpt, name)
    if found is None:
        return None
    layer, (_n, k) = found
    shape = tuple(layer.tensors["weight"].shape)
    if len(shape) != 2 or shape[1] == k:
        return None
    v = Violation("comfyui.release", f"mat1 and mat2 shapes cannot be multiplied (4x{k} and {shape[1]}x{shape[0]})",
                  "RuntimeError", name, "weight", True,
                  f"{cause}: the layer's stored weight {list(shape)} is taken as a plain one, for {k} inputs", fix)  # fmt: skip
    v.stage = "forward"
    return v


def _mismatch(ckpt, name: str, mixed: bool = False) -> str | None:
    """torch's size-mismatch lines (joined as it joins them) for a layer loaded as a plain
    ``Linear`` of the model's size (``comfyui_plain.plain_size``): its weight, then its bias, where either is
    of another shape (``mixed``: the bias only, the weight being taken as stored); None when
    they fit or the size cannot be read."""
    from .comfyui_model import size_mismatch

    found = _plain_model(ckpt, name)
    if found is None:
        return None
    layer, model = found
    lines = []
    for suffix, want in (("weight", tuple(model)), ("bias", (model[0],)))[1 if mixed else 0 :]:
        e = layer.tensors.get(suffix)
        if e is not None and tuple(e.shape) != want:
            lines.append(size_mismatch(name, suffix, tuple(e.shape), want))
    return "\n\t".join(lines) if lines else None


class Releases:
    """The file's verdict on each selected ComfyUI release group, oldest first."""

    __slots__ = ("verdicts", "selected")

    def __init__(self, verdicts: list, selected: tuple[str, ...]) -> None:
        self.verdicts = verdicts
        """(group, its releases, Verdict) per group, every release: the first loading release
        is a fact of all of them."""
        self.selected = selected
        """The releases the target selects (all by default): the JSON lists their groups."""

    @property
    def chosen(self) -> list:
        """The verdicts of the groups with a selected release, with only those releases."""
        chosen = set(self.selected)
        out = []
        for group, releases, verdict in self.verdicts:
            mine = tuple(r for r in releases if r in chosen)
            if mine:
                out.append((group, mine, verdict))
        return out

    @property
    def runs(self) -> list:
        """(releases, loads, verdict) per group, oldest first (``releases.summary``)."""
        return [(releases, v.loads, v) for _, releases, v in self.verdicts]

    @property
    def first_loading(self) -> str | None:
        """The first release of the newest run of releases that load the file (None: the
        newest selected release does not)."""
        return first_loading_of(self.runs)

    def lines(self) -> list[str]:
        """``loads from ComfyUI 0.31.0 on; fails before: KeyError: 'asym_w4a8_int8'`` and the
        releases where it stopped or started loading before."""
        chosen = f" ({self.chosen[-1][0].kitchen_text})" if self.selected != RELEASES else ""
        return summary("ComfyUI", self.runs, self.selected, failure, chosen, " (each with the comfy-kitchen it pins)")

    def to_dict(self) -> dict:
        return {
            "first_loading": self.first_loading,
            "summary": self.lines(),
            "releases": chosen_dicts(self.chosen),
        }


_MEMO_KEYS: dict[tuple[ReleaseGroup, bool], tuple] = {}
"""Each group's ``_memo_key``: facts of the tables alone, made once per process."""


def releases_for(ckpt, newest, spec: tuple[str, str] | None) -> Releases:
    """The file's verdict on every group with a release ``spec`` selects."""
    marked = Marked(ckpt)
    memo: dict[tuple, Verdict] = {}
    verdicts = []
    plain = (
        not newest.violations
        and not marked.once("weightless", lambda: _weightless(ckpt))
        and _undetected(GROUPS[0], ckpt, newest) is None
    )
    for group in GROUPS:
        key = _MEMO_KEYS.get((group, plain))
        if key is None:
            key = _MEMO_KEYS[group, plain] = _memo_key(group, plain)
        verdict = memo.get(key)
        if verdict is None:
            verdict = memo[key] = release_verdict(group, marked, newest, ckpt)
        verdicts.append((group, group.releases, verdict))
    return Releases(verdicts, selected_releases(spec))


NEWER_KITCHEN = "0.2.40"
"""The comfy-kitchen the ComfyUI profile (``comfyui.comfyui_verdict``) models, newer than the
one ComfyUI 0.33.0 pins: where it decides otherwise, the report says what upgrading does."""


def released(newest, releases: Releases) -> ReleasedVerdict:
    """The ComfyUI verdict a check reports: the newest selected release's with the comfy-kitchen
    it pins (by default ComfyUI 0.33.0 with comfy-kitchen 0.2.31), carrying the file's verdict
    on every release and, for ComfyUI 0.33.0, ``newest`` (its verdict with comfy-kitchen 0.2.40)
    where that differs (``ReleasedVerdict``)."""
    group, _, last = releases.chosen[-1]
    out = ReleasedVerdict(last.target, last.violations, last.architecture)
    out.releases = releases
    out.newest = newest if group is NEWEST and newest.violations is not last.violations else None
    return out


def _outcome(verdict) -> tuple:
    """What a runtime does with the file as a verdict says it: loads, or its first failure."""
    first = verdict.first
    return (None, None, None) if first is None else (first.exception, first.message, first.layer)


class ReleasedVerdict(SharedReleasedVerdict):
    """A ComfyUI verdict with the file's verdict on each release: the text report's lines and
    the JSON's ``releases``; and ``newer``, ComfyUI 0.33.0's verdict with comfy-kitchen 0.2.40
    where it is not this one (None otherwise): the JSON's ``newer_kitchen``."""

    __slots__ = ("newest",)
    newest: Verdict | None
    """ComfyUI 0.33.0's verdict with comfy-kitchen 0.2.40 when this verdict is 0.33.0's and
    another list of violations (None otherwise); both hold ``--deep``'s silent errors."""

    @property
    def newer(self) -> Verdict | None:
        """ComfyUI 0.33.0's verdict with comfy-kitchen 0.2.40 where it differs from this one."""
        newer = self.newest
        return newer if newer is not None and _outcome(newer) != _outcome(self) else None

    @property
    def with_newer_kitchen(self) -> Verdict:
        """ComfyUI 0.33.0's verdict with comfy-kitchen 0.2.40 when this is 0.33.0's: ``newer``
        where it differs, else this one."""
        newer = self.newer
        return self if newer is None else newer

    def release_lines(self) -> list[str]:
        lines = self.releases.lines()
        newer = self.newer
        if newer is not None:
            lines.insert(0, f"with comfy-kitchen {NEWER_KITCHEN} instead of the pinned {NEWEST.kitchen}: {failure(newer)}")
        return lines

    def to_dict(self) -> dict:
        newer = None
        found = self.newer
        if found is not None:
            newer = {"comfy_kitchen": NEWER_KITCHEN, **outcome(found.first)}
        return {**super().to_dict(), "newer_kitchen": newer}


def first_loading(fmt: str, marker: str) -> ReleaseGroup | None:
    """The oldest group that loads a valid layer of ``fmt`` marked by ``marker`` (``HEADER`` or
    ``TENSOR``): it knows the format and reads that marker form."""
    return next((g for g in GROUPS if fmt in g.formats and marker in g.markers), None)
