"""Per-layer results cached by signature.

A check's result for one layer depends only on its marker and the (suffix, dtype, shape) of
its tensors.  A 14B model has ~600 layers but a few dozen distinct signatures, so every
per-layer rule (canonical and runtime) is computed once per signature: first looked up by
marker identity within one checkpoint (cheap), then by the marker's text across checkpoints.
Cached values are immutable templates; callers bind them to a layer name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_GLOBAL: dict[tuple, Any] = {}
_GLOBAL_LIMIT = 100_000


class Memo:
    __slots__ = ("_local", "_sids")

    def __init__(self) -> None:
        self._local: dict[tuple, Any] = {}
        self._sids: dict[tuple, int] = {}

    def sid(self, sig: tuple) -> int:
        """A small int standing for a signature within this checkpoint (hashing it once)."""
        return self._sids.setdefault(sig, len(self._sids))

    def get(self, kind: str, marker: dict | None, layer, compute: Callable[[], Any]) -> Any:
        """``layer`` is a Layer (or None for a marker without tensors)."""
        if layer is None:
            sig, sid = (), -1
        else:
            sid = layer._sid
            if sid is None:
                sid = layer._sid = self.sid(layer.signature)
            sig = None
        key = (kind, id(marker), sid)
        hit = self._local.get(key, _MISS)
        if hit is _MISS:
            if sig is None:
                sig = layer.signature
            gkey = (kind, repr(marker), sig)
            hit = _GLOBAL.get(gkey, _MISS)
            if hit is _MISS:
                hit = compute()
                if len(_GLOBAL) > _GLOBAL_LIMIT:
                    _GLOBAL.clear()
                _GLOBAL[gkey] = hit
            self._local[key] = hit
        return hit


def clear() -> None:
    """Forget cross-checkpoint results (benchmarks use this to measure cold checks)."""
    _GLOBAL.clear()


_MISS = object()
