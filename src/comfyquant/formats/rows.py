"""Row (N) splits and joins of a layer's tensors, from the format descriptions alone.

A loader that splits a fused layer (QKV, gate/up) or shards it by output rows needs, for
every tensor of the layer, which slice belongs to which part, and whether the split is exact
at all.  Both follow from each slot's shape expression, so no format states them twice:

* the axis whose size follows N is the row axis (``(N, K // 2)``: 0; W4A8's correction
  ``(K // group_size, N)``: 1); a tensor whose shape does not follow N is *shared* -- every
  part holds all of it (per-tensor scales, codebooks, K-side factors), and a join is exact
  only when the parts' copies are equal;
* how many rows one index along that axis holds (``N // 128``: 128), and the blocked 128x4
  scale layout (``Slot.blocked``: its tiles hold 128 rows) fix where a split may fall;
* each part must itself be a valid layer of the format (NVFP4 rows padded to 16 ...): its
  geometry and constraints are checked like any layer's.

``Slot.rows`` overrides the derivation (``"shared"``, or the row axis).  Header-only: shapes
and slices, no tensor data, no torch.
"""

from __future__ import annotations

from math import gcd

from .base import Format, GeometryError, Meta, Slot

ROW_NAMES = ("N", "N_model")
"""Geometry names that count output rows (stored and, for padded formats, the model's)."""

_PROBE = 1024
"""Rows added to N to see which axes follow it (a multiple of every row granularity, 16 to 128)."""

BLOCKED_TILE_ROWS = 128
"""Rows of one tile of the blocked scale layout (comfy-kitchen 0.2.40
``float_utils.to_blocked``): a split inside a tile is not a slice."""


class Cut:
    """One tensor's share of one part: ``axis`` None = the whole tensor (shared), else the
    half-open range ``start:stop`` along ``axis``; ``shape`` is the part's tensor shape."""

    __slots__ = ("axis", "start", "stop", "shape")

    def __init__(self, axis: int | None, start: int, stop: int, shape: tuple) -> None:
        self.axis = axis
        self.start = start
        self.stop = stop
        self.shape = tuple(shape)

    @property
    def index(self) -> tuple[slice, ...]:
        """The numpy/torch index of the slice (``()`` for a shared tensor: all of it)."""
        if self.axis is None:
            return ()
        return (slice(None),) * self.axis + (slice(self.start, self.stop),)

    def __repr__(self) -> str:
        return "Cut(shared)" if self.axis is None else f"Cut(axis {self.axis}, {self.start}:{self.stop})"


class RowRule:
    """How one slot follows a row split: ``axis`` (None: shared), ``rows_per_index`` along it,
    and ``granularity``: the row multiple a split must fall on, with the reason."""

    __slots__ = ("axis", "rows_per_index", "granularity", "why")

    def __init__(self, axis: int | None, rows_per_index: int = 1, granularity: int = 1, why: str = "") -> None:
        self.axis = axis
        self.rows_per_index = rows_per_index
        self.granularity = granularity
        self.why = why


def _probe_env(env: dict, delta: int) -> dict:
    return dict(env, **{n: env[n] + delta for n in ROW_NAMES if isinstance(env.get(n), int)})


def row_rule(slot: Slot, env: dict) -> RowRule | str:
    """The slot's ``RowRule`` in this geometry, or why its tensor cannot follow a split."""
    try:
        base = slot.expected_shape(env)
        probed = slot.expected_shape(_probe_env(env, _PROBE))
    except (ArithmeticError, TypeError, KeyError, NameError, ValueError) as exc:
        return f"{slot.suffix}: its shape {slot.shape} cannot be evaluated ({exc})"
    declared = slot.rows
    if declared == "shared":
        return RowRule(None)
    moving = [i for i, (a, b) in enumerate(zip(base, probed)) if a != b]
    if isinstance(declared, int) and not isinstance(declared, bool) and declared in moving:
        moving = [declared]
    if len(base) != len(probed) or len(moving) > 1:
        return f"{slot.suffix}: its shape {slot.shape} does not follow N along one axis"
    if not moving:
        return RowRule(None)
    axis = moving[0]
    step = probed[axis] - base[axis] if axis < len(probed) else 0
    if step <= 0 or _PROBE % step:
        return f"{slot.suffix}: axis {axis} of {slot.shape} does not hold a whole number of rows per index"
    per = _PROBE // step
    granularity, why = per, f"{slot.suffix} stores {per} rows per index of axis {axis}" if per > 1 else ""
    if slot.blocked:
        granularity = granularity * BLOCKED_TILE_ROWS // gcd(granularity, BLOCKED_TILE_ROWS)
        why = f"{slot.suffix} holds its scales in the blocked layout's {BLOCKED_TILE_ROWS}-row tiles"
    return RowRule(axis, per, granularity, why)


def split_rows(fmt: Format, env: dict, tensors: dict, sections: list[int] | tuple[int, ...]) -> list[dict[str, Cut]] | str:
    """Split a layer of ``fmt`` (geometry ``env``, tensors by suffix with ``.shape``) into parts
    of ``sections`` output rows each, in order: per part, suffix -> ``Cut``.

    ``sections`` add up to the model's rows (``N_model`` where the format pads its stored
    rows, which the last part then carries) or to the stored ``N``.  Returns the text of a
    refusal when the split is not exact: a boundary inside a tile, an index that holds several
    rows, or a part that is not a valid layer of the format on its own."""
    n = env.get("N")
    if not isinstance(n, int):
        return f"{fmt.name}: the layer's row count N is unknown"
    sections = list(sections)
    model = env.get("N_model", n)
    if not sections or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in sections):
        return f"sections must be positive row counts, got {sections}"
    if sum(sections) not in (n, model):
        return f"sections add up to {sum(sections)} rows, the layer has {model}" + (f" ({n} stored)" if n != model else "")
    bounds = [0]
    for s in sections:
        bounds.append(bounds[-1] + s)
    bounds[-1] = n  # the last part carries the stored padding rows
    slots = {s: slot for s, slot in fmt.slots_for(env).items() if s in tensors and not slot.is_forbidden(env)}
    rules: dict[str, RowRule] = {}
    for suffix, slot in slots.items():
        rule = row_rule(slot, env)
        if isinstance(rule, str):
            return rule
        rules[suffix] = rule
        for r in bounds[1:-1]:
            if rule.axis is not None and r % rule.granularity:
                return (
                    f"a split at row {r} is not exact for {fmt.name}: {rule.why}, so splits must fall on "
                    f"multiples of {rule.granularity} rows"
                )
    parts: list[dict[str, Cut]] = []
    for i, (r0, r1) in enumerate(zip(bounds, bounds[1:])):
        part_env = dict(env, **{name: min(env[name], r1) - r0 for name in ROW_NAMES if isinstance(env.get(name), int)})
        if any(part_env[name] <= 0 for name in ROW_NAMES if name in part_env):
            return f"part {i} (rows {r0}:{r1}) lies in the stored padding rows of {fmt.name}"
        cuts: dict[str, Cut] = {}
        for suffix, rule in rules.items():
            stored = tuple(tensors[suffix].shape)
            if rule.axis is None:
                cuts[suffix] = Cut(None, 0, 0, stored)
                continue
            try:
                length = slots[suffix].expected_shape(part_env)[rule.axis]
            except (ArithmeticError, TypeError, KeyError, NameError, ValueError, IndexError) as exc:
                return f"part {i} (rows {r0}:{r1}): {suffix} has no shape ({exc})"
            start = r0 // rule.rows_per_index
            if rule.axis >= len(stored) or start + length > stored[rule.axis]:
                return f"part {i} (rows {r0}:{r1}): {suffix} {list(stored)} has no rows {start}:{start + length} along axis {rule.axis}"
            shape = stored[: rule.axis] + (length,) + stored[rule.axis + 1 :]
            cuts[suffix] = Cut(rule.axis, start, start + length, shape)
        why = _invalid_part(fmt, cuts, tensors, env, part_env)
        if why:
            return f"part {i} (rows {r0}:{r1}) is not a valid {fmt.name} layer: {why}"
        parts.append(cuts)
    return parts


def _invalid_part(fmt: Format, cuts: dict[str, Cut], tensors: dict, env: dict, part_env: dict) -> str | None:
    """Why a part's tensors are not a layer of the format (its geometry, shapes, constraints)."""
    metas = {s: Meta(getattr(tensors[s], "dtype", "?"), c.shape) for s, c in cuts.items()}
    params = {k: env[k] for k in (key.name for key in fmt.keys) if k in env}
    try:
        got = fmt.geometry(metas, params)
    except GeometryError as exc:
        return str(exc)
    for name in ROW_NAMES:
        if name in part_env and got.get(name) != part_env[name]:
            return f"its tensors read as {name}={got.get(name)}, not {part_env[name]}"
    for suffix, slot in fmt.slots_for(got).items():
        if suffix in metas and not slot.is_forbidden(got) and slot.expected_shape(got) != metas[suffix].shape:
            return f"{suffix} {list(metas[suffix].shape)} is not {list(slot.expected_shape(got))}"
    for c in fmt.constraints:
        if not c.holds(got):
            return c.message.format(**{k: v for k, v in got.items() if isinstance(k, str)})
    return None


def join_rows(fmt: Format, envs: list[dict], parts: list[dict]) -> dict[str, RowRule] | str:
    """How the parts of a split layer (geometry and tensors by suffix, in row order) join back:
    per suffix its ``RowRule`` -- concatenate along ``axis``, or (``axis`` None) one copy,
    exact only when every part's copy is equal, which the caller compares.  A refusal text
    when the parts cannot be one layer: different tensors or shared shapes, a boundary off
    the granularity."""
    if not parts or len(envs) != len(parts):
        return "nothing to join"
    suffixes = set(parts[0])
    if any(set(p) != suffixes for p in parts):
        return "the parts do not hold the same tensors"
    rules: dict[str, RowRule] = {}
    row = 0
    for i, (env, part) in enumerate(zip(envs, parts)):
        for suffix, slot in fmt.slots_for(env).items():
            if suffix not in part or slot.is_forbidden(env):
                continue
            rule = row_rule(slot, env)
            if isinstance(rule, str):
                return rule
            if rule.axis is None and tuple(part[suffix].shape) != tuple(parts[0][suffix].shape):
                return f"{suffix} is shared by every part, but part {i} holds {list(part[suffix].shape)}"
            if rule.axis is not None and i and row % rule.granularity:
                return f"part {i} starts at row {row}: {rule.why}, so parts must start on multiples of {rule.granularity} rows"
            rules.setdefault(suffix, rule)
        if i < len(parts) - 1 and env.get("N_model", env["N"]) != env["N"]:
            return f"part {i} carries {env['N'] - env['N_model']} padding rows: only the last part may"
        row += env["N"]
    return rules
