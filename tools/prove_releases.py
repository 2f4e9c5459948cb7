"""Prove comfyquant's per-release ComfyUI verdicts against every release group's own code.

    python tools/prove_releases.py [--seed 0] [--held-out] [--only 0.31.0,0.33.0] [--limit 20]

Each group of ``comfyquant.targets.comfyui_releases`` is driven by its oldest release with the
comfy-kitchen it pins (``tests/runtimes/comfyui_release_driver.py``; the releases tarball as in
``tests/runtimes/releases.py``) on every format's valid layer in each marker form and the
legacy scaled-FP8 forms of ``--seed`` (``--held-out``: the geometries the tests do not use);
the group's other releases share its results.  Outcomes are cached per group and file.  Exit
status: 0 when every verdict agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from comfyquant.targets.comfyui_releases import GROUPS  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import summary, table  # noqa: E402
from runtimes.cases import HELD_OUT  # noqa: E402
from runtimes.release_agreement import compare_group, format_cases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", action="store_true", help="the geometries of cases.HELD_OUT")
    ap.add_argument("--only", default="", help="only the groups of these releases (comma list)")
    ap.add_argument("--limit", type=int, default=20, help="disagreements printed per group")
    args = ap.parse_args(argv)
    root = releases.releases_root()
    if root is None:
        print(f"skipped: {releases.MISSING}")
        return 1
    only = {v.strip() for v in args.only.split(",") if v.strip()}
    folder = Path(tempfile.mkdtemp(prefix="comfyquant-prove-releases-"))
    failed = False
    total = agree = 0
    try:
        cases = format_cases(folder, args.seed, HELD_OUT if args.held_out else None)
        for group in GROUPS:
            if only and not only & set(group.releases):
                continue
            rows, driven = compare_group(root, group, cases)
            total += len(rows) * len(group.releases)
            agree += sum(r.why is None for r in rows) * len(group.releases)
            shared = f" (shared by {', '.join(group.releases[1:])})" if len(group.releases) > 1 else ""
            print(f"ComfyUI {group.first} with {group.kitchen_text}{shared}: {summary(rows)}; {driven} driven")
            bad = table(rows, args.limit)
            if bad:
                failed = True
                print(bad)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"cases x releases: {total}, agreeing {agree}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
