"""What comfy-kitchen's INT8 linear checks first: the input's K against the weight's.

The INT8 linear (comfy-kitchen 0.2.40, eager backend) compares the input's last dimension
with the weight's before its scale and ConvRot checks.  The input is the model's, of shape
[4, K]; the model's K is what the layer's tensors show (a weight whose rows are not the
model's N while its columns are is stored transposed: its rows are K).
"""

from __future__ import annotations

from .base import LAYER, Violation


def _model_rows(t: dict, weight_rows: int) -> int:
    """The output size most of the layer's tensors show (the weight's on a tie): the weight's
    rows, the bias's length, a per-row scale's rows."""
    seen = [weight_rows]
    b, s = t.get("bias"), t.get("weight_scale")
    if b is not None and len(b.shape) == 1:
        seen.append(b.shape[0])
    if s is not None and (len(s.shape) == 1 or (len(s.shape) == 2 and s.shape[1] == 1)) and s.shape[0] > 1:
        seen.append(s.shape[0])
    return max(seen, key=lambda n: (seen.count(n), n == weight_rows))


def int8_input_k(target: str, t: dict) -> Violation | None:
    """The linear's refusal of a weight stored transposed, for an input of shape [4, K]."""
    w = t.get("weight")
    if w is None or len(w.shape) != 2:
        return None
    rows, cols = w.shape
    n = _model_rows(t, rows)
    if rows == n or cols != n:
        return None
    k = rows  # stored [K, N]: the model's K is the weight's rows
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
