"""diffusers' Flux.1 single-file converter at any model width.

``convert_flux_transformer_checkpoint_to_diffusers`` (diffusers 0.36-0.42,
``diffusers/loaders/single_file_utils.py``) fixes ``inner_dim = 3072`` and ``mlp_ratio = 4``
to split each single block's fused ``linear1`` into ``to_q``, ``to_k``, ``to_v`` and
``proj_mlp``: a Flux of another width (a distilled or a test model) fails there with a split
size error, although nothing else in the converter depends on the width.

The mapping is otherwise the converter's own, so it stays in charge: each ``linear1`` is
handed to it as a stand-in on the meta device of the size it expects (no memory), and its four
outputs are then replaced by the real tensor split at the file's width -- the rows of
``img_in`` (the model's hidden size), the rest of ``linear1`` being the MLP.  The split is
``torch.split`` on the file's tensors, so a quantized layer is cut by its format's row rule
exactly as the converter's own split would have cut it.
"""

from __future__ import annotations

import re
import warnings

import torch

from ..torch.tensors import LoadError

CONVERTER = "convert_flux_transformer_checkpoint_to_diffusers"
"""The converter whose width is fixed (its function name in diffusers)."""
CONVERTER_WIDTH = 3072
CONVERTER_MLP = 4 * CONVERTER_WIDTH
_LINEAR1 = re.compile(r"single_blocks\.(\d+)\.linear1\.(weight|bias)")
_PARTS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
"""What the converter makes of ``linear1``'s four row ranges, in order."""


def file_width(checkpoint: dict) -> int | None:
    """The model's hidden size as the file stores it: the rows of ``img_in.weight``."""
    weight = checkpoint.get("img_in.weight")
    shape = tuple(weight.shape) if weight is not None else ()
    return int(shape[0]) if len(shape) == 2 else None


def stand_in(converter, checkpoint: dict, label: str) -> tuple[int, dict[str, torch.Tensor]] | None:
    """When ``converter`` is the fixed-width Flux one and the file is of another width: swap
    every ``single_blocks.N.linear1`` tensor of ``checkpoint`` (in place) for a meta stand-in
    the converter's split accepts; return (width, the real tensors by name).  None otherwise
    (nothing changed)."""
    if getattr(converter, "__name__", "") != CONVERTER:
        return None
    width = file_width(checkpoint)
    if width is None or width == CONVERTER_WIDTH:
        return None
    real: dict[str, torch.Tensor] = {}
    for name in [n for n in checkpoint if _LINEAR1.fullmatch(n)]:
        value = checkpoint[name]
        rows = int(value.shape[0])
        if rows <= 3 * width:
            raise LoadError(
                f"{label}: {name} has {rows} rows, not the 3 x {width} of attention plus an MLP that a Flux of width {width} has"
            )
        real[name] = value
        checkpoint[name] = torch.empty((3 * CONVERTER_WIDTH + CONVERTER_MLP, *value.shape[1:]), device="meta")
    import diffusers

    warnings.warn(
        f"{label}: diffusers {diffusers.__version__}'s Flux converter assumes width {CONVERTER_WIDTH}; this file's is "
        f"{width}, so comfyquant splits the single blocks' linear1 at {width} (the rest of the mapping is the converter's)",
        stacklevel=3,
    )
    return width, real


def put_back(converted: dict, width: int, real: dict[str, torch.Tensor]) -> None:
    """Replace the converter's parts of each stand-in with the real tensor split at ``width``."""
    for name, value in real.items():
        match = _LINEAR1.fullmatch(name)
        assert match is not None, name  # stand_ins() gave only names that match
        block, kind = match.groups()
        rows = int(value.shape[0])
        parts = torch.split(value, [width, width, width, rows - 3 * width], dim=0)
        for part_name, part in zip(_PARTS, parts):
            converted[f"single_transformer_blocks.{block}.{part_name}.{kind}"] = part
