"""Prove comfyquant's per-release comfy-kitchen verdicts against every release group's own code.

    python tools/prove_kitchen_releases.py [--seed 0] [--held-out] [--space {single,checkpoint}]
                                           [--only 0.2.11,0.2.40] [--limit 20]

Each group of ``comfyquant.targets.kitchen_releases`` is driven by its oldest release (its
sources first on a worker's path, ``tests/runtimes/kitchen_releases_driver.py``) on the whole
generated space of ``--seed`` (every defect of every format, ``runtimes.cases.generate``;
``--space checkpoint``: each case as one layer of a whole checkpoint; ``--held-out``: the
geometries the tests do not use), and each case is judged against ``check --target
comfy-kitchen==<release>``.  The group's other releases share its results.  Outcomes are cached
per group and file.  Exit status: 0 when every verdict agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from comfyquant.targets import kitchen_releases as product  # noqa: E402
from runtimes import kitchen_releases as oracle  # noqa: E402
from runtimes.cases import HELD_OUT, generate  # noqa: E402
from runtimes.outcome import expected  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", action="store_true", help="the geometries of cases.HELD_OUT")
    ap.add_argument("--space", choices=("single", "checkpoint"), default="single")
    ap.add_argument("--only", help="only the groups of these releases (comma list)")
    ap.add_argument("--limit", type=int, default=20, help="disagreements printed per group")
    args = ap.parse_args(argv)
    groups = list(product.GROUPS)
    if args.only:
        wanted = {product.group_of(r.strip()) for r in args.only.split(",")}
        groups = [g for g in groups if g in wanted]
    missing = [g.first for g in groups if oracle.source(g.first) is None]
    if missing:
        print(f"comfy-kitchen sources missing for {', '.join(missing)}: {oracle.MISSING[missing[0]]}")
        return 1
    folder = Path(tempfile.mkdtemp(prefix="comfyquant-kitchen-releases-"))
    try:
        cases = generate(args.seed, HELD_OUT if args.held_out else None, checkpoint=args.space == "checkpoint")
        for case in cases:
            case.write(folder)
        total = agree = 0
        for group in groups:
            start = time.monotonic()
            got, driven = oracle.outcomes(group, cases)
            bad = []
            for case in cases:
                said = expected(oracle.predicted(case, group.first))
                why = oracle.judged(case, got[case.id], said)
                if why is not None:
                    bad.append((case.id, why, said.short(), got[case.id].short()))
            n = len(group.releases)
            total += len(cases) * n
            agree += (len(cases) - len(bad)) * n
            print(f"comfy-kitchen {group.name}: {len(cases) - len(bad)}/{len(cases)} agree; "
                  f"{driven} driven in {time.monotonic() - start:.0f} s", flush=True)  # fmt: skip
            for case_id, why, said_, got_ in bad[: args.limit]:
                print(f"  {case_id}: {why}\n    comfyquant: {said_[:200]}\n    runtime:    {got_[:200]}")
            kinds = Counter(why for _c, why, _s, _g in bad)
            if len(bad) > args.limit:
                print("  ... " + ", ".join(f"{k}: {v}" for k, v in kinds.most_common()))
        print(f"{len(cases)} cases x {sum(len(g.releases) for g in groups)} releases: {agree}/{total} agree")
        return 0 if agree == total else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
