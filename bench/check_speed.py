"""How close is ``comfyquant check`` to the cost of just reading headers and markers?

One run builds full-size *sparse* checkpoint layouts (exact safetensors headers, real marker
bytes, tensor data as file holes; see ``layouts.py``), checks that ``comfyquant check`` finds
nothing wrong with them, then measures side by side (interleaved rounds and medians, because
the machine is noisy; ratios are medians of per-round ratios):

1. the layouts and what ``comfyquant check`` says about them (expected: no findings);
2. in-process, per layout: the FLOOR (per shard: open, 8-byte length + header read,
   ``json.loads``, one ``os.pread`` per marker tensor) against ``comfyquant.check`` (cold, and
   warm when comfyquant has a module-level cache), with GC off, given the shard list, and
   comfyquant's SGLang drop-in.  Target: check <= 1.5x floor.
   2b. SGLang-style ``safe_open`` inspection, in a child process (it needs torch);
   2c. the same ratio in CPU instructions (valgrind), which machine noise cannot move;
   2d. what dialect detection adds to check on marker files (target <= 5%);
3. linear scaling: Wan with 1x/2x/4x the blocks, time per tensor;
4. CLI cold start: the real console script as a subprocess (bytecode caches on) against a
   bare ``python -c pass``.  Target: <= 100 ms wall;
5. memory: peak RSS while checking a sparse ~43 GB single file (the reader must never map it);
6. ``-X importtime`` breakdown of the CLI, and 7. a cProfile of the in-process check of the
   Wan 14B 4-shard layout (both skipped with --quick).

Usage: python bench/check_speed.py [--quick] [--out DIR] [--rounds N] [--cli-runs N] [--skip ...]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import math
import os
import pstats
import shutil
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import layouts  # noqa: E402

import comfyquant  # noqa: E402
from comfyquant.formats import validation as cq_layers  # noqa: E402

TARGET_RATIO = 1.5
DIALECT_BUDGET = 0.05
TARGET_CLI_MS = 100.0
HEADLINE = "wan14b-w4a8-4sh"

# name, model, format, shards, header markers, extra kwargs
LAYOUTS = [
    ("flux-w4a8-1sh", "flux", "w4a8", 1, True, {}),
    ("qwen-w4a8-2sh", "qwen", "w4a8", 2, True, {}),
    ("wan14b-w4a8-1sh", "wan", "w4a8", 1, False, {}),
    ("wan14b-w4a8-2sh", "wan", "w4a8", 2, True, {}),
    (HEADLINE, "wan", "w4a8", 4, False, {}),
    ("wan14b-fp8-1sh", "wan", "fp8", 1, True, {}),
    ("wan14b-int8cr-2sh", "wan", "int8", 2, False, {}),
]
QUICK = {"flux-w4a8-1sh", HEADLINE, "wan14b-fp8-1sh"}
SCALING = [("wan-1x", 40), ("wan-2x", 80), ("wan-4x", 160)]
BIG = ("wan-fp8-3x-1file", "wan", "fp8", 1, True, {"blocks": 120})  # ~43 GB


# -- helpers -------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:>{w}}}" if i else f"{{:<{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def interleaved(funcs: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Run every function once per round, rotating the order each round; return times."""
    names = list(funcs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            gc.collect()
            t0 = time.perf_counter()
            funcs[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def disk_usage(path: str) -> tuple[int, int]:
    apparent = used = 0
    for f in layouts.shard_files(path):
        st = os.stat(f)
        apparent += st.st_size
        used += st.st_blocks * 512
    return apparent, used


# -- what is measured ----------------------------------------------------------------------


def floor_read(files: list[str]) -> None:
    """The minimum any header checker must do: per shard, the header and every marker's bytes."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = json.loads(os.pread(fd, n, 8))
            base = 8 + n
            for name, e in header.items():
                if name.endswith(".comfy_quant"):
                    a, b = e["data_offsets"]
                    os.pread(fd, b - a, base + a)
        finally:
            os.close(fd)


def least_check(files: list[str]) -> dict:
    """A lower bound for any *complete* header check: the floor's reads plus the least
    any checker must do -- each entry's byte span tested (dtype width x element count,
    inside the data area), the spans tested to tile the data area, the metadata tested to be
    strings, the tensors grouped into layers by prefix and every marker's JSON parsed.  No
    format rules, no runtime verdicts, no findings, no error messages: if even this costs
    more than the target ratio, no checker written in Python can meet it.  (The floor itself
    leaves out the header's marker map, ``_quantization_metadata``; this parses it.)"""
    from comfyquant.dtypes import DTYPE_BITS

    prod, bits = math.prod, DTYPE_BITS
    layers: dict[str, dict] = {}
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = json.loads(os.pread(fd, n, 8))
            base = 8 + n
            data_len = size - base
            meta = header.pop("__metadata__", None) or {}
            if not all(type(v) is str for v in meta.values()):
                raise ValueError(f"{f}: metadata")
            if "_quantization_metadata" in meta:  # header markers: every layer's marker in one string
                layers.setdefault("", {})["header markers"] = json.loads(meta["_quantization_metadata"])
            spans = []
            for name, e in header.items():
                a, b = e["data_offsets"]
                if (b - a) * 8 != prod(e["shape"]) * bits[e["dtype"]] or a < 0 or b > data_len:
                    raise ValueError(f"{f}: {name}")
                spans.append((a, b))
                prefix, _, suffix = name.rpartition(".")
                layer = layers.get(prefix)
                if layer is None:
                    layer = layers[prefix] = {}
                layer[suffix] = e
                if suffix == "comfy_quant":
                    layer["marker"] = json.loads(os.pread(fd, b - a, base + a))
            spans.sort()
            pos = 0
            for a, b in spans:
                if a != pos:
                    raise ValueError(f"{f}: hole or overlap at {a}")
                pos = b
            if pos != data_len:
                raise ValueError(f"{f}: trailing bytes")
        finally:
            os.close(fd)
    return layers


def clear_caches() -> bool:
    """Clear comfyquant's module-level (cross-call) caches, whichever this version has:
    ``checker.layers._CACHE`` or ``comfyquant.memo.clear()``.  False when there is none (then
    every call is as cold as the first call of a fresh CLI process)."""
    found = False
    cache = getattr(cq_layers, "_CACHE", None)
    if cache is not None:
        cache.clear()
        found = True
    try:
        from comfyquant import memo
    except ImportError:
        memo = None
    if memo is not None and callable(getattr(memo, "clear", None)):
        memo.clear()
        found = True
    return found


def check_cold(path: str) -> None:
    clear_caches()
    comfyquant.check([path])


def check_warm(path: str) -> None:
    comfyquant.check([path])


def cq_sglang_compat(files: list[str]) -> None:
    from comfyquant.compat.sglang import inspect_comfy_quant_markers

    inspect_comfy_quant_markers(files)


def sglang_style(files: list[str]) -> None:
    """The I/O pattern of SGLang's own ``inspect_comfy_quant_markers``: ``safe_open(..., "pt")``,
    ``get_slice`` per tensor for dtype/shape, ``get_tensor`` per marker, then the per-layer
    required-tensor test (``required - meta.keys()``).  Shape/dtype rules are omitted."""
    from safetensors import safe_open

    meta: dict[str, tuple] = {}
    raw: dict[str, dict] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as ck:
            md = ck.metadata() or {}
            serialized = md.get("_quantization_metadata")
            if serialized is not None:
                raw.update(json.loads(serialized)["layers"])
            for key in ck.keys():
                sl = ck.get_slice(key)
                meta[key] = (sl.get_dtype(), tuple(sl.get_shape()))
                if key.endswith(".comfy_quant"):
                    raw[key[: -len(".comfy_quant")]] = json.loads(ck.get_tensor(key).numpy().tobytes())
    for prefix, marker in raw.items():
        if marker.get("format") == "asym_w4a8_int8":
            required = {f"{prefix}.weight", f"{prefix}.weight_s_rel", f"{prefix}.weight_s_channel"}
        else:
            required = {f"{prefix}.weight", f"{prefix}.weight_scale"}
        missing = required - meta.keys()  # O(tensors) per layer, as SGLang writes it
        if missing:
            raise ValueError(f"Comfy layer {prefix!r} is missing checkpoint tensors: {sorted(missing)}")


def have_safetensors_torch() -> bool:
    """Without importing them (torch would slow every later measurement in this process)."""
    from importlib.util import find_spec

    return find_spec("safetensors") is not None and find_spec("torch") is not None


# -- sections ------------------------------------------------------------------------------


@dataclass
class Built:
    """A written layout; the tensor lists are dropped so the heap looks like a CLI process's."""

    name: str
    path: str
    shards: int
    tensors: int
    quant_layers: int
    header_markers: bool


def _built(lay: layouts.Layout, path: str) -> Built:
    return Built(lay.name, path, lay.shards, len(lay.tensors), len(lay.quant_layers), lay.header_markers)


def build(root: str, quick: bool) -> tuple[dict, dict, Built]:
    built, scaling = {}, {}
    print("== 1. Layouts (sparse; header + marker bytes written, tensor data are holes)")
    t0 = time.perf_counter()
    rows = []
    for name, model, fmt, shards, hm, kw in LAYOUTS:
        if quick and name not in QUICK:
            continue
        lay = layouts.make_layout(name, model, fmt, shards, hm, **kw)
        path = layouts.write_layout(lay, os.path.join(root, name))
        built[name] = _built(lay, path)
    for name, blocks in SCALING:
        lay = layouts.make_layout(name, "wan", "w4a8", 4, False, blocks=blocks)
        scaling[name] = _built(lay, layouts.write_layout(lay, os.path.join(root, name)))
    name, model, fmt, shards, hm, kw = BIG
    big_lay = layouts.make_layout(name, model, fmt, shards, hm, **kw)
    big = _built(big_lay, layouts.write_layout(big_lay, os.path.join(root, name)))
    build_s = time.perf_counter() - t0

    bad = []
    for name, lay in [*built.items(), *scaling.items(), (big.name, big)]:
        path = lay.path
        clear_caches()
        rep = comfyquant.check([path])
        c = rep.counts
        apparent, used = disk_usage(path)
        loads = " ".join(f"{t}={'ok' if v.loads else 'FAIL'}" for t, v in rep.verdicts.items())
        rows.append(
            [
                name,
                lay.shards,
                lay.tensors,
                lay.quant_layers,
                "yes" if lay.header_markers else "no",
                f"{apparent / 1e9:.1f} GB",
                f"{used / 1024:.0f} KiB",
                f"{c['error']}/{c['warning']}/{c['info']}",
                loads,
            ]
        )
        if c["error"] or c["warning"]:
            bad.append((name, rep))
    print(table(rows, ["layout", "shards", "tensors", "q-layers", "hdr-map", "size", "on disk", "err/warn/info", "verdicts"]))
    print(f"(built in {build_s:.2f} s under {root})")
    for name, rep in bad:
        print(f"  !! {name}: findings that a valid export should not produce:")
        for f in rep.findings[:8]:
            print(f"     {f.severity:7} {f.code:10} {f.message[:150]}")
    print()
    return built, scaling, big


def ratio_of(times: dict[str, list[float]], num: str, den: str = "floor") -> float:
    """Median over rounds of the per-round ratio: adjacent samples share the machine's state."""
    return med([a / b for a, b in zip(times[num], times[den])])


def check_nogc(path: str) -> None:
    clear_caches()
    gc.disable()
    try:
        comfyquant.check([path])
    finally:
        gc.enable()


def section_inprocess(built: dict, rounds: int) -> dict:
    has_cache = clear_caches()
    print(
        f"== 2. In-process cost per layout (median of {rounds} interleaved rounds, ms; ratio = median of per-round check/floor)"
    )
    rows, results = [], {}
    for name, lay in built.items():
        path = lay.path
        files = layouts.shard_files(path)
        check_warm(path)  # warm-up: imports, code paths, page cache
        floor_read(files)
        cq_sglang_compat(files)
        funcs = {
            "floor": lambda f=files: floor_read(f),
            "least": lambda f=files: least_check(f),
            "check": lambda p=path: check_cold(p),
            "nogc": lambda p=path: check_nogc(p),
            "files": lambda f=files: (clear_caches(), comfyquant.check(f)),
            "compat": lambda f=files: cq_sglang_compat(f),
        }
        if has_cache:
            funcs["warm"] = lambda p=path: check_warm(p)
        times = interleaved(funcs, rounds)
        t = {k: med(v) for k, v in times.items()}
        ratio = ratio_of(times, "check")
        results[name] = {**t, "ratio": ratio}
        results[name]["least_ratio"] = ratio_of(times, "least")
        row = [
            name,
            lay.tensors,
            ms(t["floor"]),
            ms(t["least"]),
            f"{ratio_of(times, 'least'):5.2f}x",
            ms(t["check"]),
            f"{ratio:5.1f}x",
            ms(t["nogc"]),
            f"{ratio_of(times, 'nogc'):5.1f}x",
            ms(t["files"]),
            ms(t["compat"]),
        ]
        if has_cache:
            row += [ms(t["warm"]), f"{ratio_of(times, 'warm'):5.1f}x"]
        rows.append(row + ["PASS" if ratio <= TARGET_RATIO else "FAIL"])
    head = ["layout", "tensors", "floor", "least", "ratio", "check", "ratio", "check-nogc", "ratio", "check(files)", "cq-sglang"]
    if has_cache:
        head += ["check-warm", "ratio"]
    print(table(rows, head + [f"<= {TARGET_RATIO}x"]))
    print("  least        = the least any complete check adds to the floor (spans tested, tiling, layers grouped,")
    print("                 markers parsed; no rules, verdicts or findings: least_check): a lower bound for check")
    least = [r["least_ratio"] for r in results.values()]
    if least and min(least) > TARGET_RATIO:
        print(
            f"  -> even the lower bound is {min(least):.2f}-{max(least):.2f}x the floor: <= {TARGET_RATIO}x is out of reach "
            "for any checker in Python here"
        )
    if has_cache:
        print("  check        = comfyquant.check(path) with the module-level caches cleared first (as in a fresh CLI")
        print("                 process; checker.layers._CACHE or comfyquant.memo.clear(), whichever exists)")
        print("  check-warm   = same, the per-layer results cached by the previous call kept")
    else:
        print("  check        = comfyquant.check(path); comfyquant has no module-level cache, so every call is as")
        print("                 cold as in a fresh CLI process")
    print("  check-nogc   = same with gc.disable() around the call (what a CLI could do)")
    print("  check(files) = check given the shard list instead of the folder (no index.json read)")
    print("  cq-sglang    = comfyquant.compat.sglang.inspect_comfy_quant_markers (the drop-in)")
    print()
    return results


def section_safe_open(built: dict, rounds: int) -> None:
    """SGLang-style inspection needs torch; importing it multiplies the collector's work for
    everything else in the process, so it runs in a child process of its own."""
    names = [n for n in built if n != "wan14b-w4a8-2sh"]
    args = [f"{n}={built[n].path}" for n in names]
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child-safe-open", str(rounds), *args], capture_output=True, text=True
    )
    print(f"== 2b. SGLang-style inspection (child process with torch imported; median of {rounds} rounds, ms)")
    if out.returncode != 0:
        print("  skipped: " + (out.stderr.strip().splitlines() or ["child failed"])[-1])
        print()
        return
    res = json.loads(out.stdout.strip().splitlines()[-1])
    rows = [
        [n, ms(r["floor"]), ms(r["safe_open"]), f"{r['ratio_so']:5.1f}x", ms(r["check"]), f"{r['ratio_cq']:5.1f}x"]
        for n, r in res.items()
    ]
    print(table(rows, ["layout", "floor", "safe_open", "ratio", "check", "ratio"]))
    print("  safe_open = safetensors.safe_open(framework='pt') per shard, get_slice per tensor, get_tensor per marker")
    print("  (the I/O pattern of SGLang's inspect_comfy_quant_markers; its shape rules are omitted)")
    print()


def child_safe_open(rounds: int, pairs: list[str]) -> int:
    import torch  # noqa: F401  (once, before the timings)

    gc.collect()
    gc.freeze()
    out = {}
    for pair in pairs:
        name, path = pair.split("=", 1)
        files = layouts.shard_files(path)
        sglang_style(files)
        check_cold(path)
        funcs = {
            "floor": lambda f=files: floor_read(f),
            "safe_open": lambda f=files: sglang_style(f),
            "check": lambda p=path: check_cold(p),
        }
        times = interleaved(funcs, rounds)
        out[name] = {k: med(v) for k, v in times.items()}
        out[name]["ratio_so"] = ratio_of(times, "safe_open")
        out[name]["ratio_cq"] = ratio_of(times, "check")
    print(json.dumps(out))
    return 0


def section_scaling(scaling: dict, rounds: int) -> None:
    print(f"== 3. Linear scaling (Wan W4A8, 4 shards; median of {rounds} rounds)")
    funcs, sizes = {}, {}
    for name, lay in scaling.items():
        path = lay.path
        files = layouts.shard_files(path)
        check_cold(path)
        funcs[name + ":floor"] = lambda f=files: floor_read(f)
        funcs[name + ":check"] = lambda p=path: check_cold(p)  # caches cleared
        sizes[name] = lay.tensors
    times = interleaved(funcs, rounds)
    t = {k: med(v) for k, v in times.items()}
    rows = []
    base = None
    for name, n in sizes.items():
        c, f = t[name + ":check"], t[name + ":floor"]
        per = c / n * 1e6
        base = base or per
        rows.append(
            [
                name,
                n,
                ms(f),
                ms(c),
                f"{f / n * 1e6:7.2f}",
                f"{per:7.2f}",
                f"{per / base:5.2f}",
                f"{ratio_of(times, name + ':check', name + ':floor'):5.1f}x",
            ]
        )
    print(table(rows, ["layout", "tensors", "floor ms", "check ms", "floor us/t", "check us/t", "vs 1x", "ratio"]))
    print("  'vs 1x' = check time per tensor relative to the 1x layout (1.00 = linear)")
    print()


def console_script() -> str:
    cand = os.path.join(sysconfig.get_path("scripts"), "comfyquant")
    if os.path.exists(cand):
        return cand
    found = shutil.which("comfyquant")
    if not found:
        sys.exit("comfyquant console script not found (pip install -e .)")
    return found


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # let the children use and write __pycache__
    return env


def section_cli(path: str, runs: int) -> None:
    script = console_script()
    env = child_env()
    cmds = {
        "comfyquant check <wan14b 4 shards>": [script, "check", path],
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -S -c pass (no site/.pth)": [sys.executable, "-S", "-c", "pass"],
        "python -c 'import comfyquant.checker.run'": [sys.executable, "-c", "import comfyquant.checker.run"],
    }
    print(f"== 4. CLI cold start (subprocess wall time, median of {runs} interleaved runs)")
    print(f"  script: {script}  (interpreter {sys.executable})")
    rcs = {}
    for k, cmd in cmds.items():  # untimed: populate bytecode caches
        rcs[k] = subprocess.run(cmd, env=env, capture_output=True).returncode

    def runner(cmd):
        def go():
            subprocess.run(cmd, env=env, capture_output=True)

        return go

    t = interleaved({k: runner(c) for k, c in cmds.items()}, runs)
    rows = []
    for k, v in t.items():
        rows.append([k, ms(med(v)), ms(min(v)), ms(max(v)), rcs[k]])
    print(table(rows, ["command", "median ms", "min ms", "max ms", "exit"]))
    cli_t, bare_t = t["comfyquant check <wan14b 4 shards>"], t["python -c pass"]
    cli = med(cli_t)
    above = med([a - b for a, b in zip(cli_t, bare_t)])
    imp = med([a - b for a, b in zip(t["python -c 'import comfyquant.checker.run'"], bare_t)])
    verdict = "PASS" if cli * 1e3 <= TARGET_CLI_MS else "FAIL"
    print(
        f"  CLI {cli * 1e3:.1f} ms (target <= {TARGET_CLI_MS:.0f} ms: {verdict}); per-round CLI minus bare "
        f"'python -c pass': {above * 1e3:.1f} ms, of which importing comfyquant.checker.run ~{imp * 1e3:.1f} ms"
    )
    print(
        f"  bare interpreter start here is {med(bare_t) * 1e3:.0f} ms ({med(t['python -S -c pass (no site/.pth)']) * 1e3:.0f} ms "
        "without site): the sandbox's certifi .pth eats most of the 100 ms budget"
    )
    print()


_PHASES_CHILD = textwrap.dedent(
    """
    import time
    t0 = time.time()
    import io, json, sys
    from comfyquant import cli
    t1 = time.time()
    args = cli._build_parser().parse_args(["check", sys.argv[1]])
    t2 = time.time()
    from comfyquant.checker.run import check
    t3 = time.time()
    rep = check(args.paths, target=args.target, deep=args.deep)
    t4 = time.time()
    from comfyquant.render import render_report
    text = render_report(rep, verbose=False)
    t5 = time.time()
    check(args.paths, target=args.target, deep=args.deep)
    t6 = time.time()
    sys.stderr.write(json.dumps([t0, t1, t2, t3, t4, t5, t6, len(text)]) + "\\n")
    """
)


def section_cli_phases(path: str, runs: int) -> None:
    """Where the CLI's wall time goes, from inside a fresh process (same steps as cmd_check)."""
    env = child_env()
    cmd = [sys.executable, "-c", _PHASES_CHILD, path]
    subprocess.run(cmd, env=env, capture_output=True)
    names = [
        "interpreter + site",
        "import comfyquant.cli",
        "argparse build + parse",
        "import checker.run",
        "check() 1st call (lazy imports)",
        "render_report",
        "exit / teardown",
        "(check() 2nd call, same process)",
    ]
    samples: list[list[float]] = [[] for _ in names]
    for _ in range(runs):
        start = time.time()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        end = time.time()
        try:
            t = json.loads(out.stderr.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print("== 4b. CLI phases: skipped (" + (out.stderr.strip().splitlines() or ["no output"])[-1][:120] + ")\n")
            return
        marks = [start, *t[:6]]
        for i in range(6):
            samples[i].append(marks[i + 1] - marks[i])
        samples[6].append(end - t[5] - (t[6] - t[5]))
        samples[7].append(t[6] - t[5])
    bare_cmd = [sys.executable, "-c", "import time, sys; sys.stderr.write(repr(time.time()))"]
    bare: list[tuple[float, float]] = []
    for _ in range(runs):
        start = time.time()
        out = subprocess.run(bare_cmd, env=env, capture_output=True, text=True)
        end = time.time()
        t0 = float(out.stderr.strip())
        bare.append((t0 - start, end - t0))
    print(f"== 4b. CLI phases in a fresh process (wall clock, median of {runs} runs, ms)")
    rows = [[n, ms(med(v))] for n, v in zip(names, samples)]
    rows += [
        ["(bare python -c: interpreter + site)", ms(med([b[0] for b in bare]))],
        ["(bare python -c: exit / teardown)", ms(med([b[1] for b in bare]))],
    ]
    print(table(rows, ["phase", "ms"]))
    print("  'exit / teardown' = subprocess end seen by the parent minus the child's last mark (interpreter finalization")
    print("  and process reaping); os._exit() after flushing skips the finalization")
    print()


_MEM_CHILD = textwrap.dedent(
    """
    import json, mmap, os, resource, sys
    maps = []
    _mmap = mmap.mmap
    class _Spy(_mmap):
        def __new__(cls, *a, **k):
            maps.append(a[1] if len(a) > 1 else k.get("length"))
            return _mmap.__new__(cls, *a, **k)
    mmap.mmap = _Spy
    import comfyquant
    from comfyquant.checker import run  # noqa: F401  (imports before the baseline)
    from comfyquant.render import render_report
    def rss():
        with open("/proc/self/status") as fh:
            st = dict(l.split(":", 1) for l in fh if ":" in l)
        return int(st["VmRSS"].split()[0]), int(st["VmHWM"].split()[0])
    before = rss()
    rep = comfyquant.check(sys.argv[1:])
    render_report(rep)
    after = rss()
    io = rep.io
    print(json.dumps({"rss_before_kb": before[0], "rss_after_kb": after[0], "hwm_kb": after[1],
                      "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "mmaps": maps, "reads": sum(v["requests"] for v in io.values()),
                      "bytes_read": sum(v["bytes"] for v in io.values()), "ok": rep.ok}))
    """
)


def section_memory(big: Built, small_path: str) -> None:
    lay, path = big, big.path
    apparent, used = disk_usage(path)
    print("== 5. Memory (subprocess; VmRSS / peak RSS in MiB)")
    rows = []
    for label, p in ((f"{lay.name} ({apparent / 1e9:.1f} GB, 1 file)", path), ("wan14b-w4a8 1x, 4 shards", small_path)):
        out = subprocess.run([sys.executable, "-c", _MEM_CHILD, p], env=child_env(), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  {label}: child failed: {out.stderr.strip()[-400:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            [
                label,
                f"{r['rss_before_kb'] / 1024:.1f}",
                f"{r['rss_after_kb'] / 1024:.1f}",
                f"{r['hwm_kb'] / 1024:.1f}",
                f"{(r['hwm_kb'] - r['rss_before_kb']) / 1024:.1f}",
                len(r["mmaps"]),
                r["reads"],
                f"{r['bytes_read'] / 1024:.0f} KiB",
                "ok" if r["ok"] else "ERRORS",
            ]
        )
    print(table(rows, ["checkpoint", "RSS before", "RSS after", "peak", "peak-before", "mmap calls", "reads", "read", "result"]))
    print(f"  the big file occupies {used / 1024:.0f} KiB on disk; a whole-file map or read would show GBs here")
    print()


def section_importtime(path: str, runs: int = 5) -> None:
    script = console_script()
    env = child_env()
    subprocess.run([sys.executable, script, "check", path], env=env, capture_output=True)
    selfs: dict[str, list[int]] = {}
    cums: dict[str, list[int]] = {}
    top: set[str] = set()
    owner: dict[str, str] = {}
    """module -> the top-level import that pulled it in (site, comfyquant.cli, ...)."""
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", script, "check", path], env=env, capture_output=True, text=True
        ).stderr
        pending: list[str] = []  # -X importtime prints children before their parent
        for line in err.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            s, c, name = line[len("import time:") :].split("|", 2)
            level = (len(name) - len(name.lstrip(" ")) - 1) // 2
            name = name.strip()
            selfs.setdefault(name, []).append(int(s))
            cums.setdefault(name, []).append(int(c))
            pending.append(name)
            if level == 0:
                top.add(name)
                for n in pending:
                    owner[n] = name
                pending = []

    def ms_(xs):
        return f"{med(xs) / 1e3:7.2f}"

    print(
        f"== 6. Import time of the CLI (python -X importtime {os.path.basename(script)} check <wan 4 shards>, "
        f"median of {runs}, ms; -X importtime inflates absolute numbers)"
    )
    ours = [n for n in top if not n.startswith("comfyquant")]
    cq = [n for n in top if n.startswith("comfyquant")]
    print(
        f"  top-level imports: {sum(med(cums[n]) for n in top) / 1e3:.1f} ms; of which comfyquant.* trees "
        f"{sum(med(cums[n]) for n in cq) / 1e3:.1f} ms, interpreter/site {sum(med(cums[n]) for n in ours) / 1e3:.1f} ms"
    )
    rows = [[n, ms_(cums[n]), ms_(selfs[n])] for n in sorted(top, key=lambda n: -med(cums[n]))[:12]]
    print(table(rows, ["top-level import", "cumul", "self"]))
    inside = [n for n, o in owner.items() if o.startswith("comfyquant")]
    rows = [[n, owner[n], ms_(selfs[n]), ms_(cums[n])] for n in sorted(inside, key=lambda n: -med(selfs[n]))[:20]]
    print(table(rows, ["module imported for comfyquant (by self)", "pulled in by", "self", "cumul"]))
    rows = [
        [n, owner[n], ms_(selfs[n]), ms_(cums[n])]
        for n in sorted((n for n in owner if not owner[n].startswith("comfyquant")), key=lambda n: -med(selfs[n]))[:8]
    ]
    print(table(rows, ["module imported at interpreter start (by self)", "pulled in by", "self", "cumul"]))
    print()


def section_profile(path: str, iters: int = 10) -> None:
    check_cold(path)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        check_cold(path)
    prof.disable()
    st = pstats.Stats(prof)
    entries = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():
        where = file
        if "comfyquant" in file:
            where = "comfyquant/" + file.split("comfyquant/", 1)[-1]
        elif file.startswith("/"):
            where = os.path.basename(file)
        entries.append((f"{func} ({where}:{line})", nc / iters, tt / iters * 1e3, ct / iters * 1e3))
    total = max(e[3] for e in entries)
    print(
        f"== 7. cProfile of comfyquant.check({HEADLINE}, cold), per call, {iters} calls "
        f"(profiled total {total:.1f} ms/call; profiling inflates ~2x)"
    )
    rows = [[n[:90], f"{c:.0f}", f"{tt:7.2f}", f"{ct:7.2f}"] for n, c, tt, ct in sorted(entries, key=lambda e: -e[3])[:25]]
    print(table(rows, ["function (by cumulative)", "calls", "self ms", "cumul ms"]))
    print()
    rows = [[n[:90], f"{c:.0f}", f"{tt:7.2f}", f"{ct:7.2f}"] for n, c, tt, ct in sorted(entries, key=lambda e: -e[2])[:20]]
    print(table(rows, ["function (by self time)", "calls", "self ms", "cumul ms"]))
    print()


INSTR_CHILD = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
import check_speed as cs
import layouts
gc.disable()
what, path, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
files = layouts.shard_files(path)
for _ in range(n):
    if what == "floor":
        cs.floor_read(files)
    elif what == "check":
        cs.check_cold(path)
    elif what == "nodialects":
        with cs.no_dialects():
            cs.check_cold(path)
    else:
        cs.clear_caches()
        cs.comfyquant.check(files)
"""


def instructions(what: str, path: str, n: int) -> int:
    """Instructions executed by ``n`` calls (valgrind's callgrind: deterministic, unlike time)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            INSTR_CHILD,
            os.path.dirname(os.path.abspath(__file__)),
            what,
            path,
            str(n),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split("Collected :")[1])
    raise RuntimeError("no instruction count in valgrind's output")


def section_instructions(built: dict) -> None:
    """The same ratio counted in CPU instructions: noise-free on a shared machine (one call's
    count = count(1 + 3 calls) - count(1 call), divided by 3; interpreter start cancels out)."""
    if shutil.which("valgrind") is None:
        print("== 2c. instruction counts: skipped (valgrind not installed)\n")
        return
    rows = []
    for name in (HEADLINE, "flux-w4a8-1sh"):
        if name not in built:
            continue
        path = built[name].path
        per = {w: (instructions(w, path, 4) - instructions(w, path, 1)) / 3 for w in ("floor", "check", "files")}
        rows.append(
            [
                name,
                f"{per['floor'] / 1e6:7.1f}",
                f"{per['check'] / 1e6:7.1f}",
                f"{per['check'] / per['floor']:.2f}x",
                f"{per['files'] / 1e6:7.1f}",
                f"{per['files'] / per['floor']:.2f}x",
            ]
        )
    print("== 2c. Instructions per call (valgrind callgrind, millions; deterministic)")
    print(table(rows, ["layout", "floor", "check", "ratio", "check(files)", "ratio"]))
    print("  check(files) is given the shard list, so it reads no index.json (the floor reads none)\n")


@contextlib.contextmanager
def no_dialects():
    """``check`` with dialect detection switched off (no dialect package asked): what detection
    costs is the difference."""
    from comfyquant.dialects import registry

    saved = dict(registry.DIALECTS)
    registry.DIALECTS.clear()
    try:
        yield
    finally:
        registry.DIALECTS.update(saved)


def section_dialects(built: dict, rounds: int) -> None:
    """Dialect detection on marker files (which no dialect claims) must add <= 5% to check:
    interleaved timings, and where valgrind is installed, instruction counts."""
    print(
        f"== 2d. Dialect detection on marker files (median of {rounds} interleaved rounds; "
        f"target: check <= {1 + DIALECT_BUDGET:.2f}x check without detection)"
    )
    rows = []
    for name, lay in built.items():
        path = lay.path

        def without(p=path):
            with no_dialects():
                check_cold(p)

        times = interleaved({"without": without, "check": lambda p=path: check_cold(p)}, rounds)
        ratio = ratio_of(times, "check", "without")
        rows.append(
            [
                name,
                ms(med(times["without"])),
                ms(med(times["check"])),
                f"{ratio:5.3f}x",
                "PASS" if ratio <= 1 + DIALECT_BUDGET else "FAIL",
            ]
        )
    print(table(rows, ["layout", "no detection", "check", "ratio", f"<= {1 + DIALECT_BUDGET:.2f}x"]))
    if shutil.which("valgrind") is not None and HEADLINE in built:
        path = built[HEADLINE].path
        per = {w: (instructions(w, path, 4) - instructions(w, path, 1)) / 3 for w in ("nodialects", "check")}
        print(
            f"  instructions per call ({HEADLINE}): {per['nodialects'] / 1e6:.1f}M without detection, "
            f"{per['check'] / 1e6:.1f}M with: {per['check'] / per['nodialects']:.4f}x"
        )
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer layouts and rounds, no import/profile analysis")
    ap.add_argument("--out", metavar="DIR", help="build layouts here and keep them (default: a temp dir, removed)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds for in-process timings (default 15, quick 5)")
    ap.add_argument("--cli-runs", type=int, help="CLI subprocess runs per command (default 20, quick 8)")
    ap.add_argument("--no-safe-open", action="store_true", help="skip the SGLang-style safe_open timing (imports torch)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of sections to skip: inproc,instructions,dialects,safe_open,scaling,cli,memory,importtime,profile",
    )
    ap.add_argument("--child-safe-open", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_safe_open:
        return child_safe_open(int(args.child_safe_open[0]), args.child_safe_open[1:])
    rounds = args.rounds or (5 if args.quick else 15)
    cli_runs = args.cli_runs or (8 if args.quick else 20)
    skip = set(filter(None, args.skip.split(",")))
    if args.quick:
        skip |= {"importtime", "profile", "safe_open", "instructions"}
    if args.no_safe_open or not have_safetensors_torch():
        skip.add("safe_open")

    root = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="cq-bench-")
    t_start = time.perf_counter()
    print(f"comfyquant {comfyquant.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    try:
        built, scaling, big = build(root, args.quick)
        headline = built[HEADLINE].path
        gc.collect()  # the layouts' tensor lists are gone: the heap is about a CLI process's size
        if "inproc" not in skip:
            section_inprocess(built, rounds)
        if "instructions" not in skip:
            section_instructions(built)
        if "dialects" not in skip:
            section_dialects(built, rounds)
        if "safe_open" not in skip:
            section_safe_open(built, max(5, rounds // 2))
        if "scaling" not in skip:
            section_scaling(scaling, max(3, rounds * 2 // 3))
        if "cli" not in skip:
            section_cli(headline, cli_runs)
            section_cli_phases(headline, max(5, cli_runs // 2))
        if "memory" not in skip:
            section_memory(big, headline)
        if "importtime" not in skip:
            section_importtime(headline)
        if "profile" not in skip:
            section_profile(headline)
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)
    print(f"total bench time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
