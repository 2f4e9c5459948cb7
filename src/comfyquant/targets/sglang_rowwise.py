"""SGLang's reader of its rowwise FP8 header map, with its exact messages and exception types.

SGLang 0.5.23 reads a file's ``_quantization_metadata`` first with
``get_quant_config_from_safetensors_metadata`` (``runtime/utils/quantization_utils.py``), before
any Comfy marker: when the map declares ``rowwise-float8_e4m3fn`` (``formats.rowwise_fp8
.declares_rowwise``), ``build_rowwise_fp8_config_from_metadata``
(``runtime/layers/quantization/rowwise_fp8.py``) validates it against the file's tensor header
and builds ``RowwiseFp8Config``, and the Comfy marker reader is never reached. Each file is read
on its own, against its own tensors. A file that ``safe_open`` refuses, or whose map Python's
``json`` cannot parse, is not read this way (SGLang then returns no config from it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..formats.rowwise_fp8 import DENSE, MAP_VERSION, ROWWISE_FP8, SCALE_RECIPE, declared_format, declares_rowwise
from ..markers import MARKER_MAP as META_KEY
from ..markers import VERSION_KEY

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

ERROR = "RowwiseFp8Error"
CONFIG = "RowwiseFp8Config"

EXPLAIN: dict[str, tuple[str, str]] = {
    "RW1": ('SGLang\'s rowwise FP8 map must say format_version "1.1"', 'set "format_version": "1.1"'),
    "RW2": ("the rowwise FP8 map needs a non-empty layers object", "list every linear layer under layers"),
    "RW3": (
        'a rowwise FP8 map\'s layers are "rowwise-float8_e4m3fn" or "bf16"',
        "mark the layer rowwise-float8_e4m3fn or bf16",
    ),
    "RW4": ("the rowwise FP8 map declares no quantized layer", "mark the FP8 layers rowwise-float8_e4m3fn"),
    "RW5": (
        'the rowwise FP8 map needs quant_configs["rowwise-float8_e4m3fn"] = {"scale_recipe": "rowwise"}',
        "add the quant_configs entry (comfyquant quantize --format rowwise-fp8 writes it)",
    ),
    "RW6": ("a rowwise FP8 layer needs its F8_E4M3 weight and F32 [N] weight_scale", "re-quantize the layer"),
    "RW7": ("a rowwise FP8 layer's input_scale must be F32 [1]", "store input_scale as F32 [1], or drop it"),
    "RW8": ("a weight_scale or input_scale belongs to a layer the map does not quantize", "mark the layer or drop the tensor"),
    "RW9": ("SGLang's own code fails on this map", "rewrite the map as comfyquant quantize --format rowwise-fp8 writes it"),
}


class Failure(Exception):
    """What SGLang raises on one file: (rule, exception type name, message, layer, tensor)."""

    def __init__(self, rule: str, message: str, layer: str | None = None, tensor: str | None = None, exception: str = ERROR):
        super().__init__(message)
        self.rule, self.message, self.layer, self.tensor, self.exception = rule, message, layer, tensor, exception


def parsed_map(header) -> object:
    """The file's ``_quantization_metadata`` as SGLang parses it (Python's ``json``), or None
    when it has none or Python cannot parse it."""
    raw = header.metadata.get(META_KEY)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def rowwise_files(ckpt: Checkpoint, damaged: Callable[[], dict]) -> list[tuple[Any, dict]]:
    """(header, parsed map) of each shard SGLang reads as rowwise FP8 (``declares_rowwise``);
    ``damaged()``: the shards ``safe_open`` refuses (asked only when a map names the format)."""
    out = []
    for header in ckpt.headers:
        raw = header.metadata.get(META_KEY)
        if not raw or (ROWWISE_FP8 not in raw and "\\u" not in raw):
            continue  # the format's name must be in the map (possibly escaped)
        obj = parsed_map(header)
        if isinstance(obj, dict) and declares_rowwise(obj) and header.file not in damaged():
            out.append((header, obj))
    return out


def _attr(value, name: str) -> str:
    return f"'{type(value).__name__}' object has no attribute '{name}'"


def validate(config: dict, tensors: dict) -> set[str]:
    """``RowwiseFp8Config._from_metadata`` with the file's tensors (``tensors``: name -> header
    entry with ``dtype`` and ``shape``): the layers with a static input scale, or ``Failure``."""
    version = config.get(VERSION_KEY)
    if isinstance(version, (list, dict)):  # SGLang tests membership in a frozenset
        raise Failure("RW9", f"unhashable type: '{type(version).__name__}'", exception="TypeError")
    if version != MAP_VERSION:
        raise Failure("RW1", f"unsupported quantization format_version {version!r}; expected one of {[MAP_VERSION]}")
    layers = config.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise Failure("RW2", f"{META_KEY} has no 'layers' map")
    quant_configs = config.get("quant_configs", {})
    fp8_layers: set[str] = set()
    for prefix, entry in layers.items():
        fmt = declared_format(entry)
        if fmt == DENSE:
            continue
        if fmt == ROWWISE_FP8:
            fp8_layers.add(prefix)
            continue
        raise Failure("RW3", f"unknown quant format {fmt!r} for layer {prefix!r}", prefix)
    if not fp8_layers:
        raise Failure("RW4", f"{META_KEY} declares no quantized layers ({ROWWISE_FP8})")
    if not hasattr(quant_configs, "get"):
        raise Failure("RW9", _attr(quant_configs, "get"), exception="AttributeError")
    fp8_config = quant_configs.get(ROWWISE_FP8)
    if not isinstance(fp8_config, dict):
        raise Failure("RW5", f"missing quant_configs[{ROWWISE_FP8!r}] layout descriptor")
    recipe = fp8_config.get("scale_recipe")
    if recipe != SCALE_RECIPE:
        raise Failure("RW5", f"unsupported FP8 scale_recipe {recipe!r}; only 'rowwise' is supported")
    return _validate_tensors(tensors, fp8_layers)


def _validate_tensors(tensors: dict, fp8_layers: set[str]) -> set[str]:
    static: set[str] = set()
    for prefix in sorted(fp8_layers):
        w_name, s_name, i_name = f"{prefix}.weight", f"{prefix}.weight_scale", f"{prefix}.input_scale"
        if w_name not in tensors:
            raise Failure("RW6", f"FP8 layer {prefix!r} missing weight tensor {w_name!r}", prefix, "weight")
        if s_name not in tensors:
            raise Failure("RW6", f"FP8 layer {prefix!r} missing weight_scale tensor {s_name!r}", prefix, "weight_scale")
        w, s = tensors[w_name], tensors[s_name]
        if w.dtype != "F8_E4M3":
            raise Failure("RW6", f"{w_name}: expected dtype F8_E4M3, got {w.dtype}", prefix, "weight")
        shape = list(w.shape)
        if len(shape) != 2:
            raise Failure("RW6", f"{w_name}: expected 2-D weight, got shape {shape}", prefix, "weight")
        if s.dtype != "F32":
            raise Failure("RW6", f"{s_name}: expected dtype F32, got {s.dtype}", prefix, "weight_scale")
        if list(s.shape) != [shape[0]]:
            raise Failure(
                "RW6", f"{s_name}: row-wise scale must have shape [{shape[0]}], got {list(s.shape)}", prefix, "weight_scale"
            )
        i = tensors.get(i_name)
        if i is not None:
            if i.dtype != "F32" or list(i.shape) != [1]:
                raise Failure(
                    "RW7",
                    f"{i_name}: static input_scale must be float32 shape [1], got dtype={i.dtype} shape={list(i.shape)}",
                    prefix,
                    "input_scale",
                )
            static.add(prefix)
    for name in tensors:
        for suffix in (".weight_scale", ".input_scale"):
            if name.endswith(suffix) and name[: -len(suffix)] not in fp8_layers:
                layer = name[: -len(suffix)]
                raise Failure("RW8", f"unexpected quantization tensor {name!r} for a non-FP8 layer", layer, suffix[1:])
    return static


def read(ckpt: Checkpoint, damaged: Callable[[], dict], run) -> str | None:
    """SGLang's rowwise reading of every shard that declares the format: the first failure is
    failed on ``run`` (``targets.sglang.Run``); the config class name when every such shard
    builds one, None when no shard declares the format."""
    files = rowwise_files(ckpt, damaged)
    if not files:
        return None
    for header, obj in files:
        try:
            validate(obj, header.tensors)
        except Failure as f:
            run.fail(f.rule, f.message, f.layer, f.tensor, exception=f.exception)
            if run.collect:
                return None
    return CONFIG
