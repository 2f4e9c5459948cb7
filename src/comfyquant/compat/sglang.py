"""Drop-in for SGLang's ``inspect_comfy_quant_markers`` (diffusion runtime, 0.5.x).

Returns the same marker dict SGLang returns (merged markers keyed by mapped prefix, with its
derived ``_activation_scheme`` / ``_has_codebook`` / ``_has_correction`` /
``_has_pre_quant_scale`` / ``_is_rowwise`` / ``_is_tensorwise_scalar`` keys), or raises the
same exception type with the same message, while reading only headers and marker bytes and
importing neither torch nor safetensors (a file safetensors refuses raises its
``SafetensorError``, imported on that path only).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..checkpoint import open_checkpoint
from ..io.shards import ShardSet
from ..io.source import LocalFile
from ..targets.container import EXCEPTION
from ..targets.sglang import Run, SGLangError, inspect_markers

_EXCEPTIONS: dict[str, type[Exception]] = {
    e.__name__: e for e in (ValueError, NotImplementedError, TypeError, OverflowError, RecursionError)
}
"""The exception types SGLang's marker functions raise (Python's own, from ``int()``, ``json``
and torch's ``numpy()``)."""


class SafetensorError(Exception):
    """Stands in for ``safetensors.SafetensorError`` where safetensors is not installed."""


def _safetensor_error() -> type[Exception]:
    """safetensors' own exception type (imported only on this failure path), as SGLang's
    ``safe_open`` raises it for a damaged file."""
    try:
        from safetensors import SafetensorError as real
    except ImportError:
        return SafetensorError
    return real


def inspect_comfy_quant_markers(
    safetensors_list: list[str] | str | os.PathLike[str],
    param_name_mapper: Callable[[str], str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Read and validate Comfy quantization markers exactly as SGLang does.

    ``param_name_mapper`` is called with each raw layer prefix (``"model.diffusion_model.x"``)
    and returns the runtime's prefix, as SGLang calls it.

    ``safetensors_list`` is SGLang's list of shard paths; one path (a string or path object)
    is taken as a list of one, where iterating it would read each character as a file."""
    if isinstance(safetensors_list, (str, os.PathLike)):
        paths = [os.fspath(safetensors_list)]
    else:
        paths = [os.fspath(p) for p in safetensors_list]
    sources = [LocalFile(p) for p in paths]
    # a file safetensors cannot open raises its SafetensorError below, as SGLang's safe_open does
    ckpt = open_checkpoint(paths, sources=sources, shardset=ShardSet(files=paths), damaged_ok=True)
    try:
        try:
            markers, derived = inspect_markers(ckpt, param_name_mapper, Run(collect=False))
            return {name: {**m, **derived.get(name, {})} for name, m in markers.items()}
        except SGLangError as exc:
            v = exc.violation
            if v.exception == EXCEPTION:
                raise _safetensor_error()(v.message) from None
            raise _EXCEPTIONS.get(v.exception or "ValueError", ValueError)(v.message) from None
    finally:
        ckpt.close()
