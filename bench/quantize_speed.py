"""Quantize throughput, error and peak memory: comfyquant quantize vs comfy-kitchen's quantizers.

One run builds a synthetic BF16 model (seeded Gaussian weights: 3072x3072 attention-like
and 3072x12288 / 12288x3072 MLP-like linears, with biases and norms) and, per format:

* runs ``comfyquant quantize`` end to end (read, encode, quality report, write, check,
  rename) in a fresh process, with ``--jobs 1`` and ``--jobs 2``, recording wall
  time, the mean relative L2 error of the decoded weights and the peak RSS of the main
  process and of the largest worker;
* times comfy-kitchen 0.2.40's ``QuantizedTensor.from_float`` on the same weights in a fresh
  process (compute only: no reading, writing or checking) and measures its error the same way.

Targets: W4A8 throughput >= 1.0x comfy-kitchen with equal or lower error; peak RSS
<= 3x the largest layer's dense size per job + 300 MB.

    python bench/quantize_speed.py [--formats w4a8,int8,...] [--keep DIR] [--repeat N] [--convert nvfp4:w4a8,...]

A convert section times ``convert FROM -> TO`` of a quantized copy of the same model against
``quantize dense -> TO`` (both end to end, one job).

The first section times the encoders alone, in this process, side by side with
comfy-kitchen on the same BF16 weights (3072x3072 and 5120x13824 by default): per format
the MB/s of both, the ratio (median of ``--rounds`` interleaved rounds) and whether every
stored tensor is bit-identical to comfy-kitchen's.  The target for W4A8 (codebook) and W6A8 is
>= 4x comfy-kitchen, bit-identical.

    python bench/quantize_speed.py --encoders-only [--shapes 3072x3072,5120x13824] [--rounds 3]

The end-to-end section quantizes a Flux-shaped slice -- ``--slice D,S``
FLUX.1 double blocks (image and text streams: qkv 9216x3072, proj 3072x3072, mlp
12288x3072 / 3072x12288) and single blocks (linear1 21504x3072, linear2 3072x15360), 2,2 by
default -- with ``quantize --jobs 1`` (one core), ``--jobs 2`` and the default ``auto``, each
run a fresh process timed by the wall clock, beside the encoder alone on the same weights
(``codec.encode`` on each weight already in memory) on one torch thread and on every core,
interleaved over ``--e2e-rounds`` rounds; it prints the ratios end-to-end / encoder-only on
the same cores (target >= 0.8) and jobs 2 / jobs 1 (target >= 1.7 on two cores) and the
peak RSS against its budget.

    python bench/quantize_speed.py --e2e-only [--e2e w4a8,w6a8] [--slice 2,2] [--e2e-rounds 3]

``--repeat N`` runs every child N times, alternating comfy-kitchen and comfyquant, and keeps
each side's fastest run and largest peak RSS: on a shared machine one run of either side
can be slowed by the neighbours' jobs (comfy-kitchen's own rate varied 7.5-9.8 MB/s
between single runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

LAYERS = (
    ("blocks.0.attn.qkv", 3072, 3072),
    ("blocks.0.attn.out", 3072, 3072),
    ("blocks.0.mlp.fc1", 12288, 3072),
    ("blocks.0.mlp.fc2", 3072, 12288),
)
KITCHEN = {
    "w4a8": ("AsymW4A8Int8Layout", {}),
    "int8": ("TensorWiseINT8Layout", {"per_channel": True, "convrot": True}),
    "w4a4": ("TensorCoreConvRotW4A4Layout", {}),
    "nvfp4": ("TensorCoreNVFP4Layout", {}),
    "mxfp8": ("TensorCoreMXFP8Layout", {}),
    "fp8": ("TensorCoreFP8Layout", {}),
}
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
"""As the command line sets it before torch loads (comfyquant/numerics/waits.py): this process
and every child (encoder alone, comfy-kitchen, quantize) wait the same way at OpenMP barriers."""
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
"""The children's wall clock includes their start-up (quantize's, and its workers' with
``--jobs 2``): they import compiled modules, as an installed comfyquant does, instead of
compiling every module again in every process (what PYTHONDONTWRITEBYTECODE makes a source
checkout do)."""
MB = 1 << 20
"""Sizes and RSS are binary (MiB); rates are decimal MB/s (comfyquant's one convention)."""
ENCODERS = {
    # row: (comfyquant format, its encode params, comfy-kitchen layout, its from_float kwargs)
    "w4a8": ("asym_w4a8_int8", {}, "AsymW4A8Int8Layout", {}),
    "w6a8": ("asym_w4a8_int8", {"codebook": False, "bits": 6}, "AsymW4A8Int8Layout", {"codebook": False, "bits": 6}),
    "w4a8-uniform": ("asym_w4a8_int8", {"codebook": False}, "AsymW4A8Int8Layout", {"codebook": False}),
    "w4a8-asym": (
        "asym_w4a8_int8",
        {"codebook": False, "symmetric": False},
        "AsymW4A8Int8Layout",
        {"codebook": False, "symmetric": False},
    ),
    "int8": (
        "int8_tensorwise",
        {"per_channel": True, "convrot": True, "convrot_groupsize": 256},
        "TensorWiseINT8Layout",
        {"per_channel": True, "convrot": True},
    ),
    "w4a4": ("convrot_w4a4", {}, "TensorCoreConvRotW4A4Layout", {}),
    "nvfp4": ("nvfp4", {}, "TensorCoreNVFP4Layout", {}),
    "mxfp8": ("mxfp8", {}, "TensorCoreMXFP8Layout", {}),
    "fp8": ("float8_e4m3fn", {}, "TensorCoreFP8Layout", {}),
}


def encoder_section(shapes: list[tuple[int, int]], names: list[str], rounds: int) -> list[dict]:
    """Encoder-only MB/s of comfyquant and comfy-kitchen, interleaved in this process.

    Each round times comfy-kitchen then comfyquant on the same weight (the order alternates
    between rounds, so neither side always runs after the other's memory traffic); the
    ratio is the median of the rounds' ratios, the rates the medians of the rounds' rates.
    Bit-exactness compares every tensor of the layout's ``state_dict`` with comfyquant's."""
    import statistics

    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from comfyquant import codecs

    rows = []
    for n, k in shapes:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)
        mb = w.numel() * w.element_size() / MB
        for name in names:
            fmt, params, layout, kwargs = ENCODERS[name]
            codec = codecs.get(fmt)

            def ours(codec=codec, params=params, w=w):
                return codec.encode(w, **dict(params))

            def theirs(layout=layout, kwargs=kwargs, w=w):
                return QuantizedTensor.from_float(w, layout, **kwargs).state_dict("weight")

            times: dict[str, list[float]] = {"cq": [], "ck": []}
            outputs = {}
            for r in range(max(1, rounds)):
                order = (("ck", theirs), ("cq", ours)) if r % 2 == 0 else (("cq", ours), ("ck", theirs))
                for side, fn in order:
                    t0 = time.perf_counter()
                    out = fn()
                    times[side].append(time.perf_counter() - t0)
                    if r == 0:
                        outputs[side] = out
                    del out
            ref, enc = outputs["ck"], outputs["cq"]
            same = set(ref) == set(enc) and all(
                ref[s].dtype == enc[s].dtype
                and ref[s].shape == enc[s].shape
                and torch.equal(ref[s].reshape(-1).view(torch.uint8), enc[s].reshape(-1).view(torch.uint8))
                for s in ref
            )
            del outputs, ref, enc
            ratios = [b / a for a, b in zip(times["cq"], times["ck"])]
            row = {
                "shape": f"{n}x{k}",
                "format": name,
                "cq": mb / statistics.median(times["cq"]),
                "ck": mb / statistics.median(times["ck"]),
                "ratio": statistics.median(ratios),
                "exact": same,
            }
            rows.append(row)
            print(
                f"{row['shape']:>11} {name:<13} {row['cq']:>9.1f} {row['ck']:>9.1f} {row['ratio']:>6.2f}x "
                f"{'yes' if same else 'NO':>9}",
                flush=True,
            )
    return rows


DOUBLE = (
    ("img_attn.qkv", 9216, 3072),
    ("img_attn.proj", 3072, 3072),
    ("img_mlp.0", 12288, 3072),
    ("img_mlp.2", 3072, 12288),
    ("txt_attn.qkv", 9216, 3072),
    ("txt_attn.proj", 3072, 3072),
    ("txt_mlp.0", 12288, 3072),
    ("txt_mlp.2", 3072, 12288),
)
SINGLE = (("linear1", 21504, 3072), ("linear2", 3072, 15360))
"""FLUX.1's linear shapes: a double block's image and text streams, a single block's two linears."""


def measure_section(names: list[str], n: int, k: int, rounds: int) -> None:
    """The quality measurement's decode + forward: ``Codec.measure_blocks`` (one pass, shared
    per-block work) against iter_decode and a blocked ``linear`` run one after the other (the
    previous measurement), interleaved in this process, median of ``rounds``."""
    import statistics

    import torch

    from comfyquant import codecs
    from comfyquant.numerics.rows import encode_block_elements

    blocks = encode_block_elements()
    print(
        f"quality measurement, decode + quantized forward of one {n}x{k} BF16 layer (16 input rows), "
        f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.2f}, median of {rounds} rounds"
    )
    for name in names:
        fmt, params, _layout, _kwargs = ENCODERS[name]
        codec = codecs.get(fmt)
        w = (torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * k**-0.5).to(torch.bfloat16)
        enc = codec.encode(w, layer="l", **dict(params))
        tensors, marker = dict(enc), enc.marker
        x = torch.randn(16, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)

        def apart(tensors=tensors, marker=marker, x=x, codec=codec):
            for _ in codec.iter_decode(tensors, marker, dtype=torch.bfloat16, block_elements=blocks, exact=False):
                pass
            codec.linear(x, tensors, marker, block_elements=blocks)

        def one_pass(tensors=tensors, marker=marker, x=x, codec=codec):
            for _ in codec.measure_blocks(tensors, x, marker, dtype=torch.bfloat16, block_elements=blocks):
                pass

        times: dict[str, list[float]] = {"apart": [], "one": []}
        for r in range(max(1, rounds)):
            order = [("apart", apart), ("one", one_pass)]
            for kind, fn in order[r % 2 :] + order[: r % 2]:
                t0 = time.perf_counter()
                fn()
                times[kind].append(time.perf_counter() - t0)
        a, o = statistics.median(times["apart"]), statistics.median(times["one"])
        print(f"  {name:<13} apart {a:6.3f} s, one pass {o:6.3f} s: {a / o:4.2f}x", flush=True)
    print()


def slice_layers(double: int, single: int) -> list[tuple[str, int, int]]:
    """The linears of ``double`` double blocks and ``single`` single blocks, in file order."""
    out = [(f"double_blocks.{b}.{name}", n, k) for b in range(double) for name, n, k in DOUBLE]
    return out + [(f"single_blocks.{b}.{name}", n, k) for b in range(single) for name, n, k in SINGLE]


def gaussian_weight(n: int, k: int, gen, rows: int):
    """A BF16 ``[n, k]`` weight of N(0, 1/k) values drawn from ``gen`` ``rows`` rows at a time
    (bounded F32 memory; the row count is part of which values are drawn)."""
    import torch

    w = torch.empty(n, k, dtype=torch.bfloat16)
    for r in range(0, n, rows):
        w[r : r + rows] = torch.randn(min(rows, n - r), k, generator=gen) * k**-0.5
    return w


def build_slice(path: str, layers: list[tuple[str, int, int]]) -> None:
    """A Flux-shaped slice: seeded Gaussian BF16 weights with F32-free generation per row block,
    biases, and one norm per block (kept dense by quantize, copied by the kernel)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    sd = {}
    for name, n, k in layers:
        sd[f"{name}.weight"] = gaussian_weight(n, k, gen, 1024)
        sd[f"{name}.bias"] = torch.zeros(n, dtype=torch.bfloat16)
        block = name.rsplit(".", 2)[0] if name.startswith("double") else name.rsplit(".", 1)[0]
        sd.setdefault(f"{block}.norm.scale", torch.ones(128, dtype=torch.bfloat16))
    save_file(sd, path)


def child_encode_only(src: str, name: str, threads: int = 0) -> dict:
    """Encoder-only time of every linear of ``src``: each weight read untimed, then only
    ``codec.encode`` timed (``threads`` torch threads; 0: torch's default, every core)."""
    import torch
    from safetensors import safe_open

    from comfyquant import codecs

    if threads:
        torch.set_num_threads(threads)
    fmt, params, _layout, _kwargs = ENCODERS[name]
    codec = codecs.get(fmt)
    seconds = 0.0
    nbytes = 0
    with safe_open(src, "pt") as f:
        for key in f.keys():
            if not key.endswith(".weight"):
                continue
            w = f.get_tensor(key)
            if w.dim() != 2:
                continue
            t0 = time.perf_counter()
            enc = codec.encode(w, layer=key, **dict(params))
            seconds += time.perf_counter() - t0
            nbytes += w.numel() * w.element_size()
            del enc, w
    own, _ = _peaks()
    return {"seconds": seconds, "bytes": nbytes, "threads": torch.get_num_threads(), "rss_main": own}


def child_slice_quantize(src: str, name: str, jobs: str, out_dir: str) -> dict:
    """``comfyquant.quantize`` of the slice, end to end (torch imported inside, as by the CLI)."""
    started = time.perf_counter()
    import comfyquant

    fmt, params, _layout, _kwargs = ENCODERS[name]
    out = os.path.join(out_dir, f"slice-{name}-j{jobs}.safetensors")
    r = comfyquant.quantize(
        src, out, fmt, dict(params), target="comfy-kitchen", jobs=jobs, progress=False, overwrite=True, preset="none"
    )
    seconds = time.perf_counter() - started
    own, kids = _peaks()
    os.unlink(out)
    return {
        "seconds": seconds,
        "rss_main": own,
        "rss_worker": kids,
        "ok": r.ok,
        "layers": r.doc["totals"]["quantized"],
        "jobs": r.doc["jobs"],
    }


E2E_RUNS = (
    ("enc1", "encoder alone, 1 torch thread"),
    ("enc", "encoder alone, torch's default threads (every core)"),
    ("j1", "quantize --jobs 1 (one core)"),
    ("j2", "quantize --jobs 2"),
    ("auto", "quantize (default --jobs auto)"),
)
E2E_RATIOS = {  # label: (numerator, denominator, target or None)
    "--jobs 1 / encoder on 1 thread": ("j1", "enc1", 0.8),
    "auto / encoder on every core": ("auto", "enc", 0.8),
    "--jobs 2 / encoder on every core": ("j2", "enc", None),
    "--jobs 2 / --jobs 1": ("j2", "j1", 1.7),
    "encoder every core / 1 thread": ("enc", "enc1", None),
}


def e2e_section(folder: str, names: list[str], double: int, single: int, rounds: int) -> None:
    """End to end ``quantize`` (``--jobs 1``, ``--jobs 2`` and the default ``auto``) against the
    encoder alone on the same layers (on one thread and on every core), each in a fresh
    process, interleaved over ``rounds`` rounds (the order rotates); rates are medians of the
    rounds, ratios medians of the rounds' ratios."""
    import statistics

    layers = slice_layers(double, single)
    src = os.path.join(folder, f"flux-slice-{double}d{single}s.safetensors")
    if not os.path.exists(src):
        build_slice(src, layers)
    nbytes = sum(n * k * 2 for _, n, k in layers)
    largest = max(n * k * 2 for _, n, k in layers) / MB
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    shapes = sorted({(n, k) for _, n, k in layers}, key=lambda s: -s[0] * s[1])
    print(
        f"end to end on a Flux-shaped slice: {double} double block(s) (image and text streams) + {single} single "
        f"block(s), {len(layers)} linears ({', '.join(f'{n}x{k}' for n, k in shapes)}), {nbytes / 1e6:.0f} MB of "
        f"BF16 weights, largest layer {largest:.0f} MiB; {cores} cores; load average {os.getloadavg()[0]:.2f}; "
        f"median of {max(1, rounds)} interleaved rounds, each run a fresh process; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"
    )
    for kind, label in E2E_RUNS:
        print(f"  {kind:<5} {label}")
    verdicts = []
    for name in names:
        runs: dict[str, list[dict]] = {kind: [] for kind, _label in E2E_RUNS}
        kinds = [
            ("enc1", ("encode-only", src, name, "1")),
            ("enc", ("encode-only", src, name, "0")),
            ("j1", ("slice", src, name, "1", folder)),
            ("j2", ("slice", src, name, "2", folder)),
            ("auto", ("slice", src, name, "auto", folder)),
        ]
        for r in range(max(1, rounds)):
            for kind, args in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                t0 = time.perf_counter()
                res = run_child(*args)
                res["wall"] = time.perf_counter() - t0
                runs[kind].append(res)
        rate = {
            kind: [nbytes / 1e6 / (r["seconds"] if kind.startswith("enc") else r["wall"]) for r in rs]
            for kind, rs in runs.items()
        }
        med = {kind: statistics.median(v) for kind, v in rate.items()}
        print(f"{name}: MB/s " + ", ".join(f"{kind} {med[kind]:.1f}" for kind in med), flush=True)
        for label, (x, y, target) in E2E_RATIOS.items():
            ratio = statistics.median(a / b for a, b in zip(rate[x], rate[y]))
            verdict = "" if target is None else f" (target >= {target}): {'MET' if ratio >= target else 'NOT MET'}"
            print(f"  {label:<34} {ratio:5.2f}x{verdict}")
            if target is not None:
                verdicts.append(f"{name}: {label} {ratio:.2f}x{verdict}")
        for kind in ("j1", "j2", "auto"):
            workers = runs[kind][0]["jobs"]["workers"]
            rss = max(r["rss_main"] + workers * r["rss_worker"] for r in runs[kind])
            budget = 3 * largest * max(1, workers) + 300
            line = (
                f"{name}: peak RSS {kind} ({runs[kind][0]['jobs']['workers']} workers) {rss:.0f} MiB "
                f"(budget {budget:.0f}): {'MET' if rss <= budget else 'NOT MET'}"
            )
            print("  " + line)
            verdicts.append(line)
    print(f"(load average at the end: {os.getloadavg()[0]:.2f})")
    print(
        "encoder: codec.encode alone on each weight already in memory; quantize: the whole run (process "
        "start, torch import, read, encode, quality report, write, fsync, check, rename), wall clock"
    )
    for v in verdicts:
        print("  " + v)
    print()


def build_model(path: str) -> int:
    """The synthetic model (weights generated row block by row block: bounded memory)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    sd = {}
    for name, n, k in LAYERS:
        sd[f"{name}.weight"] = gaussian_weight(n, k, gen, 512)
        sd[f"{name}.bias"] = torch.zeros(n, dtype=torch.bfloat16)
    sd["blocks.0.norm1.weight"] = torch.ones(3072, dtype=torch.bfloat16)
    save_file(sd, path)
    return sum(n * k * 2 for _, n, k in LAYERS)


def _peaks() -> tuple[float, float]:
    """(this process's peak RSS, its largest child's), MB.  Our own peak is VmHWM: Linux's
    ru_maxrss survives exec, so a child started by a parent that just built the model with
    torch would report the parent's peak.  (Workers are started by this small process.)"""
    with open("/proc/self/status") as fh:
        own = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, kids


def child_comfyquant(src: str, fmt: str, jobs: int, out_dir: str) -> dict:
    started = time.perf_counter()
    import comfyquant

    out = os.path.join(out_dir, f"{fmt}-j{jobs}.safetensors")
    r = comfyquant.quantize(src, out, fmt, target="all", jobs=jobs, progress=False, overwrite=True)
    seconds = time.perf_counter() - started
    own, kids = _peaks()
    os.unlink(out)
    t = r.doc["totals"]
    return {
        "seconds": seconds,
        "rel_l2": t["weight_rel_l2_mean"],
        "out_rel_l2": t["output_rel_l2_mean"],
        "rss_main": own,
        "rss_worker": kids,
        "ok": r.ok,
        "layers": t["quantized"],
    }


def child_convert(src: str, to: str, out_dir: str) -> dict:
    """``comfyquant convert`` of a quantized file, end to end, in a fresh process."""
    started = time.perf_counter()
    import comfyquant

    out = os.path.join(out_dir, f"convert-{to}.safetensors")
    r = comfyquant.convert(src, out, to, target="all", progress=False, overwrite=True)
    seconds = time.perf_counter() - started
    own, _ = _peaks()
    os.unlink(out)
    t = r.doc["totals"]
    return {"seconds": seconds, "rel_l2": t["weight_rel_l2_mean"], "rss_main": own, "ok": r.ok, "layers": t["quantized"]}


def convert_section(src: str, folder: str, pairs: list[tuple[str, str]], repeat: int, quantized_bytes: int) -> None:
    """``convert FROM -> TO`` against ``quantize dense -> TO`` on the same model, side by side:
    convert decodes each input layer once, so it should cost about what quantize does."""
    print("convert (decode the quantized input, re-encode) vs quantize from the dense original, --jobs 1:")
    head = (
        f"{'from -> to':<16} {'convert s':>10} {'quantize s':>11} {'ratio':>7} {'convert MB/s':>13} {'layers':>7} "
        f"{'RSS MiB convert / quantize':>27}"
    )
    print(head)
    print("-" * len(head))
    for frm, to in pairs:
        qsrc = os.path.join(folder, f"{frm}-source.safetensors")
        if not os.path.exists(qsrc):
            import comfyquant

            comfyquant.quantize(src, qsrc, frm, target="all", progress=False, overwrite=True)
        conv, quant = [], []
        for _ in range(max(1, repeat)):
            conv.append(run_child("convert", qsrc, to, folder))
            quant.append(run_child("comfyquant", src, to, "1", folder))
        c, q = best_of(conv), best_of(quant)
        print(
            f"{frm + ' -> ' + to:<16} {c['seconds']:>10.2f} {q['seconds']:>11.2f} {c['seconds'] / q['seconds']:>6.2f}x "
            f"{quantized_bytes / 1e6 / c['seconds']:>13.1f} {c['layers']:>7} {c['rss_main']:>13.0f} / {q['rss_main']:>11.0f}"
        )
    print()


def child_kitchen(src: str, fmt: str) -> dict:
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors import safe_open

    layout, kwargs = KITCHEN[fmt]
    seconds = 0.0
    errors = []
    with safe_open(src, "pt") as f:
        for name, _n, _k in LAYERS:
            w = f.get_tensor(f"{name}.weight")
            t0 = time.perf_counter()
            q = QuantizedTensor.from_float(w, layout, **kwargs)
            seconds += time.perf_counter() - t0
            d = q.dequantize().to(torch.float32)
            wf = w.to(torch.float32)
            errors.append(float((d - wf).norm() / wf.norm()))
            del q, d, wf, w
    own, _ = _peaks()
    return {"seconds": seconds, "rel_l2": sum(errors) / len(errors), "rss_main": own}


def run_child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best_of(runs: list[dict]) -> dict:
    """The fastest run, with the largest peak RSS seen in any run."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    for key in ("rss_main", "rss_worker"):
        if key in best:
            best[key] = max(r[key] for r in runs)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="w4a8,int8,w4a4,nvfp4,mxfp8,fp8")
    ap.add_argument("--keep", metavar="DIR", help="build the model in DIR (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per child; the fastest counts (default 1)")
    ap.add_argument("--encoders", default=",".join(ENCODERS), help="encoder section rows (default: all)")
    ap.add_argument("--shapes", default="3072x3072,5120x13824", help="encoder section weight shapes NxK")
    ap.add_argument("--rounds", type=int, default=3, help="encoder section rounds; the median counts (default 3)")
    ap.add_argument("--encoders-only", action="store_true", help="run only the encoder section")
    ap.add_argument(
        "--threads",
        type=int,
        help="torch threads for the encoder section (default: torch's); "
        "1 measures compute, not fork-join waits, on a machine whose cores are shared",
    )
    ap.add_argument("--no-encoders", action="store_true", help="skip the encoder section")
    ap.add_argument(
        "--convert",
        default="nvfp4:w4a8,fp8:int8",
        help="convert rows FROM:TO,... timed against quantize dense -> TO ('' skips them)",
    )
    ap.add_argument(
        "--e2e",
        default="w4a8",
        metavar="ROWS",
        help="end-to-end section: encoder rows (as --encoders) quantized end to end on the Flux-shaped "
        "slice with --jobs 1 and 2, beside the encoder alone ('' skips it; default w4a8)",
    )
    ap.add_argument(
        "--slice", default="2,2", metavar="D,S", help="the slice: D double blocks and S single blocks of FLUX.1 (default 2,2)"
    )
    ap.add_argument("--e2e-rounds", type=int, default=3, help="end-to-end section rounds; medians count (default 3)")
    ap.add_argument("--e2e-only", action="store_true", help="run only the end-to-end section")
    ap.add_argument(
        "--measure",
        metavar="ROWS",
        default="",
        help="measurement section: decode + forward in one pass vs apart, for these encoder rows "
        "(e.g. w4a8,int8,fp8; one 12288x3072 layer, --threads applies); then exit",
    )
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, src, fmt = args.child[:3]
        if kind == "kitchen":
            res = child_kitchen(src, fmt)
        elif kind == "encode-only":
            res = child_encode_only(src, fmt, int(args.child[3]) if len(args.child) > 3 else 0)
        elif kind == "slice":
            res = child_slice_quantize(src, fmt, args.child[3], args.child[4])
        elif kind == "convert":
            res = child_convert(src, fmt, args.child[3])
        else:
            res = child_comfyquant(src, fmt, int(args.child[3]), args.child[4])
        print(json.dumps(res))
        return

    if args.measure:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        measure_section(args.measure.split(","), 12288, 3072, args.rounds)
        return
    if not args.no_encoders and not args.e2e_only:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
        print(
            f"encoders alone, BF16 Gaussian weights, in one process; {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch threads; load average {os.getloadavg()[0]:.2f}; "
            f"median of {max(1, args.rounds)} interleaved rounds"
        )
        head = f"{'shape':>11} {'format':<13} {'cq MB/s':>9} {'ck MB/s':>9} {'ratio':>7} {'bit-exact':>9}"
        print(head)
        print("-" * len(head), flush=True)
        encoder_section(shapes, args.encoders.split(","), args.rounds)
        print(f"(load average at the end: {os.getloadavg()[0]:.2f})")
        print()
        if args.encoders_only:
            return
    folder = args.keep or tempfile.mkdtemp(prefix="cq-bench-")
    os.makedirs(folder, exist_ok=True)
    if args.e2e:
        double, single = (int(v) for v in args.slice.split(","))
        e2e_section(folder, args.e2e.split(","), double, single, args.e2e_rounds)
    if args.e2e_only:
        if not args.keep:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        return
    src = os.path.join(folder, "dense.safetensors")
    if not os.path.exists(src):
        build_model(src)
    quantized_bytes = sum(n * k * 2 for _, n, k in LAYERS)
    largest = max(n * k * 2 for _, n, k in LAYERS) / MB
    print(
        f"model: {len(LAYERS)} linears ({', '.join(f'{n}x{k}' for _, n, k in LAYERS)}), BF16, "
        f"{quantized_bytes / MB:.0f} MiB of weights; largest layer {largest:.0f} MiB; {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    pairs = [tuple(p.split(":")) for p in args.convert.split(",") if p]
    if pairs:
        convert_section(src, folder, pairs, args.repeat, quantized_bytes)
    budget = {j: 3 * largest * j + 300 for j in (1, 2)}
    rows = []
    for fmt in args.formats.split(","):
        jobs_list = (1, 2)
        ck_runs: list[dict] = []
        cq_runs: dict[int, list[dict]] = {jobs: [] for jobs in jobs_list}
        for _ in range(max(1, args.repeat)):
            ck_runs.append(run_child("kitchen", src, fmt))
            for jobs in jobs_list:
                cq_runs[jobs].append(run_child("comfyquant", src, fmt, str(jobs), folder))
        ck = best_of(ck_runs)
        rows += [(fmt, jobs, best_of(cq_runs[jobs]), ck) for jobs in jobs_list]
    print()
    head = (
        f"{'format':<6} {'jobs':>4} {'cq MB/s':>8} {'ck MB/s':>8} {'speed':>6} {'cq relL2':>9} {'ck relL2':>9} "
        f"{'cq RSS MiB (main/worker)':>24} {'budget':>7} {'ck RSS':>7}"
    )
    print(head)
    print("-" * len(head))
    verdicts = []
    for fmt, jobs, cq, ck in rows:
        cq_rate = quantized_bytes / 1e6 / cq["seconds"]
        ck_rate = quantized_bytes / 1e6 / ck["seconds"]
        total_rss = cq["rss_main"] + (cq["rss_worker"] * jobs if jobs > 1 else 0)
        print(
            f"{fmt:<6} {jobs:>4} {cq_rate:>8.1f} {ck_rate:>8.1f} {cq_rate / ck_rate:>5.2f}x {cq['rel_l2']:>9.5f} "
            f"{ck['rel_l2']:>9.5f} {cq['rss_main']:>11.0f} / {cq['rss_worker'] if jobs > 1 else 0:>8.0f}"
            f" {budget[jobs]:>7.0f} {ck['rss_main']:>7.0f}"
        )
        if fmt == "w4a8":
            verdicts.append(
                f"W4A8 --jobs {jobs}: throughput {cq_rate / ck_rate:.2f}x comfy-kitchen (target >= 1.0), "
                f"error {cq['rel_l2']:.5f} vs {ck['rel_l2']:.5f} (target <=): "
                f"{'MET' if cq_rate >= ck_rate and cq['rel_l2'] <= ck['rel_l2'] + 1e-12 else 'NOT MET'}"
            )
        verdicts.append(
            f"{fmt} --jobs {jobs}: peak RSS {total_rss:.0f} MiB (budget {budget[jobs]:.0f} MiB): "
            f"{'MET' if total_rss <= budget[jobs] else 'NOT MET'}"
        )
    print(f"(load average at the end: {os.getloadavg()[0]:.2f}; runs per child: {max(1, args.repeat)})")
    print()
    print("comfyquant: end to end (process start, read, encode, quality report, write, check, rename);")
    print("comfy-kitchen: QuantizedTensor.from_float only. RSS: ru_maxrss of the process (and of its largest worker).")
    for v in verdicts:
        print("  " + v)
    if not args.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
