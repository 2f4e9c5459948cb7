"""Write a ``*.safetensors.index.json`` for a sharded checkpoint, atomically.

Shared by ``fix``, ``quantize`` and ``convert``: the index is written last, after every shard
is in place, so a crash leaves either the old index or the new one, never a partial file.
"""

from __future__ import annotations

import json
import os

from .writer import commit_file


def write_index(weight_map: dict[str, str], dest: str, previous: str | None = None) -> None:
    """Write ``{"metadata": ..., "weight_map": ...}`` to ``dest`` (temp file, fsync, rename).

    ``previous`` is the input's index: its ``metadata`` object is kept (model tools store
    ``total_size`` and their own keys there)."""
    obj = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    if previous:
        try:
            with open(previous, encoding="utf-8") as fh:
                old = json.load(fh)
            if isinstance(old, dict) and isinstance(old.get("metadata"), dict):
                obj["metadata"] = old["metadata"]
        except (OSError, ValueError, RecursionError):
            pass
    tmp = dest + ".comfyquant.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    commit_file(tmp, dest)
