"""Open any checkpoint a command accepts: safetensors (file, shards, folder, URL) as
:func:`comfyquant.checkpoint.open_checkpoint` does, and a local file of another container
(GGUF) through its dialect's virtual safetensors view."""

from __future__ import annotations

import os

from ..checkpoint import Checkpoint, Paths, open_checkpoint
from ..io.shards import ShardSet, is_url
from .registry import CONTAINERS


def container_of(paths: Paths) -> tuple[str, object] | None:
    """(path, container) when ``paths`` names one local file of a non-safetensors container."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [str(p) for p in paths]
    if len(paths) != 1 or is_url(paths[0]) or not os.path.isfile(paths[0]):
        return None
    for c in CONTAINERS:
        if c.sniff(paths[0]):
            return paths[0], c
    return None


def open_any(paths: Paths, **kw) -> Checkpoint:
    if kw.get("sources") is None:
        found = container_of(paths)
        if found is not None:
            path, container = found
            source = container.open(path)
            return open_checkpoint(path, sources=[source], shardset=ShardSet(files=[path]), **kw)
    return open_checkpoint(paths, **kw)
