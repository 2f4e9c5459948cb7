"""Run the whole-model space of a seed through ComfyUI and through comfyquant's ComfyUI
verdicts, and print how far they agree.

    python tools/prove_whole_models.py [--seed 0] [--seeds 1,2,3] [--only SUBSTRING]
                                       [--limit 40] [--jsonl OUT] [--copy-to DIR] [--write-known]
                                       [--release 0.4.0,0.8.2]

Each seed's space (``tests/runtimes/whole_models.py``: tiny Flux and Wan 2.1 models built with
ComfyUI's own classes, quantized by comfy-kitchen, with generated defects) is written once
into the test cache; ComfyUI 0.33.0 runs every file in its own environment
(``tests/runtimes/comfyui_models.py``).  Seed 0 is the agreement test's; other seeds draw
other model sizes, layers and defects: held out, no rule was written against them.  Printed
per seed: the outcome shares and the agreement counts (verdict classes, exact messages among
the files ComfyUI raises on, silent FAILS among the files it computes garbage with), then the
disagreements.  Exit status: 0 when every verdict agrees, 1 otherwise, 2 when ComfyUI cannot
run here.

With ``--release``, the release groups of those releases (``comfyquant.targets.comfyui_releases``)
run the seed's space (seed 0 by default; ``--seeds`` for held-out ones) instead: each group's
first release with the comfy-kitchen it pins (``tests/runtimes/release_model_agreement.py``,
outcomes cached per group and file), against
comfyquant's verdict for that group; ``--write-known`` then records their disagreements in
``known/comfyui.release-models.txt``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from runtimes import comfyui_models  # noqa: E402
from runtimes.agreement import table  # noqa: E402
from runtimes.model_agreement import compare, counts, load_cases, record, summary, write_known  # noqa: E402
from runtimes.whole_models import space  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default="", help="several seeds, comma-separated (held-out: any but 0)")
    ap.add_argument("--only", default="", help="only files whose case id contains this")
    ap.add_argument("--limit", type=int, default=40, help="disagreements printed per seed")
    ap.add_argument("--jsonl", default="", help="write one JSON line per file (outcome, verdict, agreement) here")
    ap.add_argument("--copy-to", default="", help="copy the space into this folder (replacing it) and run it there")
    ap.add_argument("--write-known", action="store_true", help="record seed 0's disagreements as known/comfyui.models.txt")
    ap.add_argument("--release", default="", help="release groups (by any of their releases, comma-separated) to run instead")
    args = ap.parse_args(argv)
    if args.release:
        return releases(args)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or [args.seed]
    drv = comfyui_models.driver()
    if drv is None:
        print(f"skipped: {comfyui_models.MISSING}")
        return 2
    failed = False
    lines = []
    total = {"cases": 0, "verdicts": 0, "agree": 0, "raises": 0, "messages": 0, "garbage": 0, "silent": 0}
    with drv:
        for seed in seeds:
            found = space(seed)
            if isinstance(found, str):
                print(f"skipped: {found}")
                return 2
            folder, manifest = found
            if args.copy_to:
                folder = Path(args.copy_to) / (f"seed{seed}" if len(seeds) > 1 else "")
                shutil.rmtree(folder, ignore_errors=True)
                shutil.copytree(found[0], folder)
            cases = [c for c in load_cases(folder, manifest) if args.only in c.id]
            rows = compare(drv, cases)
            print(f"seed {seed}: {summary(rows)}")
            for key, value in counts(rows).items():
                total[key] += value
            if args.write_known and seed == 0:
                print(f"wrote {write_known(rows)}")
            bad = table(rows, args.limit)
            if bad:
                failed = True
                print(bad)
            lines.extend(dict(record(r), seed=seed) for r in rows)
    if len(seeds) > 1:
        t = total
        print(
            f"all seeds: comfyquant agrees on {t['agree']}/{t['cases']} (verdict classes {t['verdicts']}/{t['cases']}, "
            f"exact messages {t['messages']}/{t['raises']}, silent garbage {t['silent']}/{t['garbage']})"
        )
    if args.jsonl:
        Path(args.jsonl).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return 1 if failed else 0


def releases(args) -> int:
    """Each seed's space (seed 0 unless ``--seed``/``--seeds`` say otherwise) through the
    release groups named by ``args.release``."""
    from comfyquant.targets.comfyui_releases import GROUPS
    from runtimes import release_model_agreement as rma
    from runtimes import releases as release_sources

    wanted = [r.strip() for r in args.release.split(",") if r.strip()]
    groups = []
    for release in wanted:
        group = next((g for g in GROUPS if release in g.releases), None)
        if group is None:
            print(f"error: no ComfyUI release group holds release {release}")
            return 2
        if group not in groups:
            groups.append(group)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or [args.seed]
    if args.write_known and seeds != [0]:
        print("error: --write-known records seed 0's disagreements only")
        return 2
    root = release_sources.releases_root()
    if root is None:
        print(f"skipped: {release_sources.MISSING}")
        return 2
    failed = False
    rows = {}
    lines = []
    totals: dict[str, list[int]] = {}
    for seed in seeds:
        found = space(seed)
        if isinstance(found, str):
            print(f"skipped: {found}")
            return 2
        cases = [c for c in load_cases(*found) if args.only in c.id]
        said = rma.expectations(cases)
        for group in groups:
            start = time.monotonic()
            got = rma.outcomes(root, group, cases)
            if isinstance(got, str):
                print(f"skipped: {got}")
                return 2
            results, driven = got
            rows[group.first] = group_rows = rma.compare(cases, results, said, group.first)
            shared = f"; {', '.join(group.releases[1:])} share these results" if len(group.releases) > 1 else ""
            print(
                f"seed {seed}, ComfyUI {group.first} ({group.kitchen_text}): {summary(group_rows)}; "
                f"{driven} driven in {time.monotonic() - start:.0f}s{shared}"
            )
            agree = sum(1 for r in group_rows if r.why is None)
            total = totals.setdefault(group.first, [0, 0])
            total[0] += agree * len(group.releases)
            total[1] += len(group_rows) * len(group.releases)
            bad = table(group_rows, args.limit)
            if bad:
                failed = True
                print(bad)
            lines.extend(dict(record(r), release=group.first, seed=seed) for r in group_rows)
    agree, cases_total = sum(t[0] for t in totals.values()), sum(t[1] for t in totals.values())
    print(f"files x releases: {cases_total}, agreeing {agree}")
    if args.write_known and not args.only:
        print(f"wrote {rma.write_known(rows)}")
    if args.jsonl:
        Path(args.jsonl).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
