"""Dense decoders of nunchaku layers (torch, imported when a decoder runs).

AWQ W4A16: nunchaku's GEMV (``src/kernels/awq/gemv_awq.cu``, from TinyChat/llm-awq) turns each
4-bit code into its *unsigned* value u (``dequantize_s4_to_fp16x2``) and computes
``w = fma(u, wscales, wzeros)``; TinyChat's writer stores ``wzeros = -zero * scale`` so that
``w = u * s - zero * s`` (``convert_to_tinychat_w4x16y16_linear_weight``).  The decoder returns
that value in F32: ``u * s`` is exact in F32 (4-bit times a 16-bit float), so the one F32
addition is the only rounding, as in an F32 fused multiply-add.  (nunchaku's kernel then rounds
to the activations' 16-bit dtype.)
"""

from __future__ import annotations

from typing import Any

from ...numerics import nunchaku_tiles
from ..base import Decoder, Move


def awq() -> Decoder:
    """The decoder of a nunchaku AWQ W4A16 layer: ``{"qweight", "wscales", "wzeros"}`` -> F32 ``[N, K]``."""

    def decode(stored: dict[str, Any]) -> Any:
        import torch

        s = stored["wscales"].to(torch.float32)
        z = stored["wzeros"].to(torch.float32)
        groups, n = s.shape
        k = stored["qweight"].shape[1] * 2
        raw = stored["qweight"].contiguous().cpu().numpy().tobytes()
        u = torch.from_numpy(nunchaku_tiles.awq_codes(raw, n, k).copy()).to(torch.float32)
        g = k // groups
        w = u.view(n, groups, g) * s.t().unsqueeze(-1) + z.t().unsqueeze(-1)
        return w.view(n, k)

    return decode


def via_comfy(moves: list[Move], format_name: str, marker: dict) -> Decoder:
    """The decoder of a layer that is a Comfy layer after its moves (byte permutations): the
    moves applied to the stored tensors, then the Comfy format's own codec (so dequantizing the
    nunchaku file and the migrated file give the same bits)."""

    def decode(stored: dict[str, Any]) -> Any:
        import torch

        from ...formats.registry import FORMATS
        from ...numerics.dtypes import TORCH_DTYPES

        natural = {}
        for m in moves:
            if m.suffix == "bias":
                continue
            src = stored[m.source.rsplit(".", 1)[-1]].contiguous().cpu()
            data = src.view(torch.uint8).numpy().tobytes()
            out = m.transform(data) if m.transform is not None else data
            dt = TORCH_DTYPES[m.dtype]
            natural[m.suffix] = torch.frombuffer(bytearray(out), dtype=dt).view(m.shape)
        return FORMATS[format_name].codec().decode(natural, marker, dtype=torch.float32)

    return decode
