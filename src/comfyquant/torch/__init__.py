"""Run Comfy quantized checkpoints in plain PyTorch (needs the ``[torch]`` extra).

* ``QuantLinear`` -- one quantized linear layer (any format), computing what ComfyUI
  computes (comfy-kitchen's ``QuantizedTensor`` when installed, comfyquant's codecs otherwise);
* ``load_quantized`` -- load a checkpoint into a model (built on the meta device or not),
  replacing each quantized ``nn.Linear`` by a ``QuantLinear``, layer by layer;
* ``quantize_`` / ``save_quantized`` -- quantize an in-memory model with the rules of
  ``comfyquant quantize`` and write it as a Comfy checkpoint.

Names resolve on first use, so ``import comfyquant.torch`` costs nothing until one is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..discovery import lazy_exports

if TYPE_CHECKING:
    from .linear import QuantLinear, QuantWeight
    from .load import LoadError, LoadReport, load_quantized
    from .quant import quantize_, save_quantized

__all__ = ["QuantLinear", "QuantWeight", "load_quantized", "LoadReport", "LoadError", "quantize_", "save_quantized"]

_WHERE = {
    "QuantLinear": "linear",
    "QuantWeight": "linear",
    "load_quantized": "load",
    "LoadReport": "load",
    "LoadError": "load",
    "quantize_": "quant",
    "save_quantized": "quant",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _WHERE, __all__)
