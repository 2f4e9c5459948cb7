"""What an encode writes, known before anything is computed.

``planned_tensors`` derives every tensor an encode will produce (suffix -> dtype, shape)
from the format description's slots and geometry and the format's ``Params``, so a writer can
lay out the output header first and stream the tensors after it (``quantize``, ``convert``,
and ``migrate --allow-lossy``).  A mismatch with what the encoder then writes is a bug.
"""

from __future__ import annotations

from ..errors import ComfyQuantError, InputError
from . import registry
from .base import BIAS, CODEBOOK, CORRECTION, GeometryError, Meta, pad
from .params import Params


class PlanError(ComfyQuantError):
    """The format description and the encode parameters disagree (a bug, not bad input)."""


class ShapeRefused(InputError):
    """The format cannot store a weight of this shape with these parameters (one of its
    constraints fails): a layer to keep dense, not a bug."""


class _Named(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _refusal(fmt, env: dict) -> ShapeRefused | None:
    """The first of the format's constraints the planned geometry breaks, as a refusal."""
    for c in fmt.constraints:
        if not c.holds(env):
            return ShapeRefused(c.message.format_map(_Named(env)))
    return None


def planned_tensors(params: Params, n: int, k: int) -> dict[str, tuple[str, tuple]]:
    """Suffix -> (dtype, shape) of every tensor ``encode`` writes for an ``[n, k]`` weight.

    The stored geometry is the model's, padded where the format pads (``Format.pad``);
    optional slots are included when the parameters produce them (codebook, correction).
    The result is then fed back through the format's own geometry function, which must
    reproduce it."""
    name = params.FORMAT
    fmt = registry.FORMATS[name]
    marker = params.marker()
    rows, cols = fmt.pad
    guess = dict(fmt.params(marker), N=pad(n, rows), K=pad(k, cols), N_model=n, K_model=k, **params.layout())
    chosen = params.stored_dtypes()
    first = _evaluate(fmt, guess, chosen)
    metas = {s: Meta(d, sh) for s, (d, sh) in first.items()}
    if "bias" not in first:
        metas["bias"] = Meta("BF16", (n,))  # lets geometry read the model's N for padded formats
    try:
        env = fmt.geometry(metas, fmt.params(marker))
    except GeometryError as exc:
        raise _refusal(fmt, guess) or PlanError(
            f"{name}: the format description cannot read its own planned tensors: {exc}"
        ) from None
    second = _evaluate(fmt, env, chosen)
    if second != first:
        # a shape the format cannot hold (6-bit rows of a K that is no multiple of 4 lose
        # bits in the packing) is refused by one of its constraints; anything else is a bug
        raise _refusal(fmt, {**env, **guess}) or PlanError(
            f"{name} [{n}, {k}]: planned tensors {first} do not round-trip through the format geometry ({second})"
        )
    return first


def _evaluate(fmt, env: dict, chosen: dict[str, str]) -> dict[str, tuple[str, tuple]]:
    out: dict[str, tuple[str, tuple]] = {}
    for suffix, slot in fmt.slots_for(env).items():
        if slot.kind == BIAS:
            continue
        if not slot.required:
            produced = (slot.kind == CODEBOOK and env.get("has_codebook")) or (
                slot.kind == CORRECTION and env.get("has_correction")
            )
            if not produced or slot.is_forbidden(env):
                continue
        if slot.dtype == "float":
            raise PlanError(f"{fmt.name}: slot {suffix} has no fixed dtype; the quantizer cannot plan it")
        try:
            shape = slot.expected_shape(env)
        except (NameError, KeyError, TypeError, ZeroDivisionError) as exc:
            raise PlanError(f"{fmt.name}: cannot evaluate the shape of {suffix} ({slot.shape}): {exc}") from None
        dtype = chosen.get(suffix, slot.dtype)
        if dtype != slot.dtype and dtype not in slot.also_dtypes:
            raise PlanError(f"{fmt.name}: {suffix} cannot be stored as {dtype}")
        out[suffix] = (dtype, tuple(int(d) for d in shape))
    return out
