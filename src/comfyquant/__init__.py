"""comfyquant: check, inspect, fix, quantize and run Comfy quantized safetensors checkpoints.

The package import is light on purpose (no torch, no numpy, not even ``dataclasses``):
``check`` and ``inspect`` start in milliseconds.  The API functions are imported on first use
(PEP 562); type checkers see them through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    # Written out here rather than with discovery.lazy_exports (which the subpackages use):
    # importing comfyquant loads no other module of the package (tests/test_api.py).

    def __getattr__(name: str) -> object:
        module = _API.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later lookups find it without this hook
        return value


def __dir__() -> list[str]:
    """The public API and the module's own dunders (not the lazy-import machinery)."""
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})
