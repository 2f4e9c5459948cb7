"""SGLang diffusion runtime (0.5.x): marker inspection, config resolution, layer building.

Reproduces, in SGLang's own order and with its exact messages and exception types,
``inspect_comfy_quant_markers`` (spec 4.1), ``resolve_comfy_checkpoint_quantization`` and the
config constructors (4.2), and the checks made when layers are built (4.3).  In *collect* mode
every violation is listed (the first is the one SGLang raises); in *raise* mode the first is
raised, which is what :mod:`comfyquant.compat.sglang` offers as a drop-in.

Platform rules (MPS, CUDA capability) are not modelled: a CUDA device of capability >= 10.0
is assumed.  A layer counts as an embedding when its last name component contains "embed".
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .base import Verdict, Violation

QUANT_DTYPES = ("F8_E4M3", "I8", "U8")
VALIDATED = ("float8_e4m3fn", "int8_tensorwise", "asym_w4a8_int8", "convrot_w4a4", "nvfp4")
CONVROT_SIZES = (16, 64, 256)

# How each SGLang rule is explained when it is the only thing that flags a layer.
EXPLAIN: dict[str, tuple[str, str]] = {
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
    "R2": ("INT8 ConvRot layers must declare convrot_groupsize 16, 64 or 256", "add convrot_groupsize (comfyquant fix --convrot-groupsize C)"),
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
}


class SGLangError(Exception):
    """Carries the exception type name and message SGLang would raise."""

    def __init__(self, violation: Violation):
        super().__init__(violation.message)
        self.violation = violation


class _Run:
    def __init__(self, collect: bool):
        self.collect = collect
        self.violations: list[Violation] = []

    def fail(self, rule: str, message: str, layer: str | None = None, tensor: str | None = None,
             exception: str | None = "ValueError", blocking: bool = True) -> None:
        cause, fix = EXPLAIN.get(rule, (None, None))
        v = Violation(f"sglang.{rule}", message, exception, layer, tensor, blocking, cause, fix)
        if not self.collect and blocking:
            raise SGLangError(v)
        self.violations.append(v)


def checkpoint_files(ckpt) -> list[tuple[str, dict, dict, Callable[[str], bytes]]]:
    """(path, metadata, {name: (dtype, shape)} sorted by name, marker bytes) per file."""
    mb = ckpt.markers.marker_bytes
    out = []
    for h in ckpt.headers:
        meta = {n: (e.dtype, e.shape) for n, e in sorted(h.tensors.items())}
        out.append((h.file, h.metadata, meta, lambda name, _f=h.file: _marker_bytes(ckpt, mb, _f, name)))
    return out


def _marker_bytes(ckpt, cache: dict, file: str, name: str) -> bytes:
    entry = ckpt.tensors.get(name)
    if entry is not None and entry.file == file and name in cache:
        return cache[name]
    for h in ckpt.headers:
        if h.file == file:
            return ckpt.source(file).pread(h.tensors[name].start, h.tensors[name].nbytes)
    raise KeyError(name)


def _merge(run: _Run, raw: dict, prefix: str, marker: dict) -> None:
    previous = raw.get(prefix)
    if previous is None:
        raw[prefix] = dict(marker)
        return
    for key, value in marker.items():
        if key in previous and previous[key] != value:
            run.fail("P1", f"Conflicting Comfy quantization markers for {prefix!r}", prefix)
            return
    for key, value in marker.items():
        previous.setdefault(key, value)


def inspect_markers(files, param_name_mapper: Callable[[str], str] | None, run: _Run) -> dict[str, dict[str, Any]]:
    """SGLang's ``inspect_comfy_quant_markers`` over pre-read headers."""
    meta: dict[str, tuple[str, tuple]] = {}
    raw: dict[str, dict] = {}
    needs_marker: set[str] = set()
    quant_formats: set[str] = set()
    for path, metadata, tensors, marker_bytes in files:
        qf = metadata.get("quant_format")
        if qf:
            quant_formats.add(qf.lower())
        serialized = metadata.get("_quantization_metadata")
        if serialized is not None:
            _header_markers(run, raw, path, serialized)
        for key, (dtype, shape) in tensors.items():
            meta[key] = (dtype, shape)
            if key.endswith(".weight") and dtype in QUANT_DTYPES:
                needs_marker.add(key[: -len(".weight")])
            if not key.endswith(".comfy_quant"):
                continue
            prefix = key[: -len(".comfy_quant")]
            try:
                marker = json.loads(marker_bytes(key))
            except (ValueError, UnicodeDecodeError):
                run.fail("P2", f"Invalid Comfy quantization marker {key!r} in {path}", prefix, "comfy_quant")
                continue
            if not isinstance(marker, dict):
                run.fail("P3", f"Comfy quantization marker {key!r} must contain a JSON object", prefix, "comfy_quant")
                continue
            _merge(run, raw, prefix, marker)

    if quant_formats == {"mxfp8"}:
        for prefix in sorted(needs_marker):
            wmeta = meta[f"{prefix}.weight"]
            smeta = meta.get(f"{prefix}.weight_scale")
            dtype, shape = wmeta
            if dtype != "F8_E4M3" or len(shape) != 2 or shape[1] % 32 != 0 or smeta != ("U8", (shape[0], shape[1] // 32)):
                run.fail("X1", f"MXFP8 layer {prefix!r} has incompatible weight/scale metadata: {wmeta} and {smeta}",
                         prefix, "weight_scale")
                continue
            raw.setdefault(prefix, {"format": "mxfp8"})

    missing = sorted(needs_marker - raw.keys())
    if missing:
        message = f"Quantized weights are missing comfy_quant metadata: {missing[:5]}"
        for prefix in missing:
            run.fail("M0", message, prefix)

    for prefix, marker in raw.items():
        _check_marker(run, meta, prefix, marker)

    mapped: dict[str, dict] = {}
    for prefix, marker in raw.items():
        name = prefix
        if param_name_mapper is not None:
            m = param_name_mapper(prefix + ".weight")
            name = m[: -len(".weight")] if m.endswith(".weight") else m
        if name in mapped:
            run.fail("M1", f"Comfy markers collide after parameter mapping at {name!r}", prefix)
            continue
        mapped[name] = marker
    return mapped


def _header_markers(run: _Run, raw: dict, path: str, serialized: str) -> None:
    try:
        config = json.loads(serialized)
    except ValueError:
        run.fail("H1", f"Invalid _quantization_metadata in {path}")
        return
    if not isinstance(config, dict):
        run.fail("H2", f"_quantization_metadata in {path} must contain an object")
        return
    layers = config.get("layers")
    if not isinstance(layers, dict):
        run.fail("H3", f"_quantization_metadata in {path} must contain a layers object")
        return
    for prefix, marker in layers.items():
        if not isinstance(marker, dict):
            run.fail("H4", f"Comfy quantization metadata for {prefix!r} must be an object", prefix)
            continue
        _merge(run, raw, prefix, marker)


def _check_marker(run: _Run, meta: dict, prefix: str, marker: dict) -> None:
    fmt = marker.get("format")
    if fmt not in VALIDATED:
        return
    if fmt == "asym_w4a8_int8":
        required = {f"{prefix}.weight", f"{prefix}.weight_s_rel", f"{prefix}.weight_s_channel"}
    else:
        required = {f"{prefix}.weight", f"{prefix}.weight_scale"}
        if fmt == "nvfp4":
            required.add(f"{prefix}.weight_scale_2")
    missing = required - meta.keys()
    if missing:
        run.fail("T1", f"Comfy layer {prefix!r} is missing checkpoint tensors: {sorted(missing)}", prefix)
        return
    if fmt == "float8_e4m3fn":
        marker["_activation_scheme"] = "static" if f"{prefix}.input_scale" in meta else "dynamic"
    elif fmt == "asym_w4a8_int8":
        _check_w4a8(run, meta, prefix, marker)
    elif fmt == "convrot_w4a4":
        _check_w4a4(run, meta, prefix, marker)
    elif fmt == "nvfp4":
        _check_nvfp4(run, meta, prefix, marker)
    else:
        _check_int8(run, meta, prefix, marker)


def _int(run: _Run, value, prefix: str):
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        run.fail("W1", str(exc), prefix, exception=type(exc).__name__)
        return None


def _check_w4a8(run: _Run, meta: dict, prefix: str, marker: dict) -> None:
    wdt, wsh = meta[f"{prefix}.weight"]
    sdt, ssh = meta[f"{prefix}.weight_s_rel"]
    cdt, csh = meta[f"{prefix}.weight_s_channel"]
    g = _int(run, marker.get("group_size", 16), prefix)
    if g is None:
        return
    if g < 4:
        return run.fail("W1", f"Comfy W4A8 layer {prefix!r} has invalid group_size={g}", prefix)
    if wdt != "I8" or sdt != "F8_E4M3":
        return run.fail("W2", f"Comfy W4A8 layer {prefix!r} needs I8 weights and FP8 group scales, got {wdt} and {sdt}",
                        prefix, "weight" if wdt != "I8" else "weight_s_rel")
    if cdt != "F32":
        return run.fail("W3", f"Comfy W4A8 layer {prefix!r} needs F32 channel scales, got {cdt}", prefix, "weight_s_channel")
    if len(wsh) != 2:
        return run.fail("W4", f"Comfy W4A8 layer {prefix!r} needs a 2D packed weight, got {wsh}", prefix, "weight")
    k = wsh[1] * 2
    if ssh != (wsh[0], k // g) or csh != (wsh[0],):
        return run.fail("W5", f"Comfy W4A8 layer {prefix!r} has incompatible weight/scale shapes: {wsh}, {ssh}, and {csh}",
                        prefix, "weight_s_rel" if csh == (wsh[0],) else "weight_s_channel")
    cb, corr = f"{prefix}.weight_codebook", f"{prefix}.weight_correction"
    marker["_has_codebook"] = cb in meta
    marker["_has_correction"] = corr in meta
    if marker["_has_codebook"] and meta[cb] != ("F32", (16,)):
        return run.fail("W6", f"Comfy W4A8 layer {prefix!r} needs an F32[16] codebook", prefix, "weight_codebook")
    if marker["_has_correction"] and meta[corr] != ("F32", (k // g, wsh[0])):
        return run.fail("W7", f"Comfy W4A8 layer {prefix!r} has an incompatible correction tensor", prefix, "weight_correction")


def _check_w4a4(run: _Run, meta: dict, prefix: str, marker: dict) -> None:
    wdt, wsh = meta[f"{prefix}.weight"]
    sdt, ssh = meta[f"{prefix}.weight_scale"]
    if wdt != "I8" or sdt != "F32":
        return run.fail("A1", f"Comfy W4A4 layer {prefix!r} needs I8 packed weights and F32 scales, got {wdt} and {sdt}",
                        prefix, "weight" if wdt != "I8" else "weight_scale")
    if len(wsh) != 2 or ssh != (wsh[0],):
        return run.fail("A2", f"Comfy W4A4 layer {prefix!r} has incompatible weight/scale shapes: {wsh} and {ssh}",
                        prefix, "weight_scale")
    k = wsh[1] * 2
    c = _int(run, marker.get("convrot_groupsize", 256), prefix)
    if c is None:
        return
    if c not in CONVROT_SIZES:
        return run.fail("A3", f"Comfy W4A4 layer {prefix!r} has unsupported convrot_groupsize={c}", prefix)
    if k % 64 or k % c:
        return run.fail("A4", f"Comfy W4A4 layer {prefix!r} has input size {k}, incompatible with quant_group_size=64 "
                              f"and convrot_groupsize={c}", prefix)


def _check_nvfp4(run: _Run, meta: dict, prefix: str, marker: dict) -> None:
    wdt, wsh = meta[f"{prefix}.weight"]
    sdt, ssh = meta[f"{prefix}.weight_scale"]
    s2dt, s2sh = meta[f"{prefix}.weight_scale_2"]
    if wdt != "U8" or sdt != "F8_E4M3":
        return run.fail("F1", f"Comfy NVFP4 layer {prefix!r} needs U8 packed weights and FP8 block scales, got {wdt} and {sdt}",
                        prefix, "weight" if wdt != "U8" else "weight_scale")
    if s2dt != "F32" or s2sh not in ((), (1,)):
        return run.fail("F2", f"Comfy NVFP4 layer {prefix!r} needs a scalar F32 weight_scale_2, got {s2dt}{s2sh}",
                        prefix, "weight_scale_2")
    if len(wsh) != 2:
        return run.fail("F3", f"Comfy NVFP4 layer {prefix!r} needs a 2D packed weight, got {wsh}", prefix, "weight")
    k = wsh[1] * 2
    if k % 16 or ssh != (wsh[0], k // 16):
        return run.fail("F4", f"Comfy NVFP4 layer {prefix!r} has incompatible weight/scale shapes: {wsh} and {ssh}",
                        prefix, "weight_scale")
    pq = f"{prefix}.pre_quant_scale"
    marker["_has_pre_quant_scale"] = pq in meta
    if marker["_has_pre_quant_scale"]:
        pdt, psh = meta[pq]
        if pdt not in ("BF16", "F16", "F32") or psh != (k,):
            return run.fail("F5", f"Comfy NVFP4 layer {prefix!r} has an incompatible pre_quant_scale: {pdt}{psh}",
                            prefix, "pre_quant_scale")


def _check_int8(run: _Run, meta: dict, prefix: str, marker: dict) -> None:
    wdt, wsh = meta[f"{prefix}.weight"]
    sdt, ssh = meta[f"{prefix}.weight_scale"]
    if wdt == "I8" and sdt == "F32" and ssh == ():
        if len(wsh) != 2:
            return run.fail("I1", f"Comfy tensorwise INT8 layer {prefix!r} needs a 2D weight, got {wsh}", prefix, "weight")
        marker["_is_tensorwise_scalar"] = True
        return
    if wdt != "I8" or sdt != "F32":
        return run.fail("I2", f"Comfy INT8 layer {prefix!r} needs I8 weights and F32 scales, got {wdt} and {sdt}",
                        prefix, "weight" if wdt != "I8" else "weight_scale")
    if len(wsh) != 2 or ssh != (wsh[0], 1):
        return run.fail("I3", f"Comfy INT8 layer {prefix!r} has incompatible weight/scale shapes: {wsh} and {ssh}",
                        prefix, "weight_scale")
    marker["_is_rowwise"] = True


# -- resolve and config constructors (spec 4.2) ---------------------------------------------

def is_int8_embedding_marker(marker: dict) -> bool:
    return (
        marker.get("format") == "int8_tensorwise"
        and not marker.get("convrot")
        and bool(marker.get("_is_tensorwise_scalar") or marker.get("_is_rowwise"))
    )


def resolve(markers: dict[str, dict], run: _Run) -> str | None:
    """The config SGLang builds (its class name), after its constructor checks."""
    if not markers:
        return None
    formats = sorted({str(m.get("format")) for m in markers.values()})
    if formats == ["int8_tensorwise"]:
        _int8_config(markers, run)
        return "ConvRotInt8Config"
    if formats in (["asym_w4a8_int8"], ["asym_w4a8_int8", "int8_tensorwise"]):
        for prefix, m in markers.items():
            if m.get("format") == "asym_w4a8_int8":
                if m.get("convrot") is not True:
                    run.fail("R3", f"Serialized W4A8 layer {prefix!r} must set convrot=true", prefix)
            elif not is_int8_embedding_marker(m):
                run.fail("R4", f"Unsupported Comfy W4A8 format for {prefix!r}: {m.get('format')!r}", prefix)
        return "KitchenW4A8Config"
    if formats in (["convrot_w4a4"], ["convrot_w4a4", "int8_tensorwise"]):
        for prefix, m in markers.items():
            if m.get("format") == "convrot_w4a4":
                c = int(m.get("convrot_groupsize", 256))
                if c not in CONVROT_SIZES:
                    run.fail("R6", f"Serialized W4A4 layer {prefix!r} has unsupported convrot_groupsize={c}; "
                                   f"expected one of (16, 64, 256)", prefix)
                    continue
                ld = m.get("linear_dtype", "int4")
                if ld not in ("int4", "int8"):
                    run.fail("R7", f"Serialized W4A4 layer {prefix!r} has unsupported linear_dtype={ld!r}; "
                                   f"expected one of ('int4', 'int8')", prefix)
            elif m.get("format") == "int8_tensorwise":
                _int8_config({prefix: m}, run)
            else:
                run.fail("R5", f"Unsupported Comfy W4A4 format for {prefix!r}: {m.get('format')!r}", prefix)
        return "KitchenW4A4Config"
    if formats == ["float8_e4m3fn"]:
        return "ComfyFp8Config"
    if formats in (["nvfp4"], ["int8_tensorwise", "nvfp4"]):
        for prefix, m in markers.items():
            if m.get("format") == "nvfp4":
                if m.get("convrot"):
                    run.fail("R9", f"Rotated NVFP4 weights are not supported: {prefix!r}", prefix)
            elif not is_int8_embedding_marker(m):
                run.fail("R8", f"Unsupported Comfy NVFP4 companion for {prefix!r}: {m.get('format')!r}", prefix)
        return "ComfyNvfp4Config"
    if formats == ["mxfp8"]:
        return "MXFP8Config"
    run.fail("R0", "Unsupported Comfy quantization format(s): " + ", ".join(formats), exception="NotImplementedError")
    return None


def _int8_config(markers: dict[str, dict], run: _Run) -> None:
    for prefix, m in markers.items():
        if is_int8_embedding_marker(m):
            continue
        if m.get("convrot") is not True:
            run.fail("R1", f"Serialized convrot_int8 layer {prefix!r} must set convrot=true", prefix)
            continue
        c = m.get("convrot_groupsize")
        if c not in CONVROT_SIZES:
            run.fail("R2", f"Serialized convrot_int8 layer {prefix!r} must declare convrot_groupsize in (16, 64, 256), got {c!r}",
                     prefix)


# -- layer construction (spec 4.3) ----------------------------------------------------------

def _is_embedding(prefix: str) -> bool:
    return "embed" in prefix.rsplit(".", 1)[-1]


def build_layers(markers: dict[str, dict], raw_prefix: dict[str, str], meta: dict, config: str | None, run: _Run) -> None:
    for name, m in markers.items():
        prefix = raw_prefix.get(name, name)
        fmt = m.get("format")
        w = meta.get(f"{prefix}.weight")
        if w is None or len(w[1]) != 2:
            continue
        n, cols = w[1]
        if fmt == "asym_w4a8_int8":
            g, c, k = int(m.get("group_size", 16)), int(m.get("convrot_groupsize", 256)), 2 * cols
            if not (g >= 4 and (16 % g == 0 or g % 16 == 0) and k % 16 == 0 and k % g == 0 and k % c == 0):
                run.fail("B1", f"Serialized W4A8 layer {prefix!r} has input size {k}, incompatible with group_size={g} "
                               f"and convrot_groupsize={c}", prefix)
        elif fmt == "convrot_w4a4":
            c, k = int(m.get("convrot_groupsize", 256)), 2 * cols
            if k % 64 or k % c:
                run.fail("B2", f"Serialized W4A4 layer {prefix!r} has input size {k}, incompatible with quant_group_size=64 "
                               f"and convrot_groupsize={c}", prefix)
        elif fmt == "int8_tensorwise" and not _is_embedding(prefix):
            if is_int8_embedding_marker(m):
                if config in ("KitchenW4A8Config", "ComfyNvfp4Config"):
                    run.fail("B4", f"Unsupported quantized linear marker for {prefix!r}", prefix)
                else:
                    run.fail("B4", f"(no SGLang message) layer {prefix!r} has a plain INT8 marker, which SGLang treats as "
                                   f"embedding-only: the linear is built unquantized and its I8 weight cannot load",
                             prefix, exception=None)
            elif m.get("convrot") is True:
                c = m.get("convrot_groupsize")
                if isinstance(c, (int, float)) and c and cols % int(c):
                    run.fail("B3", f"Serialized convrot_int8 layer {prefix!r} has input size {cols}, which is not divisible "
                                   f"by its ConvRot group size {int(c)}", prefix)
                elif m.get("_is_tensorwise_scalar"):
                    run.fail("B5", f"(no SGLang message) ConvRot INT8 layer {prefix!r} has a scalar weight_scale; SGLang's "
                                   f"parameter is [N, 1] and the load fails", prefix, "weight_scale", exception=None)


def run_all(files, param_name_mapper=None, collect: bool = True) -> tuple[dict, list[Violation], str | None]:
    """Inspect, resolve and build, as SGLang loads a checkpoint.  Raises SGLangError unless ``collect``."""
    run = _Run(collect)
    markers = inspect_markers(files, param_name_mapper, run)
    config = resolve(markers, run)
    meta: dict = {}
    for _path, _md, tensors, _mb in files:
        meta.update(tensors)
    raw_prefix = _raw_prefixes(files, param_name_mapper) if param_name_mapper is not None else {}
    build_layers(markers, raw_prefix, meta, config, run)
    return markers, run.violations, config


def _raw_prefixes(files, mapper) -> dict[str, str]:
    out = {}
    for _path, _md, tensors, _mb in files:
        for key in tensors:
            if key.endswith(".weight"):
                raw = key[: -len(".weight")]
                m = mapper(key)
                out[m[: -len(".weight")] if m.endswith(".weight") else m] = raw
    return out


def sglang_verdict(ckpt, param_name_mapper=None) -> Verdict:
    _markers, violations, _config = run_all(checkpoint_files(ckpt), param_name_mapper, collect=True)
    return Verdict("sglang", violations)
