"""Generated user models and checkpoints for fuzzing ``comfyquant.torch.load_quantized``.

A *pool* of small checkpoints is written once (comfy-kitchen's own tiny layers, dense norms,
damaged markers, tensors stored in the wrong kind of dtype, names that collide after
``strip_prefix``).  Each execution draws one of them and a random model for it: plain
``nn.Linear`` layers, ``Linear`` subclasses holding an extra parameter, a ``weight_scale`` buffer
of their own or a submodule, modules of the wrong kind or shape, missing and extra modules,
forward hooks, a module registered under two names, a weight tied to another module, meta
or real tensors, train or eval mode -- then loads with random ``strict``, ``strip_prefix`` and
``dtype`` and judges the outcome (``judge``):

* success: the report matches what was done -- every quantized layer is a ``QuantLinear``
  holding the file's bytes, every loaded dense tensor holds the file's bytes (cast when asked)
  at its model name, every other parameter, buffer and module is the very object it was with
  its value, every file tensor is loaded or unexpected (never both), hooks moved are reported;
  a strict load reports nothing missing or unexpected;
* refusal: one ``InputError`` line naming the file and a layer or tensor, and the model
  exactly as it was (same module, parameter and buffer objects, values, modes and hooks);
* anything else (another exception, a refusal of a clean case, a success where the model
  holds a tensor the file did not give it) is a finding.

Used by ``tests/test_torch_load_all_or_nothing.py`` (bounded, through hypothesis) and by
``tools/fuzz_load_quantized.py`` (many executions).
"""

from __future__ import annotations

import json
import os
import random
import traceback
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file
from torch import nn

from comfyquant.errors import InputError
from comfyquant.torch import QuantLinear, load_quantized
from kitchen_fixtures import make_layer, write_layers

PREFIX = "model.diffusion_model."
K = 256
VARIANTS = ("fp8", "int8_rowwise", "int8_convrot", "w4a8_codebook", "nvfp4", "mxfp8", "w4a4")
N = {"fp8": 32, "int8_rowwise": 48, "int8_convrot": 32, "w4a8_codebook": 64, "nvfp4": 32, "mxfp8": 64, "w4a4": 32}
BAD_VALUES = ([16], {"a": 1}, None, "16", 1.5, 7, True)


# -- the checkpoint pool ------------------------------------------------------------------------


@dataclass
class FileSpec:
    path: str
    prefixed: bool
    layers: dict[str, str]
    """Model name -> variant of each quantized layer."""
    dense: dict[str, tuple[int, ...]]
    """Model name -> shape of each dense tensor."""
    damaged: str | None = None
    """A marker field of the wrong type (the load must be refused)."""
    wrong_kind: str | None = None
    """A dense tensor stored as integers where the model has floats."""
    collisions: list[str] = field(default_factory=list)
    """Unprefixed tensors that strip_prefix maps onto a prefixed one's model name."""
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _file(folder: str, index: int, rng: random.Random) -> FileSpec:
    prefixed = rng.random() < 0.5
    pre = PREFIX if prefixed else ""
    names = ["blocks.0.fc", "blocks.1.fc", "head"]
    count = rng.randint(1, 3)
    layers = {names[i]: rng.choice(VARIANTS) for i in range(count)}
    dense = {"norm.weight": (K,), "norm.bias": (K,)}
    made = []
    for i, (name, variant) in enumerate(layers.items()):
        layer = make_layer(
            variant, prefix=pre + name, n=N[variant], k=K, marker="comfyui", seed=index * 7 + i, bias=rng.random() < 0.8
        )
        made.append(layer)
    spec = FileSpec("", prefixed, layers, dense)
    if rng.random() < 0.15:  # a marker field of the wrong JSON type
        j = rng.randrange(len(made))
        keys = ["format"] + [k for k in made[j].marker if k != "format"] + ["full_precision_matrix_mult"]
        key, bad = rng.choice(keys), rng.choice(BAD_VALUES)
        if key == "full_precision_matrix_mult" and isinstance(bad, bool):
            bad = 1
        if key == "convrot" and isinstance(bad, bool):
            bad = 1
        made[j] = made[j].with_marker(dict(made[j].marker, **{key: bad}))
        spec.damaged = f"{made[j].prefix}: {key}={bad!r}"
    marker_mode = rng.choice(["tensor", "header", "both"])
    path = os.path.join(folder, f"pool{index}.safetensors")
    write_layers(path, made, marker_mode=marker_mode)
    sd = load_file(path)
    gen = torch.Generator().manual_seed(index)
    sd[pre + "norm.weight"] = torch.randn(K, generator=gen)
    sd[pre + "norm.bias"] = torch.randn(K, generator=gen)
    if rng.random() < 0.1:
        sd[pre + "norm.weight"] = torch.arange(K, dtype=torch.int32)
        spec.wrong_kind = "norm.weight"
    if rng.random() < 0.2:
        sd[pre + "stray.weight"] = torch.zeros(3)
    if prefixed and rng.random() < 0.2:  # collides after strip_prefix
        name = rng.choice(list(layers))
        suffix = rng.choice(["weight_scale", "bias", "weight"])
        sd[f"{name}.{suffix}"] = torch.full((N[layers[name]],) if suffix == "bias" else (), 1000.0)
        spec.collisions.append(f"{name}.{suffix}")
    if prefixed and rng.random() < 0.1:
        sd["norm.bias"] = torch.ones(K)
        spec.collisions.append("norm.bias")
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(header_len)).get("__metadata__")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, path, metadata=meta)
    spec.path = path
    spec.tensors = load_file(path)
    return spec


def build_pool(folder: str, count: int = 40, seed: int = 0) -> list[FileSpec]:
    rng = random.Random(seed)
    return [_file(folder, i, rng) for i in range(count)]


# -- the generated models -------------------------------------------------------------------------


class Node(nn.Module):
    """A container; children are added by name."""


class GatedLinear(nn.Linear):
    """A Linear subclass with an extra parameter of its own."""

    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__(k, n, bias=bias)
        self.gate = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return super().forward(x) * self.gate


class OwnFP8Linear(nn.Linear):
    """An FP8-style Linear with a ``weight_scale`` buffer of its own (a quantized slot's name)."""

    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__(k, n, bias=bias)
        self.register_buffer("weight_scale", torch.tensor(1000.0))


class LoraLinear(nn.Linear):
    """A Linear with a child module."""

    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__(k, n, bias=bias)
        self.lora_down = nn.Linear(k, 4, bias=False)


class PlainSubclass(nn.Linear):
    """A Linear subclass that holds nothing more (its class is replaced by the load)."""

    def forward(self, x):
        return super().forward(x)


class StatefulLinear(nn.Linear):
    """A Linear with extra state in its state dict (``get_extra_state``)."""

    def get_extra_state(self):
        return {"calibrated": True}

    def set_extra_state(self, state) -> None:
        pass


REFUSING_KINDS = {"gated", "own_fp8", "lora", "wrong_shape", "non_linear", "extra_state", "tensor_attr", "forward_attr"}
KINDS = ["plain"] * 40 + ["subclass", "hooked", "hooked", "shared", "tied", "absent", "no_bias"] + sorted(REFUSING_KINDS)


@dataclass
class Case:
    spec: FileSpec
    model: nn.Module
    strict: bool
    strip_prefix: str | None
    dtype: torch.dtype | None
    must_refuse: list[str]
    clean: bool
    hooks: list = field(default_factory=list)


def _linear(kind: str, n: int, bias: bool) -> nn.Module:
    if kind == "gated":
        return GatedLinear(K, n, bias)
    if kind == "own_fp8":
        return OwnFP8Linear(K, n, bias)
    if kind == "lora":
        return LoraLinear(K, n, bias)
    if kind == "subclass":
        return PlainSubclass(K, n, bias=bias)
    if kind == "extra_state":
        return StatefulLinear(K, n, bias=bias)
    if kind == "tensor_attr":
        m = nn.Linear(K, n, bias=bias)
        m.cache = torch.zeros(2)
        return m
    if kind == "forward_attr":
        m = nn.Linear(K, n, bias=bias)
        m.forward = m.forward
        return m
    if kind == "wrong_shape":
        return nn.Linear(K, n * 2, bias=bias)
    if kind == "non_linear":
        return nn.LayerNorm(K)
    return nn.Linear(K, n, bias=bias and kind != "no_bias")


def _put(root: nn.Module, name: str, module: nn.Module) -> None:
    parts = name.split(".")
    node = root
    for p in parts[:-1]:
        if p not in node._modules:
            node.add_module(p, Node())
        node = node._modules[p]
    node.add_module(parts[-1], module)


def make_case(pool: list[FileSpec], rng: random.Random) -> Case:
    spec = rng.choice(pool)
    meta = rng.random() < 0.5
    root = Node()
    must_refuse: list[str] = []
    clean = spec.damaged is None and spec.wrong_kind is None and not spec.collisions
    if spec.damaged:
        must_refuse.append(f"damaged marker {spec.damaged}")
    hooks: list = []
    missing_expected = False
    with torch.device("meta" if meta else "cpu"):
        for name, variant in spec.layers.items():
            kind = rng.choice(KINDS)
            n = N[variant]
            if kind == "absent":
                clean = clean and False
                continue
            has_bias = f"{PREFIX if spec.prefixed else ''}{name}.bias" in spec.tensors
            module = _linear(kind, n, has_bias if rng.random() < 0.9 else not has_bias)
            if kind in REFUSING_KINDS:
                must_refuse.append(f"{name} is {kind}")
                clean = False
            if kind == "no_bias" or (isinstance(module, nn.Linear) and (module.bias is not None) != has_bias):
                clean = False
            _put(root, name, module)
            if kind == "hooked":
                hooks.append(module.register_forward_hook(lambda m, i, o: None))
            elif kind == "shared":
                _put(root, "alias." + name.replace(".", "_"), module)
                missing_expected = True
            elif kind == "tied":
                other = nn.Linear(K, n)
                other.weight = module.weight
                _put(root, "tie." + name.replace(".", "_"), other)
                missing_expected = True
        norm_kind = rng.choice(["plain"] * 6 + ["absent", "wrong_shape", "extra"])
        if norm_kind == "plain":
            _put(root, "norm", nn.LayerNorm(K))
        elif norm_kind == "wrong_shape":
            _put(root, "norm", nn.LayerNorm(K // 2))
            must_refuse.append("norm is the wrong shape")
            clean = False
        elif norm_kind == "extra":
            _put(root, "norm", nn.LayerNorm(K))
            _put(root, "extra", nn.Linear(4, 4))
            missing_expected = True
        else:
            clean = False
    if spec.wrong_kind and norm_kind in ("plain", "extra"):
        must_refuse.append("norm.weight stored as integers")
    if "stray.weight" in {k.removeprefix(PREFIX) for k in spec.tensors}:
        clean = False
    if rng.random() < 0.3:
        root.eval()
    strict = rng.random() < 0.3
    if spec.prefixed:
        strip = PREFIX if rng.random() < 0.9 else "model."
    else:
        strip = None if rng.random() < 0.8 else PREFIX
    if strip == "model.":  # nothing lands: only what refuses regardless of the model still must
        clean = False
        must_refuse = [why for why in must_refuse if why.startswith("damaged marker")]
    if strict and missing_expected:
        clean = False
    dtype = rng.choice([None, None, torch.bfloat16, torch.float16])
    return Case(spec, root, strict, strip, dtype, must_refuse, clean, hooks)


# -- judging one load ----------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(_bits(a), _bits(b))


def snapshot(model: nn.Module) -> dict:
    mods = {}
    for name, m in model.named_modules(remove_duplicate=False):
        hooks = {k: (id(v), dict(v) if isinstance(v, dict) else v) for k, v in vars(m).items() if "hook" in k}
        mods[name] = (m, m.training, hooks)
    tensors = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        tensors[name] = (t, None if t.is_meta else t.detach().clone(), t.requires_grad)
    return {"modules": mods, "tensors": tensors}


def unchanged(before: dict, model: nn.Module) -> list[str]:
    after = snapshot(model)
    problems = []
    if set(before["modules"]) != set(after["modules"]):
        problems.append(f"module names changed: {sorted(set(before['modules']) ^ set(after['modules']))}")
    for name, (m, training, hooks) in before["modules"].items():
        got = after["modules"].get(name)
        if got is None:
            continue
        if got[0] is not m:
            problems.append(f"module {name!r} replaced")
        if got[1] != training:
            problems.append(f"module {name!r} training mode changed")
        if {k: v[0] for k, v in got[2].items()} != {k: v[0] for k, v in hooks.items()} or got[2] != hooks:
            problems.append(f"module {name!r} hooks changed")
    if set(before["tensors"]) != set(after["tensors"]):
        problems.append(f"tensor names changed: {sorted(set(before['tensors']) ^ set(after['tensors']))}")
    for name, (t, value, _grad) in before["tensors"].items():
        got = after["tensors"].get(name)
        if got is None:
            continue
        if got[0] is not t:
            problems.append(f"tensor {name!r} replaced")
        elif value is not None and not same_bits(got[0], value):
            problems.append(f"tensor {name!r} changed value")
    return problems


def _expected(file_tensor: torch.Tensor, dtype) -> torch.Tensor:
    if dtype is not None and file_tensor.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return file_tensor.to(dtype)
    return file_tensor


def _names(case: Case, before: dict) -> set[str]:
    """What a refusal may name: the file's tensors and layers, the model's modules and tensors."""
    names = {n for n in before["modules"] if n} | set(before["tensors"])
    for k in case.spec.tensors:
        names |= {k, k.rpartition(".")[0]}
    return {n for n in names if n}


def judge(case: Case) -> tuple[str, list[str]]:
    """("ok" | "refused", findings) of loading ``case``."""
    before = snapshot(case.model)
    spec = case.spec
    try:
        report = load_quantized(case.model, spec.path, strict=case.strict, strip_prefix=case.strip_prefix, dtype=case.dtype)
    except InputError as exc:
        text = str(exc)
        problems = [f"refusal changed the model: {p}" for p in unchanged(before, case.model)]
        if "\n" in text or spec.path not in text or not any(n in text for n in _names(case, before)):
            problems.append(f"refusal is not one line naming the file and a layer or tensor: {text!r}")
        if case.clean:
            problems.append(f"clean case refused: {text}")
        return "refused", problems
    except Exception:  # noqa: BLE001 -- the finding
        return "crashed", [f"not a clean refusal: {traceback.format_exc(limit=6)}"]
    problems = [f"loaded although it must be refused: {why}" for why in case.must_refuse]
    try:
        problems += _report_matches(case, before, report)
    except Exception:  # noqa: BLE001 -- a loaded layer that cannot run is the finding
        problems.append(f"loaded model fails: {traceback.format_exc(limit=6)}")
    return "ok", problems


def _report_matches(case: Case, before: dict, report) -> list[str]:
    spec, model = case.spec, case.model
    problems = []
    if case.strict and not report.ok:
        problems.append(f"strict load succeeded with missing {report.missing} / unexpected {report.unexpected}")
    loaded, unexpected = set(report.loaded), set(report.unexpected)
    if loaded & unexpected:
        problems.append(f"both loaded and unexpected: {sorted(loaded & unexpected)}")
    if (loaded | unexpected) != set(spec.tensors):
        problems.append(f"file tensors not accounted for: {sorted(set(spec.tensors) ^ (loaded | unexpected))}")

    def strip(n: str) -> str:
        return n[len(case.strip_prefix) :] if case.strip_prefix and n.startswith(case.strip_prefix) else n

    mods_now = dict(model.named_modules(remove_duplicate=False))
    quantized = set(report.quantized)
    file_prefix = {strip(k.rpartition(".")[0]): k.rpartition(".")[0] for k in loaded}
    for name in quantized:
        m = mods_now.get(name)
        if not isinstance(m, QuantLinear):
            problems.append(f"{name!r} reported quantized but is {type(m).__name__}")
            continue
        prefix = file_prefix.get(name)
        for s in m.suffixes:
            ft = spec.tensors.get(f"{prefix}.{s}")
            if ft is None or not same_bits(getattr(m, s), ft):
                problems.append(f"quantized {name!r}.{s} does not hold the file's {prefix}.{s}")
        old = before["modules"][name][0]
        fb = spec.tensors.get(f"{prefix}.bias")
        if f"{prefix}.bias" in loaded:
            if m.bias is None or not same_bits(m.bias, _expected(fb, case.dtype)):
                problems.append(f"quantized {name!r} bias is not the file's")
        elif getattr(old, "bias", None) is not m.bias:
            problems.append(f"quantized {name!r} lost the model's own bias")
        if m.training != old.training:
            problems.append(f"quantized {name!r} training mode not carried over")
        if len(old._forward_hooks) and (m._forward_hooks is not old._forward_hooks or name not in report.carried):
            problems.append(f"quantized {name!r} forward hooks not carried over and reported")
    for name, (m, _t, _h) in before["modules"].items():
        now = mods_now.get(name)
        if name in quantized:
            continue
        if now is not m:
            problems.append(f"module {name!r} replaced without being reported quantized")
    dense_loaded = {strip(k): k for k in loaded if strip(k).rpartition(".")[0] not in quantized}
    tensors_now = dict(model.named_parameters(remove_duplicate=False))
    tensors_now.update(dict(model.named_buffers(remove_duplicate=False)))
    for name, (t, value, _grad) in before["tensors"].items():
        if name.rpartition(".")[0] in quantized:
            continue
        now = tensors_now.get(name)
        if name in dense_loaded:
            ft = _expected(spec.tensors[dense_loaded[name]], case.dtype)
            if now is None or not same_bits(now, ft):
                problems.append(f"{name!r} does not hold the file's {dense_loaded[name]}")
        elif now is not t:
            problems.append(f"{name!r} replaced though the report does not say it was loaded")
        elif value is not None and not same_bits(now, value):
            problems.append(f"{name!r} changed though not loaded")
    for name in report.missing:
        if name in dense_loaded:
            problems.append(f"{name!r} both loaded and missing")
    for name in quantized:  # the layers run (tensors the file gave, on a real device)
        m = mods_now.get(name)
        if isinstance(m, QuantLinear) and not any(t.is_meta for t in (*m.buffers(), *m.parameters())):
            dtype = case.dtype or torch.float32
            y = m(torch.ones(2, m.in_features, dtype=dtype))
            if y.dtype != dtype or tuple(y.shape) != (2, m.out_features):
                problems.append(f"quantized {name!r} gives {y.dtype} {tuple(y.shape)} for {dtype} input")
    return problems


def run(pool: list[FileSpec], rng: random.Random) -> tuple[str, list[str]]:
    case = make_case(pool, rng)
    try:
        return judge(case)
    finally:
        for h in case.hooks:
            h.remove()
