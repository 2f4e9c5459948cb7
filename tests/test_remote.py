"""Remote checks over a real HTTP server on 127.0.0.1: verdicts equal the local check of the
same files, and the requests and bytes read are what the design promises (one request per
header, one per group of nearby markers).  Modes: Range honoured, Range ignored (200 + full
body), failing statuses, flaky 5xx, slow answers, redirects, HTML instead of safetensors; and
fsspec's memory:// filesystem for the non-HTTP path."""

from __future__ import annotations

import http.server
import json
import os
import struct
import sys
import threading
import time
from collections import Counter

import pytest

from builders import dense_layer, fp8_layer, header_markers, int8_layer, w4a8_layer, write, zeros
from comfyquant import check
from comfyquant.checker.run import check_checkpoint
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.remote import FsspecSource, HttpSource, RemoteOptions, coalesce

P = "blocks.0.attn.qkv"
FAST = RemoteOptions(timeout=2.0, backoff=0.01)


class Server:
    """Serves a folder.  ``mode``: "range" (206 for Range requests), "ignore" (always 200 with
    the whole body); ``status`` path -> code; ``flaky`` path -> number of 503s before success;
    ``delay`` seconds before answering; ``redirect`` path -> location; ``types`` path -> type;
    ``drop`` path -> number of answers cut off after half their body; ``gate`` (path, Range)
    -> None, called before each answer (a test holds answers there with events and barriers).
    Counts requests (``log``) and body bytes the server managed to write (``sent``)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.mode = "range"
        self.status: dict[str, int] = {}
        self.flaky: dict[str, int] = {}
        self.redirect: dict[str, str] = {}
        self.types: dict[str, str] = {}
        self.drop: dict[str, int] = {}
        self.delay = 0.0
        self.gate = None
        self.log: list[tuple[str, str | None, int]] = []
        self.sent: Counter = Counter()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def reply(self, code: int, headers: dict, body: bytes = b"") -> None:
                server.log.append((self.path, self.headers.get("Range"), code))
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.drop.get(self.path, 0) > 0 and len(body) > 1:  # half the body, then hang up
                    server.drop[self.path] -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                    return
                try:
                    for i in range(0, len(body), 1 << 16):
                        self.wfile.write(body[i : i + (1 << 16)])
                        server.sent[self.path] += len(body[i : i + (1 << 16)])
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:  # noqa: N802
                path = self.path
                if server.gate is not None:
                    server.gate(path, self.headers.get("Range"))
                if server.delay:
                    time.sleep(server.delay)
                if path in server.redirect:
                    return self.reply(302, {"Location": server.redirect[path]})
                if path in server.status:
                    return self.reply(server.status[path], {"Content-Type": "text/html"}, b"<html>no</html>")
                if server.flaky.get(path, 0) > 0:
                    server.flaky[path] -= 1
                    return self.reply(503, {"Retry-After": "0"}, b"busy")
                file = os.path.join(server.root, path.lstrip("/").split("?")[0])
                if not os.path.isfile(file):
                    return self.reply(404, {}, b"not found")
                with open(file, "rb") as fh:
                    data = fh.read()
                ctype = {"Content-Type": server.types.get(path, "application/octet-stream")}
                rng = self.headers.get("Range")
                if rng and server.mode == "range":
                    a, _, b = rng.removeprefix("bytes=").partition("-")
                    start = int(a)
                    stop = min(int(b) + 1, len(data)) if b else len(data)
                    if start >= len(data):
                        return self.reply(416, {"Content-Range": f"bytes */{len(data)}"})
                    return self.reply(206, {**ctype, "Content-Range": f"bytes {start}-{stop - 1}/{len(data)}"}, data[start:stop])
                return self.reply(200, ctype, data)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                # a handler a test left waiting may answer after the test's files are gone:
                # kept here, not printed into whatever the next test captures from stderr
                server.errors.append(sys.exc_info()[1])

        self.errors: list[BaseException | None] = []
        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def requests(self, name: str | None = None) -> int:
        return len([e for e in self.log if name is None or e[0] == "/" + name])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    s = Server(str(tmp_path))
    yield s
    s.close()


def header_len(path) -> int:
    with open(path, "rb") as fh:
        return 8 + struct.unpack("<Q", fh.read(8))[0]


def same_verdicts(remote, local) -> None:
    """The remote report says what the local one says (file names aside)."""
    r, lc = remote.to_dict(), local.to_dict()
    assert [(f["code"], f["layer"], f["tensor"]) for f in r["findings"]] == [
        (f["code"], f["layer"], f["tensor"]) for f in lc["findings"]
    ]
    assert r["targets"] == lc["targets"] and r["ok"] == lc["ok"] and r["counts"] == lc["counts"]
    assert r["layers"] == lc["layers"]


def broken(tmp_path, name="bad.safetensors"):
    """A checkpoint with the seed defect (transposed, downcast correction) and other layers."""
    return write(
        tmp_path / name,
        w4a8_layer(P, correction=zeros("BF16", (32, 16))),
        int8_layer("b.int8"),
        fp8_layer("c.fp8"),
        dense_layer("norm"),
    )


# -- single files ------------------------------------------------------------------------------


def test_single_file_same_verdict_two_requests(tmp_path, server):
    path = broken(tmp_path)
    remote = check(server.url("bad.safetensors"))
    local = check(path)
    same_verdicts(remote, local)
    assert not remote.ok
    # one request for length + header, one for the three markers (closer than the 64 KiB gap)
    assert server.requests() == 2
    io = remote.io[server.url("bad.safetensors")]
    assert io["requests"] == 2
    with open(path, "rb") as fh:
        raw = fh.read()
    with open_checkpoint(path) as ckpt:
        markers = sorted((e.start, e.end) for e in ckpt.tensors.values() if e.name.endswith(".comfy_quant"))
    span = markers[-1][1] - markers[0][0]
    assert io["bytes"] == header_len(path) + span < len(raw)


def test_markers_only_in_header_cost_one_request(tmp_path, server):
    marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
    write(
        tmp_path / "h.safetensors",
        int8_layer("a", marker=False),
        int8_layer("b", marker=False),
        metadata=header_markers({"a": marker, "b": marker}),
    )
    r = check(server.url("h.safetensors"))
    assert r.ok
    assert server.requests() == 1
    assert r.io[server.url("h.safetensors")]["bytes"] == header_len(tmp_path / "h.safetensors")


def test_gap_decides_coalescing(tmp_path, server):
    layers = {}
    for i in range(4):
        layers.update(int8_layer(f"l{i}", n=256, k=512))  # 128 KiB of weight between markers
    path = write(tmp_path / "m.safetensors", layers)
    url = server.url("m.safetensors")
    with open_checkpoint(url, remote=RemoteOptions(gap=0, parallel=1)) as ckpt:
        assert ckpt.io_stats()[url]["requests"] == 1 + 4
        separate = ckpt.io_stats()[url]["bytes"]
    with open_checkpoint(url, remote=RemoteOptions(gap=1 << 20)) as ckpt:
        assert ckpt.io_stats()[url]["requests"] == 1 + 1
        assert ckpt.io_stats()[url]["bytes"] > separate + 3 * 128 * 1024
    assert check(url).ok == check(path).ok


def test_large_header_costs_exactly_one_more_request(tmp_path, server):
    layers = {}
    for i in range(200):
        layers.update(int8_layer(f"blocks.{i}.a_rather_long_layer_name_to_grow_the_header", n=16, k=256, marker=False))
    path = write(tmp_path / "big.safetensors", layers)
    n = header_len(path)
    assert n > 16 * 1024
    url = server.url("big.safetensors")
    opts = RemoteOptions(first_read=16 * 1024)
    with open_checkpoint(url, remote=opts) as ckpt:
        io = ckpt.io_stats()[url]
    assert io == {"requests": 2, "bytes": n}
    # the default first read (512 KiB) takes the whole header at once, and only the header
    with open_checkpoint(url) as ckpt:
        assert ckpt.io_stats()[url] == {"requests": 1, "bytes": n}


def test_deep_reads_small_tensors_coalesced(tmp_path, server):
    path = broken(tmp_path)
    url = server.url("bad.safetensors")
    remote = check(url, deep=True)
    same_verdicts(remote, check(path, deep=True))
    assert remote.io[url]["requests"] <= 4


# -- shards and index ------------------------------------------------------------------------


def sharded(tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    a = write(d / "model-00001-of-00002.safetensors", w4a8_layer("blocks.0.q"), dense_layer("norm"))
    b = write(d / "model-00002-of-00002.safetensors", w4a8_layer("blocks.1.q", correction=zeros("BF16", (32, 16))))
    wm = {}
    for f in (a, b):
        with open_checkpoint(f) as ck:
            wm.update(dict.fromkeys(ck.tensors, os.path.basename(f)))
    with open(d / "model.safetensors.index.json", "w") as fh:
        json.dump({"metadata": {}, "weight_map": wm}, fh)
    return str(d), a, b


def test_index_url_brings_its_shards(tmp_path, server):
    folder, a, b = sharded(tmp_path)
    url = server.url("sharded/model.safetensors.index.json")
    remote = check(url)
    same_verdicts(remote, check(folder))
    assert remote.files == [
        server.url("sharded/model-00001-of-00002.safetensors"),
        server.url("sharded/model-00002-of-00002.safetensors"),
    ]
    assert remote.io[url]["requests"] == 1
    assert server.requests() == 1 + 2 * 2  # the index, then header + markers per shard
    for f in (a, b):
        io = remote.io[server.url("sharded/" + os.path.basename(f))]
        assert io["requests"] == 2 and io["bytes"] < header_len(f) + 1024


def test_shards_are_opened_and_their_markers_fetched_concurrently(tmp_path, server):
    """Every request happens while the shards are opened (one thread each): the marker round
    trips of the shards overlap; reading the checkpoint afterwards costs nothing more.  The
    overlap is proven by a barrier, not a clock: the server answers the first request of
    either shard only once both are in flight, which shards opened one after the other could
    never do."""
    from comfyquant.io.remote import open_remote

    sharded(tmp_path)
    both = threading.Barrier(2, timeout=30)
    broken = []

    def gate(path, rng):
        if path.startswith("/sharded/model-") and (rng or "").startswith("bytes=0-"):
            try:
                both.wait()
            except threading.BrokenBarrierError:
                broken.append(path)

    server.gate = gate
    ss, sources = open_remote([server.url("sharded/model.safetensors.index.json")])
    assert broken == []
    assert server.requests() == 1 + 2 * 2
    with open_checkpoint([], sources=sources, shardset=ss) as ckpt:
        assert ckpt.markers.records
    assert server.requests() == 5


def test_shard_urls_given_one_by_one(tmp_path, server):
    folder, a, b = sharded(tmp_path)
    urls = [server.url("sharded/" + os.path.basename(f)) for f in (a, b)]
    same_verdicts(check(urls), check([a, b]))
    assert server.requests() == 4


def test_missing_shard_is_a_finding_like_locally(tmp_path, server):
    folder, a, b = sharded(tmp_path)
    os.remove(b)
    r = check(server.url("sharded/model.safetensors.index.json"))
    assert any(f.code == "C011" and "model-00002-of-00002" in f.message for f in r.findings)
    assert [f.code for f in r.findings if f.code.startswith("C")] == [
        f.code for f in check(folder).findings if f.code.startswith("C")
    ]


def test_redirect_is_counted_and_followed_once(tmp_path, server):
    broken(tmp_path)
    server.redirect["/hub/bad.safetensors"] = "/bad.safetensors"
    r = check(server.url("hub/bad.safetensors"))
    assert not r.ok
    # redirect + first read, then the marker range goes straight to the redirect's target
    assert r.io[server.url("hub/bad.safetensors")]["requests"] == 3
    assert [e[0] for e in server.log] == ["/hub/bad.safetensors", "/bad.safetensors", "/bad.safetensors"]


def test_redirect_loop_is_one_line(server):
    server.redirect["/a.safetensors"] = "/b.safetensors"
    server.redirect["/b.safetensors"] = "/a.safetensors"
    with pytest.raises(InputError) as exc:
        open_checkpoint(server.url("a.safetensors"), remote=FAST)
    assert "too many or unusable redirects (HTTP 302)" in str(exc.value) and "\n" not in str(exc.value)


# -- failures: one line, exit 2 ------------------------------------------------------------------


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *args) -> str:
    rc, out, err = cli(capsys, "check", *args)
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_server_ignoring_range_is_stopped_not_downloaded(tmp_path, server):
    # a 3 MB file, larger than the first read: the 200 answer must not be read
    write(tmp_path / "big.safetensors", int8_layer("a", n=1024, k=3072))
    server.mode = "ignore"
    url = server.url("big.safetensors")
    with pytest.raises(InputError, match="ignores Range requests") as exc:
        HttpSource(url, options=FAST)
    assert str(exc.value).startswith(url) and "3,1" in str(exc.value)


def test_server_ignoring_range_cli(tmp_path, server, capsys):
    write(tmp_path / "big.safetensors", int8_layer("a", n=1024, k=3072))
    server.mode = "ignore"
    err = one_line_error(capsys, server.url("big.safetensors"))
    assert "ignores Range requests" in err and "stopped instead of downloading it" in err


def test_small_file_served_whole_is_fine(tmp_path, server):
    path = broken(tmp_path)
    server.mode = "ignore"
    url = server.url("bad.safetensors")
    remote = check(url)
    same_verdicts(remote, check(path))
    assert remote.io[url] == {"requests": 1, "bytes": os.path.getsize(path)}


@pytest.mark.parametrize(
    "code, needle, attempts",
    [
        (404, "not found (HTTP 404)", 1),
        (403, "access denied (HTTP 403 Forbidden)", 1),
        (500, "server error (HTTP 500 Internal Server Error) (after 4 attempts)", 4),
        (418, "HTTP 418", 1),
    ],
)
def test_http_errors(tmp_path, server, code, needle, attempts):
    broken(tmp_path)
    server.status["/bad.safetensors"] = code
    url = server.url("bad.safetensors")
    with pytest.raises(InputError) as exc:
        open_checkpoint(url, remote=FAST)
    assert str(exc.value).startswith(f"{url}: ") and needle in str(exc.value), str(exc.value)
    assert server.requests() == attempts


def test_http_error_cli_is_one_line(tmp_path, server, capsys):
    broken(tmp_path)
    server.status["/bad.safetensors"] = 403
    err = one_line_error(capsys, server.url("bad.safetensors"))
    assert err.startswith(f"comfyquant: {server.url('bad.safetensors')}: access denied")


def test_5xx_retried_with_backoff_then_succeeds(tmp_path, server):
    path = broken(tmp_path)
    server.flaky["/bad.safetensors"] = 2
    url = server.url("bad.safetensors")
    with open_checkpoint(url, remote=FAST) as ckpt:
        r = check_checkpoint(ckpt)
    same_verdicts(r, check(path))
    assert r.io[url]["requests"] == 2 + 2  # two 503s, then header and markers


def test_connection_dropped_mid_body_is_retried(tmp_path, server):
    path = broken(tmp_path)
    # the first answer is cut after the header (nothing missing), the marker answer is cut: retried
    server.drop["/bad.safetensors"] = 2
    url = server.url("bad.safetensors")
    with open_checkpoint(url, remote=FAST) as ckpt:
        r = check_checkpoint(ckpt)
    same_verdicts(r, check(path))
    assert server.requests() == 1 + 2
    assert r.io[url]["requests"] == 3
    server.drop["/bad.safetensors"] = 10
    with pytest.raises(InputError, match=r"connection lost after \d+ of \d+ bytes \(after 4 attempts\)"):
        HttpSource(url, options=FAST)


def test_timeout(tmp_path, server, capsys):
    """The server holds its answer until the test is over: the check ends on its own, with
    the timeout's error, before any answer was sent (no clock is read)."""
    broken(tmp_path)
    release = threading.Event()
    server.gate = lambda path, rng: release.wait(60)
    try:
        err = one_line_error(capsys, server.url("bad.safetensors"), "--timeout", "0.2")
        answered = server.requests()
    finally:
        release.set()
    assert "no answer within 0.2 s" in err and answered == 0


def test_html_instead_of_safetensors(tmp_path, server, capsys):
    (tmp_path / "page.safetensors").write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    server.types["/page.safetensors"] = "text/html; charset=utf-8"
    err = one_line_error(capsys, server.url("page.safetensors"))
    assert "not a safetensors file" in err and "text/html" in err and "<!DOCTYPE html>" in err


def test_binary_garbage_and_truncation(tmp_path, server, capsys):
    """A remote file nothing can read gets a report as a local one does: C009 says why, and
    every runtime FAILS with the SafetensorError safetensors raises opening it."""
    (tmp_path / "noise.safetensors").write_bytes(bytes(range(256)) * 4)
    rc, out, err = cli(capsys, "check", server.url("noise.safetensors"))
    assert rc == 1 and err == "" and "C009" in out and "header length" in out
    assert "FAILS  SafetensorError: Error while deserializing header: header too large" in out
    (tmp_path / "empty.safetensors").write_bytes(b"")
    rc, out, err = cli(capsys, "check", server.url("empty.safetensors"))
    assert rc == 1 and err == "" and "truncated: 0 bytes" in out
    assert "FAILS  SafetensorError: Error while deserializing header: header too small" in out


def test_connection_refused_and_bad_urls(capsys, server):
    port = server.httpd.server_address[1]
    server.close()
    err = one_line_error(capsys, f"http://127.0.0.1:{port}/x.safetensors", "--timeout", "2")
    assert "cannot connect" in err
    err = one_line_error(capsys, "https://example.com/some/folder/")
    assert "cannot list a folder" in err


def test_index_errors(tmp_path, server, capsys):
    (tmp_path / "bad.safetensors.index.json").write_text("{not json")
    err = one_line_error(capsys, server.url("bad.safetensors.index.json"))
    assert "index is not valid JSON" in err
    err = one_line_error(capsys, server.url("nope.safetensors.index.json"))
    assert "not found (HTTP 404)" in err


def test_mixing_local_and_remote_is_refused(tmp_path, server, capsys):
    path = broken(tmp_path)
    err = one_line_error(capsys, path, server.url("bad.safetensors"))
    assert "cannot mix local paths and URLs" in err


# -- CLI: -v and --json report requests and bytes ---------------------------------------------


def test_cli_json_and_verbose_report_io(tmp_path, server, capsys):
    folder, a, b = sharded(tmp_path)
    url = server.url("sharded/model.safetensors.index.json")
    rc, out, _ = cli(capsys, "check", url, "--json", "--gap", "0", "--timeout", "5")
    assert rc == 1
    doc = json.loads(out)
    assert doc["io"][url]["requests"] == 1
    shard = server.url("sharded/model-00001-of-00002.safetensors")
    assert doc["io"][shard]["requests"] == 2 and doc["io"][shard]["bytes"] > header_len(a) - 1
    rc, out, _ = cli(capsys, "check", url, "-v")
    assert f"read {shard}: 2 requests" in out
    rc, out, _ = cli(capsys, "inspect", url, "--json")
    assert rc == 0 and json.loads(out)["io"][shard]["requests"] == 2
    rc, out, _ = cli(capsys, "inspect", url)
    assert rc == 0 and "asym_w4a8_int8" in out


# -- fsspec (memory://) ------------------------------------------------------------------------


def test_fsspec_memory_filesystem(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    folder, a, b = sharded(tmp_path)
    fs = fsspec.filesystem("memory")
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as fh:
            fs.pipe(f"/cq-test/{name}", fh.read())
    try:
        index = "memory://cq-test/model.safetensors.index.json"
        same_verdicts(check(index), check(folder))
        same_verdicts(check("memory://cq-test/"), check(folder))  # a folder with an index
        r = check(index)
        shard = "memory://cq-test/model-00001-of-00002.safetensors"
        assert r.io[shard]["requests"] == 3  # size, header, markers
        src = FsspecSource("memory://cq-test/model-00002-of-00002.safetensors")
        assert src.size == os.path.getsize(b) and src.pread(0, 8) == open(b, "rb").read(8)
        with pytest.raises(InputError, match="not found"):
            FsspecSource("memory://cq-test/nope.safetensors")
    finally:
        fs.rm("/cq-test", recursive=True)


def test_missing_fsspec_implementation_names_the_package(capsys):
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401

        pytest.skip("s3fs is installed")
    except ImportError:
        pass
    err = one_line_error(capsys, "s3://bucket/model.safetensors")
    assert "pip install s3fs" in err
    err = one_line_error(capsys, "nosuchproto://bucket/model.safetensors")
    assert "unknown protocol" in err


def test_coalesce():
    ranges = [(1000, 10), (0, 10), (30, 5), (5000, 1)]
    assert coalesce(ranges, gap=20) == [(0, 35, [1, 2]), (1000, 1010, [0]), (5000, 5001, [3])]
    assert coalesce(ranges, gap=10_000) == [(0, 5001, [1, 2, 0, 3])]
    assert coalesce(ranges, gap=10_000, max_span=2000) == [(0, 1010, [1, 2, 0]), (5000, 5001, [3])]
