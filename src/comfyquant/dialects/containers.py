"""Open any checkpoint a command accepts: safetensors (file, shards, folder, URL) as
``comfyquant.checkpoint.open_checkpoint`` does, and a local file of another container
(GGUF) through its dialect's virtual safetensors view."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..checkpoint import Checkpoint, NameMapper, Paths, open_checkpoint
from ..errors import InputError
from ..io.shards import ShardSet, is_url
from .base import Container
from .registry import CONTAINERS

if TYPE_CHECKING:
    from ..io.remote import RemoteOptions


def container_of(paths: Paths) -> tuple[str, Container] | None:
    """(path, container) when ``paths`` names one local file of a non-safetensors container."""
    names = [str(paths)] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
    if len(names) != 1 or is_url(names[0]) or not os.path.isfile(names[0]):
        return None
    for c in CONTAINERS:
        if c.sniff(names[0]):
            return names[0], c
    return None


def container_suffixes() -> tuple[str, ...]:
    """The file-name endings of every container (``.gguf``): what a folder walk also looks for."""
    return tuple(s for c in CONTAINERS for s in c.suffixes)


def open_any(
    paths: Paths,
    name_mapper: NameMapper | None = None,
    *,
    shardset: ShardSet | None = None,
    remote: RemoteOptions | None = None,
    damaged_ok: bool = False,
) -> Checkpoint:
    """A container file's view, or ``open_checkpoint`` with these arguments (a caller that
    brings its own byte sources has no file to sniff: it calls ``open_checkpoint``)."""
    found = container_of(paths)
    if found is not None:
        path, container = found
        return open_checkpoint(path, name_mapper, [container.open(path)], ShardSet(files=[path]), remote, damaged_ok)
    _refuse_mixed(paths)
    return open_checkpoint(paths, name_mapper, None, shardset, remote, damaged_ok)


def _refuse_mixed(paths: Paths) -> None:
    """A container file among several inputs would be read as a safetensors shard ("header
    length ... exceeds the 100 MB limit"): say what it is instead."""
    if isinstance(paths, (str, os.PathLike)):
        return
    names = [str(p) for p in paths]
    if len(names) < 2:
        return
    for p in names:
        if not is_url(p) and os.path.isfile(p):
            for c in CONTAINERS:
                if c.sniff(p):
                    raise InputError(
                        f"{p}: a {c.name.upper()} file is read on its own (it is no shard of a safetensors "
                        "checkpoint): name it alone"
                    )
