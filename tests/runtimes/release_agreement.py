"""comfyquant's per-release ComfyUI verdicts against every release group's own code.

Each group is driven once, by its oldest release with the comfy-kitchen the product records for
it (``comfyui_release_driver``); the group's other releases share its results, their deciding
code being byte-identical (``releases.fingerprint``).  comfyquant's side is ``check`` with
``--target comfyui==<release>``.  The runtime's outcomes are cached per group fingerprint,
comfy-kitchen and file content (``outcomes``), so a run after the first drives only what changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import runtime_sources

from .agreement import Row
from .cases import VARIANTS, Case, bases, header_cases, legacy_cases
from .outcome import UNREADABLE, Expected, Outcome, disagreement, expected


def cache_file(group) -> Path:
    folder = runtime_sources.cache_dir() / "comfyui-release-outcomes"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{group.fingerprint}-{group.kitchen or 'none'}-{_driver_digest()}.json"


@functools.cache
def _driver_digest() -> str:
    """The digest of the code that drives a release (``comfyui_release_driver`` and what it
    takes from ``comfyui_driver`` and ``measure``): outcomes driven by other code are not reused."""
    h = hashlib.sha256()
    for name in ("comfyui_release_driver.py", "comfyui_driver.py", "measure.py"):
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:12]


def _digest(path: Path) -> str:
    """The case file's content digest (with its dense layers), made once per file and state:
    every group's cache is keyed by it."""
    stat = path.stat()
    return _digest_of(str(path), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _digest_of(name: str, mtime_ns: int, size: int) -> str:
    path = Path(name)
    h = hashlib.sha256(path.read_bytes())
    dense = path.with_suffix(".dense")
    if dense.is_file():
        h.update(dense.read_bytes())
    return h.hexdigest()[:20]


def outcomes(root: Path, group, cases: list[Case]) -> tuple[dict[str, Outcome], int]:
    """The group's outcome per case id, driving its oldest release only for the files not in
    the cache; also how many were driven."""
    from .comfyui_release_driver import ReleaseDriver

    path = cache_file(group)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    keys = {c.id: _digest(c.path) for c in cases}
    todo = [c for c in cases if keys[c.id] not in cached]
    if todo:
        with ReleaseDriver(root / f"comfyui-{group.first}", group.kitchen) as drv:
            for i, case in enumerate(todo, 1):
                cached[keys[case.id]] = drv.run(case.path).to_dict()
                if i % SAVE_EVERY == 0:  # a long first run that is stopped keeps what it drove
                    _save(path, cached)
        _save(path, cached)
    return {c.id: Outcome(**cached[keys[c.id]]) for c in cases}, len(todo)


SAVE_EVERY = 250
"""Outcomes driven between two writes of the cache file."""


def _save(path: Path, cached: dict) -> None:
    """Write the cache atomically, keeping outcomes another process saved meanwhile."""
    if path.is_file():
        cached.update({k: v for k, v in json.loads(path.read_text()).items() if k not in cached})
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cached))
    tmp.replace(path)


def predicted(case: Case, release: str | None) -> dict | None:
    """comfyquant's verdict for ComfyUI ``release`` (None: ``check``'s default ComfyUI verdict)."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        target = "comfyui" if release is None else f"comfyui=={release}"
        report = comfyquant.check(str(case.path), target=target, deep=case.deep)
    except InputError:
        return None
    return report.verdicts["comfyui"].to_dict()


def compare_group(root: Path, group, cases: list[Case]) -> tuple[list[Row], int]:
    got, driven = outcomes(root, group, cases)
    rows = []
    for case in cases:
        outcome = got[case.id]
        guess = expected(predicted(case, group.first))
        rows.append(Row(case, outcome, guess, disagreement(outcome, guess)))
    return rows, driven


def compare_space(root: Path, group, cases: list[Case], release: str | None) -> tuple[list[Row], int]:
    """Like ``compare_group`` on any generated cases (the whole space), judged on each case's
    own terms (``agreement.judge``: a defect the file cannot show, a model of the size the file
    records); comfyquant's side is the verdict for ``release`` (None: ``check``'s default)."""
    from .agreement import judge, valid_twin

    got, driven = outcomes(root, group, cases)
    guesses = {case.id: expected(predicted(case, release)) for case in cases}
    rows = []
    for case in cases:
        guess = guesses[case.id]
        rows.append(Row(case, got[case.id], guess, judge(case, got[case.id], guess, guesses.get(valid_twin(case.id)))))
    return rows, driven


def release_expectations(case: Case) -> dict[str, Expected] | None:
    """comfyquant's verdict on every ComfyUI release group, by each group's first release, from
    one ``check`` (its default target works out every group's verdict, ``--deep``'s silent
    errors included; None: check refused the file), as ``check --target comfyui==<release>``
    gives it."""
    import comfyquant
    from comfyquant.errors import InputError

    try:
        report = comfyquant.check(str(case.path), deep=case.deep)
    except InputError:
        return None
    return {group.first: expected(verdict.to_dict()) for group, _, verdict in report.verdicts["comfyui"].releases.verdicts}


def drive_groups(root: Path, groups, cases: list[Case], workers: int = 2) -> dict[str, tuple[dict[str, Outcome], int]]:
    """``outcomes`` of each group (by its first release), ``workers`` groups driven at once
    (each driver is a process of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        done = {g.first: pool.submit(outcomes, root, g, cases) for g in groups}
        return {first: future.result() for first, future in done.items()}


def compare_expected(cases: list[Case], got: dict[str, Outcome], expectations: dict[str, dict | None], release: str) -> list[Row]:
    """Rows of one group: the runtime's outcome per case against ``release_expectations``,
    judged on each case's own terms (``agreement.judge``)."""
    from .agreement import judge, valid_twin

    def guess(case_id: str) -> Expected | None:
        if case_id not in expectations:
            return None
        said = expectations[case_id]
        return UNREADABLE if said is None else said[release]

    rows = []
    for case in cases:
        said = guess(case.id)
        assert said is not None
        rows.append(Row(case, got[case.id], said, judge(case, got[case.id], said, guess(valid_twin(case.id)))))
    return rows


KNOWN = Path(__file__).parent / "known" / "comfyui.releases.txt"
"""Cases of the generated space (seed 0) where comfyquant's verdict for a ComfyUI release
differs from that release's own: ``<release> <case id>  # why`` a line."""


def known_release_disagreements() -> dict[str, set[str]]:
    """``KNOWN`` as the case ids per release."""
    out: dict[str, set[str]] = {}
    if KNOWN.is_file():
        for line in KNOWN.read_text().splitlines():
            entry = line.split("#", 1)[0].split()
            if len(entry) == 2:
                out.setdefault(entry[0], set()).add(entry[1])
    return out


def write_known_releases(rows: dict[str, list[Row]]) -> Path:
    """Record the disagreements per release group in ``KNOWN``."""
    lines = [
        "# Cases of the generated space (seed 0) where comfyquant's verdict for a ComfyUI release",
        "# group (named by its first release) differs from what that release does: classes the",
        "# per-release model does not know yet.  Written by tools/prove_releases.py --space single",
        "# --write-known; tests/test_comfyui_releases_space.py fails on any other disagreement and",
        "# on a listed case that agrees.",
    ]
    for release, group_rows in rows.items():
        lines += [f"{release} {r.case.id}  # {r.why}" for r in group_rows if r.why is not None]
    KNOWN.write_text("\n".join(lines) + "\n")
    return KNOWN


def format_cases(folder: Path, seed: int = 0, shapes: dict | None = None) -> list[Case]:
    """Each format's valid layer (first geometry of ``shapes``, default ``cases.VARIANTS``) as
    written, with its marker in the header map only, and in both; and the legacy scaled-FP8
    forms; written into ``folder``."""
    shapes = {variant: sizes[:1] for variant, sizes in (shapes or VARIANTS).items()}
    out: list[Case] = []
    for base in bases(seed, shapes):
        out.append(base.case(f"{base.name}.valid", "valid"))
        out.extend(c for c in header_cases(base) if c.id.endswith((".header.map-only", ".header.both")))
    out.extend(legacy_cases(seed))
    for case in out:
        case.write(folder)
    return out
