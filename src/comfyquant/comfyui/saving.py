"""The QuantizeSave node's work: a loaded model's diffusion weights quantized by ``comfyquant
quantize`` (its planner, presets, codecs and writer) into ComfyUI's ``diffusion_models``
folder.

The dense weights go to a temporary file in ComfyUI's temp folder first: the quantizer reads
checkpoints, so its per-layer decisions, presets and the check before the rename are those
of the command.  The output is written under a temporary name and renamed into place only
after it passed its check; the temporary input is removed whatever happens.
"""

from __future__ import annotations

import os
import uuid

from ..errors import InputError


def dense_weights(model) -> dict:
    """The model's diffusion weights (patches such as LoRAs applied), dense and on the CPU.
    A weight that is already quantized is refused: re-quantizing decoded weights compounds
    two errors, and the dense checkpoint is where a quantization should start."""
    import comfy.model_management
    import torch

    comfy.model_management.load_models_gpu([model], force_full_load=True)
    out = {}
    for name, value in model.model.diffusion_model.state_dict().items():
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise InputError(
                f"QuantizeSave: the model's {name!r} is already quantized ({type(value).__name__}): "
                "load the dense checkpoint to quantize it"
            )
        if value.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise InputError(
                f"QuantizeSave: the model's {name!r} is already quantized (held as {str(value.dtype).removeprefix('torch.')}: "
                "an FP8 file or a weight_dtype choice): load the dense checkpoint with weight_dtype default to quantize it"
            )
        out[name] = value.detach().to("cpu").contiguous()
    if not out:
        raise InputError("QuantizeSave: the model has no diffusion weights")
    return out


def output_folder() -> str:
    """ComfyUI's ``diffusion_models`` folder (the first of its paths named so)."""
    import folder_paths

    paths = folder_paths.get_folder_paths("diffusion_models")
    named = [p for p in paths if os.path.basename(os.path.normpath(p)) == "diffusion_models"]
    return (named or paths)[0]


def output_path(filename_prefix: str, format: str) -> str:
    """``<prefix>_<counter>_.<format>.safetensors`` in the folder, numbered as ComfyUI's
    savers number theirs (``folder_paths.get_save_image_path``)."""
    import folder_paths

    base = output_folder()
    try:
        folder, filename, counter, _sub, _prefix = folder_paths.get_save_image_path(filename_prefix, base)
    except Exception as exc:  # ComfyUI raises a bare Exception for a prefix leaving the folder
        raise InputError(f"QuantizeSave: filename_prefix {filename_prefix!r}: {exc}") from None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{filename}_{counter:05}_.{format}.safetensors")


def layer_errors(doc: dict) -> list[str]:
    """Every quantized layer's measured error (the report's per-layer figures), one line each."""
    rows = [r for r in doc.get("layers", []) if isinstance(r.get("output"), dict) and isinstance(r.get("weight"), dict)]
    if not rows:
        return []
    width = max(len(r["layer"]) for r in rows)
    lines = [f"per-layer relative L2 error ({len(rows)} layers):", f"  {'layer':<{width}}  format            weight   output"]
    for r in rows:
        lines.append(f"  {r['layer']:<{width}}  {r['format']:<16}  {r['weight']['rel_l2']:.4f}   {r['output']['rel_l2']:.4f}")
    return lines


def quantize_model(model, format: str, preset: str, filename_prefix: str) -> str:
    """Quantize and save; the quantizer's per-layer summary, the output's check and its path."""
    import comfy.utils
    import folder_paths

    from ..numerics.dtypes import DTYPE_NAMES
    from ..quantizer.api import quantize
    from ..quantizer.report import render_plan, render_result
    from .checking import report_text

    weights = dense_weights(model)
    held = ", ".join(sorted({DTYPE_NAMES.get(v.dtype, str(v.dtype)) for v in weights.values()}))
    temp_dir = folder_paths.get_temp_directory()
    os.makedirs(temp_dir, exist_ok=True)
    dense = os.path.join(temp_dir, f"comfyquant-dense-{uuid.uuid4().hex}.safetensors")
    try:
        comfy.utils.save_torch_file(weights, dense)
        del weights
        out = output_path(filename_prefix, format)
        planned = quantize(dense, out, format=format, preset=preset, target="comfyui", progress=False, jobs="auto", dry_run=True)
        if planned.plan is not None and planned.plan.refusal:
            raise InputError(f"QuantizeSave: {planned.plan.refusal}")
        total = max(len(planned.plan.layers), 1) if planned.plan is not None else 1
        bar = comfy.utils.ProgressBar(total)
        done = [0]

        def on_layer(_layer, _result) -> None:
            done[0] += 1
            bar.update_absolute(min(done[0], total), total)

        result = quantize(
            dense, out, format=format, preset=preset, target="comfyui", progress=False, jobs="auto", on_layer=on_layer
        )
    finally:
        try:
            os.unlink(dense)
        except FileNotFoundError:
            pass
    if not result.ok or not result.outputs or result.plan is None:
        why = result.plan.refusal if result.plan is not None and result.plan.refusal else "its check failed"
        raise InputError(f"QuantizeSave: {out}: not written: {why}")
    doc = result.to_dict()
    lines = [
        f"quantized from the model's weights as ComfyUI holds them: {held}",
        render_plan(result.plan, full=False),
        render_result(doc, result.check),
        *layer_errors(doc),
    ]
    lines += [f"wrote {p}" for p in result.outputs]
    lines.append(report_text(result.outputs[0], "comfyui"))
    return "\n".join(lines)
