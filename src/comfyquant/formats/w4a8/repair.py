"""``fix`` hooks of ``asym_w4a8_int8``: the marker of an unmarked layer, and the lossy
re-encode into the one variant every runtime reads (4-bit codebook rows, FP8 group scales).

Imported by the package's ``__init__`` (no torch here): the hooks receive the format
description and read shapes and rules from it, so nothing below restates a slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import BIAS, Format, GeometryError
from .widths import k_by_bits

if TYPE_CHECKING:  # imported when a re-encode is planned: check never needs it
    from ..hooks import Readers, Recode

RECODE_WRITES = ("weight", "weight_s_rel", "weight_s_channel", "weight_codebook")
"""The tensors comfy-kitchen's encoder writes for 4-bit codebook rows."""


def infer_marker(fmt: Format, tensors: dict, convrot_groupsize: int | None) -> dict | str:
    """Group size from ``weight_s_rel``'s group count and the packed row width.

    Each bit depth the width allows (4-bit first) gives one group size; the first whose layer
    meets every constraint of the format (6-bit rows need group sizes that are multiples of
    16) is taken, else the first that divides at all (the re-check then reports the layer).
    When both depths fit, the shapes do not single the group size out and the plan reports it
    as an assumption."""
    w, s_rel = tensors["weight"], tensors.get("weight_s_rel")
    if s_rel is None or len(s_rel.shape) != 2 or not s_rel.shape[1] or len(w.shape) != 2:
        return "unmarked W4A8 layer: group size cannot be told from weight_s_rel"
    groups = s_rel.shape[1]
    fits = []
    for bits, k in k_by_bits(w.shape[1]).items():
        if k % groups:
            continue
        params = {"group_size": k // groups, "convrot_groupsize": convrot_groupsize}
        try:
            env = fmt.geometry(tensors, params)
        except GeometryError:
            continue
        if env["bits"] == bits:
            fits.append((all(c.holds(env) for c in fmt.constraints), params["group_size"]))
    if not fits:
        return "unmarked W4A8 layer: group size cannot be told from weight_s_rel"
    group_size = next((g for ok, g in fits if ok), fits[0][1])
    return {"group_size": group_size, "convrot_groupsize": convrot_groupsize, "convrot": True}


def _need(env: dict, tensors: dict, readers: Readers) -> str | None:
    """Why the runtimes of ``readers`` cannot use the layer as stored (None: they can)."""
    s_rel = tensors.get("weight_s_rel")
    if env.get("bits") == 6 and readers.four_bit_w4a8:
        who = " and ".join(readers.four_bit_w4a8)
        return f"6-bit rows -> 4-bit ({who} read{'s' if len(readers.four_bit_w4a8) == 1 else ''} W4A8 rows as 4-bit)"
    if "sglang" in readers.names and s_rel is not None and s_rel.dtype == "F32":
        return "F32 group scales -> FP8 (SGLang needs FP8 weight_s_rel)"
    if readers.names == ("comfyui",) and "weight_correction" in tensors:
        return "asymmetric -> symmetric (ComfyUI drops the correction)"
    return None


def lossy(fmt: Format, env: dict, tensors: dict, readers: Readers) -> Recode | None:
    """Re-encode as 4-bit symmetric codebook rows with FP8 group scales, same group and ConvRot
    sizes: every runtime reads that variant."""
    why = _need(env, tensors, readers)
    if why is None:
        return None
    from ..hooks import Recode

    g, c = env["group_size"], env["convrot_groupsize"]
    new_env = dict(env, bits=4, variant="codebook", has_codebook=True, has_correction=False)
    slots = fmt.slots_for(new_env)
    writes = {s: (slots[s].dtype, slots[s].expected_shape(new_env)) for s in RECODE_WRITES}
    return Recode(
        why,
        params={"group_size": g, "convrot_groupsize": c, "bits": 4, "symmetric": True, "codebook": True},
        writes=writes,
        replaces=tuple(s.suffix for s in fmt.slots if s.kind != BIAS),
        marker={"format": fmt.name, "group_size": g, "convrot_groupsize": c, "convrot": True},
        after="4-bit codebook, FP8 scales",
    )
