"""What a format package's ``fix`` hooks return (see ``Format``).

Kept apart from the descriptions: only ``fix`` reads these, and a format package's
``repair.py`` builds them from its own description.
"""

from __future__ import annotations

from typing import Any


class Recode:
    """A lossy re-encode of one layer (``fix --allow-lossy``): the layer is decoded with its
    codec and encoded again with ``params`` (the codec's ``encode`` arguments).

    ``writes``: suffix -> (dtype, shape) of every tensor the encode produces, known before
    anything is computed (the writer lays the header out first); ``replaces``: the stored
    suffixes the re-encoded tensors take the place of (the bias, say, is kept); ``marker``: the
    re-encoded layer's marker; ``after``: what the plan line says the layer becomes."""

    __slots__ = ("why", "params", "writes", "replaces", "marker", "after")

    def __init__(
        self,
        why: str,
        params: dict[str, Any],
        writes: dict[str, tuple[str, tuple]],
        replaces: tuple[str, ...],
        marker: dict,
        after: str,
    ) -> None:
        self.why = why
        self.params = params
        self.writes = writes
        self.replaces = replaces
        self.marker = marker
        self.after = after

    def __repr__(self) -> str:
        return f"Recode({self.why!r}, {self.params!r})"
