"""A generated space of defective checkpoints, deterministic from a seed.

Each case is one small safetensors file holding one quantized layer (``LAYER``), built from a
valid layer that comfy-kitchen 0.2.40 quantized from a seeded dense weight, then broken in one
way.  The dense weight and bias are kept with the case so a driver can measure the output of
what a runtime computes against the layer it was meant to be.

The space (``generate``): for every format comfy-kitchen writes (FP8 E4M3/E5M2, INT8 scalar,
row-wise and ConvRot, W4A8 4/6-bit, codebook and uniform, with and without a correction,
ConvRot W4A4 int4/int8, NVFP4, MXFP8) at two geometries, plus AWQ W4A16 and legacy scaled FP8:

* ``valid``: the layer as written (marker as tensor, in the header map, or both);
* ``slot``: every stored tensor missing, cast to each plausible wrong dtype (by value, or by
  bits for same-width dtypes), transposed, each dimension one more and one less, scalar <->
  vector <-> matrix, padded <-> unpadded, 3-D; and every tensor the format does not have, extra;
* ``marker``: every marker key missing, of a wrong type, out of range, non-finite; an unknown
  key; the format unknown;
* ``header``: header map vs tensor marker conflicts and malformed header maps;
* ``legacy``: ComfyUI's scaled-FP8 forms;
* ``value`` (``deep``): scales zero, negative, NaN, inf, subnormal; a weight cast by value;
* ``container``: truncated files, wrong header lengths, headers that are not JSON, overlapping
  and short data offsets.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save, save_file

from kitchen_fixtures import make_layer, make_weight

LAYER = "blocks.0.attn.qkv"

# (variant name in kitchen_fixtures, shapes) -- two geometries per format, K a multiple of
# every group size the format uses with its defaults.
VARIANTS: dict[str, tuple[tuple[int, int], ...]] = {
    "fp8": ((64, 256), (96, 128)),
    "fp8_static": ((64, 256),),
    "fp8_e5m2": ((64, 256), (96, 128)),
    "int8_scalar": ((64, 256), (96, 128)),
    "int8_rowwise": ((64, 256), (96, 128)),
    "int8_convrot": ((64, 256), (96, 512)),
    "w4a8_codebook": ((64, 256), (96, 512)),
    "w4a8_uniform": ((64, 256),),
    "w4a8_asym": ((64, 256),),
    "w6a8": ((64, 256), (96, 512)),
    "w4a4": ((64, 256), (96, 512)),
    "w4a4_int8": ((64, 256),),
    "nvfp4": ((64, 256), (128, 128)),
    "mxfp8": ((64, 256), (128, 128)),
}

HELD_OUT: dict[str, tuple[tuple[int, int], ...]] = {
    "fp8": ((48, 192), (80, 64)),
    "fp8_static": ((80, 64),),
    "fp8_e5m2": ((48, 192), (80, 64)),
    "int8_scalar": ((48, 192), (80, 64)),
    "int8_rowwise": ((48, 192), (80, 64)),
    "int8_convrot": ((48, 512), (32, 256)),
    "w4a8_codebook": ((48, 512), (32, 256)),
    "w4a8_uniform": ((48, 512),),
    "w4a8_asym": ((32, 512),),
    "w6a8": ((48, 512), (32, 256)),
    "w4a4": ((48, 512), (32, 256)),
    "w4a4_int8": ((48, 512),),
    "nvfp4": ((48, 192), (96, 320)),
    "mxfp8": ((96, 192), (64, 128)),
}
"""Other geometries of the same formats, none of them in ``VARIANTS``: a space no rule was
written against (``generate(shapes=HELD_OUT)``, ``tools/prove_verdicts.py --held-out``)."""

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
WRONG_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8, torch.int8, torch.int32)
"""Plausible dtypes a writer puts on a tensor by mistake."""

EXTRA_SLOTS = (
    "weight_scale",
    "input_scale",
    "weight_scale_2",
    "pre_quant_scale",
    "weight_s_rel",
    "weight_s_channel",
    "weight_codebook",
    "weight_correction",
    "weight_zeros",
)

MARKER_KEYS = {
    "float8_e4m3fn": ("format", "full_precision_matrix_mult"),
    "float8_e5m2": ("format", "full_precision_matrix_mult"),
    "int8_tensorwise": ("format", "convrot", "convrot_groupsize", "full_precision_matrix_mult"),
    "asym_w4a8_int8": ("format", "group_size", "convrot_groupsize", "convrot"),
    "convrot_w4a4": ("format", "convrot_groupsize", "linear_dtype"),
    "nvfp4": ("format", "group_size"),
    "mxfp8": ("format", "group_size"),
    "awq_w4a16": ("format", "group_size"),
}

WRONG_TYPES: tuple = ("16", 16.5, [16], None, True, {"v": 16})
OUT_OF_RANGE: tuple = (0, -1, 7, 32, 64, 128, 1024)
NON_FINITE: tuple = (float("nan"), float("inf"), -float("inf"))
FORMAT_VALUES: tuple = ("float8", "int4", "", "FLOAT8_E4M3FN", "awq_w4a16", "svdquant_w4a4", 5)
LINEAR_DTYPES: tuple = ("fp8", "int16", "INT4")

UNDECIDABLE = {
    "bias-absent": (
        "the layer has no bias tensor: nothing in the file says whether the model's layer has "
        "one (ComfyUI then computes with a bias it never initialised)"
    ),
    "rotation-size": (
        "the marker's ConvRot group size is one the runtime accepts for this K but not the one "
        "the weights were rotated with: the stored codes of a rotated weight do not record the "
        "rotation size, the marker is its only record"
    ),
    "rotation-flag": (
        "the marker's convrot flag says the weights are (not) rotated and they are the other "
        "way: a rotated weight's codes do not show the rotation, the marker is its only record"
    ),
    "bytes-of-other-float": (
        "a 16-bit float tensor without a sign or range rule (a bias, a correction) holds the "
        "bytes of the other 16-bit float: both readings are valid numbers, the file does not "
        "record which the writer meant, and whether the output is garbage depends on the "
        "activations the model feeds the layer"
    ),
    "values-not-the-source": (
        "a weight whose stored codes, times its stored scales, are a valid weight the runtime "
        "computes faithfully (a dense weight cast into INT8 or MXFP8 codes with the scales left "
        "as they were, E5M2 codes stored as INT8 or E4M3 values, uniform W4A8 codes beside a "
        "codebook they were not written for): that it is not the weight the "
        "layer was meant to hold shows only against the dense weight, which the file does not contain"
    ),
    "packed-through-float8": (
        "bytes of packed 4-bit codes stored in a float8 dtype by value: past 16 the float8 rounded "
        "away their low bits, so some codes are lost; how far the output moves (measured from "
        "degraded to just past garbage) depends on the lost bits, which the file no longer holds"
    ),
}
"""Classes of defect a file cannot show, even to ``--deep``, with what information is
missing (docs/runtimes.md lists them): the agreement tests hold comfyquant to "loads" on
them and the runtime to not raising."""

WRONG_ROTATION_SIZES: tuple = ("16", 16.5, 16, 64)
"""Marker ConvRot sizes comfy-kitchen reads (through ``int()``) as a power of 4 that divides
the K of every generated ConvRot layer, none of them the size the layer was rotated with."""


def _faithful(stored: torch.Tensor, storage: torch.dtype) -> bool:
    """Whether a runtime that casts ``stored`` by value into the layout's ``storage`` dtype
    computes with the values the file holds (within 10%): the file is then consistent, and
    only the dense weight it was meant to hold shows it wrong.  U8 values are left out: in an
    FP8 slot comfyquant reads them as FP8 bytes when their top bits say so."""
    if stored.dtype == torch.uint8 or stored.dtype == storage:
        return False
    values = stored.float()
    cast = stored.to(storage).float() if storage.is_floating_point else _cast(stored.float(), storage).float()
    if not bool(torch.isfinite(values).all()) or not bool(torch.isfinite(cast).all()):
        return False
    norm = float(values.norm())
    return norm > 0 and float((cast - values).norm()) / norm < 0.1


def _undecidable_marker(fmt_marker: dict, key: str, value) -> str | None:
    """The ``UNDECIDABLE`` class of a marker edit the runtime accepts but that does not match
    how the weights were written (None: the edit is decidable from the file)."""
    if key == "convrot_groupsize" and value in WRONG_ROTATION_SIZES and type(value) is not bool:
        if fmt_marker.get("format") != "int8_tensorwise" or fmt_marker.get("convrot"):
            return "rotation-size"
    if key == "convrot" and fmt_marker.get("format") == "int8_tensorwise" and bool(value) != bool(fmt_marker.get("convrot")):
        return "rotation-flag"
    return None


@dataclass
class Case:
    """One generated checkpoint: written by ``write`` into a folder as ``<id>.safetensors``."""

    id: str
    group: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] | None = None
    dense: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    """Layer -> (dense weight [N, K] in F32, bias or None): what the layer is meant to compute."""
    deep: bool = False
    """Whether only the tensors' values show the defect (comfyquant needs ``--deep``)."""
    damage: Callable[[bytes], bytes] | None = None
    """Container damage applied to the written bytes."""
    undecidable: str | None = None
    """The ``UNDECIDABLE`` class of a defect the file cannot show (None: it can): comfyquant
    must say the file loads, and the runtime must not raise (it may compute garbage)."""
    valid: tuple[dict[str, torch.Tensor], dict] | None = None
    """The layer's tensors before a defect that changes a stored tensor's shape: the model the
    runtime is driven with is then the one the file records (``recorded_size``), which may
    differ from the dense source's (``write`` sets ``model``)."""
    prefix: str = ""
    """The prefix every tensor of the file carries (``in_checkpoint``): the runtime's model
    names its layers without it, as ComfyUI does once it strips the diffusion model's prefix."""
    model: tuple[int, int] | None = None
    """The layer size the runtime's model is built with when it is not the dense source's: the
    size the file records (``write`` sets it for a ``resized`` case whose file records another)."""
    path: Path | None = None

    def write(self, folder: Path) -> Path:
        """Write the checkpoint, and beside it ``<id>.dense`` (the dense layers, for drivers
        running in another process)."""
        path = Path(folder) / f"{self.id}.safetensors"
        if self.damage is None:
            save_file(self.tensors, str(path), metadata=self.metadata)
        else:
            path.write_bytes(self.damage(save(self.tensors, metadata=self.metadata)))
        layers = dict(self.dense)
        if self.valid is not None:
            size = recorded_size(path, self.prefix + LAYER, *self.valid)
            weight, bias = layers[LAYER]
            if size is not None and size != tuple(weight.shape):
                self.model = size
                layers[LAYER] = _recut(weight, bias, size)
        dense = {}
        for layer, (weight, bias) in layers.items():
            dense[f"{layer}.weight"] = weight.contiguous()
            if bias is not None:
                dense[f"{layer}.bias"] = bias.contiguous()
        save_file(dense, str(dense_path(path)))
        self.path = path
        return path


DIFFUSION_PREFIX = "model.diffusion_model."
CHECKPOINT_LAYERS = ("img_in", "final_layer.linear")
"""Dense BF16 layers ``in_checkpoint`` puts beside the case's layer."""


def in_checkpoint(case: Case, seed: int = 0) -> Case:
    """The case as one layer of a whole checkpoint: every tensor under the diffusion model's
    prefix (the header map's layer names too), beside dense BF16 layers and a tensor of
    another model part (a VAE's), as full checkpoints hold them."""
    renamed = {DIFFUSION_PREFIX + name: t for name, t in case.tensors.items()}
    dense = dict(case.dense)
    for i, layer in enumerate(CHECKPOINT_LAYERS):
        weight = make_weight(64, 256, torch.bfloat16, seed * 1000 + 500 + i)
        bias = (torch.randn(64, generator=torch.Generator().manual_seed(seed + i)) * 0.01).to(torch.bfloat16)
        renamed[f"{DIFFUSION_PREFIX}{layer}.weight"] = weight
        renamed[f"{DIFFUSION_PREFIX}{layer}.bias"] = bias
        dense[layer] = (weight.float(), bias)
    renamed["first_stage_model.decoder.conv_in.weight"] = torch.ones(8, 4, 3, 3, dtype=torch.bfloat16)
    metadata = case.metadata
    text = (metadata or {}).get("_quantization_metadata")
    if text is not None:
        try:
            parsed = json.loads(text)
            layers = parsed["layers"]
            parsed["layers"] = {DIFFUSION_PREFIX + k: v for k, v in layers.items()}
            metadata = dict(metadata, _quantization_metadata=json.dumps(parsed))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a malformed map stays as it is
    out = Case(f"ckpt.{case.id}", case.group, renamed, metadata, dense, case.deep, None, case.undecidable)
    out.valid, out.prefix = case.valid, DIFFUSION_PREFIX
    return out


def in_pairs(cases: list[Case], folder: Path, seed: int = 0, count: int = 600) -> list[Case]:
    """``count`` files of two defective layers each (``blocks.0`` and ``blocks.1``, two cases
    of the space drawn with ``seed``): the runtime meets both, in the model's order.  Cases
    whose model is not the dense source's, or whose defect the file cannot show, are left out
    (each layer must be judged on its own terms); each drawn case is written into ``folder``
    first to learn that."""
    rng = random.Random(seed)
    pool = [c for c in cases if c.group in ("slot", "marker", "value") and c.undecidable is None and c.metadata is None]
    out: list[Case] = []
    seen: set[str] = set()
    while len(out) < count:
        a, b = rng.sample(pool, 2)
        if a.id == b.id or f"{a.id}+{b.id}" in seen:
            continue
        seen.add(f"{a.id}+{b.id}")
        for c in (a, b):
            if c.path is None:
                c.write(folder)
        if a.model is not None or b.model is not None:
            continue
        tensors, dense = {}, {}
        for i, c in enumerate((a, b)):
            layer = f"blocks.{i}.attn.qkv"
            tensors.update({name.replace(LAYER, layer, 1): t.clone() for name, t in c.tensors.items()})
            weight, bias = c.dense[LAYER]
            dense[layer] = (weight.clone(), None if bias is None else bias.clone())
        out.append(Case(f"pair.{a.id}+{b.id}", "pair", tensors, None, dense, a.deep or b.deep))
    return out


def recorded_size(path: Path, layer: str, valid: dict[str, torch.Tensor], marker: dict) -> tuple[int, int] | None:
    """The size (N, K) of the model layer the file at ``path`` records for ``layer`` when it is
    not the one its valid layer (``valid`` and ``marker``, before the defect) records: what a
    header-only verdict has to assume.  None when the file records the valid layer's size (the
    model is then the dense source).

    Each dimension is decided alone, between the size the weight records (comfyquant's geometry
    of the stored layer under its marker, the unpadded size for formats that pad their storage)
    and the valid layer's.  The weight speaks for its own size, every other stored tensor for the
    sizes under which the format's description gives it its stored shape; the weight's size wins when no fewer tensors speak
    for it alone than for the valid size alone (the weight decides a tie), unless it is no valid
    layer (a constraint of the format fails) while another tensor records that dimension.  A
    weight whose columns are the output size the others record is stored transposed: its rows
    are the K it records."""
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.errors import ComfyQuantError
    from comfyquant.formats.base import GeometryError, Meta
    from comfyquant.formats.registry import FORMATS
    from comfyquant.numerics.dtypes import dtype_name

    try:
        with open_checkpoint(str(path)) as ckpt:
            lay = ckpt.layers.get(layer)
            fmt = FORMATS.get(lay.format_name) if lay is not None and lay.format_name else None
            if fmt is None:
                return None
            stored = {s: e for s, e in lay.tensors.items() if s != "comfy_quant"}
            env = fmt.geometry(stored, fmt.params(lay.marker or {}))
            was = FORMATS[marker["format"]]
            before = was.geometry({s: Meta(dtype_name(t.dtype), tuple(t.shape)) for s, t in valid.items()}, was.params(marker))
    except (ComfyQuantError, GeometryError, ValueError, KeyError, TypeError, ArithmeticError):
        return None
    model = dict(env)  # the stored layer's geometry, its sizes taken from the valid layer...
    for name in ("N", "K"):
        model[name] = model[f"{name}_model"] = _model_size(before, name)
    w = stored.get("weight")
    for name in ("N", "K"):  # ... then each dimension the weight records otherwise, if it wins
        recorded = (env.get(name), _model_size(env, name))
        if name == "K" and w is not None and len(w.shape) == 2 and env.get("K") == w.shape[1] == model["N"] != env.get("N"):
            recorded = (w.shape[0], w.shape[0])  # its columns are the model's N: stored transposed, its rows are K
        if recorded[1] == model[name]:
            continue
        weight = dict(model, **{name: recorded[0], f"{name}_model": recorded[1]})
        if not all(c.holds(weight) for c in fmt.constraints) and _recorded_elsewhere(fmt, weight, name, stored):
            continue
        # the weight speaks for its own size; the other tensors for the sizes that give them their shapes
        others = {s: e for s, e in stored.items() if s != "weight"}
        for_weight, for_valid = _speaking_for(fmt, weight, others) | {"weight"}, _speaking_for(fmt, model, others)
        if len(for_weight - for_valid) >= len(for_valid - for_weight):
            model = weight
    size = (_model_size(model, "N"), _model_size(model, "K"))
    if size == (_model_size(before, "N"), _model_size(before, "K")):
        return None
    return size if all(isinstance(d, int) and d > 0 for d in size) else None


def _model_size(env: dict, name: str):
    return env.get(f"{name}_model", env.get(name))


def _speaking_for(fmt, env: dict, stored: dict) -> set[str]:
    """The stored tensors whose shape is the one the format gives them under ``env``."""
    slots = fmt.slots_for(env)
    out = set()
    for suffix, entry in stored.items():
        slot = slots.get(suffix)
        try:
            if slot is not None and not slot.is_forbidden(env) and tuple(slot.expected_shape(env)) == tuple(entry.shape):
                out.add(suffix)
        except (ArithmeticError, TypeError, ValueError, KeyError, NameError):
            pass
    return out


def _recorded_elsewhere(fmt, env: dict, name: str, stored: dict) -> bool:
    """Whether a stored tensor other than the weight records dimension ``name``: its expected
    shape moves when that dimension does."""
    probe = dict(env)
    for key in (name, f"{name}_model"):
        if isinstance(probe.get(key), int):
            probe[key] = 2 * probe[key]
    slots, moved = fmt.slots_for(env), fmt.slots_for(probe)
    for suffix in stored:
        if suffix == "weight" or suffix not in slots or suffix not in moved:
            continue
        try:
            if tuple(slots[suffix].expected_shape(env)) != tuple(moved[suffix].expected_shape(probe)):
                return True
        except (ArithmeticError, TypeError, ValueError, KeyError, NameError):
            continue
    return False


def _recut(weight: torch.Tensor, bias: torch.Tensor | None, size: tuple[int, int]):
    """The dense layer cut or zero-padded to ``size``: the layer a model of that size computes
    with the file's values (what the runtime's output is measured against)."""
    n, k = size
    w = torch.zeros(n, k, dtype=weight.dtype)
    rows, cols = min(n, weight.shape[0]), min(k, weight.shape[1])
    w[:rows, :cols] = weight[:rows, :cols]
    if bias is None:
        return w, None
    b = torch.zeros(n, dtype=bias.dtype)
    b[:rows] = bias[:rows]
    return w, b


def dense_path(path: Path) -> Path:
    """Where ``Case.write`` puts the dense layers of the checkpoint at ``path``."""
    return Path(path).with_suffix(".dense")


def read_dense(path: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """The dense layers ``Case.write`` kept beside the checkpoint at ``path``."""
    from safetensors.torch import load_file

    flat = load_file(str(dense_path(path)))
    return {
        name[: -len(".weight")]: (t, flat.get(name[: -len(".weight")] + ".bias"))
        for name, t in flat.items()
        if name.endswith(".weight")
    }


def _marker_tensor(marker) -> torch.Tensor:
    raw = marker if isinstance(marker, bytes) else json.dumps(marker).encode("utf-8")
    return torch.tensor(list(raw), dtype=torch.uint8)


class _Base:
    """A valid layer: its tensors by suffix, marker, dense source."""

    def __init__(self, name: str, tensors: dict[str, torch.Tensor], marker: dict, dense, bias) -> None:
        self.name, self.tensors, self.marker, self.dense, self.bias = name, tensors, marker, dense, bias

    def named(self, tensors: dict[str, torch.Tensor] | None = None, marker=None, marker_tensor=True) -> dict:
        out = {f"{LAYER}.{s}": t.contiguous() for s, t in (self.tensors if tensors is None else tensors).items()}
        if marker_tensor:
            out[f"{LAYER}.comfy_quant"] = _marker_tensor(self.marker if marker is None else marker)
        return out

    def case(self, cid: str, group: str, tensors=None, marker=None, metadata=None, deep=False, marker_tensor=True) -> Case:
        case = Case(
            cid,
            group,
            self.named(tensors, marker, marker_tensor),
            metadata,
            {LAYER: (self.dense, self.bias)},
            deep,
        )
        if group in ("slot", "marker"):  # the defect may change the size the file records
            case.valid = (self.tensors, self.marker)
        return case


def _base(variant: str, n: int, k: int, seed: int) -> _Base:
    layer = make_layer(variant, LAYER, n, k, seed=seed, marker="sglang")
    dense = make_weight(n, k, torch.bfloat16, seed).float()
    return _Base(f"{variant}_{n}x{k}", dict(layer.tensors), dict(layer.marker), dense, layer.tensors.get("bias"))


def _w4a8_correction(base: _Base) -> _Base:
    g = base.marker.get("group_size", 16)
    n, k = base.dense.shape
    tensors = dict(base.tensors)
    tensors["weight_correction"] = torch.zeros(k // g, n, dtype=torch.float32)
    return _Base(base.name + "_corr", tensors, base.marker, base.dense, base.bias)


def _awq(n: int, k: int, seed: int, group: int = 64) -> _Base:
    """AWQ W4A16 (offline-calibrated only): random codes, scales and zeros; the dense source is
    comfy-kitchen's own decode of the valid layer."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randint(-128, 128, (n, k // 2), generator=gen, dtype=torch.int16).to(torch.int8)
    scale = (torch.rand(k // group, n, generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
    zeros = (torch.rand(k // group, n, generator=gen) * -0.05).to(torch.bfloat16)
    bias = (torch.randn(n, generator=gen) * 0.01).to(torch.bfloat16)
    tensors = {"weight": weight, "weight_scale": scale, "weight_zeros": zeros, "bias": bias}
    from comfy_kitchen.tensor import QuantizedTensor, TensorCoreAWQW4A16Layout

    params = TensorCoreAWQW4A16Layout.Params(
        scale=scale, zeros=zeros, group_size=group, orig_dtype=torch.bfloat16, orig_shape=(n, k)
    )
    dense = QuantizedTensor(weight, "TensorCoreAWQW4A16Layout", params).dequantize().float()
    return _Base(f"awq_{n}x{k}", tensors, {"format": "awq_w4a16", "group_size": group}, dense, bias)


# -- tensor mutations -------------------------------------------------------------------------


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype.is_floating_point and not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return t.float().clamp(info.min, info.max).to(dtype)
    return t.to(dtype)


def _resize(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if size <= 0:
        return t.narrow(dim, 0, 0)
    if size <= t.shape[dim]:
        return t.narrow(dim, 0, size).contiguous()
    pad_shape = list(t.shape)
    pad_shape[dim] = size - t.shape[dim]
    return torch.cat(
        [t, torch.zeros(pad_shape, dtype=t.dtype) if t.dtype != torch.float8_e8m0fnu else t.narrow(dim, 0, 1).expand(pad_shape)],
        dim,
    )


def _pad_to(x: int, m: int) -> int:
    return -(-x // m) * m


def tensor_mutations(t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Every plausible way one stored tensor is wrong: (tag, mutated tensor)."""
    for dtype in WRONG_DTYPES:
        if dtype == t.dtype:
            continue
        tag = str(dtype).removeprefix("torch.")
        yield f"cast-{tag}", _cast(t, dtype)
        if dtype.itemsize == t.dtype.itemsize and t.dim() > 0 and t.dtype != torch.float8_e8m0fnu:
            yield f"view-{tag}", t.view(dtype)
    if t.dtype == torch.uint8 and t.dim() > 0:
        yield "view-float8_e8m0fnu", t.view(torch.float8_e8m0fnu)
    if t.dim() == 2 and t.shape[0] != t.shape[1]:
        yield "transposed", t.t().contiguous()
    for d in range(t.dim()):
        yield f"dim{d}+1", _resize(t, d, t.shape[d] + 1)
        if t.shape[d] > 1:
            yield f"dim{d}-1", _resize(t, d, t.shape[d] - 1)
    if t.dim() == 0:
        yield "as-vector1", t.reshape(1)
        yield "as-matrix1x1", t.reshape(1, 1)
        yield "as-vector4", t.reshape(1).expand(4).contiguous()
    elif t.dim() == 1:
        yield "as-scalar", t[0].clone()
        yield "as-column", t.reshape(-1, 1)
        yield "as-row", t.reshape(1, -1)
    elif t.dim() == 2:
        if t.shape[1] == 1:
            yield "as-vector", t.reshape(-1)
        if t.shape[0] == 1 or t.shape[1] == 1:
            yield "as-scalar", t.reshape(-1)[0].clone()
        rows, cols = _pad_to(t.shape[0], 128), _pad_to(t.shape[1], 4)
        if (rows, cols) != tuple(t.shape):
            yield "padded", _resize(_resize(t, 0, rows), 1, cols)
        if t.shape[0] > 64 and t.shape[0] % 128 == 0:
            yield "unpadded", t.narrow(0, 0, t.shape[0] // 2).contiguous()
    if t.dim() >= 1:
        yield "3d-unsqueezed", t.unsqueeze(0)
        if t.dim() == 2 and t.shape[0] % 2 == 0:
            yield "3d-split", t.reshape(2, t.shape[0] // 2, *t.shape[1:])


def _extra(suffix: str, base: _Base) -> torch.Tensor:
    n, k = base.dense.shape
    if suffix in ("input_scale", "weight_scale_2"):
        return torch.tensor(0.01, dtype=torch.float32)
    if suffix == "pre_quant_scale":
        return torch.ones(k, dtype=torch.bfloat16)
    if suffix == "weight_s_channel":
        return torch.ones(n, dtype=torch.float32)
    if suffix == "weight_codebook":
        return torch.linspace(-1, 1, 16, dtype=torch.float32)
    if suffix in ("weight_correction", "weight_zeros"):
        return torch.zeros(k // 16, n, dtype=torch.float32)
    if suffix == "weight_s_rel":
        return torch.ones(n, k // 16, dtype=torch.float32).to(torch.float8_e4m3fn)
    return torch.ones(n, 1, dtype=torch.float32)


def slot_cases(base: _Base) -> Iterator[Case]:
    for suffix, t in base.tensors.items():
        tensors = dict(base.tensors)
        del tensors[suffix]
        # a codebook's absence shows only in the group scales' values, sized for its levels
        case = base.case(f"{base.name}.{suffix}.missing", "slot", tensors, deep=suffix == "weight_codebook")
        case.undecidable = "bias-absent" if suffix == "bias" else None
        yield case
        for tag, mutated in tensor_mutations(t):
            tensors = dict(base.tensors)
            tensors[suffix] = mutated
            # a runtime that casts a tensor by value computes normally or garbage depending on
            # the values (codes stored in a wider dtype survive, reinterpreted bytes do not)
            deep = tag.startswith(("cast-", "view-"))
            case = base.case(f"{base.name}.{suffix}.{tag}", "slot", tensors, deep=deep)
            if suffix in ("bias", "weight_correction") and tag in ("view-float16", "view-bfloat16"):
                case.undecidable = "bytes-of-other-float"
            packed = suffix == "weight" and t.shape != base.dense.shape and not t.dtype.is_floating_point
            if suffix == "weight" and not packed and tag.startswith(("cast-", "view-")) and _faithful(mutated, t.dtype):
                case.undecidable = "values-not-the-source"
            if packed and tag.startswith("cast-float8"):
                case.undecidable = "packed-through-float8"
            yield case
    for suffix in EXTRA_SLOTS:
        if suffix in base.tensors:
            continue
        tensors = dict(base.tensors)
        tensors[suffix] = _extra(suffix, base)
        case = base.case(f"{base.name}.{suffix}.extra", "slot", tensors)
        if suffix == "weight_codebook" and base.marker.get("format") == "asym_w4a8_int8":
            # uniform 4-bit codes decoded through a codebook: a valid layer the runtime computes
            # faithfully, measured just below or just above garbage depending on the seed
            case.undecidable = "values-not-the-source"
        yield case
    if "pre_quant_scale" not in base.tensors:
        k = base.dense.shape[1]
        for size in (k - 1, k + 1, 1):
            tensors = dict(base.tensors)
            tensors["pre_quant_scale"] = torch.ones(size, dtype=torch.bfloat16)
            yield base.case(f"{base.name}.pre_quant_scale.extra-len{size}", "slot", tensors)


def marker_cases(base: _Base) -> Iterator[Case]:
    fmt = base.marker["format"]
    keys = MARKER_KEYS.get(fmt, ("format",))
    for key in keys:
        marker = dict(base.marker)
        if key in marker:
            del marker[key]
            case = base.case(f"{base.name}.marker.{key}.missing", "marker", marker=marker)
            case.undecidable = _undecidable_marker(base.marker, key, False) if key == "convrot" else None
            yield case
        values: list = []
        if key == "format":
            values = list(FORMAT_VALUES) + [None, [fmt]]
        elif key == "linear_dtype":
            values = list(LINEAR_DTYPES) + ["int8", None, 4]
        elif key in ("convrot", "full_precision_matrix_mult"):
            values = ["true", 1, 0, None, not marker.get(key, False)]
        else:
            values = list(WRONG_TYPES) + list(OUT_OF_RANGE) + list(NON_FINITE)
        for i, value in enumerate(values):
            marker = dict(base.marker)
            marker[key] = value
            case = base.case(f"{base.name}.marker.{key}.v{i}", "marker", marker=marker)
            case.undecidable = _undecidable_marker(base.marker, key, value)
            yield case
    marker = dict(base.marker, unknown_key=1)
    yield base.case(f"{base.name}.marker.unknown-key", "marker", marker=marker)
    for i, raw in enumerate((b"not json", b"[1, 2]", b'"float8_e4m3fn"', b"")):
        yield Case(
            f"{base.name}.marker.raw{i}",
            "marker",
            dict(base.named(), **{f"{LAYER}.comfy_quant": torch.tensor(list(raw), dtype=torch.uint8)}),
            None,
            {LAYER: (base.dense, base.bias)},
        )


def header_cases(base: _Base) -> Iterator[Case]:
    good = json.dumps({"format_version": "1.0", "layers": {LAYER: base.marker}})
    yield base.case(f"{base.name}.header.map-only", "header", metadata={"_quantization_metadata": good}, marker_tensor=False)
    yield base.case(f"{base.name}.header.both", "header", metadata={"_quantization_metadata": good})
    other = {"format": "float8_e4m3fn"} if base.marker["format"] != "float8_e4m3fn" else {"format": "int8_tensorwise"}
    conflict = json.dumps({"format_version": "1.0", "layers": {LAYER: other}})
    # the map's format makes ComfyUI cast the weight by value: whether that keeps it, the values tell
    yield base.case(f"{base.name}.header.conflict", "header", metadata={"_quantization_metadata": conflict}, deep=True)
    case = base.case(
        f"{base.name}.header.conflict-map-only",
        "header",
        metadata={"_quantization_metadata": conflict},
        marker_tensor=False,
        deep=True,
    )
    case.undecidable = "rotation-flag" if base.marker.get("convrot") and base.marker["format"] == "int8_tensorwise" else None
    yield case
    malformed = (
        "not json",
        json.dumps([1, 2]),
        json.dumps({"layers": [LAYER]}),
        json.dumps({"layers": {LAYER: "float8_e4m3fn"}}),
        json.dumps({"layers": {LAYER: [base.marker]}}),
        json.dumps({"format_version": "1.0"}),
        json.dumps({"layers": None}),
        json.dumps({"layers": {}}),
        json.dumps({"layers": {"blocks.9.other": base.marker}}),
    )
    for i, text in enumerate(malformed):
        yield base.case(f"{base.name}.header.malformed{i}", "header", metadata={"_quantization_metadata": text})


def _fill(t: torch.Tensor, value: float, everywhere: bool) -> torch.Tensor:
    out = t.clone()
    if out.dtype == torch.float8_e8m0fnu:
        raw = out.view(torch.uint8)
        byte = {0.0: 0, -1.0: 0, math.inf: 255, -math.inf: 255}.get(value, 255 if value != value else 0)
        if everywhere:
            raw.fill_(byte)
        else:
            raw.reshape(-1)[0] = byte
        return out
    cell = torch.tensor(value, dtype=torch.float32).to(out.dtype)
    if everywhere or out.dim() == 0:
        out.copy_(cell.expand_as(out))
    else:
        out.reshape(-1)[0] = cell
    return out


VALUES = {"zero": 0.0, "negative": -1.0, "nan": math.nan, "inf": math.inf, "subnormal": 1e-40}
SCALES = ("weight_scale", "weight_scale_2", "input_scale", "weight_s_rel", "weight_s_channel", "pre_quant_scale")


def value_cases(base: _Base) -> Iterator[Case]:
    for suffix in SCALES:
        t = base.tensors.get(suffix)
        if t is None:
            continue
        for tag, value in VALUES.items():
            for everywhere in (True, False) if t.dim() else (True,):
                tensors = dict(base.tensors)
                if tag == "negative" and t.dtype in FLOAT_DTYPES:
                    tensors[suffix] = -t if everywhere else _fill(t, -float(t.reshape(-1)[0].float().abs()), False)
                else:
                    tensors[suffix] = _fill(t, value, everywhere)
                where = "all" if everywhere else "one"
                yield base.case(f"{base.name}.{suffix}.value-{tag}-{where}", "value", tensors, deep=True)


def cast_weight_cases(base: _Base) -> Iterator[Case]:
    """The dense BF16 weight cast by value into the format's weight dtype with a scale of 1."""
    w = base.tensors["weight"]
    if w.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8) or w.shape != base.dense.shape:
        return
    tensors = dict(base.tensors)
    tensors["weight"] = _cast(base.dense.to(torch.bfloat16), w.dtype)
    scale = tensors.get("weight_scale")
    if scale is not None and scale.dtype == torch.float32:
        tensors["weight_scale"] = torch.ones_like(scale)
    case = base.case(f"{base.name}.weight.value-cast", "value", tensors, deep=True)
    case.undecidable = "values-not-the-source"  # codes x scales are a valid weight, not the dense one
    yield case


def legacy_cases(seed: int) -> Iterator[Case]:
    """ComfyUI's scaled-FP8 layout: ``scaled_fp8`` marker tensor, ``scale_weight``/``scale_input``."""
    from comfy_kitchen.tensor import QuantizedTensor

    n, k = 64, 256
    gen = torch.Generator().manual_seed(seed + 7)
    dense = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    bias = (torch.randn(n, generator=gen) * 0.01).to(torch.bfloat16)
    q = QuantizedTensor.from_float(dense, "TensorCoreFP8Layout")
    sd = q.state_dict("weight")
    weight, scale = sd["weight"], sd["weight_scale"].float().reshape(())

    def case(cid, marker=None, scale_weight=scale, scale_input=None, w=weight, extra=None):
        t = {f"{LAYER}.weight": w, f"{LAYER}.bias": bias}
        if marker is not None:
            t["scaled_fp8"] = marker
        if scale_weight is not None:
            t[f"{LAYER}.scale_weight"] = scale_weight
        if scale_input is not None:
            t[f"{LAYER}.scale_input"] = scale_input
        t.update(extra or {})
        return Case(f"legacy.{cid}", "legacy", t, None, {LAYER: (dense.float(), bias)})

    e4 = torch.empty(0, dtype=torch.float8_e4m3fn)
    yield case("ok", marker=e4)
    yield case("marker-2", marker=torch.zeros(2, dtype=torch.float8_e4m3fn))
    yield case("marker-f32", marker=torch.tensor(0.0))
    yield case("marker-e5m2", marker=torch.empty(0, dtype=torch.float8_e5m2))
    yield case("scale-input-1", marker=e4, scale_input=torch.tensor(1.0))
    yield case("scale-input-0.5", marker=e4, scale_input=torch.tensor(0.5))
    yield case("scale-input-vector", marker=e4, scale_input=torch.ones(2))
    yield case("no-scale-weight", marker=e4, scale_weight=None)
    yield case("scale-weight-vector", marker=e4, scale_weight=scale.reshape(1).expand(n).contiguous())
    yield case("scale-weight-bf16", marker=e4, scale_weight=scale.to(torch.bfloat16))
    yield case("no-marker", marker=None)
    # the weight's values decide what ComfyUI's value cast to E4M3 makes of it (--deep)
    for cid, w in (("weight-bf16", dense), ("weight-e5m2", weight.float().to(torch.float8_e5m2))):
        c = case(cid, marker=e4, w=w)
        c.deep = True
        yield c


# -- damaged containers -----------------------------------------------------------------------


def _header_len(data: bytes) -> int:
    return struct.unpack("<Q", data[:8])[0]


def _with_header(data: bytes, header: bytes) -> bytes:
    body = data[8 + _header_len(data) :]
    return struct.pack("<Q", len(header)) + header + body


def _edit_header(edit: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        header = json.loads(data[8 : 8 + _header_len(data)])
        edit(header)
        return _with_header(data, json.dumps(header).encode())

    return damage


def _overlap(header: dict) -> None:
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    a, b = header[names[0]], header[names[1]]
    b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + (b["data_offsets"][1] - b["data_offsets"][0])]


def _short(header: dict) -> None:
    name = max(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0]
    )
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end - 1]


def _beyond(header: dict) -> None:
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end + 64]


def _bad_dtype(header: dict) -> None:
    name = next(k for k in header if k.endswith(".weight"))
    header[name]["dtype"] = "F7"


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "truncated-half": lambda d: d[: len(d) // 2],
    "truncated-1": lambda d: d[:-1],
    "truncated-header": lambda d: d[: 8 + _header_len(d) // 2],
    "only-length": lambda d: d[:8],
    "empty": lambda d: b"",
    "header-length-huge": lambda d: struct.pack("<Q", 1 << 40) + d[8:],
    "header-length-short": lambda d: struct.pack("<Q", _header_len(d) - 5) + d[8:],
    "header-length-long": lambda d: struct.pack("<Q", _header_len(d) + 5) + d[8:],
    "header-not-json": lambda d: _with_header(d, b"{not json" + b" " * 8),
    "header-list": lambda d: _with_header(d, b"[1, 2, 3]"),
    "overlapping": _edit_header(_overlap),
    "short-offsets": _edit_header(_short),
    "offsets-beyond-end": _edit_header(_beyond),
    "unknown-dtype": _edit_header(_bad_dtype),
    "trailing-bytes": lambda d: d + b"\0" * 16,
}


def container_cases(base: _Base) -> Iterator[Case]:
    for tag, damage in DAMAGES.items():
        case = base.case(f"{base.name}.container.{tag}", "container")
        case.damage = damage
        yield case


GROUPS = ("valid", "slot", "marker", "header", "legacy", "value", "container")

# -- the space --------------------------------------------------------------------------------


def bases(seed: int = 0, shapes: dict[str, tuple[tuple[int, int], ...]] | None = None) -> list[_Base]:
    """The valid layers every defect starts from (``shapes``: the geometries, ``VARIANTS`` by
    default)."""
    out = []
    for i, (variant, sizes) in enumerate((shapes or VARIANTS).items()):
        for j, (n, k) in enumerate(sizes):
            base = _base(variant, n, k, seed * 1000 + i * 10 + j)
            out.append(base)
            if variant.startswith("w4a8") and j == 0:
                out.append(_w4a8_correction(base))
    out.append(_awq(64, 256, seed * 1000 + 900) if shapes is None else _awq(32, 512, seed * 1000 + 900, group=128))
    return out


def generate(seed: int = 0, shapes: dict[str, tuple[tuple[int, int], ...]] | None = None, checkpoint: bool = False) -> list[Case]:
    """Every case of the space, in a fixed order (not yet written); ``checkpoint``: each one
    as a layer of a whole checkpoint (``in_checkpoint``; damaged containers, whose damage
    names the layer's tensors, are left out)."""
    if checkpoint:
        return [in_checkpoint(c, seed) for c in generate(seed, shapes) if c.group != "container"]
    rng = random.Random(seed)
    out: list[Case] = []
    all_bases = bases(seed, shapes)
    for index, base in enumerate(all_bases):
        out.append(base.case(f"{base.name}.valid", "valid"))
        out.extend(slot_cases(base))
        out.extend(marker_cases(base))
        out.extend(header_cases(base))
        out.extend(value_cases(base))
        out.extend(cast_weight_cases(base))
        if index % 4 == rng.randrange(4) or base.name.startswith("fp8_64"):
            out.extend(container_cases(base))
    out.extend(legacy_cases(seed))
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):
        raise AssertionError("case ids must be unique")
    return out


def cases(folder: Path, seed: int = 0, select: Callable[[Case], bool] | None = None) -> Iterator[Case]:
    """Write each case (selected by ``select``) into ``folder`` and yield it."""
    for case in generate(seed):
        if select is None or select(case):
            case.write(folder)
            yield case
