"""The size of the plain ``Linear`` a ComfyUI release builds for a layer it does not read as
quantized (a release that reads no tensor marker, or knows no such format).

The release builds the model's layer, whose size the file does not state outright: each of the
layer's tensors records it in the format they are stored in.  A weight stored at another size
than its scales and bias (a row too many, packed codes transposed, storage padded) is outvoted
by them; with no architecture described, the size most of the layer's tensors record is the one
taken as the model's.  Where the marker is unreadable, the format the tensors show
(``formats.registry.infer_format``) says how they record it.
"""

from __future__ import annotations

from types import SimpleNamespace


def plain_size(layer, marker: dict | None) -> tuple[int, int] | None:
    """The (N, K) of the plain ``Linear`` a release builds for ``layer`` (None when its weight
    says nothing: absent or not 2-D or 3-D).  A 3-D weight is read as its rows, flattened."""
    w = layer.tensors.get("weight")
    if w is None or len(w.shape) not in (2, 3):
        return None
    if len(w.shape) == 3:  # stacked or unsqueezed: the model's rows are its leading dimensions'
        from ..io.header import TensorEntry

        flat = TensorEntry(w.name, w.dtype, (w.shape[0] * w.shape[1], w.shape[2]), w.start, w.end, w.file)
        layer = SimpleNamespace(tensors={**layer.tensors, "weight": flat})
    marker = readable(layer.tensors, marker)
    voted = _voted(layer.tensors, marker)
    return voted if voted is not None else _unformatted(layer, marker)


def readable(tensors: dict, marker: dict | None) -> dict | None:
    """The marker that says the layer's size: its own where it names a known format, else its
    own with the format the layer's tensors show (the marker unchanged when they show none)."""
    from ..formats.registry import FORMATS, infer_format

    named = marker.get("format") if isinstance(marker, dict) else None
    if isinstance(named, str) and named in FORMATS:
        return marker
    shown = infer_format(tensors)
    if shown is None:
        return marker
    return {**marker, "format": shown.name} if isinstance(marker, dict) else {"format": shown.name}


def _unformatted(layer, marker: dict | None) -> tuple[int, int] | None:
    """The size of a layer no format describes, or whose format's reading fails: the size the
    file records (``comfyui_model.recorded_size``), N the output size most of the layer's
    tensors show (``kitchen_int8.model_rows``); an unpacked weight whose columns are that N is
    stored transposed, and its rows are K."""
    from .comfyui_model import recorded_size
    from .kitchen_int8 import model_rows

    size = recorded_size(layer, marker, True)
    if size is None:
        return None
    rows, cols = layer.tensors["weight"].shape
    if size[0] != rows:  # the format reads N off its other tensors already
        return size
    n = model_rows(layer.tensors, rows)
    if n != rows and size[1] == cols == n:
        return n, rows
    return n, size[1]


def _voted(tensors: dict, marker: dict | None) -> tuple[int, int] | None:
    """The (N, K) the layer's tensors record, in the format ``marker`` names (``_decide``): the
    weight speaks for the size its format reads off it, every other tensor for the sizes under
    which the format gives it its stored shape.  They are read with the parameters under which
    most of them agree with the weight (``_parameters``), or with a common group size in place
    of one the marker states where all of them, the weight included, agree only then
    (``_restated``): a release that reads no marker does not take a group size from it.  An
    unpacked weight whose columns are the output size the others record is stored transposed,
    and is read so.  None when the format does not read the layer."""
    from ..formats.registry import FORMATS

    fmt = marker.get("format") if isinstance(marker, dict) else None
    desc = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if desc is None:
        return None
    others = {s: e for s, e in tensors.items() if s not in ("weight", "comfy_quant") and len(e.shape) >= 1}
    readings = [(m, r) for m in _parameters(desc, marker or {}) if (r := _geometry(desc, tensors, m)) is not None]
    if not others or not readings:
        return None
    used, env = max(readings, key=lambda mr: _agreeing(desc, mr[1], others))  # the marker's on a tie
    whole = {"weight": tensors["weight"], **others}
    if _agreeing(desc, env, whole) < len(whole):  # a stated group size the tensors contradict: one they all agree with
        used, env = next(
            ((m, r) for m, r in _restated(desc, tensors, marker or {}) if _agreeing(desc, r, whole) == len(whole)), (used, env)
        )
    sizes = _sizes(env)
    if sizes is None:
        return None
    w = tensors["weight"]
    if w.shape[0] != w.shape[1] == env.get("K"):  # an unpacked weight stored transposed: its rows are the K it records
        from ..io.header import TensorEntry

        flipped = TensorEntry(w.name, w.dtype, (w.shape[1], w.shape[0]), w.start, w.end, w.file)
        turned = _geometry(desc, {**tensors, "weight": flipped}, used)
        turned_sizes = _sizes(turned) if turned is not None else None
        if (
            turned is not None
            and turned_sizes is not None
            and turned_sizes["N"] != sizes["N"]
            and _agreeing(desc, turned, others) > _agreeing(desc, env, others) + 1  # the weight speaks for itself
        ):
            sizes = {"N": turned_sizes["N"], "K": w.shape[0]}
            env = dict(turned, K=w.shape[0], K_model=w.shape[0])
    return _decide(desc, env, (sizes["N"], sizes["K"]), others)


GROUP_SIZES = (16, 32, 64, 128, 256)
"""Group sizes tried for a whole-number parameter (a group or rotation size) of the marker."""


def _parameters(desc, marker: dict) -> list[dict]:
    """The markers the layer is read with, in order of preference: its own, the format's
    defaults, and its own with each whole-number parameter it does not state, or states as a
    value the format refuses, at each of ``GROUP_SIZES``."""
    out = [marker, {"format": desc.name}]
    for key in desc.keys:
        if int in key.types and key.name != "format" and not _stated(key, marker):
            out += [{**marker, key.name: v} for v in GROUP_SIZES if v != key.default]
    return out


def _restated(desc, tensors: dict, marker: dict):
    """(marker, geometry) with each whole-number parameter the marker states at each other of ``GROUP_SIZES``."""
    for key in desc.keys:
        if int in key.types and key.name != "format" and _stated(key, marker):
            for v in GROUP_SIZES:
                if v != marker[key.name]:
                    m = {**marker, key.name: v}
                    r = _geometry(desc, tensors, m)
                    if r is not None:
                        yield m, r


def _stated(key, marker: dict) -> bool:
    """Whether ``marker`` states a value of ``key`` the format takes (of its type, allowed)."""
    if key.name not in marker:
        return False
    value = marker[key.name]
    return isinstance(value, key.types) and not (isinstance(value, bool) and bool not in key.types) and key.valid(value)


def _sizes(env: dict) -> dict | None:
    sizes = {d: env.get(f"{d}_model", env.get(d)) for d in ("N", "K")}
    return sizes if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes.values()) else None


def _agreeing(desc, env: dict, others: dict) -> int:
    """How many of ``others`` have the shape the format gives them under ``env``."""
    shapes = _shapes(desc, env, others)
    return sum(shapes[s] == tuple(e.shape) for s, e in others.items())


def _geometry(desc, tensors: dict, marker: dict | None) -> dict | None:
    from ..formats.base import GeometryError

    try:
        return desc.model_geometry(tensors, desc.params(marker if isinstance(marker, dict) else {"format": desc.name}))
    except (GeometryError, KeyError, TypeError, ValueError, ArithmeticError):
        return None


def _candidates(others: dict, env: dict) -> tuple[set[int], set[int]]:
    """Sizes the other tensors may record: an output size is one of their dimensions; an input
    size one of them times a power of two up to 128 (a block or group count) or times a
    whole-number parameter of the geometry (a group size)."""
    dims = {d for e in others.values() for d in e.shape if d > 0}
    factors = {1, 2, 4, 8, 16, 32, 64, 128} | {
        v for v in env.values() if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4096
    }
    return dims, {d * f for d in dims for f in factors}


def _shapes(desc, env: dict, others: dict) -> dict[str, tuple | None]:
    """The shape the format gives each of ``others`` under ``env`` (None: none, or forbidden)."""
    slots = desc.slots_for(env)
    out: dict[str, tuple | None] = {}
    for suffix in others:
        slot = slots.get(suffix)
        try:
            out[suffix] = None if slot is None or slot.is_forbidden(env) else tuple(slot.expected_shape(env))
        except (ArithmeticError, TypeError, ValueError, KeyError, NameError):
            out[suffix] = None
    return out


def _decide(desc, env: dict, own: tuple[int, int], others: dict) -> tuple[int, int]:
    """The (N, K) the layer's tensors record.  The other tensors' consensus is the size most of
    them speak for (among those the format's constraints allow, if any), nearest the weight's;
    each dimension then keeps the weight's own size unless more tensors speak for the
    consensus's than for the weight's with the other dimension at the consensus (the weight's
    voice counted), or the weight's own size makes no valid layer and another tensor records
    that dimension."""

    def at(n: int, k: int) -> dict:
        out = dict(env)
        for name, v in (("N", n), ("K", k)):
            if out.get(f"{name}_model", out.get(name)) == out.get(name):  # stored at the model's size (not padded)
                out[name] = v
            out[f"{name}_model"] = v
        return out

    still = _shapes(desc, at(*own), others)
    records = [  # per dimension, the tensors whose shape moves with it
        {s for s, shape in _shapes(desc, at(2 * own[0], own[1]), others).items() if shape != still[s]},
        {s for s, shape in _shapes(desc, at(own[0], 2 * own[1]), others).items() if shape != still[s]},
    ]
    recording = {s: e for s, e in others.items() if s in records[0] | records[1]}
    if not recording:
        return own
    heard: dict[tuple[int, int], int] = {}

    def voices(p: tuple[int, int]) -> int:
        if p not in heard:
            heard[p] = _agreeing(desc, at(*p), recording)
        return heard[p]

    def nearness(p: tuple[int, int]) -> tuple:
        return (abs(p[0] - own[0]) + abs(p[1] - own[1]), p)

    ns, ks = _candidates(recording, env)
    pairs = [(n, k) for n in ns | {own[0]} for k in ks | {own[1]}]
    valid = [p for p in pairs if _allowed(desc, at(*p))]
    consensus = min(valid or pairs, key=lambda p: (-voices(p), nearness(p)))
    out = list(own)
    for i in (0, 1):
        if own[i] == consensus[i]:
            continue
        mine = (own[0], consensus[1]) if i == 0 else (consensus[0], own[1])
        if (
            not _allowed(desc, at(*mine))
            and _allowed(desc, at(*consensus))
            and _agreeing(desc, at(*consensus), {s: recording[s] for s in records[i]})
        ):
            out[i] = consensus[i]  # no valid layer at the weight's size: the one another tensor records
        elif voices(mine) + 1 < voices(consensus):
            out[i] = consensus[i]
    return out[0], out[1]


def _allowed(desc, env: dict) -> bool:
    return all(c.holds(env) for c in desc.constraints)
