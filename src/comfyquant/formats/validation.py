"""Word one layer's reading against its format as findings.

``Format.interpret`` judges the layer's marker and tensors against the description (all the
evaluation of its expressions); this module only says what it found: codes, messages, causes
and fixes.

The result depends only on the format, the marker and the (suffix, dtype, shape) of the
layer's tensors, so results are cached by that signature: a 14B model has ~600 layers but a
few dozen distinct signatures.  Findings are layer-relative (``tensor`` is the suffix and the
message holds a ``{layer}`` placeholder) until bound with ``Finding.with_layer``.
"""

from __future__ import annotations

from functools import cache

from ..findings import Finding
from ..shapes import fmt_shape
from .base import FORBIDDEN, INVALID, MISSING, NESTED, UNDERSCORED, Format, MarkerKey, Slot
from .diagnose import dtype_cause, fix_text, shape_cause


def check_layer(fmt: Format, marker: dict | None, tensors: dict, memo=None, layer=None):
    """Layer-relative findings and the geometry env (None when it cannot be inferred).

    ``marker`` None means the layer has no marker and the format was inferred: marker keys are
    then not checked (a separate finding reports the missing marker).
    """
    if memo is None:
        return _check(fmt, marker, tensors)
    return memo.get("format:" + fmt.name, marker, layer, lambda: _check(fmt, marker, tensors))


def _check(fmt: Format, marker: dict | None, tensors: dict) -> tuple[list[Finding], dict | None]:
    reading = fmt.interpret(marker, tensors)
    out: list[Finding] = []
    for problem in reading.keys:
        out.append(_key_finding(fmt, problem))
    env = reading.env
    if env is None:
        out.append(_geometry_finding(fmt, tensors, reading.geometry_error))
        return out, None
    for state, slot, entry, detail in reading.slots:
        if state == MISSING:
            out.append(
                Finding(
                    "L001",
                    f"layer {{layer}} ({fmt.name}) is missing {slot.suffix} ({slot.meaning})",
                    tensor=slot.suffix,
                    expected=_expected_text(slot, detail),
                    actual="absent",
                    cause="incomplete export or the tensor is in a missing shard",
                    fix="re-export the layer (comfyquant quantize)",
                )
            )
        elif state == FORBIDDEN:
            out.append(
                Finding(
                    "L006",
                    f"layer {{layer}} ({fmt.name}, {env.get('variant', '')}) must not have {slot.suffix}",
                    tensor=slot.suffix,
                    expected="absent",
                    actual=f"{entry.dtype} {fmt_shape(entry.shape, as_tuple=True)}",
                    cause=detail or "not allowed in this variant",
                    fix="re-export the layer from the original weights (comfyquant quantize)",
                )
            )
        else:
            out.append(_mismatch_finding(fmt, slot, env, entry, *detail))
    for suffix, entry in reading.unknown:
        out.append(
            Finding(
                "L007",
                f"layer {{layer}} ({fmt.name}) has {suffix}, which the format does not define",
                tensor=suffix,
                actual=f"{entry.dtype} {fmt_shape(entry.shape, as_tuple=True)}",
                cause="left over from another format or export; runtimes leave it unconsumed",
                fix="remove the tensor (comfyquant fix)",
            )
        )
    for c in reading.failed:
        out.append(
            Finding(
                "L005",
                f"layer {{layer}} ({fmt.name}): " + c.message.format(**env),
                expected=c.expr,
                actual=_env_text(fmt, env),
                cause=c.cause or None,
                fix=c.fix or None,
            )
        )
    return out, env


def _geometry_finding(fmt: Format, tensors: dict, error: str) -> Finding:
    if "weight" not in tensors:
        return Finding(
            "L001",
            f"layer {{layer}} ({fmt.name}) has no weight tensor",
            tensor="weight",
            expected="weight",
            actual="absent",
            cause="the weight is in a shard that is missing, or the marker names the wrong layer",
            fix="check the shards and the marker's layer name",
        )
    return Finding(
        "L008",
        f"layer {{layer}} ({fmt.name}): {error}",
        tensor="weight",
        actual=f"{tensors['weight'].dtype} {fmt_shape(tensors['weight'].shape, as_tuple=True)}",
    )


def _expected_text(slot: Slot, shape: tuple | None) -> str:
    """The dtype and concrete shape a missing tensor should have; the dtype alone when the
    layer's other tensors cannot tell its shape (a finding never shows a formula)."""
    if shape is None:
        return slot.dtype
    try:
        return f"{slot.dtype} {fmt_shape(shape, as_tuple=True)}"
    except Exception:  # noqa: BLE001 -- a shape that does not format is as unknown as none
        return slot.dtype


def _mismatch_finding(fmt: Format, slot: Slot, env: dict, entry, expected: tuple, dtype_ok: bool, shape_ok: bool) -> Finding:
    causes = []
    if not shape_ok:
        causes.append(shape_cause(slot, env, entry.shape, expected))
    if not dtype_ok:
        causes.append(dtype_cause(slot, entry.dtype))
    severities = [c.severity for c in causes]
    severity = "error" if "error" in severities else "warning" if "warning" in severities else "info"
    code = "L004" if not dtype_ok and not shape_ok else "L002" if not dtype_ok else "L003"
    exp = f"{slot.dtype} {fmt_shape(expected, as_tuple=True)}"
    act = f"{entry.dtype} {fmt_shape(entry.shape, as_tuple=True)}"
    cause = "; ".join(c.text for c in causes)
    return Finding(
        code,
        f"layer {{layer}} ({fmt.name}): {slot.suffix} is {act}, expected {exp}: " + cause,
        tensor=slot.suffix,
        expected=exp,
        actual=act,
        cause=cause,
        fix=fix_text(causes),
        severity=severity,
    )


GEOMETRY_NAMES = ("N", "K", "bits")
"""The geometry every format infers; a constraint finding shows them and the format's numeric
marker parameters (group size, ConvRot size ...)."""


def _env_text(fmt: Format, env: dict) -> str:
    names = GEOMETRY_NAMES + tuple(k.name for k in fmt.keys if int in k.types)
    return ", ".join(f"{k}={env[k]}" for k in names if k in env)


def _key_finding(fmt: Format, problem: tuple) -> Finding:
    kind = problem[0]
    if kind == NESTED:
        nested = problem[1]
        moved = sorted(nested) if isinstance(nested, dict) else []
        return Finding(
            "M033",
            f"layer {{layer}}: marker nests {moved} in a 'params' object",
            expected="flat marker keys",
            actual=f"params={nested!r}"[:120],
            cause=f"ComfyUI reads {_nested_keys_text()} from params; SGLang ignores them (a ConvRot flag there is silently lost)",
            fix="flatten the marker (comfyquant fix)",
        )
    if kind == UNDERSCORED:
        _kind, key, value = problem
        return Finding(
            "M034",
            f"layer {{layer}}: marker key {key!r} starts with an underscore",
            actual=f"{key}={value!r}",
            cause="SGLang adds internal '_' keys in memory; a stored one can conflict with them",
            fix="drop the key (comfyquant fix)",
        )
    if kind == INVALID:
        _kind, k, value, why = problem
        return Finding(
            "M035",
            f"layer {{layer}} ({fmt.name}): marker {k.name}={value!r} is not allowed",
            expected=f"{k.name}: {k.allowed_text}",
            actual=f"{k.name}={value!r}",
            cause=why or _key_cause(k, value),
            fix=f"set {k.name} to {k.allowed_text}",
        )
    k = problem[1]
    what = k.missing_text or f"{k.name} left to its default ({k.default!r})"
    return Finding(
        "M036",
        f"layer {{layer}} ({fmt.name}): marker has no {k.name}: {what}",
        expected=f"{k.name} written explicitly ({k.allowed_text})",
        actual="absent",
        cause=k.why_explicit or None,
        fix=f"add {k.name}: {_default_text(k)} (comfyquant fix)",
    )


def _default_text(k: MarkerKey) -> str:
    if k.suggested:
        return k.suggested
    return repr(k.default) if k.default is not None else "a value"


@cache
def _nested_keys_text() -> str:
    """The keys ComfyUI also reads from a nested ``params`` object: every format's ``nested_ok``
    keys (the ``params`` fallback of ComfyUI 0.33.0 ``comfy/ops.py``), in name order."""
    from .registry import FORMATS  # imports every format package: only on this rare path

    names = sorted({k.name for f in FORMATS.values() for k in f.keys if k.nested_ok})
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _key_cause(k: MarkerKey, value) -> str:
    if isinstance(value, str) and int in k.types:
        return "a number written as a string"
    return f"{k.name} must be {k.allowed_text}"
