"""Test set-up: ``tests/`` on the path (builders, kitchen_fixtures), and the light install.

The light install (numpy and rich, no torch) runs ``check``, ``inspect`` and the lossless
``fix``; ``.ci/run`` runs the suite a second time in such an environment.  There, the modules
that need torch at import are not collected, and single tests that need it carry the
``needs_torch`` marker and are skipped.  Everything else must pass without torch.
"""

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

HAS_TORCH = importlib.util.find_spec("torch") is not None

TORCH_MODULES = [
    "test_codecs_vs_kitchen.py",
    "test_dequantize.py",
    "test_fix_decoded.py",
    "test_fix_lossy.py",
    "test_kitchen_formats.py",
    "test_moe_banks.py",
    "test_numerics.py",
    "test_quantize.py",
]
"""Test modules that import torch (or comfy-kitchen) at module level."""

collect_ignore = [] if HAS_TORCH else TORCH_MODULES


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_torch: the test runs a command that needs the [torch] extra")


def pytest_collection_modifyitems(config, items):
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch (light install)")
    for item in items:
        if "needs_torch" in item.keywords:
            item.add_marker(skip)
