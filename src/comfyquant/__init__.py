"""comfyquant: check, inspect, fix, quantize and run Comfy quantized safetensors checkpoints.

The package import is light on purpose (no torch, no numpy): ``check`` and ``inspect`` start
in milliseconds.  Heavy pieces load lazily.
"""

from __future__ import annotations

from .version import __version__

__all__ = ["__version__", "check", "open_checkpoint", "inspect", "fix", "quantize", "convert", "dequantize"]


def __getattr__(name: str):
    if name == "check":
        from .checker.run import check

        return check
    if name == "open_checkpoint":
        from .checkpoint import open_checkpoint

        return open_checkpoint
    if name == "inspect":
        from .inspection import inspect

        return inspect
    if name == "fix":
        from .repair.run import fix

        return fix
    if name in ("quantize", "convert"):
        from .quantizer import api

        return getattr(api, name)
    if name == "dequantize":
        from .dequantizer import dequantize

        return dequantize
    raise AttributeError(name)
