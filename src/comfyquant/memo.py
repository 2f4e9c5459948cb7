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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Protocol

    class Classified(Protocol):
        """What the memo reads and keeps on a layer (``comfyquant.checkpoint.Layer``)."""

        @property
        def signature(self) -> tuple: ...

        class_ids: dict[int, tuple[object, int]] | None


_CLASS_IDS: dict[tuple, int] = {}
_NEXT_ID = itertools.count()
"""Ids never repeat, even after ``clear()``: a live Memo's ids stay unambiguous."""
_RESULTS: dict[tuple[str, int], Any] = {}
_LIMIT = 200_000


class Memo:
    """Per-checkpoint front of the cache: marker texts and class ids are computed once.

    Caches are keyed by the marker object's identity and hold the object itself, so an id is
    never reused by another marker while the cache can still answer for it (a derived marker
    that a profile drops could otherwise hand its address, and its class, to a new one)."""

    __slots__ = ("_reprs",)

    def __init__(self) -> None:
        self._reprs: dict[int, tuple[object, str]] = {}

    def class_id(self, marker: dict | None, layer: Classified | None) -> int:
        """The class id of (marker, layer): equal ids mean every per-layer rule agrees.

        Cached on the layer (``Layer.class_ids``: marker id -> (marker, class id)): the rule sets
        ask for the same layer's class with one to three marker objects (the merged marker,
        and the ones a runtime profile derives from it when header and tensor markers both
        exist), each several times."""
        mid = id(marker)
        if layer is not None:
            cached = layer.class_ids
            if cached is not None:
                hit = cached.get(mid)
                if hit is not None and hit[0] is marker:
                    return hit[1]
            sig = layer.signature
        else:
            sig = ()
        known = self._reprs.get(mid)
        if known is None or known[0] is not marker:
            known = self._reprs[mid] = (marker, repr(marker))
        key = (known[1], sig)
        cid = _CLASS_IDS.get(key)
        if cid is None:
            if len(_CLASS_IDS) > _LIMIT:
                clear()
            cid = _CLASS_IDS[key] = next(_NEXT_ID)
        if layer is not None:
            if layer.class_ids is None:
                layer.class_ids = {}
            layer.class_ids[mid] = (marker, cid)
        return cid

    def get(self, kind: str, marker: dict | None, layer: Classified | None, compute: Callable[[], Any]) -> Any:
        """The result of rule ``kind`` for this layer, computed only for a new class."""
        # The layer's cached class, inline: this runs for every layer under every rule set.
        cached = layer.class_ids if layer is not None else None
        hit = cached.get(id(marker)) if cached is not None else None
        if hit is not None and hit[0] is marker:
            key = (kind, hit[1])
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
