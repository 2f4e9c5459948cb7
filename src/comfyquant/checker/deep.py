"""``--deep``: read the small tensors (scales, codebooks, corrections; never weights) and check
their values.  numpy is imported here only, so plain ``check`` stays light."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..dialects.reading import file_ends, sound
from ..findings import DEEP_MEASURES, Finding
from ..formats.base import CODEBOOK, CORRECTION, SCALE
from ..formats.registry import FORMATS
from ..targets.base import Violation
from . import dropped

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

MAX_DEEP_BYTES = 256 * 1024 * 1024


GARBAGE_CODES = frozenset({"D001", "D005", "D007"})
"""Value findings that make a layer compute garbage in every runtime that reads the tensor:
NaN/Inf poison the output.  Zero and negative scales (D002, D003) do when every scale is
(``WHOLE``): the layer decodes to zero or to its negation; one bad row or group among many
leaves the output measurably close (relative error well under 0.9), so that stays a warning.
An unsorted codebook (D004) still decodes by its table, and an all-zero tensor that is not a
scale (D006) may be a placeholder: those stay warnings too."""
WHOLE_CODES = frozenset({"D002", "D003"})
WHOLE = "all"
"""How a D002/D003 finding's ``actual`` begins when every scale of the tensor is affected."""
TINY = 1.1754944e-38
"""The smallest normal F32: scales below it are subnormal."""


SATURATED = "D009"
"""Every scale at its dtype's largest finite value: the writer's scale overflowed and the
cast saturated it, so each weight decodes hundreds of times too large (garbage)."""
ON_GRID = "decoded onto the INT8 grid"
"""How a NaN/Inf finding's ``actual`` ends on a scale the decode clamps onto the INT8 grid
(``Slot.on_int8_grid``): a non-finite group scale gives that group one constant code instead
of a non-finite output, so only every group scale non-finite is garbage; some of them degrade
the layer.  A scale whose decode adds zero points (``Slot.adds_zero_points``) is a degraded
output, not garbage, when every scale is zero or subnormal."""


class Measured:
    """A value ``--deep`` measured on one tensor: what it is (``quantity``) and its ``value``.
    Every finding on that tensor that rests on it (``MEASURING``) or promises it
    (``findings.DEEP_MEASURES``) carries it, in the text report's ``measured`` line and as
    the JSON ``measured`` object."""

    __slots__ = ("tensor", "quantity", "value", "why")

    def __init__(self, tensor: str, quantity: str, value: float | None, why: str | None = None) -> None:
        self.tensor = tensor
        self.quantity = quantity
        self.value = value
        self.why = why
        """Why there is no value (``value`` None): the measurement is undefined."""

    def to_dict(self) -> dict:
        out: dict = {"quantity": self.quantity, "value": self.value}
        if self.why:
            out["why"] = self.why
        return out


MEASURING = frozenset({"D008", dropped.CODE})
"""Findings that state a measurement's outcome (a cast that changes the weight, a dropped
correction's share): they carry the value they rest on."""
RELATIVE_ERROR = "relative error"
NON_FINITE = "the values or their scale are not finite (other findings say which)"
"""Why a relative error is undefined."""
UNDEFINED_SHARE = "the layer's values are not finite or not of dtypes it decodes (other findings say which)"
"""Why a dropped correction's share is undefined."""


UNMEASURED = (
    "its values cannot be read as the layer's format (a tensor of another dtype or shape, or bytes that are not "
    "what the header says: the layer's other findings name it)"
)
"""Why a promised measurement was not made."""


def attach(findings: list[Finding], measured: list[Measured]) -> None:
    """Give each finding the measurement of its tensor when it rests on it or promises it; a
    promise ``--deep`` could not keep says why (``value`` null), so every promise is answered."""
    by_tensor = {m.tensor: m for m in measured}
    for f in findings:
        m = by_tensor.get(f.tensor) if f.tensor else None
        if m is not None and (f.code in MEASURING or DEEP_MEASURES in f.message):
            f.measured = m.to_dict()
        elif DEEP_MEASURES in f.message:
            f.measured = {"quantity": RELATIVE_ERROR, "value": None, "why": UNMEASURED}


def _measure(tensor: str, error: float | None) -> Measured:
    """A relative error, or why it is undefined (non-finite values or scale)."""
    if error is None or not math.isfinite(error):
        return Measured(tensor, RELATIVE_ERROR, None, NON_FINITE)
    return Measured(tensor, RELATIVE_ERROR, round(float(error), 6))


def makes_garbage(f: Finding) -> bool:
    """Whether a value finding means the layer's output is garbage (see ``GARBAGE_CODES``;
    D008: a weight the runtime's value cast changes; D009: saturated scales)."""
    actual = f.actual or ""
    if f.code == dropped.CODE:
        return actual.startswith("garbage")
    if f.code in ("D001", "D007") and actual.endswith(ON_GRID):
        return actual.startswith(WHOLE + " ")
    return (
        f.code in GARBAGE_CODES
        or f.code in ("D008", SATURATED, LEVEL_MISMATCH)
        or (f.code in WHOLE_CODES and actual.startswith(WHOLE + " "))
    )


def value_failures(findings: list[Finding], verdicts: dict, prefixes: dict[str, str]) -> None:
    """Add to each runtime's verdict a silent error (no exception: the runtime loads and runs)
    for every garbage-making value finding on a tensor that runtime reads, covering that
    finding, so severity and verdicts agree: such a finding is an error exactly when a
    selected runtime computes with the tensor.  A runtime reads a tensor unless its profile
    already says it drops it (a silent loss on that tensor, e.g. ComfyUI's W4A8 correction)."""
    for f in findings:
        if not makes_garbage(f) or not f.tensor or not f.layer:
            continue
        prefix = prefixes.get(f.layer, f.layer)
        suffix = f.tensor[len(prefix) + 1 :] if f.tensor.startswith(prefix + ".") else f.tensor
        for verdict in verdicts.values():
            if f.code in CAST_TARGETS and verdict.target not in CAST_TARGETS[f.code]:
                continue
            if suffix in UNUSED.get(verdict.target, ()):
                continue
            unread = f.code not in CAST_TARGETS  # a cast weight is read, its warning says how
            if unread and any(not v.fails and v.layer == prefix and v.tensor == suffix for v in verdict.violations):
                continue
            v = Violation(
                f"{verdict.target}.values",
                f"layer '{prefix}' computes garbage (no error): {f.message}",
                exception=None,
                layer=prefix,
                tensor=suffix,
                blocking=False,
                cause=f.cause,
                fix=f.fix,
                severity="error",
            )
            v.covers = f
            verdict.violations.append(v)


INTEGERS = {"U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8"}


def _decoder():
    import numpy as np

    def fp8_e4m3_table():
        codes = np.arange(256, dtype=np.uint32)
        s = np.where(codes & 0x80, -1.0, 1.0)
        e = (codes >> 3) & 0xF
        m = codes & 0x7
        val = np.where(e == 0, 2.0**-6 * (m / 8.0), 2.0 ** (e.astype(np.float64) - 7) * (1 + m / 8.0))
        val = np.where((e == 15) & (m == 7), np.nan, val)
        return (s * val).astype(np.float32)

    e4m3 = fp8_e4m3_table()

    def decode(data: bytes, dtype: str, as_dtype: str):
        if dtype in ("U8", "I8") and as_dtype in ("F8_E4M3", "F8_E8M0"):
            dtype = as_dtype  # one-byte codes in an FP8 slot: ComfyUI views their bytes as FP8
        raw = np.frombuffer(data, dtype=np.uint8)
        if dtype == "F32":
            return np.frombuffer(data, dtype="<f4")
        if dtype == "F16":
            return np.frombuffer(data, dtype="<f2").astype(np.float32)
        if dtype == "BF16":
            return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        if dtype == "F8_E4M3":
            return e4m3[raw]
        if dtype == "F8_E8M0":
            with np.errstate(over="ignore"):  # 255 is NaN, set below; 2**128 overflows on the way
                out = np.exp2(raw.astype(np.float32) - 127)
            out[raw == 255] = np.inf  # byte 0 is 2**-127 (comfy-kitchen: 0): either way below TINY, no scale
            return out
        if dtype == "F8_E5M2":  # the top byte of a float16
            return (raw.astype(np.uint16) << 8).view("<f2").astype(np.float32)
        if dtype in INTEGERS:
            # a scale stored as integers is read by value: runtimes that take it cast it
            return np.frombuffer(data, dtype=INTEGERS[dtype]).astype(np.float32)
        return None

    return np, decode


CASTS = ("I8", "U8", "F8_E4M3", "F8_E5M2")
"""Weight dtypes ComfyUI casts a stored weight to by value (``weight.to(storage dtype)``)."""
CAST_TARGETS = {"D008": ("comfyui",), dropped.CODE: ("comfyui",)}
UNUSED = {"comfyui": frozenset({"input_scale"}), "comfy-kitchen": frozenset({"input_scale"})}
"""Tensors a runtime does not compute with on the path the verdicts are proven for: ComfyUI on
CPU has no FP8 compute, so it never quantizes the activation with ``input_scale`` (on a GPU
with FP8 compute it does), and comfy-kitchen's layouts do not take it."""
"""Value findings that only the listed runtimes turn into garbage (the others refuse the dtype)."""


def _survives_cast(np, v, source: str, target: str, packed: bool = False) -> bool:
    """Whether torch's value cast of ``v`` (stored as ``source``) to ``target`` leaves the
    weight close to what it holds: integers wrap modulo 256 into I8/U8 (the same bytes come
    back: the codes survive); otherwise the cast values (floats truncated and wrapped into
    I8/U8, rounded to the nearest FP8 value) must stay within a relative error of
    ``CAST_GARBAGE`` of the stored ones."""
    if _relabelled(np, v, source, target):
        return False  # FP8 bytes labelled U8: the cast turns each code's bits into a count
    if target in ("I8", "U8"):
        lo = -128 if target == "I8" else 0
        if source in INTEGERS:
            wrapped = ((v.astype(np.int64) - lo) % 256) + lo
            if source in ("U8", "I8"):
                back_lo = -128 if source == "I8" else 0
                wrapped = ((wrapped - back_lo) % 256) + back_lo
            if np.array_equal(wrapped, v.astype(np.int64)):
                return True
            cast = (((v.astype(np.int64) - lo) % 256) + lo).astype(np.float64)
        else:
            if not np.isfinite(v).all():
                return False
            cast = ((np.trunc(v).astype(np.int64) - lo) % 256 + lo).astype(np.float64)
    else:
        if not np.isfinite(v).all():
            return False
        cast = _to_fp8(np, v, target)
    ref = v.astype(np.float64)
    if packed:  # two or more codes a byte: any changed byte changes its codes
        if source in ("F8_E4M3", "F8_E5M2") and bool((np.trunc(ref) == ref).all()):
            # whole numbers in a float8: bytes written by value, their low bits already rounded
            # away; what that cost is not in the file any more (the verdict cannot tell)
            return True
        return bool(np.array_equal(cast, ref))
    norm = float(np.sqrt((ref * ref).sum()))
    if norm == 0.0:
        return bool((cast == 0).all())
    return float(np.sqrt(((cast - ref) ** 2).sum())) / norm < CAST_GARBAGE


def _relabelled(np, v, source: str, target: str) -> bool:
    """Whether a U8 weight in an FP8 slot holds FP8 bytes labelled U8 (``RELABELLED``)."""
    return bool(
        source == "U8"
        and target in ("F8_E4M3", "F8_E5M2")
        and v.size
        and RELABELLED[0] <= float((v >= 128).mean()) <= RELABELLED[1]
    )


def _weight_cast_error(np, v, meant, source: str, target: str) -> float | None:
    """The relative error of the weight ComfyUI's value cast of ``v`` (stored as ``source``)
    to ``target`` computes with, against the weight the file holds (``meant``: the stored
    values, or the FP8 values of FP8 bytes labelled U8).  Integers whose bytes come back
    unchanged from the wrap into I8/U8 are the same codes: 0.  None when not finite."""
    ref = meant.astype(np.float64)
    if not np.isfinite(ref).all() or not np.isfinite(v).all():
        return None
    if target in ("I8", "U8"):
        lo = -128 if target == "I8" else 0
        if source in INTEGERS:
            cast = (((v.astype(np.int64) - lo) % 256) + lo).astype(np.float64)
            back_lo = -128 if source == "I8" else 0
            if source in ("U8", "I8") and np.array_equal(((cast.astype(np.int64) - back_lo) % 256) + back_lo, v):
                return 0.0  # the same bytes: the same codes
        else:
            cast = ((np.trunc(v).astype(np.int64) - lo) % 256 + lo).astype(np.float64)
    else:
        cast = _to_fp8(np, v.astype(np.float64), target)
    norm = float(np.sqrt((ref * ref).sum()))
    if norm == 0.0:
        return 0.0 if bool((cast == 0).all()) else 1.0
    return float(np.sqrt(((cast - ref) ** 2).sum())) / norm


def _to_fp8(np, v, target: str):
    """``v`` cast by value to the FP8 dtype ``target`` as torch does: the nearest value, ties
    to the lower one, saturated at the largest (float64)."""
    table = np.sort(_fp8_values(np, target).astype(np.float64))
    idx = np.clip(np.searchsorted(table, v), 1, len(table) - 1)
    left, right = table[idx - 1], table[idx]
    cast = np.where(np.abs(v - left) <= np.abs(right - v), left, right)
    return np.where(v > table[-1], table[-1], np.where(v < table[0], table[0], cast))


def _cast_error(np, values, target: str, scale: float | None) -> float | None:
    """Relative weight error of a dialect's weight a runtime casts by value to the FP8
    ``target`` and multiplies by ``scale`` (None: no scale, or one that applies to both
    readings alike).  A dense weight whose values are all ``target`` values is read as FP8
    codes stored wide (meant: codes x scale, which the runtime computes); any other dense
    weight is read as the weight itself (meant: the values as stored).  None when the values
    are not finite (other findings say so)."""
    v = values.astype(np.float64)
    if not np.isfinite(v).all():
        return None
    cast = _to_fp8(np, v, target)
    norm = float(np.sqrt((v * v).sum()))
    if norm == 0.0:
        return 0.0
    if scale is None or np.array_equal(cast, v):
        return float(np.sqrt(((cast - v) ** 2).sum())) / norm
    return float(np.sqrt(((cast * scale - v) ** 2).sum())) / norm


def _value_cast_findings(np, decode, casts: list, data: dict[str, bytes], measured: list[Measured]) -> list[Finding]:
    """D008 for every dialect weight (``dialects.base.ValueCast``, read into ``data``) whose
    value cast, times its scale, moves it by ``CAST_GARBAGE`` or more; every cast's relative
    error goes to ``measured``."""
    out = []
    for c in casts:
        values = decode(data[c.weight.name], c.weight.dtype, c.weight.dtype)
        scale = None
        if c.scale is not None:
            read = decode(data[c.scale.name], c.scale.dtype, c.scale.dtype)
            if read is None or read.size != 1:
                continue
            scale = float(read.reshape(-1)[0])
        if values is None:
            continue
        error = _cast_error(np, values, c.target, scale)
        measured.append(_measure(c.weight.name, error))
        if error is None or error < CAST_GARBAGE:
            continue
        times = "" if scale is None else f" times its scale {scale:.4g}"
        out.append(
            Finding(
                "D008",
                f"{c.weight.name}: its {c.weight.dtype} values cast to {c.target}{times} are not the weight "
                f"it holds (relative error {error:.3g})",
                layer=c.layer,
                tensor=c.weight.name,
                expected=f"{c.target} codes",
                actual=f"{c.weight.dtype} values",
                cause="the runtime casts this weight by value to its reading's dtype",
                fix="re-export the layer in its own format (comfyquant migrate, or quantize from the original weights)",
            )
        )
    return out


CAST_GARBAGE = 0.9
RELABELLED = (0.3, 0.7)
"""The share of U8 values of 128 and more (an FP8 code's sign bit) that marks a U8 weight in an
FP8 slot as FP8 bytes labelled U8: a weight's signs are balanced, so its FP8 bytes set the top
bit about half the time, where U8 values of a weight cast by value (negatives clamped to 0)
rarely reach 128.  ComfyUI casts those bytes by value: garbage (measured 2.6 relative)."""
"""Relative change of the weight from which the cast layer computes garbage (the harness's
output threshold; a smaller change degrades the layer, and check only warns)."""


def _fp8_values(np, dtype: str):
    """Every finite value of an FP8 dtype (E4M3: 4 exponent bits, bias 7; E5M2: 5, bias 15)."""
    exp_bits, bias = (4, 7) if dtype == "F8_E4M3" else (5, 15)
    man_bits = 7 - exp_bits
    codes = np.arange(128, dtype=np.int64)
    e, m = codes >> man_bits, codes & ((1 << man_bits) - 1)
    val = np.where(e == 0, 2.0 ** (1 - bias) * m / (1 << man_bits), 2.0 ** (e - bias) * (1 + m / (1 << man_bits)))
    top = (1 << exp_bits) - 1
    special = (e == top) & (m == (1 << man_bits) - 1) if dtype == "F8_E4M3" else (e == top)
    val = val[~special]
    return np.concatenate([val, -val]).astype(np.float32)


def deep_findings(ckpt: Checkpoint, casts: list | None = None, measured: list[Measured] | None = None) -> list[Finding]:
    """The value findings of every marked layer, of the W4A8 layers whose correction ComfyUI
    drops, and of the dialect weights a runtime casts by value (``casts``).  What it measures
    on the way (a cast's or a dropped correction's relative error) goes to ``measured``, for
    ``attach``."""
    measured = [] if measured is None else measured
    wanted = []
    ends = file_ends(ckpt)
    casts = [c for c in casts or () if all(_sound(e, ends) for e in c.entries)]
    corrected = []  # (layer, the part ComfyUI drops): how much dropping it moves the output
    for _prefix, layer in ckpt.layers.items():
        part = dropped.part(layer)
        if part is not None and _readable(layer, part.reads, ends):
            corrected.append((layer, part))
        fmt = FORMATS.get(layer.format_name) if layer.format_name else None
        if fmt is None:
            continue
        for slot in fmt.slots:
            entry = layer.stored.get(slot.suffix)  # as stored: every expert of a MoE bank
            cast = slot.suffix == "weight" and entry is not None and entry.dtype != slot.dtype and slot.dtype in CASTS
            if entry is None or (slot.kind not in (SCALE, CODEBOOK, CORRECTION) and not cast) or not _sound(entry, ends):
                continue
            wanted.append((layer, slot, entry))
    if not wanted and not corrected and not casts:
        return []
    np, decode = _decoder()
    with np.errstate(all="ignore"):  # NaN/Inf in a file are findings, not warnings on stderr
        return _read_values(np, decode, ckpt, wanted, corrected, casts, measured)


def _read_values(
    np, decode, ckpt: Checkpoint, wanted: list, corrected: list, casts: list, measured: list[Measured]
) -> list[Finding]:
    """Read the tensors ``deep_findings`` chose and judge their values."""
    extra = [e for layer, part in corrected for s, e in layer.stored.items() if s in part.reads]
    extra += [e for c in casts for e in c.entries]
    first: dict = {}  # tensor name -> its first entry, in order
    for e in [e for _, _, e in wanted] + extra:
        first.setdefault(e.name, e)
    entries = list(first.values())
    data = ckpt.read_many(entries)
    casts = [c for c in casts if all(len(data[e.name]) == e.nbytes for e in c.entries)]  # none cut short by a changed file
    cast_findings = _value_cast_findings(np, decode, casts, data, measured)
    out_dropped = []
    for layer, part in corrected:
        if all(len(data[e.name]) == e.nbytes for s, e in layer.stored.items() if e.name in data):
            share = dropped.share(np, decode, layer, part, data)
            name = layer.stored[part.suffix].name
            if share is None:
                measured.append(Measured(name, RELATIVE_ERROR, None, UNDEFINED_SHARE))
                continue
            measured.append(_measure(name, share))
            if share >= dropped.GARBAGE:  # below, the header's warning says it, with this measurement
                out_dropped.append(dropped.finding(layer, part, share))
    out: list[Finding] = []
    done: set[str] = set()
    for layer, slot, entry in wanted:
        if entry.name in done:
            continue
        done.add(entry.name)
        raw = data[entry.name]
        if len(raw) != entry.nbytes:  # the file changed under us or ended early: nothing sound to judge
            continue
        if slot.suffix == "weight":
            values = decode(raw, entry.dtype, entry.dtype)
            packed = "//" in slot.shape  # the stored width is a fraction of K: packed codes
            if values is None:
                continue
            meant = decode(raw, slot.dtype, slot.dtype) if _relabelled(np, values, entry.dtype, slot.dtype) else values
            measured.append(_measure(entry.name, _weight_cast_error(np, values, meant, entry.dtype, slot.dtype)))
            if not _survives_cast(np, values, entry.dtype, slot.dtype, packed):
                out.append(
                    Finding(
                        "D008",
                        f"{entry.name}: its {entry.dtype} values are not {slot.dtype} codes: the value cast "
                        f"to {slot.dtype} ComfyUI applies at load changes them",
                        layer=layer.name,
                        tensor=entry.name,
                        expected=f"{slot.dtype} codes",
                        actual=f"{entry.dtype} values",
                        cause="the weight's bytes or values are not the format's codes (a relabelled or re-cast weight)",
                        fix=f"re-export the layer with a {slot.dtype} weight (comfyquant quantize)",
                    )
                )
            continue
        values = decode(raw, entry.dtype, slot.dtype if slot.dtype != "float" else entry.dtype)
        if values is None:
            continue
        if slot.deep_check is not None:
            levels = slot.deep_check(np, layer, entry.name, values)
            if levels is not None:
                out.append(Finding(LEVEL_MISMATCH, layer=layer.name, tensor=entry.name, **levels))
        out.extend(_value_findings(np, layer.name, entry.name, slot, values, slot.on_int8_grid, slot.adds_zero_points))
        saturated = _saturated(np, entry.name, slot, values, entry.dtype if slot.dtype == "float" else slot.dtype)
        if saturated is not None:
            out.append(Finding(SATURATED, saturated[0], layer=layer.name, tensor=entry.name, **saturated[1]))
    return out + out_dropped + cast_findings


def _sound(e, ends: dict) -> bool:
    """Whether tensor ``e``'s bytes are the values its header describes (``dialects.reading.sound``)
    and it is small enough to read (``MAX_DEEP_BYTES``): only then are its values read."""
    return e.nbytes <= MAX_DEEP_BYTES and sound(e, ends)


def _readable(layer, suffixes: tuple[str, ...], ends: dict) -> bool:
    """Whether the layer's tensors among ``suffixes`` can all be read soundly (``_sound``)."""
    return all(_sound(e, ends) for e in (layer.stored.get(s) for s in suffixes) if e is not None)


FLOAT8_MAX = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}
LEVEL_MISMATCH = "D011"
"""Scales that do not fit the layer's levels (a slot's ``deep_check``, from its format)."""


def _saturated(np, tensor: str, slot, v, dtype: str) -> tuple[str, dict] | None:
    """A SATURATED finding's message and fields when every non-zero scale of an FP8 scale
    tensor sits at the dtype's largest finite magnitude (zeros are a blocked layout's padding).
    A writer's absmax scales spread over the dtype's range; all of them at its ceiling means
    they overflowed and the cast clipped them."""
    top = FLOAT8_MAX.get(dtype)
    if top is None or slot.kind != SCALE or v.size < 2:
        return None
    nonzero = v[v != 0]
    if nonzero.size < 2 or not np.isfinite(nonzero).all() or not np.all(np.abs(nonzero) == top):
        return None
    return (
        f"{tensor} ({slot.meaning or slot.kind}): every scale is {top:g}, the largest {dtype} value",
        {
            "expected": f"scales spread below {top:g}",
            "actual": f"{WHOLE} {top:g}",
            "cause": "the scales overflowed the dtype and were clipped to its largest value: every weight decodes far too large",
            "fix": "re-export the layer from the original weights (comfyquant quantize)",
        },
    )


def _value_findings(np, layer: str, tensor: str, slot, v, clamped: bool = False, offset: bool = False) -> list[Finding]:
    out: list[Finding] = []
    finite = np.isfinite(v)
    n_bad = int(v.size - finite.sum())
    if slot.blocked and slot.kind == SCALE:
        return out + _blocked_findings(np, layer, tensor, slot, v, n_bad)
    what = f"{tensor} ({slot.meaning or slot.kind})"
    fix = "re-export the layer from the original weights (comfyquant quantize)"
    if slot.kind == CODEBOOK:
        if n_bad:
            out.append(
                Finding(
                    "D005",
                    f"{what}: {n_bad} non-finite codebook entries",
                    layer=layer,
                    tensor=tensor,
                    actual=f"{n_bad} NaN/Inf",
                    fix=fix,
                )
            )
        elif v.size > 1 and np.any(np.diff(v) < 0):
            out.append(
                Finding(
                    "D004",
                    f"{what}: codebook is not sorted ascending",
                    layer=layer,
                    tensor=tensor,
                    expected="ascending levels",
                    actual=np.array2string(v, precision=3, max_line_width=200),
                    cause="codes and levels may have been permuted by a faulty writer",
                    fix=fix,
                )
            )
        return out
    if n_bad:
        code = "D001" if slot.positive else "D007"
        actual = f"{n_bad} NaN/Inf"
        cause = "overflow during quantization or a corrupted file"
        if clamped:
            actual = f"{WHOLE if n_bad == v.size else n_bad} NaN/Inf, {ON_GRID}"
            cause += ": the decode clamps those groups onto the INT8 grid, each becomes one constant code" + (
                " (every group: the output is garbage)" if n_bad == v.size else " (the output degrades, stays finite)"
            )
        out.append(
            Finding(
                code,
                f"{what}: {n_bad} of {v.size} values are NaN or Inf",
                layer=layer,
                tensor=tensor,
                expected="finite values",
                actual=actual,
                cause=cause,
                fix=fix,
            )
        )
    if slot.positive:
        zeros = int((v == 0).sum())
        neg = int((v < 0).sum())
        # scales below the smallest normal F32 decode the layer to (almost) zero as surely
        tiny = int(((v != 0) & (np.abs(v) < TINY)).sum())
        if zeros + tiny == v.size and tiny:
            out.append(
                Finding(
                    "D002",
                    f"{what}: " + ("the scale is" if v.size == 1 else "every scale is") + " zero or subnormal",
                    layer=layer,
                    tensor=tensor,
                    expected=f">= {TINY:.3g}",
                    actual=("every scale zero or subnormal, zero points kept" if offset else WHOLE + " zero or subnormal"),
                    cause="the layer decodes to its zero points only (a degraded output)"
                    if offset
                    else "the whole layer decodes to zero (it outputs only its bias)",
                    fix=fix,
                )
            )
        elif zeros:
            # a single (per-tensor) scale of zero, or all of them, zeroes the whole layer's output
            whole = zeros == v.size
            said = (
                ("the scale is zero" if v.size == 1 else "every scale is zero")
                if whole
                else f"{zeros} of {v.size} scales are zero"
            )
            out.append(
                Finding(
                    "D002",
                    f"{what}: {said}",
                    layer=layer,
                    tensor=tensor,
                    expected="> 0",
                    actual=("every scale zero, zero points kept" if offset else f"{WHOLE} zero")
                    if whole
                    else f"{zeros} zero" + ("" if zeros == 1 else "s"),
                    cause=(
                        "the layer decodes to its zero points only (a degraded output)"
                        if offset
                        else "the whole layer decodes to zero (it outputs only its bias)"
                    )
                    if whole
                    else "those rows/groups decode to zero (dead outputs) or divide by zero",
                    fix=fix,
                )
            )
        if neg:
            out.append(
                Finding(
                    "D003",
                    f"{what}: {neg} of {v.size} scales are negative",
                    layer=layer,
                    tensor=tensor,
                    expected="> 0",
                    actual=f"{WHOLE} negative" if neg == v.size else f"{neg} negative",
                    cause="sign-flipped scales invert weights",
                    fix=fix,
                )
            )
    if v.size > 1 and not np.any(v != 0):
        out.append(
            Finding(
                "D006",
                f"{what}: every value is zero",
                layer=layer,
                tensor=tensor,
                actual="all zeros",
                cause="the tensor was never written (placeholder export?)",
                fix=fix,
            )
        )
    return out


def _blocked_findings(np, layer: str, tensor: str, slot, v, n_bad: int) -> list[Finding]:
    """Findings on a blocked per-block scale (NVFP4's E4M3, MXFP8's E8M0, in the 128x4 layout):
    its padding cells are zero by design, so only a layer with no positive normal scale at all
    decodes to zero or to its negation (garbage); some zero or negative blocks degrade it."""
    what = f"{tensor} ({slot.meaning or slot.kind})"
    fix = "re-export the layer from the original weights (comfyquant quantize)"
    if n_bad:
        return [
            Finding(
                "D007",
                f"{what}: {n_bad} of {v.size} values are NaN or Inf",
                layer=layer,
                tensor=tensor,
                expected="finite values",
                actual=f"{n_bad} NaN/Inf",
                cause="overflow during quantization or a corrupted file",
                fix=fix,
            )
        ]
    positive = int((v >= TINY).sum())
    negative = int((v < 0).sum())
    if positive == 0:
        sign = "negative" if negative else "zero or subnormal"
        return [
            Finding(
                "D003" if negative else "D002",
                f"{what}: every block scale is {sign}",
                layer=layer,
                tensor=tensor,
                expected=f">= {TINY:.3g} (zero only in the padding)",
                actual=f"{WHOLE} {sign}",
                cause="the whole layer decodes to " + ("its negation" if negative else "zero (it outputs only its bias)"),
                fix=fix,
            )
        ]
    if negative:
        return [
            Finding(
                "D003",
                f"{what}: {negative} of {v.size} block scales are negative",
                layer=layer,
                tensor=tensor,
                expected="> 0",
                actual=f"{negative} negative",
                cause="sign-flipped scales invert those blocks",
                fix=fix,
            )
        ]
    return []
