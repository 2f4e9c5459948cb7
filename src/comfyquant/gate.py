"""The input gate of the commands that read a checkpoint to write or measure another
(``dequantize``, ``convert``, ``quantize``, ``compare``, ``recipe``, the PyTorch loaders): every
one opens its inputs through ``open_input``, which judges a file in two steps.

1. The file as stored, before any dialect view reads it (``refuse_damage``): container
   damage -- a truncated file, a tensor whose bytes do not match its dtype and shape, an
   unknown dtype, a malformed entry, a name in two shards -- and an incomplete shard set (a
   shard the index or the shard names call for is missing, or the index lists a tensor no
   shard holds) refuse the input in one line naming the file or shard, whatever the layout.
   A dialect's translation reads the stored bytes, so it must never meet them damaged; and a
   missing shard is never dropped from an output.
2. The Comfy file it reads as (``check_input``): the inputs ``check`` finds broken, with
   the same one-line reason, so no command accepts what another refuses.  Severity is judged
   for comfy-kitchen, whose decode these commands reproduce bit for bit: a finding that only
   stops another runtime (SGLang's stricter marker rules, say) does not make the weights
   undecodable.

``fix`` and ``migrate`` have no gate: broken inputs are what they are for (they refuse what
they cannot carry over exactly themselves).
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .errors import ComfyQuantError, InputError
from .findings import ERROR, RULES

if TYPE_CHECKING:
    from .checker.report import Report
    from .checkpoint import Checkpoint

GATE_TARGET = "comfy-kitchen"
ALWAYS_BLOCKING = frozenset({"M023"})
"""Findings that stop a decoding command whatever their severity for comfy-kitchen: a
quantized weight without a marker cannot be decoded, and copying it would leave it quantized."""


DAMAGE = frozenset(code for code, rule in RULES.items() if code.startswith("C") and rule.severity == ERROR)
"""Container and shard-set findings (``C0xx`` errors) that refuse an input before anything reads
its tensors: the bytes are not what the header says, or tensors the checkpoint declares are
absent (``C011`` a missing shard, ``C014`` a tensor no shard holds)."""


@contextmanager
def open_input(paths, verb: str, error: type[ComfyQuantError] = InputError, *, check: bool = True, **open_kw) -> Iterator[tuple]:
    """``(stored, view)``: the checkpoint at ``paths`` opened (any container), judged as stored
    (``refuse_damage``), then read as the Comfy file its layout translates to
    (``dialects/view``; ``view is stored`` for a Comfy file) and, with ``check``, judged as that
    (``check_input``).  Every refusal raises ``error`` ("refusing to <verb>: ...").  Both
    are closed on leaving."""
    from .dialects.containers import open_any
    from .dialects.view import viewed

    with open_any(paths, **open_kw) as stored:
        refuse_damage(stored, verb, error)
        with viewed(stored, verb) as view:
            if check:
                check_input(view, verb, error)
            yield stored, view


def refuse_damage(ckpt: Checkpoint, verb: str, error: type[ComfyQuantError] = InputError) -> None:
    """Raise ``error`` when the stored checkpoint has container damage or an incomplete shard
    set (``DAMAGE``), naming the file or the missing shard: "refusing to <verb>: <file>:
    <what> [code] (and N more ...)"."""
    damage = [f for f in ckpt.findings if f.code in DAMAGE]
    if damage:
        _refuse(damage, verb, error)


def check_input(ckpt: Checkpoint, verb: str, error: type[ComfyQuantError] = InputError) -> Report:
    """Check ``ckpt`` and raise ``error`` ("refusing to <verb>: <first error> [code] (and N
    more ...)") if it has an error; returns the report otherwise.

    A weight without a marker of its own is decodable when the file's ``quant_format`` gives
    it one (``file_level_markers``, as SGLang reads it): its ``M023``
    does not block; the commands validate its tensors against that format when they plan it."""
    from .checker.run import check_checkpoint
    from .markers import file_level_markers

    report = check_checkpoint(ckpt, target=GATE_TARGET)
    refuse_errors(report, verb, error, set(file_level_markers(ckpt)), _relabelled_for_kitchen(ckpt, report))
    return report


def _relabelled_for_kitchen(ckpt: Checkpoint, report: Report) -> set[str]:
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
    report,
    verb: str,
    error: type[ComfyQuantError] = InputError,
    implied: AbstractSet[str] = frozenset(),
    viewed: AbstractSet[str] = frozenset(),
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
    if errors:
        _refuse(errors, verb, error)


def _refuse(errors: list, verb: str, error: type[ComfyQuantError]) -> None:
    first = errors[0]
    where = first.file if not first.layer and first.file else None
    # no count of its own: the gate judges for comfy-kitchen, check for every runtime, and a user
    # who read two different numbers for one file could trust neither
    more = " (and more: comfyquant check lists every problem)" if len(errors) > 1 else ""
    prefix = f"{where}: " if where and where not in first.message else ""
    if first.layer and first.layer not in first.message:  # a runtime's own words (Python's int() message)
        prefix = f"layer {first.layer}: "
    raise error(f"refusing to {verb}: {prefix}{first.message} [{first.code}]{more}")
