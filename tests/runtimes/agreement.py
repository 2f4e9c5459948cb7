"""Every case through one runtime's driver and through comfyquant's check, side by side.

A driver module (``comfyui_driver``, ``kitchen_driver``, ``sglang_driver``) exposes
``TARGET`` (comfyquant's name of the runtime), ``VERSION``, ``MISSING`` (why it cannot run
here, set when ``driver()`` returns None) and ``driver()``; the driver it returns is a context
manager with ``run(path) -> Outcome``.  ``compare`` returns one row per case;
``table`` prints the disagreements compactly (case id, comfyquant's verdict, the runtime's).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .cases import Case
from .outcome import Expected, Outcome, disagreement, expected

DRIVERS = {
    "comfyui": "runtimes.comfyui_driver",
    "comfy-kitchen": "runtimes.kitchen_driver",
    "sglang": "runtimes.sglang_driver",
}


@dataclass
class Row:
    case: Case
    outcome: Outcome
    predicted: Expected
    why: str | None
    """None when comfyquant agrees with the runtime."""


def driver_module(target: str):
    return importlib.import_module(DRIVERS[target])


def verdict(case: Case, target: str) -> dict | None:
    """comfyquant's verdict for ``target`` on the written case (None: check refused the file)."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        report = comfyquant.check(str(case.path), target=target, deep=case.deep)
    except InputError:
        return None
    return report.verdicts[target].to_dict()


def compare(drv, target: str, cases: Iterable[Case]) -> list[Row]:
    rows = []
    predict = getattr(drv, "predict", expected)  # a driver that runs part of a runtime says what it covers
    for case in cases:
        outcome = drv.run(case.path)
        predicted = predict(verdict(case, target))
        rows.append(Row(case, outcome, predicted, disagreement(outcome, predicted)))
    return rows


def summary(rows: list[Row]) -> str:
    statuses = Counter(r.outcome.status for r in rows)
    total = len(rows) or 1
    shares = ", ".join(f"{s} {statuses[s]} ({100 * statuses[s] / total:.1f}%)" for s in ("raises", "garbage", "degraded", "ok"))
    agree = sum(r.why is None for r in rows)
    return f"{len(rows)} cases: {shares}; comfyquant agrees on {agree}/{len(rows)}"


def table(rows: list[Row], limit: int | None = None, width: int = 110) -> str:
    bad = [r for r in rows if r.why is not None]
    lines = []
    for r in bad[:limit]:
        lines.append(f"{r.case.id}  [{r.why}]")
        lines.append(f"    comfyquant: {r.predicted.short()[:width]}")
        lines.append(f"    runtime:    {r.outcome.stage or '-'}: {r.outcome.short()[:width]}")
    if limit is not None and len(bad) > limit:
        lines.append(f"... and {len(bad) - limit} more")
    return "\n".join(lines)
