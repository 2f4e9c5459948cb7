"""A generated space of SGLang rowwise FP8 files (``rowwise-float8_e4m3fn``), valid and defective,
deterministic from a seed: the single-layer agreement space of SGLang's rowwise reader.

Each case is one small safetensors file holding the quantized layer ``cases.LAYER`` (written by
comfyquant's rowwise FP8 encoder from a seeded dense weight) and a dense ``bf16`` companion layer
``OTHER``, under the header map SGLang 0.5.23 reads (``format_version`` "1.1", ``layers`` and
``quant_configs``). Defect classes (``GROUPS``):

* ``valid``: as written, with and without a static ``input_scale``, entries as strings or as
  ``{"format": ...}`` objects, with a bias;
* ``map``: ``format_version`` missing, other strings, numbers, lists; ``layers`` missing, empty,
  not an object; a layer value unknown (other formats, case, empty, numbers, null, lists, objects
  without a format); no quantized layer; ``quant_configs`` missing, not an object, its entry
  missing or not an object, ``scale_recipe`` missing or another value;
* ``slot``: weight / weight_scale missing, cast to each wrong dtype, reshaped (1-D, 3-D,
  transposed, one row more or less, [N, 1], scalar); input_scale of each wrong dtype and shape;
* ``stray``: a ``weight_scale`` or ``input_scale`` on the dense layer, or on a layer the map does
  not name;
* ``fuzz``: random combinations of two defects of different classes (seeded).
"""

from __future__ import annotations

import json
import random

import torch

from .cases import LAYER, Case

OTHER = "blocks.0.proj"
SHAPES = ((64, 256), (96, 128))
HELD_OUT = ((48, 192),)
GROUPS = ("valid", "map", "slot", "stray", "fuzz")
FP8 = "rowwise-float8_e4m3fn"
WRONG_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2, torch.uint8, torch.int8)


def _header(layers: dict | None = None, **top) -> dict:
    obj: dict = {"format_version": "1.1", "layers": layers if layers is not None else {LAYER: FP8, OTHER: "bf16"}}
    obj["quant_configs"] = {FP8: {"scale_recipe": "rowwise"}}
    obj.update(top)
    return {k: v for k, v in obj.items() if v is not _DROP}


_DROP = object()


class _Layer:
    def __init__(self, n: int, k: int, seed: int) -> None:
        from comfyquant.formats.rowwise_fp8.codec import CODECS

        g = torch.Generator().manual_seed(seed)
        self.n, self.k = n, k
        self.dense = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).float()
        self.bias = (torch.randn(n, generator=g) * 0.01).to(torch.bfloat16)
        enc = CODECS[FP8].encode(self.dense)
        self.tensors = {"weight": enc["weight"], "weight_scale": enc["weight_scale"]}
        self.other = (torch.randn(k, k, generator=g) * 0.05).to(torch.bfloat16)
        self.name = f"rowwise_{n}x{k}"

    def case(
        self, cid: str, group: str, tensors: dict | None = None, header: dict | None = None, extra: dict | None = None
    ) -> Case:
        t = {f"{LAYER}.{s}": v.contiguous() for s, v in (self.tensors if tensors is None else tensors).items() if v is not None}
        t[f"{OTHER}.weight"] = self.other
        t.update(extra or {})
        meta = {"_quantization_metadata": json.dumps(_header() if header is None else header)}
        dense = {LAYER: (self.dense, None), OTHER: (self.other.float(), None)}
        return Case(f"{self.name}.{cid}", group, t, meta, dense)


def _valid(b: _Layer):
    yield b.case("valid", "valid")
    yield b.case("valid.input_scale", "valid", dict(b.tensors, input_scale=torch.tensor([0.02])))
    yield b.case("valid.objects", "valid", header=_header({LAYER: {"format": FP8}, OTHER: {"format": "bf16"}}))
    yield b.case("valid.bias", "valid", dict(b.tensors, bias=b.bias))
    yield b.case("valid.no_dense", "valid", header=_header({LAYER: FP8}))


VERSIONS = (_DROP, "1.0", "1.2", "", 1.1, 1, None, ["1.1"], {"v": "1.1"})
LAYER_VALUES = ("float8_e4m3fn", "ROWWISE-FLOAT8_E4M3FN", "fp8", "", 0, None, 1.5, ["bf16"], {}, {"fmt": FP8}, {"format": None})
CONFIGS = (
    _DROP,
    None,
    [],
    "rowwise",
    1,
    {},
    {FP8: None},
    {FP8: "rowwise"},
    {FP8: {}},
    {FP8: {"scale_recipe": "tensorwise"}},
    {FP8: {"scale_recipe": None}},
    {FP8: {"scale_recipe": "ROWWISE"}},
    {"other": {"scale_recipe": "rowwise"}},
)


def _map(b: _Layer):
    for i, v in enumerate(VERSIONS):
        yield b.case(f"map.version{i}", "map", header=_header(format_version=v))
    for i, v in enumerate((_DROP, {}, [], "x", None)):
        yield b.case(f"map.layers{i}", "map", header=_header(layers=None) if v is None else _header(**{"layers": v}))
    for i, v in enumerate(LAYER_VALUES):
        yield b.case(f"map.value{i}", "map", header=_header({LAYER: FP8, OTHER: v}))
        yield b.case(f"map.value{i}.fp8", "map", header=_header({LAYER: v, OTHER: "bf16"}))
    yield b.case("map.all_dense", "map", header=_header({LAYER: "bf16", OTHER: "bf16"}))
    for i, v in enumerate(CONFIGS):
        yield b.case(f"map.configs{i}", "map", header=_header(quant_configs=v))
    yield b.case("map.only_configs", "map", header={"format_version": "1.1", "quant_configs": {FP8: {"scale_recipe": "rowwise"}}})


def _shapes(t: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {"flat": t.reshape(-1), "3d": t.reshape(1, *t.shape), "scalar": t.reshape(-1)[:1].reshape(())}
    if t.dim() == 2:
        out["transposed"] = t.t().contiguous()
        out["row_more"] = torch.cat([t, t[:1]])
        out["row_less"] = t[:-1]
    else:
        out["column"] = t.reshape(-1, 1)
        out["more"] = torch.cat([t, t[:1]])
        out["less"] = t[:-1]
    return out


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.float().clamp(-100, 100).to(dtype)


def _slot(b: _Layer):
    for s in ("weight", "weight_scale"):
        yield b.case(f"slot.{s}.missing", "slot", {k: v for k, v in b.tensors.items() if k != s})
        for d in dict.fromkeys(WRONG_DTYPES + (torch.float8_e4m3fn,)):
            if d == b.tensors[s].dtype:
                continue
            yield b.case(f"slot.{s}.{str(d).split('.')[-1]}", "slot", dict(b.tensors, **{s: _cast(b.tensors[s], d)}))
        for name, t in _shapes(b.tensors[s]).items():
            yield b.case(f"slot.{s}.{name}", "slot", dict(b.tensors, **{s: t}))
    one = torch.tensor([0.02])
    for d in (torch.bfloat16, torch.float16, torch.float64):
        yield b.case(f"slot.input_scale.{str(d).split('.')[-1]}", "slot", dict(b.tensors, input_scale=one.to(d)))
    for name, t in (("scalar", one.reshape(())), ("two", torch.tensor([0.02, 0.03])), ("matrix", one.reshape(1, 1))):
        yield b.case(f"slot.input_scale.{name}", "slot", dict(b.tensors, input_scale=t))


def _stray(b: _Layer):
    s, i = torch.ones(b.k), torch.tensor([0.02])
    yield b.case("stray.dense_scale", "stray", extra={f"{OTHER}.weight_scale": s})
    yield b.case("stray.dense_input", "stray", extra={f"{OTHER}.input_scale": i})
    yield b.case("stray.unnamed_scale", "stray", extra={"blocks.1.proj.weight_scale": s})
    yield b.case("stray.unnamed_input", "stray", extra={"blocks.1.proj.input_scale": i})
    yield b.case("stray.bare_input", "stray", extra={"input_scale": i})


def _fuzz(b: _Layer, rng: random.Random, count: int = 24):
    """Two defects of different classes in one file: the reader's first check decides."""
    for j in range(count):
        header = _header(
            format_version=rng.choice(("1.1",) + VERSIONS),
            quant_configs=rng.choice(({FP8: {"scale_recipe": "rowwise"}},) + CONFIGS),
        )
        header["layers"] = {LAYER: rng.choice((FP8, FP8) + LAYER_VALUES), OTHER: rng.choice(("bf16",) + LAYER_VALUES)}
        header = {k: v for k, v in header.items() if v is not _DROP}
        tensors = dict(b.tensors)
        s = rng.choice(("weight", "weight_scale", "input_scale", None))
        if s == "input_scale":
            tensors[s] = rng.choice((torch.tensor([0.02]), torch.tensor(0.02), torch.tensor([0.02], dtype=torch.bfloat16)))
        elif s is not None:
            options = list(_shapes(tensors[s]).values()) + [None, _cast(tensors[s], rng.choice(WRONG_DTYPES))]
            tensors[s] = rng.choice(options)
        extra = {f"{OTHER}.weight_scale": torch.ones(b.k)} if rng.random() < 0.25 else None
        yield b.case(f"fuzz{j}", "fuzz", tensors, header, extra)


def generate(seed: int = 0, shapes: tuple[tuple[int, int], ...] = SHAPES) -> list[Case]:
    """Every case of the space, in a fixed order (not yet written)."""
    rng = random.Random(seed)
    out: list[Case] = []
    for j, (n, k) in enumerate(shapes):
        b = _Layer(n, k, seed * 1000 + 500 + j)
        for part in (_valid(b), _map(b), _slot(b), _stray(b), _fuzz(b, rng)):
            out.extend(part)
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):
        raise AssertionError("case ids must be unique")
    return out
