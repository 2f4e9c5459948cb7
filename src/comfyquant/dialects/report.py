"""What ``check`` says about a checkpoint's dialects: findings, runtime violations, --deep.

One ``F001`` per dialect summarises its layers by variant and verdict (a 300-layer legacy
file is one line, not 300); a layer that cannot become a Comfy layer gets its own ``F002``;
what only the data can tell is one ``F003`` per dialect, settled by ``--deep``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..findings import Finding
from ..targets.dialect_failures import render
from .base import LOSSY, REFUSED
from .registry import DIALECTS, Detection

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from .base import Claim


def _summary(claim) -> str:
    groups = Counter((t.variant, t.verdict, t.format) for t in claim.layers.values())
    parts = []
    for (variant, verdict, fmt), n in groups.most_common():
        into = f" -> {fmt}" if fmt else (" -> dense" if verdict not in (LOSSY, REFUSED) else "")
        parts.append(f"{n} {variant or 'layer'}{into} ({verdict})")
    return "; ".join(parts)


def dialect_findings(detection: Detection) -> list[Finding]:
    out: list[Finding] = []
    for claim in detection.claims:
        dialect = DIALECTS[claim.dialect]
        n = len(claim.layers)
        verdicts = {t.verdict for t in claim.layers.values()}
        if REFUSED in verdicts:
            fix = "the refused layers cannot be migrated (see their findings); dequantize the file instead"
        elif LOSSY in verdicts:
            fix = "comfyquant migrate --allow-lossy (re-quantizes the lossy layers, with their measured error)"
        elif n:
            fix = "comfyquant migrate (rewrites it as a Comfy quantized checkpoint, exactly)"
        else:
            fix = None
        notes = f"; {'; '.join(claim.notes)}" if claim.notes else ""
        out.append(
            Finding(
                "F001",
                f"{n} layer{'s' * (n != 1)} in the {dialect.title} layout ({dialect.name}): "
                f"{_summary(claim) or 'no layer'}{notes}",
                cause=f"written by {dialect.writer}",
                fix=fix,
                actual=dialect.name,
                expected="comfy",
            )
        )
        for t in claim.layers.values():
            if t.verdict == REFUSED:
                out.append(
                    Finding(
                        "F002",
                        f"layer {t.prefix}: {dialect.name} {t.variant} layer has no Comfy form: {t.why}",
                        layer=t.prefix,
                        actual=t.label,
                        cause=t.why,
                        fix="keep the file for a runtime that reads this layout, or dequantize it",
                    )
                )
        unsettled = list(dict.fromkeys([*claim.unsettled, *(u for t in claim.layers.values() for u in t.unsettled)]))
        if unsettled and claim.settled is None:
            out.append(
                Finding(
                    "F003",
                    f"{dialect.name}: only the tensor data can tell: {'; '.join(unsettled)}",
                    fix="comfyquant check --deep reads it",
                )
            )
        elif unsettled:  # --deep ran: what it could not read stays open
            out.append(
                Finding(
                    "F003",
                    f"{dialect.name}: the tensor data that tells cannot be read (its bytes are not what the "
                    f"header describes): {'; '.join(unsettled)}",
                    cause="a damaged file: the container findings name the tensors",
                    fix="download or export the file again",
                )
            )
    return out


def claim_violations(ckpt: Checkpoint, claim: Claim, target: str) -> list:
    """What ``target`` does with one claim's layers, from its dialect's runtime failures."""
    dialect = DIALECTS[claim.dialect]
    if dialect.failures is None:
        return []
    return render(target, dialect.rule_tag, dialect.failures(ckpt, claim))


def dialect_violations(ckpt: Checkpoint, detection: Detection, target: str) -> list:
    """What ``target`` does with the claimed layers, from each dialect's runtime failures."""
    out: list = []
    for claim in detection.claims:
        out.extend(claim_violations(ckpt, claim, target))
    return out


def settle(ckpt: Checkpoint, detection: Detection) -> list[Finding]:
    """Read the tensor data each dialect needs to settle what its header leaves open; the
    translations are refined in place (``migrate`` and ``--deep`` both call this)."""
    out: list[Finding] = []
    for claim in detection.claims:
        fn = DIALECTS[claim.dialect].settle
        if claim.settled is None:
            claim.settled = fn(ckpt, claim) if fn is not None else []
        out.extend(claim.settled)
    return out


def value_casts(detection: Detection) -> list:
    """Every ``ValueCast`` the claimed layers' dialects list (what ``--deep`` reads)."""
    out: list = []
    for claim in detection.claims:
        fn = DIALECTS[claim.dialect].value_casts
        if fn is not None:
            out.extend(fn(claim))
    return out
