"""Open any checkpoint a command accepts: safetensors (file, shards, folder, URL) as
``comfyquant.checkpoint.open_checkpoint`` does, and a local file of another container
(GGUF) through its dialect's virtual safetensors view."""

from __future__ import annotations

import os

from ..checkpoint import Checkpoint, Paths, open_checkpoint
from ..errors import InputError
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


def container_suffixes() -> tuple[str, ...]:
    """The file-name endings of every container (``.gguf``): what a folder walk also looks for."""
    return tuple(s for c in CONTAINERS for s in c.suffixes)


def open_any(paths: Paths, **kw) -> Checkpoint:
    if kw.get("sources") is None:
        found = container_of(paths)
        if found is not None:
            path, container = found
            source = container.open(path)
            kw["shardset"] = ShardSet(files=[path])
            return open_checkpoint(path, sources=[source], **kw)
        _refuse_mixed(paths)
    return open_checkpoint(paths, **kw)


def _refuse_mixed(paths: Paths) -> None:
    """A container file among several inputs would be read as a safetensors shard ("header
    length ... exceeds the 100 MB limit"): say what it is instead."""
    if isinstance(paths, (str, os.PathLike)):
        return
    paths = [str(p) for p in paths]
    if len(paths) < 2:
        return
    for p in paths:
        if not is_url(p) and os.path.isfile(p):
            for c in CONTAINERS:
                if c.sniff(p):
                    raise InputError(
                        f"{p}: a {c.name.upper()} file is read on its own (it is no shard of a safetensors "
                        "checkpoint): name it alone"
                    )
