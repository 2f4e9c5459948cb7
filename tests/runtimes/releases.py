"""ComfyUI's releases from their tarball, and the code in each that decides quantized loading.

The releases tarball (``COMFYQUANT_COMFYUI_RELEASES``, default the one beside the project,
``../shared/runtimes/comfyui-releases.tar.xz``) holds one folder per release. Its files change
from release to release for reasons that have nothing to do with quantized loading (new model
classes in ``model_detection.py``, offloading in ``ops.py``): a release's *deciding code* is the
source text of the definitions its single-layer loading path runs, each module's entry points
and every top-level definition of the same module they name, transitively
(``DECIDING``).  Two releases whose deciding code is byte-identical and which pin the same
comfy-kitchen load every file alike, so they form one group (``groups``); the product records
the groups in ``comfyquant.targets.comfyui_releases`` and ``tests/test_comfyui_releases.py``
proves them from the tarball.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from pathlib import Path

import runtime_sources

WHOLE = ("comfy/quant_ops.py", "comfy/float.py")
"""Files whose every line can decide a quantized layer (layouts, registrations, casts)."""

DECIDING: dict[str, tuple[str, ...]] = {
    "comfy/utils.py": (
        "load_torch_file",
        "convert_old_quants",
        "detect_layer_quantization",
        "state_dict_prefix_replace",
        "calculate_parameters",
        "weight_dtype",
    ),
    "comfy/ops.py": ("pick_operations", "mixed_precision_ops", "cast_bias_weight", "manual_cast", "disable_weight_init"),
    "comfy/model_detection.py": ("unet_prefix_from_state_dict", "detect_layer_quantization"),
    "comfy/sd.py": ("load_diffusion_model_state_dict",),
    "comfy/model_management.py": ("unet_dtype", "unet_manual_cast"),
    "comfy/model_base.py": ("BaseModel.load_model_weights",),
}
"""Per module, the entry points of the loading path the agreement driver runs
(``tests/runtimes/comfyui_driver.py``): read, convert, detect the quantization, pick the
operations, build and load the layers, run them."""


def releases_tarball() -> Path:
    env = os.environ.get("COMFYQUANT_COMFYUI_RELEASES")
    return Path(env) if env else runtime_sources.ROOT.parent / "shared" / "runtimes" / "comfyui-releases.tar.xz"


MISSING = ""
"""Why the releases are not available (set by ``releases_root``)."""


def releases_root() -> Path | None:
    """The folder holding ``comfyui-<version>/`` per release, unpacked once into the test cache
    (atomically); None when the tarball is absent."""
    global MISSING
    tarball = releases_tarball()
    target = runtime_sources.cache_dir() / "comfyui-releases"
    if (target / "comfyui-0.33.0" / "comfy").is_dir():
        return target
    if not tarball.is_file():
        MISSING = f"ComfyUI releases tarball not found at {tarball} (set COMFYQUANT_COMFYUI_RELEASES)"
        return None
    runtime_sources.unpack_once(tarball, target, target / "comfyui-0.33.0" / "comfy", "comfyui-releases")
    return target


def releases_root_or_skip() -> Path:
    """``releases_root``, or the calling test skips saying why (under CI it fails instead:
    ``runtime_sources.skip_missing``)."""
    found = releases_root()
    if found is None:
        runtime_sources.skip_missing(MISSING)
    return found


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def versions(root: Path) -> list[str]:
    """The releases in the tarball, oldest first."""
    found = [p.name.removeprefix("comfyui-") for p in root.iterdir() if p.name.startswith("comfyui-")]
    return sorted(found, key=_key)


_KITCHEN = re.compile(r"^comfy-kitchen\s*(==|>=)\s*([0-9.]+)", re.I | re.M)


def kitchen_requirement(source: Path) -> tuple[str, str] | None:
    """(``==`` or ``>=``, version) of the comfy-kitchen a release's requirements name."""
    m = _KITCHEN.search((source / "requirements.txt").read_text())
    return (m.group(1), m.group(2)) if m else None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _definitions(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """Top-level statements by the names they define (functions, classes, assignments)."""
    out: dict[str, list[ast.stmt]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, []).append(node)
    return out


def deciding_text(path: Path, entries: tuple[str, ...]) -> str:
    """The source of ``entries`` in the module at ``path`` (a top-level name, or
    ``Class.method``) and of every top-level definition they name, transitively, in file order
    ("" for an entry the module lacks)."""
    text = path.read_text()
    tree = ast.parse(text)
    defs = _definitions(tree)
    for entry in entries:
        cls, _, method = entry.partition(".")
        if method:
            node = next((n for n in defs.get(cls, ()) if isinstance(n, ast.ClassDef)), None)
            found = [m for m in (node.body if node else ()) if getattr(m, "name", None) == method]
            defs[entry] = found
    seen: set[str] = set()
    todo = [e for e in entries if defs.get(e)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in defs[name]:
            todo.extend(n for n in _names(node) if n in defs and n not in seen)
    nodes = sorted({id(n): n for name in seen for n in defs[name]}.values(), key=lambda n: n.lineno)
    return "\n".join(ast.get_source_segment(text, n) or "" for n in nodes)


def fingerprint(source: Path) -> str:
    """A digest of a release's deciding code and the comfy-kitchen it names."""
    h = hashlib.sha256()
    for rel in WHOLE:
        p = source / rel
        h.update(rel.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"") + b"\0")
    for rel, entries in DECIDING.items():
        p = source / rel
        h.update(rel.encode() + b"\0" + (deciding_text(p, entries).encode() if p.is_file() else b"") + b"\0")
    h.update(repr(kitchen_requirement(source)).encode())
    return h.hexdigest()[:16]


def groups(root: Path) -> list[list[str]]:
    """Consecutive releases with the same fingerprint, oldest first."""
    out: list[list[str]] = []
    last = None
    for v in versions(root):
        fp = fingerprint(root / f"comfyui-{v}")
        if fp == last:
            out[-1].append(v)
        else:
            out.append([v])
        last = fp
    return out
