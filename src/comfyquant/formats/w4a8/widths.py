"""What a W4A8 packed row's byte width says about the layer's input size.

Both the description's geometry (``__init__``) and ``fix``'s marker inference (``repair``)
read it, so it lives below both of them.
"""

from __future__ import annotations


def k_by_bits(cols: int) -> dict[int, int]:
    """Bit depth -> input size K of a packed row ``cols`` bytes wide (4-bit first): two codes
    per byte, or four 6-bit codes per three bytes."""
    by_bits = {4: 2 * cols}
    if (4 * cols) % 3 == 0:
        by_bits[6] = 4 * cols // 3
    return by_bits
