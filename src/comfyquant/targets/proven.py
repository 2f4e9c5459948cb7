"""The runtime versions each profile's verdicts are proven for: the one home of these facts.

A profile is proven for a version when the real runtime, driven on the generated defect space
(``tools/prove_verdicts.py``, which ``.ci/run`` runs through the agreement tests), does what the
profile predicts on every case: loads, fails with the same exception and message, or computes
garbage. ``check`` names these versions in its text and ``--json``; re-proving for another
version is running that script against it and reading the disagreements (docs/runtimes.md).
"""

from __future__ import annotations


class Runtime:
    """One runtime release: its name, version and, for a source checkout, the commit."""

    __slots__ = ("name", "version", "commit")

    def __init__(self, name: str, version: str, commit: str | None = None) -> None:
        self.name = name
        self.version = version
        self.commit = commit

    def __str__(self) -> str:
        return f"{self.name} {self.version}" + (f" at {self.commit}" if self.commit else "")

    def to_dict(self) -> dict:
        return {"runtime": self.name, "version": self.version, "commit": self.commit}


SGLANG = Runtime("SGLang", "0.5.23")
COMFYUI = Runtime("ComfyUI", "0.33.0", "783545f")
KITCHEN = Runtime("comfy-kitchen", "0.2.40")
KITCHEN_PINNED = Runtime("comfy-kitchen", "0.2.31")
"""The comfy-kitchen ComfyUI 0.33.0's requirements pin: its default verdict's."""

PROVEN: dict[str, tuple[Runtime, ...]] = {
    "sglang": (SGLANG,),
    "comfyui": (COMFYUI, KITCHEN_PINNED, KITCHEN),
    "comfy-kitchen": (KITCHEN,),
}
"""Per target, the runtimes its verdicts were proven against: ComfyUI runs its layers on
comfy-kitchen, so its verdict is proven with the comfy-kitchen it pins and with 0.2.40 (the
line that says where 0.2.40 decides otherwise)."""

MODELLED: dict[str, tuple[frozenset[str], str]] = {
    "sglang": (
        frozenset({"sglang.B1", "sglang.B2", "sglang.B3", "sglang.B4", "sglang.B5", "sglang.B6", "sglang.incomplete"}),
        "modelled from SGLang's source: building the layer and loading its weights",
    ),
}
"""Per target, the rules its verdicts state without having been run, and what they model. SGLang's
own ``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization`` are run when its
verdicts are proven; the checks it makes when it builds each layer, and its weight loading, are
read from its source."""


def modelled(target: str, rule: str | None) -> str | None:
    """What a verdict decided by ``rule`` models (None when the rule is proven by running)."""
    rules, what = MODELLED.get(target, (frozenset(), ""))
    return what if rule in rules else None


def proven_text(target: str) -> str:
    """``ComfyUI 0.33.0 at 783545f with comfy-kitchen 0.2.31 and 0.2.40``: the versions of one
    target (a runtime, then the libraries it runs on)."""
    first, *rest = PROVEN[target]
    if not rest:
        return str(first)
    names = [str(rest[0])] + [r.version if r.name == rest[0].name else str(r) for r in rest[1:]]
    return f"{first} with {' and '.join(names)}"
