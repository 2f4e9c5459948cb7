"""nunchaku SVDQuant single files (nunchaku `lora/flux/packer.py`, deepcompressor): SVDQ W4A4
(int4, nvfp4) and AWQ W4A16 layers.

Per SVDQuant linear: ``qweight`` I8 ``[N, K/2]``, ``wscales`` ``[K/G, N]`` (BF16/F16 for int4,
G = 64; F8_E4M3 for nvfp4, G = 16), ``smooth_factor`` and ``smooth_factor_orig`` ``[K]``,
``proj_down`` ``[K, R]``, ``proj_up`` ``[N, R]``, an optional ``bias`` ``[N]``, and for nvfp4
``wcscales`` ``[N]`` and ``wtscale`` ``[1]``.  Per AWQ W4A16 layer (the modulation linears):
``qweight`` I32 ``[N/4, K/2]``, ``wscales``/``wzeros`` ``[K/64, N]``, ``bias``.  None of these
suffixes is a Comfy layer suffix, so the checkpoint lists them as other tensors and this
package groups them by prefix; a layer's ``bias`` is a layer tensor of the same prefix.

Every tensor is stored in the order nunchaku's kernels read it (``numerics.nunchaku_tiles``
undoes it), so an int4 SVDQuant layer is Comfy's ``svdquant_w4a4`` by a byte permutation, and
an AWQ layer Comfy's ``awq_w4a16`` by a permutation plus a zero-point change (nunchaku's codes
are unsigned, Comfy subtracts 8) that only the values can prove exact (``settle``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ...dtypes import DTYPE_BITS
from ...findings import Finding
from ...formats.awq import AWQ_W4A16
from ...formats.svdquant import SVDQUANT_W4A4
from ...numerics import nunchaku_tiles as tiles
from ...shapes import fmt_shape
from ...targets.base import RuntimeFailure
from ..base import EXACT, PERMUTATION, REFUSED, Claim, Dialect, Move, Translation, refused
from ..reading import read_sound
from . import metadata
from .decoders import awq as awq_decoder
from .decoders import via_comfy

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...checkpoint import Checkpoint

NAME = "nunchaku"
_refused = partial(refused, NAME)
SVDQ_FORMAT = SVDQUANT_W4A4.name
AWQ_FORMAT = AWQ_W4A16.name
SVDQ_SUFFIXES = ("qweight", "wscales", "smooth_factor", "smooth_factor_orig", "proj_down", "proj_up", "wcscales", "wtscale")
AWQ_SUFFIXES = ("qweight", "wscales", "wzeros")
SUFFIXES = frozenset(SVDQ_SUFFIXES + AWQ_SUFFIXES)
FLOAT16 = ("BF16", "F16")
BIAS_DTYPES = (*FLOAT16, "F32")
FUSED_QKV = ("to_qkv", "add_qkv_proj", "qkv_proj")
UNSIGNED_ACT = (".net.2", ".mlp_fc2")
"""Layers nunchaku's model code runs with unsigned (shifted post-GELU) activations in int4:
``NunchakuFeedForward`` sets ``net[2].act_unsigned``, the single blocks ``mlp_fc2.act_unsigned``
(``nunchaku/models/transformers/transformer_flux_v2.py``).  The file does not record it."""
MODULATION = ("norm1.linear", "norm1_context.linear", "norm.linear", "img_mod", "txt_mod")
SGLANG_AWQ = ("img_mod", "txt_mod")
SGLANG_SKIP = ("norm", "embed", "rotary", "pos_embed")
"""SGLang multimodal_gen ``nunchaku_config.py``: skip > AWQ > SVDQ patterns, any other linear SVDQ."""


def _groups(ckpt: Checkpoint) -> dict[str, dict]:
    """nunchaku tensors by layer prefix (only prefixes with a ``qweight``), plus their bias."""
    found: dict[str, dict] = {}
    for name in ckpt.other_tensors:
        prefix, _, suffix = name.rpartition(".")
        if prefix and suffix in SUFFIXES:
            found.setdefault(prefix, {})[suffix] = ckpt.tensors[name]
    out = {}
    for prefix, t in found.items():
        if "qweight" not in t:
            continue
        layer = ckpt.layers.get(prefix)
        if layer is not None:
            for suffix, entry in layer.tensors.items():
                t.setdefault(suffix, entry)
        out[prefix] = t
    return out


def detect(ckpt: Checkpoint, claimed: set) -> Claim | None:
    groups = {
        p: t for p, t in _groups(ckpt).items() if p not in claimed and (p not in ckpt.layers or ckpt.layers[p].marker is None)
    }
    if not groups:
        return None
    facts = metadata.read(ckpt.metadata())
    layers = {p: _translate(p, t, ckpt) for p, t in sorted(groups.items())}
    notes = facts.notes()
    ranks = sorted({t["proj_down"].shape[1] for t in groups.values() if "proj_down" in t and len(t["proj_down"].shape) == 2})
    if ranks:
        notes.append("low-rank branch rank " + "/".join(map(str, ranks)) + " (proj_down)")
    if facts.precision and any(tr.variant.startswith("svdq") and facts.precision not in tr.variant for tr in layers.values()):
        notes.append(
            f"quantization_config says precision {facts.precision}, but some layers' tensors are another "
            "precision (the tensors decide)"
        )
    fused = [p for p in layers if p.rsplit(".", 1)[-1] in FUSED_QKV]
    if fused:
        notes.append(
            f"{len(fused)} fused q/k/v layer(s) (e.g. {fused[0]}): nunchaku stores attention projections "
            "fused; a runtime with separate q/k/v layers must split each along N (slice weight rows, "
            "weight_scale columns, proj_up rows and bias in three; give each part the same proj_down and "
            "smooth_factor, exact) -- diffusers' Nunchaku Lite warns that fused checkpoints do not load into "
            "a model config with separate Q, K and V; migrate keeps nunchaku's (diffusers) names, and "
            "ComfyUI's diffusers-name conversion maps only separate to_q/to_k/to_v, so a loader must map "
            "the fused names itself"
        )
    mod = [p for p, tr in layers.items() if tr.variant == "awq w4a16" and any(m in p for m in MODULATION)]
    if mod:
        notes.append(
            f"{len(mod)} AWQ modulation layer(s) (e.g. {mod[0]}): deepcompressor's converter may have "
            "interleaved their output rows across the modulation chunks and folded +1 into the scale "
            "biases (convert_to_nunchaku_w4x16_linear_weight, adanorm_splits); migrate keeps the rows as "
            "stored, which is what nunchaku's model expects, not ComfyUI's"
        )
    unsettled = [AWQ_UNSETTLED] if any(AWQ_UNSETTLED in tr.unsettled for tr in layers.values()) else []
    return Claim(
        NAME,
        layers,
        notes=notes,
        unsettled=unsettled,
        metadata_drop=[k for k in ("quantization_config", "comfy_config", "model_class") if k in ckpt.metadata()],
    )


def _variant(t: dict) -> str:
    q = t["qweight"]
    if q.dtype == "I32" or ("wzeros" in t and "smooth_factor" not in t):
        return "awq w4a16"
    ws = t.get("wscales")
    if "wcscales" in t or "wtscale" in t or (ws is not None and ws.dtype == "F8_E4M3"):
        return "svdq nvfp4"
    return "svdq int4"


def _translate(prefix: str, t: dict, ckpt: Checkpoint) -> Translation:
    variant = _variant(t)
    if variant == "awq w4a16":
        return _awq(prefix, t, variant, ckpt)
    if variant == "svdq nvfp4":
        return Translation(
            prefix,
            NAME,
            variant,
            t,
            verdict=REFUSED,
            why="SVDQuant NVFP4 (FP4 E2M1 residual, F8_E4M3 scales per 16 columns, wcscales/wtscale): "
            "no Comfy format holds it (svdquant_w4a4 is int4 with group 64); no decoder either: "
            "nunchaku's FP4 micro-scale packing (pack_micro_scale) and wcscales/wtscale semantics "
            "are not verified here",
        )
    return _svdq_int4(prefix, t, variant)


def _packed_weight(name: str, n: int, k: int, reorder: Callable[..., bytes], what: str) -> Move:
    """The weight's move to Comfy's row-major int4 pairs ``[N, K/2]``: both Nunchaku layouts
    store two nibbles a byte and differ only in the order ``reorder`` undoes."""
    return Move("weight", name, "I8", (n, k // 2), partial(reorder, n=n, k=k), PERMUTATION, what)


def _svdq_int4(prefix: str, t: dict, variant: str) -> Translation:
    need = [s for s in ("qweight", "wscales", "smooth_factor", "proj_down", "proj_up") if s not in t]
    if need:
        return _refused(prefix, t, variant=variant, why="incomplete SVDQuant layer: no " + ", ".join(need))
    q, ws, sm, down, up = (t[s] for s in ("qweight", "wscales", "smooth_factor", "proj_down", "proj_up"))
    if q.dtype != "I8" or len(q.shape) != 2:
        return _refused(
            prefix, t, variant=variant, why=f"qweight {q.dtype} {fmt_shape(q.shape)}: nunchaku's int4 qweight is I8 [N, K/2]"
        )
    n, k = q.shape[0], 2 * q.shape[1]
    bad = "an empty weight" if n == 0 or k == 0 else tiles.svdq_weight_fits(n, k)
    if bad:
        return _refused(prefix, t, variant=variant, why=f"qweight {fmt_shape(q.shape)}: {bad}")
    expect = {"wscales": (k // 64, n), "smooth_factor": (k,), "proj_up": (n, None), "proj_down": (k, None)}
    for s, shape in expect.items():
        e = t[s]
        if e.dtype not in FLOAT16:
            return _refused(prefix, t, variant=variant, why=f"{s} {e.dtype}: nunchaku's int4 layers store it BF16/F16")
        if len(e.shape) != len(shape) or any(w is not None and w != d for w, d in zip(shape, e.shape)):
            want = fmt_shape(["R" if d is None else d for d in shape])
            return _refused(
                prefix,
                t,
                variant=variant,
                why=f"{s} {fmt_shape(e.shape)} does not fit qweight {fmt_shape(q.shape)} (expected {want})",
            )
    rank = down.shape[1]
    if rank == 0:
        return _refused(prefix, t, variant=variant, why="rank 0: proj_down/proj_up are empty")
    if up.shape[1] != rank:
        return _refused(prefix, t, variant=variant, why=f"proj_up rank {up.shape[1]} != proj_down rank {rank}")
    bad = tiles.lowrank_fits(k, rank) or tiles.lowrank_fits(n, rank)
    if bad:
        return _refused(prefix, t, variant=variant, why=f"low-rank factors {bad}")
    bias = t.get("bias")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype not in BIAS_DTYPES):
        return _refused(prefix, t, variant=variant, why=f"bias {bias.dtype} {fmt_shape(bias.shape)} does not fit N={n}")
    moves = [
        _packed_weight(q.name, n, k, tiles.svdq_weight, "MMA tile order -> row-major int4 pairs"),
        Move(
            "weight_scale",
            ws.name,
            ws.dtype,
            (k // 64, n),
            partial(tiles.svdq_scales, groups=k // 64, n=n, itemsize=2),
            PERMUTATION,
            "lane order -> [K/64, N]",
        ),
        Move(
            "weight_smooth_factor",
            sm.name,
            sm.dtype,
            (k,),
            partial(tiles.svdq_vector, n=k, itemsize=2),
            PERMUTATION,
            "lane order -> natural",
        ),
        Move(
            "weight_proj_down",
            down.name,
            down.dtype,
            (k, rank),
            partial(tiles.lowrank_down, k=k, rank=rank, itemsize=2),
            PERMUTATION,
            "16x16 packs -> [K, R]",
        ),
        Move(
            "weight_proj_up",
            up.name,
            up.dtype,
            (n, rank),
            partial(tiles.lowrank_up, n=n, rank=rank, itemsize=2),
            PERMUTATION,
            "16x16 packs -> [N, R]",
        ),
    ]
    if bias is not None:
        size = DTYPE_BITS[bias.dtype] // 8
        moves.append(
            Move(
                "bias",
                bias.name,
                bias.dtype,
                (n,),
                partial(tiles.svdq_vector, n=n, itemsize=size),
                PERMUTATION,
                "lane order -> natural (nunchaku's kernel reads the bias packed)",
            )
        )
    drops = [t[s].name for s in ("smooth_factor_orig",) if s in t]
    others = [
        s for s in t if s not in ("qweight", "wscales", "smooth_factor", "smooth_factor_orig", "proj_down", "proj_up", "bias")
    ]
    if others:
        return _refused(prefix, t, variant=variant, why="unexpected tensors next to an int4 SVDQuant layer: " + ", ".join(others))
    marker: dict[str, object] = {"format": SVDQ_FORMAT}
    why = "byte permutation of nunchaku's MMA tile layout into Comfy's natural svdquant_w4a4 layout"
    if prefix.endswith(UNSIGNED_ACT):
        marker["act_unsigned"] = True
        why += (
            "; act_unsigned: true (nunchaku runs post-GELU fc2 layers with unsigned activations; inferred "
            "from the layer name, the file does not record it)"
        )
    if prefix.rsplit(".", 1)[-1] in FUSED_QKV:
        why += "; fused q/k/v: split along N for a runtime with separate q/k/v layers"
    return Translation(
        prefix,
        NAME,
        variant,
        t,
        verdict=PERMUTATION,
        why=why,
        format=SVDQ_FORMAT,
        marker=marker,
        moves=moves,
        drops=drops,
        decoder=via_comfy(moves, SVDQ_FORMAT, marker),
        dropped_why="smooth_factor_orig: nunchaku's unused copy of the smoothing factors" if drops else "",
    )


AWQ_WHY = (
    "TinyChat 4-row interleave -> Comfy row-major codes; nunchaku's codes are unsigned (w = u * wscales + "
    "wzeros) and Comfy's awq_w4a16 subtracts 8 (w = (u - 8) * scale + zeros), so the zero points become "
    "wzeros + 8 * wscales in F32 (scales upcast to F32, exact; ComfyUI then computes this layer in F32)"
)
AWQ_UNSETTLED = "AWQ zero points: wzeros + 8 * wscales exact in F32"


class InexactZeros(ValueError):
    """A zero point whose Comfy form is not exact in F32 (``settle`` refuses such layers first)."""


def _awq(prefix: str, t: dict, variant: str, ckpt: Checkpoint) -> Translation:
    need = [s for s in AWQ_SUFFIXES if s not in t]
    if need:
        return _refused(prefix, t, variant=variant, why="incomplete AWQ W4A16 layer: no " + ", ".join(need))
    q, ws, wz = t["qweight"], t["wscales"], t["wzeros"]
    if q.dtype != "I32" or len(q.shape) != 2:
        return _refused(
            prefix, t, variant=variant, why=f"qweight {q.dtype} {fmt_shape(q.shape)}: nunchaku's AWQ qweight is I32 [N/4, K/2]"
        )
    n, k = 4 * q.shape[0], 2 * q.shape[1]
    bad = "an empty weight" if n == 0 or k == 0 else tiles.awq_fits(n, k)
    if bad:
        return _refused(prefix, t, variant=variant, why=f"qweight {fmt_shape(q.shape)}: {bad}")
    for e in (ws, wz):
        if e.dtype not in FLOAT16 or len(e.shape) != 2 or e.shape[1] != n or e.shape[0] == 0 or k % e.shape[0]:
            return _refused(
                prefix,
                t,
                variant=variant,
                why=f"{e.name.rsplit('.', 1)[-1]} {e.dtype} {fmt_shape(e.shape)} does not "
                f"fit qweight {fmt_shape(q.shape)} (expected BF16/F16 [K/G, {n}])",
            )
    if ws.shape != wz.shape or ws.dtype != wz.dtype:
        return _refused(
            prefix,
            t,
            variant=variant,
            why=f"wscales {ws.dtype} {fmt_shape(ws.shape)} and wzeros {wz.dtype} {fmt_shape(wz.shape)} differ",
        )
    bias = t.get("bias")
    if bias is not None and tuple(bias.shape) != (n,):
        return _refused(prefix, t, variant=variant, why=f"bias {fmt_shape(bias.shape)} does not fit N={n}")

    def zeros(data: bytes, ws=ws) -> bytes:  # reads the scales itself; settle normally replaces this
        out = _shifted_zeros(ws.dtype, ckpt.read_bytes(ws), data)
        if out is None:
            raise InexactZeros(f"layer {prefix}: wzeros + 8 * wscales is not exact in F32")
        return out

    moves = [
        _packed_weight(q.name, n, k, tiles.awq_weight, "TinyChat 4-row interleave -> row-major unsigned int4 pairs"),
        Move(
            "weight_scale",
            ws.name,
            "F32",
            tuple(ws.shape),
            partial(_to_f32, dtype=ws.dtype),
            EXACT,
            f"{ws.dtype} -> F32 (exact)",
        ),
        Move("weight_zeros", wz.name, "F32", tuple(wz.shape), zeros, EXACT, "wzeros + 8 * wscales in F32"),
    ]
    if bias is not None:
        moves.append(Move("bias", bias.name, bias.dtype, tuple(bias.shape)))
    marker = {"format": AWQ_FORMAT, "group_size": k // ws.shape[0]}
    return Translation(
        prefix,
        NAME,
        variant,
        t,
        verdict=PERMUTATION,
        why=AWQ_WHY,
        format=AWQ_FORMAT,
        marker=marker,
        moves=moves,
        decoder=awq_decoder(),
        unsettled=[AWQ_UNSETTLED],
    )


def _shifted_zeros(dtype: str, s_bytes: bytes, z_bytes: bytes) -> bytes | None:
    """F32 bytes of ``wzeros + 8 * wscales`` when every sum is exact in F32 (None otherwise)."""
    import numpy as np

    def f64(b: bytes):
        if dtype == "F16":
            return np.frombuffer(b, dtype="<f2").astype(np.float64)
        return (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    with np.errstate(all="ignore"):  # NaN/Inf stay what they are; a sum past F32's range is not exact: refused below
        exact = f64(z_bytes) + 8.0 * f64(s_bytes)  # exact in F64: both are 16-bit floats
        out = exact.astype(np.float32)
    if not np.array_equal(out.astype(np.float64), exact, equal_nan=True):
        return None
    return out.astype("<f4").tobytes()


def settle(ckpt: Checkpoint, claim: Claim) -> list[Finding]:
    """AWQ layers: read wscales/wzeros.  Where ``wzeros + 8 * wscales`` is exact in F32 for every
    group the translation stands (the zeros are kept computed: the Comfy layer's F32 weight is
    then bit-identical to the nunchaku decoder's); otherwise the layer is refused."""
    awq = [tr for tr in claim.layers.values() if AWQ_UNSETTLED in tr.unsettled]
    values = read_sound(ckpt, [tr.inputs[s] for tr in awq for s in ("wscales", "wzeros")])
    inexact = []
    for tr in awq:
        ws, wz = tr.inputs["wscales"], tr.inputs["wzeros"]
        if ws.name not in values or wz.name not in values:
            continue  # bytes that are not what the header says (C001/C002 name them): it stays unsettled
        zeros = _shifted_zeros(ws.dtype, values[ws.name], values[wz.name])
        tr.unsettled = []
        if zeros is None:
            inexact.append(tr.prefix)
            tr.verdict, tr.format, tr.marker, tr.moves = REFUSED, None, None, []
            tr.why = (
                "nunchaku's AWQ codes are unsigned (w = u * wscales + wzeros), Comfy's awq_w4a16 subtracts 8: "
                "the zero points would be wzeros + 8 * wscales, and some of those sums are not exact in F32"
            )
            continue
        tr.moves = [
            m
            if m.suffix != "weight_zeros"
            else Move(
                m.suffix,
                m.source,
                m.dtype,
                m.shape,
                partial(_constant, zeros),
                EXACT,
                "wzeros + 8 * wscales in F32 (verified exact)",
            )
            for m in tr.moves
        ]
    claim.unsettled = [u for u in claim.unsettled if u != AWQ_UNSETTLED]  # what stays open is on its layers
    if not inexact:
        return []
    return [
        Finding(
            "F004",
            f"{len(inexact)} nunchaku AWQ layer(s) (e.g. {inexact[0]}) have zero points whose Comfy "
            "form wzeros + 8 * wscales is not exact in F32",
            layer=inexact[0],
            cause="nunchaku's unsigned-code convention differs from Comfy's",
            fix="keep these layers for nunchaku's loader; they cannot be migrated or dequantized exactly",
        )
    ]


def _constant(value: bytes, _data: bytes) -> bytes:
    """A transform whose output does not depend on the stored bytes (computed at detection)."""
    return value


def _to_f32(data: bytes, dtype: str) -> bytes:
    from ...numerics import bytewise

    return bytewise.to_f32(data, dtype)


# -- runtimes -------------------------------------------------------------------------------------------------


def failures(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    return [*_comfyui(ckpt, claim), *_sglang(claim), *_kitchen(claim)]


def _kitchen(claim: Claim) -> list[RuntimeFailure]:
    return [
        RuntimeFailure(
            "comfy-kitchen",
            f"layer '{tr.prefix}': comfy-kitchen reads SVDQuant/AWQ only in "
            "Comfy's layouts (a comfy_quant marker and weight/weight_scale/... tensors; its 4-D "
            "tile-packed svdquant storage is its own, not nunchaku's MMA order): this "
            f"{tr.variant} layer is not loaded",
            None,
            tr.prefix,
            "qweight",
            "silent",
            "nunchaku layout, not a Comfy layout",
            "comfyquant migrate" if tr.verdict != REFUSED else "load it with nunchaku",
            severity="error",
        )
        for tr in claim.layers.values()
    ]


def _comfyui(ckpt: Checkpoint, claim: Claim) -> list[RuntimeFailure]:
    facts = metadata.read(ckpt.metadata())
    loader = "load it with ComfyUI-nunchaku's Nunchaku DiT loader"
    if not facts.comfy_config_ok:
        loader += " (which needs the header's comfy_config, missing or unreadable here)"
    return [
        RuntimeFailure(
            "comfyui",
            f"layer '{tr.prefix}': ComfyUI core has no nunchaku loader: no "
            f"'{tr.prefix}.weight' reaches the model (diffusers names: convert_diffusers_mmdit maps only "
            "known keys and leaves qweight/wscales/... over; other names: load_state_dict(strict=False) "
            "logs them as 'unet unexpected'), ComfyUI logs 'unet missing' and the layer keeps "
            "uninitialized weights (garbage output, no error) -- when it detects the model type at all",
            None,
            tr.prefix,
            "qweight",
            "silent",
            "nunchaku SVDQuant file in ComfyUI core",
            f"{loader}, or comfyquant migrate" if tr.verdict != REFUSED else loader,
            severity="error",
        )
        for tr in claim.layers.values()
    ]


def _sglang(claim: Claim) -> list[RuntimeFailure]:
    out = [
        RuntimeFailure(
            "sglang",
            "(no SGLang message modelled) SGLang reads nunchaku files only through its "
            "nunchaku path (multimodal_gen NunchakuConfig, quant_method svdquant / nunchaku_lite, with the "
            "nunchaku package installed), which runs the tensors as stored; its comfy_quant reader does "
            "not read them",
            None,
            None,
            None,
            "silent",
            "nunchaku layout",
            "start SGLang with the nunchaku quantization config",
            severity="warning",
        )
    ]
    for tr in claim.layers.values():
        low = tr.prefix.lower()
        skip = next((p for p in SGLANG_SKIP if p in low), None)
        awq_rule = any(p in tr.prefix for p in SGLANG_AWQ)
        if skip is not None:
            out.append(
                RuntimeFailure(
                    "sglang",
                    f"(no SGLang message modelled) layer '{tr.prefix}': SGLang's "
                    f"nunchaku config skips layers whose name contains '{skip}' (unquantized linear): "
                    f"the {tr.variant} tensors are not loaded and the layer has no weight",
                    None,
                    tr.prefix,
                    "qweight",
                    "silent",
                    "SGLang nunchaku skip pattern",
                    severity="error",
                )
            )
        elif (tr.variant == "awq w4a16") != awq_rule:
            out.append(
                RuntimeFailure(
                    "sglang",
                    _awq_mismatch(tr.prefix, tr.variant, awq_rule),
                    "AssertionError",
                    tr.prefix,
                    "qweight",
                    "load",
                    "SGLang nunchaku AWQ pattern",
                    severity="error",
                )
            )
    return out


def _awq_mismatch(prefix: str, variant: str, awq_rule: bool) -> str:
    """Why a layer fails SGLang's name rule for AWQ W4A16: the rule picks the layer's kind by
    its name, and this layer's stored kind is the other one (either way the qweight does not fit)."""
    names = " / ".join(SGLANG_AWQ)
    if awq_rule:
        return (
            f"layer '{prefix}': SGLang's nunchaku config runs names containing {names} as AWQ W4A16 "
            f"(qweight I32 [N/4, K/2]); this {variant} layer does not fit"
        )
    return (
        f"layer '{prefix}': SGLang's nunchaku config runs AWQ W4A16 only for names containing {names}; "
        "it builds this layer as SVDQ W4A4 (qweight I8 [N, K/2]) and the stored I32 [N/4, K/2] qweight does not fit"
    )


DIALECTS = (
    Dialect(
        NAME,
        "nunchaku SVDQuant (SVDQ W4A4 int4/nvfp4, AWQ W4A16)",
        writer="nunchaku / deepcompressor (svdq-int4-*, svdq-fp4-* checkpoints), ComfyUI-nunchaku",
        source="nunchaku lora/flux/packer.py, deepcompressor "
        "backend/nunchaku/utils.py and backend/tinychat/utils.py; diffusers quantizers/nunchaku",
        detect=detect,
        failures=failures,
        rule_tag="nunchaku",
        settle=settle,
        order=60,
    ),
)
