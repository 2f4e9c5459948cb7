"""Shared types for runtime profiles."""

from __future__ import annotations


class Violation:
    """One rule of a runtime that the checkpoint breaks.

    ``blocking`` violations stop the load (the first one is the runtime's error); the others
    are silent losses the runtime does not report (e.g. ComfyUI dropping a correction).
    """

    __slots__ = ("rule", "message", "exception", "layer", "tensor", "blocking", "cause", "fix", "severity")

    def __init__(self, rule: str, message: str, exception: str | None = "ValueError", layer: str | None = None,
                 tensor: str | None = None, blocking: bool = True, cause: str | None = None, fix: str | None = None,
                 severity: str = "") -> None:
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

    def __repr__(self) -> str:
        return f"Violation({self.rule}, {self.message!r}, {self.exception}, {self.layer!r})"


class Verdict:
    __slots__ = ("target", "violations")

    def __init__(self, target: str, violations: list[Violation] | None = None) -> None:
        self.target = target
        self.violations = violations if violations is not None else []

    @property
    def first(self) -> Violation | None:
        for v in self.violations:
            if v.blocking:
                return v
        return None

    @property
    def loads(self) -> bool:
        return self.first is None

    def to_dict(self) -> dict:
        first = self.first
        return {
            "loads": first is None,
            "error": first.message if first else None,
            "exception": first.exception if first else None,
            "rule": first.rule if first else None,
            "layer": first.layer if first else None,
            "warnings": [v.message for v in self.violations if not v.blocking],
        }


LAYER = "\x00layer\x00"
"""Placeholder for the layer name in cached per-layer violation templates."""


def bind(templates: list[Violation], prefix: str) -> list[Violation]:
    """Concrete violations for one layer from cached templates."""
    return [
        Violation(v.rule, v.message.replace(LAYER, prefix), v.exception, prefix, v.tensor, v.blocking, v.cause, v.fix,
                  v.severity)
        for v in templates
    ]


TARGETS = ("sglang", "comfyui", "comfy-kitchen")


def run_target(name: str, ckpt) -> Verdict:
    if name == "sglang":
        from .sglang import sglang_verdict

        return sglang_verdict(ckpt)
    if name == "comfyui":
        from .comfyui import comfyui_verdict

        return comfyui_verdict(ckpt)
    if name == "comfy-kitchen":
        from .kitchen import kitchen_verdict

        return kitchen_verdict(ckpt)
    raise ValueError(f"unknown target {name!r}: choose from {', '.join(TARGETS)}")
