"""The runtime profiles by name: the one place that knows all three (each profile knows only itself
and the shared pieces in ``base``/``container``; ComfyUI's also reads comfy-kitchen's kernels)."""

from __future__ import annotations

from .base import Verdict

TARGETS = ("sglang", "comfyui", "comfy-kitchen")


def run_target(name: str, ckpt) -> Verdict:
    """The verdict of runtime ``name`` on ``ckpt`` (profiles import lazily: a check selects few)."""
    if name == "sglang":
        from .sglang import sglang_verdict

        return sglang_verdict(ckpt)
    if name == "comfyui":
        from .comfyui import comfyui_verdict

        return comfyui_verdict(ckpt)
    if name == "comfy-kitchen":
        from .kitchen import kitchen_verdict

        return kitchen_verdict(ckpt)
    raise ValueError(f"unknown target {name!r}: choose from {', '.join(TARGETS)}")
