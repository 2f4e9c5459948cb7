"""What a GGUF file and its virtual safetensors view are recognised by (standard library only:
``check`` and ``inspect`` import this on every run, the reader only for a GGUF file)."""

from __future__ import annotations

import os
import stat

MAGIC = b"GGUF"

DENSE = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "I16": "I16", "I32": "I32", "I64": "I64"}
"""ggml types whose bytes are a safetensors dtype's bytes (little-endian, row-major)."""

CONTAINER_KEY = "comfyquant.container"
"""Metadata of a virtual view: which container the checkpoint really is."""
TYPES_KEY = "comfyquant.gguf.types"
"""JSON {tensor name: ggml type name} of every tensor of the GGUF file."""
ORIG_SHAPE_KEY = "comfyquant.gguf.orig_shape"
"""JSON {tensor name: {"shape": [...], "type": array element type}} of the reshaped tensors."""
ARCH_KEY = "gguf.architecture"
ORIG_SHAPE_PREFIX = "comfy.gguf.orig_shape."
"""ComfyUI-GGUF's key for the shape of a tensor its converter flattened (loader.py get_orig_shape)."""


def is_gguf(path: str) -> bool:
    """Whether ``path`` is a local regular file starting with the GGUF magic (4 bytes read;
    False for anything unreadable, a pipe, a folder or a URL, never an exception)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError, TypeError):
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.pread(fd, 4, 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)
