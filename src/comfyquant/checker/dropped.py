"""``--deep``: how far a layer's output moves when ComfyUI drops a part of it that the other
runtimes apply.

Which part, when it can be measured and how its share of the weight is computed is the
format's (``Format.dropped``, a ``formats.hooks.DroppedPart`` from the format package's
``deep.py``); here are the finding, its thresholds and the reading of a 16-bit part both
ways.  numpy is imported by the caller (``deep``), never by plain ``check``."""

from __future__ import annotations

from ..findings import Finding
from ..formats.hooks import DroppedPart
from ..formats.registry import FORMATS

CODE = "D010"
GARBAGE = 0.9
"""The relative output error from which the layer's output is garbage (the harness's
threshold); from ``DEGRADED`` it works, clearly worse than the format's usual error."""
DEGRADED = 0.3


def part(layer) -> DroppedPart | None:
    """The part of ``layer`` ComfyUI drops, when its format has one and the layer's tensors let
    its share be measured; else None."""
    fmt = FORMATS.get(layer.format_name) if layer.format_name else None
    dropped = fmt.dropped if fmt is not None else None
    return dropped if dropped is not None and dropped.wanted(layer) else None


OTHER_HALF = {"F16": "BF16", "BF16": "F16"}
"""A 16-bit float part's bytes read as the other 16-bit float: both are valid numbers,
and the file does not record which one the writer meant."""


def share(np, decode, layer, dropped: DroppedPart, data: dict[str, bytes]) -> float | None:
    """The dropped part's share of the full weight (the format's ``share``), or None when the
    values cannot be read soundly.  A 16-bit part is read both ways (``OTHER_HALF``) and the
    smaller share is the one a file can vouch for."""
    dtype = layer.stored[dropped.suffix].dtype
    shares = [dropped.share(np, decode, layer, data, d) for d in (dtype, OTHER_HALF.get(dtype)) if d is not None]
    known = [v for v in shares if v is not None]
    return min(known) if known else None


def finding(layer, dropped: DroppedPart, share_: float) -> Finding:
    """The D010 finding: what ComfyUI computes without the part (garbage from ``GARBAGE``;
    the verdict follows, see ``deep.makes_garbage``).  ``deep`` reports it only from
    ``GARBAGE``: below, ComfyUI's profile already warns that the layer computes without the
    part, and a valid layer that has one (about 0.4) raises no value finding."""
    tensor = layer.stored[dropped.suffix].name
    if share_ >= GARBAGE:
        what, actual = "garbage", f"garbage: relative error {share_:.2f}"
    elif share_ >= DEGRADED:
        what, actual = "a degraded output", f"degraded: relative error {share_:.2f}"
    else:
        what, actual = "a close output", f"close: relative error {share_:.2f}"
    return Finding(
        CODE,
        f"{tensor}: ComfyUI drops the correction, {share_:.0%} of the layer's weight: {what} (no error)",
        layer=layer.name,
        tensor=tensor,
        expected=dropped.expected,
        actual=actual,
        cause=dropped.cause,
        fix=dropped.fix,
    )
