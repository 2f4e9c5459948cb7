"""Every case through one runtime's driver and through comfyquant's check, side by side.

A driver module (``comfyui_driver``, ``kitchen_driver``, ``sglang_driver``) exposes
``TARGET`` (comfyquant's name of the runtime), ``VERSION``, ``MISSING`` (why it cannot run
here, set when ``driver()`` returns None) and ``driver()``; the driver it returns is a context
manager with ``run(path) -> Outcome``.  ``compare`` returns one row per case;
``table`` prints the disagreements compactly (case id, comfyquant's verdict, the runtime's).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .cases import Case, generate, in_pairs
from .outcome import Expected, Outcome, disagreement, expected, with_newer_kitchen

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


KNOWN = Path(__file__).resolve().parent / "known"


def write_space(folder: Path, seed: int = 0, checkpoint: bool = False) -> list[Case]:
    """The generated space of ``seed``, written into ``folder``: what an agreement test reads
    (``checkpoint``: each case as one layer of a whole checkpoint)."""
    cases = generate(seed, checkpoint=checkpoint)
    for case in cases:
        case.write(folder)
    return cases


@contextlib.contextmanager
def running(module) -> Iterator:
    """A runtime driver's module started for the length of a test module; the test is skipped
    with the driver's one-line reason when the runtime cannot be had here."""
    import runtime_sources

    drv = module.driver()
    if drv is None:
        runtime_sources.skip_missing(module.MISSING)
    with drv:
        yield drv


SPACES = {"": "", "checkpoint": ", each in a whole checkpoint", "pairs": ", two defective layers a file"}
"""The spaces the agreement tests run, by the suffix of their ``known`` lists."""


def write_pairs(folder: Path, seed: int = 0, count: int = 400) -> list[Case]:
    """``count`` files of two defective layers each (``cases.in_pairs``), written into ``folder``."""
    singles = Path(folder) / "singles"
    singles.mkdir(parents=True, exist_ok=True)
    pairs = in_pairs(generate(seed), singles, seed, count)
    for case in pairs:
        case.write(folder)
    return pairs


def known_path(target: str, space: str = "") -> Path:
    """``known/<target>.txt``, or ``known/<target>.<space>.txt`` for another space (``SPACES``)."""
    return KNOWN / f"{target}{'.' + space if space else ''}.txt"


def known_disagreements(target: str, space: str = "") -> set[str]:
    """The case ids ``known_path`` lists: where comfyquant is known to differ from the runtime
    (one id a line, ``#`` starts a comment)."""
    path = known_path(target, space)
    if not path.is_file():
        return set()
    return {line.split("#", 1)[0].strip() for line in path.read_text().splitlines()} - {""}


def write_known(target: str, rows: list[Row], space: str = "") -> Path:
    """Record the cases where comfyquant differs from the runtime in ``known_path``."""
    KNOWN.mkdir(exist_ok=True)
    path = known_path(target, space)
    lines = [
        f"# Cases of the generated space (seed 0{SPACES[space]}) where comfyquant's {target} verdict differs from the",
        "# runtime's: classes the profile does not model yet.  Written by",
        "# tools/prove_verdicts.py --write-known; the agreement test fails on any other disagreement",
        "# and on a listed case that agrees.",
    ]
    lines += [f"{r.case.id}  # {r.why}" for r in rows if r.why is not None]
    path.write_text("\n".join(lines) + "\n")
    return path


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
    said = report.verdicts[target].to_dict()
    return with_newer_kitchen(said) if target == "comfyui" else said  # its driver runs comfy-kitchen 0.2.40


def judge_undecidable(case: Case, outcome: Outcome, predicted: Expected, twin: Expected | None = None) -> str | None:
    """Agreement on a defect the file cannot show (``cases.UNDECIDABLE``): where the runtime
    computes (normally or garbage), comfyquant must say what it says of the valid layer, having
    nothing to tell the two apart: that the file loads, or garbage where it calls the valid
    layer (``twin``, its verdict on ``valid_twin(case.id)``) garbage for a reason the file
    shows (a release that reads no tensor marker); where the runtime raises, the usual exact
    agreement applies."""
    if outcome.kind == "raises":
        return disagreement(outcome, predicted)
    if as_valid_layer(predicted, twin):
        return None
    return f"undecidable ({case.undecidable}): {predicted.kind} vs {outcome.kind}"


def as_valid_layer(predicted: Expected, twin: Expected | None) -> bool:
    """Whether comfyquant says of a file whose defect it cannot tell what it says of the valid
    layer the file was made from (``twin``): that it loads, or garbage where that one is
    garbage too, for a reason the file shows."""
    return predicted.kind == "loads" or (twin is not None and predicted.kind == twin.kind == "garbage")


MARKER_FORM_TWINS = {"header.conflict-map-only": "header.map-only", "header.conflict": "header.both"}
"""A header-map case's valid layer in its own marker form: a map entry that conflicts with the
weights was made from the layer marked the same way correctly (the map alone, or map and tensor
marker)."""


def valid_twin(case_id: str) -> str:
    """The id of the valid layer a case's defect was made from, in the case's marker form
    (``fp8_64x256.weight.cast-int8`` -> ``fp8_64x256.valid``,
    ``int8_convrot_64x256.header.conflict-map-only`` -> ``int8_convrot_64x256.header.map-only``;
    a checkpoint case's keeps its ``ckpt.``)."""
    parts = case_id.split(".")
    head = parts[:2] if parts[0] == "ckpt" else parts[:1]
    rest = ".".join(parts[len(head) :])
    return ".".join([*head, MARKER_FORM_TWINS.get(rest, "valid")])


def judge_resized(outcome: Outcome, predicted: Expected, twin: Expected | None = None) -> str | None:
    """Agreement on a case whose model is the size the file records (``Case.model``), not the
    dense source's: what that layer should compute is not known, so a finite output counts as
    computing (a non-finite one is still garbage), which comfyquant must call loading, or
    garbage where it calls the valid layer (``twin``) garbage too; exceptions agree exactly as
    usual."""
    if outcome.kind == "garbage" and outcome.error is not None and math.isfinite(outcome.error):
        if as_valid_layer(predicted, twin):
            return None
        return f"{predicted.kind} vs computes (model of the recorded size)"
    return disagreement(outcome, predicted)


OFFSET = re.compile(r"^(.*invalid offset for tensor `)(.+)`$", re.S)


def _twins(path: Path, a: str, b: str) -> bool:
    """Whether tensors ``a`` and ``b`` of the file at ``path`` have the same data offsets."""
    import json
    import struct

    raw = path.read_bytes()
    try:
        header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
        return header[a]["data_offsets"] == header[b]["data_offsets"]
    except (ValueError, KeyError, TypeError, struct.error):
        return False


def either_twin(case: Case, outcome: Outcome, predicted: Expected) -> bool:
    """Whether the runtime and comfyquant name two tensors at the same data offsets in
    safetensors' ``invalid offset`` message: safetensors sorts the header's tensors by offsets
    from a hash map's order, which changes from one process to the next, so which of two
    tensors at equal offsets it names is not decided by the file."""
    return twin_messages(case.path, outcome.message, predicted.message)


def twin_messages(path: Path, said: str | None, measured: str | None) -> bool:
    """``either_twin`` on two messages about the file at ``path``."""
    a = OFFSET.match(said or "")
    b = OFFSET.match(measured or "")
    return bool(a and b and a.group(1) == b.group(1) and _twins(Path(path), a.group(2), b.group(2)))


def compare(drv, target: str, cases: Iterable[Case]) -> list[Row]:
    predict = getattr(drv, "predict", expected)  # a driver that runs part of a runtime says what it covers
    cases = list(cases)
    guesses = {case.id: predict(verdict(case, target)) for case in cases}
    rows = []
    for case in cases:
        outcome = drv.run(case.path)
        predicted = guesses[case.id]
        rows.append(Row(case, outcome, predicted, judge(case, outcome, predicted, guesses.get(valid_twin(case.id)))))
    return rows


def judge(case: Case, outcome: Outcome, predicted: Expected, twin: Expected | None = None) -> str | None:
    """Why comfyquant's verdict on a generated case differs from the runtime's outcome (None:
    they agree), with the case's own terms: a defect the file cannot show (``twin``:
    comfyquant's verdict on its valid layer, where known), a model of the size the file
    records, two tensors at the same offsets."""
    if case.undecidable is not None:
        return judge_undecidable(case, outcome, predicted, twin)
    if case.model is not None:
        return judge_resized(outcome, predicted, twin)
    why = disagreement(outcome, predicted)
    if why == "message differs" and either_twin(case, outcome, predicted):
        return None
    return why


def undecided(rows: list[Row]) -> Counter:
    """How many cases of each ``cases.UNDECIDABLE`` class the runtime computed garbage on
    (comfyquant, which cannot see these defects, said they load)."""
    return Counter(r.case.undecidable for r in rows if r.case.undecidable and r.outcome.kind == "garbage")


def summary(rows: list[Row]) -> str:
    statuses = Counter(r.outcome.status for r in rows)
    total = len(rows) or 1
    shares = ", ".join(f"{s} {statuses[s]} ({100 * statuses[s] / total:.1f}%)" for s in ("raises", "garbage", "degraded", "ok"))
    agree = sum(r.why is None for r in rows)
    line = f"{len(rows)} cases: {shares}; comfyquant agrees on {agree}/{len(rows)}"
    hidden = undecided(rows)
    if hidden:
        classes = ", ".join(f"{name} {count}" for name, count in sorted(hidden.items()))
        line += f" (of them garbage the file cannot show: {classes})"
    return line


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


def assert_agreement(drv, target: str, cases: list[Case], version: str, space: str = "") -> None:
    """Every case agrees except the ones ``known_path`` lists: a new disagreement fails, and
    so does a listed case that now agrees (take it off the list)."""
    rows = compare(drv, target, cases)
    assert rows
    known = known_disagreements(target, space)
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    assert not new, f"{version}: {summary(rows)}\n{table(new)}"
    fixed = sorted(r.case.id for r in rows if r.why is None and r.case.id in known)
    assert not fixed, f"these cases now agree: take them off {known_path(target, space).name}: {fixed}"
