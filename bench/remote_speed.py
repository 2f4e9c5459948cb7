"""How few requests and bytes does a remote ``comfyquant check`` need?

Builds the full-size sparse layouts of ``check_speed.py`` (``layouts.py``: exact headers, real
marker bytes, tensor data as file holes), plus variants whose markers are only in the header
(``_quantization_metadata``, no ``.comfy_quant`` tensors), serves them from a local HTTP server
on 127.0.0.1 (Range support, optional per-request latency), checks each by URL (the file, or
the ``model.safetensors.index.json`` of a sharded layout) and prints, per layout:

* requests per shard (the index request is counted apart, in ``index``),
* bytes read by comfyquant divided by header + marker bytes (the 8-byte lengths, the JSON
  headers and the ``.comfy_quant`` tensors) — the index's bytes are listed apart,
* what the server wrote to its sockets, divided the same way: the first request asks for up to
  512 KiB and comfyquant stops reading at the header's end, so on loopback the kernel buffers
  take the rest of that range (on a real link, at most a bandwidth-delay product of it),
* the time of the remote check against the local check of the same files (medians),
* whether the remote verdict equals the local one.

Targets: <= 3 requests per shard when markers are tensors (<= 1 when they are only in the
header), bytes read <= 1.2x header + marker bytes.

Usage: python bench/remote_speed.py [--quick] [--rounds N] [--latency MS] [--out DIR]
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import layouts  # noqa: E402
from check_speed import LAYOUTS, QUICK  # noqa: E402  (the same layouts as the local benchmark)

import comfyquant  # noqa: E402
from comfyquant import memo  # noqa: E402

TARGET_REQUESTS = 3
TARGET_REQUESTS_HEADER_ONLY = 1
TARGET_BYTES = 1.2

# Markers only in the header: derived from these layouts by dropping the .comfy_quant tensors.
HEADER_ONLY = ["flux-w4a8-1sh", "qwen-w4a8-2sh", "wan14b-fp8-1sh"]


class RangeServer:
    """Serves ``root`` with single-range GETs read by ``os.pread`` (sparse files stay sparse);
    counts requests and body bytes written per path; ``latency`` seconds before each answer."""

    def __init__(self, root: str, latency: float = 0.0) -> None:
        self.requests: Counter = Counter()
        self.written: Counter = Counter()
        self.latency = latency
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                srv.requests[self.path] += 1
                if srv.latency:
                    time.sleep(srv.latency)
                file = os.path.join(root, self.path.lstrip("/"))
                if not os.path.isfile(file):
                    self.send_error(404)
                    return
                size = os.path.getsize(file)
                start, stop, code = 0, size, 200
                rng = self.headers.get("Range")
                if rng:
                    a, _, b = rng.removeprefix("bytes=").partition("-")
                    start, stop, code = int(a), min(int(b) + 1 if b else size, size), 206
                self.send_response(code)
                self.send_header("Content-Length", str(stop - start))
                if code == 206:
                    self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
                self.end_headers()
                fd = os.open(file, os.O_RDONLY)
                try:
                    pos = start
                    while pos < stop:
                        chunk = os.pread(fd, min(1 << 16, stop - pos), pos)
                        self.wfile.write(chunk)
                        srv.written[self.path] += len(chunk)
                        pos += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    os.close(fd)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def reset(self) -> None:
        self.requests.clear()
        self.written.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def header_only(lay: layouts.Layout) -> layouts.Layout:
    tensors = [t for t in lay.tensors if not t.name.endswith(".comfy_quant")]
    return layouts.Layout(lay.name + "-hdronly", lay.model, lay.fmt, lay.shards, True, tensors, lay.quant_layers)


def needed_bytes(files: list[str]) -> tuple[int, int]:
    """(header bytes, marker bytes) over the shards: what any header checker must read."""
    header = marker = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
        header += 8 + n
        with comfyquant.open_checkpoint(f) as ck:
            marker += sum(e.nbytes for name, e in ck.tensors.items() if name.endswith(".comfy_quant"))
    return header, marker


def findings_of(report) -> list[tuple]:
    return [(f.code, f.layer, f.tensor) for f in report.findings]


def measure(name: str, path: str, root: str, server: RangeServer, rounds: int) -> dict:
    files = layouts.shard_files(path)
    rel = os.path.relpath(path, root)
    is_index = os.path.isdir(path)
    url = f"{server.base}/{rel}/model.safetensors.index.json" if is_index else f"{server.base}/{rel}"
    local_target = path
    header, marker = needed_bytes(files)
    # one measured remote check for the counts
    memo.clear()
    server.reset()
    remote = comfyquant.check(url)
    local = comfyquant.check(local_target)
    index_io = remote.io.get(url, {"requests": 0, "bytes": 0}) if is_index else {"requests": 0, "bytes": 0}
    shard_io = {k: v for k, v in remote.io.items() if k != url or not is_index}
    requests = sum(v["requests"] for v in shard_io.values())
    nbytes = sum(v["bytes"] for v in shard_io.values())
    written = sum(v for p, v in server.written.items() if not p.endswith(".json"))
    # timing: interleaved rounds, cold memo each time (the same for both)
    t_remote, t_local = [], []
    for _ in range(rounds):
        for fn, sink in ((lambda: comfyquant.check(url), t_remote), (lambda: comfyquant.check(local_target), t_local)):
            memo.clear()
            t0 = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - t0)
    return {
        "name": name,
        "shards": len(files),
        "header_only": name.endswith("-hdronly"),
        "requests_per_shard": requests / len(files),
        "max_requests": max(v["requests"] for v in shard_io.values()),
        "index_requests": index_io["requests"],
        "index_bytes": index_io["bytes"],
        "header": header,
        "marker": marker,
        "read": nbytes,
        "ratio": nbytes / (header + marker),
        "written_ratio": written / (header + marker),
        "remote_ms": statistics.median(t_remote) * 1e3,
        "local_ms": statistics.median(t_local) * 1e3,
        "same": findings_of(remote) == findings_of(local) and remote.ok == local.ok,
        "size": sum(os.path.getsize(f) for f in files),
    }


def table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:>{w}}}" if i else f"{{:<{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, r)) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the layouts check_speed --quick uses")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--latency", type=float, default=0.0, metavar="MS", help="server delay before each answer")
    ap.add_argument("--out", help="build the layouts here (kept) instead of a temporary folder")
    args = ap.parse_args()

    root = args.out or tempfile.mkdtemp(prefix="cq-remote-")
    os.makedirs(root, exist_ok=True)
    built: list[tuple[str, str]] = []
    for name, model, fmt, shards, hm, kw in LAYOUTS:
        if args.quick and name not in QUICK:
            continue
        lay = layouts.make_layout(name, model, fmt, shards, hm, **kw)
        built.append((name, layouts.write_layout(lay, os.path.join(root, name))))
        if name in HEADER_ONLY:
            h = header_only(lay)
            built.append((h.name, layouts.write_layout(h, os.path.join(root, h.name))))
    server = RangeServer(root, latency=args.latency / 1e3)
    try:
        results = [measure(name, path, root, server, args.rounds) for name, path in built]
    finally:
        server.close()
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)

    rows = []
    ok = True
    for r in results:
        limit = TARGET_REQUESTS_HEADER_ONLY if r["header_only"] else TARGET_REQUESTS
        meets = r["max_requests"] <= limit and r["ratio"] <= TARGET_BYTES and r["same"]
        ok &= meets
        rows.append(
            [
                r["name"],
                f"{r['size'] / 1e9:.1f} GB",
                r["shards"],
                f"{r['requests_per_shard']:.2f} (<= {limit})",
                r["index_requests"] or "-",
                f"{r['header'] / 1024:.0f}+{r['marker'] / 1024:.0f} KiB",
                f"{r['read'] / 1024:.0f} KiB",
                f"{r['ratio']:.3f}",
                f"{r['index_bytes'] / 1024:.0f} KiB" if r["index_bytes"] else "-",
                f"{r['written_ratio']:.2f}",
                f"{r['remote_ms']:.1f}",
                f"{r['local_ms']:.1f}",
                f"{r['remote_ms'] / r['local_ms']:.1f}x",
                "yes" if r["same"] else "NO",
                "ok" if meets else "MISSED",
            ]
        )
    latency = f", server latency {args.latency:g} ms per request" if args.latency else ""
    print(f"remote check over HTTP on 127.0.0.1 (medians of {args.rounds} rounds{latency})\n")
    print(
        table(
            rows,
            [
                "layout",
                "size",
                "shards",
                "req/shard",
                "index",
                "header+marker",
                "read",
                "read/need",
                "index read",
                "sent/need",
                "remote ms",
                "local ms",
                "vs local",
                "same",
                "target",
            ],
        )
    )
    print(
        "\nreq/shard: requests per shard (the index's own request is under 'index').  read/need: bytes "
        "comfyquant read ÷ (header + marker bytes); target <= 1.2.  sent/need: body bytes the server wrote "
        "to its sockets, the same way (the first request asks for up to 512 KiB and is dropped at the "
        "header's end; loopback buffers absorb the rest)."
    )
    print("\nall targets met" if ok else "\nSOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
