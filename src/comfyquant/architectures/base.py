"""The vocabulary of an architecture description: parameters, the model they make up, and a
detection result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Param(NamedTuple):
    """One tensor the model registers: ``name`` relative to the model, its ``shape``.  ``linear``
    names the ``Linear`` module it belongs to (weight or bias), None for other modules'
    parameters (norms, convolutions, modulation tables).  ``aliases``: other names a file may
    store it under that ComfyUI renames to ``name`` before loading (Flux's ``*_norm.scale``
    becomes ``*_norm.weight``).  A tuple: a model has thousands of them."""

    name: str
    shape: tuple[int, ...]
    linear: str | None = None
    aliases: tuple[str, ...] = ()


class Linear(NamedTuple):
    """A ``Linear`` the model builds: its true input and output sizes and whether it has a bias."""

    name: str
    k: int
    n: int
    bias: bool


@dataclass
class Model:
    """What ComfyUI builds for one detected configuration."""

    params: list[Param]
    """Every parameter, in the order ``load_state_dict`` visits them (module registration order,
    a module's own parameters before its children's)."""
    linears: dict[str, Linear]
    """Every ``Linear`` by name, in registration order."""
    execution: list[str]
    """The ``Linear`` modules in the order the first forward runs them."""
    external: frozenset[str] = frozenset()
    """The ``Linear`` modules the model's inputs feed (latents, text embeddings): their input
    has the data's width, which is the one the file records, whatever size detection built."""

    def registration_index(self) -> dict[str, int]:
        """Each module's place in the order ``load_state_dict`` visits it (that of its first
        parameter: a module's own parameters come before its children's)."""
        out: dict[str, int] = {}
        for i, p in enumerate(self.params):
            out.setdefault(p.name.rsplit(".", 1)[0], i)
        return out

    def execution_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.execution)}


@dataclass
class Detected:
    """ComfyUI's detection of one checkpoint."""

    name: str
    """The architecture (ComfyUI's ``image_model``, with the model class it matched)."""
    model_class: str | None
    """ComfyUI's ``supported_models`` class, None when no class matches the configuration."""
    dims: dict[str, object]
    """The dimensions detection derived, by ComfyUI's config names."""
    prefix: str
    """The prefix ComfyUI stripped from the keys ("" for none)."""
    read: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The keys detection read a size from (as stored, with their shapes)."""
    model: Model | None = None
    """What ComfyUI builds, when the architecture is described here (None: only named)."""
    dropped_correction: str = "degraded"
    """The model's output when its W4A8 layers lose their correction: "garbage" or "degraded"."""

    def summary(self) -> str:
        dims = ", ".join(f"{k} {v}" for k, v in self.dims.items())
        where = f", prefix {self.prefix!r}" if self.prefix else ""
        return f"{self.name} ({dims}{where})"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "model_class": self.model_class,
            "dims": dict(self.dims),
            "prefix": self.prefix,
            "read": {k: list(v) for k, v in self.read.items()},
            "modelled": self.model is not None,
        }


class Builder:
    """Collects parameters in registration order (a small helper for the architecture modules)."""

    def __init__(self) -> None:
        self.params: list[Param] = []
        self.linears: dict[str, Linear] = {}

    def linear(self, name: str, k: int, n: int, bias: bool = True) -> None:
        self.linears[name] = Linear(name, k, n, bias)
        self.params.append(Param(f"{name}.weight", (n, k), name))
        if bias:
            self.params.append(Param(f"{name}.bias", (n,), name))

    def param(self, name: str, shape: tuple[int, ...], aliases: tuple[str, ...] = ()) -> None:
        self.params.append(Param(name, shape, None, aliases))

    def norm(self, name: str, dim: int, bias: bool = False, aliases: tuple[str, ...] = ()) -> None:
        self.param(f"{name}.weight", (dim,), aliases)
        if bias:
            self.param(f"{name}.bias", (dim,))

    def model(self, execution: list[str], external: tuple[str, ...] = ()) -> Model:
        return Model(self.params, self.linears, execution, frozenset(n for n in external if n in self.linears))


def count_blocks(keys, prefix: str) -> int:
    """ComfyUI's ``count_blocks``: how many consecutive blocks ``prefix{i}.`` from 0 have a key."""
    cut = len(prefix)
    starts = {key[cut : key.find(".", cut)] for key in keys if key.startswith(prefix) and key.find(".", cut) > 0}
    n = 0
    while str(n) in starts:
        n += 1
    return n


def any_suffix(keys, main: str, suffixes=("weight", "scale")) -> bool:
    return any(f"{main}{s}" in keys for s in suffixes)
