"""Write a ``*.safetensors.index.json`` for a sharded checkpoint.

Shared by ``fix``, ``quantize``, ``convert`` and ``dequantize``, through the one writer
(``comfyquant.io.writer.stage_file``): the index is staged beside the shards and committed
with them, so a failure leaves either the old index or the new one, never a partial file.
"""

from __future__ import annotations

from .jsontext import parse as parse_json
from .writer import commit_file, json_filler, stage_file


def index_document(weight_map: dict[str, str], previous: str | None = None, total_size: int | None = None) -> dict:
    """``{"metadata": ..., "weight_map": ...}``.  ``previous`` is the input's index: its
    ``metadata`` object is kept (model tools store ``total_size`` and their own keys there);
    ``total_size``, when the writer knows the new tensors' bytes, replaces the old figure."""
    metadata: dict = {}
    if previous:
        try:
            with open(previous, encoding="utf-8") as fh:
                old = parse_json(fh.read())
            if isinstance(old, dict) and isinstance(old.get("metadata"), dict):
                metadata = dict(old["metadata"])
        except (OSError, ValueError):
            pass
    if total_size is not None:
        metadata["total_size"] = total_size
    return {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}


def write_index(
    weight_map: dict[str, str],
    dest: str,
    previous: str | None = None,
    *,
    total_size: int | None = None,
    commit: bool = True,
) -> str:
    """Write the index of ``weight_map`` (tensor -> shard file name) to ``dest`` (temp file,
    fsync, rename); with ``commit=False`` the staged temporary file's path is returned for the
    caller to commit with the shards (``commit_file``)."""
    tmp = stage_file(dest, json_filler(index_document(weight_map, previous, total_size), indent=2))
    if commit:
        commit_file(tmp, dest)
        return dest
    return tmp
