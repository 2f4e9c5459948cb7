"""The three nodes: their sockets (what ComfyUI's frontend shows) and the calls behind them.

Each node is a thin shell: the work is comfyquant's (``check``, ``loading``,
``saving``).  A comfyquant error reaches the UI as ``NodeError``, raised here with
the error's one line and without its chain, so what ComfyUI shows is that line and the node's
own frame, never comfyquant's internals.
"""

from __future__ import annotations

import os
from collections.abc import Callable

CATEGORY = "comfyquant"


class NodeError(Exception):
    """What a node shows in ComfyUI when comfyquant refuses its input: one line naming the
    file, layer or tensor and what is wrong."""


def guarded(work: Callable, *args, **kwargs):
    """Run ``work``; comfyquant's refusals and unreadable files become one ``NodeError``."""
    from ..errors import ComfyQuantError

    try:
        return work(*args, **kwargs)
    except ComfyQuantError as exc:
        message = str(exc)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        message = f"{where}{exc.strerror or exc}"
    raise NodeError(message)


def model_path(model_name: str) -> str:
    """The full path of a file in ComfyUI's ``diffusion_models`` folders."""
    import folder_paths

    path = folder_paths.get_full_path("diffusion_models", model_name)
    if path is None:
        raise NodeError(f"{model_name}: not in ComfyUI's diffusion_models folders")
    return path


def file_state(model_name: str) -> str:
    """Changes when the file does: ComfyUI re-runs a node whose ``IS_CHANGED`` value changed."""
    try:
        st = os.stat(model_path(model_name))
    except (OSError, NodeError):
        return "missing"
    return f"{st.st_mtime_ns}:{st.st_size}"


def diffusion_models() -> list[str]:
    import folder_paths

    return folder_paths.get_filename_list("diffusion_models")


def target_choices() -> list[str]:
    """The Check node's ``targets``: all, then every runtime check judges by, ComfyUI's own
    first (the node runs inside it)."""
    from ..targets.select import TARGETS

    return ["all", *sorted(TARGETS, key=lambda name: name != "comfyui")]


def weight_dtypes() -> list[str]:
    """The Loader's ``weight_dtype`` choices (``loading.WEIGHT_DTYPES``)."""
    from .loading import WEIGHT_DTYPES

    return list(WEIGHT_DTYPES)


class ComfyQuantCheck:
    """``comfyquant check`` on a file of ``diffusion_models``: each runtime's verdict with its
    exact error, then the findings with their fixes; the report is shown on the node."""

    CATEGORY = CATEGORY
    FUNCTION = "check"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    DESCRIPTION = (
        "Check a quantized diffusion model file: each runtime's verdict with its exact error, then every finding and its fix."
    )

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": (diffusion_models(),),
                "targets": (target_choices(), {"default": "all"}),
            }
        }

    @classmethod
    def IS_CHANGED(cls, model_name, targets):
        return file_state(model_name)

    def check(self, model_name, targets):
        from .checking import report_text

        text = guarded(report_text, model_path(model_name), targets)
        return {"ui": {"text": [text]}, "result": (text,)}


class ComfyQuantLoader:
    """A diffusion model file of any layout loaded by ComfyUI's own loader: other writers'
    layouts translated exactly and lossless repairs applied in memory (nothing is written);
    a file that cannot load exactly is refused with the check's message unless
    ``allow_lossy``."""

    CATEGORY = CATEGORY
    FUNCTION = "load"
    OUTPUT_NODE = True
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("MODEL", "notes")
    DESCRIPTION = (
        "Load a diffusion model of any layout (legacy scaled FP8, musubi, ModelOpt, BFL, INT8-Fast, nunchaku, GGUF): "
        "translated and repaired in memory, then loaded by ComfyUI."
    )

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": (diffusion_models(),),
                "weight_dtype": (weight_dtypes(), {"default": "default"}),
                "allow_lossy": ("BOOLEAN", {"default": False}),
            }
        }

    @classmethod
    def IS_CHANGED(cls, model_name, weight_dtype, allow_lossy):
        return file_state(model_name)

    def load(self, model_name, weight_dtype, allow_lossy):
        from .loading import load_model

        model, notes = guarded(load_model, model_path(model_name), weight_dtype, bool(allow_lossy))
        return {"ui": {"text": [notes]}, "result": (model, notes)}


def writable_formats() -> list[str]:
    """The formats ``quantize`` writes, in the registry's order (the recommended one first)."""
    from ..formats.registry import FORMATS

    return [name for name, fmt in FORMATS.items() if fmt.writable]


def preset_choices() -> list[str]:
    from ..quantizer.presets import PRESETS

    return ["auto", "none", *PRESETS]


class ComfyQuantQuantizeSave:
    """The model's diffusion weights quantized by comfyquant's quantizer (format, preset) into
    a checkpoint in ComfyUI's ``diffusion_models`` folder, checked before it is renamed into
    place; returns the per-layer error summary."""

    CATEGORY = CATEGORY
    FUNCTION = "save"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("summary",)
    DESCRIPTION = "Quantize the model's diffusion weights and save a checked checkpoint into diffusion_models."

    @classmethod
    def INPUT_TYPES(cls):
        formats = writable_formats()
        return {
            "required": {
                "model": ("MODEL",),
                "format": (formats, {"default": formats[0]}),
                "preset": (preset_choices(), {"default": "auto"}),
                "filename_prefix": ("STRING", {"default": "comfyquant/model"}),
            }
        }

    def save(self, model, format, preset, filename_prefix):
        from .saving import quantize_model

        text = guarded(quantize_model, model, format, preset, filename_prefix)
        return {"ui": {"text": [text]}, "result": (text,)}
