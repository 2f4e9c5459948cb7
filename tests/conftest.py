"""Test set-up: ``tests/`` on the path (builders, kitchen_fixtures), and the light install.

The light install (numpy, no torch) runs ``check``, ``inspect`` and the lossless
``fix``; ``.ci/run`` runs the suite a second time in such an environment.  There, the modules
that import torch or comfy-kitchen at module level, themselves or through a helper module of the
tests' folder, are not collected, and single tests that need it carry the
``needs_torch`` marker and are skipped.  Everything else must pass without torch.

A test whose runtime is missing (ComfyUI's source, SGLang's wheel, comfy-kitchen, chromium)
skips with ``runtime_sources.skip_missing``. Under ``CI=true`` such a skip fails instead, with
its one-line reason: CI must not pass with the runtime tests left out. The light run is exempt
(there the runtimes that need torch are absent by design).
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import runtime_sources  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
"""As the command line does (``numerics/waits.py``): before any test imports torch, so its
OpenMP threads sleep at barriers instead of spinning on cores shared with other jobs."""

HAS_TORCH = importlib.util.find_spec("torch") is not None

_TORCH_IMPORT = re.compile(r"^(?:import|from)\s+(?:torch|comfy_kitchen|safetensors\.torch)\b", re.M)
"""A module-level import of torch (or of what imports it): such a test module needs torch."""
_LOCAL_IMPORT = re.compile(r"^(?:import|from)\s+(\w+)", re.M)
"""A module-level import, possibly of a helper module beside the tests (builders, fixtures)."""


def _needs_torch(path: Path, seen: set[Path]) -> bool:
    """Whether ``path`` imports torch at module level, itself or through a helper module of
    the tests' folder that does (e.g. a fixtures module built on torch)."""
    seen.add(path)
    text = path.read_text(encoding="utf-8")
    if _TORCH_IMPORT.search(text):
        return True
    for name in _LOCAL_IMPORT.findall(text):
        helper = path.parent / f"{name}.py"
        if helper not in seen and helper.is_file() and _needs_torch(helper, seen):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """On a light install, leave out the test modules that import torch at module level."""
    if HAS_TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if _needs_torch(Path(collection_path), set()) else None


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_torch: the test runs a command that needs the [torch] extra")


def pytest_collection_modifyitems(config, items):
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch (light install)")
    for item in items:
        if "needs_torch" in item.keywords:
            item.add_marker(skip)


RUNTIMES_REQUIRED = runtime_sources.in_ci() and HAS_TORCH
"""Whether a missing runtime fails its test instead of skipping it (see the module docstring)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip for a missing runtime is a failure with the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if not (RUNTIMES_REQUIRED and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2])
    if runtime_sources.MISSING_PREFIX in reason:
        report.outcome = "failed"
        said = reason.split(runtime_sources.MISSING_PREFIX, 1)[1]
        report.longrepr = f"CI=true: a runtime this test needs is missing: {said}"


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Run the test with 1 and with 2 torch threads (bit-exactness must not depend on them);
    the previous count is restored.  torch is imported only by the tests that use it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before


@pytest.fixture
def reuse_pools(monkeypatch):
    """The pools of the ``numerics.pages.reused_outputs`` scopes the test opens, in order; the
    buffers of small test layers (above 64 KiB) count as large, so they go through them."""
    from comfyquant.numerics import pages

    monkeypatch.setattr(pages, "LARGE_BYTES", 64 << 10)
    pools = []

    class Seen(pages._Pool):
        def __init__(self):
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(pages, "_Pool", Seen)
    return pools
