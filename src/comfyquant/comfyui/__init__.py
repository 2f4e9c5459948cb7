"""comfyquant's nodes for ComfyUI: check a diffusion model file, load one of any layout
(translated and repaired in memory), quantize a loaded model into a checked checkpoint.

ComfyUI imports this package from ``custom_nodes/comfyquant/`` (the shim
``comfyquant comfyui install`` writes) and reads the three names below.  Nothing of ComfyUI
(nor torch) is imported here: the nodes import ``folder_paths``, ``comfy.sd`` and
``comfy.utils`` when ComfyUI calls them, so importing this package anywhere else costs
nothing.
"""

from __future__ import annotations

import os

from .nodes import ComfyQuantCheck, ComfyQuantLoader, ComfyQuantQuantizeSave

NODE_CLASS_MAPPINGS = {
    "ComfyQuantCheck": ComfyQuantCheck,
    "ComfyQuantLoader": ComfyQuantLoader,
    "ComfyQuantQuantizeSave": ComfyQuantQuantizeSave,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "ComfyQuantCheck": "Check quantized model (comfyquant)",
    "ComfyQuantLoader": "Load diffusion model, any layout (comfyquant)",
    "ComfyQuantQuantizeSave": "Quantize and save model (comfyquant)",
}
WEB_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
"""The frontend extension (``web/comfyquant.js``): shows the Check node's report on the node.
Absolute, because ComfyUI resolves it against the folder of the module it imported, which is
the shim in ``custom_nodes/comfyquant/``, not this package."""

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
