"""Shared types for runtime profiles."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..findings import Finding


class Violation:
    """One rule of a runtime that the checkpoint breaks.

    ``blocking`` violations stop the load (the first one is the runtime's error); the others
    are silent: a silent error (``severity`` error: garbage output, e.g. ComfyUI casting an
    unmarked INT8 weight by value) makes the verdict FAILS without an exception; a silent loss
    (warning, e.g. ComfyUI dropping a W4A8 correction) leaves it ``loads``.
    """

    __slots__ = (
        "rule",
        "message",
        "exception",
        "layer",
        "tensor",
        "blocking",
        "cause",
        "fix",
        "severity",
        "file",
        "covers",
        "stage",
    )

    def __init__(
        self,
        rule: str,
        message: str,
        exception: str | None = "ValueError",
        layer: str | None = None,
        tensor: str | None = None,
        blocking: bool = True,
        cause: str | None = None,
        fix: str | None = None,
        severity: str = "",
        file: str | None = None,
    ) -> None:
        self.rule = rule
        self.message = message
        self.exception = exception
        self.layer = layer
        self.tensor = tensor
        self.blocking = blocking
        self.cause = cause
        self.fix = fix
        # Severity of the finding this becomes when no canonical finding covers it.
        self.severity = severity or ("error" if blocking else "warning")
        self.file = file
        """Set for a file the runtime cannot open: the canonical container findings of that
        file (C0xx) are what explain it."""
        self.covers: Finding | None = None
        """The canonical finding that explains this violation, when the profile knows it."""
        self.stage: str | None = None
        """``forward`` for what a layer's first forward raises, once the whole model loaded (a
        profile that orders its violations by stage says so; None: reading or loading)."""

    @property
    def fails(self) -> bool:
        """Whether the runtime does not work: it raises (``blocking``), or it runs without an
        error and computes garbage (a silent error: ``severity`` error, no exception)."""
        return self.blocking or self.severity == "error"

    def __repr__(self) -> str:
        return f"Violation({self.rule}, {self.message!r}, {self.exception}, {self.layer!r})"


STAGES = ("file", "load", "forward", "silent")
"""Where a runtime fails: it cannot open the file at all, it raises while loading the weights,
it raises at the first forward, or it runs and computes garbage (or loses data) without an error."""


class RuntimeFailure:
    """What a runtime does wrong with a dialect's layers, as data: the dialect says which
    target, where (``stage``), on which layer and tensor, with which exception and message;
    ``targets.dialect_failures`` makes the ``Violation`` (rule name, blocking) from it.  The
    fields mirror ``Violation``'s, with ``target`` and ``stage`` for its rule and ``blocking``.

    ``broadcast``: the two shapes the runtime multiplies when torch's broadcasting error is what
    it raises; the rendering words that error (``torch_text``), so ``message`` stays empty."""

    __slots__ = ("target", "message", "exception", "layer", "tensor", "stage", "cause", "fix", "severity", "broadcast")

    def __init__(
        self,
        target: str,
        message: str,
        exception: str | None,
        layer: str | None,
        tensor: str | None,
        stage: str,
        cause: str | None = None,
        fix: str | None = None,
        severity: str = "",
        broadcast: tuple[tuple, tuple] | None = None,
    ) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self.broadcast = broadcast
        self.target = target
        self.message = message
        self.exception = exception
        self.layer = layer
        self.tensor = tensor
        self.stage = stage
        self.cause = cause
        self.fix = fix
        self.severity = severity

    @property
    def blocking(self) -> bool:
        """Whether the runtime stops (it raises); a silent failure lets it run."""
        return self.stage != "silent"

    def __repr__(self) -> str:
        return f"RuntimeFailure({self.target}, {self.stage}, {self.message!r}, {self.layer!r})"


class Verdict:
    __slots__ = ("target", "violations", "architecture")

    def __init__(self, target: str, violations: list[Violation] | None = None, architecture: dict | None = None) -> None:
        self.target = target
        self.violations = violations if violations is not None else []
        self.architecture = architecture
        """The whole model the runtime builds from the file, when its profile reads one
        (ComfyUI: ``targets.comfyui_model.WholeModel.describe``)."""

    @property
    def first(self) -> Violation | None:
        """What the runtime fails with: the first error it raises (in its own order), or when it
        raises nothing, the first silent error (it runs and computes garbage; no exception)."""
        silent = None
        for v in self.violations:
            if v.blocking:
                return v
            if silent is None and v.severity == "error":
                silent = v
        return silent

    @property
    def loads(self) -> bool:
        return self.first is None

    def to_dict(self) -> dict:
        return {
            **outcome(self.first),
            "warnings": [v.message for v in self.violations if not v.fails],
            **({"architecture": self.architecture} if self.architecture is not None else {}),
        }


def outcome(first: Violation | None) -> dict:
    """What a verdict whose first failure is ``first`` says in JSON: whether the file loads,
    and the error, exception, rule and layer it fails with."""
    return {
        "loads": first is None,
        "error": first.message if first else None,
        "exception": first.exception if first else None,
        "rule": first.rule if first else None,
        "layer": first.layer if first else None,
    }


LAYER = "\x00layer\x00"
"""Placeholder for the layer name in cached per-layer violation templates."""


def bind(templates: list[Violation], prefix: str) -> list[Violation]:
    """Concrete violations for one layer from cached templates."""
    return [
        Violation(v.rule, v.message.replace(LAYER, prefix), v.exception, prefix, v.tensor, v.blocking, v.cause, v.fix, v.severity)
        for v in templates
    ]


def container_violation(target: str, file: str, message: str, rule: str = "safetensors") -> Violation:
    """The ``SafetensorError`` a runtime raises opening a damaged file (targets/container.py)."""
    from .container import EXCEPTION

    return Violation(
        f"{target}.{rule}",
        message,
        EXCEPTION,
        None,
        None,
        True,
        f"the safetensors library refuses {file} (damaged container)",
        "re-download or rewrite the file; see the container findings",
        file=file,
    )


INCOMPLETE = ("C011", "C014")
"""Checkpoint findings that mean tensors the checkpoint declares are absent (a shard the index
names is missing, or the index lists a tensor no shard holds)."""


def container_violations(target: str, ckpt: Checkpoint) -> list[Violation]:
    """One violation per file safetensors refuses, in the order the runtime opens them."""
    from .container import container_errors

    errors = container_errors(ckpt)
    return [container_violation(target, f, errors[f]) for f in ckpt.files if f in errors] if errors else []


def incomplete_violations(target: str, ckpt: Checkpoint, blocking: bool, consequence: str) -> list[Violation]:
    """One violation per piece of missing data (INCOMPLETE), explained by its finding."""
    out = []
    for f in ckpt.findings:
        if f.code in INCOMPLETE:
            v = Violation(f"{target}.incomplete", f"{f.message}: {consequence}", None, None, None, blocking, f.cause, f.fix)
            v.covers = f
            out.append(v)
    return out


_NUMBERS = re.compile(r"(\d+)")


def module_order(name: str) -> list:
    """A layer's place in a model's module order as far as its name tells: block numbers
    compared as numbers (``blocks.2`` before ``blocks.10``); the model decides the rest.  The
    parts alternate text and number, so two keys compare text with text and number with number."""
    parts: list = _NUMBERS.split(name)
    parts[1::2] = map(int, parts[1::2])
    return parts


_DIGITS_OUT = bytes.maketrans(b"0123456789", b"\0" * 10)
"""Every ASCII digit to NUL: a name's *shape* (its text, and where its digit runs are)."""


def least_in_module_order(names: list[str], key: Callable[[str], Any] = module_order) -> tuple[str, bool]:
    """``min(names, key=key)`` for ``key`` = ``module_order`` (the first listed of equals), and
    whether no other name has its key (then any order of the names gives it), keying only a
    few names: ASCII names of one shape (the same text between digit runs of the same lengths)
    compare in module order as plain strings do, so each shape's least string stands for it,
    and only those are keyed (a model's names have a few dozen shapes)."""
    text = "\n".join(names)
    if len(names) < 8 or not text.isascii() or "\0" in text or text.count("\n") != len(names) - 1:
        found = min(names, key=key)
        return found, False
    best: dict[bytes, int] = {}
    for i, shape in enumerate(text.encode().translate(_DIGITS_OUT).split(b"\n")):
        have = best.get(shape)
        if have is None or names[i] < names[have]:
            best[shape] = i
    ranked = sorted(best.values(), key=lambda i: (key(names[i]), i))  # an equal key is another shape's least
    return names[ranked[0]], len(ranked) < 2 or key(names[ranked[0]]) != key(names[ranked[1]])


def in_module_order(violations: list[Violation]) -> list[Violation]:
    """The violations of one stage (loading, or the first forward) in the order a runtime
    meets their layers, its model's module order; the file's order (a header sorts its tensors
    by dtype) says nothing of it.  Unnamed ones stay first.  Each layer's key is made once."""
    layers = {v.layer for v in violations}
    if len(layers) < 2:
        return violations
    keys = {layer: module_order(layer) for layer in layers if layer}
    return sorted(violations, key=lambda v: keys[v.layer] if v.layer else [])
