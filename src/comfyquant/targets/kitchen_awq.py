"""What the first forward of an AWQ W4A16 layer raises in comfy-kitchen 0.2.40.

comfy-kitchen's AWQ ``Params`` validate nothing at load; its linear (``F.linear`` with the
``QuantizedTensor``) runs ``gemv_awq_w4a16`` (comfy-kitchen 0.2.40
``comfy_kitchen/backends/eager/awq.py``), on CPU the eager backend.  That op checks its
operands' dtypes and ranks, then the input's K against the group size and the packed weight,
then unpacks the weight into ``[N, K / group_size, group_size]`` groups and applies the
scales and zeros as ``[N, groups, 1]`` (each stored as ``[groups, N]``, transposed) by
broadcasting, and multiplies the input in the scales' dtype.  Every message below follows
from the stored shapes and dtypes, for a first forward on an input of shape
``[4, K]`` (K the model's input size, two codes per stored weight byte).
"""

from __future__ import annotations

from .base import LAYER, Violation
from .torch_text import TORCH_DTYPES, broadcast_error

OP = "gemv_awq_w4a16"
FLOATS = ("F32", "F16", "BF16")
OPERANDS = (("weight", "qweight", ("I8",)), ("weight_scale", "wscales", FLOATS), ("weight_zeros", "wzeros", FLOATS))
"""(suffix, the op's operand name, accepted dtypes), in the order the op's constraints check
them: each operand's dtype, then its rank (exactly 2-D)."""
C10 = {"F32": "float", "F16": "c10::Half", "BF16": "c10::BFloat16", "F64": "double"}
"""How torch's matmul names a dtype in its dtype-mismatch message."""

ROWS = 4
"""The rows of the input the verdict states (``[4, K]``)."""


def _promoted(a: str, b: str) -> str:
    """torch's result dtype of an elementwise op between two float dtypes."""
    return a if a == b else "F32"


def _broadcast(a: tuple, b: tuple) -> tuple:
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + tuple(a)
    b = (1,) * (ndim - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def _fail(message: str, exception: str, tensor: str | None, cause: str, fix: str) -> Violation:
    cause = f"{cause}; first forward on an input of shape [{ROWS}, K], K two codes per weight byte"
    return Violation("comfy-kitchen.awq", message, exception, LAYER, tensor, True, cause, fix)


def _absent(suffix: str, attribute: str) -> Violation:
    return _fail(
        f"'NoneType' object has no attribute '{attribute}'",
        "AttributeError",
        suffix,
        f"{suffix} is missing: the layout is built without it and the op fails where it reads it",
        "re-export the layer with its scales and zeros",
    )


def model_k(w, scale, zeros, g: int) -> int:
    """The model's input size K for an AWQ layer: the weight's (two codes per byte), unless
    the weight is what is off while the scales and zeros, both ``[groups, N]``, record the same
    other K: its rows are not the N they record, or its K is a multiple neither of the group
    size nor of their group count (a K their groups split evenly says the marker's group size
    is what is off)."""
    n, k_half = w.shape
    k = 2 * k_half
    if scale is None or zeros is None or len(scale.shape) != 2 or tuple(scale.shape) != tuple(zeros.shape) or g <= 0:
        return k
    groups, rows = scale.shape
    if groups * g == k or groups <= 0:
        return k
    if rows != n or (k % g and k % groups):  # (a K the stored groups split evenly: the marker is off)
        return groups * g
    return k


def awq_forward(t: dict, group_size: int) -> Violation | None:
    """The first failure of ``gemv_awq_w4a16`` on the stored tensors ``t`` (header entries)
    with the marker's group size, on an input of shape ``[4, K]``; None when it runs."""
    for suffix, operand, accepted in OPERANDS:
        e = t.get(suffix)
        if e is None:
            continue  # an absent operand is not checked; the op fails where it reads it
        if e.dtype not in accepted:
            names = ", ".join(f"torch.{TORCH_DTYPES[d]}" for d in accepted)
            return _fail(
                f"No backend can handle '{OP}': eager: {operand}: dtype torch.{TORCH_DTYPES.get(e.dtype, e.dtype)} not in {{{names}}}",
                "NoCapableBackendError",
                suffix,
                f"{suffix} stored as {e.dtype}: comfy-kitchen's {OP} takes {' or '.join(accepted)}",
                f"store {suffix} as {accepted[-1]}",
            )
        if len(e.shape) != 2:
            return _fail(
                f"No backend can handle '{OP}': eager: {operand}: shape {list(e.shape)} fails: exactly 2D",
                "NoCapableBackendError",
                suffix,
                f"{suffix} of shape {list(e.shape)}: comfy-kitchen's {OP} takes it exactly 2-D",
                "store the weight as [N, K / 2] and its scales and zeros as [K / group_size, N]",
            )
    w, scale, zeros = t["weight"], t.get("weight_scale"), t.get("weight_zeros")
    n, k_half = w.shape
    g = group_size
    regroup = "re-export the layer with the group size it was quantized with"
    if g == 0:
        return _fail("integer modulo by zero", "ZeroDivisionError", None, "marker group_size 0", regroup)
    k = model_k(w, scale, zeros, g)
    if k % g:
        return _fail(
            f"K={k} not divisible by group_size={g}", "ValueError", None, f"group_size {g} does not divide K={k}", regroup
        )
    if k != 2 * k_half:
        return _fail(
            f"qweight K//2={k_half} inconsistent with x K={k}",
            "ValueError",
            "weight",
            f"weight of shape {list(w.shape)} ({2 * k_half} inputs) where its scales and zeros record {k} "
            f"(their {k // g} groups of {g}): the input has the model's {k}",
            "re-export the layer from its original weights",
        )
    groups = k // g
    if scale is None:  # the scales' dtype is the compute dtype
        return _absent("weight_scale", "dtype")
    if groups < 0:
        return _fail(
            f"invalid shape dimension {groups} at index 1 of shape [{n}, {groups}, {g}]",
            "RuntimeError",
            None,
            f"negative group_size {g}",
            regroup,
        )
    if zeros is None:  # both are transposed before either is applied
        return _absent("weight_zeros", "t")
    shape = (n, groups, g)
    for suffix, e in (("weight_scale", scale), ("weight_zeros", zeros)):
        applied = (e.shape[1], e.shape[0], 1)  # stored [groups, N], applied transposed
        message = broadcast_error(shape, applied)
        if message is not None:
            return _fail(
                message,
                "RuntimeError",
                suffix,
                f"{suffix} of shape {list(e.shape)} for {groups} groups of {g} over {n} rows "
                f"(applied as [N, groups, 1] at the first forward)",
                f"store {suffix} as [{groups}, {n}]",
            )
        shape = _broadcast(shape, applied)
    decoded = _promoted(scale.dtype, zeros.dtype)
    if decoded != scale.dtype and scale.dtype in C10 and decoded in C10:
        return _fail(
            f"expected m1 and m2 to have the same dtype, but got: {C10[scale.dtype]} != {C10[decoded]}",
            "RuntimeError",
            "weight_zeros",
            f"weight_zeros stored as {zeros.dtype} beside {scale.dtype} scales: the decoded weight is "
            f"{decoded} while the input is cast to the scales' {scale.dtype}",
            f"store weight_zeros as {scale.dtype}",
        )
    return None
