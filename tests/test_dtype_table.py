"""The one dtype table (``comfyquant.dtypes``) against the libraries whose names it records.

Every column is checked against the library itself: the dtype list and its order against
what safetensors says about an unknown dtype, the widths and names against torch's dtypes and
the ScalarType names torch prints in a view error, the NumPy column against NumPy's item sizes.
"""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest

from comfyquant import dtypes


def test_rows_follow_safetensors_dtype_enum(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    header = json.dumps({"x": {"dtype": "NOT_A_DTYPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
    path = tmp_path / "unknown.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    with pytest.raises(Exception, match="unknown variant") as raised:
        safetensors.safe_open(str(path), "np")
    listed = re.findall(r"`([A-Z0-9_]+)`", str(raised.value).split("expected one of", 1)[1])
    assert tuple(dtypes.DTYPE_BITS) == tuple(listed)


def test_numpy_column_holds_one_element():
    for name, numpy_name in dtypes.NUMPY_NAMES.items():
        assert np.dtype(numpy_name).itemsize * 8 == dtypes.DTYPE_BITS[name], name
    assert set(dtypes.DTYPE_BITS) - set(dtypes.NUMPY_NAMES) == {"F4", "F6_E2M3", "F6_E3M2"}


def test_torch_columns_match_torch():
    torch = pytest.importorskip("torch")
    for name, attribute in dtypes.TORCH_NAMES.items():
        torch_dtype = getattr(torch, attribute)
        assert torch_dtype.itemsize * 8 == dtypes.DTYPE_BITS[name], name
        assert torch_dtype.is_floating_point == (dtypes.DTYPE_KINDS[name] in {"float", "float8", "float8-fnuz"}), name
        other = torch.int16 if torch_dtype.itemsize != 2 else torch.int32
        with pytest.raises(RuntimeError) as raised:
            torch.zeros((), dtype=torch_dtype).view(other)
        assert f"view {dtypes.SCALAR_TYPES[name]} as" in str(raised.value), name
    assert set(dtypes.TORCH_NAMES) == set(dtypes.SCALAR_TYPES)


def test_dense_floats_and_codec_dtypes():
    assert dtypes.DENSE_FLOAT_DTYPES == {"F16", "BF16", "F32", "F64"}
    torch = pytest.importorskip("torch")
    from comfyquant.numerics.dtypes import DTYPE_NAMES, TORCH_DTYPES

    assert set(TORCH_DTYPES) == set(dtypes.TORCH_NAMES) - {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}
    assert DTYPE_NAMES[torch.float8_e4m3fn] == "F8_E4M3"
