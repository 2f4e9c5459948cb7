"""The input gate of the commands that decode a checkpoint into a new one (``dequantize``,
``convert``, ``quantize``): they refuse exactly the inputs ``check`` finds broken, with the
same one-line reason, so no command accepts what another refuses.

Severity is judged for comfy-kitchen, whose decode these commands reproduce bit for bit: a
finding that only stops another runtime (SGLang's stricter marker rules, say) does not make
the weights undecodable.  ``fix`` has no gate: broken inputs are what it is for.
"""

from __future__ import annotations

from .errors import ComfyQuantError, InputError

GATE_TARGET = "comfy-kitchen"
ALWAYS_BLOCKING = frozenset({"M023"})
"""Findings that stop a decoding command whatever their severity for comfy-kitchen: a
quantized weight without a marker cannot be decoded, and copying it would leave it quantized."""


def check_input(ckpt, verb: str, error: type[ComfyQuantError] = InputError):
    """Check ``ckpt`` and raise ``error`` ("refusing to <verb>: <first error> [code] (and N
    more ...)") if it has an error; returns the report otherwise.

    A weight without a marker of its own is decodable when the file's ``quant_format`` gives
    it one (:func:`~comfyquant.markers.file_level_markers`, as SGLang reads it): its ``M023``
    does not block; the commands validate its tensors against that format when they plan it."""
    from .checker.run import check_checkpoint
    from .markers import file_level_markers

    report = check_checkpoint(ckpt, target=GATE_TARGET)
    refuse_errors(report, verb, error, set(file_level_markers(ckpt)), _relabelled_for_kitchen(ckpt, report))
    return report


def _relabelled_for_kitchen(ckpt, report) -> set[str]:
    """Layers comfy-kitchen refuses only for an operand's dtype label that ComfyUI views as the
    right one before handing it over (an MXFP8 block scale stored as ``U8``, say: the same
    bytes).  The decoding commands decode the way ComfyUI runs comfy-kitchen, views included,
    so those layers are decodable exactly: their findings do not block."""
    from .targets.select import run_target

    failing: dict[str, set[str]] = {}
    for v in report.verdicts[GATE_TARGET].violations:
        if v.fails and v.layer:
            failing.setdefault(v.layer, set()).add(v.rule)
    only_dtype = {layer for layer, rules in failing.items() if rules == {f"{GATE_TARGET}.dtype"}}
    if not only_dtype:
        return set()
    comfy = run_target("comfyui", ckpt)
    still = {v.layer for v in comfy.violations if v.fails and v.rule == "comfyui.dtype"}
    return only_dtype - still


def refuse_errors(
    report, verb: str, error: type[ComfyQuantError] = InputError, implied: set[str] = frozenset(), viewed: set[str] = frozenset()
) -> None:
    """``implied``: unmarked layers a file-level ``quant_format`` covers (their missing marker,
    M023, is no obstacle); ``viewed``: layers whose only comfy-kitchen failure is a dtype label
    ComfyUI views as the right one (no finding of theirs is an obstacle)."""
    errors = [
        f
        for f in report.findings
        if (f.severity == "error" or f.code in ALWAYS_BLOCKING)
        and f.layer not in viewed
        and not (f.code == "M023" and f.layer in implied)
    ]
    if not errors:
        return
    first = errors[0]
    where = first.file if not first.layer and first.file else None
    # no count of its own: the gate judges for comfy-kitchen, check for every runtime, and a user
    # who read two different numbers for one file could trust neither
    more = " (and more: comfyquant check lists every problem)" if len(errors) > 1 else ""
    prefix = f"{where}: " if where and where not in first.message else ""
    raise error(f"refusing to {verb}: {prefix}{first.message} [{first.code}]{more}")
