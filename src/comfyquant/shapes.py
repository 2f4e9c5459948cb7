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
