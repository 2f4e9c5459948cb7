"""Every SGLang release from 0.5.14 on, each run from its own wheel as an oracle of its Comfy readers.

Each release's wheel is downloaded once into the test cache (``pip download --no-deps``, beside the
0.5.23 wheel ``runtime_sources.sglang_wheel`` fetches). A release's *reader files* are the module
that reads Comfy checkpoints (``runtime/utils/quantization_utils.py``) and every quantization module
it imports, at any depth (``reader_modules``): releases whose reader files are byte-identical share
one digest (``reader_digest``) and so one set of verdicts.

Two kinds of reader exist:

* from 0.5.19 on, ``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization``,
  run here as ``sglang_driver`` runs 0.5.23's (the modules imported at module level are executed
  from the wheel, the rest of SGLang is stubbed);
* before, no marker reader: ``get_quant_config_from_safetensors_metadata`` picks a config from the
  header's ``_quantization_metadata`` and ``build_nvfp4_config_from_safetensors_list`` builds
  an NVFP4 one from the tensors. Both are run here, with SGLang's config registry replaced by a
  recorder: what they decide is the name of the quantization method they ask for (``None``: the
  model is built unquantized).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import sglang_driver as drv

RELEASES = ("0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
READER = "sglang.multimodal_gen.runtime.utils.quantization_utils"
_QUANT = "sglang.multimodal_gen.runtime.layers.quantization."

MISSING: dict[str, str] = {}
"""Why a release's wheel could not be had (set by ``wheel``)."""


def wheel(version: str) -> Path | None:
    """The ``sglang==version`` wheel in the test cache, downloaded once; None when the package
    index cannot be reached (the reason is ``MISSING[version]``)."""
    import runtime_sources

    folder = runtime_sources.cache_dir() / f"sglang-{version}"
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    with runtime_sources._Locked(f"sglang-{version}"):
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
        tmp = Path(tempfile.mkdtemp(prefix=".sglang-", dir=runtime_sources.cache_dir()))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check"]
                + [f"sglang=={version}", "-d", str(tmp)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wheels = sorted(tmp.glob(f"sglang-{version}-*.whl"))
            if proc.returncode or not wheels:
                last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                MISSING[version] = f"SGLang {version} wheel could not be downloaded: {last}"
                return None
            folder.mkdir(parents=True, exist_ok=True)
            final = folder / wheels[0].name
            os.replace(wheels[0], final)
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _imports(source: bytes, top_level: bool) -> Iterable[str]:
    """The modules a source imports with ``from X import``: everywhere, or only those its module
    body runs (also inside a module-level ``try``/``if``), not those inside functions."""
    tree = ast.parse(source)
    if not top_level:
        nodes: Iterable[ast.AST] = ast.walk(tree)
    else:
        nodes, todo = [], list(tree.body)
        while todo:
            node = todo.pop(0)
            nodes.append(node)
            if isinstance(node, (ast.Try, ast.If)):
                todo.extend(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def reader_modules(zf: zipfile.ZipFile, top_level: bool = False) -> list[str]:
    """The Comfy reader and the quantization modules of the wheel it imports, at any depth (with
    ``top_level``, only the imports module bodies run: what executing the reader needs)."""
    names = set(zf.namelist())
    out: list[str] = []
    todo = [READER]
    while todo:
        module = todo.pop(0)
        if module in out:
            continue
        out.append(module)
        for imported in _imports(zf.read(_path(module)), top_level):
            if imported.startswith(_QUANT) and _path(imported) in names:
                todo.append(imported)
    return out


def reader_digest(path: Path) -> str:
    """SHA-256 over the reader files of a wheel (each name and its bytes, in name order)."""
    with zipfile.ZipFile(path) as zf:
        h = hashlib.sha256()
        for module in sorted(reader_modules(zf)):
            h.update(_path(module).encode() + b"\0" + zf.read(_path(module)) + b"\0")
    return h.hexdigest()


def _executed(module: str) -> bool:
    """Whether a reader module is executed from source: the reader, the config constructors it
    calls (``configs.*``), the Comfy format modules and MXFP8's config; the layer and kernel
    modules these import are stubbed, as ``sglang_driver`` stubs them (only loading uses them)."""
    if module == READER:
        return True
    name = module.removeprefix(_QUANT)
    return name.startswith(("configs.", "comfy_", "rowwise_")) or name == "mxfp8"


class _Finder(drv._WheelFinder):
    """``sglang_driver``'s finder with this wheel's own list of modules executed from source."""

    def __init__(self, wheel: zipfile.ZipFile, label: str, values: dict[str, dict[str, Any]], real: tuple[str, ...]) -> None:
        super().__init__(wheel, label, values)
        self.real = real

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname not in self.real)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        if spec.name in self.real:
            return None
        return drv._StubModule(spec.name, self.values.get(spec.name, {}))

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ not in self.real:
            return
        path = _path(module.__name__)
        module.__file__ = f"{self.label}/{path}"
        exec(compile(self.wheel.read(path).decode("utf-8"), module.__file__, "exec"), module.__dict__)


class _Method:
    """What SGLang's config registry hands back for a quantization method: its ``from_config``
    returns the method's name, the decision the old readers make."""

    def __init__(self, name: str) -> None:
        self.name = name

    def from_config(self, *args: Any, **kwargs: Any) -> str:
        return self.name

    def get_config_filenames(self) -> list[str]:
        return []


def _literal_or(zf: zipfile.ZipFile, path: str, name: str, default: Any) -> Any:
    try:
        return drv._literal(zf.read(path).decode(), name)
    except (KeyError, LookupError):
        return default


def _quiet_logger(name: str) -> logging.Logger:
    """SGLang's logger for a reader module, silenced: the old readers log every file they cannot
    open, which the oracle records through their return values instead."""
    logger = logging.getLogger(name)
    logger.disabled = True
    return logger


class Release:
    """One SGLang release's Comfy readers, executed from its wheel."""

    def __init__(self, version: str, path: Path) -> None:
        self.version = version
        with zipfile.ZipFile(path) as zf:
            values = {
                "sglang.kernels.ops.gemm.convrot_int8": {
                    "GROUP_SIZES": _literal_or(zf, "sglang/kernels/ops/gemm/convrot_int8.py", "GROUP_SIZES", (64, 256))
                },
                "sglang.multimodal_gen.envs": {
                    "SGLANG_DIFFUSION_CONVROT_INT8_BACKEND": _literal_or(
                        zf, "sglang/multimodal_gen/envs.py", "SGLANG_DIFFUSION_CONVROT_INT8_BACKEND", "jit"
                    )
                },
                "sglang.multimodal_gen.runtime.platforms": {"current_platform": drv._NoDevice()},
                "sglang.multimodal_gen.runtime.utils.logging_utils": {"init_logger": _quiet_logger},
                "sglang.srt.utils": {"is_npu": lambda: False},
                "sglang.multimodal_gen.runtime.layers.quantization": {"get_quantization_config": _Method},
            }
            real = tuple(m for m in reader_modules(zf, top_level=True) if _executed(m))
            modules = self._load(zf, f"sglang-{version}", values, real)
        utils = modules[READER]
        self.markers = hasattr(utils, "inspect_comfy_quant_markers")
        if self.markers and version == RELEASES[-1]:
            self.oracle = drv.SGLang(path)  # the newest, with its row-wise FP8 reader: the suite's own driver
        elif self.markers:
            self.oracle = drv.SGLang.__new__(drv.SGLang)
            self.oracle.inspect_comfy_quant_markers = utils.inspect_comfy_quant_markers
            self.oracle.resolve_comfy_checkpoint_quantization = utils.resolve_comfy_checkpoint_quantization
            self.oracle.rowwise_config = None  # no row-wise reader before the newest release
        else:
            self.from_metadata = utils.get_quant_config_from_safetensors_metadata
            self.nvfp4 = utils.build_nvfp4_config_from_safetensors_list

    @staticmethod
    def _load(zf: zipfile.ZipFile, label: str, values: dict[str, dict[str, Any]], real: tuple[str, ...]) -> dict:
        finder = _Finder(zf, label, values, real)
        saved = {name: mod for name, mod in sys.modules.items() if name == "sglang" or name.startswith("sglang.")}
        for name in saved:
            del sys.modules[name]
        sys.meta_path.insert(0, finder)
        try:
            return {name: importlib.import_module(name) for name in real}
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[name]
            sys.modules.update(saved)

    def outcome(self, paths: list[str]) -> Outcome:
        """What this release's readers do with the checkpoint made of ``paths``."""
        if self.markers:
            r = self.oracle.outcome(paths)
            return Outcome(r.exception, r.message, r.config)
        methods = []
        try:
            methods.append(self.from_metadata(paths[0]))
            methods.append(self.nvfp4(paths))
        except Exception as exc:  # the oracle records whatever SGLang raises
            return Outcome(type(exc).__name__, str(exc), None)
        chosen = [m for m in methods if m is not None]
        return Outcome(None, None, chosen[0] if chosen else None)


class Outcome:
    """A release's outcome on one file: the exception it raises (type and message), or the config
    it resolves (a config class name, or for releases before 0.5.19 a quantization method name;
    None when the model is built unquantized)."""

    __slots__ = ("exception", "message", "config")

    def __init__(self, exception: str | None, message: str | None, config: str | None) -> None:
        self.exception, self.message, self.config = exception, message, config

    @property
    def raises(self) -> bool:
        return self.exception is not None

    def __repr__(self) -> str:
        return f"raises {self.exception}: {self.message}" if self.raises else f"config {self.config}"


_LOADED: dict[str, Release] = {}


def release(version: str) -> Release | None:
    """The release's readers, loaded once per process; None when its wheel cannot be had."""
    if version not in _LOADED:
        path = wheel(version)
        if path is None:
            return None
        _LOADED[version] = Release(version, path)
    return _LOADED[version]
