"""The whole-model space (``whole_models``) through older ComfyUI release groups
(``comfyui_models.release_driver``) and through comfyquant's per-release verdicts.

Each group is driven by its first release with the comfy-kitchen it pins; its other releases
share its results (``releases.fingerprint``).  comfyquant's side is one ``check --deep`` per
file, which works out every group's verdict (``release_agreement.release_expectations``).
Agreement is judged per file as in ``model_agreement``.  The runtime's outcomes are cached per
group fingerprint, comfy-kitchen and file content (``outcomes``), so a second run drives
nothing.  The known list is ``known/comfyui.release-models.txt``: ``<release> <case id>  # why``
a line.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import runtime_sources

from .agreement import Row, table
from .model_agreement import ModelCase, judge, summary, valid_twin
from .outcome import UNREADABLE, Expected, Outcome
from .release_agreement import _save

KNOWN = Path(__file__).parent / "known" / "comfyui.release-models.txt"
"""Files of the whole-model space (seed 0) where comfyquant's verdict for a ComfyUI release
group differs from what its first release does with the whole model."""

SAVE_EVERY = 25
"""Outcomes driven between two writes of the cache file (a stopped first run keeps them)."""


def cache_file(group) -> Path:
    folder = runtime_sources.cache_dir() / "comfyui-release-model-outcomes"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{group.fingerprint}-{group.kitchen or 'none'}.json"


@functools.cache
def _file_digest(name: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(name).read_bytes()).hexdigest()


def _digest_one(path: Path) -> str:
    stat = path.stat()
    return _file_digest(str(path), stat.st_mtime_ns, stat.st_size)


def digest(case: ModelCase) -> str:
    """The case's key: the file's path (detection's message names it) and content, the dense
    model it is measured against and its reference tensors (the outcome depends on all)."""
    parts = [case.path, case.dense] + ([case.reference] if case.reference is not None else [])
    return hashlib.sha256((str(case.path) + "".join(_digest_one(p) for p in parts)).encode()).hexdigest()[:20]


def outcomes(root: Path, group, cases: list[ModelCase]) -> tuple[dict[str, Outcome], int] | str:
    """The group's outcome per case id, driving its first release only for the files not in
    the cache; also how many were driven.  A string: why the group cannot be driven here."""
    from . import comfyui_models

    path = cache_file(group)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    keys = {c.id: digest(c) for c in cases}
    todo = [c for c in cases if keys[c.id] not in cached]
    if todo:
        drv = comfyui_models.release_driver(root, group)
        if drv is None:
            return comfyui_models.MISSING
        with drv:
            for i, case in enumerate(todo, 1):
                cached[keys[case.id]] = drv.run(case.path, case.dense, case.reference).to_dict()
                if i % SAVE_EVERY == 0:
                    _save(path, cached)
        _save(path, cached)
    return {c.id: Outcome(**cached[keys[c.id]]) for c in cases}, len(todo)


def expectations(cases: list[ModelCase]) -> dict[str, dict[str, Expected] | None]:
    """comfyquant's verdict per case id on every release group (by its first release)."""
    from .release_agreement import release_expectations

    return {c.id: release_expectations(c) for c in cases}  # type: ignore[arg-type]


def compare(
    cases: list[ModelCase], got: dict[str, Outcome], said: dict[str, dict[str, Expected] | None], release: str
) -> list[Row]:
    """One row per case: the group's outcome against comfyquant's verdict for ``release``."""

    def guess(case_id: str) -> Expected | None:
        if case_id not in said:
            return None
        verdicts = said[case_id]
        return UNREADABLE if verdicts is None else verdicts[release]

    rows = []
    for case in cases:
        mine = guess(case.id)
        assert mine is not None
        rows.append(Row(case, got[case.id], mine, judge(case, got[case.id], mine, guess(valid_twin(case.id)))))  # type: ignore[arg-type]
    return rows


def known_disagreements() -> dict[str, set[str]]:
    """``KNOWN`` as the case ids per release."""
    out: dict[str, set[str]] = {}
    if KNOWN.is_file():
        for line in KNOWN.read_text().splitlines():
            entry = line.split("#", 1)[0].split()
            if len(entry) == 2:
                out.setdefault(entry[0], set()).add(entry[1])
    return out


def write_known(rows: dict[str, list[Row]]) -> Path:
    """Record the disagreements of each release group run in ``KNOWN`` (the other groups'
    lines are kept)."""
    runs = set(rows)
    kept = [line for line in _entries() if line.split()[0] not in runs]
    lines = [
        "# Files of the whole-model space (seed 0) where comfyquant's verdict for a ComfyUI release",
        "# group (named by its first release) differs from what that release does with the whole",
        "# model.  Written by tools/prove_whole_models.py --release ... --write-known;",
        "# tests/test_comfyui_releases_whole_model.py fails on any other disagreement and on a",
        "# listed case that agrees.",
    ]
    new = [f"{release} {r.case.id}  # {r.why}" for release, group_rows in rows.items() for r in group_rows if r.why is not None]
    lines += sorted(kept + new, key=lambda line: _release_key(line.split()[0]))
    KNOWN.write_text("\n".join(lines) + "\n")
    return KNOWN


def _entries() -> list[str]:
    if not KNOWN.is_file():
        return []
    return [line for line in KNOWN.read_text().splitlines() if len(line.split("#", 1)[0].split()) == 2]


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def problems(rows: list[Row], release: str) -> str | None:
    """What fails the agreement of one group: a disagreement the known list does not name, or
    a listed case that agrees (take it off the list); None when neither."""
    known = known_disagreements().get(release, set())
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    if new:
        return f"ComfyUI {release}: {summary(rows)}\n{len(new)} disagreements not in {KNOWN.name}\n{table(new, 40)}"
    fixed = sorted(r.case.id for r in rows if r.why is None and r.case.id in known)
    if fixed:
        return f"ComfyUI {release}: these files now agree: take them off {KNOWN.name}: {fixed[:20]}"
    return None
