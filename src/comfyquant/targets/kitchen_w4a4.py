"""What ConvRot W4A4's linear refuses of its per-row scale at the first forward.

comfy-kitchen 0.2.40 dispatches ``convrot_w4a4_linear`` with operand constraints (on CPU the
eager backend's, ``comfy_kitchen/backends/eager/__init__.py``): ``wscales`` must be exactly
1-D, checked before the linear's own group-size checks.  The INT4 matmul then scales its
``[rows, N]`` output by ``wscales`` (``comfy_kitchen/backends/eager/convrot_w4a4.py``), where a
scale of another length raises torch's broadcasting error; the verdict states it for an input
of shape [4, K].
"""

from __future__ import annotations

from .base import LAYER, Violation
from .torch_text import broadcast_error

OP = "convrot_w4a4_linear"
FLOATS = ("F32", "F16", "BF16")
ROWS = 4
"""The rows of the input the verdict states (``[4, K]``)."""


def _scale(t: dict):
    """The weight and its scale when both reach the op with dtypes it takes, else None."""
    w, s = t.get("weight"), t.get("weight_scale")
    if w is None or s is None or w.dtype != "I8" or s.dtype not in FLOATS or len(w.shape) != 2:
        return None
    return w, s


def w4a4_scale_rank(target: str, t: dict) -> Violation | None:
    """A ``weight_scale`` that is not exactly 1-D: refused when the op is dispatched."""
    pair = _scale(t)
    if pair is None or len(pair[1].shape) == 1:
        return None
    s = pair[1]
    return Violation(
        f"{target}.w4a4-scale",
        f"No backend can handle '{OP}': eager: wscales: shape {list(s.shape)} fails: exactly 1D",
        "NoCapableBackendError",
        LAYER,
        "weight_scale",
        True,
        f"weight_scale of shape {list(s.shape)}: the ConvRot W4A4 linear takes one scale per output row, 1-D "
        "(raised at the first forward)",
        "store weight_scale as [N]",
    )


def w4a4_scale_length(target: str, t: dict) -> Violation | None:
    """A 1-D ``weight_scale`` whose length is not the weight's rows: the output scaling's
    broadcasting error, once the linear's own checks passed."""
    pair = _scale(t)
    if pair is None or len(pair[1].shape) != 1:
        return None
    w, s = pair
    message = broadcast_error((ROWS, w.shape[0]), tuple(s.shape))
    if message is None:
        return None
    return Violation(
        f"{target}.w4a4-scale",
        message,
        "RuntimeError",
        LAYER,
        "weight_scale",
        True,
        f"weight_scale of {s.shape[0]} values for {w.shape[0]} output rows: the first forward (on an input of "
        f"shape [{ROWS}, K]) scales its [{ROWS}, {w.shape[0]}] output by it",
        f"store weight_scale as [{w.shape[0]}]",
    )
