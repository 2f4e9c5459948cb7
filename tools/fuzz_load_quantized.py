"""Fuzz ``comfyquant.torch.load_quantized`` with generated user models (``tests/user_models.py``).

Each execution draws a checkpoint from a pool written once (tiny comfy-kitchen layers, dense
norms, damaged markers, wrong-kind tensors, names that collide after ``strip_prefix``) and a
random model for it, loads, and judges: success with a report that matches what was done, or
one clean line naming the file and a layer or tensor with the model exactly unchanged.

    python tools/fuzz_load_quantized.py [-n 100000] [--seed 0] [--pool 40]

Prints the counts of each outcome and every finding (with the execution's seed, which
replays it: ``--seed S -n 1 --first S``); exit status 1 when there is a finding.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from user_models import build_pool, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100_000, help="executions (default 100000)")
    ap.add_argument("--seed", type=int, default=0, help="pool seed (default 0)")
    ap.add_argument("--first", type=int, default=0, help="seed of the first execution (default 0)")
    ap.add_argument("--pool", type=int, default=40, help="checkpoints in the pool (default 40)")
    ap.add_argument("--every", type=int, default=10_000, help="progress line every N executions")
    args = ap.parse_args(argv)
    start = time.monotonic()
    counts: Counter = Counter()
    findings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fuzz-load-") as folder:
        pool = build_pool(folder, args.pool, args.seed)
        for i in range(args.first, args.first + args.n):
            outcome, problems = run(pool, random.Random(i))
            counts[outcome] += 1
            if problems:
                counts["findings"] += 1
                if len(findings) < 50:
                    findings.append(f"execution {i}: " + "; ".join(problems))
            done = i - args.first + 1
            if done % args.every == 0:
                print(f"{done} executions, {dict(counts)}, {time.monotonic() - start:.0f} s", flush=True)
    elapsed = time.monotonic() - start
    print(f"{args.n} executions in {elapsed:.0f} s ({elapsed / max(args.n, 1) * 1000:.2f} ms each): {dict(counts)}")
    for f in findings:
        print(f)
    return 1 if counts["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
