"""fix throughput on a multi-GB checkpoint with one broken layer, against ``cp`` of the same file
(and ``cp`` followed by ``sync``, since fix makes its output durable before renaming it).

Builds a real (not sparse) W4A8 checkpoint of ``--size-gb`` GB whose last layer carries the
seed defect (correction transposed and BF16), then runs, alternately, ``cp`` and
``comfyquant fix -o`` on it and prints the median wall time, throughput, their ratio, and the
peak RSS of ``fix`` against its target (2x the largest tensor + 200 MB).  Targets: fix
throughput >= 0.5x cp, peak RSS within the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from comfyquant.io.writer import build_header  # noqa: E402

MARKER = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True}


def build(path: str, size_gb: float) -> int:
    """Layers of 5120 x 13824 W4A8 until the size is reached; the last one is broken."""
    n, k, g = 5120, 13824, 16
    per_layer = n * k // 2 + n * k // g + 4 * n
    count = max(2, int(size_gb * 2**30 // per_layer))
    marker = json.dumps(MARKER).encode()
    tensors = {}
    for i in range(count):
        p = f"blocks.{i}.ffn"
        tensors[f"{p}.weight"] = ("I8", (n, k // 2), None)
        tensors[f"{p}.weight_s_rel"] = ("F8_E4M3", (n, k // g), None)
        tensors[f"{p}.weight_s_channel"] = ("F32", (n,), None)
        if i == count - 1:
            tensors[f"{p}.weight_correction"] = ("BF16", (n, k // g), None)  # the seed defect
        tensors[f"{p}.comfy_quant"] = ("U8", (len(marker),), marker)
    header = build_header(tensors, None)
    block = bytes([0x38]) * (8 << 20)
    with open(path, "wb") as fh:
        fh.write(header)
        for dtype, shape, data in tensors.values():
            if data is not None:
                fh.write(data)
                continue
            size = {"I8": 1, "F8_E4M3": 1, "F32": 4, "BF16": 2}[dtype]
            for d in shape:
                size *= d
            while size:
                chunk = block[: min(size, len(block))]
                fh.write(chunk)
                size -= len(chunk)
    return n * k // 2


def run(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and the child's peak RSS in bytes."""
    code = (
        "import resource, subprocess, sys, time, json;"
        "t = time.perf_counter(); r = subprocess.run(sys.argv[1:]); dt = time.perf_counter() - t;"
        "print(json.dumps([dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, r.returncode]))"
    )
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, check=True)
    dt, rss, rc = json.loads(out.stdout.strip().splitlines()[-1])
    if rc not in (0,):
        raise SystemExit(f"{cmd[0]} exited {rc}")
    return dt, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary folder)")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="cq-fix-bench-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "model.safetensors")
    try:
        largest = build(src, args.size_gb)
        size = os.path.getsize(src)
        exe = os.path.join(sysconfig.get_path("scripts"), "comfyquant")
        cps, syncs, fixes, rss = [], [], [], []
        for _ in range(args.rounds):
            dest = os.path.join(work, "copy.safetensors")
            dt, _ = run(["cp", src, dest])
            cps.append(dt)
            os.unlink(dest)
            dt, _ = run(["sh", "-c", f"cp '{src}' '{dest}' && sync '{dest}'"])
            syncs.append(dt)
            os.unlink(dest)
            dest = os.path.join(work, "fixed.safetensors")
            dt, peak = run([exe, "fix", src, "-o", dest])
            fixes.append(dt)
            rss.append(peak)
            os.unlink(dest)
        cp_s, fix_s, sync_s = statistics.median(cps), statistics.median(fixes), statistics.median(syncs)
        bound = 2 * largest + 200 * 2**20
        print(f"checkpoint: {size / 2**30:.2f} GiB, one broken layer; largest tensor {largest / 2**20:.0f} MiB")
        print(f"{'':14}{'median s':>10}{'GiB/s':>8}")
        print(f"{'cp':14}{cp_s:10.2f}{size / 2**30 / cp_s:8.2f}")
        print(f"{'cp + sync':14}{sync_s:10.2f}{size / 2**30 / sync_s:8.2f}")
        print(f"{'comfyquant fix':14}{fix_s:10.2f}{size / 2**30 / fix_s:8.2f}")
        print(f"throughput ratio fix/cp: {cp_s / fix_s:.2f}x (target >= 0.5x); fix/(cp + sync): {sync_s / fix_s:.2f}x")
        print("  fix fsyncs its output before the rename (cp does not) and reads it back to verify")
        print(
            f"peak RSS of fix: {max(rss) / 2**20:.0f} MiB; bound 2 x largest tensor + 200 MiB = {bound / 2**20:.0f} MiB "
            f"({'OK' if max(rss) <= bound else 'OVER'})"
        )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
