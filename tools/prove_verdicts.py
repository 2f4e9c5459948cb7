"""Record what the real runtimes do on the generated defect space and print where comfyquant's
verdicts disagree.

    python tools/prove_verdicts.py [--target comfyui,comfy-kitchen,sglang] [--seed 0]
                                   [--only SUBSTRING] [--limit 40] [--json OUT]

Each runtime is driven by its driver in ``tests/runtimes/`` (ComfyUI from its source tarball,
comfy-kitchen as installed, SGLang from its wheel); a runtime that cannot run here is skipped
with the reason.  To prove the verdicts for another version of a runtime, point its driver at
that version (``COMFYQUANT_COMFYUI_TARBALL`` for ComfyUI, the installed comfy-kitchen,
``COMFYQUANT_SGLANG_WHEEL`` for SGLang) and read the disagreements.  Exit status: 0 when every
verdict agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from runtimes.agreement import DRIVERS, compare, driver_module, summary, table, write_known  # noqa: E402
from runtimes.cases import HELD_OUT, generate, in_pairs  # noqa: E402


class Replay:
    """A runtime's outcomes as recorded by an earlier ``--json`` run (same seed): comfyquant's
    side is checked again without running the runtime."""

    def __init__(self, path: str, target: str, cases, predict=None) -> None:
        from runtimes.outcome import Outcome

        recorded = {r["case"]: Outcome(**r["outcome"]) for r in json.loads(Path(path).read_text()) if r["target"] == target}
        self.by_path = {str(c.path): recorded[c.id] for c in cases if c.id in recorded}
        if predict is not None:  # the driver runs part of its runtime: compare what it covers
            self.predict = predict

    def run(self, path) -> object:
        return self.by_path[str(path)]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=",".join(DRIVERS), help="runtimes to drive (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="only cases whose id contains this")
    ap.add_argument("--held-out", action="store_true", help="the space over other geometries than the tests' (cases.HELD_OUT)")
    ap.add_argument("--checkpoint", action="store_true", help="each case as one layer of a whole prefixed checkpoint")
    ap.add_argument("--pairs", type=int, default=0, help="instead, this many files of two defective layers each")
    ap.add_argument("--limit", type=int, default=40, help="disagreements printed per runtime")
    ap.add_argument("--json", default="", help="write every outcome and verdict to this file")
    ap.add_argument("--write-known", action="store_true", help="record the disagreements as tests/runtimes/known/<target>.txt")
    ap.add_argument("--replay", default="", help="take the runtimes' outcomes from a --json file instead of running them")
    args = ap.parse_args(argv)
    all_cases = [c for c in generate(args.seed, HELD_OUT if args.held_out else None, args.checkpoint) if args.only in c.id]
    records = []
    failed = False
    # one folder per seed, the same on every run: a runtime's message that names the file
    # (a damaged container's) is then the same when replayed
    folder = (
        Path(tempfile.gettempdir())
        / f"comfyquant-prove-verdicts-{args.seed}{'-held-out' if args.held_out else ''}{'-checkpoint' if args.checkpoint else ''}"
    )
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        if args.pairs:
            singles = folder / "singles"
            singles.mkdir()
            all_cases = in_pairs(all_cases, singles, args.seed, args.pairs)
        for case in all_cases:
            case.write(folder)
        for target in args.target.split(","):
            module = driver_module(target.strip())
            drv = Replay(args.replay, target, all_cases, getattr(module, "predict", None)) if args.replay else module.driver()
            if drv is None:
                print(f"{target}: skipped: {module.MISSING}")
                continue
            with drv:
                rows = compare(drv, target, all_cases)
            print(f"{module.VERSION}: {summary(rows)}")
            if args.write_known:
                print(f"wrote {write_known(target, rows, 'checkpoint' if args.checkpoint else 'pairs' if args.pairs else '')}")
            bad = table(rows, args.limit)
            if bad:
                failed = True
                print(bad)
            records.extend(
                {
                    "target": target,
                    "case": r.case.id,
                    "outcome": r.outcome.to_dict(),
                    "comfyquant": r.predicted.short(),
                    "agrees": r.why is None,
                }
                for r in rows
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
