"""The one dtype table (``comfyquant.dtypes``) against the libraries whose names it records.

Every column is checked against the library itself: the dtype list and its order against
what safetensors says about an unknown dtype, the ScalarType names against what torch prints
in a view error (and the widths against its dtypes), the NumPy column against NumPy's item sizes.
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


def test_scalar_type_column_matches_torch():
    """Each ScalarType name is the one torch prints for the dtype, and through it the codecs
    find a torch dtype of the table's width for every dtype they meet."""
    torch = pytest.importorskip("torch")
    from comfyquant.numerics.dtypes import TORCH_DTYPES

    assert set(TORCH_DTYPES) == set(dtypes.SCALAR_TYPES) - {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}
    checked = dict(TORCH_DTYPES, C64=torch.complex64, F8_E4M3FNUZ=torch.float8_e4m3fnuz, F8_E5M2FNUZ=torch.float8_e5m2fnuz)
    for name, torch_dtype in checked.items():
        assert torch_dtype.itemsize * 8 == dtypes.DTYPE_BITS[name], name
        assert torch_dtype.is_floating_point == (dtypes.DTYPE_KINDS[name] in {"float", "float8", "float8-fnuz"}), name
        other = torch.int16 if torch_dtype.itemsize != 2 else torch.int32
        with pytest.raises(RuntimeError) as raised:
            torch.zeros((), dtype=torch_dtype).view(other)
        assert f"view {dtypes.SCALAR_TYPES[name]} as" in str(raised.value), name
    assert set(dtypes.SCALAR_TYPES) == set(dtypes.DTYPE_BITS) - {"F4", "F6_E2M3", "F6_E3M2"}


def test_dense_floats_and_codec_dtypes():
    assert dtypes.DENSE_FLOAT_DTYPES == {"F16", "BF16", "F32", "F64"}
    torch = pytest.importorskip("torch")
    from comfyquant.numerics.dtypes import DTYPE_NAMES

    assert DTYPE_NAMES[torch.float8_e4m3fn] == "F8_E4M3" and DTYPE_NAMES[torch.bfloat16] == "BF16"
