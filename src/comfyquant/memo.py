"""Per-layer results cached by signature.

A check's result for one layer depends only on its marker and the (suffix, dtype, shape) of
its tensors.  A 14B model has ~600 layers but a few dozen distinct signatures, so every
per-layer rule (canonical and runtime) is computed once per signature.

Each layer is mapped once to a *class id* (its marker's text + tensor signature, interned
across checkpoints); every rule's result is then looked up by ``(rule kind, class id)``.
Cached values are immutable templates; callers bind them to a layer name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

_CLASS_IDS: dict[tuple, int] = {}
_NEXT_ID = itertools.count()
"""Ids never repeat, even after ``clear()``: a live Memo's ids stay unambiguous."""
_RESULTS: dict[tuple[str, int], Any] = {}
_LIMIT = 200_000


class Memo:
    """Per-checkpoint front of the cache: marker texts and class ids are computed once."""

    __slots__ = ("_reprs",)

    def __init__(self) -> None:
        self._reprs: dict[int, str] = {}

    def class_id(self, marker: dict | None, layer) -> int:
        """The class id of (marker, layer): equal ids mean every per-layer rule agrees.

        Cached on the layer (``layer._sid`` holds (marker id, class id)): every rule asks for
        the same layer's class, usually with the same marker object."""
        if layer is not None:
            cached = layer._sid
            if cached is not None and cached[0] == id(marker):
                return cached[1]
            sig = layer.signature
        else:
            sig = ()
        text = self._reprs.get(id(marker))
        if text is None:
            text = self._reprs[id(marker)] = repr(marker)
        key = (text, sig)
        cid = _CLASS_IDS.get(key)
        if cid is None:
            if len(_CLASS_IDS) > _LIMIT:
                clear()
            cid = _CLASS_IDS[key] = next(_NEXT_ID)
        if layer is not None:
            layer._sid = (id(marker), cid)
        return cid

    def get(self, kind: str, marker: dict | None, layer, compute: Callable[[], Any]) -> Any:
        """The result of rule ``kind`` for this layer, computed only for a new class."""
        # The layer's cached class, inline: this runs for every layer under every rule set.
        cached = layer._sid if layer is not None else None
        if cached is not None and cached[0] == id(marker):
            key = (kind, cached[1])
        else:
            key = (kind, self.class_id(marker, layer))
        hit = _RESULTS.get(key, _MISS)
        if hit is _MISS:
            hit = _RESULTS[key] = compute()
        return hit


def clear() -> None:
    """Forget cross-checkpoint results (benchmarks use this to measure cold checks)."""
    _CLASS_IDS.clear()
    _RESULTS.clear()


_MISS = object()
