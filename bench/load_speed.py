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
     of the same file -- the yardstick for time --, one
     byte of every page then read (``load_file`` maps the file lazily: without the read it
     costs nothing and holds nothing),
   * the dense route users take today at best: the model on the meta device, ``load_file``
     of the BF16 file + ``load_state_dict(assign=True)``, every page read likewise.
   Rounds alternate; the time ratio is the median of per-round ratios.  Targets: peak RSS
   <= file size + largest layer dense + 300 MB; time <= 1.2x load_file.  The files sit in the
   page cache (written just before): times are warm-cache reads.

3. diffusers: ``comfyquant.diffusers.load_transformer`` of a Flux.1-shaped checkpoint
   (``FluxTransformer2DModel``'s real shapes, ``--flux-blocks`` double blocks and twice as many
   single blocks; the full model is 19 + 38) in ComfyUI names, W4A8 and FP8 (random weights:
   each distinct layer shape is encoded once by the format's codec and its tensors reused), in
   fresh processes as in 2:
   * ``load_transformer`` (config from a local folder),
   * the yardstick for time: ``FluxTransformer2DModel.from_config`` (constructed as usual) +
     ``safetensors.torch.load_file`` of the same file, every page read,
   * beside it, what diffusers users run today: ``from_single_file`` of the BF16 file of the
     same model (what ``comfyquant dequantize`` gives).
   Targets: peak RSS <= file size + largest layer dense + 300 MB; time <= 1.2x the yardstick.
   The overhead above the file size does not grow with the blocks (one layer in flight), so
   the figure for the full model is printed from the measured overhead.

Usage: python bench/load_speed.py [--quick] [--rounds N] [--blocks B] [--tokens M] [--out DIR]
                                  [--sections 1,2,3] [--flux-blocks F]
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
    (
        "int8_convrot",
        "TensorWiseINT8Layout",
        {"per_channel": True, "convrot": True, "convrot_groupsize": 256},
        {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256},
    ),
    (
        "w4a8",
        "AsymW4A8Int8Layout",
        {"group_size": 16, "convrot_groupsize": 256},
        {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256},
    ),
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
            row = {
                "format": name,
                "shape": [n, k],
                "tokens": tokens,
                "quantlinear_ms": 1e3 * statistics.median(ours),
                "kitchen_ms": 1e3 * statistics.median(theirs),
                "ratio": statistics.median(ratios),
                "bit_identical": same,
                "compute": layer.compute()[0],
            }
            rows.append(row)
            print(
                f"  {name:13s} {n:5d}x{k:<5d} QuantLinear {row['quantlinear_ms']:8.2f} ms  kitchen {row['kitchen_ms']:8.2f} ms"
                f"  ratio {row['ratio']:.3f}  bit-identical {same}  ({row['compute']})",
                flush=True,
            )
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
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"), os.environ.get("PYTHONPATH", "")]),
    )
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
        med = {
            op: {
                "seconds": statistics.median(r["seconds"] for r in rs),
                "peak_above_start": statistics.median(r["peak"] - r["before"] for r in rs),
            }
            for op, rs in runs.items()
        }
        bound = size + largest + 300 * 2**20
        row = {
            "format": fmt,
            "blocks": blocks,
            "file_bytes": size,
            "dense_file_bytes": os.path.getsize(dense),
            "largest_layer_dense_bytes": largest,
            "bound_bytes": bound,
            "time_ratio_vs_load_file": statistics.median(ratios),
            **{op: v for op, v in med.items()},
        }
        rows.append(row)
        mib = 2**20
        print(
            f"  {fmt:14s} file {size / mib:7.0f} MiB  load_quantized {med['load_quantized']['seconds']:6.2f} s "
            f"peak +{med['load_quantized']['peak_above_start'] / mib:6.0f} MiB (bound {bound / mib:.0f})  | load_file "
            f"{med['load_file']['seconds']:6.2f} s peak +{med['load_file']['peak_above_start'] / mib:6.0f} MiB  | dense BF16 "
            f"{med['dense_bf16']['seconds']:6.2f} s peak +{med['dense_bf16']['peak_above_start'] / mib:6.0f} MiB  "
            f"| time ratio {row['time_ratio_vs_load_file']:.2f}x",
            flush=True,
        )
    return rows


# -- 3. diffusers ---------------------------------------------------------------------------------

FLUX_CONFIG = dict(
    patch_size=1,
    in_channels=64,
    num_attention_heads=24,
    attention_head_dim=128,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=[16, 56, 56],
)
FLUX_DENSE = ("time_in.", "vector_in.", "guidance_in.", "txt_in.", "img_in.", "final_layer.")
"""Layers a Flux file keeps dense (embedders and the final layer, as ComfyUI's fp8mixed files do)."""


def flux_comfy_shapes(blocks: int) -> dict[str, tuple]:
    """ComfyUI/BFL tensor names and shapes of Flux.1 with ``blocks`` double blocks and twice as
    many single blocks (diffusers' converter's own names)."""
    d, mlp = 3072, 12288
    shapes: dict[str, tuple] = {}

    def lin(name, n, k, bias=True):
        shapes[f"{name}.weight"] = (n, k)
        if bias:
            shapes[f"{name}.bias"] = (n,)

    for a, k in (("time_in", 256), ("vector_in", 768), ("guidance_in", 256)):
        lin(f"{a}.in_layer", d, k)
        lin(f"{a}.out_layer", d, d)
    lin("txt_in", d, 4096)
    lin("img_in", d, 64)
    for i in range(blocks):
        b = f"double_blocks.{i}"
        for s in ("img", "txt"):
            lin(f"{b}.{s}_mod.lin", 6 * d, d)
            lin(f"{b}.{s}_attn.qkv", 3 * d, d)
            lin(f"{b}.{s}_attn.proj", d, d)
            lin(f"{b}.{s}_mlp.0", mlp, d)
            lin(f"{b}.{s}_mlp.2", d, mlp)
            shapes[f"{b}.{s}_attn.norm.query_norm.scale"] = (128,)
            shapes[f"{b}.{s}_attn.norm.key_norm.scale"] = (128,)
    for i in range(2 * blocks):
        b = f"single_blocks.{i}"
        lin(f"{b}.modulation.lin", 3 * d, d)
        lin(f"{b}.linear1", 3 * d + mlp, d)
        lin(f"{b}.linear2", d, d + mlp)
        shapes[f"{b}.norm.query_norm.scale"] = (128,)
        shapes[f"{b}.norm.key_norm.scale"] = (128,)
    lin("final_layer.linear", 64, d)
    lin("final_layer.adaLN_modulation.1", 2 * d, d)
    return shapes


def write_flux_files(folder: str, blocks: int) -> dict[str, str]:
    """The BF16 file and the W4A8 / FP8 files (ComfyUI prefix, markers as tensors), written
    tensor by tensor through comfyquant's writer (no whole-model copy in this process)."""
    from comfyquant import codecs
    from comfyquant.io.writer import write_safetensors
    from comfyquant.numerics.dtypes import DTYPE_NAMES, to_bytes

    shapes = flux_comfy_shapes(blocks)
    prefix = "model.diffusion_model."
    g = torch.Generator().manual_seed(0)
    dense_of: dict[tuple, torch.Tensor] = {}  # one random tensor per shape: real shapes, reused values

    def dense(shape):
        if shape not in dense_of:
            dense_of[shape] = (torch.randn(shape, generator=g) * (0.02 if len(shape) == 2 else 0.1)).to(torch.bfloat16)
        return dense_of[shape]

    def entry(t):
        t = t.contiguous()
        return (DTYPE_NAMES[t.dtype], tuple(t.shape), lambda: (to_bytes(t),))  # bytes made while writing

    paths = {"bf16": os.path.join(folder, "flux_bf16.safetensors")}
    write_safetensors(paths["bf16"], {prefix + k: entry(dense(v)) for k, v in shapes.items()})
    for fmt, params in (("w4a8", {"group_size": 16, "convrot_groupsize": 256}), ("fp8", {})):
        name = {"w4a8": "asym_w4a8_int8", "fp8": "float8_e4m3fn"}[fmt]
        codec = codecs.get(name)
        encoded: dict[tuple, object] = {}
        entries: dict = {}
        for k, shape in shapes.items():
            layer = k.rsplit(".", 1)[0]
            if len(shape) != 2 or k.startswith(FLUX_DENSE):
                entries[prefix + k] = entry(dense(shape))
                continue
            if shape not in encoded:
                encoded[shape] = codec.encode(dense(shape), **params)
            enc = encoded[shape]
            for suffix, t in enc.items():
                entries[f"{prefix}{layer}.{suffix}"] = entry(t)
            marker = torch.tensor(list(json.dumps(enc.marker).encode()), dtype=torch.uint8)
            entries[f"{prefix}{layer}.comfy_quant"] = entry(marker)
        paths[fmt] = os.path.join(folder, f"flux_{fmt}.safetensors")
        write_safetensors(paths[fmt], entries)
        del encoded, entries
    return paths


FLUX_CHILD = r"""
import json, os, sys, time, torch
sys.path.insert(0, {bench!r})
from load_speed import rss, touch, FLUX_CONFIG
op, path, blocks, cfg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
# one-time imports before the baseline (paid once per process, not per load)
import diffusers, safetensors.torch, comfy_kitchen.tensor
import comfyquant.diffusers.load, comfyquant.torch.load, comfyquant.formats.codec
import comfyquant.checker.run, comfyquant.dialects.view, comfyquant.gate, comfyquant.dialects.registry, comfyquant.targets.select
from diffusers import FluxTransformer2DModel
config = dict(FLUX_CONFIG, num_layers=blocks, num_single_layers=2 * blocks)
before = rss()["VmRSS"]
t = time.perf_counter()
if op == "load_transformer":
    model = comfyquant.diffusers.load.load_transformer(path, FluxTransformer2DModel, config=cfg)
elif op == "construct_load_file":
    model = FluxTransformer2DModel.from_config(config).to(torch.bfloat16)
    sd = safetensors.torch.load_file(path)
    touch(sd.values())
else:
    model = FluxTransformer2DModel.from_single_file(path, config=cfg, torch_dtype=torch.bfloat16)
    touch(model.state_dict().values())
seconds = time.perf_counter() - t
print(json.dumps({{"seconds": seconds, "before": before, "peak": rss()["VmHWM"]}}))
"""


def flux_child(op: str, path: str, blocks: int, cfg: str) -> dict:
    code = FLUX_CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"), os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run([sys.executable, "-c", code, op, path, str(blocks), cfg], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"child {op} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_diffusers(folder: str, blocks: int, rounds: int) -> list[dict]:
    cfg = os.path.join(folder, "flux_config")
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, "config.json"), "w") as fh:
        json.dump(dict(FLUX_CONFIG, num_layers=blocks, num_single_layers=2 * blocks, _class_name="FluxTransformer2DModel"), fh)
    t = time.perf_counter()
    paths = write_flux_files(folder, blocks)
    print(f"  wrote the BF16, W4A8 and FP8 files in {time.perf_counter() - t:.1f} s", flush=True)
    shapes = flux_comfy_shapes(blocks)
    largest = max(n * k * 2 for n, k in (s for s in shapes.values() if len(s) == 2))
    full = flux_comfy_shapes(19)
    mib, gib = 2**20, 2**30
    rows = []
    for fmt in ("w4a8", "fp8"):
        path, size = paths[fmt], os.path.getsize(paths[fmt])
        runs: dict[str, list[dict]] = {"load_transformer": [], "construct_load_file": [], "from_single_file_bf16": []}
        ratios = []
        for _ in range(rounds):
            a = flux_child("load_transformer", path, blocks, cfg)
            b = flux_child("construct_load_file", path, blocks, cfg)
            c = flux_child("from_single_file_bf16", paths["bf16"], blocks, cfg)
            for op, r in zip(runs, (a, b, c)):
                runs[op].append(r)
            ratios.append(a["seconds"] / b["seconds"])
        med = {
            op: {
                "seconds": statistics.median(r["seconds"] for r in rs),
                "peak_above_start": statistics.median(r["peak"] - r["before"] for r in rs),
            }
            for op, rs in runs.items()
        }
        bound = size + largest + 300 * mib
        overhead = med["load_transformer"]["peak_above_start"] - size
        # the full model's file: this file scaled by its share of quantized bytes per block
        per_block = (size - _flux_file_bytes(shapes, fmt, 0)) / blocks
        full_size = _flux_file_bytes(full, fmt, 0) + per_block * 19
        row = {
            "format": fmt,
            "double_blocks": blocks,
            "single_blocks": 2 * blocks,
            "file_bytes": size,
            "bf16_file_bytes": os.path.getsize(paths["bf16"]),
            "largest_layer_dense_bytes": largest,
            "bound_bytes": bound,
            "time_ratio_vs_construct_load_file": statistics.median(ratios),
            "overhead_above_file_bytes": overhead,
            "full_flux_file_bytes_estimate": full_size,
            **med,
        }
        rows.append(row)
        lt, cl, fs = med["load_transformer"], med["construct_load_file"], med["from_single_file_bf16"]
        print(
            f"  {fmt:5s} file {size / mib:6.0f} MiB  load_transformer {lt['seconds']:6.2f} s peak +{lt['peak_above_start'] / mib:6.0f}"
            f" MiB (bound {bound / mib:.0f}, {'ok' if lt['peak_above_start'] <= bound else 'OVER'})  | construct + load_file "
            f"{cl['seconds']:6.2f} s peak +{cl['peak_above_start'] / mib:6.0f} MiB  | from_single_file BF16 "
            f"({os.path.getsize(paths['bf16']) / mib:.0f} MiB) {fs['seconds']:6.2f} s peak +{fs['peak_above_start'] / mib:6.0f} MiB"
            f"  | time ratio {row['time_ratio_vs_construct_load_file']:.2f}x",
            flush=True,
        )
        print(
            f"        overhead above the file {overhead / mib:.0f} MiB (a constant: one layer in flight); full Flux.1 "
            f"(19 + 38 blocks): file ~{full_size / gib:.1f} GiB -> peak ~{(full_size + overhead) / gib:.1f} GiB "
            f"(bound {(full_size + largest + 300 * mib) / gib:.1f} GiB); its BF16 file "
            f"{sum(_numel(s) for s in full.values()) * 2 / gib:.1f} GiB",
            flush=True,
        )
    return rows


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _flux_file_bytes(shapes: dict, fmt: str, _unused: int) -> int:
    """Bytes of the layers kept dense (embedders, final layer, norms, biases) in BF16."""
    return sum(_numel(s) * 2 for k, s in shapes.items() if len(s) != 2 or k.startswith(FLUX_DENSE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, one block, the small shape only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", help="folder for load_speed.json (created)")
    ap.add_argument("--sections", default="1,2,3", help="which sections to run (comma list of 1, 2, 3)")
    ap.add_argument(
        "--flux-blocks",
        type=int,
        default=2,
        help="section 3: Flux.1 double blocks (single blocks: twice as many; full model: 19)",
    )
    ap.add_argument("--tmp", help="folder for the temporary checkpoints (default: the system's)")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    blocks = 1 if args.quick else args.blocks
    sections = {int(x) for x in args.sections.split(",")}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()}")
    forward = load = flux = []
    if 1 in sections:
        print("1. forward (BF16 activations)")
        forward = bench_forward(rounds, args.tokens, SHAPES[:1] if args.quick else SHAPES)
    folder = tempfile.mkdtemp(prefix="load_speed_", dir=args.tmp)
    try:
        if 2 in sections:
            print(f"2. load ({blocks} Flux-shaped blocks)")
            load = bench_load(folder, blocks, rounds)
        if 3 in sections:
            flux_blocks = 1 if args.quick else args.flux_blocks
            print(f"3. diffusers load_transformer (Flux.1: {flux_blocks} double + {2 * flux_blocks} single blocks)")
            flux = bench_diffusers(folder, flux_blocks, rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "load_speed.json"), "w") as fh:
            json.dump({"forward": forward, "load": load, "diffusers": flux}, fh, indent=2)


if __name__ == "__main__":
    main()
