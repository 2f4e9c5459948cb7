"""``awq_w4a16``: unsigned 4-bit weights with float group scales and zeros (weight-only)."""

from __future__ import annotations

from ..base import WEIGHT, Constraint, Format, MarkerKey, Slot
from ..common import BIAS_SLOT, FORMAT_KEY, FULL_PRECISION_KEY, as_int, weight_2d

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""


def _geometry(tensors: dict, params: dict) -> dict:
    n, cols = weight_2d(tensors)
    return dict(params, N=n, K=2 * cols, bits=4, group_size=as_int(params.get("group_size"), 64))


AWQ_W4A16 = Format(
    name="awq_w4a16",
    codec_module=CODEC,
    title="4-bit weight-only (AWQ), float group scales and zeros",
    slots=(
        Slot("weight", "I8", "(N, K // 2)", kind=WEIGHT, meaning="unsigned nibbles, low nibble first"),
        Slot(
            "weight_scale",
            "float",
            "(K // group_size, N)",
            positive=True,
            # comfy-kitchen 0.2.40 decodes code x scale + zeros: every scale zero or subnormal
            # leaves the zero points (measured 0.58 relative error), every scale negative is garbage (1.17)
            adds_zero_points=True,
            meaning="group scales, group-major",
        ),
        Slot("weight_zeros", "float", "(K // group_size, N)", meaning="group zero points, group-major"),
        BIAS_SLOT,
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        MarkerKey("group_size", (int,), default=64, allowed="v > 0", allowed_text="a positive group size", nested_ok=True),
    ),
    geometry=_geometry,
    inspect_text=lambda env: f"G={env['group_size']}",
    constraints=(Constraint("K % group_size == 0", "group_size={group_size} does not divide K={K}"),),
    bits_text="4",
    loaders=frozenset({"comfy-kitchen"}),
    recognize=lambda t: "weight_zeros" in t and "weight" in t and t["weight"].dtype == "I8",
)

FORMATS = (AWQ_W4A16,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
