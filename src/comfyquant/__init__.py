"""comfyquant: check, inspect, fix, quantize and run Comfy quantized safetensors checkpoints.

The package import is light on purpose (no torch, no numpy, not even ``dataclasses``):
``check`` and ``inspect`` start in milliseconds.  The API functions are imported on first use
(PEP 562); type checkers see them through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .discovery import lazy_exports
from .version import __version__

if TYPE_CHECKING:
    from .checker.run import check
    from .checkpoint import open_checkpoint
    from .comparison import compare
    from .dequantizer import dequantize
    from .inspection import inspect
    from .quantizer.api import convert, quantize
    from .repair.migration import migrate
    from .repair.run import fix

__all__ = ["__version__", "check", "open_checkpoint", "inspect", "fix", "migrate", "quantize", "convert", "dequantize", "compare"]

_API = {
    "check": "checker.run",
    "open_checkpoint": "checkpoint",
    "inspect": "inspection",
    "fix": "repair.run",
    "migrate": "repair.migration",
    "quantize": "quantizer.api",
    "convert": "quantizer.api",
    "dequantize": "dequantizer",
    "compare": "comparison",
}
"""Each API function's module (relative to the package): imported on first access."""


if not TYPE_CHECKING:  # type checkers see the imports above: a misspelt name stays an error
    __getattr__, __dir__ = lazy_exports(__name__, _API, __all__)
