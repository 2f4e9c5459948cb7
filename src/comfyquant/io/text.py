"""The text files a command reads beside checkpoints (rules files, shard indexes): read whole,
as UTF-8, or refused in one line naming the file.

A user who passes a checkpoint where a rules file belongs, or a file saved in another
encoding, must hear which file is not what, not a decoder's traceback; a multi-gigabyte
checkpoint given by mistake is refused by its size before it is read into memory.
"""

from __future__ import annotations

import os

from ..errors import InputError

MAX_TEXT_BYTES = 64 << 20
"""The largest text input read (64 MiB): rules files and indexes are kilobytes; a larger file
is a checkpoint or an archive given by mistake."""

_BINARY_HINTS = ((b"GGUF", "a GGUF file"), (b"PK\x03\x04", "a zip archive"), (b"\x80", "a pickle"))


def _looks_like(head: bytes) -> str:
    """What binary a refused file appears to be, for the message (a phrase, or "")."""
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1:
        return "; it looks like a safetensors checkpoint"
    for magic, what in _BINARY_HINTS:
        if head.startswith(magic):
            return f"; it looks like {what}"
    return ""


def read_text_file(path: str, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``path`` decoded as UTF-8 (a leading byte-order mark dropped), or an ``InputError`` that
    names the file and says it is not ``what`` (``"a rules file"``): missing, unreadable, too
    large, binary or in another encoding."""
    from .source import require_regular

    require_regular(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(16)
            if size > limit:
                raise InputError(f"{path}: {size:,} bytes is too large for {what} (at most {limit:,}){_looks_like(head)}")
            data = head + fh.read(limit + 1 - len(head))
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what.removeprefix('a ')}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a folder, not {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:  # it grew while read
        raise InputError(f"{path}: too large for {what} (at most {limit:,} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}), which {what} must be"
            f"{_looks_like(data[:16])}"
        ) from None
    if "\x00" in text:
        raise InputError(f"{path}: holds NUL bytes, which {what} never does{_looks_like(data[:16])}")
    return text.removeprefix("\ufeff")
