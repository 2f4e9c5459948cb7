"""GGUF files of city96's ComfyUI-GGUF (ComfyUI-GGUF `loader.py`, `tools/convert.py`).

GGUF is another container: ``reader`` opens it as a virtual safetensors file in which
every tensor has its original name and shape, dense tensors are the file's own bytes and
every quantized ggml type is already decoded into F32 (exactly, by ``gguf.quants``).  This
dialect recognises that view by its metadata and claims every layer whose tensor was
quantized in the GGUF: no Comfy format holds those numbers (Q8_0 is int8 codes times one FP16
scale per 32 weights along K; the K-quants nest 6-bit sub-block scales and mins inside
256-weight super-blocks; the IQ types index lattices), so each such layer is LOSSY: its exact
form is the dense F32 weight, and ``--allow-lossy`` requantizes it into the Comfy format of
the nearest bit depth.  Dense tensors (F32, F16, BF16) are plain dense layers.

No runtime comfyquant models loads a GGUF file: ComfyUI needs the ComfyUI-GGUF custom node,
SGLang reads safetensors.  The notes say what ComfyUI-GGUF itself would do with the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...io.jsontext import parse as parse_json
from ...targets.base import RuntimeFailure
from ..base import EXACT, LOSSY, Claim, Container, Dialect, Lossy, Move, Translation
from .keys import ARCH_KEY, CONTAINER_KEY, DENSE, ORIG_SHAPE_KEY, TYPES_KEY, is_gguf

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "gguf"

COMFYUI_GGUF_IMAGE_ARCHS = (
    "flux",
    "sd1",
    "sdxl",
    "sd3",
    "aura",
    "hidream",
    "cosmos",
    "ltxv",
    "hyvid",
    "wan",
    "lumina2",
    "qwen_image",
)
"""Architectures ComfyUI-GGUF's UnetLoaderGGUF accepts (``loader.py`` IMG_ARCH_LIST, stored
snapshot 001ffcf); any other name raises "Unexpected architecture type in GGUF file"."""
COMFYUI_GGUF_TEXT_ARCHS = ("t5", "t5encoder", "llama", "qwen2vl")
"""What its CLIP loaders accept (TXT_ARCH_LIST)."""

LAYOUTS = {
    "Q8_0": ("int8 codes x one FP16 scale per 32 weights along K", "per-32 FP16 scales"),
    "Q8_1": ("int8 codes x one FP16 scale (and sum) per 32 weights along K", "per-32 FP16 scales"),
    "Q4_0": ("4-bit codes x one FP16 scale per 32 weights", "per-32 FP16 scales"),
    "Q4_1": ("4-bit codes x an FP16 scale and minimum per 32 weights", "per-32 FP16 scales and minimums"),
    "Q5_0": ("5-bit codes x one FP16 scale per 32 weights", "5-bit codes or per-32 FP16 scales"),
    "Q5_1": ("5-bit codes x an FP16 scale and minimum per 32 weights", "5-bit codes or per-32 FP16 scales and minimums"),
    "IQ4_NL": ("4-bit indices into a non-linear table x one FP16 scale per 32 weights", "per-32 FP16 scales"),
    "MXFP4": ("FP4 codes x one E8M0 scale per 32 weights", "FP4 codes with per-32 E8M0 scales"),
    "NVFP4": ("FP4 codes x UE4M3 scales per 16 weights in 64-weight blocks", "this block layout without a tensor scale"),
}
"""(the block layout, what no Comfy format has) per ggml type; K-quants, IQ and TQ types by family."""


def layout_of(type_name: str) -> tuple[str, str]:
    if type_name in LAYOUTS:
        return LAYOUTS[type_name]
    if type_name.endswith("_K"):
        return (
            "codes in 256-weight super-blocks with 6/8-bit sub-block scales (and minimums) under FP16 super-block scales",
            "nested super-block scales",
        )
    if type_name.startswith("IQ"):
        return ("lattice (codebook) indices with sub-block scales in 256-weight super-blocks", "lattice codebooks")
    if type_name.startswith("TQ"):
        return "ternary codes with one FP16 scale per 256 weights", "ternary codes"
    return "a ggml block layout", "this layout"


def bits_per_weight(type_name: str) -> float | None:
    """Bits per weight of a ggml type (its block's bytes x 8 / weights), None if gguf has no such type.
    (Only asked about a GGUF view, so the gguf package is already imported.)"""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType.__members__.get(type_name)
    if qtype is None or qtype not in GGML_QUANT_SIZES:
        return None
    block, size = GGML_QUANT_SIZES[qtype]
    return size * 8 / block


def lossy_target(type_names) -> Lossy:
    """The one Comfy format ``--allow-lossy`` requantizes a GGUF file's linear layers into
    (SGLang loads one Comfy format per file, and ``migrate`` judges the output for every
    runtime by default), chosen by the deepest ggml type among them: never fewer bits than
    the GGUF spends on any layer, and the scaled-integer layout closest to ggml's blocks.

    * any type above 4.5 bits (Q8_0, Q5_*, Q6_K, the Q4_K_M mixes' Q6_K): ``int8_tensorwise``
      - int8 codes like Q8_0's, one scale per row instead of per 32 weights (W6A8 would match
      Q6_K's depth, but SGLang does not load it);
    * only FP4 types (MXFP4, NVFP4): ``nvfp4`` - FP4 E2M1 codes with FP8 block scales;
    * otherwise (Q4_*, IQ4_*, Q3_K, Q2_K, IQ1-3, TQ*; 4.5 bits and below): ``asym_w4a8_int8``
      at 4 bits - grouped 4-bit codes with per-group scales.
    """
    names = [type_names] if isinstance(type_names, str) else sorted(set(type_names))
    depths = {t: bits_per_weight(t) for t in names}
    deepest = max(names, key=lambda t: 99.0 if (depth := depths[t]) is None else depth)
    bpw = depths[deepest]
    what = f"{deepest}" + ("" if bpw is None else f" ({bpw:.2f} bits/weight)")
    whole = f", the deepest of the file's {', '.join(names)}" if len(names) > 1 else ""
    if all(t in ("MXFP4", "NVFP4") for t in names):
        return Lossy("nvfp4", {}, f"{what}{whole} -> nvfp4: FP4 codes with FP8 block scales")
    if bpw is None or bpw > 4.5:
        return Lossy(
            "int8_tensorwise",
            {},
            f"{what}{whole} -> int8_tensorwise: 8-bit codes with per-row scales, no fewer bits than the GGUF spends",
        )
    return Lossy(
        "asym_w4a8_int8",
        {"bits": 4},
        f"{what}{whole} -> W4A8: 4-bit grouped codes with per-group scales, the nearest Comfy layout to ggml's scaled blocks",
    )


def _identity(suffix: str):
    """The exact decode of a GGUF layer: the virtual file already holds its F32 weight."""

    def decode(stored: dict):
        import torch

        return stored[suffix].to(torch.float32)

    return decode


def virtual_source(path: str):
    """The GGUF file at ``path`` read as a safetensors file (``reader.virtual_source``)."""
    from .reader import virtual_source as open_view

    return open_view(path)


def _is_gguf_view(ckpt: Checkpoint) -> bool:
    """The checkpoint is a GGUF file read through ``reader`` (metadata alone could be a
    copy carried into a safetensors file by some writer; that file is no GGUF)."""
    if ckpt.metadata().get(CONTAINER_KEY) != "gguf":
        return False
    from .reader import GGUFSource

    return any(isinstance(s, GGUFSource) for s in ckpt.sources)


def _json(meta: dict, key: str) -> dict:
    try:
        value = parse_json(meta.get(key) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    if not _is_gguf_view(ckpt):
        return None
    meta = ckpt.metadata()
    types = _json(meta, TYPES_KEY)
    layers: dict[str, Translation] = {}
    loose: list[str] = []
    for name, type_name in types.items():
        if type_name in DENSE or name not in ckpt.tensors:
            continue
        prefix, dot, suffix = name.rpartition(".")
        if suffix != "weight" or not prefix:
            loose.append(name)  # not a layer's weight (SD3's pos_embed): read as its F32 decode, unclaimed
            continue
        if prefix not in claimed:
            layers[prefix] = _translate(ckpt, prefix, type_name)
    linear = [tr.variant for tr in layers.values() if tr.verdict == LOSSY]
    if linear:
        target = lossy_target(linear)
        for tr in layers.values():
            if tr.verdict == LOSSY:
                tr.lossy = target
    notes = _notes(meta, types)
    if loose:
        notes.append(
            f"{len(loose)} quantized tensor(s) that are no layer's weight (e.g. {loose[0]!r}) are read as their exact F32 decode"
        )
    return Claim(
        NAME, layers, notes=notes, metadata_drop=[k for k in meta if k.startswith("comfyquant.gguf.") or k == CONTAINER_KEY]
    )


def _translate(ckpt: Checkpoint, prefix: str, type_name: str) -> Translation:
    """A quantized GGUF weight: LOSSY for a linear (2-D) weight, whose Comfy form requantizes it;
    EXACT as the dense F32 weight for any other rank (a conv kernel, a reshaped tensor), which
    no Comfy format quantizes, so the exact decode is its Comfy form."""
    w = ckpt.tensors[f"{prefix}.weight"]
    inputs = {"weight": w}
    bias = ckpt.tensors.get(f"{prefix}.bias")
    if bias is not None:
        inputs["bias"] = bias
    bpw = bits_per_weight(type_name)
    size = f" ({bpw:.2f} bits/weight)" if bpw is not None else ""
    layout, missing = layout_of(type_name)
    if len(w.shape) != 2:
        moves = [Move(s, e.name, e.dtype, tuple(e.shape)) for s, e in inputs.items()]
        return Translation(
            prefix,
            NAME,
            type_name,
            inputs,
            verdict=EXACT,
            moves=moves,
            decoder=_identity("weight"),
            why=f"{type_name}{size} {len(w.shape)}-D weight {list(w.shape)}: no Comfy format quantizes it; "
            "it becomes its exact dense F32 decode",
        )
    why = (
        f"{type_name}{size}: {layout}; no Comfy layout has {missing}, so the layer is exact only as its dense F32 "
        "weight (dequantize); any Comfy format requantizes it"
    )
    return Translation(prefix, NAME, type_name, inputs, verdict=LOSSY, why=why, decoder=_identity("weight"))


def _notes(meta: dict, types: dict) -> list[str]:
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    arch = meta.get(ARCH_KEY)
    mix = ", ".join(f"{t} x{n}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    notes = [
        f"GGUF v{meta.get('comfyquant.gguf.version', '?')} file, architecture {arch!r}: {len(types)} tensors ({mix}); "
        "quantized tensors are read dequantized into F32 (exact)"
    ]
    if arch is None:
        notes.append("no general.architecture: ComfyUI-GGUF loads it in compatibility mode, guessing the model from tensor names")
    elif arch in COMFYUI_GGUF_IMAGE_ARCHS:
        notes.append(f"ComfyUI-GGUF's UnetLoaderGGUF accepts architecture {arch!r}")
    elif arch in COMFYUI_GGUF_TEXT_ARCHS:
        notes.append(f"architecture {arch!r} is a text encoder: ComfyUI-GGUF loads it with CLIPLoaderGGUF, not UnetLoaderGGUF")
    else:
        notes.append(f"ComfyUI-GGUF refuses architecture {arch!r} (ValueError: Unexpected architecture type in GGUF file)")
    shapes = _json(meta, ORIG_SHAPE_KEY)
    if shapes:
        odd = sorted(n for n, s in shapes.items() if isinstance(s, dict) and s.get("type") != "INT32")
        notes.append(f"{len(shapes)} tensor(s) stored flattened with comfy.gguf.orig_shape (read in their original shape)")
        if odd:
            notes.append(
                f"comfy.gguf.orig_shape.{odd[0]} is not an INT32 array ({len(odd)} such): ComfyUI-GGUF raises "
                "TypeError: Bad original shape metadata"
            )
    return notes


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """Neither runtime opens a GGUF file: each stops at the file, before any layer."""
    return [
        RuntimeFailure(
            "comfyui",
            "(no ComfyUI message modelled) a GGUF file: ComfyUI's own model loaders read "
            "safetensors (and pickle) files and do not list .gguf ones; it loads only through the "
            "ComfyUI-GGUF custom node (Unet Loader (GGUF), UnetLoaderGGUF)",
            None,
            None,
            None,
            "file",
            "GGUF container (city96 ComfyUI-GGUF)",
            "install city96/ComfyUI-GGUF and load it with UnetLoaderGGUF, or comfyquant dequantize / "
            "convert it to a safetensors file",
        ),
        RuntimeFailure(
            "sglang",
            "(no SGLang message modelled) a GGUF file: SGLang's diffusion loader reads safetensors weights, not GGUF",
            None,
            None,
            None,
            "file",
            "GGUF container",
            "comfyquant convert it to a Comfy safetensors file (lossy) or dequantize it",
        ),
    ]


DIALECTS = (
    Dialect(
        NAME,
        "GGUF (city96 ComfyUI-GGUF)",
        writer="city96 ComfyUI-GGUF tools/convert.py, llama.cpp gguf-py",
        source="city96/ComfyUI-GGUF loader.py, tools/convert.py",
        detect=detect,
        failures=failures,
        rule_tag="gguf",
        order=1,
    ),
)

CONTAINERS = (Container(NAME, sniff=is_gguf, open=virtual_source, suffixes=(".gguf",)),)
"""A local ``.gguf`` file opens as its virtual safetensors view (``dialects/containers.open_any``)."""

__all__ = ["CONTAINERS", "DIALECTS", "NAME", "is_gguf", "virtual_source", "lossy_target"]
