"""Dense decoders of the scaled-FP8 dialects (torch, imported when a decoder runs).

A decoder takes the layer's stored tensors by input suffix (torch tensors as stored) and
returns the dense weight in F32 by the writer's own formula (one IEEE F32 multiply per factor,
in the writer's order), so the result is bit-identical to what that writer's loader computes.
"""

from __future__ import annotations


def scaled_fp8(weight_suffix: str = "weight", scale_suffix: str = "scale_weight", second_suffix: str | None = None):
    """``W = q * scale`` (per tensor, per output channel ``[N, 1]``/``[N]``, or per block
    ``[N, B, 1]`` over K in B equal blocks), times ``second_suffix``'s scalar when given."""

    def decode(stored: dict):
        import torch

        q = stored[weight_suffix].to(torch.float32)
        scale = stored[scale_suffix].to(torch.float32)
        n, k = q.shape
        if scale.numel() == 1:
            out = q * scale.reshape(())
        elif scale.dim() == 3:
            blocks = scale.shape[1]
            out = (q.reshape(n, blocks, k // blocks) * scale.reshape(n, blocks, 1)).reshape(n, k)
        else:
            out = q * scale.reshape(n, 1)
        if second_suffix is not None and second_suffix in stored:
            out = out * stored[second_suffix].to(torch.float32).reshape(())
        return out

    return decode
