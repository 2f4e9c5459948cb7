"""Byte counts as text, one convention for every command (base layer: no package imports)."""

from __future__ import annotations


def human_size(n: float) -> str:
    """Bytes as ``123 B``, ``4.5 MiB`` ... (every command's summary uses this one).

    One convention everywhere: sizes are binary (KiB, MiB, GiB: powers of 1024, labelled so),
    rates are decimal (``MB/s``: 10**6 bytes per second, as disks and networks are quoted)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
