"""Decide, for every layer, what the output holds, before any tensor is read.

``quantize`` (dense input): a 2-D float ``weight`` gets the format its rule (or ``--format``)
names, unless the format or the target cannot take its shape; everything else (norms,
embeddings, biases, 1-D/3-D tensors, excluded or kept layers) is copied dense, each with its
reason.  ``convert`` (quantized input): each quantized layer is decoded and encoded again in
the new format, or copied unchanged when it already has that format and those parameters.

The plan is then judged as a whole by the checker on a virtual checkpoint
(``layout``): a format combination the target refuses (e.g. W4A8 with W4A4 for SGLang)
stops the run here, with the runtime's message, before anything is computed.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Protocol

from ..dtypes import DENSE_FLOAT_DTYPES, MODEL_FLOAT_DTYPES
from ..errors import InputError, option
from ..formats.params import Params
from ..naming import natural_key
from .layout import check_files, format_problems, layer_problems, marker_entries, planned_tensors, problems
from .rules import Choice, Rules

if TYPE_CHECKING:
    from ..checker.run import Targets
    from ..checkpoint import Checkpoint
    from ..io.header import TensorEntry

QUANTIZE = "quantize"
DENSE = "dense"
COPY = "copy"
DECODE = "decode"
"""``convert`` writes a quantized input layer as its dense weight (rules ``format = "dense"``)."""
ENCODABLE_DTYPES = MODEL_FLOAT_DTYPES


class LayerPlan:
    """One layer of the output: what is done to it and why.

    ``action``: ``quantize`` (encode; from the dense weight, or from the decoded weight in
    ``convert``), ``dense`` (copied, stays dense) or ``copy`` (a quantized layer copied
    unchanged, with ``marker`` written for it)."""

    __slots__ = (
        "name",
        "index",
        "action",
        "format",
        "params",
        "marker",
        "source",
        "reason",
        "n",
        "k",
        "entries",
        "planned",
        "src_format",
        "src_marker",
        "dtype",
    )

    def __init__(self, name: str, entries: dict, action: str, reason: str | None = None) -> None:
        self.name = name
        self.index = 0
        self.entries = entries
        self.action = action
        self.reason = reason
        self.format: str | None = None
        self.params: Params | None = None
        self.marker: dict | None = None
        self.source: str | None = None
        self.n = self.k = 0
        self.planned: dict[str, tuple[str, tuple]] = {}
        self.src_format: str | None = None
        self.src_marker: dict | None = None
        self.dtype: str | None = None  # the model dtype of the dense weight (source or decoded)

    @property
    def bytes_in(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    @property
    def bytes_out(self) -> int:
        from ..dtypes import DTYPE_BITS

        if self.action == DECODE:
            return sum(_nbytes(d, sh, DTYPE_BITS) for _s, d, sh in self.output_tensors())
        if self.action != QUANTIZE:
            return self.bytes_in + (len(json.dumps(self.marker)) if self.marker else 0)
        total = sum(_nbytes(d, s, DTYPE_BITS) for d, s in self.planned.values())
        kept = sum(e.nbytes for s, e in self.entries.items() if s == "bias")
        return total + kept + len(json.dumps(self.marker))

    def output_tensors(self) -> list[tuple[str, str, tuple]]:
        """(suffix, dtype, shape) written for this layer, marker excluded, in file order."""
        if self.action == DECODE:
            bias = self.entries.get("bias")
            return [("weight", self.dtype, (self.n, self.k))] + ([("bias", bias.dtype, bias.shape)] if bias else [])
        if self.action != QUANTIZE:
            return [(s, e.dtype, e.shape) for s, e in self.entries.items() if s != "comfy_quant"]
        out = [(s, d, sh) for s, (d, sh) in self.planned.items()]
        bias = self.entries.get("bias")
        if bias is not None:
            out.append(("bias", bias.dtype, bias.shape))
        return out

    def describe(self) -> str:
        if self.action == QUANTIZE and self.params is not None:
            return self.params.describe()
        return self.reason or self.action

    def to_dict(self) -> dict:
        w = self.entries.get("weight")
        return {
            "layer": self.name,
            "index": self.index,
            "action": self.action,
            "format": self.format if self.action == QUANTIZE else (self.marker or {}).get("format"),
            "params": self.params.as_dict() if self.action == QUANTIZE and self.params is not None else None,
            "marker": self.marker,
            "reason": self.reason,
            "shape": list(w.shape) if w is not None else None,
            "source_dtype": w.dtype if w is not None else None,
            "source_format": self.src_format,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


def _nbytes(dtype: str, shape: tuple, bits: dict) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * bits[dtype] // 8


class Plan:
    """Every layer in model order, the tensors outside layers, and the options that made it."""

    def __init__(self, mode: str, layers: list[LayerPlan], others: list, target) -> None:
        self.mode = mode
        self.layers = layers
        self.others = others
        self.target = target
        self.selection = None  # the presets.Selection that decided layers, if any
        self.notes: list[str] = []  # what the command says besides the plan (preset detected, --like)
        self.refusal: str | None = None
        """Why the target would not load the planned output (a dry run still prints the plan)."""

    @property
    def quantized(self) -> list[LayerPlan]:
        return [lp for lp in self.layers if lp.action == QUANTIZE]

    def __repr__(self) -> str:
        formats = ", ".join(f"{f} x{n}" for f, n in self.formats().items()) or "none"
        refused = ", refused" if self.refusal else ""
        return (
            f"Plan({self.mode}: {len(self.quantized)} of {len(self.layers)} layers encoded, formats {formats}, "
            f"target {self.target}{refused})"
        )

    def formats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lp in self.layers:
            fmt = lp.format if lp.action == QUANTIZE else (lp.marker or {}).get("format")
            if fmt:
                out[fmt] = out.get(fmt, 0) + 1
        return dict(sorted(out.items()))

    @property
    def bytes_in(self) -> int:
        return sum(lp.bytes_in for lp in self.layers) + sum(e.nbytes for e in self.others)

    @property
    def bytes_out(self) -> int:
        return sum(lp.bytes_out for lp in self.layers) + sum(e.nbytes for e in self.others)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "target": self.target,
            "formats": self.formats(),
            "layers": [lp.to_dict() for lp in self.layers],
            "other_tensors": [e.name for e in self.others],
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


def is_embedding(name: str) -> bool:
    """Embedding tables by name, as SGLang recognises them (``embed`` in the last component)."""
    return "embed" in name.rsplit(".", 1)[-1]


class Chooser(Protocol):
    """What a preset selection (``presets.Selection``) is to the plan: a choice for the layers
    the user's own rules leave open (named here so that the plan does not import presets,
    which imports the plan through ``recipe``)."""

    def choose(self, name: str) -> Choice | None: ...


class Options:
    """What decides the choices: rules, the default format, excludes, the target."""

    def __init__(
        self,
        rules: Rules | None,
        default: Choice | None,
        excludes: list[str],
        target: Targets,
        selection: Chooser | None = None,
    ) -> None:
        self.rules = rules
        self.default = default
        self.target = target
        self.selection = selection
        """A ``Selection`` (preset keep rules, all-in-one scope) or None: it
        decides what the user's own rules do not match, before the default format."""
        self.excludes = []
        for rx in excludes:
            try:
                self.excludes.append((rx, re.compile(rx)))
            except re.error as exc:
                raise InputError(f"{option('--exclude ', 'exclude=')}{rx!r}: not a valid regular expression ({exc})") from None

    def excluded(self, name: str) -> str | None:
        for text, rx in self.excludes:
            if rx.search(name):
                return text
        return None

    def choose(self, name: str) -> Choice | None:
        chosen = self.rules.choose(name) if self.rules is not None else None
        if self.selection is not None and (chosen is None or (self.rules is not None and chosen is self.rules.default)):
            picked = self.selection.choose(name)
            if picked is not None:
                return picked
        if chosen is None or (self.default is not None and self.rules is not None and chosen is self.rules.default):
            chosen = self.default or chosen
        return chosen


def build_plan(ckpt: Checkpoint, mode: str, options: Options) -> Plan:
    """The plan for ``quantize`` (``mode="quantize"``) or ``convert`` (``mode="convert"``)."""
    from ..markers import file_level_markers

    _refuse_choices(ckpt, options)
    implied = file_level_markers(ckpt) if mode == "convert" else {}
    layers: list[LayerPlan] = []
    decoded = getattr(ckpt, "decoded", ())  # a dialect's quantized layers, read as their exact dense decode
    for prefix in sorted(ckpt.layers, key=natural_key):
        layer = ckpt.layers[prefix]
        if mode == "quantize" or prefix in decoded:
            lp = _plan_quantize(layer, options)
        else:
            lp = _plan_convert(layer, options, implied.get(prefix))
        lp.index = len(layers)
        layers.append(lp)
    others = sorted((ckpt.tensors[n] for n in ckpt.other_tensors), key=lambda e: natural_key(e.name))
    plan = Plan(mode, layers, others, options.target)
    _check_whole(ckpt, plan)
    return plan


def _refuse_choices(ckpt: Checkpoint, options: Options) -> None:
    """A format or parameter set the target cannot load at all is refused up front."""
    choices = [options.default] if options.default is not None else []
    if options.rules is not None:
        choices += [r.choice for r in options.rules.rules]
        if options.rules.default is not None:
            choices.append(options.rules.default)
    seen: set[Params] = set()
    for c in choices:
        if c is None or c.keep:
            continue
        params = c.encoding
        if params in seen:
            continue
        seen.add(params)
        found = format_problems(params, options.target, "<layer>")
        if found:
            raise InputError(f"{c.source}: {params.describe()} cannot be written for --target {options.target}: {found[0]}")


def _dense(layer, reason: str) -> LayerPlan:
    return LayerPlan(layer.prefix, dict(layer.stored), DENSE, reason)


def _plan_quantize(layer, options: Options) -> LayerPlan:
    name = layer.prefix
    if layer.marker is not None or layer.inferred:
        raise InputError(
            f"layer {name!r} is already quantized ({layer.format_name}); quantize takes dense checkpoints "
            "(use comfyquant convert to change the format of a quantized one)"
        )
    w = layer.weight
    if w is None:
        return _dense(layer, "no weight tensor (copied)")
    rx = options.excluded(name)
    if rx is not None:
        return _dense(layer, f"excluded by --exclude {rx!r}")
    why = unquantizable(layer)
    if why is not None:
        return _dense(layer, why)
    choice = options.choose(name)
    if choice is None:
        return _dense(layer, "no rule matches and no --format")
    if choice.keep:
        return _dense(layer, f"kept by {choice.source}")
    if w.dtype not in ENCODABLE_DTYPES:
        what = "a float dtype quantize does not take" if w.dtype in DENSE_FLOAT_DTYPES else "not a float dtype"
        raise InputError(
            f"layer {name!r}: weight is {w.dtype}, {what}; quantize takes BF16, F16 or F32 weights "
            "(--exclude the layer to copy it unchanged)"
        )
    return _encode_plan(layer, choice, options, w.shape[0], w.shape[1], "dense", w.dtype)


def unquantizable(layer) -> str | None:
    """Why ``quantize`` copies this dense layer whatever a rule says (no weight, not a 2-D
    linear weight, an embedding table, other tensors), or None.  ``recipe`` reads it too: such
    layers need no rule."""
    w = layer.weight
    if w is None:
        return "no weight tensor (copied)"
    if len(w.shape) == 1:
        return "1-D tensor (norm or scale)"
    if len(w.shape) != 2:
        return f"{len(w.shape)}-D weight (convolution or expert bank): quantize writes 2-D linear weights"
    if 0 in w.shape:
        return f"empty weight {list(w.shape)}: nothing to quantize"
    if is_embedding(layer.prefix):
        return "embedding table: quantize writes linear layers"
    extra = sorted(set(layer.tensors) - {"weight", "bias"})
    if extra:
        return f"has other tensors ({', '.join(extra)}): not a plain linear layer"
    return None


def _encode_plan(layer, choice: Choice, options: Options, n: int, k: int, source: str, dtype: str) -> LayerPlan:
    """A ``quantize`` plan, or a ``dense``/``copy`` one with the reason the shape cannot be taken."""
    name = layer.prefix
    bias = layer.tensors.get("bias")
    why = _padding_loses_shape(choice.format, n, k, bias)
    if why is None:
        found = layer_problems(
            name, choice.encoding, n, k, None if bias is None else (bias.dtype, tuple(bias.shape)), options.target
        )
        why = found[0] if found else None
    if why is not None:
        kept = DENSE if source == "dense" else COPY
        lp = LayerPlan(name, dict(layer.tensors), kept, f"{choice.format} cannot take [{n}, {k}]: {why}")
        if kept == COPY:
            lp.marker = layer.marker
        return lp
    lp = LayerPlan(name, dict(layer.tensors), QUANTIZE, f"by {choice.source}")
    params = choice.encoding
    lp.format, lp.params, lp.source = choice.format, params, source
    lp.marker = params.marker()
    lp.n, lp.k, lp.dtype = n, k, dtype
    lp.planned = planned_tensors(params, n, k)
    return lp


def _padding_loses_shape(fmt_name: str, n: int, k: int, bias) -> str | None:
    """Why padding the stored weight would lose the layer's own shape, or None.  A padded
    format (``Format.pad``) stores ``[Np, Kp]``; the model's N is read back from the bias, the
    model's K from nothing the encoder writes -- so decoding (dequantize) and running the
    layer would see the padded size."""
    from ..formats.registry import FORMATS

    rows, cols = FORMATS[fmt_name].pad
    if k % cols:
        return (
            f"K={k} is not a multiple of {cols}: the weight would be stored padded to K={-(-k // cols) * cols}, "
            "and the file keeps no record of the model's K"
        )
    if n % rows and (bias is None or tuple(bias.shape) != (n,)):
        return (
            f"N={n} is not a multiple of {rows} and the layer has no bias: the weight would be stored padded to "
            f"N={-(-n // rows) * rows}, and nothing in the file would keep the model's N"
        )
    return None


def _plan_convert(layer, options: Options, implied: dict | None = None) -> LayerPlan:
    """``implied``: the marker the file's ``quant_format`` gives this unmarked layer (SGLang's
    reading in its ``inspect_comfy_quant_markers``); the layer is then read with it, and a copy
    of it carries it as its own marker (the output drops ``quant_format``)."""
    from .. import codecs
    from ..formats.codec import CodecError, output_dtype
    from ..numerics.dtypes import dtype_name

    name = layer.prefix
    marker = layer.marker if layer.marker is not None else implied
    if marker is None and not layer.inferred:
        return _dense(layer, "dense in the input (copied)")
    fmt = layer.format_name if layer.marker is not None or marker is None else marker.get("format")
    if marker is None:
        raise InputError(f"layer {name!r} has no marker (its tensors look like {fmt}); run comfyquant fix first")
    if not fmt or not codecs.has(fmt):
        raise InputError(f"layer {name!r}: format {fmt!r} cannot be decoded, so it cannot be converted")
    try:
        codec_plan = codecs.get(fmt).plan(dict(layer.tensors), marker, name)
        dtype = dtype_name(output_dtype(None, dict(layer.tensors), codec_plan.marker))
    except CodecError as exc:
        why = (
            "" if layer.marker is not None else f" (it has no marker: the file's quant_format makes it {fmt}, as SGLang reads it)"
        )
        raise InputError(
            f"cannot convert: {exc}{why} (comfyquant check lists every problem; comfyquant fix repairs most)"
        ) from None

    def copy(reason: str, out_marker: dict | None = None) -> LayerPlan:
        lp = LayerPlan(name, dict(layer.stored), COPY, reason)  # as stored: a bank keeps its shapes
        lp.marker, lp.src_format = out_marker or marker, fmt
        return lp

    if layer.bank is not None:
        return copy(f"MoE expert bank of {layer.bank.experts} experts (copied unchanged: convert re-encodes 2-D layers only)")
    rx = options.excluded(name)
    if rx is not None:
        return copy(f"excluded by --exclude {rx!r}")
    choice = options.choose(name)
    if choice is None:
        return copy("no rule matches and no --to")
    if choice.decode:
        lp = LayerPlan(name, dict(layer.tensors), DECODE, f"decoded to dense by {choice.source}")
        lp.n, lp.k = codec_plan.shape
        lp.dtype, lp.src_format, lp.src_marker = dtype, fmt, dict(marker)
        return lp
    if choice.keep:
        return copy(f"kept by {choice.source}")
    n, k = codec_plan.shape
    if _already(layer, marker, choice, n, k):
        return copy(f"already {choice.encoding.describe()} (copied unchanged)", choice.encoding.marker())
    lp = _encode_plan(layer, choice, options, n, k, "decode", dtype)
    if lp.action == COPY:
        lp.marker = marker
    lp.src_format, lp.src_marker = fmt, dict(marker)
    return lp


def _already(layer, marker: dict, choice: Choice, n: int, k: int) -> bool:
    """The layer already stores exactly what encoding it again would write (format,
    parameters, tensor dtypes and shapes): copying it is lossless, re-encoding is not."""
    from ..formats import registry

    if marker.get("format") != choice.format:
        return False
    fmt = registry.FORMATS[choice.format]
    want = choice.encoding.marker()
    have = fmt.params(marker)
    if any(have.get(key) != value for key, value in want.items() if key != "format"):
        return False
    actual = {s: (e.dtype, e.shape) for s, e in layer.tensors.items() if s not in ("bias", "comfy_quant")}
    try:
        return actual == planned_tensors(choice.encoding, n, k)
    except InputError:  # the format cannot hold this shape: the stored layer is not its encode
        return False


def output_files(ckpt: Checkpoint, plan: Plan) -> list[tuple[str, list[LayerPlan | TensorEntry]]]:
    """Per input file (in input order): its layers and other tensors, in model order.  A layer
    goes with its weight's file (the file of its first tensor when it has no weight)."""
    by_file: dict[str, list[LayerPlan | TensorEntry]] = {h.file: [] for h in ckpt.headers}
    for lp in plan.layers:
        anchor = lp.entries.get("weight") or next(iter(lp.entries.values()))
        by_file[anchor.file].append(lp)
    for e in plan.others:
        by_file[e.file].append(e)
    for items in by_file.values():
        items.sort(key=lambda it: natural_key(it.name))
    return list(by_file.items())


def virtual_files(ckpt: Checkpoint, plan: Plan) -> list[tuple[str, dict, dict | None]]:
    """The planned output as (name, tensors, metadata) per file: data None except markers."""
    files: list[tuple[str, dict, dict | None]] = []
    for file, items in output_files(ckpt, plan):
        tensors: dict = {}
        markers: dict[str, dict] = {}
        for lp in items:
            if not isinstance(lp, LayerPlan):  # a tensor of no layer
                tensors[lp.name] = (lp.dtype, lp.shape, None)
                continue
            for suffix, dtype, shape in lp.output_tensors():
                tensors[f"{lp.name}.{suffix}"] = (dtype, shape, None)
            if lp.marker is not None and lp.action != DENSE:
                markers[lp.name] = lp.marker
        mt, meta = marker_entries(markers)
        tensors.update(mt)
        files.append((file, tensors, meta))
    return files


class PlanRefused(InputError):
    """The target would not load the planned output; ``plan`` is the plan (for --dry-run)."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


def _check_whole(ckpt: Checkpoint, plan: Plan) -> None:
    """Refuse a plan whose output the target would not load (format combinations, markers),
    naming the layers that make the combination and the way out.  A runtime that does not load
    the input either (a model its architecture does not fit, parameters it lacks) is no
    measure of the quantization: its findings are left to ``check``."""
    report = check_files(virtual_files(ckpt, plan), plan.target)
    found = new_problems(report, ckpt, plan.target)
    if found:
        formats = ", ".join(plan.formats()) or "no quantized layers"
        plan.refusal = f"refusing: the output ({formats}) would not load for --target {plan.target}: {found[0]}{_culprits(plan)}"
        raise PlanRefused(plan.refusal, plan)


def new_problems(report, ckpt: Checkpoint, target, warnings: bool = True) -> list[str]:
    """``problems`` of an output's report, less those of the runtimes that do not load the
    input as it is either: what the quantization itself would break."""
    found = problems(report, warnings)
    if not found:
        return found
    from ..checker.run import check_checkpoint

    failing = {name for name, verdict in check_checkpoint(ckpt, target=target).verdicts.items() if not verdict.loads}
    if not failing:
        return found
    report.findings = [f for f in report.findings if not (f.targets and set(f.targets) <= failing)]
    return problems(report, warnings)


def _culprits(plan: Plan) -> str:
    """For a convert whose output mixes formats: the layers left in their input format, with
    why each could not take the new one, and what to do about them."""
    by_format: dict[str, int] = {}
    for lp in plan.layers:
        if lp.action in (QUANTIZE, COPY) and lp.marker:
            fmt = str(lp.marker.get("format"))
            by_format[fmt] = by_format.get(fmt, 0) + 1
    if len(by_format) < 2 or plan.mode != "convert":
        return ""
    copied = [lp for lp in plan.layers if lp.action == COPY and lp.marker]
    if not copied:
        return ""
    shown = "; ".join(f"{lp.name} stays {(lp.marker or {}).get('format')} ({lp.reason})" for lp in copied[:4])
    more = f"; and {len(copied) - 4} more" if len(copied) > 4 else ""
    return (
        f". Layers left in their input format: {shown}{more}. Give them a format this target loads with "
        f'the others, or decode them (a rules file: [[rules]] match = ["{copied[0].name}"] format = "dense"), '
        f"or choose a --target that loads the mix (--dry-run prints the whole plan)"
    )
