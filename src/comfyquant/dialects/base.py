"""The vocabulary of a dialect: how a foreign layout's layer becomes a Comfy layer.

A *dialect* is a layout some other writer uses for quantized weights (ComfyUI's legacy scaled
FP8, musubi-tuner, NVIDIA ModelOpt, BFL, ComfyUI-INT8-Fast, convert_to_quant, nunchaku, GGUF).
Each lives in one package under ``dialects/`` and says, from the header alone, which layers
are its own and what each one becomes: a ``Translation`` (output tensors as
``Move`` s from input tensors, the Comfy marker, and a verdict: exact, byte permutation,
lossy or refused).  Every command reads these: ``check``/``inspect`` name them, ``migrate``
writes them, ``dequantize``/``convert`` read a dialect file through them.

Nothing here imports torch: transforms and decoders are plain callables that import what
they need when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..io.header import TensorEntry
    from ..io.source import ByteSource

EXACT = "exact"
"""Renames, added markers, reshapes of the same bytes, exact scale upcasts."""
PERMUTATION = "byte-permutation"
"""The same numbers in another arrangement: nibble order, scale swizzle, padding."""
LOSSY = "lossy"
"""No Comfy format holds these numbers: the layer is requantized (``--allow-lossy``)."""
REFUSED = "refused"
"""Neither: the layer cannot become a Comfy layer (the translation says why)."""
VERDICTS = (EXACT, PERMUTATION, LOSSY, REFUSED)

Transform = Callable[[bytes], bytes]
Decoder = Callable[[dict[str, Any]], Any]
"""Stored tensors by input suffix (torch tensors) -> the dense F32 weight (a torch tensor)."""


class Move:
    """One output tensor of a translated layer: its Comfy suffix, the input tensor it comes
    from (full name), its dtype and shape as written, and the byte transform (None: the bytes
    are copied as they are, possibly under another name, dtype label of the same width, or
    shape of the same element count)."""

    __slots__ = ("suffix", "source", "dtype", "shape", "transform", "kind", "what")

    def __init__(
        self,
        suffix: str,
        source: str,
        dtype: str,
        shape: tuple,
        transform: Transform | None = None,
        kind: str = EXACT,
        what: str = "",
    ) -> None:
        self.suffix = suffix
        self.source = source
        self.dtype = dtype
        self.shape = tuple(shape)
        self.transform = transform
        self.kind = kind
        self.what = what
        """What the move does, in words, for the plan (empty: a plain copy or rename)."""

    def __repr__(self) -> str:
        return f"Move({self.suffix!r} <- {self.source!r}, {self.dtype} {self.shape}, {self.kind})"


class Lossy:
    """How ``--allow-lossy`` requantizes a layer with no exact Comfy form: decode with the
    translation's decoder, encode with ``format`` and ``params`` (quantize's names)."""

    __slots__ = ("format", "params", "why")

    def __init__(self, format: str, params: dict | None = None, why: str = "") -> None:
        self.format = format
        self.params = dict(params or {})
        self.why = why


class Translation:
    """What one layer of a dialect file is and becomes.

    ``prefix``: the layer's prefix in the file; ``out_prefix``: its prefix in the Comfy file
    (the same unless the dialect's writer added one, e.g. ``model.`` for INT8-Fast);
    ``inputs``: the layer's stored tensors by suffix (``TensorEntry``); ``format``/``marker``:
    the Comfy format and marker it gets (None when refused or lossy); ``moves``: every output
    tensor; ``drops``: input tensor names not carried over (with ``dropped_why``);
    ``unsettled``: what only the tensor data can settle (``--deep`` reads it); ``decoder``:
    the exact dense decode (F32), for dequantize/convert and the lossy path; ``lossy``: the
    requantization ``--allow-lossy`` uses."""

    __slots__ = (
        "prefix",
        "out_prefix",
        "dialect",
        "variant",
        "inputs",
        "format",
        "marker",
        "moves",
        "drops",
        "dropped_why",
        "verdict",
        "why",
        "unsettled",
        "decoder",
        "lossy",
        "header_only",
        "declared",
    )

    def __init__(
        self,
        prefix: str,
        dialect: str,
        variant: str,
        inputs: dict[str, TensorEntry],
        *,
        verdict: str,
        why: str = "",
        format: str | None = None,
        marker: dict | None = None,
        moves: list[Move] | None = None,
        drops: list[str] | None = None,
        dropped_why: str = "",
        out_prefix: str | None = None,
        unsettled: list[str] | None = None,
        decoder: Decoder | None = None,
        lossy: Lossy | None = None,
        header_only: bool = False,
        declared: str | None = None,
    ) -> None:
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        self.prefix = prefix
        self.out_prefix = prefix if out_prefix is None else out_prefix
        self.dialect = dialect
        self.variant = variant
        self.inputs = inputs
        self.format = format
        self.marker = marker
        self.moves = moves or []
        self.drops = drops or []
        self.dropped_why = dropped_why
        self.verdict = verdict
        self.why = why
        self.unsettled = unsettled or []
        self.decoder = decoder
        self.lossy = lossy
        self.header_only = header_only
        """The marker goes into the header's layer map only, no ``.comfy_quant`` tensor (the
        layout a dialect writes that way, e.g. ModelOpt: a reader takes such tensors for a Comfy file)."""
        self.declared = declared
        """The registered format the file itself declares the layer to be, in a map of its own
        that a runtime reads (SGLang's rowwise FP8): ``inspect`` shows it as the layer's format."""

    @property
    def label(self) -> str:
        """``dialect`` or ``dialect (variant)``: what inspect and check call the layer."""
        return f"{self.dialect} ({self.variant})" if self.variant else self.dialect

    def to_dict(self) -> dict:
        return {
            "layer": self.prefix,
            "dialect": self.dialect,
            "variant": self.variant,
            "verdict": self.verdict,
            "format": self.format,
            "marker": self.marker,
            "why": self.why,
            "unsettled": list(self.unsettled),
            "out_prefix": self.out_prefix,
        }

    def __repr__(self) -> str:
        return f"Translation({self.prefix!r}, {self.label}, {self.verdict} -> {self.format})"


def refused(dialect: str, prefix: str, inputs: dict, why: str, variant: str = "unknown", **more: Any) -> Translation:
    """A layer of ``dialect`` that is recognised but not translated, and ``why`` (every dialect
    refuses this way; ``more`` takes the other ``Translation`` fields, e.g. a ``decoder``
    that still reads the layer)."""
    return Translation(prefix, dialect, variant, inputs, verdict=REFUSED, why=why, **more)


def exact(
    dialect: str, prefix: str, inputs: dict, variant: str, fmt: str, why: str, marker: dict | None = None, **more: Any
) -> Translation:
    """A layer of ``dialect`` that is the Comfy format ``fmt`` exactly, and ``why``: its marker
    is ``{"format": fmt}`` unless ``marker`` says more; ``more`` takes the other ``Translation``
    fields (``moves``, ``drops``...)."""
    return Translation(
        prefix, dialect, variant, inputs, verdict=EXACT, why=why, format=fmt, marker=marker or {"format": fmt}, **more
    )


class Claim:
    """What one dialect claims in a checkpoint: its layers' translations, the file-level
    tensors it drops (a sentinel), metadata keys it removes or sets in a migrated file, and
    file-level notes (facts about the whole file, in words)."""

    __slots__ = ("dialect", "layers", "drop", "metadata_drop", "metadata_set", "notes", "unsettled", "settled")

    def __init__(
        self,
        dialect: str,
        layers: dict[str, Translation] | None = None,
        drop: list[str] | None = None,
        metadata_drop: list[str] | None = None,
        metadata_set: dict[str, str] | None = None,
        notes: list[str] | None = None,
        unsettled: list[str] | None = None,
    ) -> None:
        self.dialect = dialect
        self.layers = layers or {}
        self.drop = drop or []
        self.metadata_drop = metadata_drop or []
        self.metadata_set = metadata_set or {}
        self.notes = notes or []
        self.unsettled = unsettled or []
        self.settled: list | None = None
        """The findings of the dialect's ``settle`` once it ran (it runs once per claim)."""


Detect = Callable[[Any, set], "Claim | None"]
"""(checkpoint, prefixes already claimed) -> this dialect's claim, or None: header only."""
Failures = Callable[[Any, "Claim"], list]
"""(checkpoint, claim) -> ``targets.base.RuntimeFailure`` s: what each runtime does wrong with
the claimed layers, as data (``targets.dialect_failures`` renders them)."""
Settle = Callable[[Any, "Claim"], list]
"""(checkpoint, claim) -> findings from the tensor data (``--deep``); may refine the claim's
translations (a value that decides a move: ``scale_input == 1.0``, a dummy scale)."""
ValueCasts = Callable[["Claim"], list]
"""claim -> ``ValueCast`` s: the weights a runtime casts by value into another dtype."""
Export = Callable[[Any, set], "Claim | None"]
"""(Comfy checkpoint, prefixes already claimed) -> translations of its marked layers *into*
this dialect (``migrate --to DIALECT``): the same vocabulary, the other direction."""


class ValueCast:
    """A weight a runtime casts by value into ``target`` (then multiplies by ``scale``, a
    one-value tensor, when there is one): ``check --deep`` reads the weight and says whether
    the cast layer computes garbage (D008)."""

    __slots__ = ("layer", "weight", "target", "scale")

    def __init__(self, layer: str, weight, target: str, scale=None) -> None:
        self.layer = layer
        self.weight = weight
        self.target = target
        self.scale = scale

    @property
    def entries(self) -> list:
        """The tensors to read: the weight, and its scale when there is one."""
        return [self.weight] if self.scale is None else [self.weight, self.scale]


class Dialect:
    """A foreign layout: its name, who writes it, how to spot it and what runtimes do with it.

    ``detect`` looks at the header only (tensor names, dtypes, shapes, ``__metadata__``) and
    returns a ``Claim``; ``failures`` says, for every target, what that runtime does wrong
    with the claimed layers (refuses with its message, or computes garbage without an error),
    reported under the rules ``{target}.{rule_tag}``; ``settle`` reads tensor data for what the header cannot tell (``--deep``).
    ``export`` (optional) translates Comfy layers into this layout, for the layouts a
    runtime needs and Comfy can be rewritten to exactly (NVFP4 both ways).  ``value_casts``
    (optional) lists the claimed weights a runtime casts by value into another dtype.
    ``order``: detection order (a more specific layout first)."""

    __slots__ = (
        "name",
        "title",
        "writer",
        "source",
        "detect",
        "failures",
        "rule_tag",
        "settle",
        "export",
        "value_casts",
        "order",
    )

    def __init__(
        self,
        name: str,
        title: str,
        *,
        writer: str,
        source: str,
        detect: Detect,
        failures: Failures | None = None,
        rule_tag: str | None = None,
        settle: Settle | None = None,
        export: Export | None = None,
        value_casts: ValueCasts | None = None,
        order: int = 100,
    ) -> None:
        self.name = name
        self.title = title
        self.writer = writer
        self.source = source
        self.detect = detect
        self.failures = failures
        self.rule_tag = rule_tag or name
        self.settle = settle
        self.export = export
        self.value_casts = value_casts
        self.order = order

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"


class Container:
    """A file format other than safetensors that a dialect reads (GGUF): ``sniff(path)`` says
    whether a local file is one (a few bytes, never raises), ``open(path)`` returns a byte
    source that reads as the equivalent safetensors file (``comfyquant.io.virtual.VirtualSource``).
    ``suffixes`` are the file names it is looked for under in a folder (``check --recursive``):
    each such file is a checkpoint of its own."""

    __slots__ = ("name", "sniff", "open", "suffixes")

    def __init__(
        self, name: str, sniff: Callable[[str], bool], open: Callable[[str], ByteSource], suffixes: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.sniff = sniff
        self.open = open
        self.suffixes = suffixes
