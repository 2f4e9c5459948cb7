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

MULTIPLES = (1, 2, 4, 8, 16, 32, 64, 128)
"""Factors between a size and a companion tensor's dimension (a block or group count): the
candidate sizes are every dimension of the layer's other tensors times each."""


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
    """The marker that says the layer's size: its own where it names a known format, else the
    format the layer's tensors show (the marker unchanged when they show none)."""
    from ..formats.registry import FORMATS, infer_format

    named = marker.get("format") if isinstance(marker, dict) else None
    if isinstance(named, str) and named in FORMATS:
        return marker
    shown = infer_format(tensors)
    return marker if shown is None else {"format": shown.name}


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
    """The (N, K) most of a formatted layer's tensors record (``_decide``): the weight speaks
    for the size its format reads off it, every other tensor for the sizes under which the
    format gives it its stored shape.  The tensors are read with the marker's parameters or the format's defaults,
    whichever more of them agree with the weight under (a release that reads no marker does not
    take its group size from it); a weight whose columns are the output size the others record
    is stored transposed, and is read so.  None when the format does not read the layer."""
    from ..formats.registry import FORMATS

    fmt = marker.get("format") if isinstance(marker, dict) else None
    desc = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if desc is None:
        return None
    others = {s: e for s, e in tensors.items() if s not in ("weight", "comfy_quant") and len(e.shape) >= 1}
    readings = [(m, r) for m in (marker, {"format": desc.name}) if (r := _geometry(desc, tensors, m)) is not None]
    if not others or not readings:
        return None
    used, env = max(readings, key=lambda mr: _agreeing(desc, mr[1], others))  # the marker's on a tie
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
    return _decide(desc, env, sizes, others)


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
        params = desc.params(marker if isinstance(marker, dict) else {"format": desc.name})
        if desc.name == "asym_w4a8_int8":  # the size its tensors show together (formats/w4a8 model_geometry)
            from ..formats.w4a8 import model_geometry

            return model_geometry(tensors, params)
        return desc.geometry(tensors, params)
    except (GeometryError, KeyError, TypeError, ValueError, ArithmeticError):
        return None


def _candidates(others: dict, env: dict) -> set[int]:
    """Sizes another tensor may record: each of its dimensions times each of ``MULTIPLES`` and
    each whole-number parameter of the geometry (a group size)."""
    factors = set(MULTIPLES) | {v for v in env.values() if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4096}
    return {d * f for e in others.values() for d in e.shape if d > 0 for f in factors}


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


def _decide(desc, env: dict, sizes: dict, others: dict) -> tuple[int, int]:
    """The (N, K) with the most voices: the other tensors that have the shape the format gives
    them there, and the weight's for each dimension it records.  The weight's own size wins a
    tie; a size the constraints refuse loses to the nearest they allow that another tensor
    speaks for."""
    own = (sizes["N"], sizes["K"])
    near = [{v for v in _candidates(others, env) if own[i] // 4 <= v <= own[i] * 4} | {own[i]} for i in range(2)]

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

    def speaking(n: int, k: int) -> set[str]:
        shapes = _shapes(desc, at(n, k), recording)
        return {s for s, e in recording.items() if shapes[s] == tuple(e.shape)}

    def nearness(p: tuple[int, int]) -> tuple:
        return (abs(p[0] - own[0]) + abs(p[1] - own[1]), p)

    heard = {(n, k): speaking(n, k) for n in near[0] for k in near[1]}
    votes = {p: len(h) + (p[0] == own[0]) + (p[1] == own[1]) for p, h in heard.items()}
    if not _allowed(desc, at(*own)):  # no valid layer at the weight's size: one its other tensors record
        fits = [
            p
            for p, h in heard.items()
            if p != own and _allowed(desc, at(*p)) and all(p[i] == own[i] or h & records[i] for i in range(2))
        ]
        if fits:
            return min(fits, key=lambda p: (-votes[p], nearness(p)))
    return min(votes, key=lambda p: (-votes[p], p != own, nearness(p)))


def _allowed(desc, env: dict) -> bool:
    return all(c.holds(env) for c in desc.constraints)
