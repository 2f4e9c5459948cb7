"""How a tensor's shape is written in every message comfyquant prints (base layer: no package imports)."""

from __future__ import annotations

from collections.abc import Iterable


def fmt_shape(shape: Iterable[int | str], *, as_tuple: bool = False) -> str:
    """A shape as ``[5120, 13824]``, the form the commands print shapes in.

    ``as_tuple`` writes Python's tuple syntax instead (``(5120, 13824)``, ``(16,)``): the
    per-layer findings show a stored shape beside the format description's shape expression
    (``(K // group_size, N)``), which is written in that syntax.  A symbolic dimension (``"R"``,
    a rank of any size) is written as given."""
    dims = [str(d) for d in shape]
    if not as_tuple:
        return "[" + ", ".join(dims) + "]"
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def broadcast_mismatch(a: tuple, b: tuple) -> tuple[int, int, int] | None:
    """Where shapes ``a`` and ``b`` do not broadcast, as torch compares them (dimensions from
    the last one): ``(size in a, size in b, dimension)`` of the first clash, or None when they
    broadcast.  ``torch_text.broadcast_error`` words it as torch does."""
    ndim = max(len(a), len(b))
    for i in range(ndim - 1, -1, -1):
        back = ndim - 1 - i
        da = a[len(a) - 1 - back] if back < len(a) else 1
        db = b[len(b) - 1 - back] if back < len(b) else 1
        if da != db and da != 1 and db != 1:
            return da, db, i
    return None
