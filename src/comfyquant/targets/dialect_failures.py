"""Turn a dialect's runtime failures into the violations a runtime's verdict holds.

A dialect package says what each runtime does wrong with its layers as ``RuntimeFailure``
data; the wording a verdict carries (the rule name, whether it blocks, the order) is the
runtime side's, made here once for every dialect.
"""

from __future__ import annotations

from collections.abc import Iterable

from .base import RuntimeFailure, Violation
from .torch_text import broadcast_error


def render(target: str, tag: str, failures: Iterable[RuntimeFailure]) -> list[Violation]:
    """The violations of ``target`` among ``failures``, under the rule ``{target}.{tag}``: the
    file-stage failures first (the runtime cannot open the file, so it stops before any
    layer), then the others in the dialect's order."""
    mine = [f for f in failures if f.target == target]
    ordered = [f for f in mine if f.stage == "file"] + [f for f in mine if f.stage != "file"]
    return [
        Violation(
            f"{target}.{tag}",
            _message(f),
            f.exception,
            f.layer,
            f.tensor,
            f.blocking,
            f.cause,
            f.fix,
            severity=f.severity,
        )
        for f in ordered
    ]


def _message(f: RuntimeFailure) -> str:
    """The failure's message: torch's broadcasting error in torch's words when the failure
    names the shapes the runtime multiplies, else the dialect's own."""
    if f.broadcast is not None:
        return broadcast_error(*f.broadcast) or f.message
    return f.message
