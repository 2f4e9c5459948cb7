"""``Codec.measure_blocks``: quantize's quality measurement decodes a layer and runs its
forward in one pass.  Each block must be what ``iter_decode(exact=False)`` gives and each
output column what the format's own forward gives, whether the format shares work between
the two (W4A8 builds each block's INT8 grid once) or not.  Its integer products are exact,
as on GPUs and VNNI CPUs (where they are the runtime's own bits); oneDNN's AVX2 kernel,
which a runtime on such a CPU calls, saturates pair sums instead."""

from __future__ import annotations

import pytest
import torch

from comfyquant import codecs
from comfyquant.formats.codec import Codec
from comfyquant.numerics import int8
from kitchen_fixtures import VARIANTS, int_mm_is_exact, same_bits
from test_codecs_vs_kitchen import DTYPES, ENCODE_ARGS, weight

SHAPE = (203, 512)  # a short tail block at every block size below
BLOCKS = (16 * 512, 5000, 1 << 24)


def _encoded(variant: str, dtype: torch.dtype):
    codec = codecs.get(VARIANTS[variant].format)
    w = weight("heavy", *SHAPE, dtype, seed=7)
    enc = codec.encode(w, layer="blocks.0.fc", **ENCODE_ARGS[variant])
    return codec, dict(enc), enc.marker


def _run(codec, tensors, marker, x, dtype, block):
    rows, ys = [], []
    for r0, r1, b, y in codec.measure_blocks(tensors, x, marker, dtype=dtype, layer="blocks.0.fc", block_elements=block):
        assert b.shape[0] == y.shape[1] == r1 - r0
        rows.append(b.clone())
        ys.append(y)
    return rows, ys


@pytest.mark.parametrize("dtype_name", ["bf16", "f32"])
@pytest.mark.parametrize("variant", list(ENCODE_ARGS))
def test_measure_blocks_are_the_decode_and_the_forward(variant, dtype_name, monkeypatch):
    dtype = DTYPES[dtype_name]
    codec, tensors, marker = _encoded(variant, dtype)
    x = torch.randn(16, SHAPE[1], generator=torch.Generator().manual_seed(3)).to(dtype)
    for block in BLOCKS:
        rows, ys = _run(codec, tensors, marker, x, dtype, block)
        decoded = [b.clone() for b in codec.iter_decode(tensors, marker, dtype=dtype, block_elements=block, exact=False)]
        assert len(rows) == len(decoded) and all(same_bits(a, b) for a, b in zip(rows, decoded))
        with monkeypatch.context() as m:  # the plain path: decode and forward each on their own
            m.setattr(type(codec), "_measure_rows", Codec._measure_rows)
            plain_rows, plain_ys = _run(codec, tensors, marker, x, dtype, block)
        assert all(same_bits(a, b) for a, b in zip(rows, plain_rows))
        assert all(same_bits(a, b) for a, b in zip(ys, plain_ys))
        whole = codec.linear(x, tensors, marker)  # the runtime's one GEMM, its own INT8 call
        with monkeypatch.context() as m:  # the same, its integers multiplied exactly
            m.setattr(int8, "runtime_int8_matmul", int8.int8_matmul)
            exact = codec.linear(x, tensors, marker)
        y = torch.cat(ys, dim=1)[:, : whole.shape[1]]
        integer = (
            not torch.is_floating_point(tensors["weight"])
            and VARIANTS[variant].format == "asym_w4a8_int8"
            and "weight_correction" not in tensors
        )
        for runtime in (exact, whole) if int_mm_is_exact() else (exact,):
            if integer:
                assert same_bits(y, runtime)  # integer GEMM: exact for any subset of output features
            else:
                assert torch.allclose(y.float(), runtime.float(), rtol=2e-2, atol=1e-3)


def test_measure_blocks_refuses_a_wrong_input():
    codec, tensors, marker = _encoded("w4a8_codebook", torch.bfloat16)
    with pytest.raises(Exception, match="input must be"):
        next(codec.measure_blocks(tensors, torch.zeros(4, 100), marker, layer="blocks.0.fc"))
