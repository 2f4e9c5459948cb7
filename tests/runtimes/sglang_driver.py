"""SGLang 0.5.23's own marker functions, run on real files as the oracle of comfyquant's SGLang verdicts.

The wheel (``runtime_sources.sglang_wheel``) is opened as a zip and only the modules that hold
``inspect_comfy_quant_markers``, ``resolve_comfy_checkpoint_quantization``,
``get_quant_config_from_safetensors_metadata`` (whose rowwise FP8 reader, ``rowwise_fp8.py``,
SGLang runs on a file's header map before any Comfy marker) and the config constructors they
call are executed from its source (``REAL``). Every other ``sglang.*`` module
they import is a stub made here: the kernels, layers and model classes those modules import are
used by later stages (building layers, loading weights, running kernels), not by these functions.
The few stub values these functions do read are SGLang's own: the JIT kernel group sizes and the
default ConvRot INT8 backend are read from their source files in the wheel, and the platform is a
machine without MPS or CUDA, where neither config constructor makes a device check. ``torch``
and ``safetensors`` are the real, installed libraries, as SGLang opens files with them.

What SGLang does after these functions (building each layer from its marker, loading the weights)
is not run here: comfyquant models it from SGLang's source, and its verdicts say so.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import logging
import os
import sys
import types
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .outcome import Expected, expected
from .outcome import Outcome as SharedOutcome

SGLANG = "0.5.23"

_QUANT = "sglang.multimodal_gen.runtime.layers.quantization"
REAL = (
    "sglang.multimodal_gen.runtime.utils.quantization_utils",
    f"{_QUANT}.configs.base_config",
    f"{_QUANT}.rowwise_fp8",
    f"{_QUANT}.comfy_int8",
    f"{_QUANT}.configs.convrot_int8_config",
    f"{_QUANT}.configs.kitchen_w4a8_config",
    f"{_QUANT}.configs.kitchen_w4a4_config",
    f"{_QUANT}.comfy_fp8",
    f"{_QUANT}.comfy_nvfp4",
    f"{_QUANT}.mxfp8",
)
"""The modules executed from the wheel's source, in the order they are imported."""


def _source_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _literal(source: str, name: str) -> Any:
    """The literal value a module or class body assigns to ``name`` (read, never executed)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} is not assigned a literal in the SGLang source")


class _Stub:
    """Anything a stubbed SGLang module exports: a base class, a decorator-free callable or a
    value the marker functions never read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()


class _StubModule(types.ModuleType):
    """A stubbed ``sglang`` module (a package, so its submodules import): each name it is asked
    for is a fresh stub class, unless ``values`` gives SGLang's own value."""

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in _GIVEN:  # a submodule whose values are SGLang's own
            return importlib.import_module(f"{self.__name__}.{name}")
        stub = type(name, (_Stub,), {"__module__": self.__name__})
        setattr(self, name, stub)
        return stub


_GIVEN = (
    "sglang.kernels.ops.gemm.convrot_int8",
    "sglang.multimodal_gen.envs",
    "sglang.multimodal_gen.runtime.platforms",
    "sglang.multimodal_gen.runtime.utils.logging_utils",
    "sglang.srt.utils",
)
"""The stubbed modules that carry values of SGLang's own (``SGLang.__init__``)."""


class _NoDevice:
    """SGLang's ``current_platform`` on a machine with neither MPS nor CUDA: the config
    constructors then make no device check (a CUDA device of capability >= 10.0 passes them
    all the same)."""

    def is_mps(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return False

    def is_npu(self) -> bool:
        return False

    def is_hip(self) -> bool:
        return False

    def get_device_capability(self) -> None:
        return None


class _WheelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``sglang.*``: the ``REAL`` modules from the wheel's source, every other one as a stub."""

    def __init__(self, wheel: zipfile.ZipFile, label: str, values: dict[str, dict[str, Any]]) -> None:
        self.wheel = wheel
        self.label = label
        self.values = values

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname not in REAL)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        if spec.name in REAL:
            return None
        return _StubModule(spec.name, self.values.get(spec.name, {}))

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ not in REAL:
            return
        path = _source_path(module.__name__)
        code = compile(self.wheel.read(path).decode("utf-8"), f"{self.label}/{path}", "exec")
        module.__file__ = f"{self.label}/{path}"
        exec(code, module.__dict__)


class SGLang:
    """SGLang's own ``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization``,
    executed from the wheel at ``wheel``."""

    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            jit_groups = _literal(zf.read("sglang/kernels/ops/gemm/convrot_int8.py").decode(), "GROUP_SIZES")
            backend = _literal(zf.read("sglang/multimodal_gen/envs.py").decode(), "SGLANG_DIFFUSION_CONVROT_INT8_BACKEND")
            values = {
                "sglang.kernels.ops.gemm.convrot_int8": {"GROUP_SIZES": jit_groups},
                "sglang.multimodal_gen.envs": {"SGLANG_DIFFUSION_CONVROT_INT8_BACKEND": backend},
                "sglang.multimodal_gen.runtime.platforms": {"current_platform": _NoDevice()},
                "sglang.multimodal_gen.runtime.utils.logging_utils": {"init_logger": logging.getLogger},
                "sglang.srt.utils": {"is_npu": lambda: False},
            }
            modules = self._load(zf, wheel.name, values)
            self.dequantize_rowwise_fp8_weight = _function(zf, wheel.name, _WEIGHT_ONLY_FP8, "dequantize_rowwise_fp8_weight")
        self.modules = modules
        utils = modules["sglang.multimodal_gen.runtime.utils.quantization_utils"]
        self.get_quant_config_from_safetensors_metadata: Callable[[str], Any] = utils.get_quant_config_from_safetensors_metadata
        self.rowwise_config = modules[f"{_QUANT}.rowwise_fp8"].RowwiseFp8Config
        self.inspect_comfy_quant_markers: Callable[..., dict[str, dict[str, Any]]] = utils.inspect_comfy_quant_markers
        self.resolve_comfy_checkpoint_quantization: Callable[[dict], Any] = utils.resolve_comfy_checkpoint_quantization

    @staticmethod
    def _load(zf: zipfile.ZipFile, label: str, values: dict[str, dict[str, Any]]) -> dict[str, types.ModuleType]:
        """Import the ``REAL`` modules through a finder that lives only for this call; afterwards
        no ``sglang`` module stays in ``sys.modules`` (the functions keep their own globals)."""
        finder = _WheelFinder(zf, label, values)
        saved = {name: mod for name, mod in sys.modules.items() if name == "sglang" or name.startswith("sglang.")}
        for name in saved:
            del sys.modules[name]
        sys.meta_path.insert(0, finder)
        try:
            for name in REAL:
                importlib.import_module(name)
            # every sglang module now imported (the REAL ones and their stubs): functions that
            # import lazily (the rowwise FP8 reader) find them again through ``installed``
            return {n: m for n, m in sys.modules.items() if n == "sglang" or n.startswith("sglang.")}
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[name]
            sys.modules.update(saved)

    def serialized(self, paths: list[str]) -> Result | None:
        """What ``get_quant_config_from_safetensors_metadata`` does with each shard when a shard's
        header map is SGLang's rowwise FP8 map (it raises in, or returns, the rowwise reader's
        config); None when no shard is read that way (SGLang goes on to the Comfy markers)."""
        if self.rowwise_config is None:  # a release without the row-wise reader
            return None
        built = False
        saved = {n: m for n, m in sys.modules.items() if n == "sglang" or n.startswith("sglang.")}
        sys.modules.update(self.modules)
        try:
            for path in paths:
                try:
                    config = self.get_quant_config_from_safetensors_metadata(path)
                except Exception as exc:  # the oracle records whatever SGLang raises
                    if _in_rowwise_reader(exc):
                        return Result("serialized", type(exc).__name__, str(exc))
                    continue
                built = built or isinstance(config, self.rowwise_config)
        finally:
            for name in self.modules:
                del sys.modules[name]
            sys.modules.update(saved)
        return Result("ok", config="RowwiseFp8Config") if built else None

    def outcome(self, paths: Iterable[str | Path], param_name_mapper: Callable[[str], str] | None = None) -> Result:
        """What SGLang does with the checkpoint made of ``paths`` (its shards): its rowwise FP8
        reader when a header map declares that format, else its two Comfy marker functions."""
        files = [str(p) for p in paths]
        rowwise = self.serialized(files)
        if rowwise is not None:
            return rowwise
        try:
            markers = self.inspect_comfy_quant_markers(files, param_name_mapper)
        except Exception as exc:  # the oracle records whatever SGLang raises
            return Result("inspect", type(exc).__name__, str(exc))
        snapshot = _plain(markers)
        try:
            config = self.resolve_comfy_checkpoint_quantization(markers)
        except Exception as exc:
            return Result("resolve", type(exc).__name__, str(exc), markers=snapshot)
        return Result("ok", markers=snapshot, config=None if config is None else type(config).__name__)


_WEIGHT_ONLY_FP8 = f"{_QUANT}.weight_only_fp8"
"""The module whose ``dequantize_rowwise_fp8_weight`` is how SGLang's FP8 linear turns a rowwise
FP8 weight into its dense weight (``weight.to(dtype) * weight_scale.to(dtype)[:, None]``)."""


def _function(zf: zipfile.ZipFile, label: str, module: str, name: str) -> Callable[..., Any]:
    """The top-level function ``name`` of ``module`` in the wheel, defined alone (its module
    imports SGLang's kernels) with the real ``torch`` as its only global."""
    import torch

    path = _source_path(module)
    tree = ast.parse(zf.read(path).decode("utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module([node], []), f"{label}/{path}", "exec"), namespace)
    return namespace[name]


def _in_rowwise_reader(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the rowwise FP8 reader (``rowwise_fp8.py``, or the
    builder call that hands it the file's tensor header)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.endswith("rowwise_fp8.py") or (
            code.co_name == "<lambda>" and code.co_filename.endswith("quantization_utils.py")
        ):
            return True
        tb = tb.tb_next
    return False


def _plain(markers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A copy of the marker dict as inspect returned it (resolve must not be able to change it)."""
    return {prefix: dict(marker) for prefix, marker in markers.items()}


class Result:
    """One file's outcome: where SGLang stopped (``inspect``, ``resolve`` or ``ok``), the exception
    it raised (type name and message), or the markers inspect returned and the config resolve built
    (its class name; None for an unquantized checkpoint)."""

    __slots__ = ("stage", "exception", "message", "markers", "config")

    def __init__(
        self,
        stage: str,
        exception: str | None = None,
        message: str | None = None,
        markers: dict[str, dict[str, Any]] | None = None,
        config: str | None = None,
    ) -> None:
        self.stage = stage
        self.exception = exception
        self.message = message
        self.markers = markers
        self.config = config

    @property
    def raises(self) -> bool:
        return self.exception is not None

    def shared(self) -> SharedOutcome:
        """As the ``Outcome`` every driver returns: a file safetensors refuses fails at ``read``,
        everything else these functions raise at ``load``."""
        if not self.raises:
            return SharedOutcome("ok")
        stage = "read" if self.exception == "SafetensorError" else "load"
        return SharedOutcome("raises", stage, self.exception, self.message or "")

    def __repr__(self) -> str:
        if self.raises:
            return f"Result({self.stage}: {self.exception}: {self.message})"
        return f"Result(ok, config={self.config})"


TARGET = "sglang"
VERSION = f"SGLang {SGLANG}"
MISSING = ""
"""Why SGLang's functions cannot run here (set when ``driver()`` returns None)."""

LATER = frozenset({"B1", "B2", "B3", "B4", "B5", "B6", "incomplete"})
"""comfyquant's SGLang rules for what SGLang does after these two functions (building each layer,
loading its weights): modelled from SGLang's source, not run here."""

_LOADED: dict[Path, SGLang] = {}


def sglang() -> SGLang | None:
    """The oracle, loaded once per process; None when the wheel cannot be had (the reason is
    ``MISSING``). ``COMFYQUANT_SGLANG_WHEEL`` names another SGLang wheel to prove the verdicts
    against (``VERSION`` then names its version); by default the 0.5.23 wheel is downloaded."""
    global MISSING, VERSION
    import runtime_sources

    given = os.environ.get("COMFYQUANT_SGLANG_WHEEL")
    if given:
        wheel: Path | None = Path(given)
        if not wheel.is_file():
            MISSING = f"COMFYQUANT_SGLANG_WHEEL names no file: {given}"
            return None
        VERSION = f"SGLang {wheel.name.split('-')[1]}"
    else:
        wheel = runtime_sources.sglang_wheel()
        if wheel is None:
            MISSING = runtime_sources.SGLANG_MISSING
            return None
    if wheel not in _LOADED:
        _LOADED[wheel] = SGLang(wheel)
    return _LOADED[wheel]


class Driver:
    """The runtime driver of ``runtimes.agreement``: one file in, the shared ``Outcome`` out."""

    def __init__(self, oracle: SGLang) -> None:
        self.oracle = oracle

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, path: str | Path) -> SharedOutcome:
        return self.oracle.outcome([path]).shared()

    def predict(self, verdict: dict | None) -> Expected:
        """What ``runtimes.agreement`` compares with the outcome (``predict``)."""
        return predict(verdict)


def predict(verdict: dict | None) -> Expected:
    """comfyquant's verdict as far as SGLang's two functions go: a first failure from a later
    stage (a rule in ``LATER``, or garbage computed without an exception: the values, read with
    ``--deep``) means both functions pass."""
    if verdict is not None and not verdict["loads"]:
        if not verdict.get("exception") or (verdict.get("rule") or "").split(".", 1)[-1] in LATER:
            return Expected("loads")
    return expected(verdict)


def driver() -> Driver | None:
    oracle = sglang()
    return None if oracle is None else Driver(oracle)
