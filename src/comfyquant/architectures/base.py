"""The vocabulary of an architecture description: parameters, the model they make up, and a
detection result."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from operator import methodcaller
from typing import Any, NamedTuple


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


class Model:
    """What ComfyUI builds for one detected configuration (a plain class: ``check`` imports no
    ``dataclasses``, a start-up cost)."""

    def __init__(
        self,
        params: list[Param],
        linears: dict[str, Linear],
        execution: list[str],
        external: frozenset[str] = frozenset(),
        modules: dict[str, int] | None = None,
    ) -> None:
        self.params = params
        self.linears = linears
        self.execution = execution
        self.external = external
        self.modules = modules if modules is not None else {}
        self._execution_index: dict[str, int] | None = None
        self._names: frozenset[str] | None = None
        self._plain: list[Param] | None = None

    params: list[Param]
    """Every parameter, in the order ``load_state_dict`` visits them (module registration order,
    a module's own parameters before its children's)."""
    linears: dict[str, Linear]
    """Every ``Linear`` by name, in registration order."""
    execution: list[str]
    """The ``Linear`` modules in the order the first forward runs them."""
    external: frozenset[str]
    """The ``Linear`` modules the model's inputs feed (latents, text embeddings): their input
    has the data's width, which is the one the file records, whatever size detection built."""
    modules: dict[str, int]
    """Each module's place in the order ``load_state_dict`` visits it (that of its first
    parameter: a module's own parameters come before its children's)."""

    def names(self) -> frozenset[str]:
        """Every parameter's name: a file holding them all needs no per-parameter search."""
        if self._names is None:
            self._names = frozenset(p.name for p in self.params)
        return self._names

    def plain(self) -> list[Param]:
        """The parameters outside ``Linear`` layers (norms, convolutions, tables), in order."""
        if self._plain is None:
            self._plain = [p for p in self.params if p.linear is None]
        return self._plain

    def registration_index(self) -> dict[str, int]:
        return self.modules

    def execution_index(self) -> dict[str, int]:
        if self._execution_index is None:
            self._execution_index = {name: i for i, name in enumerate(self.execution)}
        return self._execution_index


class Detected:
    """ComfyUI's detection of one checkpoint."""

    def __init__(
        self,
        name: str,
        model_class: str | None,
        dims: dict[str, object],
        prefix: str,
        read: dict[str, tuple[int, ...]] | None = None,
        model: Model | None = None,
        dropped_correction: str = "degraded",
    ) -> None:
        self.name = name
        self.model_class = model_class
        self.dims = dims
        self.prefix = prefix
        self.read = read if read is not None else {}
        self.model = model
        self.dropped_correction = dropped_correction

    name: str
    """The architecture (ComfyUI's ``image_model``, with the model class it matched)."""
    model_class: str | None
    """ComfyUI's ``supported_models`` class, None when no class matches the configuration."""
    dims: dict[str, object]
    """The dimensions detection derived, by ComfyUI's config names."""
    prefix: str
    """The prefix ComfyUI stripped from the keys ("" for none)."""
    read: dict[str, tuple[int, ...]]
    """The keys detection read a size from (as stored, with their shapes)."""
    model: Model | None
    """What ComfyUI builds, when the architecture is described here (None: only named)."""
    dropped_correction: str
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


class Shapes(Mapping):
    """Name -> shape over a mapping whose values hold the shape at index ``at`` (a header's
    entries: ``(name, dtype, shape, ...)``), read without copying the header.  Its keys are also
    kept as one text (``text``: each full name after a newline), so that whether any key starts
    with a prefix is one substring search, not a pass over thousands of names."""

    __slots__ = ("raw", "at", "under", "_text")

    def __init__(self, raw: Mapping[str, Any], at: int = 2, under: str = "", text: str | None = None) -> None:
        self.raw = raw
        self.at = at
        self.under = under
        """The prefix stripped from the names ``text`` holds whole."""
        self._text = text

    def __getitem__(self, key: str) -> tuple[int, ...]:
        return tuple(self.raw[key][self.at])

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def text(self) -> str:
        if self._text is None:
            self._text = "\n" + "\n".join(self.raw)
        return self._text

    def any_startswith(self, head: str) -> bool:
        return "\n" + self.under + head in self.text()

    def stripped(self, prefix: str) -> Shapes:
        """The keys under ``prefix``, without it."""
        cut = len(prefix)
        raw = {k[cut:]: v for k, v in self.raw.items() if k.startswith(prefix)}
        return Shapes(raw, self.at, self.under + prefix, self.text())


class Builder:
    """Collects parameters in registration order (a small helper for the architecture modules)."""

    def __init__(self) -> None:
        self.params: list[Param] = []
        self.linears: dict[str, Linear] = {}
        self.modules: dict[str, int] = {}

    def linear(self, name: str, k: int, n: int, bias: bool = True) -> None:
        self.linears[name] = Linear(name, k, n, bias)
        self.modules.setdefault(name, len(self.params))
        self.params.append(Param(f"{name}.weight", (n, k), name))
        if bias:
            self.params.append(Param(f"{name}.bias", (n,), name))

    def param(self, name: str, shape: tuple[int, ...], aliases: tuple[str, ...] = ()) -> None:
        self.modules.setdefault(name.rpartition(".")[0], len(self.params))
        self.params.append(Param(name, shape, None, aliases))

    def norm(self, name: str, dim: int, bias: bool = False, aliases: tuple[str, ...] = ()) -> None:
        self.param(f"{name}.weight", (dim,), aliases)
        if bias:
            self.param(f"{name}.bias", (dim,))

    def model(self, execution: list[str], external: tuple[str, ...] = ()) -> Model:
        external_ = frozenset(n for n in external if n in self.linears)
        return Model(self.params, self.linears, execution, external_, self.modules)


def count_blocks(keys, prefix: str, probe: str = "") -> int:
    """ComfyUI's ``count_blocks``: how many consecutive blocks ``prefix{i}.`` from 0 have a key.
    ``probe``: a key every block of the architecture has (``prefix{i}.probe``): when blocks 0 to
    n-1 have it, one pass over the keys tells whether block n has any key (the common case,
    without splitting every key)."""
    if probe and isinstance(keys, Mapping):
        n = 0
        while f"{prefix}{n}.{probe}" in keys:
            n += 1
        head = f"{prefix}{n}."
        if isinstance(keys, Shapes):
            if not keys.any_startswith(head):
                return n
        elif not any(map(methodcaller("startswith", head), keys)):
            return n
    cut = len(prefix)
    starts = {key[cut : key.find(".", cut)] for key in keys if key.startswith(prefix) and key.find(".", cut) > 0}
    n = 0
    while str(n) in starts:
        n += 1
    return n


def any_suffix(keys, main: str, suffixes=("weight", "scale")) -> bool:
    return any(f"{main}{s}" in keys for s in suffixes)
