"""A model's changes made together or not at all.

A load decides every change first (which module object goes into which parent's slot, which
tensor into which module's attribute), with the objects resolved while the model is as the
user built it, then makes them here.  Should any assignment fail, the ones already made are
undone in reverse order, so the model is left with the very objects it had.
"""

from __future__ import annotations

from torch import nn


class Edits:
    """Attribute assignments on modules (``setattr(module, attr, value)``, so ``nn.Module``
    files each value as a parameter, buffer or submodule as it would for the user)."""

    def __init__(self) -> None:
        self._planned: list[tuple[nn.Module, str, object]] = []

    def set(self, module: nn.Module, attr: str, value: object) -> None:
        self._planned.append((module, attr, value))

    def __len__(self) -> int:
        return len(self._planned)

    def apply(self) -> None:
        done: list[tuple[nn.Module, str, object]] = []
        try:
            for module, attr, value in self._planned:
                old = getattr(module, attr)
                setattr(module, attr, value)
                done.append((module, attr, old))
        except BaseException:
            for module, attr, old in reversed(done):
                setattr(module, attr, old)
            raise
