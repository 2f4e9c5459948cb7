"""Prove comfyquant's per-release ComfyUI verdicts against every release group's own code.

    python tools/prove_releases.py [--seed 0] [--held-out] [--space {formats,single,checkpoint}]
                                   [--only 0.31.0,0.33.0] [--limit 20] [--write-known]

Each group of ``comfyquant.targets.comfyui_releases`` is driven by its oldest release with the
comfy-kitchen it pins (``tests/runtimes/comfyui_release_driver.py``; the releases tarball as in
``tests/runtimes/releases.py``), two groups at a time.  ``--space formats`` (the default) runs
every format's valid layer in each marker form and the legacy scaled-FP8 forms of ``--seed``;
``--space single`` the whole generated space (every defect of every format,
``runtimes.cases.generate``), ``--space checkpoint`` each of its cases as one layer of a whole
checkpoint (``--held-out``: the geometries the tests do not use).  The whole spaces are judged
on each case's own terms (``runtimes.agreement.judge``) against one ``check`` per case, which
gives every group's verdict.  The group's other releases share its results.  Outcomes are
cached per group and file.  ``--write-known`` records the single-layer disagreements of seed 0
in ``tests/runtimes/known/comfyui.releases.txt``.  Exit status: 0 when every verdict agrees, 1
otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from comfyquant.targets.comfyui_releases import GROUPS  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import Row, summary, table  # noqa: E402
from runtimes.cases import HELD_OUT, Case, generate  # noqa: E402
from runtimes.release_agreement import (  # noqa: E402
    compare_expected,
    compare_group,
    drive_groups,
    format_cases,
    release_expectations,
    write_known_releases,
)


def _cases(space: str, folder: Path, seed: int, held_out: bool) -> list[Case]:
    shapes = HELD_OUT if held_out else None
    if space == "formats":
        return format_cases(folder, seed, shapes)
    cases = generate(seed, shapes, checkpoint=space == "checkpoint")
    for case in cases:
        case.write(folder)
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", action="store_true", help="the geometries of cases.HELD_OUT")
    ap.add_argument("--space", choices=("formats", "single", "checkpoint"), default="formats",
                    help="the valid layers per format (default), or the whole generated space")  # fmt: skip
    ap.add_argument("--only", default="", help="only the groups of these releases (comma list)")
    ap.add_argument("--limit", type=int, default=20, help="disagreements printed per group")
    ap.add_argument("--write-known", action="store_true", help="record the disagreements (--space single, seed 0)")
    args = ap.parse_args(argv)
    if args.write_known and (args.space != "single" or args.seed or args.held_out or args.only):
        ap.error("--write-known records the whole single-layer space of seed 0 on every group")
    root = releases.releases_root()
    if root is None:
        print(f"skipped: {releases.MISSING}")
        return 1
    only = {v.strip() for v in args.only.split(",") if v.strip()}
    groups = [g for g in GROUPS if not only or only & set(g.releases)]
    folder = Path(tempfile.mkdtemp(prefix="comfyquant-prove-releases-"))
    failed = False
    total = agree = 0
    found: dict[str, list[Row]] = {}
    try:
        start = time.monotonic()
        cases = _cases(args.space, folder, args.seed, args.held_out)
        print(f"{len(cases)} cases written in {time.monotonic() - start:.0f}s", flush=True)
        if args.space != "formats":
            start = time.monotonic()
            expectations = {c.id: release_expectations(c) for c in cases}
            print(f"comfyquant's verdicts on every group: {time.monotonic() - start:.0f}s", flush=True)
        start = time.monotonic()
        driven = drive_groups(root, groups, cases)
        print(f"driven in {time.monotonic() - start:.0f}s", flush=True)
        for group in groups:
            got, count = driven[group.first]
            if args.space == "formats":
                rows, _ = compare_group(root, group, cases)
            else:
                rows = compare_expected(cases, got, expectations, group.first)
            found[group.first] = rows
            total += len(rows) * len(group.releases)
            agree += sum(r.why is None for r in rows) * len(group.releases)
            shared = f" (shared by {', '.join(group.releases[1:])})" if len(group.releases) > 1 else ""
            print(f"ComfyUI {group.first} with {group.kitchen_text}{shared}: {summary(rows)}; {count} driven", flush=True)
            bad = table(rows, args.limit)
            if bad:
                failed = True
                print(bad)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"cases x releases: {total}, agreeing {agree}")
    if args.write_known:
        print(f"written: {write_known_releases(found)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
