"""comfy-kitchen's releases from the package index, and the code in each that the kitchen target models.

Each release's wheel is downloaded once (``pip download --no-deps``) and only its Python
sources are kept in the test cache (``comfy-kitchen-src-<version>/comfy_kitchen``): on CPU the
eager backend is all that runs, and the CUDA extension of the wheel is never loaded.  A
release's *deciding code* (``DECIDING``) is the modules that build a layer's layout and run its
first forward on the eager backend; releases whose deciding code is byte-identical form one
group (``digest``), which ``comfyquant.targets.kitchen_releases.GROUPS`` records.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "comfy_kitchen"

RELEASES = tuple(
    "0.1.2 0.1.3 0.1.4 0.1.5 0.1.6 0.2.0 0.2.1 0.2.2 0.2.3 0.2.4 0.2.5 0.2.6 0.2.7 0.2.8 0.2.9 0.2.10 0.2.11 0.2.12 "
    "0.2.13 0.2.14 0.2.15 0.2.16 0.2.17 0.2.18 0.2.19 0.2.20 0.2.21 0.2.22 0.2.23 0.2.24 0.2.25 0.2.26 0.2.27 0.2.28 "
    "0.2.30 0.2.31 0.2.32 0.2.33 0.2.34 0.2.35 0.2.36 0.2.37 0.2.38 0.2.39 0.2.40".split()
)
"""Every comfy-kitchen release the package index has (``pip index versions comfy-kitchen``)."""

DECIDING_DIRS = ("tensor", "backends/eager")
"""Folders of the package whose every module decides a layer: the layouts (their ``Params``,
checks and linear) and the eager ops the first forward runs."""
DECIDING_FILES = ("registry.py", "constraints.py", "exceptions.py", "float_utils.py")
"""Modules beside them that decide: the backend registry and its operand constraints (the
``NoCapableBackendError`` messages), the exceptions, the block-scale helpers."""
SKIPPED = ("rope.py", "na.py", "adaln.py")
"""Eager modules no quantized linear runs (rotary embeddings, neighbourhood attention, AdaLN)."""

MISSING: dict[str, str] = {}
"""Why a release's sources could not be had (set by ``source``)."""


def deciding(root: Path) -> list[str]:
    """The deciding modules of the package at ``root / comfy_kitchen``, as package paths in name order."""
    pkg = root / PACKAGE
    out = [f for f in DECIDING_FILES if (pkg / f).is_file()]
    for folder in DECIDING_DIRS:
        out.extend(str(p.relative_to(pkg)) for p in sorted((pkg / folder).glob("*.py")) if p.name not in SKIPPED)
    return sorted(out)


def digest(root: Path) -> str:
    """The first 12 hex digits of SHA-256 over the deciding modules (path and bytes, in name order)."""
    h = hashlib.sha256()
    for rel in deciding(root):
        h.update(rel.encode() + b"\0" + (root / PACKAGE / rel).read_bytes() + b"\0")
    return h.hexdigest()[:12]


def source(version: str) -> Path | None:
    """The folder holding ``comfy_kitchen/`` (Python sources only) of comfy-kitchen ``version``,
    fetched once; None when the package index cannot give it (the reason in ``MISSING``)."""
    import runtime_sources

    folder = runtime_sources.cache_dir() / f"comfy-kitchen-src-{version}"
    if (folder / PACKAGE / "__init__.py").is_file():
        return folder
    with runtime_sources._Locked(f"comfy-kitchen-src-{version}"):
        if (folder / PACKAGE / "__init__.py").is_file():
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=".comfy-kitchen-", dir=runtime_sources.cache_dir()))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check"]
                + [f"comfy-kitchen=={version}", "-d", str(tmp / "wheel")],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wheels = sorted((tmp / "wheel").glob("*.whl"))
            if proc.returncode or not wheels:
                last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                MISSING[version] = f"comfy-kitchen {version} could not be downloaded: {last}"
                return None
            unpacked = tmp / "src"
            with zipfile.ZipFile(wheels[0]) as zf:
                for name in zf.namelist():
                    if name.startswith(PACKAGE + "/") and name.endswith(".py"):
                        zf.extract(name, unpacked)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(unpacked, folder)
            return folder
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def exported_layouts(root: Path) -> set[str]:
    """The layout classes ``comfy_kitchen.tensor`` of the release at ``root`` exports (the names
    its ``__init__`` imports that end in ``Layout``)."""
    import ast

    tree = ast.parse((root / PACKAGE / "tensor" / "__init__.py").read_text())
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (alias.asname or alias.name).endswith("Layout")
    }


def takes_layout_names(root: Path) -> bool:
    """Whether the release's ``QuantizedTensor`` looks its layout up by name (``get_layout_class``)."""
    return "def get_layout_class" in (root / PACKAGE / "tensor" / "base.py").read_text()


def six_bit_w4a8(root: Path) -> bool:
    """Whether the release's eager W4A8 op reads the code width off the packed row (``_w4a8_geometry``)."""
    path = root / PACKAGE / "backends" / "eager" / "w4a8_int8.py"
    return path.is_file() and "def _w4a8_geometry" in path.read_text()


def outcomes(group, cases: list) -> tuple[dict, int]:
    """The group's outcome per case id (its first release driven, ``kitchen_releases_driver``),
    cached per group digest and file content; also how many cases were driven."""
    import json

    import runtime_sources

    from .kitchen_releases_driver import KitchenReleaseDriver
    from .outcome import Outcome
    from .release_agreement import _digest

    folder = runtime_sources.cache_dir() / "kitchen-release-outcomes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{group.digest}.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    keys = {c.id: _digest(c.path) for c in cases}
    todo = [c for c in cases if keys[c.id] not in cached]
    if todo:
        root = source(group.first)
        if root is None:
            raise RuntimeError(MISSING[group.first])
        with KitchenReleaseDriver(root, group.first) as drv:
            for case in todo:
                cached[keys[case.id]] = drv.run(case.path).to_dict()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(path)
    return {c.id: Outcome(**cached[keys[c.id]]) for c in cases}, len(todo)


def predicted(case, release: str) -> dict | None:
    """comfyquant's verdict of comfy-kitchen ``release`` on the written case."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        report = comfyquant.check(str(case.path), target=f"comfy-kitchen=={release}", deep=case.deep)
    except InputError:
        return None
    return report.verdicts["comfy-kitchen"].to_dict()


def predicted_all(case) -> dict[str, dict | None]:
    """``predicted`` for every group at once, by its first release: one ``check``, whose default
    comfy-kitchen verdict carries every group's."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        report = comfyquant.check(str(case.path), target="comfy-kitchen", deep=case.deep)
    except InputError:
        return {}
    return {group.first: verdict.to_dict() for group, verdict in report.verdicts["comfy-kitchen"].releases.verdicts}


def casts_scales(root: Path) -> bool:
    """Whether the release's FP8 and NVFP4 layouts cast their per-tensor scale to F32 when built."""
    cast = '__setattr__(self, "scale", self.scale.to(dtype=torch.float32'
    found = {cast in (root / PACKAGE / "tensor" / f"{m}.py").read_text() for m in ("fp8", "nvfp4")}
    assert len(found) == 1, f"{root}: the FP8 and NVFP4 layouts differ in casting their scale"
    return found.pop()


def judged(case, outcome, predicted) -> str | None:
    """Agreement as ``agreement.compare`` judges it (defects the file cannot show, models of the
    recorded size, tensors at equal offsets): None, or why not."""
    from .agreement import either_twin, judge_resized, judge_undecidable
    from .outcome import disagreement

    if case.undecidable is not None:
        return judge_undecidable(case, outcome, predicted)
    if case.model is not None:
        return judge_resized(outcome, predicted)
    why = disagreement(outcome, predicted)
    return None if why == "message differs" and either_twin(case, outcome, predicted) else why


def converts_nvfp4_scale(root: Path) -> bool:
    """Whether the release's eager NVFP4 dequantize converts its per-tensor scale before multiplying."""
    text = (root / PACKAGE / "backends" / "eager" / "quantization.py").read_text()
    body = text[text.index("def dequantize_nvfp4") :]
    body = body[: body.index("\ndef ", 1)] if "\ndef " in body[1:] else body
    return "per_tensor_scale.to(" in body
