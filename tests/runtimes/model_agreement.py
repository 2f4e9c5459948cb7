"""The whole-model space (``whole_models``) through ComfyUI (``comfyui_models``) and through
comfyquant's ``check --deep --target comfyui``, side by side.

Agreement is judged per file as for the single-layer spaces (``judge``): a file ComfyUI
raises on must FAIL with the same exception type and exact message; a file it computes garbage
with, or runs with parameters the file did not fill (``undefined``), must FAIL silently; a file
it computes with (``ok`` / ``degraded``) must load; a file whose one defect the file cannot
show (``UNDECIDABLE_VARIANTS``) must load where ComfyUI computes, having nothing to tell it
otherwise.  The known list is
``known/comfyui.models.txt`` (``agreement.known_path("comfyui", "models")``).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .agreement import Row, as_valid_layer, known_disagreements, known_path, table
from .outcome import Expected, Outcome, comparable, disagreement, expected, with_newer_kitchen

TARGET = "comfyui"
SPACE = "models"

UNDECIDABLE_VARIANTS = {
    "reciprocal": "values-not-the-source",
    "e5m2-bytes": "values-not-the-source",
    "rotation-size": "rotation-size",
    "rotation-flag": "rotation-flag",
}
"""The whole-model space's ``value`` variants (``whole_models``) the file cannot show, even to
``--deep``, by their class in ``cases.UNDECIDABLE``: an FP8 scale stored as its reciprocal and
E5M2 bytes under an E4M3 dtype are valid codes and scales of another weight; a ConvRot group
size or flag the weights were not rotated with has the marker as its only record."""


def undecidable(case: ModelCase) -> str | None:
    """The ``cases.UNDECIDABLE`` class of a file whose one defect is such a variant (the id's
    third part: ``wan.fp8.reciprocal.blocks.1.cross_attn.k``), or None."""
    parts = case.id.split(".")
    return UNDECIDABLE_VARIANTS.get(parts[2]) if len(parts) > 2 else None


def valid_twin(case_id: str) -> str:
    """The id of the valid file of a file's model and format (``flux.fp8.valid``)."""
    return ".".join([*case_id.split(".")[:2], "valid"])


def judge(case: ModelCase, outcome: Outcome, predicted: Expected, twin: Expected | None = None) -> str | None:
    """Why comfyquant's verdict on a whole-model file differs from what ComfyUI does (None:
    they agree): exactly (``outcome.disagreement``), except that on a defect the file cannot
    show comfyquant must say what it says of the valid file of that model and format
    (``twin``) where ComfyUI computes (garbage or not): that it loads, or garbage where the
    valid file is garbage too for a reason the file shows, as ``agreement.judge_undecidable``
    holds the single-layer spaces to."""
    kind = undecidable(case)
    if kind is not None and outcome.kind != "raises":
        if as_valid_layer(predicted, twin):
            return None
        return f"undecidable ({kind}): {predicted.kind} vs {outcome.kind}"
    return disagreement(outcome, predicted)


@dataclass
class ModelCase:
    """One file of the whole-model space (an entry of its manifest)."""

    id: str
    model: str
    fmt: str
    group: str
    path: Path
    dense: Path
    reference: Path | None
    notes: list[str] = field(default_factory=list)
    deep: bool = True
    """The verdict is asked with ``--deep`` (values are part of the space)."""


def load_cases(folder: Path, manifest: dict) -> list[ModelCase]:
    return [
        ModelCase(
            e["id"],
            e["model"],
            e["fmt"],
            e["group"],
            folder / e["file"],
            folder / f"{e['model']}.dense.safetensors",
            folder / e["reference"] if e.get("reference") else None,
            list(e.get("notes", [])),
        )
        for e in manifest["entries"]
    ]


def space_cases(seed: int = 0) -> list[ModelCase] | str:
    """The written space of ``seed`` (from the test cache), or why it cannot be had here."""
    from .whole_models import space

    found = space(seed)
    if isinstance(found, str):
        return found
    return load_cases(*found)


def verdict(case: ModelCase) -> dict | None:
    """comfyquant's ComfyUI verdict on the file (``check --deep``; None: check refused it)."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        report = comfyquant.check(str(case.path), target=TARGET, deep=case.deep)
    except InputError:
        return None
    return with_newer_kitchen(report.verdicts[TARGET].to_dict())  # ComfyUI runs with comfy-kitchen 0.2.40


def outcomes(drv, cases: list[ModelCase]) -> list[Outcome]:
    return [drv.run(c.path, c.dense, c.reference) for c in cases]


def compare(drv, cases: list[ModelCase], recorded: dict[str, Outcome] | None = None) -> list[Row]:
    """One row per case; ComfyUI runs in its worker while comfyquant's verdicts are computed
    here (the two processes share the machine's cores).  ``recorded``: outcomes by case id
    from an earlier run, used instead of running ComfyUI."""
    got: dict[str, Outcome] = dict(recorded or {})
    failure: list[BaseException] = []

    def drive() -> None:
        try:
            for c in cases:
                if c.id not in got:
                    got[c.id] = drv.run(c.path, c.dense, c.reference)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=drive)
    worker.start()
    predicted = {c.id: expected(verdict(c)) for c in cases}
    worker.join()
    if failure:
        raise failure[0]
    return [
        Row(c, got[c.id], predicted[c.id], judge(c, got[c.id], predicted[c.id], predicted.get(valid_twin(c.id)))) for c in cases
    ]


def counts(rows: list[Row]) -> dict[str, int]:
    """Agreement counts: verdict classes, exact messages among files ComfyUI raises on, silent
    FAILS among files it computes garbage with (or undefined memory)."""
    raises = [r for r in rows if r.outcome.kind == "raises"]
    silent = [r for r in rows if r.outcome.kind == "garbage"]
    return {
        "cases": len(rows),
        "verdicts": sum(r.outcome.kind == r.predicted.kind for r in rows),
        "agree": sum(r.why is None for r in rows),
        "raises": len(raises),
        "messages": sum(
            r.predicted.kind == "raises"
            and r.predicted.exception == r.outcome.exception
            and comparable(r.predicted.message) == comparable(r.outcome.message)
            for r in raises
        ),
        "garbage": len(silent),
        "silent": sum(r.predicted.kind == "garbage" for r in silent),
    }


def summary(rows: list[Row]) -> str:
    statuses = Counter(r.outcome.status for r in rows)
    total = len(rows) or 1
    shares = ", ".join(
        f"{s} {statuses[s]} ({100 * statuses[s] / total:.1f}%)" for s in ("raises", "garbage", "undefined", "degraded", "ok")
    )
    c = counts(rows)
    return (
        f"{c['cases']} whole-model files: {shares}; comfyquant agrees on {c['agree']}/{c['cases']} "
        f"(verdict classes {c['verdicts']}/{c['cases']}, exact messages {c['messages']}/{c['raises']}, "
        f"silent garbage {c['silent']}/{c['garbage']})"
    )


def write_known(rows: list[Row]) -> Path:
    """Record the cases where comfyquant differs from ComfyUI in ``known/comfyui.models.txt``."""
    path = known_path(TARGET, SPACE)
    lines = [
        "# Files of the whole-model space (seed 0) where comfyquant's comfyui verdict differs from",
        "# what ComfyUI does with the whole model: classes the profile does not model yet.  Written by",
        "# tools/prove_whole_models.py --write-known; the agreement test fails on any other",
        "# disagreement and on a listed case that agrees.",
    ]
    lines += [f"{r.case.id}  # {r.why}" for r in rows if r.why is not None]
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_agreement(rows: list[Row], version: str) -> None:
    """Every file agrees except the ones the known list names: a new disagreement fails, and
    so does a listed file that now agrees (take it off the list)."""
    assert rows
    known = known_disagreements(TARGET, SPACE)
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    assert not new, f"{version}: {summary(rows)}\n{table(new)}"
    fixed = sorted(r.case.id for r in rows if r.why is None and r.case.id in known)
    assert not fixed, f"these files now agree: take them off {known_path(TARGET, SPACE).name}: {fixed}"


def record(row: Row) -> dict:
    """One JSON line of the outcomes file handed to the product's side."""
    o = row.outcome
    return {
        "case": row.case.id,
        "file": str(row.case.path),
        "dense": str(row.case.dense),
        "reference": None if row.case.reference is None else str(row.case.reference),
        "group": row.case.group,
        "notes": row.case.notes,
        "outcome": o.to_dict(),
        "architecture": o.architecture,
        "worst_layer": o.layer,
        "worst_error": o.error,
        "model_error": o.model_error,
        "comfyquant": row.predicted.short(),
        "agrees": row.why is None,
        "why": row.why,
    }


__all__ = ["ModelCase", "Expected", "compare", "counts", "summary", "write_known", "assert_agreement", "record"]
