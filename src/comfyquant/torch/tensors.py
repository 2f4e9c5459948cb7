"""What every loader of ``comfyquant.torch`` and ``comfyquant.diffusers`` shares: opening a
checkpoint behind the decoding commands' gate, reading one tensor straight into its own
storage, and putting tensors and modules into a model (``assign=True`` semantics).

Kept apart from ``load`` so the diffusers loader, which maps names through diffusers'
converters instead of matching them to a model, reads and assigns tensors the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..dtypes import DENSE_FLOAT_DTYPES
from ..errors import InputError
from ..numerics.dtypes import TORCH_DTYPES

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

DENSE_TORCH_DTYPES = frozenset(TORCH_DTYPES[name] for name in DENSE_FLOAT_DTYPES)
"""The torch dtypes of dense float tensors: the ones a load may cast."""


class LoadError(InputError):
    """The checkpoint cannot be loaded into the model; the message names the file, key or layer."""


def path_label(path) -> str:
    """How messages name the checkpoint."""
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)


@contextmanager
def open_checked(path) -> Iterator:
    """The checkpoint at ``path`` (file, shards, folder, dialect file) as its Comfy view,
    checked for comfy-kitchen first -- the gate every decoding command shares: a checkpoint
    a runtime could not load is refused with its findings in one line (``LoadError``)."""
    from ..gate import open_input

    verb = f"load {path_label(path)}"  # "refusing to load <file>: <first finding> [code] (and N more ...)"
    with open_input(path, verb, LoadError) as (_stored, ckpt):
        yield ckpt


def read_tensor(ckpt: Checkpoint, entry, device: torch.device, report=None, cast: torch.dtype | None = None) -> torch.Tensor:
    """One tensor, read into its own storage (no memory map, no intermediate copy for local
    files); floating-point tensors cast to ``cast`` when given; ``report.bytes_read`` counts."""
    dtype = TORCH_DTYPES.get(entry.dtype)
    if dtype is None:
        raise LoadError(f"{entry.file}: tensor {entry.name!r} has dtype {entry.dtype}, which torch cannot hold")
    source = ckpt.source(entry.file)
    if hasattr(source, "readinto"):
        buf = torch.empty(entry.nbytes, dtype=torch.uint8)
        if entry.nbytes and source.readinto(entry.start, buf.numpy().data) != entry.nbytes:
            raise LoadError(f"{entry.file}: file ended early while reading tensor {entry.name!r} (truncated?)")
    else:
        buf = (
            torch.frombuffer(bytearray(ckpt.read_bytes(entry)), dtype=torch.uint8)
            if entry.nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
    if report is not None:
        report.bytes_read += entry.nbytes
    t = buf.view(dtype).reshape(tuple(entry.shape))
    if cast is not None and t.dtype in DENSE_TORCH_DTYPES:
        t = t.to(cast)
    return t if device.type == "cpu" else t.to(device)


def owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """(module holding ``name``, its attribute name)."""
    parent, _, leaf = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), leaf


def replace_module(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, leaf = owner(model, name)
    setattr(parent, leaf, layer)


def assign_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """``load_state_dict(assign=True)`` for one tensor: the parameter (or buffer) object is
    replaced, so a meta-device placeholder never allocates."""
    module, leaf = owner(model, name)
    old = getattr(module, leaf)
    if isinstance(old, nn.Parameter):
        setattr(module, leaf, nn.Parameter(value, requires_grad=old.requires_grad and value.is_floating_point()))
    else:
        setattr(module, leaf, value)
