"""Any ComfyUI release from the releases tarball, with the comfy-kitchen it pins, loading a
file its own way (the per-release twin of ``comfyui_driver``).

The worker imports the release's ``comfy`` package from its folder with the comfy-kitchen
release installed into a cache folder of its own (``pip install --no-deps --target``), put
first on the worker's path; releases before 0.8.0 run without comfy-kitchen (their own torch
layouts), and the environment's comfy-kitchen is hidden from them.  The steps are
``comfyui_driver``'s, taken from each release's own ``load_diffusion_model_state_dict``:
releases before 0.4.0 read the header map with ``model_detection.detect_layer_quantization``
and hand it to the operations as ``layer_quant_config``; from 0.4.0 on ``convert_old_quants``
folds it (and tensor markers) into the state dict and ``utils.detect_layer_quantization``
returns ``quant_config``.  Where the fold comes is the release's own (``folds_before_prefix``):
up to 0.18 once, after the prefix is stripped; from 0.19 before and again after.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import types
from pathlib import Path

from .comfyui_driver import _function_from, _tree
from .outcome import Outcome
from .worker import Worker

TARGET = "comfyui"


def kitchen_folder(version: str) -> Path | None:
    """comfy-kitchen ``version`` installed into the test cache (once); None when pip cannot get it."""
    import runtime_sources

    folder = runtime_sources.cache_dir() / f"comfy-kitchen-{version}"
    if (folder / "comfy_kitchen" / "__init__.py").is_file():
        return folder
    with runtime_sources._Locked(f"comfy-kitchen-{version}"):
        if (folder / "comfy_kitchen" / "__init__.py").is_file():
            return folder
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
             "--target", str(folder), f"comfy-kitchen=={version}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode:
            return None
    return folder


class ReleaseDriver(Worker):
    """A worker process with one ComfyUI release imported once; ``run`` sends it one file."""

    target = TARGET

    def __init__(self, source: Path, kitchen: str | None) -> None:
        self.version = f"ComfyUI {source.name.removeprefix('comfyui-')}" + (f" with comfy-kitchen {kitchen}" if kitchen else "")
        paths = []
        if kitchen:
            folder = kitchen_folder(kitchen)
            if folder is None:
                raise RuntimeError(f"comfy-kitchen {kitchen} could not be installed")
            paths.append(str(folder))
        args = [str(source), "1" if kitchen else "0"]
        super().__init__(sys.executable, "runtimes.comfyui_release_driver", args, self.version, paths)

    def run(self, path: Path) -> Outcome:
        return Outcome(**self.ask({"path": str(path)}, path))


class _Worker:
    def __init__(self, source: Path, kitchen: bool) -> None:
        if not kitchen:
            sys.modules["comfy_kitchen"] = None  # type: ignore[assignment]
        sys.path.insert(0, str(source))
        import logging

        logging.disable(logging.CRITICAL)
        import comfy.options
        import torch

        sys.argv = [sys.argv[0], "--cpu"]
        comfy.options.enable_args_parsing()
        import comfy.model_management as mm
        import comfy.ops
        import comfy.utils

        self.torch, self.mm, self.ops, self.utils = torch, mm, comfy.ops, comfy.utils
        detection = source / "comfy" / "model_detection.py"
        ns = {"__name__": "comfy.model_detection", "json": json, "logging": logging}
        self.unet_prefix = _function_from(detection, "unet_prefix_from_state_dict", ns)
        self.header_layers = None
        if not hasattr(comfy.utils, "convert_old_quants"):
            self.header_layers = _function_from(detection, "detect_layer_quantization", ns)
        self.fold_first = folds_before_prefix(source / "comfy" / "sd.py")
        self.device = torch.device("cpu")

    def run(self, path: str) -> dict:
        from .measure import judge, reference_input, relative_error

        torch, utils = self.torch, self.utils
        stage = "read"
        try:
            sd, metadata = utils.load_torch_file(path, return_metadata=True)
            stage = "convert"
            config = types.SimpleNamespace(quant_config=None, layer_quant_config=None)
            folds = self.header_layers is None
            if folds and self.fold_first:
                sd, metadata = utils.convert_old_quants(sd, "", metadata=metadata)
            prefix = self.unet_prefix(sd)
            temp_sd = utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
            if len(temp_sd) > 0:
                sd = temp_sd
                if folds and self.fold_first:
                    sd, metadata = utils.convert_old_quants(sd, "", metadata=metadata)
            if folds and not self.fold_first:  # once, after the prefix is stripped
                sd, metadata = utils.convert_old_quants(sd, "", metadata=metadata)
            if self.header_layers is None:
                config.quant_config = utils.detect_layer_quantization(sd, "")
                quantized = config.quant_config is not None
            else:
                config.layer_quant_config = self.header_layers(metadata)
                quantized = config.layer_quant_config is not None
            scaled_fp8 = None
            if self.header_layers is not None and "scaled_fp8" in sd:
                # before 0.4.0, model detection pops the legacy key and the ops scale by it
                marker = sd.pop("scaled_fp8")
                scaled_fp8 = torch.float8_e4m3fn if marker.dtype == torch.float32 else marker.dtype
                fp8_optimizations = marker.nelement() != 2
            stage = "load"
            supported = [torch.bfloat16, torch.float16, torch.float32]
            params = utils.calculate_parameters(sd)
            weight_dtype = None if quantized else utils.weight_dtype(sd)
            unet_dtype = self.mm.unet_dtype(model_params=params, supported_dtypes=supported, weight_dtype=weight_dtype)
            manual_cast = self.mm.unet_manual_cast(None if quantized else unet_dtype, self.device, supported)
            extra = {"scaled_fp8": scaled_fp8, "fp8_optimizations": fp8_optimizations} if scaled_fp8 is not None else {}
            ops = self.ops.pick_operations(unet_dtype, manual_cast, load_device=self.device, model_config=config, **extra)
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


def folds_before_prefix(sd_py: Path) -> bool:
    """Whether a release's ``load_diffusion_model_state_dict`` folds the markers into the state
    dict (``convert_old_quants``) before it picks the prefix to strip, as its source says: the
    releases from 0.19 do, then fold again after stripping; those from 0.4.0 to 0.18 fold once,
    after."""
    tree = ast.parse(sd_py.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_diffusion_model_state_dict")
    lines: dict[str, list[int]] = {"convert_old_quants": [], "unet_prefix_from_state_dict": []}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in lines:
            lines[node.func.attr].append(node.lineno)
    converts, picks = lines["convert_old_quants"], lines["unet_prefix_from_state_dict"]
    return bool(converts) and bool(picks) and min(converts) < min(picks)


def read_dense(path: Path) -> dict:
    """The dense layers ``Case.write`` kept beside the checkpoint (``cases.read_dense``, read
    here without ``cases``, whose fixtures import the environment's comfy-kitchen)."""
    from safetensors.torch import load_file

    flat = load_file(str(Path(path).with_suffix(".dense")))
    return {n[: -len(".weight")]: (t, flat.get(n[: -len(".weight")] + ".bias")) for n, t in flat.items() if n.endswith(".weight")}


def _serve(source: Path, kitchen: bool) -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = _Worker(source, kitchen)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps(worker.run(request["path"])) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), sys.argv[2] == "1")
