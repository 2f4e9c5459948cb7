"""Pieces several format descriptions share: common marker keys, bias slot, dense geometry."""

from __future__ import annotations

from .base import BIAS, GeometryError, MarkerKey, Slot

FORMAT_KEY = MarkerKey("format", (str,), allowed_text="a format name")
FULL_PRECISION_KEY = MarkerKey(
    "full_precision_matrix_mult",
    (bool,),
    default=False,
    allowed_text="true or false",
)
CONVROT_JSON_TRUE = (("v in (1, 'true')", "convrot must be JSON true: SGLang tests identity with True"),)
"""``MarkerKey.invalid_cause`` of a ``convrot`` flag a format turns on: a value that reads as
true loosely (``1``, ``"true"``) is still refused."""
BIAS_SLOT = Slot("bias", "float", "(N,)", kind=BIAS, required=False, meaning="bias, never quantized")
ALL_RUNTIMES = frozenset({"comfyui", "sglang", "comfy-kitchen"})


def f32_scale_slot(shape: str, **kw) -> Slot:
    """The F32 ``weight_scale`` of a layer whose dequantization scale must be finite and > 0."""
    return Slot("weight_scale", "F32", shape, positive=True, **kw)


def convrot_size_key(allowed_text: str, explicit: bool | str, why_explicit: str) -> MarkerKey:
    """The ConvRot rotation size ``convrot_groupsize``: a power of 4, 256 when unwritten."""
    return MarkerKey(
        "convrot_groupsize",
        (int,),
        default=256,
        allowed="is_pow4(v)",
        allowed_text=allowed_text,
        explicit=explicit,
        why_explicit=why_explicit,
        nested_ok=True,
    )


def as_int(value, default):
    """Marker numbers go through ``int()`` in the runtimes; fall back to the default if that fails."""
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def weight_2d(tensors: dict) -> tuple[int, int]:
    w = tensors.get("weight")
    if w is None:
        raise GeometryError("the layer has no weight tensor")
    if len(w.shape) != 2:
        raise GeometryError(f"weight must be 2-D [N, K], got {w.shape}")
    return w.shape


def dense_geometry(tensors: dict, params: dict) -> dict:
    """Geometry of formats that store one element per weight: weight is [N, K]."""
    n, k = weight_2d(tensors)
    return dict(params, N=n, K=k, bits=8)


def has_2d_weight(tensors: dict, dtype: str) -> bool:
    w = tensors.get("weight")
    return w is not None and w.dtype == dtype and len(w.shape) == 2


def padded_bias_slot(multiple: int) -> Slot:
    """Bias of a format that pads its stored rows: it keeps the model's own N."""
    return Slot(
        "bias",
        "float",
        "(N_model,)",
        kind=BIAS,
        required=False,
        meaning=f"bias, never quantized; model rows (storage pads rows to {multiple})",
    )


def model_size(tensors: dict, suffix: str, stored: int, multiple: int) -> int:
    """The model's size along a padded axis, read from an unpadded 1-D companion if it fits."""
    e = tensors.get(suffix)
    if e is not None and len(e.shape) == 1 and 0 < e.shape[0] <= stored and -(-e.shape[0] // multiple) * multiple == stored:
        return e.shape[0]
    return stored


def no_params(env: dict, tensors: dict) -> dict:
    """``Format.encode_params`` of formats whose encoder takes no parameters."""
    return {}
