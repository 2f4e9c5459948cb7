"""Reading a tensor's values only when its bytes are what its header describes.

A damaged file still opens for ``check`` (its container findings report the damage), so every
reader of tensor values -- ``check --deep``'s value checks and each dialect's ``settle`` --
first asks ``sound``: a reader that indexes a short or long span by its header's shape reads
garbage or fails.  Plain data, no numpy: ``check`` imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dtypes import DTYPE_BITS

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint


def file_ends(ckpt: Checkpoint) -> dict[str, int]:
    """Each file's size, by file: where a tensor's span must end (``sound``)."""
    return {h.file: h.size for h in ckpt.headers}


def sound(entry, ends: dict[str, int]) -> bool:
    """Whether a tensor's bytes are the values its header describes: its span lies within its
    file (a span past the end of a truncated file is C002's) and is exactly dtype x shape (a
    span of another size is C001's).  Only such tensors are read for their values: a reader
    that indexes a short or long span by its header's shape reads garbage or fails."""
    return entry.end <= ends.get(entry.file, entry.end) and entry.nbytes * 8 == entry.numel * DTYPE_BITS.get(entry.dtype, -1)


def read_sound(ckpt: Checkpoint, entries) -> dict[str, bytes]:
    """The bytes of each of ``entries`` that is ``sound`` and reads back whole, by name; the
    others are left out (the container findings say what is wrong with them), so a reader
    judges only values its tensor's header describes truly and leaves the rest unsettled."""
    ends = file_ends(ckpt)
    wanted = [e for e in dict.fromkeys(entries) if sound(e, ends)]
    data = ckpt.read_many(wanted) if wanted else {}
    return {e.name: data[e.name] for e in wanted if len(data.get(e.name, b"")) == e.nbytes}
