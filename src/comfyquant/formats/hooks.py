"""What a format package's hooks return or hold (see ``Format``): ``fix``'s re-encodes
(``Recode``) and the part of a layer ``check --deep`` measures when a runtime drops it
(``DroppedPart``).

Kept apart from the descriptions: a format package's ``repair.py`` and ``deep.py`` build them
from its own description, and only ``fix`` and the checker's ``--deep`` read them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Readers(NamedTuple):
    """The runtimes a lossy repair is for, as a format's ``lossy`` hook asks about them (worked
    out by ``fix`` from its ``--target`` and the releases it selects)."""

    names: tuple[str, ...]
    """The selected runtimes (``sglang``, ``comfyui``, ``comfy-kitchen``)."""
    four_bit_w4a8: tuple[str, ...] = ()
    """Those whose judged release reads every W4A8 row as 4-bit codes, as they are named in a
    plan line (``SGLang``, ``ComfyUI 0.33.0 with comfy-kitchen 0.2.31``)."""


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


class DroppedPart:
    """A stored part of a layer that ComfyUI's loader leaves out while the other runtimes apply
    it (W4A8's correction), and how ``check --deep`` measures how far that moves the output.

    ``suffix``: the dropped tensor; ``reads``: the suffixes the measurement reads;
    ``wanted(layer)``: whether the layer's tensors let it be measured;
    ``share(np, decode, layer, data, dtype)``: the dropped part's share of the full weight
    (the relative output error) with the part's bytes read as ``dtype``, or None when the
    values cannot be read soundly (numpy and the checker's decoder are handed in: a
    description never imports numpy).  ``expected``, ``cause`` and ``fix``: the format's words
    in the finding."""

    __slots__ = ("suffix", "reads", "wanted", "share", "expected", "cause", "fix")

    def __init__(
        self,
        suffix: str,
        reads: tuple[str, ...],
        wanted: Callable[[Any], bool],
        share: Callable[..., float | None],
        expected: str,
        cause: str,
        fix: str,
    ) -> None:
        self.suffix = suffix
        self.reads = reads
        self.wanted = wanted
        self.share = share
        self.expected = expected
        self.cause = cause
        self.fix = fix

    def __repr__(self) -> str:
        return f"DroppedPart({self.suffix!r})"
