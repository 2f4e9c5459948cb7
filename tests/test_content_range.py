"""A range answer whose ``Content-Range`` contradicts itself or the request is refused in one
line naming the URL, never taken for the file size: ``bytes 0-65535/32767`` made ``check
--deep`` report a healthy file as truncated (C002).  A real HTTP server on 127.0.0.1 forges
the headers."""

from __future__ import annotations

import http.server
import os
import threading

import pytest

import builders as b
from comfyquant.checker.run import check_checkpoint
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.remote import RemoteOptions

FAST = RemoteOptions(timeout=5.0, backoff=0.01, retries=0)


class ForgingServer:
    """Serves one file with honest range answers, except that ``forge(start, stop, size)``
    may return other ``(Content-Range, Content-Length or None, status)`` for a request."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as fh:
            self.data = fh.read()
        self.forge = lambda start, stop, size: None
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server.requests += 1
                first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
                start, stop = int(first), min(int(last) + 1, len(server.data))
                body = server.data[start:stop]
                forged = server.forge(start, stop, len(server.data))
                cr, length, status = forged or (f"bytes {start}-{stop - 1}/{len(server.data)}", None, 206)
                self.send_response(status)
                self.send_header("Content-Range", cr)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                try:
                    self.wfile.write(body[: len(body) if length is None else min(length, len(body))])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/m.safetensors"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path):
    path = b.write(  # 80 KiB: larger than the reported case's 64 KiB span
        tmp_path / "m.safetensors", *(b.int8_layer(f"blocks.{i}.attn", n=80, k=256) for i in range(4)), b.dense_layer("head")
    )
    s = ForgingServer(path)
    yield s, path
    s.close()


FIRST_ANSWERS = {
    "the reported case": lambda start, stop, size: ("bytes 0-65535/32767", None, 206),
    "end past its own total": lambda start, stop, size: (f"bytes 0-{2 * size - 1}/{size}", None, 206),
    "end past a smaller total": lambda start, stop, size: (f"bytes 0-{stop - 1}/{stop // 2}", None, 206),
    "start after end": lambda start, stop, size: (f"bytes {stop - 1}-0/{size}", None, 206),
    "total zero": lambda start, stop, size: (f"bytes 0-{stop - 1}/0", None, 206),
    "not from byte 0": lambda start, stop, size: (f"bytes 8-{stop - 1}/{size}", None, 206),
    "garbage after the total": lambda start, stop, size: (f"bytes 0-{stop - 1}/{size}x", None, 206),
    "length not the span": lambda start, stop, size: (f"bytes 0-{stop - 1}/{size}", (stop - start) // 2, 206),
    "416 for a file it says is not empty": lambda start, stop, size: (f"bytes */{size}", 0, 416),
}


@pytest.mark.parametrize("case", list(FIRST_ANSWERS))
def test_a_first_answer_that_contradicts_itself_is_refused(served, capsys, case):
    server, _path = served
    server.forge = FIRST_ANSWERS[case]
    for args in (["check", "--deep", "--timeout", "5", server.url], ["inspect", "--timeout", "5", server.url]):
        assert main(args) == 2, case
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith(f"comfyquant: {server.url}: "), err
        assert "C002" not in err and "truncated" not in err and "internal error" not in err
        assert "Content-Range" in err, err  # the answer is named, not a damage the file does not have


LATER_ANSWERS = {
    "a span other than the one asked": lambda start, stop, size: (f"bytes {start}-{stop}/{size}", stop - start + 1, 206),
    "a total other than the file's": lambda start, stop, size: (f"bytes {start}-{stop - 1}/{size + 100}", None, 206),
    "end past its own total": lambda start, stop, size: (f"bytes {start}-{stop - 1}/{start}", None, 206),
    "length not the span": lambda start, stop, size: (f"bytes {start}-{stop - 1}/{size}", (stop - start) // 2, 206),
}


@pytest.mark.parametrize("case", list(LATER_ANSWERS))
def test_a_later_answer_that_contradicts_itself_is_refused(served, case):
    """--deep reads the scales with further range requests: each answer is held to its request."""
    server, path = served
    header = 8 + int.from_bytes(open(path, "rb").read(8), "little")
    opts = RemoteOptions(timeout=5.0, backoff=0.01, retries=0, first_read=header, prefetch=False)
    forge = LATER_ANSWERS[case]
    server.forge = lambda start, stop, size: forge(start, stop, size) if start >= header else None
    with pytest.raises(InputError, match=f"^{server.url}: "):
        with open_checkpoint(server.url, remote=opts) as ckpt:
            check_checkpoint(ckpt, deep=True)


def test_honest_answers_still_check_clean(served, capsys):
    server, path = served
    assert main(["check", "--deep", server.url]) == 0
    remote = capsys.readouterr().out
    assert main(["check", "--deep", path]) == 0
    local = capsys.readouterr().out
    assert remote.splitlines()[1:] == local.splitlines()[1:]
    assert os.path.getsize(path) == len(server.data)
