"""ComfyUI (upstream 783545f, 0.33.0) with comfy-kitchen 0.2.40, loading a file its own way.

ComfyUI's source is unpacked from its tarball (``runtime_sources.comfyui_source``) and
imported in a worker process (``python -m runtimes.comfyui_driver SOURCE``), once: the import
sets global state (layout registrations, backend choices, logging) the test process must not
inherit.  For each file the worker runs ComfyUI's own functions in ComfyUI's order:

1. read: ``comfy.utils.load_torch_file(path, return_metadata=True)``;
2. convert: the opening of ``comfy.sd.load_diffusion_model_state_dict``: ``convert_old_quants``,
   the diffusion-model prefix (``unet_prefix_from_state_dict``, loaded alone from
   ``comfy/model_detection.py``, whose module imports the model zoo) and
   ``state_dict_prefix_replace``, then ``detect_layer_quantization``;
3. load: the dtypes ``model_management`` picks for a CPU model supporting BF16/F16/F32,
   ``comfy.ops.pick_operations``, a module tree of the picked ``Linear`` at the model's layer
   names (the dense source's shapes: the model, not the file, decides them) and
   ``load_state_dict(strict=False)`` as ``BaseModel.load_model_weights`` does (a parameter the
   file does not fill keeps uninitialized memory in ComfyUI; the driver creates it as NaN, so
   that garbage is the same on every run);
4. forward: each layer's first forward under ``torch.inference_mode()`` on a seeded input,
   measured against the dense layer (``measure``).

The first exception ends the file (its stage, type and message are the outcome).
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

from .outcome import Outcome
from .worker import Worker

TARGET = "comfyui"
VERSION = "ComfyUI 0.33.0 (783545f) with comfy-kitchen 0.2.40"
MISSING = ""
"""Why the driver cannot run here (set by ``driver()``)."""


class ComfyUIDriver(Worker):
    """A worker process with ComfyUI imported once; ``run`` sends it one file at a time."""

    target = TARGET
    version = VERSION

    def __init__(self, source: Path) -> None:
        super().__init__(sys.executable, "runtimes.comfyui_driver", [str(source)], "ComfyUI")

    def run(self, path: Path) -> Outcome:
        return Outcome(**self.ask({"path": str(path)}, path))


def driver() -> ComfyUIDriver | None:
    """The driver, or None with ``MISSING`` saying why (no ComfyUI source here)."""
    global MISSING
    import runtime_sources

    source = runtime_sources.comfyui_source()
    if source is None:
        MISSING = runtime_sources.COMFYUI_MISSING
        return None
    return ComfyUIDriver(source)


# -- the worker ---------------------------------------------------------------------------------


def _function_from(path: Path, name: str, namespace: dict):
    """Define the top-level function ``name`` of the module at ``path`` alone in ``namespace``."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


class _Model:
    """A bare module tree at the given layer names."""


def _tree(torch, linear_cls, layers: dict, dtype):
    root = torch.nn.Module()
    for name, (weight, bias) in layers.items():
        parent = root
        parts = name.split(".")
        for part in parts[:-1]:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        n, k = weight.shape
        parent.add_module(parts[-1], linear_cls(k, n, bias=bias is not None, dtype=dtype))
    # a weight or bias the file does not fill keeps the memory ComfyUI's operations create it
    # with (torch.empty, their reset_parameters skipped): NaN there makes that garbage measured
    # the same way on every run.  Other parameters keep the value the operations give them (the
    # scaled-FP8 Linear of releases before 0.4.0 creates its scale_weight and scale_input as ones)
    with torch.no_grad():
        for name, param in root.named_parameters():
            if param.dtype.is_floating_point and name.rsplit(".", 1)[-1] in ("weight", "bias"):
                param.fill_(float("nan"))
    return root


class _Worker:
    def __init__(self, source: Path) -> None:
        sys.path.insert(0, str(source))
        import logging

        logging.disable(logging.CRITICAL)
        import comfy.options
        import torch

        # ComfyUI started as ``main.py --cpu``: its arguments are parsed from sys.argv
        sys.argv = [sys.argv[0], "--cpu"]
        comfy.options.enable_args_parsing()
        import comfy.model_management as mm
        import comfy.ops
        import comfy.utils

        self.torch, self.mm, self.ops, self.utils = torch, mm, comfy.ops, comfy.utils
        ns = {"__name__": "comfy.model_detection"}
        self.unet_prefix = _function_from(source / "comfy" / "model_detection.py", "unet_prefix_from_state_dict", ns)
        self.device = torch.device("cpu")

    def run(self, path: str) -> dict:
        from .cases import read_dense
        from .measure import judge, reference_input, relative_error

        torch, utils = self.torch, self.utils
        stage = "read"
        try:
            sd, metadata = utils.load_torch_file(path, return_metadata=True)
            stage = "convert"
            sd, metadata = utils.convert_old_quants(sd, "", metadata=metadata)
            prefix = self.unet_prefix(sd)
            temp_sd = utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
            if len(temp_sd) > 0:
                sd = temp_sd
                sd, metadata = utils.convert_old_quants(sd, "", metadata=metadata)
            quant_config = utils.detect_layer_quantization(sd, "")
            stage = "load"
            supported = [torch.bfloat16, torch.float16, torch.float32]
            params = utils.calculate_parameters(sd)
            weight_dtype = None if quant_config is not None else utils.weight_dtype(sd)
            unet_dtype = self.mm.unet_dtype(model_params=params, supported_dtypes=supported, weight_dtype=weight_dtype)
            if quant_config is not None:
                manual_cast = self.mm.unet_manual_cast(None, self.device, supported)
            else:
                manual_cast = self.mm.unet_manual_cast(unet_dtype, self.device, supported)

            class Config:
                pass

            config = Config()
            config.quant_config = quant_config
            ops = self.ops.pick_operations(unet_dtype, manual_cast, load_device=self.device, model_config=config)
            dense = read_dense(Path(path))
            model = _tree(torch, ops.Linear, dense, unet_dtype)
            model.load_state_dict(sd, strict=False)
            stage = "forward"
            compute = manual_cast or unet_dtype
            errors = {}
            current = None
            with torch.inference_mode():
                for current, (weight, bias) in dense.items():
                    x = reference_input(weight.shape[1], compute)
                    y = model.get_submodule(current)(x)
                    errors[current] = relative_error(y, weight, bias, x)
            return judge(errors).to_dict()
        except Exception as exc:  # the runtime's own failure is the outcome
            layer = locals().get("current") if stage == "forward" else None
            return Outcome("raises", stage, type(exc).__name__, str(exc), layer).to_dict()


def _serve(source: Path) -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever ComfyUI prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    worker = _Worker(source)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps(worker.run(request["path"])) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
