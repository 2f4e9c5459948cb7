"""Fuzz ``check --deep`` in-process on damaged files in every layout.

Each execution takes a small valid seed (ComfyUI's legacy scaled FP8, musubi, ModelOpt, BFL,
INT8-Fast, convert_to_quant, nunchaku, comfy-kitchen's own layers, GGUF written by the ``gguf``
package's writer), damages one to three of its tensors (a wrong shape or dtype, a span short
or long, a tensor missing or added, NaN/Inf/zero/negative/huge/subnormal values, wrong element
counts for its scales, zeros and codebooks, another group size in its marker; for GGUF: a
tensor's ggml type, a dimension, its data offset, its scale bytes, the file's end) and runs
``comfyquant.check(path, deep=True)`` as the command line would.  Every execution must end with a
report (exit 0 or 1) that renders as text and strict JSON, or a one-line refusal (exit 2):
never an internal error (exit 3), never a numpy warning, every promised ``--deep`` measurement
present (``tests/foreign_seeds.deep_outcome`` says what is checked).

    nice -n 10 python tools/fuzz_deep.py                # 100,000 executions
    python tools/fuzz_deep.py -n 2000 --seed 7          # a short run, another random stream

It prints the count of executions per exit code and every failure (with the seed and damages
that reproduce it), and exits 1 when any execution failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import warnings
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="fuzz check --deep on damaged files in every layout")
    p.add_argument("-n", "--executions", type=int, default=100_000, help="how many damaged files to check (100,000)")
    p.add_argument("--seed", type=int, default=0, help="the random stream (each execution's is derived from it)")
    p.add_argument("--every", type=int, default=10_000, help="print progress every N executions")
    p.add_argument("--max-failures", type=int, default=20, help="stop after this many failures")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import foreign_seeds as fs

    warnings.simplefilter("error")  # a warning on stderr is a defect as much as a traceback
    with tempfile.TemporaryDirectory(prefix="fuzz-deep-") as folder:
        safetensors = {name: fs.read(fs.seed(name, folder)) for name in fs.DEEP_SEEDS}
        ggufs = {}
        for name, path in fs.gguf_seeds(folder).items():
            with open(path, "rb") as fh:
                raw = fh.read()
            ggufs[name] = (raw, fs.gguf_tensor_fields(raw))
        names = sorted(safetensors) + sorted(ggufs)
        target = {"safetensors": os.path.join(folder, "damaged.safetensors"), "gguf": os.path.join(folder, "damaged.gguf")}
        exits: Counter = Counter()
        failures = []
        start = time.monotonic()
        for i in range(args.executions):
            rand = random.Random(args.seed * 1_000_003 + i)
            name = rand.choice(names)
            if name in ggufs:
                raw, fields = ggufs[name]
                specs = [fs.random_gguf_damage(rand) for _ in range(rand.randint(1, 2))]
                for spec in specs:
                    raw = fs.damage_gguf(raw, fields, spec, rand)
                path = target["gguf"]
                with open(path, "wb") as fh:
                    fh.write(raw)
            else:
                header, data = safetensors[name]
                header = json.loads(json.dumps(header))
                specs = [fs.random_damage(rand) for _ in range(rand.randint(1, 3))]
                for spec in specs:
                    header, data = fs.damage_tensor(header, data, spec, rand)
                path = fs.write_raw(target["safetensors"], header, data)
            code, problem = fs.deep_outcome(path)
            exits[code] += 1
            if problem is not None:
                failures.append(f"execution {i} (--seed {args.seed}): seed {name}, damages {specs}: {problem}")
                print(failures[-1], flush=True)
                if len(failures) >= args.max_failures:
                    break
            if args.every and (i + 1) % args.every == 0:
                print(f"{i + 1} executions, {time.monotonic() - start:.0f} s, exits {dict(sorted(exits.items()))}", flush=True)
    done = sum(exits.values())
    print(
        f"{done} executions in {time.monotonic() - start:.1f} s: exits {dict(sorted(exits.items()))}, "
        f"{len(failures)} failure{'s' * (len(failures) != 1)}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
