"""Byte counts as text, one convention for every command (base layer: no package imports)."""

from __future__ import annotations


def human_size(n: float) -> str:
    """Bytes as ``123 B``, ``4.5 MB`` ... (every command's summary uses this one)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
