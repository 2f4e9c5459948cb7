"""The Loader node's work: a file of any layout, translated and repaired in memory by
``comfyquant.repair.memory.repaired``, handed to ComfyUI's own
``comfy.sd.load_diffusion_model_state_dict`` (ComfyUI 0.33.0 comfy/sd.py), which detects
the model from the tensors' names and shapes as it does for a file it reads itself."""

from __future__ import annotations

from ..errors import InputError
from ..markers import set_marker_map

WEIGHT_DTYPES: dict[str, dict] = {
    "default": {},
    "fp8_e4m3fn": {"dtype": "e4m3fn"},
    "fp8_e4m3fn_fast": {"dtype": "e4m3fn", "fp8_optimizations": True},
    "fp8_e5m2": {"dtype": "e5m2"},
}
"""The Loader's ``weight_dtype`` choices, as ComfyUI's own diffusion model loader (nodes.py
``UNETLoader``) offers them, and the model options it passes for each (``dtype`` names the
FP8 element type, torch's ``float8_<dtype>``: the node's choices are read without importing
torch)."""


def model_options(weight_dtype: str) -> dict:
    """What ComfyUI's ``UNETLoader`` passes for a ``weight_dtype`` choice (``WEIGHT_DTYPES``)."""
    options = dict(WEIGHT_DTYPES.get(weight_dtype, {}))
    if "dtype" in options:
        import torch

        options["dtype"] = getattr(torch, f"float8_{options['dtype']}")
    return options


def state_dict(view, progress=None) -> dict:
    """Every tensor of the (repaired) checkpoint, read into its own CPU storage."""
    import torch

    from ..torch.tensors import read_tensor

    cpu = torch.device("cpu")
    out = {}
    for i, (name, entry) in enumerate(view.tensors.items(), 1):
        out[name] = read_tensor(view, entry, cpu)
        if progress is not None:
            progress(i, len(view.tensors))
    return out


def runtime_metadata(repaired) -> dict[str, str]:
    """The header metadata ComfyUI reads: the first file's, with one marker map of every
    file (ComfyUI takes its layers' markers from it when present)."""
    return set_marker_map(dict(repaired.view.headers[0].metadata), repaired.quant_map())


def describe(repaired) -> str:
    """What was translated or repaired (the Loader's second output)."""
    name = repaired.source.files[0]
    lines = repaired.notes()
    if not lines:
        return f"{name}: loaded as stored (nothing to translate or repair)"
    return "\n".join([f"{name}: {len(lines)} change{'s' * (len(lines) != 1)} made in memory (the file is unchanged):", *lines])


def load_model(path: str, weight_dtype: str, allow_lossy: bool):
    """(ComfyUI's MODEL, the notes) for the file at ``path``."""
    import comfy.sd
    import comfy.utils

    from ..repair.memory import repaired

    with repaired(path, target="comfyui", allow_lossy=allow_lossy) as fixed:
        bar = comfy.utils.ProgressBar(max(len(fixed.view.tensors), 1))
        sd = state_dict(fixed.view, lambda done, total: bar.update_absolute(done, total))
        metadata = runtime_metadata(fixed)
        notes = describe(fixed)
    model = comfy.sd.load_diffusion_model_state_dict(sd, model_options=model_options(weight_dtype), metadata=metadata)
    if model is None:
        raise InputError(f"{path}: ComfyUI does not recognise the model in this file (no known model's tensor names and shapes)")
    return model, notes
