"""comfyquant's codecs and ``dequantize`` against comfy-kitchen 0.2.40 eager (CPU) in one run.

1. Per format/variant and per layer shape (3072x3072 and 5120x13824, BF16 source weights):
   encode and decode throughput in MB of source (dense BF16) weight per second, comfyquant vs
   comfy-kitchen (best of a few rounds, interleaved: the machine is shared and noisy; six
   times as many rounds for the small layer, whose operations take milliseconds), and
   whether the results are bit-identical.  Targets: decode >= 1.0x kitchen (stretch 2x),
   encode >= 1.0x.
2. ``comfyquant dequantize`` of checkpoints built from those layers (one 5120x13824 layer per
   format; and an FP8-only one) against ``cp`` of the same file, with the peak RSS of the
   dequantize process.  Targets: >= 0.5x cp throughput (input MB/s), peak RSS <= 2x the
   largest dense layer + 200 MB.  Beside them a lower bound that no dequantizer can beat:
   reading the input and writing the output's byte count from memory, no decoding, with and
   without the fsync (``least_dequantize``).  For a file with layers that comfy-kitchen
   un-rotates in one F32 GEMM over the layer (INT8 ConvRot, W4A4) it also prints the RSS floor
   of that call shape (start-up RSS + packed tensors + F32 operand + F32 product), which is
   above the budget: no decoder of the same bits needs less.  Beside the bound, decode-only:
   every layer decoded in row blocks in a fresh process as dequantize's (``DECODE_CHILD``, no
   reading or writing timed), run next to dequantize in alternating order; the target is
   >= 0.8x of the slower of the bound and decode-only.  And, to see what the disk's traffic
   costs on the machine, the same decode-only while another process writes the output's
   bytes with O_DIRECT (dd), and the time until both are done.

3. Decoder scaling (``--sections scaling``): every decoder's MB/s (of dense BF16 output) at
   3072x3072 and at 5120x13824, measured in the same rounds (each round decodes the small
   layer as many times as make the large one's bytes and the large one once, in alternating
   order from round to round), with the
   median over rounds of the per-round ratio large/small.  Target: >= 0.8 for every decoder.
   Three ways to decode: decode() into a new tensor (each result dropped before the next
   call, so a large one reuses the memory decode() keeps; and, as "held", while the caller
   still holds its last result: fresh memory every call), iter_decode() into one reused
   block buffer (layer after layer in one ``reused_outputs`` scope, as dequantize runs it),
   and a row source materialized (convert's path); beside decode(), in the
   same rounds, a decoder with no arithmetic (read the stored weight, write a fresh output
   of the same size) and the bound its ratio puts on the held decode()'s.

Usage: python bench/codec_speed.py [--quick] [--rounds N] [--out DIR] [--threads T]
       [--sections codec,scaling,dequantize] [--scaling-rounds N] [--decoders a,b]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from comfyquant.numerics.waits import prefer_passive_waits

prefer_passive_waits()  # as the command line does, before torch loads (the machine is shared)

import torch  # noqa: E402
from comfy_kitchen.tensor import QuantizedTensor  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from comfyquant import codecs  # noqa: E402
from comfyquant.numerics.assemble import fill_rows  # noqa: E402
from comfyquant.numerics.hadamard import unrotate  # noqa: E402
from comfyquant.numerics.pages import empty_output, release_spare, reused_outputs  # noqa: E402
from comfyquant.numerics.rows import materialize, row_ranges  # noqa: E402

SHAPES = [(3072, 3072), (5120, 13824)]
# name, format, comfy-kitchen layout, kitchen quantize kwargs (comfyquant takes the same)
VARIANTS = [
    ("fp8", "float8_e4m3fn", "TensorCoreFP8Layout", {}),
    ("int8", "int8_tensorwise", "TensorWiseINT8Layout", {}),
    ("int8_convrot", "int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True, "convrot": True}),
    ("w4a8", "asym_w4a8_int8", "AsymW4A8Int8Layout", {}),
    ("w4a8_asym", "asym_w4a8_int8", "AsymW4A8Int8Layout", {"codebook": False, "symmetric": False}),
    ("w6a8", "asym_w4a8_int8", "AsymW4A8Int8Layout", {"codebook": False, "bits": 6}),
    ("w4a4", "convrot_w4a4", "TensorCoreConvRotW4A4Layout", {}),
    ("nvfp4", "nvfp4", "TensorCoreNVFP4Layout", {}),
    ("mxfp8", "mxfp8", "TensorCoreMXFP8Layout", {}),
]
DEQ_MIXED = ["fp8", "int8_convrot", "w4a8", "w4a4", "nvfp4", "mxfp8"]
MARKERS = {
    "fp8": {"format": "float8_e4m3fn"},
    "int8": {"format": "int8_tensorwise"},
    "int8_convrot": {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256},
    "w4a8": {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256, "convrot": True},
    "w4a4": {"format": "convrot_w4a4", "convrot_groupsize": 256},
    "nvfp4": {"format": "nvfp4"},
    "mxfp8": {"format": "mxfp8"},
}


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def same(a: dict, b: dict) -> bool:
    def bits(t):
        return t.contiguous().reshape(-1).view(torch.uint8)

    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k])) for k in a
    )


def codec_rows(rounds: int, quick: bool) -> tuple[list[dict], dict]:
    """Encode/decode timings per variant and shape; returns rows and the big-shape tensors."""
    rows, keep = [], {}
    shapes = SHAPES[:1] if quick else SHAPES
    for n, k in shapes:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        mb = w.numel() * 2 / 1e6
        for name, fmt, layout, kw in VARIANTS:
            codec = codecs.get(fmt)
            slow = fmt == "asym_w4a8_int8" and n * k > 20e6
            # a 3072x3072 encode or decode takes a few ms: six times the rounds, so that the
            # best of them is not one the shared machine slowed down
            small = 6 if n * k < 20e6 else 1
            enc_rounds = 1 if slow else rounds * small
            t_ck_e = t_cq_e = float("inf")
            for _ in range(enc_rounds):
                t, q = timed(lambda: QuantizedTensor.from_float(w, layout, **kw))  # noqa: B023
                t_ck_e = min(t_ck_e, t)
                t, enc = timed(lambda: codec.encode(w, **kw))  # noqa: B023
                t_cq_e = min(t_cq_e, t)
            ref = {s: v.contiguous() for s, v in q.state_dict("weight").items()}
            enc_exact = same(dict(enc), ref)
            t_ck_d = t_cq_d = float("inf")
            marker = enc.marker
            for _ in range(rounds * small):
                t, _ = timed(q.dequantize)
                t_ck_d = min(t_ck_d, t)
                t, d_cq = timed(lambda: codec.decode(ref, marker, dtype=torch.bfloat16))  # noqa: B023
                t_cq_d = min(t_cq_d, t)
            dec_exact = torch.equal(d_cq.view(torch.int16), q.dequantize().view(torch.int16))
            row = {
                "variant": name,
                "shape": f"{n}x{k}",
                "mb": mb,
                "encode_ck": mb / t_ck_e,
                "encode_cq": mb / t_cq_e,
                "decode_ck": mb / t_ck_d,
                "decode_cq": mb / t_cq_d,
                "encode_exact": enc_exact,
                "decode_exact": dec_exact,
            }
            rows.append(row)
            print_row(row)
            if (n, k) == shapes[-1] and name in MARKERS:
                keep[name] = (ref, enc.marker)
    return rows, keep


def print_header() -> None:
    print(f"{'variant':13s} {'shape':11s} | {'encode MB/s':>24s} | {'decode MB/s':>24s} | exact")
    print(f"{'':13s} {'':11s} | {'kitchen':>7s} {'cq':>7s} {'ratio':>8s} | {'kitchen':>7s} {'cq':>7s} {'ratio':>8s} | enc dec")


def print_row(r: dict) -> None:
    print(
        f"{r['variant']:13s} {r['shape']:11s} | {r['encode_ck']:7.1f} {r['encode_cq']:7.1f} {r['encode_cq'] / r['encode_ck']:7.2f}x"
        f" | {r['decode_ck']:7.1f} {r['decode_cq']:7.1f} {r['decode_cq'] / r['decode_ck']:7.2f}x"
        f" | {'yes' if r['encode_exact'] else 'NO':3s} {'yes' if r['decode_exact'] else 'NO'}",
        flush=True,
    )


# -- decoder scaling: large layer vs small layer ------------------------------------------------

TILE_ROWS = 512
"""Scaling layers are one encoded 512-row slice repeated down the rows (every per-row tensor
along its row axis): the decoders see a real encoding, and building the 5120x13824 W4A8
layers takes a second instead of minutes.  A multiple of 128, so blocked scale layouts
(NVFP4, MXFP8: 128-row tiles) repeat whole tiles."""
SCALING = [
    ("fp8", "float8_e4m3fn", {}),
    ("e5m2", "float8_e5m2", {}),
    ("int8", "int8_tensorwise", {}),
    ("int8_rowwise", "int8_tensorwise", {"per_channel": True}),
    ("int8_convrot", "int8_tensorwise", {"per_channel": True, "convrot": True}),
    ("w4a8", "asym_w4a8_int8", {}),
    ("w4a8_asym", "asym_w4a8_int8", {"codebook": False, "symmetric": False}),
    ("w6a8", "asym_w4a8_int8", {"codebook": False, "bits": 6}),
    ("w4a4", "convrot_w4a4", {}),
    ("nvfp4", "nvfp4", {}),
    ("mxfp8", "mxfp8", {}),
    ("awq", "awq_w4a16", None),
    ("svdquant", "svdquant_w4a4", None),
]


def _tiled(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (of a TILE_ROWS-row layer) repeated to ``rows`` rows along its row axis."""
    reps = rows // TILE_ROWS
    if t.dim() >= 1 and t.shape[0] == TILE_ROWS:
        return t.repeat(reps, *([1] * (t.dim() - 1)))
    if t.dim() == 2 and t.shape[1] == TILE_ROWS:  # group-major tensors (W4A8's correction)
        return t.repeat(1, reps)
    return t.clone()


def scaling_layer(fmt: str, kw: dict | None, n: int, k: int) -> tuple[dict, dict]:
    """Tensors and marker of an ``[n, k]`` layer of ``fmt`` (BF16 model dtype)."""
    gen = torch.Generator().manual_seed(2)
    if fmt == "awq_w4a16":  # no quantizer (offline calibration): random codes, scales, zeros
        g = 128
        t = {
            "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
            "weight_scale": (torch.rand(k // g, n, generator=gen) * 0.01).to(torch.bfloat16),
            "weight_zeros": (torch.randn(k // g, n, generator=gen) * 0.01).to(torch.bfloat16),
        }
        return t, {"format": fmt, "group_size": g}
    if fmt == "svdquant_w4a4":
        r = 32
        t = {
            "weight": torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, generator=gen),
            "weight_scale": (torch.rand(k // 64, n, generator=gen) * 0.01 + 0.001).to(torch.bfloat16),
            "weight_proj_down": (torch.randn(k, r, generator=gen) * 0.05).to(torch.bfloat16),
            "weight_proj_up": (torch.randn(n, r, generator=gen) * 0.05).to(torch.bfloat16),
            "weight_smooth_factor": (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16),
        }
        return t, {"format": fmt}
    w = (torch.randn(TILE_ROWS, k, generator=gen) * 0.02).to(torch.bfloat16)
    enc = codecs.get(fmt).encode(w, **kw)
    return {s: _tiled(v, n) for s, v in enc.items()}, enc.marker


def _fresh_output(shape: tuple[int, int], dtype: torch.dtype, stored: torch.Tensor) -> None:
    """A decoder with no arithmetic: the output allocated as decode() allocates it
    (``empty_output``) and written once -- its first bytes
    copied from the stored weight (every input byte read once), the rest filled.  Its
    large/small rate ratio is what reading the layer and producing a fresh output of its
    size cost on the large layer: fresh pages the kernel faults in and zeroes, and 70 + 141
    MB that do not stay in cache, where the small layer's input and 19 MB output (reused
    heap memory) do."""
    flat = empty_output(shape, dtype).view(-1).view(torch.uint8)
    src = stored.contiguous().view(-1).view(torch.uint8)
    m = min(src.numel(), flat.numel())
    flat[:m].copy_(src[:m])
    flat[m:].fill_(1)


def _one_gemm(shape: tuple[int, int], dtype: torch.dtype, stored: torch.Tensor, size: int = 256) -> None:
    """A one-GEMM decoder with no format arithmetic: an F32 operand of the layer filled in
    row blocks from the stored weight's bytes (as the INT8 ConvRot and W4A4 decoders fill
    theirs), comfy-kitchen's one un-rotation GEMM over it, and the product rounded to
    ``dtype`` block by block into one reused buffer (what ``iter_decode`` yields).  This is
    the work the reference's call shape imposes on a decoder that must reproduce its bits:
    an operand and a product of the layer's size in F32, which stay in the last-level cache
    for a 3072x3072 layer (2 x 38 MB) and not for a 5120x13824 one (2 x 283 MB)."""
    n, k = shape
    src = stored.contiguous().view(-1).view(torch.uint8)

    def fill(r0: int, r1: int, dest: torch.Tensor) -> None:
        flat = dest.view(-1)
        at = (r0 * k) % max(1, src.numel() - flat.numel())
        flat.copy_(src[at : at + flat.numel()])

    product = unrotate(lambda: fill_rows(shape, torch.float32, fill), size, torch.float32)
    buf = None
    for r0, r1 in row_ranges(n, k, 1 << 20, join_tail=False):
        buf = torch.empty((r1 - r0, k), dtype=dtype) if buf is None or buf.shape[0] < r1 - r0 else buf
        buf[: r1 - r0].copy_(product[r0:r1])


def _scaling_rounds(codec, small: tuple, large: tuple, repeat: int, rounds: int, dtype: torch.dtype) -> dict[str, list[float]]:
    """Per round, for ``decode`` (a fresh output tensor) and ``iter_decode`` (row blocks in one
    reused buffer, what dequantize streams): MB/s of ``repeat`` small decodes, MB/s of one
    large decode, and their ratio; beside them, in the same round, the rates of producing a
    fresh output of each size (``_fresh_output``) and the bound they put on decode()'s
    ratio (see ``_output_bound``).  For a layer decoded by one GEMM over the whole layer
    (comfy-kitchen's call shape, kept for its bits), also the rates of that GEMM's own work
    (``_one_gemm``) and the bound they put on ``iter_decode``'s ratio.  ``iter_decode``
    and that yardstick run as the commands that stream layers run them: in a
    ``reused_outputs`` scope, after a first layer of the same size."""

    def fresh(layer: tuple) -> None:
        codec.decode(*layer, dtype=dtype)

    def held(layer: tuple) -> None:  # as if the caller still held its last result: no kept memory to reuse
        release_spare()
        codec.decode(*layer, dtype=dtype)

    def streamed(layer: tuple) -> None:
        for _ in codec.iter_decode(*layer, dtype=dtype):
            pass

    shapes = {id(small): codec.plan(*small).shape, id(large): codec.plan(*large).shape}

    def output(layer: tuple) -> None:
        _fresh_output(shapes[id(layer)], dtype, layer[0]["weight"])

    def source(layer: tuple) -> None:
        materialize(codec.row_source(*layer, dtype=dtype))

    def gemm(layer: tuple) -> None:
        _one_gemm(shapes[id(layer)], dtype, layer[0]["weight"], codec.plan(*layer).env.get("convrot_groupsize", 256))

    whole = codec.decodes_whole(large[0], codec.plan(*large), dtype)

    scoped = {streamed, gemm}  # run as dequantize, compare and the error report run them

    def run(how, layer: tuple, times: int) -> float:
        """Seconds of ``times`` calls; for the streamed paths layer after layer inside one
        ``reused_outputs`` scope, timed after the scope's first layer (a file's first layer
        gets fresh memory, the ones after it the memory the last ones let go of)."""
        with reused_outputs() if how in scoped else contextlib.nullcontext():
            if how in scoped:
                how(layer)
            t = time.perf_counter()
            for _ in range(times):
                how(layer)
            return time.perf_counter() - t

    paths = ((fresh, ""), (held, "_held"), (output, "_out"), (streamed, "_it"), (source, "_src")) + (
        ((gemm, "_gemm"),) if whole else ()
    )
    for how, _tag in paths:  # warm-up: first-call costs (tables, the allocator's pools)
        run(how, small, 1)
        run(how, large, 1)
    mb_s = repeat * _dense_mb(codec, small)
    mb_l = _dense_mb(codec, large)
    out: dict[str, list[float]] = {f"{key}{tag}": [] for _, tag in paths for key in ("small", "large", "ratio")}
    out["bound"], out["bound_src"], out["bound_it"] = [], [], []
    for rnd in range(rounds):
        for how, tag in paths:
            if rnd % 2:  # alternating order: a machine slowing down during a round favours neither size
                r_l = mb_l / run(how, large, 1)
                r_s = mb_s / run(how, small, repeat)
            else:
                r_s = mb_s / run(how, small, repeat)
                r_l = mb_l / run(how, large, 1)
            out["small" + tag].append(r_s)
            out["large" + tag].append(r_l)
            out["ratio" + tag].append(r_l / r_s)
        out["bound"].append(_output_bound(out["small_held"][-1], out["small_out"][-1], out["large_out"][-1]))
        # materialize also writes a fresh output of the layer's size: the same bound, at its own small rate
        out["bound_src"].append(_output_bound(out["small_src"][-1], out["small_out"][-1], out["large_out"][-1]))
        # iter_decode writes no fresh output; a one-GEMM decoder's extra cost is that GEMM's operand and product
        out["bound_it"].append(
            _output_bound(out["small_it"][-1], out["small_gemm"][-1], out["large_gemm"][-1]) if whole else float("nan")
        )
    return out


def _output_bound(decode_small: float, out_small: float, out_large: float) -> float:
    """The large/small ratio decode() would reach if its own work per byte were the same at
    both sizes and the large layer only added its output's extra cost (rates in MB/s, from
    one round): per MB, ``1/decode_small`` becomes ``1/decode_small + 1/out_large -
    1/out_small``.  A decoder at or above it is as fast per byte as producing a fresh
    output of that size allows, unless the output's cost hides behind the decoding."""
    return (1 / decode_small) / (1 / decode_small + max(0.0, 1 / out_large - 1 / out_small))


def _dense_mb(codec, layer: tuple) -> float:
    n, k = codec.plan(*layer).shape
    return n * k * 2 / 1e6


def scaling_rows(rounds: int, dtype: torch.dtype = torch.bfloat16, only: set[str] | None = None) -> list[dict]:
    """Per decoder (or those named in ``only``): median MB/s at each shape and the median
    per-round ratio large/small; beside decode(), the fresh output's own ratio and the bound
    it puts on decode()'s (medians over the same rounds)."""
    (n0, k0), (n1, k1) = SHAPES
    repeat = max(1, round(n1 * k1 / (n0 * k0)))  # small decodes per round: about the large one's bytes
    rows = []
    for name, fmt, kw in SCALING:
        if only and name not in only:
            continue
        codec = codecs.get(fmt)
        small, large = scaling_layer(fmt, kw, n0, k0), scaling_layer(fmt, kw, n1, k1)
        got = _scaling_rounds(codec, small, large, repeat, rounds, dtype)
        del small, large
        row = {"variant": name, "format": fmt, **{key: statistics.median(v) for key, v in got.items()}}
        rows.append(row)
        print(
            f"{name:13s} | {row['small']:8.0f} {row['large']:8.0f} {row['ratio']:5.2f}x {_verdict(row['ratio'], _NO_BOUND):9s}"
            f" {row['ratio_held']:5.2f}x {_verdict(row['ratio_held'], row['bound']):9s}"
            f" {row['ratio_out']:5.2f}x {row['bound']:5.2f}x | {row['small_it']:8.0f} {row['large_it']:8.0f}"
            f" {row['ratio_it']:5.2f}x {_verdict(row['ratio_it'], row['bound_it']):9s} {_bound(row['bound_it'])} |"
            f" {row['small_src']:8.0f}"
            f" {row['large_src']:8.0f} {row['ratio_src']:5.2f}x {_verdict(row['ratio_src'], row['bound_src']):9s}"
            f" {row['bound_src']:5.2f}x",
            flush=True,
        )
    return rows


_NO_BOUND = float("nan")
"""decode() dropping each result reuses its memory (``empty_result``): no fresh-output bound."""


def _bound(bound: float) -> str:
    return "    -" if bound != bound else f"{bound:4.2f}x"


def _verdict(ratio: float, bound: float) -> str:
    """``ok`` at >= 0.8; else ``at bound`` when the ratio reaches 95% of the bound measured
    in the same rounds (a fresh output of the layer's size, or a one-GEMM decoder's GEMM),
    else ``LOW`` (also where there is no bound: NaN)."""
    if ratio >= 0.8:
        return "ok"
    return "at bound" if ratio >= 0.95 * bound else "LOW"


def print_scaling_header(rounds: int) -> None:
    (n0, k0), (n1, k1) = SHAPES
    small, large = f"{n0}x{k0}", f"{n1}x{k1}"
    print(
        f"\ndecoder scaling: MB/s of dense BF16 output, median of {rounds} interleaved rounds; "
        f"ratio = median per-round {large} rate / {small} rate (target >= 0.8)"
    )
    print(
        "  decode: a new output tensor per call, each dropped before the next call (a large one then takes the "
        "memory of the last one, which decode() keeps: numerics.pages.empty_result).  held: the same while the "
        "caller still holds its previous result, so every large output is fresh memory.  output: held without "
        "decoding -- a fresh output of the same size, written once from the stored weight's bytes (_fresh_output: "
        "a large one is new memory the kernel faults in and zeroes, too big for the cache with its input; a small "
        "one is reused heap memory that stays in cache).  bound: held's ratio if the large layer cost it only "
        "that extra time per byte (_output_bound); the row source writes such an output too and has its own "
        "bound.  iter_decode: row blocks into one reused buffer (what dequantize, compare and "
        "quantize's error report stream, timed as they run it: inside one reused_outputs scope, after the scope's first layer of that size); its bound, for the decoders that un-rotate the whole layer in one "
        "F32 GEMM as comfy-kitchen does (kept for its bits): its ratio if the large layer cost it only the extra "
        "time per byte of that GEMM's own work (_one_gemm: an F32 operand filled from the stored bytes, the GEMM, "
        "the product rounded in blocks).  row source: materialize(row_source), how convert and quantize read "
        "a quantized input"
    )
    print(f"{'':13s} | {'decode':^60s} | {'iter_decode':^40s} | {'row source':^42s}")
    print(
        f"{'decoder':13s} | {small:>8s} {large:>8s} ratio  {'':9s} held  {'':9s} output bound | {small:>8s} {large:>8s} ratio"
        f"  {'':9s} bound | {small:>8s} {large:>8s} ratio  {'':9s} bound"
    )


# -- dequantize vs cp -------------------------------------------------------------------------

CHILD = r"""
import json, sys, time
from comfyquant.numerics.waits import prefer_passive_waits
prefer_passive_waits()  # as the command line does before torch loads
t = time.perf_counter()
import comfyquant, comfyquant.codecs, torch  # what dequantize imports lazily, timed apart as start-up
startup = time.perf_counter() - t
base = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
s = comfyquant.dequantize(sys.argv[1], sys.argv[2], progress=False)
# the run's own seconds: dequantize times the imports it needs (the checker, the writer...) apart
# as start-up, like torch's (they are compiled anew in every process where Python may not
# write .pyc files: PYTHONDONTWRITEBYTECODE)
seconds, startup = s.seconds, startup + s.startup
# VmHWM is this process's own peak (ru_maxrss would include the big parent it was forked from)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "startup": startup, "rss_mb": hwm / 1024, "base_mb": base / 1024,
                  "largest": s.largest_layer[1],
                  "written": s.bytes_written}))
"""


DECODE_CHILD = r"""
import json, sys, time
from comfyquant.numerics.waits import prefer_passive_waits
prefer_passive_waits()
import comfyquant, comfyquant.codecs, torch
from comfyquant.numerics.pages import reused_outputs
from safetensors.torch import load_file
state = load_file(sys.argv[1])  # in memory before the clock starts: no reading is timed
with open(sys.argv[1], "rb") as fh:  # dequantize decodes in file order
    header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
layers = []
for key in sorted((k for k in state if k.endswith(".comfy_quant")),
                  key=lambda k: header[k[: -len(".comfy_quant")] + ".weight"]["data_offsets"][0]):
    name = key[: -len(".comfy_quant")]
    marker = json.loads(bytes(state[key].tolist()))
    packed = {k[len(name) + 1 :]: v for k, v in state.items()
              if k.startswith(name + ".") and k != key and not k.endswith(".bias")}
    layers.append((packed, marker))
writer = None
if len(sys.argv) > 3:  # the output's bytes written meanwhile by another process, as dequantize writes them
    import subprocess
    writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={sys.argv[2]}", "bs=8M", f"count={int(sys.argv[3]) >> 23}",
                               "oflag=direct", "conv=fsync"], stderr=subprocess.DEVNULL)
t = time.perf_counter()
with reused_outputs():  # as dequantize decodes
    for packed, marker in layers:
        for _ in comfyquant.codecs.get(marker["format"]).iter_decode(packed, marker, dtype=torch.bfloat16):
            pass
seconds = both = time.perf_counter() - t
if writer is not None:
    if writer.wait() != 0:
        seconds = float("nan")  # no O_DIRECT here (tmpfs): no such figure
    both = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "both": both}))
"""
"""Decode-only in a fresh process, as dequantize runs: every layer of the file decoded in row
blocks with no reading and no writing timed.  A fresh process pays first-use costs the bench's
own warm process has long paid (memory the kernel maps for the first time, the first large
GEMM's): dequantize pays them too, so this is its yardstick; the warm figure is printed
beside it."""


def _child_json(script: str, *args: str) -> dict:
    """Run ``script`` in a fresh interpreter (``CHILD_ENV``) and return the JSON object
    its last line of output prints."""
    res = subprocess.run([sys.executable, "-c", script, *args], check=True, capture_output=True, text=True, env=CHILD_ENV)
    return json.loads(res.stdout.strip().splitlines()[-1])


CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""The dequantize child imports compiled modules, as an installed comfyquant does: the format
codecs it imports lazily, inside its timed run, are otherwise compiled again in every child
(what PYTHONDONTWRITEBYTECODE makes a source checkout do: 0.04 s of a 2 s run)."""


def write_checkpoint(path: str, layers: dict) -> int:
    tensors, gen = {}, torch.Generator().manual_seed(1)
    for i, (name, (ref, marker)) in enumerate(layers.items()):
        prefix = f"blocks.{i}.{name}"
        for suffix, t in ref.items():
            tensors[f"{prefix}.{suffix}"] = t.clone()  # safetensors refuses shared storage
        n = ref["weight"].shape[0]  # no padding at these shapes
        tensors[f"{prefix}.bias"] = (torch.randn(n, generator=gen) * 0.01).to(torch.bfloat16)
        tensors[f"{prefix}.comfy_quant"] = torch.tensor(list(json.dumps(marker).encode()), dtype=torch.uint8)
    tensors["final_norm.weight"] = torch.ones(13824, dtype=torch.bfloat16)
    save_file(tensors, path, metadata={"modelspec.title": "codec_speed"})
    return os.path.getsize(path)


def least_dequantize(src: str, dst: str, out_bytes: int, sync: bool) -> None:
    """A lower bound for any dequantizer: read every input byte once and write ``out_bytes``
    (the dense output's size) from memory, with no decoding at all; with ``sync``, made
    durable as a tool that must not leave a partial file does -- write-back started in the
    background every 256 MB while writing goes on (as comfyquant's writer does), then fsync
    and rename."""
    import threading

    chunk = bytearray(8 << 20)
    tmp = dst + ".tmp"
    with open(src, "rb", buffering=0) as fi, open(tmp, "wb", buffering=0) as fo:
        while fi.readinto(chunk):
            pass
        view, left, pending, flusher = memoryview(chunk), out_bytes, 0, None
        while left:
            n = fo.write(view[: min(left, len(chunk))])
            left -= n
            pending += n
            if sync and pending >= 256 << 20 and (flusher is None or not flusher.is_alive()):
                pending = 0
                flusher = threading.Thread(target=os.fdatasync, args=(fo.fileno(),))
                flusher.start()
        if flusher is not None:
            flusher.join()
        if sync:
            os.fsync(fo.fileno())
    os.replace(tmp, dst)


def decode_only(layers: dict) -> float:
    """Seconds to decode every layer of a dequantize bench file in row blocks (what dequantize
    does between reading and writing), in this process, BF16 output -- as dequantize decodes
    them: within one ``reused_outputs`` scope, each layer's large temporaries reusing the
    memory of the last ones'."""
    t = time.perf_counter()
    with reused_outputs():
        for ref, marker in layers.values():
            for _ in codecs.get(marker["format"]).iter_decode(ref, marker, dtype=torch.bfloat16):
                pass
    return time.perf_counter() - t


def whole_layer_floor(layers: dict) -> int:
    """Bytes the largest one-GEMM layer of a bench file needs at its peak in comfy-kitchen's
    own decode: its packed tensors, the dequantized F32 operand and the F32 product of the
    un-rotation GEMM, all alive during the GEMM (0: no such layer).  The GEMM must see the
    whole layer (its rounding may depend on the row count), so no decoder of the same bits
    needs less; the RSS budget of 2x the dense BF16 layer is below it by construction."""
    floor = 0
    for ref, marker in layers.values():
        codec = codecs.get(marker["format"])
        plan = codec.plan(ref, marker)
        if codec._whole_layer(plan.env, torch.bfloat16, ref):
            n, k = plan.shape
            packed = sum(t.numel() * t.element_size() for t in ref.values())
            floor = max(floor, packed + 2 * 4 * n * k)
    return floor


def dequantize_rows(layers: dict, folder: str, rounds: int) -> list[dict]:
    rows = []
    sets = {"mixed (6 formats)": {k: layers[k] for k in DEQ_MIXED if k in layers}}
    if "fp8" in layers:
        sets["fp8 only (4 layers)"] = {f"fp8_{i}": layers["fp8"] for i in range(4)}
    for label, chosen in sets.items():
        src = os.path.join(folder, "src.safetensors")
        size = write_checkpoint(src, chosen)
        best_cp = best_sync = best_dq = best_start = best_least = best_least_nosync = float("inf")
        info = {}
        per_round: list[float] = []  # this round's bound time / its dequantize time (adjacent: same machine state)
        per_round_limit: list[float] = []  # the slower of bound and decode-only, over dequantize's time
        decode_times: list[float] = []  # decode-only in a fresh child process (DECODE_CHILD)
        warm_times: list[float] = []  # decode-only in this long-running process
        loaded_times: list[float] = []  # decode-only in a fresh process while another writes the output's bytes
        both_times: list[float] = []  # ... until both it and the writing are done
        per_round_loaded: list[float] = []  # that time over dequantize's, per round
        for rnd in range(rounds):
            dst = os.path.join(folder, "cp.safetensors")
            t, _ = timed(lambda: subprocess.run(["cp", src, dst], check=True))  # noqa: B023
            best_cp = min(best_cp, t)
            os.unlink(dst)
            t, _ = timed(lambda: subprocess.run(["sh", "-c", f"cp '{src}' '{dst}' && sync '{dst}'"], check=True))  # noqa: B023
            best_sync = min(best_sync, t)
            os.unlink(dst)
            out = os.path.join(folder, "dense.safetensors")

            def run_dequantize() -> dict:
                info = _child_json(CHILD, src, out)  # noqa: B023
                os.unlink(out)  # noqa: B023
                return info

            def run_bound() -> float:
                t, _ = timed(lambda: least_dequantize(src, dst, info["written"], True))  # noqa: B023
                os.unlink(dst)  # noqa: B023
                return t

            def run_decode(*extra: str) -> dict:
                return _child_json(DECODE_CHILD, src, *extra)  # noqa: B023

            # dequantize sits between its two yardsticks, in alternating order (adjacent runs see
            # the same machine; this one is shared and its speed drifts)
            if rnd % 2 == 0:
                if rnd:  # the bound needs the output's size: in the first round, after dequantize
                    t_bound = run_bound()
                info = run_dequantize()
                if not rnd:
                    t_bound = run_bound()
                t_dec = run_decode()["seconds"]
            else:
                t_dec = run_decode()["seconds"]
                info = run_dequantize()
                t_bound = run_bound()
            best_dq = min(best_dq, info["seconds"])
            best_start = min(best_start, info["startup"])
            best_least = min(best_least, t_bound)
            per_round.append(t_bound / info["seconds"])
            decode_times.append(t_dec)
            t, _ = timed(lambda: least_dequantize(src, dst, info["written"], False))  # noqa: B023
            best_least_nosync = min(best_least_nosync, t)
            os.unlink(dst)
            warm_times.append(decode_only(chosen))
            loaded = run_decode(dst, str(info["written"]))
            loaded_times.append(loaded["seconds"])
            both_times.append(loaded["both"])
            per_round_loaded.append(loaded["both"] / info["seconds"])
            if os.path.exists(dst):
                os.unlink(dst)
            per_round_limit.append(max(per_round[-1] * info["seconds"], t_dec) / info["seconds"])
        mb = size / 1e6
        budget = 2 * info["largest"] / 2**20 + 200
        floor = whole_layer_floor(chosen)
        floor_mb = info["base_mb"] + floor / 2**20 if floor else 0.0
        row = {
            "file": label,
            "input_mb": mb,
            "output_mb": info["written"] / 1e6,
            "cp_mbs": mb / best_cp,
            "cp_sync_mbs": mb / best_sync,
            "dq_mbs": mb / best_dq,
            "rss_mb": info["rss_mb"],
            "rss_budget_mb": budget,
            "startup_s": best_start,
            "out_mbs": info["written"] / 1e6 / best_dq,
            "least_mbs": mb / best_least,
            "least_nosync_mbs": mb / best_least_nosync,
            "of_bound_median": statistics.median(per_round),
            "decode_only_mbs": mb / statistics.median(decode_times),
            "decode_warm_mbs": mb / statistics.median(warm_times),
            "decode_loaded_mbs": mb / statistics.median(loaded_times),
            "both_mbs": mb / statistics.median(both_times),
            "of_loaded_median": statistics.median(per_round_loaded),
            "of_limit_median": statistics.median(per_round_limit),
            "rss_floor_mb": floor_mb,
            "rss_base_mb": info["base_mb"],
        }
        rows.append(row)
        print(
            f"{label:20s} in {mb:6.1f} MB -> out {row['output_mb']:6.1f} MB | cp {row['cp_mbs']:6.0f} MB/s, cp+sync "
            f"{row['cp_sync_mbs']:6.0f} MB/s | dequantize {row['dq_mbs']:6.1f} MB/s of input ({best_dq:.2f} s; "
            f"{row['dq_mbs'] / row['cp_mbs']:.2f}x cp, {row['dq_mbs'] / row['cp_sync_mbs']:.2f}x cp+sync; "
            f"writes {row['out_mbs']:.0f} MB/s of output) | peak RSS {row['rss_mb']:.0f} MB (budget {budget:.0f} MB) | "
            f"start-up (imports) {best_start:.2f} s, not in the times",
            flush=True,
        )
        print(
            f"{'':20s} lower bound (read the input, write the output's bytes from memory, no decoding): "
            f"{row['least_mbs']:6.0f} MB/s = {row['least_mbs'] / row['cp_mbs']:.2f}x cp with fsync, "
            f"{row['least_nosync_mbs']:6.0f} MB/s = {row['least_nosync_mbs'] / row['cp_mbs']:.2f}x cp without; "
            f"dequantize reaches {row['of_bound_median']:.2f}x of the bound (median over {len(per_round)} interleaved "
            f"rounds of bound time / dequantize time; target >= 0.8)",
            flush=True,
        )
        if floor:
            print(
                f"{'':20s} peak RSS: the budget is below what its one-GEMM layers need in comfy-kitchen itself: "
                f"{floor_mb:.0f} MiB = {info['base_mb']:.0f} MiB after importing torch + {floor / 2**20:.0f} MiB (packed "
                f"tensors + the F32 operand + the F32 product of the largest such layer's un-rotation GEMM); "
                f"dequantize's peak is {row['rss_mb'] - floor_mb:+.0f} MiB from that floor",
                flush=True,
            )
        print(
            f"{'':20s} decode only (a fresh process, every layer's row blocks, no I/O timed): {row['decode_only_mbs']:6.0f}"
            f" MB/s of input (in this warm process: {row['decode_warm_mbs']:.0f} MB/s); dequantize reaches {row['of_limit_median']:.2f}x of the slower of bound and decode-only "
            f"(median over rounds; target >= 0.8)",
            flush=True,
        )
        print(
            f"{'':20s} the same decode-only while another process writes the output's bytes with O_DIRECT and "
            f"fsync (dd, started with the decode; no dependency between them): the decoding {row['decode_loaded_mbs']:.0f}"
            f" MB/s of input ({row['decode_loaded_mbs'] / row['decode_only_mbs']:.2f}x decode-only: what the disk "
            f"traffic costs it here), both done {row['both_mbs']:.0f} MB/s (what a perfect overlap of decoding and "
            f"writing reaches here); dequantize, which can write a block only once it is decoded, reaches "
            f"{row['of_loaded_median']:.2f}x of that (median over rounds)",
            flush=True,
        )
        os.unlink(src)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3072x3072 only, no dequantize section")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds (best of); default 2")
    ap.add_argument(
        "--dequantize-rounds",
        type=int,
        default=5,
        help="interleaved dequantize / bound rounds (the median ratio counts); default 5",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", help="folder for the dequantize files (default: a temporary folder)")
    ap.add_argument(
        "--sections",
        default="codec,scaling,dequantize",
        help="comma-separated: codec (vs comfy-kitchen), scaling (decoders, large vs small layer), "
        "dequantize (vs its bound); default all",
    )
    ap.add_argument("--decoders", help="comma-separated decoder names of the scaling section (default: all)")
    ap.add_argument("--scaling-rounds", type=int, default=7, help="interleaved rounds of the scaling section; default 7")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - {"codec", "scaling", "dequantize"}
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
        f"MB = MB of BF16 source weight (N x K x 2 bytes)\n"
    )
    keep: dict = {}
    if "codec" in sections:
        print_header()
        _rows, keep = codec_rows(args.rounds, args.quick)
    if args.quick:
        return
    if "scaling" in sections:
        print_scaling_header(args.scaling_rounds)
        scaling_rows(args.scaling_rounds, only=set(args.decoders.split(",")) if args.decoders else None)
    if "dequantize" not in sections:
        return
    if not keep:  # the codec section did not run: the same layers, built as the scaling section builds them
        n, k = SHAPES[-1]
        keep = {name: scaling_layer(fmt, kw, n, k) for name, fmt, kw in SCALING if name in MARKERS}
    print(
        "\ndequantize: a fresh child process per run (time measured inside it, after importing comfyquant.codecs and "
        "torch, whose start-up is shown apart); all read a warm page cache; dequantize writes 2-4x the input's bytes "
        "and fsyncs them, cp does neither, cp+sync fsyncs"
    )
    folder = args.out or tempfile.mkdtemp(prefix="codec_speed-")
    os.makedirs(folder, exist_ok=True)  # --out DIR need not exist yet
    try:
        dequantize_rows(keep, folder, args.dequantize_rounds)
    finally:
        if not args.out:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
