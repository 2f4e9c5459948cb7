"""Plan repairs from the checkpoint and the format descriptions.

The planner does not parse findings: it compares each layer's tensors and marker with its
format's description (the same data the checker uses) and derives, for every deviation it can
undo exactly, an edit: transpose, upcast to F32, relabel the dtype of identical bytes,
reshape without reordering, convert unblocked block scales to the blocked layout, complete or
normalise a marker, add a marker where the format is unambiguous.  Anything else is left for
the re-check after writing to report as unfixable, with the checker's fix advice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from ..checker.fit import differing_keys, explain, fitting_side
from ..checker.rules import prefix_match
from ..dtypes import QUANTIZED_WEIGHT_DTYPES
from ..errors import option
from ..findings import json_kind
from ..formats.base import Format, GeometryError, Meta
from ..formats.diagnose import dtype_matches
from ..formats.registry import FORMATS, infer_format
from ..markers import HEADER, TENSOR, MarkerMerge, file_level_markers
from ..numerics import bytewise as transforms
from ..shapes import fmt_shape
from .edits import STORAGE, Assumption, Change, Options, Plan, TensorEdit

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint, Layer

UNCARRIABLE = ("C001", "C002", "C005", "C006", "C010", "C011", "C016")
"""Container damage a rewrite cannot carry over exactly: a tensor whose bytes do not match its
dtype and shape, or lie past the end of the file, an unknown dtype, a malformed entry, a name
in two shards, a missing shard, a header safetensors refuses that Python's JSON reads (which of
a repeated key's values is meant is not for a rewrite to guess).  Writing anyway would drop or
garble data."""


def plan_repairs(ckpt: Checkpoint, options: Options) -> Plan:
    plan = Plan()
    plan.options = options
    damage = next((f for f in [*(f for h in ckpt.headers for f in h.findings), *ckpt.findings] if f.code in UNCARRIABLE), None)
    if damage is not None:
        plan.refused.append(
            (
                None,
                f"{damage.message} [{damage.code}]: fix rewrites a checkpoint only when it can carry every tensor over exactly",
            )
        )
        return plan
    _metadata_text(ckpt, plan)
    markers = _final_markers(ckpt, options, plan)
    plan.markers = markers
    from .migrate import claims_for, plan_dialects

    claims = claims_for(ckpt, options.to)
    plan_dialects(ckpt, plan, markers, options.allow_lossy, claims)
    claimed = {p for c in claims for p in c.layers}
    implied = file_level_markers(ckpt)
    for prefix, layer in ckpt.layers.items():
        if prefix in plan.kept or prefix in claimed:
            continue  # its marker is undecided: nothing is planned from it
        marker = markers.get(prefix)
        if marker is None and prefix in implied:
            marker = _file_level_marker(layer, implied[prefix], plan)
            if marker is None:
                continue
            markers[prefix] = marker
        elif marker is None:
            marker = _infer_marker(layer, options, plan)
            if marker is None:
                continue
            markers[prefix] = marker
        fmt = _format_of(marker)
        if fmt is None:
            continue
        if layer.bank is not None:
            # A MoE expert bank: its tensors are seen through a 2-D view (flattened rows or
            # expert 0), and an edit would be written in that shape.  Banks are copied as stored; a repair the bank
            # would need is refused (planned on a scratch plan only to know whether there is one).
            probe = Plan()
            probe.options = options
            _repair_tensors(ckpt, layer, fmt, marker, probe)
            if probe.changes or probe.requant or probe.refused:
                plan.refused.append(
                    (
                        prefix,
                        f"MoE expert bank of {layer.bank.experts} experts: fix does not rewrite the "
                        "tensors of expert banks; re-export the bank",
                    )
                )
            continue
        _repair_tensors(ckpt, layer, fmt, marker, plan)
    plan.markers = markers
    for prefix, marker in implied.items():
        plan.stated.setdefault(prefix, []).append(marker)
    _assumptions(ckpt, plan)
    _marker_storage(ckpt, plan)
    return plan


# -- markers ---------------------------------------------------------------------------------


def _final_markers(ckpt: Checkpoint, options: Options, plan: Plan) -> dict[str, dict]:
    """Merge each layer's marker sources, then normalise them against the format's keys."""
    ms = ckpt.markers
    out: dict[str, dict] = {}
    layers = ckpt.layers
    for prefix, sources in ms.sources.items():
        target_prefix = prefix
        if prefix not in layers:
            match = prefix_match(prefix, layers)
            if match is None:
                plan.changes.append(
                    Change(
                        prefix,
                        None,
                        "remove marker for a layer that does not exist",
                        json.dumps(ms.effective[prefix]),
                        "(removed)",
                    )
                )
                plan.markers_changed = True
                continue
            target_prefix = match
            plan.changes.append(Change(match, None, "re-key header marker to the tensor names", prefix, match))
            plan.markers_changed = True
        plan.stated.setdefault(target_prefix, []).extend(r.obj for r in sources if r.error is None)
        layer = layers.get(target_prefix)
        merged = _merge_sources(prefix, sources, options, plan, layer.tensors if layer is not None else None)
        if merged is None:
            # Refused: the layer keeps its markers exactly as found (a rewrite must not drop them).
            kept = plan.kept.setdefault(target_prefix, {})
            for rec in sources:
                if rec.error is None:
                    kept.setdefault(rec.kind, {}).update({k: v for k, v in rec.obj.items() if k not in kept.get(rec.kind, {})})
            continue
        if target_prefix in out:
            merged = {**merged, **out[target_prefix]}
        out[target_prefix] = merged
    for prefix, marker in list(out.items()):
        out[prefix] = _normalise(prefix, marker, options, plan)
    return out


def _merge_sources(prefix: str, sources: list, options: Options, plan: Plan, layer_tensors: dict | None) -> dict | None:
    """The union of a layer's markers.  On a conflict, ``--prefer`` decides; without it, the
    side whose values the tensors fit when exactly one does (``checker.fit``); else the
    layer is refused."""
    header_recs = [r for r in sources if r.kind == HEADER]
    tensor_recs = [r for r in sources if r.kind == TENSOR]
    headers, tensors = [r.obj for r in header_recs], [r.obj for r in tensor_recs]
    union = MarkerMerge()  # the first value read wins: tensor markers, then the header map
    conflicts = [(key, old, rec.obj[key]) for rec in tensor_recs + header_recs for key, old, _ in union.add(rec)]
    merged = dict(union.merged.get(prefix, {}))
    if not conflicts:
        if headers and tensors and any(set(h) != set(merged) for h in headers + tensors):
            plan.markers_changed = True
        return merged
    if options.prefer is None:
        fit = fitting_side(sources, layer_tensors) if layer_tensors is not None else None
        if fit is not None:
            side, chosen, other = fit
            plan.changes.append(
                Change(
                    prefix,
                    None,
                    f"resolve marker conflict: {explain(side, chosen, other, took=True)}",
                    ", ".join(
                        f"{k}: header {(chosen if side == HEADER else other)[k]!r} / "
                        f"tensor {(chosen if side == TENSOR else other)[k]!r}"
                        for k in differing_keys(chosen, other)
                    ),
                    json.dumps(chosen),
                )
            )
            plan.markers_changed = True
            return dict(chosen)
        keys = ", ".join(sorted({c[0] for c in conflicts}))
        plan.refused.append(
            (
                prefix,
                f"header and tensor markers disagree on {keys} and the tensors fit both or neither: "
                "choose --prefer header or --prefer tensor",
            )
        )
        return None
    first, second = (tensor_recs, header_recs) if options.prefer == TENSOR else (header_recs, tensor_recs)
    preferred = MarkerMerge()  # the preferred side is read first, so its values win
    for rec in first + second:
        preferred.add(rec)
    chosen = dict(preferred.merged[prefix])
    for key, old, new in conflicts:
        keep = chosen[key]
        plan.changes.append(
            Change(
                prefix, None, f"resolve marker conflict on {key!r} (--prefer {options.prefer})", f"{old!r} / {new!r}", repr(keep)
            )
        )
    plan.markers_changed = True
    return chosen


def _normalise(prefix: str, marker: dict, options: Options, plan: Plan) -> dict:
    fmt = _format_of(marker)
    new = {k: v for k, v in marker.items() if not k.startswith("_")}
    for k in marker:
        if k.startswith("_"):
            plan.changes.append(Change(prefix, None, f"drop internal key {k!r}", repr(marker[k]), "(removed)"))
    nested = new.pop("params", None)
    if isinstance(nested, dict):
        moved = {k: v for k, v in nested.items() if k not in new}
        new.update(moved)
        plan.changes.append(Change(prefix, None, "flatten nested params", json.dumps(nested), json.dumps(moved)))
    elif nested is not None:
        new["params"] = nested
    if fmt is None:
        _record(prefix, marker, new, plan)
        return new
    params = fmt.params(new)
    for key in fmt.keys:
        if key.name == "format":
            continue
        if key.name in new:
            value = new[key.name]
            if not key.valid(value):
                fixed = _coerce(key, value)
                if fixed is not _NO:
                    if fixed is _REMOVE:
                        del new[key.name]
                        plan.changes.append(
                            Change(prefix, None, f"remove {key.name} ({key.allowed_text})", repr(value), "(removed)")
                        )
                    else:
                        new[key.name] = fixed
                        plan.changes.append(Change(prefix, None, f"set {key.name} to a valid value", repr(value), repr(fixed)))
        elif key.must_be_explicit(params):
            value = _explicit_value(fmt, key, options)
            if value is not None:
                new[key.name] = value
                params[key.name] = value
                plan.changes.append(Change(prefix, None, f"write {key.name} explicitly", "(absent)", json.dumps(value)))
    _record(prefix, marker, new, plan)
    return new


_NO = object()
_REMOVE = object()

CANDIDATES = {int: (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024, 4096), bool: (True, False)}
"""Other values tried for a key, to learn whether the tensors' shapes single out the written one."""


def _assumptions(ckpt: Checkpoint, plan: Plan) -> None:
    """Every marker value about to be written that the file does not state (no marker source
    of the layer has it, or its sources disagree) and the tensors' shapes do not single out
    (another allowed value fits them as well) is an ``Assumption``, attached to the plan
    lines of its layer."""
    from ..checker.fit import layer_errors

    options = plan.options
    cache: dict = {}  # (signature, marker, key) -> singled out: a model's layers share signatures
    for prefix, marker in plan.markers.items():
        layer = ckpt.layers.get(prefix)
        fmt = _format_of(marker)
        if layer is None or fmt is None or layer.bank is not None:
            continue
        stated = plan.stated.get(prefix, [])
        found: list[Assumption] = []
        base = None
        for key in fmt.keys:
            if key.name == "format" or key.name not in marker:
                continue
            value = marker[key.name]
            said = [v for v in (_stated_value(fmt, key, m) for m in stated) if v is not _NO]
            if said and all(type(v) is type(value) and v == value for v in said):
                continue  # the file states it, consistently
            memo = (layer.signature, json.dumps(marker, sort_keys=True, default=repr), key.name)
            single = cache.get(memo)
            if single is None:
                if base is None:
                    base = layer_errors(marker, layer.tensors) or frozenset()
                single = cache[memo] = _shapes_single_out(key, marker, value, layer.tensors, base, layer_errors)
            if single:
                continue
            if said and options.prefer:
                others = sorted({json.dumps(v) for v in said if v != value})
                source = f"chosen by --prefer {options.prefer} over {', '.join(others)}; the tensors fit both"
            elif key.name == "convrot_groupsize" and options.convrot_groupsize == value:
                source = "given by --convrot-groupsize"
            elif key.name == "convrot" and options.convrot_groupsize is not None and not said:
                source = "the layer is taken as rotated because --convrot-groupsize was given"
            elif value == key.default:
                source = "the readers' default for a missing key"
            else:
                source = "written by fix"
            found.append(Assumption(prefix, key.name, value, source))
        if not found:
            continue
        plan.assumptions.extend(found)
        lines = [c for c in plan.changes if c.layer == prefix and c.tensor is None] or [
            c for c in plan.changes if c.layer == prefix
        ]
        if not lines:
            continue  # no plan line writes it (the summary still lists it)
        for a in found:
            line = next((c for c in lines if a.key in c.what or f'"{a.key}"' in c.after), lines[0])
            line.assumed.append(a)


def _stated_value(fmt: Format, key, marker: dict):
    """The value a stated marker gives ``key`` (nested ``params`` included, numbers written as
    strings read as readers read them), or ``_NO``."""
    if key.name in marker:
        value = marker[key.name]
    elif key.nested_ok and isinstance(marker.get("params"), dict) and key.name in marker["params"]:
        value = marker["params"][key.name]
    else:
        return _NO
    if not key.valid(value):
        fixed = _coerce(key, value, forced=False)
        if fixed is not _NO and fixed is not _REMOVE:
            return fixed
    return value


def _shapes_single_out(key, marker: dict, value, tensors: dict, base: frozenset, layer_errors) -> bool:
    """True when no other allowed value of ``key`` fits the tensors as well as ``value``."""
    candidates = CANDIDATES.get(bool if isinstance(value, bool) else type(value))
    if candidates is None:
        return False  # not enumerable (a string): the shapes cannot single it out
    for alt in candidates:
        if alt == value or type(alt) is not type(value) or not key.valid(alt):
            continue
        errors = layer_errors({**marker, key.name: alt}, tensors)
        if errors is not None and errors <= base:
            return False
    return True


def _coerce(key, value, forced: bool = True):
    """A valid value meaning what readers already understood from ``value``, if there is one.

    ``forced``: also a flag's only valid value (W4A8's ``convrot``, which the format always
    applies, so the readers that load the layer ignore a false one; SGLang refuses it)."""
    if key.drop_invalid:
        return _REMOVE  # the format never uses the key: the readers that load the layer do not miss it
    if bool in key.types:
        if value in (1, "true", "True") and key.valid(True):
            return True
        if value in (0, "false", "False") and key.valid(False):
            return False
        only = _only_flag_value(key)
        return only if forced and only is not None else _NO
    if int in key.types and isinstance(value, (str, float)) and not isinstance(value, bool):
        try:
            n = int(value)
        except ValueError:
            return _NO
        if n == float(value) and key.valid(n):
            return n
    return _NO


def _only_flag_value(key) -> bool | None:
    """The one value a boolean key allows (None: both, or it is no flag)."""
    if bool not in key.types:
        return None
    allowed = [v for v in (True, False) if key.valid(v)]
    return allowed[0] if len(allowed) == 1 else None


def _explicit_value(fmt: Format, key, options: Options):
    only = _only_flag_value(key)
    if only is not None:
        return only
    if key.name == "convrot_groupsize" and options.convrot_groupsize is not None:
        return options.convrot_groupsize
    return key.default


def _record(prefix: str, before: dict, after: dict, plan: Plan) -> None:
    if before != after:
        plan.markers_changed = True


def _infer_marker(layer: Layer, options: Options, plan: Plan) -> dict | None:
    """A marker for an unmarked quantized layer, where the tensors say which format it is."""
    w = layer.tensors.get("weight")
    if w is None or w.dtype not in QUANTIZED_WEIGHT_DTYPES:
        return None
    fmt = infer_format(layer.tensors)
    if fmt is None:
        plan.refused.append((layer.prefix, f"{w.dtype} weight without a marker and no known format matches its tensors"))
        return None
    if fmt.rotation != "none" and options.convrot_groupsize is None:
        plan.refused.append(
            (
                layer.prefix,
                f"unmarked layer looks like {fmt.name}, but its ConvRot size cannot be told "
                f"from the tensors: pass {option('--convrot-groupsize C', 'convrot_groupsize=C')} (16, 64 or 256)",
            )
        )
        return None
    keys = (fmt.infer_marker or _generic_marker)(fmt, layer.tensors, options.convrot_groupsize)
    if isinstance(keys, str):
        plan.refused.append((layer.prefix, keys))
        return None
    marker: dict = {"format": fmt.name, **keys}
    plan.changes.append(Change(layer.prefix, None, f"add marker (tensors match {fmt.name})", "(none)", json.dumps(marker)))
    plan.markers_changed = True
    return marker


def _generic_marker(fmt: Format, tensors: dict, convrot_groupsize: int | None) -> dict:
    """The inferred marker of a format without an ``infer_marker`` hook: nothing but the
    rotation, when the format rotates (``convrot: true`` where a key switches it on)."""
    if fmt.rotation == "none":
        return {}
    keys: dict = {"convrot": True} if fmt.key("convrot") is not None else {}
    keys["convrot_groupsize"] = convrot_groupsize
    return keys


def _file_level_marker(layer: Layer, marker: dict, plan: Plan) -> dict | None:
    """The marker the file's ``quant_format`` gives this unmarked layer in SGLang (0.5.23
    ``inspect_comfy_quant_markers``), written per layer so that ComfyUI and comfy-kitchen, which
    never read ``quant_format``, read the layer as SGLang does.  ``quant_format`` itself stays:
    it describes the same layers, and SGLang keeps loading the file the way it did."""
    fmt = FORMATS[marker["format"]]
    w = layer.tensors["weight"]
    if fmt.recognize is not None and not fmt.recognize(layer.tensors):
        guess = infer_format(layer.tensors)
        looks = f"; they look like {guess.name}" if guess is not None else ""
        plan.refused.append(
            (
                layer.prefix,
                f"quant_format={fmt.quant_format} makes this unmarked layer {fmt.name} in SGLang, "
                f"but its tensors are not {fmt.name} (weight {w.dtype} {fmt_shape(w.shape, as_tuple=True)}{looks}): "
                f"SGLang refuses the file (X1); re-export the layer, or remove quant_format "
                f"and run fix again",
            )
        )
        return None
    plan.changes.append(
        Change(
            layer.prefix,
            None,
            f"write the marker quant_format={fmt.quant_format} implies (only SGLang "
            "reads quant_format; ComfyUI and comfy-kitchen need a marker per layer)",
            "(none)",
            json.dumps(marker),
        )
    )
    plan.markers_changed = True
    return dict(marker)


def _metadata_text(ckpt: Checkpoint, plan: Plan) -> None:
    """Non-string ``__metadata__`` values (C007, which safetensors refuses) become their JSON
    text: the value is kept, only its type changes."""
    for h in ckpt.headers:
        for key, value in h.nonstring_metadata.items():
            text = json.dumps(value)
            plan.metadata_text.setdefault(h.file, {})[key] = text
            shown = text if len(text) <= 40 else text[:37] + "..."
            plan.changes.append(
                Change(None, None, f"store __metadata__[{key!r}] as JSON text", f"{json_kind(value)} {shown}", "string")
            )


def _marker_storage(ckpt: Checkpoint, plan: Plan) -> None:
    """Markers are written both as U8 tensors and in the header map; note where that changes."""
    for prefix in plan.markers:
        layer = ckpt.layers.get(prefix)
        if layer is None:
            continue
        entry = layer.tensors.get("comfy_quant")
        if entry is not None and entry.dtype != "U8":
            plan.changes.append(Change(prefix, entry.name, "store marker as U8", entry.dtype, "U8"))
            plan.markers_changed = True
        kinds = {r.kind for r in ckpt.markers.sources.get(prefix, [])}
        if kinds != {HEADER, TENSOR}:
            plan.markers_changed = True
    if plan.markers_changed and not any(c.what == STORAGE for c in plan.changes):
        plan.changes.append(Change(None, None, STORAGE, "as found", "both, identical"))


# -- tensors ---------------------------------------------------------------------------------


def _repair_tensors(ckpt: Checkpoint, layer: Layer, fmt: Format, marker: dict, plan: Plan) -> None:
    tensors = dict(layer.tensors)
    for old, new in plan.renames.items():
        suffix_old, suffix_new = old.rsplit(".", 1)[-1], new.rsplit(".", 1)[-1]
        if old.startswith(layer.prefix + ".") and suffix_old in tensors:
            tensors[suffix_new] = tensors.pop(suffix_old)
    try:
        env = fmt.geometry(tensors, fmt.params(marker))
    except GeometryError:
        return
    exact = _exact_edits(ckpt, layer, fmt, env, tensors, plan)
    op = _lossy(layer, fmt, env, tensors, marker, plan) if fmt.lossy is not None else None
    if op is False:
        return  # a re-encode is needed but not allowed: refused, nothing planned for the layer
    for suffix, entry, edit, change in exact:
        if op is not None and suffix in op.replaces:
            # The re-encode replaces this tensor: the exact repair is what it decodes from.
            op.source_edits[suffix] = edit
            change.what += "; the re-encode starts from the repaired tensor"
        else:
            plan.edits[entry.name] = edit
        plan.changes.append(change)
    if op is not None:
        unreadable = _undecodable(fmt, marker, tensors, op)
        if unreadable is not None:
            plan.requant.pop(layer.prefix, None)
            plan.markers[layer.prefix] = marker
            plan.refused.append(
                (
                    layer.prefix,
                    f"{unreadable}: the re-encode cannot decode the layer without an exact repair of it; re-export the layer",
                )
            )
            return
        plan.changes.append(op.change)  # after the exact repairs it builds on


def _undecodable(fmt: Format, marker: dict, tensors: dict, op) -> str | None:
    """The first error its codec would raise on decoding the tensors a re-encode replaces,
    after their exact repairs (None: they decode).  Checked here, before anything is written
    or computed, with the format description the codec itself checks against."""
    from ..formats.validation import check_layer

    metas = {}
    for suffix, entry in tensors.items():
        if suffix in op.replaces:
            edit = op.source_edits.get(suffix)
            metas[suffix] = Meta(edit.dtype, edit.shape) if edit is not None else Meta(entry.dtype, entry.shape)
    findings, _env = check_layer(fmt, marker, metas)
    bad = next((f for f in findings if f.severity == "error" and f.code.startswith("L")), None)
    return None if bad is None else bad.message.replace("{layer}", repr(op.prefix))


def _exact_edits(ckpt: Checkpoint, layer: Layer, fmt: Format, env: dict, tensors: dict, plan: Plan) -> list[tuple]:
    """(suffix, stored entry, ``TensorEdit``, plan line) of every exact repair of the layer's tensors."""
    out: list[tuple] = []
    quant_format = {v.lower() for v in ckpt.markers.quant_formats.values() if v}
    for suffix, slot in fmt.slots_for(env).items():
        entry = tensors.get(suffix)
        if entry is None or slot.is_forbidden(env):
            continue
        expected = slot.expected_shape(env)
        dtype, shape = entry.dtype, entry.shape
        steps: list[Callable[[bytes], bytes]] = []
        notes: list[str] = []
        if shape != expected:
            if len(shape) == 2 and shape[::-1] == expected and shape[0] != shape[1]:
                steps.append(partial(transforms.transpose, dtype=dtype, shape=shape))
                notes.append("transpose")
                shape = expected
            elif _numel(shape) == _numel(expected) and _squeeze(shape) == _squeeze(expected):
                notes.append("reshape")
                shape = expected
            elif slot.blocked and len(shape) == 2 and shape == (env["N"], env["K"] // slot.blocked):
                rows, cols = shape
                steps.append(partial(_blocked_bytes, rows=rows, cols=cols))
                notes.append("convert to the blocked layout")
                shape = expected
            else:
                continue  # not an exact transform: the re-check reports it with its cause
        if not dtype_matches(slot, dtype):
            if slot.dtype == "F32" and dtype in ("BF16", "F16"):
                steps.append(partial(transforms.to_f32, dtype=dtype))
                notes.append(f"upcast {dtype} -> F32 (exact)")
                dtype = "F32"
            elif dtype == "U8" and slot.dtype in ("F8_E4M3", "I8"):
                notes.append(f"relabel U8 -> {slot.dtype} (same bytes)")
                dtype = slot.dtype
            elif dtype == "I8" and slot.dtype == "U8":
                notes.append("relabel I8 -> U8 (same bytes)")
                dtype = "U8"
        elif slot.dtype == "F8_E8M0" and dtype == "F8_E8M0" and fmt.quant_format and quant_format == {fmt.quant_format}:
            # U8 and E8M0 are the same bytes; SGLang's quant_format path accepts only U8
            # (and ComfyUI reads both), so such files get U8 scales.
            notes.append(f"relabel F8_E8M0 -> U8 (same bytes; SGLang quant_format={fmt.quant_format} needs U8)")
            dtype = "U8"
        if not notes:
            continue
        name = plan.renames.get(entry.name, entry.name)
        edit = TensorEdit(name, dtype, shape, _chain(steps) if steps else None)
        change = Change(
            layer.prefix,
            name,
            ", ".join(notes),
            f"{entry.dtype} {fmt_shape(entry.shape, as_tuple=True)}",
            f"{dtype} {fmt_shape(shape, as_tuple=True)}",
        )
        out.append((suffix, entry, edit, change))
    return out


def _lossy(layer: Layer, fmt: Format, env: dict, tensors: dict, marker: dict, plan: Plan):
    """The format's lossy re-encode when the target needs one and it is allowed (a
    ``Requant``, its plan line not yet in the plan); None when none is needed; False when it
    is needed but not allowed (the layer is refused)."""
    from .lossy import plan_requant

    op = plan_requant(layer.prefix, fmt, env, tensors, marker, plan.options.target)
    if op is None:
        return None
    if not plan.options.allow_lossy:
        plan.refused.append(
            (
                layer.prefix,
                f"{op.why}: a lossy re-quantization; re-run with {option('--allow-lossy', 'allow_lossy=True')} "
                "(the error is measured and reported)",
            )
        )
        return False
    op.change = Change(
        layer.prefix,
        None,
        f"re-quantize: {op.why}",
        f"{tensors['weight'].dtype} {fmt_shape(tensors['weight'].shape, as_tuple=True)} ({env.get('variant')})",
        op.recode.after,
        kind="lossy",
    )
    plan.requant[layer.prefix] = op
    plan.markers[layer.prefix] = op.marker
    plan.markers_changed = True
    return op


def _format_of(marker: dict) -> Format | None:
    """The described format a marker names (None: none, or no name)."""
    name = marker.get("format")
    return FORMATS.get(name) if isinstance(name, str) else None


def _blocked_bytes(data: bytes, rows: int, cols: int) -> bytes:
    """``to_blocked``'s bytes (its shape is the slot's, known already)."""
    return transforms.to_blocked(data, rows, cols)[0]


def _chain(steps: list[Callable[[bytes], bytes]]) -> Callable[[bytes], bytes]:
    def run(data: bytes) -> bytes:
        for step in steps:
            data = step(data)
        return data

    return run


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _squeeze(shape: tuple) -> tuple:
    return tuple(d for d in shape if d != 1)
