"""``asym_w4a8_int8``: grouped 4-bit (or 6-bit) codes, FP8 group scales, always ConvRot.

Four storage variants share the name (comfy-kitchen 0.2.40 ``AsymW4A8Int8Layout``): codebook
(A), uniform symmetric (B), asymmetric with a correction (C) and 6-bit rows (D).  The variant
follows from the tensors present and the packed row width."""

from __future__ import annotations

import math

from ..base import CODEBOOK, CORRECTION, WEIGHT, Constraint, Expr, Format, GeometryError, MarkerKey, Slot
from ..common import (
    ALL_RUNTIMES,
    BIAS_SLOT,
    CONVROT_JSON_TRUE,
    FORMAT_KEY,
    FULL_PRECISION_KEY,
    as_int,
    convrot_size_key,
    weight_2d,
)
from .deep import DROPPED_CORRECTION, level_mismatch
from .repair import infer_marker, lossy
from .widths import k_by_bits

CODEC = __name__ + ".codec"
"""The module holding this package\'s codecs (imported on first use)."""

REQUANTIZE = "re-export from the original weights with one consistent group size (comfyquant quantize)"

GROUP_SIZE = 16
"""The default group size: the marker key's default and what ``quantize`` writes."""


def group_rule(g: str) -> str:
    """The group sizes comfy-kitchen's W4A8 kernels take, as an expression over the name ``g``
    (the marker key's allowed values, the geometry constraint and ``group_size_ok``)."""
    return f"{g} >= 4 and (16 % {g} == 0 or {g} % 16 == 0)"


GROUP_RULE_TEXT = ">= 4 and dividing 16 or a multiple of 16"
_GROUP_RULE = Expr(group_rule("g"))


def group_size_ok(g: int) -> bool:
    """Whether an integer group size meets the rule (the encoder and comfy-kitchen's profile)."""
    return bool(_GROUP_RULE({"g": g}))


SIX_BIT_GROUP = "group_size % 16 == 0"
"""6-bit rows pack groups of 16: the group size 6-bit storage needs."""
SIX_BIT_RULE = f"K % 32 == 0 and {SIX_BIT_GROUP}"
"""What 6-bit storage needs of the layer (the packed row holds whole 3-byte quads)."""
K_RULE = "K % 16 == 0 and K % group_size == 0 and K % convrot_groupsize == 0"
"""The input sizes the grouping and the rotation divide (with a valid group size)."""

SIX_BIT_FORBIDS = "6-bit storage is uniform and symmetric: no codebook or correction"
"""Why a 6-bit layer has neither a codebook nor a correction (the L006 cause)."""

_SIX_BIT_GROUP, _SIX_BIT_RULE, _K_RULE = Expr(SIX_BIT_GROUP), Expr(SIX_BIT_RULE), Expr(K_RULE)


def six_bit_group_ok(g: int) -> bool:
    return bool(_SIX_BIT_GROUP({"group_size": g}))


def six_bit_fits(k: int, g: int) -> bool:
    return bool(_SIX_BIT_RULE({"K": k, "group_size": g}))


def k_fits(k: int, g: int, c: int) -> bool:
    """Whether K fits group size ``g`` and ConvRot size ``c`` (both nonzero)."""
    return bool(_K_RULE({"K": k, "group_size": g, "convrot_groupsize": c}))


def _inspect_text(env: dict) -> str:
    return f"{env['variant']} {env['bits']}-bit G={env['group_size']} C={env['convrot_groupsize']}"


def _input_size(cols: int, s_rel, g: int, c: int) -> tuple[int, int]:
    """(K, bits) the stored tensors show: K = groups x group_size with the groups read from
    the natural [N, NG] s_rel, else the transposed one (a transposed s_rel still yields the
    geometry and is reported).  When the marker's group size explains neither width (the
    marker is what is wrong), the width whose K the stored groups split into a group size the
    kernels take; else the nearest fitting width (``_nearest``: the s_rel slot then reports the
    mismatch)."""
    by_bits = k_by_bits(cols)
    if s_rel is None or len(s_rel.shape) != 2:
        return _nearest(by_bits, s_rel, g, c)
    for groups in (s_rel.shape[1], s_rel.shape[0]):
        for b, kk in by_bits.items():
            if g > 0 and groups * g == kk:
                return kk, b
    groups = s_rel.shape[1]
    for b, kk in by_bits.items():
        if groups > 0 and kk % groups == 0 and group_size_ok(kk // groups):
            return kk, b
    return _nearest(by_bits, s_rel, g, c)


def _nearest(by_bits: dict[int, int], s_rel, g: int, c: int) -> tuple[int, int]:
    """(K, bits) when the stored groups fit no width exactly (s_rel is what is off): the widths
    whose K fits the grouping and the rotation, the one whose group count is nearest s_rel's
    last dimension."""
    fitting = {b: kk for b, kk in by_bits.items() if g > 0 and c > 0 and k_fits(kk, g, c)} or by_bits
    if s_rel is None or not s_rel.shape or g <= 0:
        return next((kk, b) for b, kk in fitting.items())
    stored = s_rel.shape[-1]
    b = min(fitting, key=lambda b: (abs(fitting[b] // g - stored), b))
    return fitting[b], b


def layer_geometry(tensors: dict, params: dict) -> dict:
    """The layer's geometry whatever its group size: a runtime builds the layer with the
    model's (N, K) and the marker's group size, and its own check refuses a group size that
    cannot define groups (``_geometry`` raises for those instead)."""
    n, cols = weight_2d(tensors)
    g = as_int(params.get("group_size"), GROUP_SIZE)
    c = as_int(params.get("convrot_groupsize"), 256)
    k, bits = _input_size(cols, tensors.get("weight_s_rel"), g, c)
    has_codebook = "weight_codebook" in tensors
    has_correction = "weight_correction" in tensors
    variant = "6-bit" if bits == 6 else "asymmetric" if has_correction else "codebook" if has_codebook else "uniform"
    return dict(
        params,
        N=n,
        K=k,
        bits=bits,
        group_size=g,
        convrot_groupsize=c,
        variant=variant,
        has_codebook=has_codebook,
        has_correction=has_correction,
        K_multiple=math.lcm(16, g, c) if g > 0 and c > 0 else 16,
    )


def _rows(tensors: dict, weight_rows: int) -> int:
    """The output size most of the layer's tensors show (the weight's on a tie): the weight's
    rows, s_rel's rows, s_channel's and the bias's length, the correction's columns."""
    seen = [weight_rows]
    for suffix, rank, axis in (("weight_s_rel", 2, 0), ("weight_s_channel", 1, 0), ("bias", 1, 0), ("weight_correction", 2, 1)):
        e = tensors.get(suffix)
        if e is not None and len(e.shape) == rank:
            seen.append(e.shape[axis])
    return max(seen, key=lambda n: (seen.count(n), n == weight_rows))


def model_geometry(tensors: dict, params: dict) -> dict:
    """The geometry of the model a runtime builds for this layer (its ``Params`` are checked
    against it, the stored tensors against each other at the first forward): N is what most
    tensors show; K is the stored groups' when the weight's width fits no K they show (the
    weight is what is off)."""
    env = layer_geometry(tensors, params)
    rows = env["N"]
    env["N"] = _rows(tensors, rows)
    s_rel, g, c = tensors.get("weight_s_rel"), env["group_size"], env["convrot_groupsize"]
    if s_rel is not None and len(s_rel.shape) == 2 and g > 0 and c > 0:
        groups = s_rel.shape[1]
        grouped = groups * g
        widths = k_by_bits(weight_2d(tensors)[1]).values()
        # a width the stored groups split into a valid group size: the marker is what is off,
        # unless the weight's rows are not the model's (the weight is)
        split = rows == env["N"] and groups > 0 and any(kk % groups == 0 and group_size_ok(kk // groups) for kk in widths)
        explained = env["K"] == s_rel.shape[0] * g  # a transposed s_rel
        if grouped not in widths and not split and not explained and k_fits(grouped, g, c) and group_size_ok(g):
            env["K"] = grouped
    return env


def _geometry(tensors: dict, params: dict) -> dict:
    g = as_int(params.get("group_size"), GROUP_SIZE)
    if g <= 0:
        raise GeometryError(f"group_size={params.get('group_size')!r} cannot define groups")
    return layer_geometry(tensors, params)


def _encode_params(env: dict, tensors: dict) -> dict:
    """comfy-kitchen's arguments for this layer's variant (A-D above) and sizes."""
    s_rel = tensors.get("weight_s_rel")
    return {
        "group_size": env["group_size"],
        "convrot_groupsize": env["convrot_groupsize"],
        "bits": env["bits"],
        "symmetric": "weight_correction" not in tensors,
        "codebook": "weight_codebook" in tensors,
        "scale_dtype": "float32" if s_rel is not None and str(s_rel.dtype) in ("F32", "torch.float32") else "float8_e4m3fn",
    }  # header entries name dtypes, torch tensors carry torch dtypes


ASYM_W4A8_INT8 = Format(
    name="asym_w4a8_int8",
    heavy_encoder=True,
    codec_module=CODEC,
    title="grouped 4/6-bit weights, FP8 group scales, INT8 activations, ConvRot",
    slots=(
        Slot(
            "weight", "I8", "(N, K * bits // 8)", kind=WEIGHT, meaning="packed codes, K/2 (4-bit) or 3K/4 (6-bit) bytes per row"
        ),
        Slot(
            "weight_s_rel",
            "F8_E4M3",
            "(N, K // group_size)",
            positive=True,
            # comfy-kitchen 0.2.40 ``_dequant_int4_grouped_to_int8`` rounds and clamps code x s_rel:
            # a NaN in one group leaves the output finite and close (measured)
            on_int8_grid=True,
            deep_check=level_mismatch,
            meaning="per-group relative scale",
            also_dtypes={
                "U8": ("FP8 bytes labelled U8: ComfyUI views them as FP8, SGLang refuses them", "warning"),
                "F32": ("written with scale_dtype=float32: comfy-kitchen reads it, SGLang refuses it", "warning"),
            },
        ),
        Slot("weight_s_channel", "F32", "(N,)", positive=True, meaning="per-row scale"),
        Slot(
            "weight_codebook",
            "F32",
            "(16,)",
            kind=CODEBOOK,
            required=False,
            meaning="code -> level table (codebook variant)",
            forbidden="bits == 6",
            forbidden_cause=SIX_BIT_FORBIDS,
        ),
        Slot(
            "weight_correction",
            "F32",
            "(K // group_size, N)",
            kind=CORRECTION,
            required=False,
            meaning="per-(group, row) additive term, group-major",
            forbidden="bits == 6 or has_codebook",
            forbidden_cause=(
                ("bits == 6", SIX_BIT_FORBIDS),
                (
                    "has_codebook",
                    "a codebook and a correction on one layer: comfy-kitchen's writer never stores both "
                    "(comfy-kitchen 0.2.40 decodes the levels plus the correction; ComfyUI drops the correction)",
                ),
            ),
            also_dtypes={
                "BF16": ("comfy-kitchen writes the correction in the source weight dtype; SGLang requires F32", "warning"),
                "F16": ("comfy-kitchen writes the correction in the source weight dtype; SGLang requires F32", "warning"),
            },
        ),
        BIAS_SLOT,
    ),
    keys=(
        FORMAT_KEY,
        FULL_PRECISION_KEY,
        MarkerKey(
            "group_size",
            (int,),
            default=GROUP_SIZE,
            allowed=group_rule("v"),
            allowed_text=GROUP_RULE_TEXT,
            explicit=True,
            why_explicit="write group sizes explicitly so every reader agrees",
            nested_ok=True,
        ),
        convrot_size_key(
            "a power of 4 (16, 64 or 256 recommended)", True, "write ConvRot sizes explicitly so every reader agrees"
        ),
        MarkerKey(
            "convrot",
            (bool,),
            allowed="v is True",
            allowed_text="true (W4A8 always rotates)",
            explicit=True,
            why_explicit="SGLang refuses W4A8 markers without convrot: true; ComfyUI does not write it",
            nested_ok=True,
            missing_text="missing ConvRot flag",
            suggested="true",
            invalid_cause=CONVROT_JSON_TRUE,
        ),
    ),
    geometry=_geometry,
    model_geometry=model_geometry,
    constraints=(
        Constraint(
            K_RULE,
            "K={K} must be a multiple of {K_multiple} (16, group_size={group_size} and "
            "convrot_groupsize={convrot_groupsize} must all divide it)",
            cause="the layer's input size does not fit the W4A8 grouping or rotation",
            fix="keep this layer dense, or re-quantize with sizes that divide K",
        ),
        Constraint(
            group_rule("group_size"),
            "group_size={group_size} must be >= 4 and divide 16 or be a multiple of 16",
            fix=REQUANTIZE,
        ),
        Constraint(
            "is_pow4(convrot_groupsize)",
            "convrot_groupsize={convrot_groupsize} is not a power of 4",
            cause="comfy-kitchen raises 'Regular Hadamard size must be a power of 4'; SGLang does not check and fails at run time",
            fix=REQUANTIZE,
        ),
        Constraint(
            f"bits != 6 or ({SIX_BIT_RULE})",
            "6-bit storage needs K divisible by 32 and group_size a multiple of 16, got K={K}, group_size={group_size}",
            fix=REQUANTIZE,
        ),
    ),
    bits_text="4 or 6 (from the packed row width)",
    rotation="always",
    loaders=ALL_RUNTIMES,
    bank_rows=("weight", "weight_scale", "weight_s_rel", "weight_s_channel", "bias"),
    recognize=lambda t: "weight_s_rel" in t and "weight" in t and t["weight"].dtype == "I8",
    encode_params=_encode_params,
    params_module=__name__ + ".params",
    aliases=("w4a8",),
    inspect_text=_inspect_text,
    infer_marker=infer_marker,
    lossy=lossy,
    dropped=DROPPED_CORRECTION,
)

FORMATS = (ASYM_W4A8_INT8,)
"""The formats this package describes (the registry collects every package's ``FORMATS``)."""
