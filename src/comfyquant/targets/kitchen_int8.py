"""What comfy-kitchen's INT8 linear checks first: the input's K against the weight's.

The INT8 linear (comfy-kitchen 0.2.40, eager backend) compares the input's last dimension
with the weight's before its scale and ConvRot checks.  The input is the model's, of shape
[4, K]; the model's K is what the layer's tensors show (a weight whose rows are not the
model's N while its columns are is stored transposed: its rows are K).
"""

from __future__ import annotations

from .base import LAYER, Violation


def model_rows(t: dict, weight_rows: int) -> int:
    """The output size most of the layer's tensors show (the weight's on a tie): the weight's
    rows, the bias's length, a per-row scale's rows."""
    seen = [weight_rows]
    b, s = t.get("bias"), t.get("weight_scale")
    if b is not None and len(b.shape) == 1:
        seen.append(b.shape[0])
    if s is not None and (len(s.shape) == 1 or (len(s.shape) == 2 and s.shape[1] == 1)) and s.shape[0] > 1:
        seen.append(s.shape[0])
    return max(seen, key=lambda n: (seen.count(n), n == weight_rows))


def stored_transposed(t: dict) -> tuple[int, int] | None:
    """The model's (N, K) of a 2-D weight stored transposed ([K, N]: its rows are not the
    model's N while its columns are, so its rows are K), or None."""
    w = t.get("weight")
    if w is None or len(w.shape) != 2:
        return None
    rows, cols = w.shape
    n = model_rows(t, rows)
    return (n, rows) if rows != n and cols == n else None


def int8_input_k(target: str, t: dict) -> Violation | None:
    """The linear's refusal of a weight stored transposed, for an input of shape [4, K]."""
    found = stored_transposed(t)
    if found is None:
        return None
    n, k = found
    rows, cols = t["weight"].shape
    return Violation(
        f"{target}.int8-input",
        f"Input and weight inner dimensions must match, got {k} and {cols}",
        "ValueError",
        LAYER,
        "weight",
        True,
        f"weight stored [{rows}, {cols}] for a layer of {n} outputs: it is transposed, so the first forward "
        f"(on an input of shape [4, {k}]) meets {cols} weight columns",
        f"store the weight as [{n}, {k}]",
    )


def _ceil8(n: int) -> int:
    return -(-n // 8) * 8


def unchecked_int8_linear(target: str, read: dict, t: dict) -> Violation | None:
    """What the first forward of an INT8 layer raises in a comfy-kitchen release whose INT8
    linear checks neither the input's K nor the scale's length first (0.2.11 to 0.2.13): the
    steps fail in its own order, in torch's words.  ``read``: the marker as ComfyUI reads it
    (``kitchen.marker_ints``).  The steps, on an input of shape [4, K]:

    * ConvRot builds its Hadamard rotation (a size not a power of 4 is refused), then rotates
      the input in groups (a size not dividing K is refused);
    * the weight is transposed and padded to multiples of 8 (K and the output columns) for
      ``torch._int_mm``, which takes 2-D operands of matching inner sizes only;
    * the weight scale is flattened (``view``) and multiplied into the [4, N] output with the
      input's row scales, so it must hold one value or N.

    None: it raises none of these (the layer computes as in 0.2.40)."""
    from ..formats.base import is_pow4

    w = t.get("weight")
    if w is None or len(w.shape) not in (2, 3):
        return None
    shape = tuple(w.shape)
    transposed = stored_transposed(t)
    k = shape[-1] if transposed is None else transposed[1]
    where = f"comfy-kitchen 0.2.11 to 0.2.13 run the INT8 linear unchecked; weight stored {list(shape)}"

    def refused(message: str, exception: str, tensor: str, cause: str, fix: str) -> Violation:
        return Violation(f"{target}.int8-unchecked", message, exception, LAYER, tensor, True, f"{where}: {cause}", fix)

    if read.get("convrot"):
        c = read.get("convrot_groupsize", 256)
        if isinstance(c, int) and not isinstance(c, bool):
            if not is_pow4(c):
                return refused(
                    f"Regular Hadamard size must be a power of 4, got {c}", "ValueError", "comfy_quant",
                    f"convrot_groupsize {c} is not a Hadamard size", "re-quantize with convrot_groupsize 16, 64 or 256",
                )  # fmt: skip
            if k % c:
                return refused(
                    f"features {k} not divisible by group_size {c}", "ValueError", "comfy_quant",
                    f"convrot_groupsize {c} does not divide the input's {k} features", "re-quantize with a group size dividing K",
                )  # fmt: skip
    rows_t = shape[::-1]  # weight.T (a 3-D weight's dimensions reversed)
    padded_k = _ceil8(k)
    fix_shape = f"store the weight 2-D as [N, {k}]"
    if len(shape) == 3:
        if padded_k != k or _ceil8(rows_t[1]) != rows_t[1]:  # padded with a 2-D block
            return refused("Tensors must have same number of dimensions: got 3 and 2", "RuntimeError", "weight",
                           "the 3-D weight is padded with a 2-D block", fix_shape)  # fmt: skip
        return refused("int_mm_out_cpu: Expected mat2 to be of dimension 2 but got 3", "RuntimeError", "weight",
                       "torch._int_mm takes a 2-D weight", fix_shape)  # fmt: skip
    inner = rows_t[0] + padded_k - k
    if inner != padded_k:
        return refused(
            f"int_mm_out_cpu: self.size(1) needs to match mat2.size(0) but got {padded_k} and {inner}", "RuntimeError",
            "weight", f"the input's {k} features meet {shape[1]} weight columns", fix_shape,
        )  # fmt: skip
    s = t.get("weight_scale")
    if s is None:
        return refused("'NoneType' object has no attribute 'view'", "AttributeError", "weight_scale",
                       "weight_scale is missing", "re-export the layer with all its tensors")  # fmt: skip
    n = shape[0]
    if s.numel not in (1, n):
        return refused(
            f"The size of tensor a ({n}) must match the size of tensor b ({s.numel}) at non-singleton dimension 1",
            "RuntimeError", "weight_scale", f"weight_scale holds {s.numel} values for {n} outputs",
            "store one scale, or one per output row (comfyquant fix reshapes it when the values allow)",
        )  # fmt: skip
    return None
