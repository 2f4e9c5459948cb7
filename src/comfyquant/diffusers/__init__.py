"""Load Comfy quantized single files into diffusers models (needs the ``[diffusers]`` extra).

* ``load_transformer`` -- a ComfyUI/BFL-named checkpoint (any format, any dialect) into a
  diffusers transformer class through diffusers' own key converter, every quantized layer a
  ``QuantLinear``;
* ``ComfyQuantParameter`` -- a quantized layer posing as its dense weight while a
  converter splits and fuses it (exact row operations only);
* ``SUPPORTED`` -- the diffusers versions it is written against.

Names resolve on first use, so ``import comfyquant.diffusers`` imports neither torch nor diffusers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..discovery import lazy_exports

if TYPE_CHECKING:
    from .load import load_transformer
    from .parameter import ComfyQuantParameter, InexactOperation
    from .versions import SUPPORTED

__all__ = ["load_transformer", "ComfyQuantParameter", "InexactOperation", "SUPPORTED"]

_WHERE = {
    "load_transformer": "load",
    "ComfyQuantParameter": "parameter",
    "InexactOperation": "parameter",
    "SUPPORTED": "versions",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _WHERE, __all__)
