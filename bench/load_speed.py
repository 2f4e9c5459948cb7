"""``comfyquant.torch`` against comfy-kitchen and safetensors, ratios measured in one run.

1. Forward: ``QuantLinear(x)`` against comfy-kitchen 0.2.40's forward of the same layer as
   ComfyUI runs it (``F.linear`` on its ``QuantizedTensor``, the activation quantized by the
   layout for FP8), per format, at 3072x3072 and 12288x3072 ([N, K], BF16 activations of
   ``--tokens`` rows).  NVFP4/MXFP8: comfy-kitchen has no CPU GEMM; the reference is then
   the emulation composed of its own quantize/dequantize primitives (what the tests compare
   against).  Rounds alternate between the two; the ratio is the median of the per-round
   ratios kitchen time / QuantLinear time (>= 1.0: QuantLinear at least as fast).  Target >= 1.0.
2. Load: a Flux-shaped stack of ``--blocks`` blocks (qkv 9216x3072, proj 3072x3072, fc1
   12288x3072, fc2 3072x12288, norms; random weights) written dense BF16 and quantized by
   ``comfyquant quantize`` to W4A8 and FP8.  Each measurement is a fresh process: the time
   and the peak RSS above the process's RSS before it (torch, safetensors, comfy-kitchen and
   comfyquant's torch modules imported: one-time costs) of
   * the model built on the meta device + ``load_quantized``,
   * the model constructed as usual (dense BF16, initialised) + ``safetensors.torch.load_file``
     of the same file -- the issue's yardstick for time --, one
     byte of every page then read (``load_file`` maps the file lazily: without the read it
     costs nothing and holds nothing),
   * the dense route users take today at best: the model on the meta device, ``load_file``
     of the BF16 file + ``load_state_dict(assign=True)``, every page read likewise.
   Rounds alternate; the time ratio is the median of per-round ratios.  Targets: peak RSS
   <= file size + largest layer dense + 300 MB; time <= 1.2x load_file.  The files sit in the
   page cache (written just before): times are warm-cache reads.

Usage: python bench/load_speed.py [--quick] [--rounds N] [--blocks B] [--tokens M] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F  # noqa: N812
from comfy_kitchen.backends.eager import quantization as ck_q
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
from torch import nn

from comfyquant.torch import QuantLinear, QuantWeight

SHAPES = [(3072, 3072), (12288, 3072)]
# name, layout, comfy-kitchen quantize kwargs, marker (what ComfyUI's writer puts in the file)
FORMATS = [
    ("fp8", "TensorCoreFP8Layout", {}, {"format": "float8_e4m3fn"}),
    ("int8_convrot", "TensorWiseINT8Layout", {"per_channel": True, "convrot": True, "convrot_groupsize": 256},
     {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}),
    ("w4a8", "AsymW4A8Int8Layout", {"group_size": 16, "convrot_groupsize": 256},
     {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}),
    ("w4a4", "TensorCoreConvRotW4A4Layout", {"convrot_groupsize": 256}, {"format": "convrot_w4a4", "convrot_groupsize": 256}),
    ("nvfp4", "TensorCoreNVFP4Layout", {}, {"format": "nvfp4"}),
    ("mxfp8", "TensorCoreMXFP8Layout", {}, {"format": "mxfp8"}),
]


def kitchen_forward(layout: str, q: QuantizedTensor, sd: dict, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """ComfyUI's forward with comfy-kitchen on CPU (emulated for the layouts it has no CPU GEMM for)."""
    if layout == "TensorCoreFP8Layout":
        xq, p = TensorCoreFP8Layout.quantize(x, scale=torch.tensor(1.0), dtype=torch.float8_e4m3fn)
        return F.linear(QuantizedTensor(xq, layout, p), q, bias)
    if layout == "TensorCoreNVFP4Layout":
        s_in = (torch.amax(x.abs()) / 2688.0).to(torch.float32)
        xq, xs = ck_q.quantize_nvfp4(x, s_in, pad_16x=True)
        xd = ck_q.dequantize_nvfp4(xq, s_in, xs, torch.float32)[: x.shape[0], : x.shape[1]]
        wd = ck_q.dequantize_nvfp4(sd["weight"], sd["weight_scale_2"], sd["weight_scale"], torch.float32)
        return F.linear(xd, wd[: q.shape[0], : q.shape[1]], bias.float()).to(x.dtype)
    if layout == "TensorCoreMXFP8Layout":
        xq, xs = ck_q.quantize_mxfp8(x, pad_32x=True)
        xd = ck_q.dequantize_mxfp8(xq, xs, torch.float32)[: x.shape[0], : x.shape[1]]
        wd = ck_q.dequantize_mxfp8(sd["weight"], sd["weight_scale"], torch.float32)
        return F.linear(xd, wd[: q.shape[0], : q.shape[1]], bias.float()).to(x.dtype)
    return F.linear(x, q, bias)


def best(fn, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def bench_forward(rounds: int, tokens: int, shapes) -> list[dict]:
    rows = []
    for n, k in shapes:
        g = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        bias = (torch.randn(n, generator=g) * 0.01).to(torch.bfloat16)
        x = torch.randn(tokens, k, generator=g).to(torch.bfloat16)
        for name, layout, kwargs, marker in FORMATS:
            q = QuantizedTensor.from_float(w, layout, **kwargs)
            sd = q.state_dict("weight")
            layer = QuantLinear(QuantWeight(sd, marker, name), bias)
            y, y_ref = layer(x), kitchen_forward(layout, q, sd, x, bias)
            same = torch.equal(y.view(torch.int16), y_ref.view(torch.int16))
            ratios, ours, theirs = [], [], []
            for r in range(rounds):
                ours_first = r % 2 == 0  # alternate which one runs first in a round
                if ours_first:
                    a = best(lambda: layer(x), 2)  # noqa: B023
                b = best(lambda: kitchen_forward(layout, q, sd, x, bias), 2)  # noqa: B023
                if not ours_first:
                    a = best(lambda: layer(x), 2)  # noqa: B023
                ours.append(a)
                theirs.append(b)
                ratios.append(b / a)
            row = {"format": name, "shape": [n, k], "tokens": tokens, "quantlinear_ms": 1e3 * statistics.median(ours),
                   "kitchen_ms": 1e3 * statistics.median(theirs), "ratio": statistics.median(ratios),
                   "bit_identical": same, "compute": layer.compute()[0]}
            rows.append(row)
            print(f"  {name:13s} {n:5d}x{k:<5d} QuantLinear {row['quantlinear_ms']:8.2f} ms  kitchen {row['kitchen_ms']:8.2f} ms"
                  f"  ratio {row['ratio']:.3f}  bit-identical {same}  ({row['compute']})", flush=True)
    return rows


class Block(nn.Module):
    def __init__(self, d: int = 3072, mlp: int = 12288) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, dtype=torch.bfloat16)
        self.qkv = nn.Linear(d, 3 * d, dtype=torch.bfloat16)
        self.proj = nn.Linear(d, d, dtype=torch.bfloat16)
        self.fc1 = nn.Linear(d, mlp, dtype=torch.bfloat16)
        self.fc2 = nn.Linear(mlp, d, dtype=torch.bfloat16)


class Stack(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])


CHILD = r"""
import json, os, sys, time, torch
sys.path.insert(0, {bench!r})
from load_speed import Stack, rss, touch
op, path, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])
# one-time imports (paid once per process, not per load) before the baseline
import comfyquant.torch.load, comfyquant.torch.linear, comfyquant.formats.codec, comfy_kitchen.tensor, safetensors.torch
import comfyquant.checker.run, comfyquant.dialects.view, comfyquant.gate, comfyquant.dialects.registry, comfyquant.targets.select
from comfyquant.torch.linear import QuantLinear
before = rss()["VmRSS"]
t = time.perf_counter()
if op == "load_quantized":
    with torch.device("meta"):
        model = Stack(blocks)
    comfyquant.torch.load_quantized(model, path)
elif op == "load_file":
    model = Stack(blocks)  # the model constructed as usual (dense BF16, initialised), then the file
    sd = safetensors.torch.load_file(path)
    touch(sd.values())
else:
    with torch.device("meta"):
        model = Stack(blocks)
    sd = safetensors.torch.load_file(path)
    model.load_state_dict(sd, assign=True)
    del sd
    touch(model.state_dict().values())
seconds = time.perf_counter() - t
print(json.dumps({{"seconds": seconds, "before": before, "peak": rss()["VmHWM"]}}))
"""


def touch(tensors) -> None:
    """Read one byte per page of every tensor: ``load_file`` maps the file and reads nothing
    until a tensor is used, so its time and memory are measured once the data is in memory."""
    for t in tensors:
        if t.numel():
            flat = t.reshape(-1).view(torch.uint8)
            int(flat[::4096].sum()) + int(flat[-1])


def rss() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def child(op: str, path: str, blocks: int) -> dict:
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code, op, path, str(blocks)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"child {op} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_load(folder: str, blocks: int, rounds: int) -> list[dict]:
    from safetensors.torch import save_file

    import comfyquant

    torch.manual_seed(0)
    model = Stack(blocks)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)
    dense = os.path.join(folder, "dense.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, dense)
    largest = max(p.numel() * 2 for p in model.parameters())
    del model
    rows = []
    for fmt in ("w4a8", "float8_e4m3fn"):
        path = os.path.join(folder, f"{fmt}.safetensors")
        t = time.perf_counter()
        comfyquant.quantize(dense, path, format=fmt, jobs=2, progress=False)
        print(f"  wrote {fmt} in {time.perf_counter() - t:.1f} s", flush=True)
        size = os.path.getsize(path)
        runs: dict[str, list[dict]] = {"load_quantized": [], "load_file": [], "dense_bf16": []}
        ratios = []
        for _ in range(rounds):
            a = child("load_quantized", path, blocks)
            b = child("load_file", path, blocks)
            c = child("dense_bf16", dense, blocks)
            runs["load_quantized"].append(a)
            runs["load_file"].append(b)
            runs["dense_bf16"].append(c)
            ratios.append(a["seconds"] / b["seconds"])
        med = {op: {"seconds": statistics.median(r["seconds"] for r in rs),
                    "peak_above_start": statistics.median(r["peak"] - r["before"] for r in rs)} for op, rs in runs.items()}
        bound = size + largest + 300 * 2**20
        row = {"format": fmt, "blocks": blocks, "file_bytes": size, "dense_file_bytes": os.path.getsize(dense),
               "largest_layer_dense_bytes": largest, "bound_bytes": bound, "time_ratio_vs_load_file": statistics.median(ratios),
               **{op: v for op, v in med.items()}}
        rows.append(row)
        mib = 2**20
        print(f"  {fmt:14s} file {size / mib:7.0f} MiB  load_quantized {med['load_quantized']['seconds']:6.2f} s "
              f"peak +{med['load_quantized']['peak_above_start'] / mib:6.0f} MiB (bound {bound / mib:.0f})  | load_file "
              f"{med['load_file']['seconds']:6.2f} s peak +{med['load_file']['peak_above_start'] / mib:6.0f} MiB  | dense BF16 "
              f"{med['dense_bf16']['seconds']:6.2f} s peak +{med['dense_bf16']['peak_above_start'] / mib:6.0f} MiB  "
              f"| time ratio {row['time_ratio_vs_load_file']:.2f}x", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, one block, the small shape only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", help="folder for load_speed.json (created)")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    blocks = 1 if args.quick else args.blocks
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("1. forward (BF16 activations)")
    forward = bench_forward(rounds, args.tokens, SHAPES[:1] if args.quick else SHAPES)
    print(f"2. load ({blocks} Flux-shaped blocks)")
    folder = tempfile.mkdtemp(prefix="load_speed_")
    try:
        load = bench_load(folder, blocks, rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "load_speed.json"), "w") as fh:
            json.dump({"forward": forward, "load": load}, fh, indent=2)


if __name__ == "__main__":
    main()
