"""BFL FLUX.2 quantized single files as diffusers' BFL quantizer reads them (diffusers 0.42.1
`quantizers/bfl/utils.py`).

diffusers 0.42 ``quantizers/bfl`` loads two per-layer layouts, with no ``comfy_quant`` marker
and no header metadata: the quantizer decides by the tensors (``maybe_update_state_dict``):

* ``fp8r``: an F8_E4M3 ``weight [N, K]`` with F32 per-row ``weight_scale [N]``,
  ``W = q * weight_scale[:, None]`` (``dequantize_fp8r``).  No Comfy format has per-row FP8
  scales, so the layer is requantized (lossy) or decoded exactly.
* ``nvfp4``: a U8 ``weight [N, K/2]`` packed **low nibble first**, E4M3 ``weight_scale [N, K/16]``
  in the **linear** layout, an F32 ``weight_scale_2`` and an ``input_scale`` (required by the
  quantizer).  The same numbers as Comfy ``nvfp4`` in another arrangement: nibbles swap,
  scales are blocked, rows are padded to 16 (a byte permutation, both ways).

An unmarked U8 layer is Comfy ``nvfp4`` without its marker just as well; the scale shape
tells them apart (linear ``[N, K/16]`` vs blocked ``[pad(N, 128), pad(K/16, 4)]``) except when
``N % 128 == 0`` and ``(K/16) % 4 == 0``, where the shapes coincide.  Then the layer must have
the ``input_scale`` the BFL layout requires (Comfy writers leave it out by default), and the
file decides: a layer of it whose shape tells, a ``comfy_quant`` marker anywhere (a Comfy
writer marks its layers), else the writer this layout is named after.  The nibble order is
never in the header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...numerics import nvfp4_layouts as lay
from ...shapes import fmt_shape
from ...targets.base import RuntimeFailure
from ..base import EXACT, LOSSY, PERMUTATION, REFUSED, Claim, Dialect, Lossy, Move, Translation, exact
from ..common import FLOAT_SCALE_DTYPES, copy, is_scalar_float, scalar_scale
from ..decoders import scaled_fp8
from . import nvfp4

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

NAME = "bfl"
NVFP4 = "nvfp4"
FP8R = "fp8r"
SOURCE = "the BFL layout of diffusers quantize_nvfp4: low nibble first, linear scales"
PACKING = nvfp4.Packing(NAME, NVFP4, lay.LOW_FIRST, lay.LINEAR)
"""How the BFL layout stores an NVFP4 layer, read (``detect``) and written (``to=bfl``) alike."""
PACKED_QKV = ("_attn.qkv", ".linear1")
"""BFL (FLUX) names of packed QKV layers: SGLang's diffusion loader reads the scales of a file
that has them as swizzled and swaps nibbles (``_build_nvfp4_config_from_safetensors_files``)."""


def fp8r_tensors(t: dict) -> bool:
    """An F8_E4M3 ``[N, K]`` weight with one float scale per row ``[N]`` and no tensor scale."""
    w, s = t.get("weight"), t.get("weight_scale")
    return (
        w is not None
        and w.dtype == "F8_E4M3"
        and len(w.shape) == 2
        and s is not None
        and s.dtype in FLOAT_SCALE_DTYPES
        and tuple(s.shape) == (w.shape[0],)
        and "weight_scale_2" not in t
    )


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    marked = False
    nv: dict[str, dict[str, int]] = {}
    rowwise: list[str] = []
    for prefix, layer in ckpt.layers.items():
        if layer.marker is not None:
            marked = True
            continue
        if prefix in claimed:
            continue
        t = layer.tensors
        if nvfp4.nvfp4_tensors(t):
            nv[prefix] = nvfp4.fits(t)
        elif fp8r_tensors(t):
            rowwise.append(prefix)
    if not nv and not rowwise:
        return None
    layers: dict[str, Translation] = {}
    notes: list[str] = []
    unsettled: list[str] = []
    linear_only = [p for p, f in nv.items() if set(f) == {lay.LINEAR}]
    blocked_only = [p for p, f in nv.items() if set(f) == {lay.BLOCKED}]
    # where the shapes coincide, a layer without input_scale is no BFL layer (diffusers' BFL
    # quantizer refuses it), while Comfy writers leave it out by default
    both = [p for p, f in nv.items() if len(f) == 2 and "input_scale" in ckpt.layers[p].tensors]
    comfy = blocked_only[0] if blocked_only else None
    if comfy is not None or marked:
        why = (
            f"layer {comfy!r} has blocked scales {fmt_shape(ckpt.layers[comfy].tensors['weight_scale'].shape)}"
            if comfy is not None
            else "the file has comfy_quant markers (a Comfy writer marks its layers)"
        )
        if both:
            notes.append(
                f"{len(both)} unmarked U8 layer(s) (e.g. {both[0]}) fit both the linear and the blocked "
                f"scale layout; {why}: left as Comfy nvfp4 without a marker"
            )
        both = []
    elif both:
        evidence = (
            f"layer {linear_only[0]!r} of this file has scales only the linear layout fits"
            if linear_only
            else "no layer's shape tells, the file has no comfy_quant marker (a Comfy writer marks its "
            "layers) and no ModelOpt quantization_config: the BFL writer's linear layout"
        )
        unsettled.append(
            f"{len(both)} NVFP4 layer(s) (e.g. {both[0]}) have N % 128 == 0 and (K/16) % 4 == 0, where "
            f"linear and blocked scales have the same shape: read as linear because {evidence}; the "
            "nibble order (low first) is the writer's; neither the header nor the data shows either"
        )
    for prefix in linear_only + both:
        t = ckpt.layers[prefix].tensors
        layers[prefix] = _nvfp4(prefix, t, nv[prefix][lay.LINEAR], unsettled if prefix in both else None)
    for prefix in rowwise:
        layers[prefix] = _fp8r(prefix, ckpt.layers[prefix].tensors)
    if not layers:  # nothing of this layout (a note alone would name the dialect in the file)
        return None
    return Claim(NAME, layers, notes=notes, unsettled=unsettled)


def _nvfp4(prefix: str, t: dict, scale_cols: int, unsettled: list[str] | None) -> Translation:
    tr = nvfp4.to_comfy(prefix, t, PACKING, scale_cols=scale_cols, source=SOURCE, unsettled=list(unsettled or []))
    if "input_scale" not in t and tr.verdict == PERMUTATION:
        tr.why += "; no input_scale (diffusers' BFL quantizer refuses such a layer; Comfy runs it with dynamic activation scales)"
    return tr


def _fp8r(prefix: str, t: dict) -> Translation:
    w, s, si = t["weight"], t["weight_scale"], t.get("input_scale")
    others = [copy(e, suffix) for suffix, e in t.items() if suffix not in ("weight", "weight_scale", "input_scale")]
    drops = [si.name] if si is not None else []
    dropped_why = "fp8r quantizes activations per row at run time: diffusers never applies input_scale"
    if w.shape[0] == 1:  # one row: the per-row scale is a per-tensor scale
        why = "one row: its per-row scale is a per-tensor scale"
        moves = [copy(w, "weight"), scalar_scale(s, prefix, "weight_scale"), *others]
        return exact(NAME, prefix, t, FP8R, "float8_e4m3fn", why, moves=moves, drops=drops, dropped_why=dropped_why)
    return Translation(
        prefix,
        NAME,
        FP8R,
        t,
        verdict=LOSSY,
        why=f"per-row weight_scale {fmt_shape(s.shape)}: no Comfy FP8 format has per-row scales "
        "(convert_to_quant's float8_e4m3fn_rowwise is unregistered in ComfyUI and SGLang)",
        moves=others,
        drops=drops,
        dropped_why=dropped_why,
        decoder=scaled_fp8("weight", "weight_scale"),
        lossy=Lossy("float8_e4m3fn", why="requantized with one scale per tensor"),
    )


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    return [f for target in ("comfyui", "sglang") for f in _failures(target, ckpt, claim)]


def _failures(target: str, ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    """What each runtime does with the unmarked BFL layers: ComfyUI's profile leaves them to
    this; SGLang's refuses unmarked quantized weights on its Comfy path (M0), and its diffusion
    loader's own NVFP4 path guesses the layout from the names (modelled here)."""
    out: list[RuntimeFailure] = []
    packed_qkv = any(p.endswith(PACKED_QKV) for p in ckpt.layers)
    for tr in claim.layers.values():
        w = tr.inputs["weight"]
        if target == "comfyui":
            if tr.variant == NVFP4:
                out.append(
                    RuntimeFailure(
                        "comfyui",
                        f"(no exact ComfyUI message modelled) layer '{tr.prefix}': no marker, so ComfyUI "
                        f"loads the U8 weight {fmt_shape(w.shape)} as a plain weight where the model has "
                        f"[{w.shape[0]}, {2 * w.shape[1]}]: size mismatch at load_state_dict",
                        "RuntimeError",
                        tr.prefix,
                        "weight",
                        "load",
                        "BFL/diffusers NVFP4 layout without comfy_quant markers",
                        "comfyquant migrate",
                    )
                )
            else:
                out.append(
                    RuntimeFailure(
                        "comfyui",
                        f"layer '{tr.prefix}': no marker, so ComfyUI casts the F8_E4M3 weight to the compute "
                        "dtype by value and never applies its per-row weight_scale (garbage output, no error)",
                        None,
                        tr.prefix,
                        "weight",
                        "silent",
                        "BFL fp8r layout without comfy_quant markers",
                        "comfyquant migrate --allow-lossy, or dequantize",
                        severity="error",
                    )
                )
        elif target == "sglang":
            if tr.variant == NVFP4 and packed_qkv:
                out.append(
                    RuntimeFailure(
                        "sglang",
                        f"(no SGLang message modelled) layer '{tr.prefix}': the file has BFL packed-QKV "
                        "names, so SGLang's diffusion loader reads its NVFP4 scales as swizzled and swaps nibbles; "
                        "these are linear and low-nibble-first (garbage output, no error)",
                        None,
                        tr.prefix,
                        "weight_scale",
                        "silent",
                        "BFL/diffusers NVFP4 layout under BFL (FLUX) names",
                        "comfyquant migrate (Comfy layout, which SGLang reads)",
                        severity="error",
                    )
                )
    return out


def export(ckpt: Checkpoint, claimed: set) -> Claim | None:
    """Comfy ``nvfp4`` and ``float8_e4m3fn`` layers in the BFL layout diffusers' quantizer reads.
    Padding the BFL layout has no room for (rows past the bias, the blocked layout's) is read
    and must be zero, else the layer is refused."""
    layers: dict[str, Translation] = {}
    for prefix, layer in ckpt.layers.items():
        if prefix in claimed or layer.marker is None or layer.inferred or layer.bank is not None:
            continue
        t = layer.tensors
        if layer.format_name == NVFP4 and nvfp4.nvfp4_tensors(t):
            if "pre_quant_scale" in t:
                layers[prefix] = Translation(
                    prefix, NAME, NVFP4, t, verdict=REFUSED, why="pre_quant_scale: diffusers' BFL quantizer never applies one"
                )
                continue
            tr = layers[prefix] = nvfp4.from_comfy(
                prefix,
                t,
                PACKING,
                keep_rows=False,
                pad_scale_cols=False,
                marker=None,
                require_input_scale="no input_scale: diffusers' BFL quantizer refuses an nvfp4 layer without one "
                "('has `weight_scale_2` but no `input_scale`')",
            )
            nvfp4.check_padding(ckpt, tr)
        elif (
            layer.format_name == "float8_e4m3fn"
            and t.get("weight") is not None
            and t["weight"].dtype == "F8_E4M3"
            and len(t["weight"].shape) == 2
            and is_scalar_float(t.get("weight_scale"))
        ):
            layers[prefix] = _to_fp8r(prefix, t)
    return Claim(NAME, layers) if layers else None


def _to_fp8r(prefix: str, t: dict) -> Translation:
    w, s, si = t["weight"], t["weight_scale"], t.get("input_scale")
    rows = w.shape[0]

    def per_row(data: bytes, dtype: str = s.dtype) -> bytes:
        from ...numerics.bytewise import to_f32

        return lay.broadcast_rows(to_f32(data, dtype), rows)

    moves = [
        copy(w, "weight"),
        Move(
            "weight_scale", s.name, "F32", (rows,), per_row, EXACT, f"per-tensor scale -> the same value for each of {rows} rows"
        ),
    ]
    moves += [
        copy(e, suffix) for suffix, e in t.items() if suffix not in ("weight", "weight_scale", "input_scale", "comfy_quant")
    ]
    drops = [si.name] if si is not None else []
    drops += [t["comfy_quant"].name] if "comfy_quant" in t else []
    return Translation(
        prefix,
        NAME,
        FP8R,
        t,
        verdict=EXACT,
        why="per-tensor weight_scale repeated per row",
        moves=moves,
        drops=drops,
        dropped_why="fp8r quantizes activations per row at run time (no input_scale); no marker",
    )


DIALECTS = (
    Dialect(
        NAME,
        "BFL FLUX.2 fp8r / nvfp4 (diffusers BFL quantizer layout)",
        writer="diffusers 0.42 BFL quantizer layout (quantize_fp8r / quantize_nvfp4), BFL FLUX.2 files",
        source="diffusers quantizers/bfl/utils.py",
        detect=detect,
        failures=failures,
        rule_tag="bfl",
        settle=nvfp4.settle,
        export=export,
        order=40,
    ),
)
