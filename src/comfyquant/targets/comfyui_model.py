"""ComfyUI 0.33.0's whole-model path around the per-layer rules (``comfy/sd.py``
``load_diffusion_model``): the prefix it strips and the keys it drops, the architecture it
detects, the true size of every layer it builds, and what ``load_state_dict(strict=False)``
leaves uninitialised.

The per-layer rules (``comfyui``) judge each layer at the size the file records; this module
says where the model disagrees: ComfyUI builds each ``Linear`` at the size its architecture
gives it (``comfyquant.architectures``), checks a plain layer's tensors and every bias against
that size at load, hands a quantized layer's weight to comfy-kitchen with that size as its
``orig_shape``, and assigns an unmarked weight of a quantized model unchecked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..architectures.base import Linear, Shapes
from ..architectures.registry import Resolution, failure_message, resolve
from .base import Violation

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint

CUT_ON_CPU = frozenset({"float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8"})
"""Formats ComfyUI dequantizes on CPU (no FP8/FP4 compute) to the layer's ``orig_shape``: a
weight that holds at least the model's rows and columns is cut back to them."""


class Reading(NamedTuple):
    """How a ComfyUI release reads a file where it differs from ComfyUI 0.33.0 in ways the
    whole-model verdict (``comfyui.comfyui_verdict``) follows."""

    map_after_prefix: bool = False
    """The header map is folded into the keys only after the diffusion-model prefix is chosen
    and stripped: its entries match the stripped names only, its keys play no part in the
    choice, and any of them makes the model quantized."""
    cut_on_cpu: frozenset = CUT_ON_CPU
    """The formats dequantized and cut to the model's size on CPU (the others meet the input at
    their stored size)."""


NEWEST_READING = Reading()

WHOLE_MODEL = "comfyui.whole_model"
"""Where a check keeps ComfyUI 0.33.0's ``WholeModel`` of the file (``ckpt.shared``), for the
release verdicts: the order its modules load in, and each layer's size in the model."""


class WholeModel:
    """What ComfyUI makes of one checkpoint as a whole model."""

    __slots__ = ("resolution", "path", "quantized", "_reg", "_exe", "_linears")

    def __init__(self, resolution: Resolution, path: str, quantized: bool) -> None:
        self.resolution = resolution
        self.path = path
        self.quantized = quantized
        model = self.model
        self._reg = model.registration_index() if model is not None else {}
        self._exe = model.execution_index() if model is not None else {}
        # each layer's true size under its stored name: one look-up per layer of the file
        prefix = resolution.prefix
        linears = model.linears if model is not None else {}
        self._linears = {prefix + name: lin for name, lin in linears.items()} if prefix else linears

    @property
    def registration(self) -> dict[str, int]:
        """Each module's place in the order the model registers them, by its name in the model."""
        return self._reg

    @property
    def model(self):
        d = self.resolution.detected
        return d.model if d is not None else None

    def model_name(self, stored: str) -> str | None:
        """The name a stored layer has in ComfyUI's model (None: dropped with its prefix)."""
        prefix = self.resolution.prefix
        if not prefix:
            return stored
        return stored[len(prefix) :] if stored.startswith(prefix) else None

    def kept(self, stored: str) -> bool:
        """Whether a stored layer is loaded (False: dropped with the keys outside the prefix)."""
        prefix = self.resolution.prefix
        return not prefix or stored.startswith(prefix)

    def linear(self, stored: str) -> Linear | None:
        return self._linears.get(stored)

    def load_key(self, stored: str | None):
        """A stored layer's place in the order ``load_state_dict`` visits modules."""
        name = self.model_name(stored) if stored else None
        return self._reg.get(name, len(self._reg)) if name is not None else -1

    def forward_key(self, stored: str | None):
        name = self.model_name(stored) if stored else None
        return self._exe.get(name, len(self._exe)) if name is not None else -1

    def describe(self) -> dict:
        """The architecture ComfyUI detects, for ``check`` and ``inspect``: ``name`` (None when it
        detects none), its ``dims``, the ``prefix`` it strips, how many keys it ``dropped``, and a
        ``note`` saying how the layers are judged."""
        res = self.resolution
        d = res.detected
        out: dict = {"name": None, "model_class": None, "dims": {}, "prefix": res.prefix, "dropped": len(res.dropped)}
        if d is not None:
            out.update(d.to_dict())
            out["dropped"] = len(res.dropped)
            out["note"] = (
                "layers judged at the sizes the model builds them with"
                if d.model is not None
                else f"ComfyUI detects {d.name}, which comfyquant does not describe: layers judged at the sizes the file records"
            )
        elif res.failure is not None:
            out["resembles"] = res.resembles
            out["note"] = f"the file holds a {res.resembles} model, but ComfyUI detects no architecture from its keys"
        else:
            out["note"] = "architecture not recognised: layers judged at the sizes the file records"
        return out

    def failure(self) -> Violation | None:
        """What detection raises, for a file that holds a described architecture."""
        res = self.resolution
        if res.failure is None:
            return None
        exc, message = res.failure
        if exc == "RuntimeError":
            message = failure_message(message, self.path)
        where = f" under the prefix {res.resembles_prefix!r}" if res.resembles_prefix else ""
        return Violation(
            "comfyui.detect",
            message,
            exc,
            None,
            None,
            True,
            _failure_cause(res, where)
            if exc == "RuntimeError"
            else f"ComfyUI's {res.resembles or 'model'} detection reads a key the file lacks or matches no model class",
            "store every key of the model under one prefix ComfyUI knows (model.diffusion_model.) or none",
        )


def _failure_cause(res: Resolution, where: str) -> str:
    if res.prefix:
        kept = f"keeps only the keys under '{res.prefix}' ({len(res.dropped)} dropped)"
    else:
        kept = "finds no key under a prefix it strips and reads the keys as stored"
    return f"the file holds a {res.resembles} model{where}; ComfyUI {kept} and detects no architecture from them"


def whole_model(ckpt: Checkpoint, markers: dict, map_after_prefix: bool = False) -> WholeModel:
    """ComfyUI's reading of ``ckpt`` as a whole model (``markers``: the per-layer markers ComfyUI
    ends up with).  Header only.  ``map_after_prefix``: as a release that folds the header map
    in after it chose and stripped the prefix (``Reading``)."""
    # header map markers become '<layer>.comfy_quant' keys when converted, under the names the
    # map gives them (before any prefix is chosen), whether or not a layer has that name
    records = ckpt.markers.records if ckpt.markers is not None else ()
    named = {rec.prefix + ".comfy_quant" for rec in records if rec.kind == "header"}
    extra = [key for key in named if key not in ckpt.tensors] if not map_after_prefix else []
    marked = set(markers) | {p for p, d in ckpt.foreign.items() if "legacy" in d}
    mapped = map_after_prefix and bool(named)

    def kept_marked(prefix: str) -> bool:
        return mapped or any(not prefix or p.startswith(prefix) for p in marked)

    res = resolve(Shapes(ckpt.tensors), kept_marked, extra)
    path = ckpt.paths[0] if ckpt.paths else ""
    return WholeModel(res, path, kept_marked(res.prefix))


def architecture_of(ckpt: Checkpoint) -> dict:
    """``WholeModel.describe`` for a checkpoint outside a verdict (``inspect``): the markers are
    the checkpoint's merged ones."""
    markers = {p: m for p, m in (ckpt.markers.effective.items() if ckpt.markers is not None else ()) if m is not None}
    return whole_model(ckpt, markers).describe()


def recorded_fits(layer, marker: dict | None, true: Linear) -> bool | None:
    """Whether the layer's stored weight is one of the model's true (N, K) in its format's
    storage (padding included); None when the format cannot say."""
    w = layer.tensors.get("weight")
    if w is None or len(w.shape) != 2:
        return None
    fmt = marker.get("format") if isinstance(marker, dict) else None
    if fmt is None or marker is None:
        return tuple(w.shape) == (true.n, true.k)
    from ..formats.base import GeometryError, pad
    from ..formats.registry import FORMATS

    desc = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if desc is None:
        return None
    try:
        env = desc.geometry(layer.tensors, desc.params(marker))
    except (GeometryError, KeyError, TypeError, ValueError):
        return None
    rows, cols = desc.pad or (1, 1)
    env = dict(env, N=pad(true.n, rows or 1), K=pad(true.k, cols or 1), N_model=true.n, K_model=true.k)
    slot = next((s for s in desc.slots if s.suffix == "weight"), None)
    try:
        expected = tuple(slot.expected_shape(env)) if slot is not None else None
    except (ArithmeticError, TypeError, ValueError, KeyError, NameError):
        return None
    return expected == tuple(w.shape) if expected is not None else None


def recorded_size(layer, marker: dict | None, defaults: bool = False) -> tuple[int, int] | None:
    """The (N, K) the file records for a layer (its weight's reading in its format);
    ``defaults``: where the format refuses a marker value, read with the format's defaults."""
    w = layer.tensors.get("weight")
    if w is None or len(w.shape) != 2:
        return None
    fmt = marker.get("format") if isinstance(marker, dict) else None
    if fmt is None or marker is None:
        return w.shape[0], w.shape[1]
    from ..formats.base import GeometryError
    from ..formats.registry import FORMATS

    desc = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if desc is None:
        return None

    try:
        env = desc.model_geometry(layer.tensors, desc.params(marker))
    except (GeometryError, KeyError, TypeError, ValueError, ArithmeticError):
        if not defaults:
            return None
        # a marker value the format refuses (a group size of 0): the stored tensors still
        # record the layer's size, read with the format's defaults
        try:
            env = desc.model_geometry(layer.tensors, desc.params({"format": fmt}))
        except (GeometryError, KeyError, TypeError, ValueError, ArithmeticError):
            return None
    n, k = env.get("N_model", env.get("N")), env.get("K_model", env.get("K"))
    return (n, k) if isinstance(n, int) and isinstance(k, int) else None


def size_mismatch(name: str, suffix: str, have: tuple, want: tuple) -> str:
    """torch's ``load_state_dict`` line for a tensor of another shape than the model's."""

    def size(s) -> str:
        return f"torch.Size([{', '.join(str(d) for d in s)}])"

    return (
        f"size mismatch for {name}.{suffix}: copying a param with shape {size(have)} from checkpoint, "
        f"the shape in current model is {size(want)}."
    )
