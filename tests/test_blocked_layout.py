"""One blocked-scale layout (comfy-kitchen 0.2.40 ``float_utils.to_blocked``): ``fix`` (numpy bytes, no torch) and the codecs (torch)
run the same code in numerics/blocked.py and agree bit for bit, both directions."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from comfyquant.numerics import blocked
from comfyquant.numerics import bytewise as transforms

SHAPES = [(32, 16), (20, 3), (128, 4), (300, 13), (1, 1), (257, 64), (129, 5)]


def _by_offsets(logical: np.ndarray) -> np.ndarray:
    """The layout from its definition, one entry at a time (independent of the reshapes)."""
    rows, cols = logical.shape
    rp, cp = blocked.blocked_shape(rows, cols)
    flat = np.zeros(rp * cp, dtype=np.uint8)
    for r in range(rows):
        for c in range(cols):
            flat[blocked.blocked_offset(r, c, cp)] = logical[r, c]
    return flat


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_numpy_bytes_match_the_definition_and_round_trip(rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    logical = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    data, shape = transforms.to_blocked(logical.tobytes(), rows, cols)
    assert shape == blocked.blocked_shape(rows, cols)
    assert data == _by_offsets(logical).tobytes()
    assert transforms.from_blocked(data, rows, cols) == logical.tobytes()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (light install)")
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_torch_and_numpy_paths_are_bit_identical(rows, cols):
    import torch

    rng = np.random.default_rng(7 + rows + cols)
    logical = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    data, _ = transforms.to_blocked(logical.tobytes(), rows, cols)
    t = blocked.to_blocked(torch.from_numpy(logical.copy()))
    assert t.numpy().tobytes() == data
    back = blocked.from_blocked(torch.frombuffer(bytearray(data), dtype=torch.uint8), rows, cols)
    assert back.contiguous().numpy().tobytes() == transforms.from_blocked(data, rows, cols) == logical.tobytes()


def test_fix_transforms_do_not_import_torch():
    code = (
        "import sys; from comfyquant.numerics import bytewise as transforms; "
        "transforms.from_blocked(transforms.to_blocked(bytes(range(60)), 20, 3)[0], 20, 3); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
