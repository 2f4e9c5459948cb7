"""ComfyUI (upstream 783545f, 0.33.0) with comfy-kitchen 0.2.40, loading and running a whole
model file its own way: the oracle of the whole-model space (``whole_models``).

A worker process in ComfyUI's own environment (``comfyui_env``) imports ComfyUI once, started
as ``main.py --cpu``, and for each file runs ComfyUI's whole path:

1. ``comfy.sd.load_diffusion_model(path)``: read (``load_torch_file``), the diffusion-model
   prefix, detection (``model_detection``: the architecture and its dimensions from the
   tensors; ``RuntimeError: ERROR: Could not detect model type of: ...`` when nothing
   matches), the real model of the detected size, its weights loaded in module-registration
   order (``BaseModel.load_model_weights``, ``load_state_dict(strict=False)``);
2. ``comfy.model_management.load_models_gpu([patcher])``;
3. ``model.apply_model(...)`` on a seeded latent, timestep and text context (Flux: pooled
   vector and guidance too), of the sizes the dense model takes.

The stage of a raised exception (read / detect / load / forward) is told by where it was
raised.  A run that computes is judged against the dense model: forward hooks record each
linear layer's input and output, and the layer's output is compared with the dense layer's on
the same input (``measure.relative_error``); the model's output with the dense model's
(computed once by the same path).  Parameters ComfyUI reports it did not fill (``unet
missing: [...]``, logged by ``load_model_weights``) make the outcome ``undefined``: ComfyUI
computes with uninitialised memory there, whatever it happens to hold.

The same worker runs any release from the releases tarball (``release_driver``): its source
folder in place of the cache's, with the comfy-kitchen its group pins first on the worker's
path (``comfyui_release_driver.kitchen_folder``), or, for releases before comfy-kitchen, with
the environment's comfy-kitchen hidden from it.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import traceback
from pathlib import Path

from .outcome import GARBAGE, Outcome
from .worker import Worker

TARGET = "comfyui"
VERSION = "ComfyUI 0.33.0 (783545f) with comfy-kitchen 0.2.40, whole models"
MISSING = ""
"""Why the driver cannot run here (set by ``driver()``)."""

DEGRADED = 0.3
"""Relative error from which a layer or the model works but clearly worse than any format's
usual error (as ``measure.DEGRADED``)."""


class ModelDriver(Worker):
    """A worker process in ComfyUI's environment; ``run`` sends it one file at a time."""

    target = TARGET
    version = VERSION
    close_timeout = 60

    def __init__(
        self, python: Path, source: Path, kitchen: Path | None = None, hide_kitchen: bool = False, version: str = VERSION
    ) -> None:
        """ComfyUI from ``source``; ``kitchen``: a folder holding the comfy-kitchen to import
        instead of the environment's; ``hide_kitchen``: no comfy-kitchen at all."""
        self.version = version
        paths = [str(kitchen)] if kitchen is not None else []
        args = [str(source), "0" if hide_kitchen else "1"]
        super().__init__(python, "runtimes.comfyui_models", args, version.removesuffix(", whole models"), paths)

    def run(self, path: Path, dense: Path, reference: Path | None = None) -> Outcome:
        """What ComfyUI does with the file at ``path``, measured against the dense model at
        ``dense`` (with ``reference``'s tensors in place of the dense model's, where given)."""
        request = {"path": str(path), "dense": str(dense), "reference": None if reference is None else str(reference)}
        return Outcome(**self.ask(request, path))


def driver() -> ModelDriver | None:
    """The driver, or None with ``MISSING`` saying why (no ComfyUI source or environment here)."""
    global MISSING
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import comfyui_env
    import runtime_sources

    python = comfyui_env.comfyui_python()
    if python is None:
        MISSING = comfyui_env.MISSING
        return None
    return ModelDriver(python, runtime_sources.comfyui_source())


def release_version(group) -> str:
    """The pairing a release group's driver runs: its first release and its comfy-kitchen."""
    kitchen = f"with comfy-kitchen {group.kitchen}" if group.kitchen else "without comfy-kitchen"
    return f"ComfyUI {group.first} {kitchen}, whole models"


def release_driver(root: Path, group) -> ModelDriver | None:
    """The driver of a release group (``comfyquant.targets.comfyui_releases.GROUPS``): its first
    release's source under ``root`` (``releases.releases_root``) in ComfyUI's environment, with
    the comfy-kitchen the group pins; None with ``MISSING`` saying why it cannot run here."""
    global MISSING
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import comfyui_env

    from .comfyui_release_driver import kitchen_folder

    python = comfyui_env.comfyui_python()
    if python is None:
        MISSING = comfyui_env.MISSING
        return None
    source = root / f"comfyui-{group.first}"
    if not source.is_dir():
        MISSING = f"ComfyUI {group.first} is not in the releases ({root})"
        return None
    kitchen = None
    if group.kitchen:
        kitchen = kitchen_folder(group.kitchen)
        if kitchen is None:
            MISSING = f"comfy-kitchen {group.kitchen} could not be installed"
            return None
    return ModelDriver(python, source, kitchen, hide_kitchen=not group.kitchen, version=release_version(group))


# -- the worker ---------------------------------------------------------------------------------


class _Log:
    """What ComfyUI logged while loading one file (the parameters it did not fill)."""

    def __init__(self) -> None:
        import logging

        class Handler(logging.Handler):
            def emit(inner, record) -> None:
                self.records.append(record.getMessage())

        self.records: list[str] = []
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(Handler(logging.INFO))
        root.setLevel(logging.INFO)

    def missing(self) -> list[str]:
        out: list[str] = []
        for message in self.records:
            if message.startswith("unet missing: "):
                out.extend(ast.literal_eval(message[len("unet missing: ") :]))
        return out


def _stage_of(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.name == "load_torch_file" for f in frames):
        return "read"
    if str(exc).startswith("ERROR: Could not detect model type of:") or any(
        f.filename.endswith("model_detection.py") for f in frames
    ):
        return "detect"
    return "load"


class _Worker:
    def __init__(self, source: Path, kitchen: bool = True) -> None:
        if not kitchen:
            sys.modules["comfy_kitchen"] = None  # type: ignore[assignment]
        sys.path.insert(0, str(source))
        import comfy.options

        # ComfyUI started as ``main.py --cpu``: its arguments are parsed from sys.argv
        sys.argv = [sys.argv[0], "--cpu"]
        comfy.options.enable_args_parsing()
        self.log = _Log()
        import comfy.model_management
        import comfy.sd
        import torch
        from safetensors.torch import load_file

        # one thread: the test process computes comfyquant's verdicts on the other core meanwhile
        torch.set_num_threads(1)
        self.torch, self.sd, self.mm, self.load_file = torch, comfy.sd, comfy.model_management, load_file
        self.outputs: dict[str, object] = {}
        """Dense file -> the dense model's output (computed once)."""

    def inputs(self, dense: dict) -> dict:
        """The seeded inputs of one step, sized for the dense model (what ComfyUI's text
        encoders and latents give it)."""
        torch = self.torch
        gen = torch.Generator().manual_seed(0)
        if "img_in.weight" in dense:  # Flux
            c = dense["img_in.weight"].shape[1] // 4
            out = {
                "x": torch.randn(1, c, 8, 8, generator=gen),
                "c_crossattn": torch.randn(1, 8, dense["txt_in.weight"].shape[1], generator=gen),
                "guidance": torch.tensor([3.5]),
            }
            if "vector_in.in_layer.weight" in dense:
                out["y"] = torch.randn(1, dense["vector_in.in_layer.weight"].shape[1], generator=gen)
            return out
        c = dense["patch_embedding.weight"].shape[1]
        return {
            "x": torch.randn(1, c, 1, 8, 8, generator=gen),
            "c_crossattn": torch.randn(1, 8, dense["text_embedding.0.weight"].shape[1], generator=gen),
        }

    def forward(self, patcher, dense: dict):
        """One step of the loaded model: (its diffusion model's output, each measured linear
        layer's (input, output) pairs).  Hooks only record (the measuring is done after the
        step, outside ComfyUI's path: an error of the harness is never taken for ComfyUI's);
        an exception raised in the step carries the layer that was running (``layer``)."""
        torch = self.torch
        net = patcher.model.diffusion_model
        seen: dict[str, list] = {}
        running: list[str] = []
        handles = []
        captured = {}

        def pre(name):
            def hook(module, args):
                running.append(name)

            return hook

        def post(name):
            def hook(module, args, output):
                running.pop()
                # copies: the model may change a tensor in place after the layer ran
                x = args[0] if args else None
                seen.setdefault(name, []).append(tuple(t.clone() if torch.is_tensor(t) else None for t in (x, output)))

            return hook

        for name, module in net.named_modules():
            if name and hasattr(module, "weight") and f"{name}.weight" in dense and dense[f"{name}.weight"].dim() == 2:
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name)))
        handles.append(net.register_forward_hook(lambda m, a, out: captured.__setitem__("out", out)))
        inputs = self.inputs(dense)
        x = inputs.pop("x")
        try:
            with torch.inference_mode():
                patcher.model.apply_model(x, torch.tensor([0.5]), **inputs)
        except Exception as exc:
            exc.layer = running[-1] if running else None
            raise
        finally:
            for h in handles:
                h.remove()
        return captured.get("out"), seen

    def errors(self, seen: dict, dense: dict) -> dict[str, float]:
        """Each layer's worst relative error against the dense layer on the same inputs."""
        torch = self.torch
        out = {}
        for name, calls in seen.items():
            weight, bias = dense[f"{name}.weight"], dense.get(f"{name}.bias")
            worst = 0.0
            for x, y in calls:
                if torch.is_tensor(x) and torch.is_tensor(y):
                    worst = max(worst, _relative(torch, y, x, weight, bias))
            out[name] = worst
        return out

    def dense_output(self, dense_path: str, dense: dict):
        """The dense model's output by this ComfyUI; None when this ComfyUI cannot load or run
        the dense model itself (an older release that does not detect the space's layout):
        a file it computes with is then judged by its layers alone."""
        if dense_path not in self.outputs:
            try:
                patcher = self.sd.load_diffusion_model(dense_path)
                self.mm.load_models_gpu([patcher])
                self.outputs[dense_path] = self.forward(patcher, dense)[0].float()
            except Exception:
                self.outputs[dense_path] = None
            finally:
                self.mm.unload_all_models()
        return self.outputs[dense_path]

    def run(self, path: str, dense_path: str, reference: str | None) -> dict:
        torch = self.torch
        dense = self.load_file(dense_path)
        if reference:
            dense.update(self.load_file(reference))
        expected = self.dense_output(dense_path, dense)
        self.log.records.clear()
        stage, arch = "read", None
        try:
            try:
                patcher = self.sd.load_diffusion_model(path)
            except Exception as exc:
                stage = _stage_of(exc)
                raise
            arch = _architecture(patcher.model.model_config)
            stage = "load"
            self.mm.load_models_gpu([patcher])
            missing = self.log.missing()
            stage = "forward"
            out, seen = self.forward(patcher, dense)
        except Exception as exc:  # the runtime's own failure is the outcome
            layer = getattr(exc, "layer", None)
            return Outcome("raises", stage, type(exc).__name__, str(exc), layer, architecture=arch).to_dict()
        finally:
            self.mm.unload_all_models()
        errors = self.errors(seen, dense)
        model_error = None if expected is None else _relative_output(torch, out, expected)
        layer = max(errors, key=lambda n: errors[n]) if errors else None
        worst = errors[layer] if layer is not None else None
        common = dict(layer=layer, error=worst, model_error=model_error, architecture=arch)
        if missing:
            # what the unfilled memory computes is not the file's doing: no error is recorded
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            first = missing[0].rsplit(".", 1)[0]
            return Outcome("undefined", message=f"not in the file: {shown}", layer=first, architecture=arch).to_dict()
        whole = model_error or 0.0
        if worst == float("inf") or whole == float("inf"):
            return Outcome("garbage", message="non-finite or misshapen output", **common).to_dict()
        if (worst or 0.0) >= GARBAGE or whole >= GARBAGE:
            which = f"layer {worst:.3g}" if (worst or 0.0) >= GARBAGE else f"model {whole:.3g}"
            return Outcome("garbage", message=f"relative error {which}", **common).to_dict()
        if (worst or 0.0) >= DEGRADED or whole >= DEGRADED:
            return Outcome("degraded", **common).to_dict()
        return Outcome("ok", **common).to_dict()


def _architecture(config) -> str:
    """The detected model class and the dimensions detection read."""
    unet = config.unet_config
    keys = ("hidden_size", "depth", "depth_single_blocks", "context_in_dim", "vec_in_dim", "dim", "ffn_dim", "num_layers")
    dims = ",".join(f"{k}={unet[k]}" for k in keys if k in unet)
    return f"{type(config).__name__}({dims})"


def _relative(torch, output, x, weight, bias) -> float:
    """``|y - y_ref| / |y_ref|`` of one layer's output against the dense layer's F32 output on
    the same input; inf when the output is not finite or of another shape."""
    x = x.float()
    if x.shape[-1] != weight.shape[1]:
        return float("inf")
    ref = torch.nn.functional.linear(x, weight.float(), None if bias is None else bias.float())
    y = output.float()
    if y.shape != ref.shape or not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def _relative_output(torch, out, expected) -> float:
    if out is None or not torch.is_tensor(out):
        return float("inf")
    out = out.float()
    if out.shape != expected.shape or not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out - expected).norm() / expected.norm().clamp_min(1e-30))


def _serve(source: Path, kitchen: bool) -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever ComfyUI prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    worker = _Worker(source, kitchen)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps(worker.run(request["path"], request["dense"], request.get("reference"))) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), sys.argv[2] != "0")
