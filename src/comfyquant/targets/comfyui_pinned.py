"""A W4A8 layer's first forward under the comfy-kitchen ComfyUI 0.31.0 to 0.33.0 pin (0.2.28,
0.2.30 and 0.2.31, whose W4A8 eager code is byte-identical).

ComfyUI's own code, and comfy-kitchen's ``Params`` checks at load, are those the ComfyUI
profile models with comfy-kitchen 0.2.40 (``comfyui.comfyui_verdict``); running ComfyUI 0.33.0
with each comfy-kitchen on the generated defect space shows that only the W4A8 linear's first
forward differs.  The pinned releases store 4-bit codes only, so their linear:

* checks the operands' dtypes (``No backend can handle 'w4a8_int8_linear'``) before anything
  else, where 0.2.40 checks the tensors against each other first;
* reads K as twice the packed row's bytes (0.2.40 reads it off the group scales' columns and
  infers 4 or 6 bits from the row): the combined geometry message (K divisible by 16, the
  group size and the ConvRot size, the group size's own rule), then the group scales', the
  channel scales' and the codebook's shapes against that K, then the input's K;
* builds the ConvRot rotation last (a size that is not a power of 4 fails after the operand
  checks).

A 6-bit row (3K/4 bytes) therefore fails in its own words, and so does a weight of another
width, with the messages of that release.  No torch: ``check`` reads these rules.
"""

from __future__ import annotations

from .base import LAYER, Violation, bind

FORMAT = "asym_w4a8_int8"
FORWARD_RULES = frozenset({"comfyui.w4a8", "comfyui.hadamard", "comfyui.dtype"})
"""The rules of what the ComfyUI profile says a W4A8 layer's first forward raises with
comfy-kitchen 0.2.40 (the operand checks, the ConvRot size, the operand dtypes): the part of its
verdict the pinned comfy-kitchen decides otherwise."""


def operands(t: dict, env: dict) -> Violation | None:
    """What the pinned comfy-kitchen's W4A8 linear raises on a layer that loaded, in its order
    (after the operand dtypes): K = 2 x the row's bytes against 16, the group size and the
    ConvRot size; the group, channel and codebook scales' shapes; the input's K (the model's);
    the ConvRot rotation's size.  ComfyUI never passes the correction in."""
    from ..formats.base import is_pow4

    w = t["weight"]
    if len(w.shape) != 2 or w.dtype != "I8":
        return Violation("comfyui.w4a8", "packed weight must be a 2D int8 tensor", "ValueError", LAYER, "weight")
    n, cols = w.shape
    k, g, c = 2 * cols, env["group_size"], env["convrot_groupsize"]
    if g >= 4 and not k % 16 and not k % g and c == 0:  # Python's own modulo, in the same test
        return Violation("comfyui.w4a8", "integer modulo by zero", "ZeroDivisionError", LAYER, None)
    if g < 4 or k % 16 or k % g or k % c or (16 % g and g % 16):
        return Violation(
            "comfyui.w4a8",
            f"K={k} must be divisible by 16, group_size={g}, and convrot_groupsize={c}; group_size must be "
            f">=4 and divide 16 or be a multiple of 16",
            "ValueError",
            LAYER,
            "weight",
        )
    groups = k // g
    s_rel, s_ch, cb = t.get("weight_s_rel"), t.get("weight_s_channel"), t.get("weight_codebook")
    if s_rel is not None and tuple(s_rel.shape) != (n, groups):
        return Violation(
            "comfyui.w4a8", f"s_rel must have shape {(n, groups)}, got {tuple(s_rel.shape)}", "ValueError", LAYER, "weight_s_rel"
        )
    if s_ch is not None and tuple(s_ch.shape) != (n,):
        return Violation(
            "comfyui.w4a8", f"s_channel must have shape {(n,)}, got {tuple(s_ch.shape)}", "ValueError", LAYER, "weight_s_channel"
        )
    if cb is not None and tuple(cb.shape) != (16,):
        return Violation(
            "comfyui.w4a8", f"codebook must have shape (16,), got {tuple(cb.shape)}", "ValueError", LAYER, "weight_codebook"
        )
    if env["K"] != k:
        return Violation("comfyui.w4a8", f"Input K={env['K']} does not match qdata K={k}", "ValueError", LAYER, "weight")
    if not is_pow4(c):
        return Violation(
            "comfyui.hadamard",
            f"Regular Hadamard size must be a power of 4, got {c}",
            "ValueError",
            LAYER,
            None,
            True,
            "ConvRot size comfy-kitchen cannot build",
            "re-quantize with convrot_groupsize 16, 64 or 256",
        )
    return None


def first_forward(marker: dict, t: dict) -> Violation | None:
    """What the first forward of a W4A8 layer of this class raises under the pinned
    comfy-kitchen, once it loaded (a template naming ``LAYER``): its operands' dtypes, then
    ``operands``.  None also when the layer does not load or its geometry cannot be read (the
    0.2.40 verdict stands)."""
    from ..formats.base import GeometryError
    from ..formats.w4a8 import ASYM_W4A8_INT8, model_geometry
    from .kitchen import VIEWS, forward_templates, marker_ints

    marker, refused = marker_ints(FORMAT, marker)  # ComfyUI reads the sizes through int()
    w = t.get("weight")
    if refused is not None or w is None or len(w.shape) != 2:
        return None
    if w.dtype != "I8":  # ComfyUI casts the stored weight to the layout's dtype by value
        t = dict(t, weight=type(w)(w.name, "I8", w.shape, w.start, w.end, w.file))
    typed = forward_templates("comfyui", FORMAT, t, VIEWS.get(FORMAT))
    if typed:
        return typed[0]
    try:
        env = model_geometry(t, ASYM_W4A8_INT8.params(marker))
    except (GeometryError, KeyError, TypeError, ValueError):
        return None
    return operands(t, env)


def pinned_violations(
    violations: list[Violation], forwards: dict[str, Violation | None], keys: dict[str, list], cause: str
) -> list[Violation] | None:
    """The verdict's ``violations`` (comfy-kitchen 0.2.40's) with each W4A8 layer's first
    forward as the pinned comfy-kitchen runs it (``forwards``: layer -> its violation bound to
    the layer, or None when it runs; ``keys``: the module-order key of each layer that fails),
    or None when nothing changes.

    The forward is reached only when nothing fails before it: when the 0.2.40 verdict's first
    error is a load error (or another layer's forward error, which is taken to come first)
    nothing changes.  Otherwise each W4A8 layer's 0.2.40 forward error is replaced by its pinned
    one in place, and a layer that ran with 0.2.40 but not with the pinned comfy-kitchen gets
    its error at its place in module order among the forward errors."""
    from .base import module_order

    first = next((i for i, v in enumerate(violations) if v.blocking), None)
    if first is not None:
        f = violations[first]
        if f.layer not in forwards or f.rule not in FORWARD_RULES:
            return None
    out: list[Violation] = []
    seen: set[str] = set()
    changed = False
    for v in violations:
        if v.blocking and v.layer in forwards and v.rule in FORWARD_RULES:
            seen.add(v.layer)
            new = forwards[v.layer]
            if new is None or new.rule != v.rule or new.message != v.message:
                changed = True
                if new is not None:
                    new.cause = new.cause or cause
                    new.fix = v.fix or new.fix
                    out.append(new)
                continue
        out.append(v)
    added = [p for p in forwards if p not in seen and forwards[p] is not None]
    if not added:
        return out if changed else None
    keys = dict(keys)
    for v in out:
        if v.blocking and v.layer and v.layer not in keys:
            keys[v.layer] = module_order(v.layer)
    pending = sorted(added, key=keys.__getitem__)
    merged: list[Violation] = []
    last = max((i for i, v in enumerate(out) if v.blocking), default=len(out) - 1)
    for i, v in enumerate(out):
        while pending and v.blocking and v.layer and keys[pending[0]] < keys[v.layer]:
            merged.append(_ran_with_newer(forwards[pending.pop(0)], cause))
        merged.append(v)
        if i == last:
            merged.extend(_ran_with_newer(forwards[p], cause) for p in pending)
            pending = []
    merged.extend(_ran_with_newer(forwards[p], cause) for p in pending)
    return merged


def _ran_with_newer(v: Violation | None, cause: str) -> Violation:
    """A W4A8 layer's pinned forward error where comfy-kitchen 0.2.40 runs the layer."""
    assert v is not None
    v.cause = f"{v.cause}; {cause}" if v.cause else cause
    v.fix = (
        v.fix
        or "load it with comfy-kitchen 0.2.40 (which reads 6-bit W4A8 rows), or re-quantize 4-bit (comfyquant fix --allow-lossy)"
    )
    return v


def bound(template: Violation | None, layer: str) -> Violation | None:
    return None if template is None else bind([template], layer)[0]
