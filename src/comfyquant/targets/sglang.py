"""SGLang diffusion runtime (0.5.x): marker inspection, config resolution, layer building.

Reproduces, in SGLang's own order and with its exact messages and exception types,
``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization`` (SGLang 0.5.23
``sglang/multimodal_gen/runtime/utils/quantization_utils.py``), the config constructors they call
(``runtime/layers/quantization/configs/*.py``, ``comfy_fp8.py``, ``comfy_nvfp4.py``, ``mxfp8.py``),
and the checks made when layers are built (the configs' ``get_quant_method``).  The first two
stages are proven against SGLang's own functions (tests/test_runtime_agreement_sglang.py); the
layer building is modelled from the source (``targets.proven.MODELLED``).  In *collect* mode
every violation is listed (the first is the one SGLang raises); in *raise* mode the first is
raised, which is what ``comfyquant.compat.sglang`` offers as a drop-in.

Platform rules (MPS, CUDA capability) are not modelled: a CUDA device of capability >= 10.0
is assumed.  A layer counts as an embedding when its last name component contains "embed".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from ..formats.base import GeometryError
from ..formats.w4a8 import ASYM_W4A8_INT8, GROUP_SIZE, group_size_ok, k_fits
from ..markers import FILE_LEVEL_DTYPES, HEADER, MARKER_MAP, TENSOR, MarkerMerge, MarkerRecord
from . import sglang_rowwise
from .base import Verdict, Violation, incomplete_violations
from .container import EXCEPTION, container_errors

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

VALIDATED = ("float8_e4m3fn", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4")
CONVROT_SIZES = (16, 64, 256)

# How each SGLang rule is explained when it is the only thing that flags a layer.
EXPLAIN: dict[str, tuple[str, str]] = {
    "safetensors": (
        "the safetensors library refuses the file (damaged container): safe_open raises before any marker is read",
        "re-download or rewrite the file; see the container findings",
    ),
    "H1": ("the header marker map is not JSON", "rewrite the header markers (comfyquant fix)"),
    "H2": ("the header marker map is not an object", "rewrite the header markers (comfyquant fix)"),
    "H3": ("the header marker map has no layers object", "rewrite the header markers (comfyquant fix)"),
    "H4": ("a header marker entry is not an object", "rewrite the header markers (comfyquant fix)"),
    "P1": ("header and tensor markers (or shards) disagree", "synchronise markers: comfyquant fix --prefer header|tensor"),
    "P2": ("a marker tensor is not UTF-8 JSON", "rewrite the marker (comfyquant fix)"),
    "P3": ("a marker tensor is not a JSON object", "rewrite the marker (comfyquant fix)"),
    "X1": (
        "quant_format=mxfp8 makes SGLang treat every F8/I8/U8 weight as MXFP8 with U8 [N, K/32] scales",
        "remove quant_format from the metadata, or store every layer as MXFP8 with U8 [N, K/32] scales",
    ),
    "M0": ("quantized weights without a marker", "add markers (comfyquant fix infers unambiguous formats)"),
    "T1": ("a marker names a layer whose tensors are missing (prefix mismatch?)", "re-key or remove the marker (comfyquant fix)"),
    "W5": (
        "6-bit rows read as 4-bit: SGLang assumes K = 2 x packed width",
        "re-quantize at 4 bits (comfyquant fix --allow-lossy, or comfyquant convert)",
    ),
    "F4": (
        "blocked, padded NVFP4 scale layout: SGLang requires (rows, K/16), which only layers with N % 128 == 0 and K % 64 == 0 have",
        "keep such layers dense or in another format for SGLang",
    ),
    "R0": (
        "SGLang loads only these format sets: int8; w4a8(+int8 embeddings); w4a4(+int8); fp8; nvfp4(+int8 embeddings); mxfp8",
        "convert the checkpoint to one supported format set (comfyquant convert)",
    ),
    "R1": ("INT8 linear markers must set convrot to JSON true", "set convrot: true (comfyquant fix)"),
    "R2": (
        "INT8 ConvRot layers must declare convrot_groupsize 16, 64 or 256",
        "add convrot_groupsize (comfyquant fix --convrot-groupsize C)",
    ),
    "R3": ("missing ConvRot flag: ComfyUI writes W4A8 markers without convrot: true", "add convrot: true (comfyquant fix)"),
    "R4": ("only INT8 embedding markers may accompany W4A8 in SGLang", "convert those layers to W4A8 or keep them dense"),
    "R5": ("only INT8 markers may accompany W4A4 in SGLang", "convert those layers to W4A4 or keep them dense"),
    "R6": ("SGLang supports W4A4 ConvRot sizes 16, 64 and 256 only", "re-quantize with convrot_groupsize 16, 64 or 256"),
    "R7": ("SGLang supports W4A4 linear_dtype int4 or int8 only", "set linear_dtype to int4 or int8"),
    "R8": ("only INT8 embedding markers may accompany NVFP4 in SGLang", "convert those layers to NVFP4 or keep them dense"),
    "R9": ("NVFP4 markers must not set convrot", "remove the convrot key (comfyquant fix)"),
    "B1": ("W4A8 input size incompatible with its group size or ConvRot size", "re-quantize with sizes that divide K"),
    "B2": ("W4A4 input size incompatible with 64 or its ConvRot size", "re-quantize with a ConvRot size that divides K"),
    "B3": ("INT8 ConvRot size does not divide the input size", "re-quantize with a ConvRot size that divides K"),
    "B4": (
        "plain INT8 markers are embedding-only in SGLang: on a linear layer they are refused or left unquantized",
        "re-quantize the layer with ConvRot (comfyquant convert) or keep it dense",
    ),
    "B5": ("ConvRot INT8 layers need row-wise [N, 1] scales in SGLang", "re-quantize the layer row-wise"),
    "B6": (
        "MoE expert banks are ComfyUI-only: SGLang builds 2-D linear layers from Comfy markers",
        "keep the bank dense for SGLang, or load the checkpoint in ComfyUI",
    ),
    **sglang_rowwise.EXPLAIN,
}


class SGLangError(Exception):
    """Carries the exception type name and message SGLang would raise."""

    def __init__(self, violation: Violation):
        super().__init__(violation.message)
        self.violation = violation


class Run:
    """One pass of SGLang's loading: in *collect* mode every violation is listed in
    ``violations``; otherwise the first blocking one is raised as ``SGLangError``, as
    SGLang raises it (what ``comfyquant.compat.sglang`` needs)."""

    def __init__(self, collect: bool) -> None:
        self.collect = collect
        self.violations: list[Violation] = []

    def fail(
        self,
        rule: str,
        message: str,
        layer: str | None = None,
        tensor: str | None = None,
        exception: str | None = "ValueError",
        blocking: bool = True,
        file: str | None = None,
    ) -> None:
        cause, fix = EXPLAIN.get(rule, (None, None))
        v = Violation(f"sglang.{rule}", message, exception, layer, tensor, blocking, cause, fix, file=file)
        if not self.collect and blocking:
            raise SGLangError(v)
        self.violations.append(v)


PREFIX = "\x00prefix\x00"
"""Placeholder for ``repr(prefix)`` in cached per-layer messages."""
RAW = "\x00raw\x00"
"""Placeholder for the prefix itself (inside tensor names)."""


def inspect_markers(ckpt: Checkpoint, param_name_mapper: Callable[[str], str] | None, run: Run) -> tuple[dict, dict]:
    """SGLang's ``inspect_comfy_quant_markers`` over an opened checkpoint.

    Returns (markers by mapped prefix, derived keys by mapped prefix).  Marker dicts are the
    checkpoint's own (shared, never mutated); SGLang's derived ``_`` keys are kept apart.
    """
    ms = ckpt.markers
    layers = ckpt.layers
    headers = {hm.file: hm for hm in ms.headers}
    by_file: dict[str, list] = {}
    for rec in ms.records:
        by_file.setdefault(rec.file, []).append(rec)
    merge = MarkerMerge(skip_conflicting=True)  # SGLang raises on a conflicting record: it adds nothing
    damaged = container_errors(ckpt)
    lenient: set[str] = set()  # prefixes with a marker only Python's own json reads
    # markers stored in another dtype than U8 (each has its M003 finding): torch may not read them
    odd = {(f.file, f.tensor) for f in ms.findings if f.code == "M003"}
    for path in ckpt.files:
        if path in damaged:
            # safe_open(path) raises before anything of this shard is read
            run.fail("safetensors", damaged[path], exception=EXCEPTION, file=path)
        hm = headers.get(path)
        if hm is not None and hm.error == "M010":
            # the strict reader refused the map; SGLang reads it with Python's json (NaN, Infinity)
            for rec in _lenient_header(hm, run):
                _merge_python(merge, rec, run, lenient)
        elif hm is not None and hm.error is not None:
            rule, text = {
                "M011": ("H2", f"_quantization_metadata in {path} must contain an object"),
                "M012": ("H3", f"_quantization_metadata in {path} must contain a layers object"),
            }[hm.error]
            run.fail(rule, text)
        for rec in by_file.get(path, ()):
            if rec.error == "M013":
                run.fail("H4", f"Comfy quantization metadata for {rec.prefix!r} must be an object", rec.prefix)
                continue
            if odd and (rec.file, rec.key) in odd and (unread := _unreadable_dtype(ckpt, rec)) is not None:
                run.fail("P2", unread, rec.prefix, "comfy_quant", exception="TypeError")
                continue
            python_only = rec.error == "M001"
            if python_only:
                relaxed = _lenient_tensor(ms, rec, run)
                if relaxed is None:
                    continue
                rec = relaxed
            if rec.error == "M002":
                run.fail("P3", f"Comfy quantization marker {rec.key!r} must contain a JSON object", rec.prefix, "comfy_quant")
                continue
            if python_only or (lenient and rec.prefix in lenient):
                _merge_python(merge, rec, run, lenient)
            elif merge.add(rec):
                run.fail("P1", f"Conflicting Comfy quantization markers for {rec.prefix!r}", rec.prefix)
    raw: dict[str, dict] = merge.merged  # SGLang's own union: a later equal value of another type wins
    if run.collect:
        # check: where the union equals ComfyUI's merged marker, that object (per-layer results
        # cached under it serve both profiles), unless their convrot differs in type (1 for
        # true), the one such difference that changes what SGLang does
        effective = ms.effective
        raw = {
            p: e
            if p not in lenient
            and (e := effective.get(p)) is not None
            and e == m
            and type(e.get("convrot")) is type(m.get("convrot"))
            else m
            for p, m in raw.items()
        }

    # SGLang sees the tensors as stored: it has no MoE expert banks, so no flattened view.
    needs_marker = [
        p for p, layer in layers.items() if (w := layer.stored.get("weight")) is not None and w.dtype in FILE_LEVEL_DTYPES
    ]
    qfs = {v.lower() for v in ms.quant_formats.values() if v}
    if qfs == {"mxfp8"}:
        for prefix in sorted(needs_marker):
            t = layers[prefix].stored
            w, s = t["weight"], t.get("weight_scale")
            wmeta, smeta = (w.dtype, w.shape), (s.dtype, s.shape) if s is not None else None
            if (
                w.dtype != "F8_E4M3"
                or len(w.shape) != 2
                or w.shape[1] % 32 != 0
                or smeta != ("U8", (w.shape[0], w.shape[1] // 32))
            ):
                run.fail(
                    "X1",
                    f"MXFP8 layer {prefix!r} has incompatible weight/scale metadata: {wmeta} and {smeta}",
                    prefix,
                    "weight_scale",
                )
                continue
            raw.setdefault(prefix, MXFP8_MARKER)

    missing = sorted(p for p in needs_marker if p not in raw)
    if missing:
        message = f"Quantized weights are missing comfy_quant metadata: {missing[:5]}"
        for prefix in missing:
            run.fail("M0", message, prefix, "weight")

    derived: dict[str, dict] = {}
    memo = ckpt.memo
    for prefix, marker in raw.items():
        layer = layers.get(prefix)
        outcome = memo.get("sglang", marker, layer, partial(_check_marker, marker, layer.stored if layer else {}))
        rule, template, tensor, keys, exception = outcome
        if rule is not None:
            run.fail(rule, template.replace(PREFIX, repr(prefix)).replace(RAW, prefix), prefix, tensor, exception)
        if keys:
            derived[prefix] = keys

    mapped: dict[str, dict] = {}
    mapped_derived: dict[str, dict] = {}
    for prefix, marker in raw.items():
        name = prefix if param_name_mapper is None else param_name_mapper(prefix)  # SGLang maps the prefix itself
        if name in mapped:
            run.fail("M1", f"Comfy markers collide after parameter mapping at {name!r}", prefix)
            continue
        mapped[name] = marker
        if prefix in derived:
            mapped_derived[name] = derived[prefix]
    return mapped, mapped_derived


MXFP8_MARKER = {"format": "mxfp8"}

NO_NUMPY = {
    "BF16": "BFloat16",
    "F8_E4M3": "Float8_e4m3fn",
    "F8_E5M2": "Float8_e5m2",
    "F8_E8M0": "Float8_e8m0fnu",
    "F8_E4M3FNUZ": "Float8_e4m3fnuz",
    "F8_E5M2FNUZ": "Float8_e5m2fnuz",
}
"""Marker tensor dtypes whose torch tensor has no NumPy view: SGLang reads a marker's bytes with
``tensor.numpy().tobytes()``, and torch refuses these with its own ``TypeError``."""


def _unreadable_dtype(ckpt: Checkpoint, rec: MarkerRecord) -> str | None:
    """torch's message when SGLang cannot take a marker tensor's bytes (its dtype), else None."""
    header = next((h for h in ckpt.headers if h.file == rec.file), None)
    entry = header.tensors.get(rec.key) if header is not None else None
    name = NO_NUMPY.get(entry.dtype) if entry is not None else None
    return None if name is None else f"Got unsupported ScalarType {name}"


def _python_json(text: str | bytes, run: Run, rule: str, message: str, prefix: str | None) -> tuple[bool, object]:
    """Python's own ``json.loads`` of ``text`` (what SGLang parses markers with: it accepts NaN,
    Infinity and numbers beyond the float range, and detects UTF-16/32 and a BOM in bytes):
    (True, the object), or (False, None) after failing ``rule`` with ``message`` as SGLang does."""
    try:
        return True, json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        run.fail(rule, message, prefix)
    except RecursionError as exc:  # not caught by SGLang: it raises through
        run.fail(rule, str(exc), prefix, exception="RecursionError")
    return False, None


def _lenient_header(hm, run: Run) -> list[MarkerRecord]:
    """The records of a header map only Python's json reads (SGLang's H1-H4 on it)."""
    path = hm.file
    ok, obj = _python_json(hm.raw, run, "H1", f"Invalid _quantization_metadata in {path}", None)
    if not ok:
        return []
    if not isinstance(obj, dict):
        run.fail("H2", f"_quantization_metadata in {path} must contain an object")
        return []
    layers = obj.get("layers")
    if not isinstance(layers, dict):
        run.fail("H3", f"_quantization_metadata in {path} must contain a layers object")
        return []
    out = []
    for prefix, marker in layers.items():
        if not isinstance(marker, dict):
            run.fail("H4", f"Comfy quantization metadata for {prefix!r} must be an object", prefix)
            continue
        out.append(MarkerRecord(HEADER, path, prefix, prefix, marker))
    return out


def _lenient_tensor(ms, rec: MarkerRecord, run: Run) -> MarkerRecord | None:
    """A tensor marker the strict reader refused, as SGLang reads it (P2 when it cannot)."""
    data = ms.marker_bytes.get((rec.file, rec.key), b"")
    message = f"Invalid Comfy quantization marker {rec.key!r} in {rec.file}"
    ok, obj = _python_json(data, run, "P2", message, rec.prefix)
    if not ok:
        return None
    return MarkerRecord(TENSOR, rec.file, rec.prefix, rec.key, obj, None if isinstance(obj, dict) else "M002")


def _merge_python(merge: MarkerMerge, rec: MarkerRecord, run: Run, lenient: set[str]) -> None:
    """SGLang's ``_merge_comfy_quant_marker`` for a marker only Python's json reads (or a prefix
    one of those set): compared key by key with ``!=``, as SGLang compares, so a NaN never
    equals itself; a conflicting record adds nothing."""
    prefix = rec.prefix
    lenient.add(prefix)
    previous = merge.merged.get(prefix) or {}
    if any(key in previous and previous[key] != value for key, value in rec.obj.items()) or merge.add(rec):
        run.fail("P1", f"Conflicting Comfy quantization markers for {prefix!r}", prefix)


def _meta(tensors: dict, suffix: str):
    e = tensors.get(suffix)
    return None if e is None else (e.dtype, e.shape)


def _check_marker(marker: dict, t: dict) -> tuple[str | None, str, str | None, dict, str | None]:
    """One marker's inspection: (rule, message template, tensor suffix, derived keys, exception)."""
    fmt = marker.get("format")
    if fmt not in VALIDATED:
        return None, "", None, {}, None
    P = PREFIX
    required: tuple[str, ...]
    if fmt == "asym_w4a8_int8":
        required = ("weight", "weight_s_rel", "weight_s_channel")
    elif fmt == "nvfp4":
        required = ("weight", "weight_scale", "weight_scale_2")
    else:
        required = ("weight", "weight_scale")
    missing = sorted(s for s in required if s not in t)
    if missing:
        names = ", ".join(f"'{RAW}.{s}'" for s in missing)
        return "T1", f"Comfy layer {P} is missing checkpoint tensors: [{names}]", missing[0], {}, "ValueError"
    if fmt == "float8_e4m3fn":
        return None, "", None, {"_activation_scheme": "static" if "input_scale" in t else "dynamic"}, None
    if fmt == "asym_w4a8_int8":
        return _check_w4a8(marker, t)
    if fmt == "convrot_w4a4":
        return _check_w4a4(marker, t)
    if fmt == "nvfp4":
        return _check_nvfp4(t)
    return _check_int8(t)


def _fail_tpl(rule: str, message: str, tensor: str | None = None, keys: dict | None = None, exception: str = "ValueError"):
    return rule, message, tensor, keys or {}, exception


def _check_w4a8(marker: dict, t: dict):
    P = PREFIX
    wdt, wsh = _meta(t, "weight")
    sdt, ssh = _meta(t, "weight_s_rel")
    cdt, csh = _meta(t, "weight_s_channel")
    try:
        g = int(marker.get("group_size", GROUP_SIZE))
    except (TypeError, ValueError, OverflowError) as exc:  # SGLang's own int() of the value
        return _fail_tpl("W1", str(exc), exception=type(exc).__name__)
    if g < 4:
        return _fail_tpl("W1", f"Comfy W4A8 layer {P} has invalid group_size={g}")
    if wdt != "I8" or sdt != "F8_E4M3":
        return _fail_tpl(
            "W2",
            f"Comfy W4A8 layer {P} needs I8 weights and FP8 group scales, got {wdt} and {sdt}",
            "weight" if wdt != "I8" else "weight_s_rel",
        )
    if cdt != "F32":
        return _fail_tpl("W3", f"Comfy W4A8 layer {P} needs F32 channel scales, got {cdt}", "weight_s_channel")
    if len(wsh) != 2:
        return _fail_tpl("W4", f"Comfy W4A8 layer {P} needs a 2D packed weight, got {wsh}", "weight")
    k = wsh[1] * 2
    if ssh != (wsh[0], k // g) or csh != (wsh[0],):
        return _fail_tpl(
            "W5",
            f"Comfy W4A8 layer {P} has incompatible weight/scale shapes: {wsh}, {ssh}, and {csh}",
            "weight_s_rel" if csh == (wsh[0],) else "weight_s_channel",
        )
    keys = {"_has_codebook": "weight_codebook" in t, "_has_correction": "weight_correction" in t}
    if keys["_has_codebook"] and _meta(t, "weight_codebook") != ("F32", (16,)):
        return _fail_tpl("W6", f"Comfy W4A8 layer {P} needs an F32[16] codebook", "weight_codebook", keys)
    if keys["_has_correction"] and _meta(t, "weight_correction") != ("F32", (k // g, wsh[0])):
        return _fail_tpl("W7", f"Comfy W4A8 layer {P} has an incompatible correction tensor", "weight_correction", keys)
    return None, "", None, keys, None


def _check_w4a4(marker: dict, t: dict):
    P = PREFIX
    wdt, wsh = _meta(t, "weight")
    sdt, ssh = _meta(t, "weight_scale")
    if wdt != "I8" or sdt != "F32":
        return _fail_tpl(
            "A1",
            f"Comfy W4A4 layer {P} needs I8 packed weights and F32 scales, got {wdt} and {sdt}",
            "weight" if wdt != "I8" else "weight_scale",
        )
    if len(wsh) != 2 or ssh != (wsh[0],):
        return _fail_tpl("A2", f"Comfy W4A4 layer {P} has incompatible weight/scale shapes: {wsh} and {ssh}", "weight_scale")
    k = wsh[1] * 2
    try:
        c = int(marker.get("convrot_groupsize", 256))
    except (TypeError, ValueError, OverflowError) as exc:  # SGLang's own int() of the value
        return _fail_tpl("A3", str(exc), exception=type(exc).__name__)
    if c not in CONVROT_SIZES:
        return _fail_tpl("A3", f"Comfy W4A4 layer {P} has unsupported convrot_groupsize={c}")
    if k % 64 or k % c:
        return _fail_tpl(
            "A4", f"Comfy W4A4 layer {P} has input size {k}, incompatible with quant_group_size=64 and convrot_groupsize={c}"
        )
    return None, "", None, {}, None


def _check_nvfp4(t: dict):
    P = PREFIX
    wdt, wsh = _meta(t, "weight")
    sdt, ssh = _meta(t, "weight_scale")
    s2dt, s2sh = _meta(t, "weight_scale_2")
    if wdt != "U8" or sdt != "F8_E4M3":
        return _fail_tpl(
            "F1",
            f"Comfy NVFP4 layer {P} needs U8 packed weights and FP8 block scales, got {wdt} and {sdt}",
            "weight" if wdt != "U8" else "weight_scale",
        )
    if s2dt != "F32" or s2sh not in ((), (1,)):
        return _fail_tpl("F2", f"Comfy NVFP4 layer {P} needs a scalar F32 weight_scale_2, got {s2dt}{s2sh}", "weight_scale_2")
    if len(wsh) != 2:
        return _fail_tpl("F3", f"Comfy NVFP4 layer {P} needs a 2D packed weight, got {wsh}", "weight")
    k = wsh[1] * 2
    if k % 16 or ssh != (wsh[0], k // 16):
        return _fail_tpl("F4", f"Comfy NVFP4 layer {P} has incompatible weight/scale shapes: {wsh} and {ssh}", "weight_scale")
    keys = {"_has_pre_quant_scale": "pre_quant_scale" in t}
    if keys["_has_pre_quant_scale"]:
        pdt, psh = _meta(t, "pre_quant_scale")
        if pdt not in ("BF16", "F16", "F32") or psh != (k,):
            return _fail_tpl(
                "F5", f"Comfy NVFP4 layer {P} has an incompatible pre_quant_scale: {pdt}{psh}", "pre_quant_scale", keys
            )
    return None, "", None, keys, None


def _check_int8(t: dict):
    P = PREFIX
    wdt, wsh = _meta(t, "weight")
    sdt, ssh = _meta(t, "weight_scale")
    if wdt == "I8" and sdt == "F32" and ssh == ():
        if len(wsh) != 2:
            return _fail_tpl("I1", f"Comfy tensorwise INT8 layer {P} needs a 2D weight, got {wsh}", "weight")
        return None, "", None, {"_is_tensorwise_scalar": True}, None
    if wdt != "I8" or sdt != "F32":
        return _fail_tpl(
            "I2",
            f"Comfy INT8 layer {P} needs I8 weights and F32 scales, got {wdt} and {sdt}",
            "weight" if wdt != "I8" else "weight_scale",
        )
    if len(wsh) != 2 or ssh != (wsh[0], 1):
        return _fail_tpl("I3", f"Comfy INT8 layer {P} has incompatible weight/scale shapes: {wsh} and {ssh}", "weight_scale")
    return None, "", None, {"_is_rowwise": True}, None


# -- resolve and config constructors ----------------------------------------------------------


def is_int8_embedding_marker(marker: dict, derived: dict | None = None) -> bool:
    """SGLang's ``is_comfy_int8_embedding`` on the dict inspect returns: the marker with the
    keys inspect derived (``derived``) laid over it, so a marker's own ``_is_rowwise`` counts."""
    d = derived or {}
    return (
        marker.get("format") == "int8_tensorwise"
        and not marker.get("convrot", False)
        and bool(_derived(marker, d, "_is_rowwise") or _derived(marker, d, "_is_tensorwise_scalar"))
    )


def _derived(marker: dict, derived: dict, key: str):
    return derived[key] if key in derived else marker.get(key)


def resolve(markers: dict[str, dict], derived: dict[str, dict], run: Run) -> str | None:
    """The config SGLang builds (its class name), after its constructor checks."""
    if not markers:
        return None
    formats = sorted({str(m.get("format")) for m in markers.values()})
    if formats == ["int8_tensorwise"]:
        _int8_config(markers, derived, run)
        return "ConvRotInt8Config"
    if formats in (["asym_w4a8_int8"], ["asym_w4a8_int8", "int8_tensorwise"]):
        for prefix, m in markers.items():
            if m.get("format") == "asym_w4a8_int8":
                if m.get("convrot") is not True:
                    run.fail("R3", f"Serialized W4A8 layer {prefix!r} must set convrot=true", prefix)
            elif not is_int8_embedding_marker(m, derived.get(prefix)):
                run.fail("R4", f"Unsupported Comfy W4A8 format for {prefix!r}: {m.get('format')!r}", prefix)
        return "KitchenW4A8Config"
    if formats in (["convrot_w4a4"], ["convrot_w4a4", "int8_tensorwise"]):
        # the constructor builds its INT8 config from every INT8 marker before it reads a W4A4 one
        _int8_config({p: m for p, m in markers.items() if m.get("format") == "int8_tensorwise"}, derived, run)
        for prefix, m in markers.items():
            if m.get("format") == "int8_tensorwise":
                continue
            if m.get("format") != "convrot_w4a4":
                run.fail("R5", f"Unsupported Comfy W4A4 format for {prefix!r}: {m.get('format')!r}", prefix)
                continue
            try:
                c = int(m.get("convrot_groupsize", 256))
            except (TypeError, ValueError, OverflowError) as exc:  # the constructor's own int()
                run.fail("R6", str(exc), prefix, exception=type(exc).__name__)
                continue
            if c not in CONVROT_SIZES:
                run.fail(
                    "R6",
                    f"Serialized W4A4 layer {prefix!r} has unsupported convrot_groupsize={c}; expected one of (16, 64, 256)",
                    prefix,
                )
                continue
            ld = str(m.get("linear_dtype", "int4"))  # the constructor's own str()
            if ld not in ("int4", "int8"):
                run.fail(
                    "R7",
                    f"Serialized W4A4 layer {prefix!r} has unsupported linear_dtype={ld!r}; expected one of ('int4', 'int8')",
                    prefix,
                )
        return "KitchenW4A4Config"
    if formats == ["float8_e4m3fn"]:
        return "ComfyFp8Config"
    if formats in (["nvfp4"], ["int8_tensorwise", "nvfp4"]):
        for prefix, m in markers.items():
            if m.get("format") == "nvfp4":
                if m.get("convrot"):
                    run.fail("R9", f"Rotated NVFP4 weights are not supported: {prefix!r}", prefix)
            elif not is_int8_embedding_marker(m, derived.get(prefix)):
                run.fail("R8", f"Unsupported Comfy NVFP4 companion for {prefix!r}: {m.get('format')!r}", prefix)
        return "ComfyNvfp4Config"
    if formats == ["mxfp8"]:
        return "MXFP8Config"
    run.fail("R0", "Unsupported Comfy quantization format(s): " + ", ".join(formats), exception="NotImplementedError")
    return None


def _int8_config(markers: dict[str, dict], derived: dict[str, dict], run: Run) -> None:
    for prefix, m in markers.items():
        if is_int8_embedding_marker(m, derived.get(prefix)):
            continue
        if m.get("convrot") is not True:
            run.fail("R1", f"Serialized convrot_int8 layer {prefix!r} must set convrot=true", prefix)
            continue
        c = m.get("convrot_groupsize")
        if c not in CONVROT_SIZES:
            run.fail(
                "R2",
                f"Serialized convrot_int8 layer {prefix!r} must declare convrot_groupsize in (16, 64, 256), got {c!r}",
                prefix,
            )


# -- layer construction (the configs' get_quant_method) ---------------------------------------


def _is_embedding(prefix: str) -> bool:
    return "embed" in prefix.rsplit(".", 1)[-1]


def build_layers(
    markers: dict[str, dict], derived: dict[str, dict], raw_prefix: dict[str, str], ckpt: Checkpoint, config: str | None, run: Run
) -> None:
    layers = ckpt.layers
    memo = ckpt.memo
    for name, m in markers.items():
        prefix = raw_prefix.get(name, name)
        layer = layers.get(prefix)
        if layer is None:
            continue
        if layer.bank is not None:
            run.fail(
                "B6",
                f"(no SGLang message) layer {prefix!r} is a MoE expert bank of {layer.bank.experts} experts "
                "(weight [E, out, ...]); SGLang has no loader for Comfy quantized expert banks",
                prefix,
                "weight",
                exception=None,
            )
            continue
        d = derived.get(name) or {}
        embedding_config = config in ("KitchenW4A8Config", "ComfyNvfp4Config")
        emb = _is_embedding(prefix)
        outcome = memo.get(
            f"sglang-build:{embedding_config}:{emb}",
            m,
            layer,
            partial(_build_layer, m, layer.stored, d, embedding_config, emb),
        )
        if outcome is not None:
            rule, template, tensor, exception = outcome
            run.fail(rule, template.replace(PREFIX, repr(prefix)), prefix, tensor, exception=exception)


def _build_layer(m: dict, t: dict, d: dict, embedding_config: bool, is_embedding: bool):
    """What building one layer raises: (rule, message template, tensor, exception) or None."""
    P = PREFIX
    fmt = m.get("format")
    w = t.get("weight")
    if w is None or len(w.shape) != 2:
        return None
    n, cols = w.shape
    if fmt == "asym_w4a8_int8":
        # The layer is built with the model's input size, not the packed width: the format's
        # own geometry infers it (6-bit rows have K = 4/3 x width; they fail W5 instead).
        try:
            g, c = int(m.get("group_size", GROUP_SIZE)), int(m.get("convrot_groupsize", 256))
        except (TypeError, ValueError, OverflowError) as exc:  # what the layer's own int() raises
            return "B1", str(exc), None, type(exc).__name__
        if c == 0:
            return None  # the marker stage refuses it first (not 16, 64 or 256); k % 0 would raise here
        try:
            k = ASYM_W4A8_INT8.geometry(t, {"group_size": g, "convrot_groupsize": c})["K"]
        except GeometryError:
            k = 2 * cols
        if not (group_size_ok(g) and k_fits(k, g, c)):
            return (
                "B1",
                (f"Serialized W4A8 layer {P} has input size {k}, incompatible with group_size={g} and convrot_groupsize={c}"),
                None,
                "ValueError",
            )
    elif fmt == "convrot_w4a4":
        try:
            c, k = int(m.get("convrot_groupsize", 256)), 2 * cols
        except (TypeError, ValueError, OverflowError) as exc:
            return "B2", str(exc), None, type(exc).__name__
        if c == 0:
            return None  # the marker stage refuses it first (not 16, 64 or 256); k % 0 would raise here
        if k % 64 or k % c:
            return (
                "B2",
                (
                    f"Serialized W4A4 layer {P} has input size {k}, incompatible with quant_group_size=64 "
                    f"and convrot_groupsize={c}"
                ),
                None,
                "ValueError",
            )
    elif fmt == "int8_tensorwise" and not is_embedding:
        if is_int8_embedding_marker(m, d):
            if embedding_config:
                return "B4", f"Unsupported quantized linear marker for {P}", None, "ValueError"
            return (
                "B4",
                (
                    f"(no SGLang message) layer {P} has a plain INT8 marker, which SGLang treats as "
                    f"embedding-only: the linear is built unquantized and its I8 weight cannot load"
                ),
                None,
                None,
            )
        if m.get("convrot") is True:
            size = m.get("convrot_groupsize")
            if size in CONVROT_SIZES and cols % int(size):  # any other size fails the config (R2) first
                return (
                    "B3",
                    (
                        f"Serialized convrot_int8 layer {P} has input size {cols}, which is not divisible "
                        f"by its ConvRot group size {int(size)}"
                    ),
                    None,
                    "ValueError",
                )
            if d.get("_is_tensorwise_scalar"):
                return (
                    "B5",
                    (
                        f"(no SGLang message) ConvRot INT8 layer {P} has a scalar weight_scale; SGLang's "
                        f"parameter is [N, 1] and the load fails"
                    ),
                    "weight_scale",
                    None,
                )
    return None


def run_all(
    ckpt: Checkpoint, param_name_mapper=None, collect: bool = True, read: list | None = None, rowwise_reader: bool = True
) -> tuple[dict, dict, list[Violation], str | None]:
    """Inspect, resolve and build, as SGLang loads a checkpoint.  Raises SGLangError unless ``collect``.
    ``read`` gets (markers, derived keys) appended when the Comfy markers are inspected (not when
    the row-wise FP8 reader takes the file first); ``rowwise_reader`` False: as a release without that
    reader (before 0.5.23) loads it, Comfy markers only."""
    run = Run(collect)
    if rowwise_reader and any(MARKER_MAP in h.metadata for h in ckpt.headers):
        # SGLang reads a map declaring its rowwise FP8 format before any Comfy marker
        rowwise = sglang_rowwise.read(ckpt, lambda: container_errors(ckpt), run)
        if rowwise is not None or run.violations:
            if run.collect:
                run.violations.extend(
                    incomplete_violations(
                        "sglang", ckpt, True, "(no SGLang message modelled) SGLang cannot load weights that are not there"
                    )
                )
            return {}, {}, run.violations, rowwise
    markers, derived = inspect_markers(ckpt, param_name_mapper, run)
    if read is not None:
        read.append((markers, derived))
    config = resolve(markers, derived, run)
    raw_prefix = {}
    if param_name_mapper is not None:
        for prefix in ckpt.layers:
            raw_prefix[param_name_mapper(prefix)] = prefix
    build_layers(markers, derived, raw_prefix, ckpt, config, run)
    if run.collect:
        # weights that are not in any shard: SGLang's weight loading cannot fill those
        # parameters (its exact message is not modelled)
        run.violations.extend(
            incomplete_violations(
                "sglang", ckpt, True, "(no SGLang message modelled) SGLang cannot load weights that are not there"
            )
        )
    return markers, derived, run.violations, config


class SGLangVerdict(Verdict):
    """SGLang's verdict with the Comfy markers it inspected (``read``: (markers, derived keys) by
    unmapped prefix; None when it did not inspect them as a check does), and whether its row-wise
    FP8 reader took the file (``rowwise``): the release verdicts (``targets.sglang_releases``)
    start from these, so a check inspects the markers once."""

    __slots__ = ("read", "rowwise")
    read: tuple[dict, dict] | None
    rowwise: bool


def sglang_verdict(ckpt: Checkpoint, param_name_mapper=None) -> Verdict:
    read: list = []
    _markers, _derived, violations, _config = run_all(ckpt, param_name_mapper, collect=True, read=read)
    verdict = SGLangVerdict("sglang", violations)
    verdict.read = read[0] if read and param_name_mapper is None else None
    verdict.rowwise = not read
    return verdict
