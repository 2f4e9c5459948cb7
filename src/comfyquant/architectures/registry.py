"""ComfyUI 0.33.0's path from a file's keys to a model (``comfy/sd.py``
``load_diffusion_model_state_dict``, ``comfy/model_detection.py``), on names and shapes only.

1. The prefix: of ``model.diffusion_model.``, ``model.model.`` and ``net.``, the one most keys
   start with when more than five do, else ``model.``.  Every key with it loses it and every key
   without it is dropped, unless no key has it (then the keys stay as they are).
2. Detection: ComfyUI's checks in its order; the first that fires decides the architecture (an
   architecture checked earlier wins over a later one whose keys are there too).  Flux and Wan
   are described (``flux``, ``wan``); the checks before them are named so that a file they
   catch is not read as Flux or Wan.
3. The model class: the configuration must match one of ComfyUI's ``supported_models``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

from . import flux, wan
from .base import Detected, Shapes

PREFIX_CANDIDATES = ("model.diffusion_model.", "model.model.", "net.")
"""In ComfyUI's order (``unet_prefix_from_state_dict``)."""
DEFAULT_PREFIX = "model."

EARLIER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mmdit", ("joint_blocks.0.context_block.attn.qkv.weight",)),
    ("stable_cascade", ("clf.1.weight",)),
    ("stable_audio", ("transformer.rotary_pos_emb.inv_freq",)),
    ("aura_flow", ("double_layers.0.attn.w1q.weight",)),
    ("hydit", ("mlp_t5.0.weight",)),
    ("hunyuan_video", ("txt_in.individual_token_refiner.blocks.0.norm1.weight",)),
)
"""Checks ComfyUI runs before Flux's, by the keys that make them fire (named, not described)."""
BETWEEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mochi_preview", ("t5_yproj.weight",)),
    ("ltxv", ("adaln_single.emb.timestep_embedder.linear_1.bias",)),
    ("pixart", ("t_block.1.weight",)),
    ("cosmos", ("blocks.block0.blocks.0.block.attn.to_q.0.weight",)),
    ("lumina2", ("cap_embedder.1.weight", "noise_refiner.0.attention.k_norm.weight")),
    ("cogvideox", ("blocks.0.norm1.linear.weight",)),
)
"""Checks ComfyUI runs after Flux's and before Wan's."""
DESCRIBED = (flux, wan)
MIN_SIGNATURE = 3
"""How many of an architecture's signature keys show that a file holds it."""


def comfyui_prefix(names) -> str:
    """The prefix ``unet_prefix_from_state_dict`` picks."""
    return _prefix_of("\n" + "\n".join(names))


def _prefix_of(text: str) -> str:
    """``comfyui_prefix`` of the names a text holds, each after a newline: the candidates
    exclude each other (no key starts with two), so each is counted on its own."""
    counts = {c: text.count("\n" + c) for c in PREFIX_CANDIDATES}
    top = max(counts, key=lambda c: counts[c])
    return top if counts[top] > 5 else DEFAULT_PREFIX


class Resolution:
    """What ComfyUI makes of a file's keys."""

    def __init__(self, prefix: str, kept: Mapping[str, tuple[int, ...]], dropped: list[str] | None = None) -> None:
        self.prefix = prefix
        self.kept = kept
        self.dropped = dropped if dropped is not None else []
        self.detected: Detected | None = None
        self.resembles: str | None = None
        self.resembles_prefix = ""
        self.failure: tuple[str, str] | None = None

    prefix: str
    """The prefix stripped ("" when no key had the one ComfyUI picked)."""
    kept: Mapping[str, tuple[int, ...]]
    """The keys ComfyUI detects and loads from, without the prefix, with their shapes."""
    dropped: list[str]
    """Keys dropped for lacking the prefix (as stored)."""
    detected: Detected | None
    """The architecture ComfyUI detects (None: none it knows, or none described here)."""
    resembles: str | None
    """A described architecture the file holds (under whatever prefix), when ComfyUI's own
    detection does not end in it: the file is that model and ComfyUI will not load it."""
    resembles_prefix: str
    failure: tuple[str, str] | None
    """(exception, message) detection ends in for a file that resembles a described
    architecture; the message's path is ``{path}`` (the caller's)."""


def resemblance(names) -> tuple[str, str] | None:
    """(architecture, prefix) of a described architecture whose signature keys the file holds
    under one prefix, the most signature keys winning; None when none does."""
    best: tuple[int, str, str] | None = None
    for arch in DESCRIBED:
        counts: dict[str, int] = {}
        for sig in arch.SIGNATURE:
            for name in names:
                if name.endswith(sig) and (len(name) == len(sig) or name[-len(sig) - 1] == "."):
                    p = name[: -len(sig)]
                    counts[p] = counts.get(p, 0) + 1
        for p, n in counts.items():
            if n >= MIN_SIGNATURE and (best is None or n > best[0]):
                best = (n, arch.NAME, p)
    return (best[1], best[2]) if best else None


def _fires(keys, wanted) -> bool:
    return all(k in keys for k in wanted)


def resolve(shapes: Mapping[str, tuple[int, ...]], quantized, extra: Iterable[str] = ()) -> Resolution:
    """ComfyUI's prefix rule and detection on a file's keys (``shapes``: name -> shape, as
    stored, a dict or a ``Shapes`` view of header entries); ``quantized``: whether some layer
    ComfyUI keeps carries a marker (ComfyUI then sets the quantization config on the model class
    it found), or a function of the prefix that tells; ``extra``: keys ComfyUI adds before
    choosing the prefix (the header map's markers), counted for the prefix only."""
    text = shapes.text() if isinstance(shapes, Shapes) else "\n" + "\n".join(shapes)
    extra = list(extra)
    prefix = _prefix_of(text + "\n" + "\n".join(extra) if extra else text)
    # the markers ComfyUI adds from the header map are keys too: when only they carry the
    # prefix, stripping it keeps them alone and every tensor is dropped
    marked_only = "\n" + prefix not in text and any(e.startswith(prefix) for e in extra)
    if "\n" + prefix not in text and not marked_only:
        prefix = ""  # no key has it: the keys stay as they are
    kept: Mapping[str, tuple[int, ...]]
    if marked_only:
        kept = {}
    elif isinstance(shapes, Shapes):
        kept = shapes.stripped(prefix) if prefix else shapes
    else:
        kept = {k[len(prefix) :]: s for k, s in shapes.items() if k.startswith(prefix)}
    if len(kept) == len(shapes):
        dropped: list[str] = []
    elif kept or marked_only:
        dropped = [k for k in shapes if not k.startswith(prefix)]
    else:
        prefix, kept, dropped = "", shapes, []
    if callable(quantized):
        quantized = quantized(prefix)
    res = Resolution(prefix, kept, dropped)
    res.detected, res.failure = _detect(kept, prefix, quantized)
    if res.detected is None or res.detected.model is None:
        seen = resemblance(shapes)
        if seen is not None and (res.detected is None or res.detected.name != seen[0]):
            res.resembles, res.resembles_prefix = seen
    if res.failure is None and res.detected is None and res.resembles is not None:
        res.failure = ("RuntimeError", "ERROR: Could not detect model type of: {path}\n{hint}")
    return res


def _detect(keys: Mapping, prefix: str, quantized: bool) -> tuple[Detected | None, tuple[str, str] | None]:
    for name, wanted in EARLIER:
        if _fires(keys, wanted):
            return Detected(name, None, {}, prefix), None
    if flux.fires(keys):
        return _described(flux, keys, prefix, quantized)
    for name, wanted in BETWEEN:
        if _fires(keys, wanted):
            return Detected(name, None, {}, prefix), None
    if wan.fires(keys):
        missing = wan.missing_read(keys)
        if missing is not None:
            return None, ("KeyError", repr(missing))
        return _described(wan, keys, prefix, quantized)
    return None, None


def _described(arch, keys: Mapping, prefix: str, quantized: bool) -> tuple[Detected | None, tuple[str, str] | None]:
    image_model, dims, read = arch.configure(keys)
    cls = arch.model_class(image_model, dims)
    if cls is None:
        if quantized:  # model_config_from_unet sets quant_config on the None it found
            return None, ("AttributeError", "'NoneType' object has no attribute 'quant_config'")
        return None, ("RuntimeError", "ERROR: Could not detect model type of: {path}\n{hint}")
    found = Detected(image_model, cls, dims, prefix, {prefix + k: v for k, v in read.items()})
    found.model = _built(arch, image_model, tuple(dims.items()))
    found.dropped_correction = arch.DROPPED_CORRECTION
    return found, None


@lru_cache(maxsize=16)
def _built(arch, image_model: str, dims: tuple):
    """``arch.build``, once per configuration: a model description never changes (a 14B Wan
    lists about 1,400 parameters)."""
    return arch.build(image_model, dict(dims))


def failure_message(message: str, path: str) -> str:
    """The detection failure as ComfyUI words it for the file at ``path``
    (``model_detection_error_hint`` adds a hint when the file name holds 'lora')."""
    import os

    hint = ""
    if "lora" in os.path.basename(path).lower():
        hint = (
            "\nHINT: This seems to be a Lora file and Lora files should be put in the lora folder and "
            "loaded with a lora loader node.."
        )
    return message.replace("{hint}", hint).replace("{path}", path)
