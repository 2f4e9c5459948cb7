"""Remote byte sources: check a checkpoint on an HTTP server, a model hub or an object store
without downloading it.  ``check`` needs each shard's header and its marker bytes — a few
hundred KB of a 10–30 GB file — so a remote check is a handful of range requests.

Which client, and why
---------------------
``http://`` and ``https://`` use the standard library (``urllib``), not fsspec's HTTP
filesystem.  fsspec's HTTP needs aiohttp (an extra dependency; with fsspec itself ~0.2 s of
imports and an event-loop thread), asks the server for the size before the first range, and its
file objects read ahead in blocks: the number of requests and the bytes read would be its
cache's decision.  What makes a remote check cheap needs control of every request: the first
read is *one* request whose body is read only up to the end of the header, a server that ignores
``Range`` is recognised from the status line before any of its body is read, and marker ranges
are coalesced into as few requests as the gap allows.  urllib gives that, follows redirects
(hubs redirect to a CDN), honours the ``*_proxy`` variables and adds no dependency.

Every other protocol (``s3://``, ``gs://``, ``hf://``, ``az://``, ``memory://`` ...) goes through
fsspec and the implementation the user installed (s3fs, gcsfs, huggingface_hub, adlfs), which own
authentication and endpoints; comfyquant should not reimplement them.  Those files are opened
with ``cache_type="none"`` so each read is one exact range request; opening costs one request
(the size), and the first read is a plain ``first_read``-byte range (no early stop).

The speculative first read (HTTP)
---------------------------------
One ``GET`` with ``Range: bytes=0-{first_read - 1}`` (512 KiB: quantized Flux, Qwen-Image and Wan
headers are 60–400 KB).  Its ``Content-Range`` gives the file size (no ``HEAD``); comfyquant
reads the 8-byte length, then exactly the header, and drops the connection.  ``bytes`` counts
what was read; what the server had already put on the wire beyond the header is bounded by the
range and, on a real link, by one bandwidth-delay product — the price of one round trip, which
is what reading the header in a second request would have cost.  A header longer than the
range costs exactly one more request for the rest.  A ``200`` answer means the server ignores
``Range``: a body no larger than ``first_read`` is the whole (small) file and is kept; a larger
one is never read — the check stops with an error instead of downloading the checkpoint.

Errors are one line naming the URL: 404/410 not found, 401/403 access denied, 408/425/429/5xx
and dropped connections are retried ``retries`` times with exponential backoff, a timeout is
not.  ``timeout`` bounds the whole read of a checkpoint (every request, retry and shard): at the
deadline a watchdog shuts the sockets down, so even a server that trickles bytes cannot hold a
read past it.  Content that is not safetensors is named by its first bytes.
"""

from __future__ import annotations

import json
import posixpath
import re
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import InputError, option
from ..installing import extra_command
from .header import MAX_HEADER_BYTES
from .shards import ShardSet, is_url, read_index
from .timeouts import timeout_problem

if TYPE_CHECKING:
    import http.client
    import socket
    import urllib.error
    import urllib.request

FIRST_READ = 512 * 1024
"""Speculative first read: one request for headers up to this size (minus 8 bytes)."""
DEFAULT_GAP = 64 * 1024
"""Marker ranges closer than this share one request (over-reading the bytes in between)."""
MAX_SPAN = 64 * 1024 * 1024
"""Coalescing never builds a request larger than this (a single larger range is read as is)."""
MAX_INDEX_BYTES = 64 * 1024 * 1024
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
USER_AGENT = "comfyquant (header check; range requests)"

# fsspec protocol -> package that implements it (for the "install X" message).
PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "hf": "huggingface_hub",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "adl": "adlfs",
    "oci": "ocifs",
    "webhdfs": "fsspec",
    "sftp": "paramiko",
    "ssh": "paramiko",
    "smb": "smbprotocol",
    "gdrive": "gdrivefs",
    "dropbox": "dropboxdrivefs",
}


class RemoteOptions:
    """How remote sources read: timeouts, retries, first-read size and coalescing gap."""

    __slots__ = ("timeout", "gap", "first_read", "retries", "backoff", "parallel", "max_span", "prefetch", "deadline")

    def __init__(
        self,
        timeout: float = 30.0,
        gap: int = DEFAULT_GAP,
        first_read: int = FIRST_READ,
        retries: int = 3,
        backoff: float = 0.5,
        parallel: int = 8,
        max_span: int = MAX_SPAN,
        prefetch: bool = True,
    ) -> None:
        self.timeout = _checked_timeout(timeout)
        """Seconds the whole remote read of one checkpoint may take (every request, retry and
        wait of every shard): ``open_remote`` turns it into ``deadline``."""
        self.gap = gap
        self.first_read = max(8, first_read)
        self.retries = retries
        """Extra attempts after a 408/425/429/5xx answer or a dropped connection."""
        self.backoff = backoff
        """First retry delay in seconds, doubled for each further attempt (``Retry-After`` wins
        when the server sends a shorter one)."""
        self.parallel = parallel
        """Concurrent requests within one checkpoint (shard openings, coalesced spans)."""
        self.max_span = max_span
        self.prefetch = prefetch
        """HTTP: fetch the marker spans while opening (see ``HttpSource._prefetch_markers``)."""
        self.deadline: float | None = None
        """``time.monotonic()`` by which every read must be done (None: each wait is bounded
        by ``timeout`` alone)."""

    def started(self) -> RemoteOptions:
        """A copy whose ``deadline`` is ``timeout`` seconds from now: one checkpoint's read."""
        new = RemoteOptions.__new__(RemoteOptions)
        for name in self.__slots__:
            setattr(new, name, getattr(self, name))
        new.timeout = _checked_timeout(self.timeout)  # set after construction, as the CLI does
        new.deadline = time.monotonic() + new.timeout
        return new

    def remaining(self) -> float:
        """Seconds left before the deadline (``timeout`` when there is none); never negative."""
        if self.deadline is None:
            return self.timeout
        return max(0.0, self.deadline - time.monotonic())


def _checked_timeout(value) -> float:
    problem = timeout_problem(value)
    if problem is not None:
        raise ValueError(f"RemoteOptions timeout {problem}")
    return float(value)


class RemoteNotFound(InputError):
    """The URL does not exist (a shard an index names becomes a finding, not an error)."""


# -- coalescing ------------------------------------------------------------------------------


def coalesce(ranges: list[tuple[int, int]], gap: int, max_span: int = MAX_SPAN) -> list[tuple[int, int, list[int]]]:
    """Group ``(offset, length)`` ranges (any order) into spans ``(start, end, indexes)``: ranges
    whose distance is at most ``gap`` share a span unless it would exceed ``max_span`` bytes."""
    spans: list[tuple[int, int, list[int]]] = []
    for i in sorted(range(len(ranges)), key=lambda i: ranges[i][0]):
        off, n = ranges[i]
        end = off + n
        if spans:
            s, e, idx = spans[-1]
            if off - e <= gap and max(e, end) - s <= max_span:
                spans[-1] = (s, max(e, end), idx)
                idx.append(i)
                continue
        spans.append((off, end, [i]))
    return spans


_MARKER_ENTRY = re.compile(rb'\.comfy_quant"\s*:\s*(\{[^{}]*\})')


def marker_ranges(raw: bytes, base: int, size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of every ``*.comfy_quant`` tensor in a raw header (a regex scan: far
    cheaper than a second ``json.loads`` of a 300 KB header).  A range it gets wrong only costs
    bytes: readers are always served the exact bytes they ask for."""
    out = []
    for m in _MARKER_ENTRY.finditer(raw):
        try:
            a, b = json.loads(m.group(1))["data_offsets"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if type(a) is int and type(b) is int and 0 <= a <= b and base + b <= size:
            out.append((base + a, b - a))
    return out


def _split(ranges: list[tuple[int, int]], spans: list[tuple[int, int, list[int]]], blocks: list[bytes]) -> list[bytes]:
    out: list[bytes] = [b""] * len(ranges)
    for (s, _e, idx), block in zip(spans, blocks):
        for i in idx:
            off, n = ranges[i]
            out[i] = block[off - s : off - s + n]
    return out


def _map(fn: Callable, items: list, parallel: int) -> list:
    """``[fn(x) for x in items]``, with up to ``parallel`` threads when there are several."""
    if len(items) <= 1 or parallel <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(parallel, len(items))) as pool:
        futures = [pool.submit(fn, x) for x in items]
    return [f.result() for f in futures]  # the first failure (in order) is raised


def _one_line(what: object) -> str:
    """The first line of an exception's (or any object's) text: errors are one line."""
    text = str(what).strip().splitlines()
    return text[0] if text else type(what).__name__


# -- HTTP ------------------------------------------------------------------------------------

_OPENER: urllib.request.OpenerDirector | None = None
_HOPS = threading.local()
_LIVE = threading.local()
"""The ``_Watchdog`` of the request running in this thread (its connections register)."""


class _Watchdog:
    """Enforces the deadline on one ``get``: at the deadline it shuts down the sockets of the
    request, so a server that trickles a byte every half second (each wait shorter than any
    per-wait timeout) cannot hold the read past ``--timeout``: the blocked read returns at once."""

    def __init__(self, remaining: float) -> None:
        self.fired = False
        self.answered = False
        """Whether the server's status line arrived (for the error's wording)."""
        self._socks: list = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._timer = threading.Timer(remaining, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            socks = list(self._socks)
        self._wake.set()
        for sock in socks:
            _shutdown(sock)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            fired = self.fired
        if fired:
            _shutdown(sock)

    def sleep(self, seconds: float) -> None:
        """A retry's backoff, cut short by the deadline."""
        self._wake.wait(seconds)

    def cancel(self) -> None:
        self._timer.cancel()


def _shutdown(sock: socket.socket) -> None:
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watch(conn: http.client.HTTPConnection) -> None:
    """Hand a freshly connected socket to the current request's watchdog, which can shut it down."""
    dog = getattr(_LIVE, "dog", None)
    if dog is not None:
        dog.watch(conn.sock)


def _opener() -> urllib.request.OpenerDirector:
    """A urllib opener that counts redirects (each one is a request the server answered)."""
    global _OPENER
    if _OPENER is None:
        import urllib.request

        class CountingRedirects(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, req, fp, code, msg, headers, newurl):
                _HOPS.n = getattr(_HOPS, "n", 0) + 1
                return super().redirect_request(req, fp, code, msg, headers, newurl)

        import http.client

        class WatchedHttp(http.client.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                _watch(self)

        class Http(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(WatchedHttp, req)

        handlers: list[type[urllib.request.BaseHandler]] = [CountingRedirects, Http]
        if hasattr(http.client, "HTTPSConnection"):

            class WatchedHttps(http.client.HTTPSConnection):
                def connect(self) -> None:
                    super().connect()
                    _watch(self)

            class Https(urllib.request.HTTPSHandler):
                def https_open(self, req):
                    # typeshed leaves out the handler's private SSL context, which urllib's own
                    # https_open passes the same way.
                    kw = {"context": self._context}  # type: ignore[attr-defined]
                    if hasattr(self, "_check_hostname"):
                        kw["check_hostname"] = self._check_hostname
                    return self.do_open(WatchedHttps, req, **kw)

            handlers.append(Https)
        _OPENER = urllib.request.build_opener(*handlers)
    return _OPENER


_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*", re.IGNORECASE)


def _content_range(value: str | None) -> tuple[int | None, int | None, int | None]:
    """``bytes a-b/total`` -> (a, b, total); ``bytes */total`` -> (None, None, total);
    ``total`` None when the server writes ``*``.  A header that contradicts itself is treated
    as absent, (None, None, None): a span that ends before it starts, or past the total it
    states (``bytes 0-65535/32767``), or a span over an empty file.  Its total must never
    become the file size, nor its span be taken for the bytes asked for."""
    match = _CONTENT_RANGE.fullmatch(value.strip()) if value else None
    if match is None:
        return None, None, None
    first, last, total_text = match.groups()
    total = None if total_text == "*" else int(total_text)
    if first is None:
        return (None, None, None) if total is None else (None, None, total)
    a, b = int(first), int(last)
    if b < a or (total is not None and b >= total):
        return None, None, None
    return a, b, total


def _length_problem(resp: http.client.HTTPResponse, a: int, b: int) -> str | None:
    """Why a 206 answer's ``Content-Length`` contradicts its ``Content-Range`` span, or None."""
    length = resp.headers.get("Content-Length")
    if length is None or not length.strip().isdigit():
        return None
    if int(length) != b - a + 1:
        return f"Content-Length {int(length):,} for the {b - a + 1:,} bytes of its Content-Range"
    return None


def _status(resp) -> int:
    """The status of a response or of an HTTPError (which carries ``code``)."""
    return getattr(resp, "status", None) or resp.code


def _looks_like_text(data: bytes) -> bool:
    return bool(data) and all(32 <= c < 127 or c in (9, 10, 13) for c in data)


class _Retry(Exception):
    """Internal: this attempt failed in a way worth another try."""

    def __init__(self, why: str, delay: float | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.delay = delay


class HttpClient:
    """Counted, retried ``GET`` requests for one URL (no connection is kept between them)."""

    def __init__(self, name: str, url: str | None = None, options: RemoteOptions | None = None) -> None:
        self.name = name
        """What messages and reports call this file: the URL as given (or as an index joined it)."""
        self.url = url or name
        """Where requests go: after the first redirect, its target (no redirect per range)."""
        self.options = options or RemoteOptions()
        self.reads = 0
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _count(self, requests: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.reads += requests
            self.bytes_read += nbytes

    def read_body(self, resp: http.client.HTTPResponse, n: int) -> bytes:
        """Up to ``n`` bytes of ``resp``'s body (fewer only when it ends)."""
        parts = []
        got = 0
        try:
            while got < n:
                chunk = resp.read1(min(n - got, 1 << 20)) if hasattr(resp, "read1") else resp.read(min(n - got, 1 << 20))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        except TimeoutError:
            raise InputError(
                f"{self.name}: the server stopped sending for {self.options.timeout:g} s ({option('--timeout', 'timeout')})"
            ) from None
        except Exception as exc:  # reset, aborted, http.client.IncompleteRead: worth another try
            raise _Retry(f"connection lost while reading ({_one_line(exc)})") from None
        finally:
            self._count(0, got)
        return b"".join(parts)

    def get(self, consume: Callable, start: int | None = None, stop: int | None = None):
        """``GET`` (bytes ``[start, stop)`` when given) and return ``consume(response)``.

        Retries 408/425/429/5xx answers and dropped connections with backoff; every other
        failure is one ``InputError`` line naming the URL.  ``consume`` may raise
        ``_Retry`` for a body that broke off.  A 416 answer is passed to ``consume``.
        With a deadline (``RemoteOptions.started``), everything ends by it: retries included."""
        opts = self.options
        if opts.deadline is None:
            return self._get(consume, start, stop, None)
        remaining = opts.remaining()
        if remaining <= 0:
            raise self._deadline_error(False)
        dog = _Watchdog(remaining)
        _LIVE.dog = dog
        try:
            result = self._get(consume, start, stop, dog)
            if dog.fired:  # the sockets were shut down under the read: what it got may be cut short
                raise TimeoutError
            return result
        except BaseException as exc:
            if dog.fired and not isinstance(exc, KeyboardInterrupt):
                raise self._deadline_error(dog.answered) from None
            raise
        finally:
            dog.cancel()
            _LIVE.dog = None

    def _deadline_error(self, answered: bool = True) -> InputError:
        if not answered:
            return self._timeout()
        return InputError(
            f"{self.name}: not read within {self.options.timeout:g} s ({option('--timeout', 'timeout')} bounds the whole "
            "remote read; the server sends too slowly)"
        )

    def _get(self, consume: Callable, start: int | None, stop: int | None, dog: _Watchdog | None):
        import http.client
        import urllib.error
        import urllib.request

        opts = self.options
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if start is not None:
            headers["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
        attempt = 0
        while True:
            _HOPS.n = 0
            try:
                try:
                    req = urllib.request.Request(self.url, headers=headers)
                    resp = _opener().open(req, timeout=opts.timeout if dog is None else min(opts.timeout, opts.remaining()))
                    if dog is not None:
                        dog.answered = True
                except urllib.error.HTTPError as exc:
                    self._count(1 + _HOPS.n)
                    try:
                        if exc.code == 416:
                            return consume(exc)
                        self._status_error(exc)  # raises InputError or _Retry
                    finally:
                        try:
                            exc.close()
                        except Exception:
                            pass
                self._count(1 + _HOPS.n)
                final = resp.geturl()
                if final and final != self.url:
                    self.url = final  # later ranges skip the redirect
                with resp:
                    return consume(resp)
            except _Retry as retry:
                if attempt >= opts.retries:
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise InputError(f"{self.name}: {retry.why}{tries}") from None
                delay = opts.backoff * (2**attempt)
                if retry.delay is not None:
                    delay = min(delay, retry.delay)
                self._sleep(delay, dog)
                attempt += 1
            except InputError:
                raise
            except urllib.error.URLError as exc:
                reason = exc.reason
                if isinstance(reason, TimeoutError):
                    raise self._timeout() from None
                if isinstance(reason, (ConnectionResetError, ConnectionAbortedError)) and attempt < opts.retries:
                    self._sleep(opts.backoff * (2**attempt), dog)
                    attempt += 1
                    continue
                text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
                raise InputError(f"{self.name}: cannot connect ({_one_line(text)})") from None
            except TimeoutError:
                raise self._timeout() from None
            except (http.client.HTTPException, ConnectionError) as exc:
                if attempt >= opts.retries:
                    raise InputError(f"{self.name}: connection failed ({_one_line(exc)})") from None
                self._sleep(opts.backoff * (2**attempt), dog)
                attempt += 1
            except ValueError as exc:  # unknown scheme, malformed URL
                raise InputError(f"{self.name}: invalid URL ({_one_line(exc)})") from None
            except OSError as exc:
                raise InputError(f"{self.name}: cannot connect ({_one_line(exc)})") from None

    @staticmethod
    def _sleep(seconds: float, dog: _Watchdog | None) -> None:
        if dog is None:
            time.sleep(seconds)
        else:
            dog.sleep(seconds)
            if dog.fired:
                raise TimeoutError  # get() turns it into the deadline's error

    def _timeout(self) -> InputError:
        return InputError(f"{self.name}: no answer within {self.options.timeout:g} s ({option('--timeout', 'timeout')})")

    def _status_error(self, exc: urllib.error.HTTPError) -> None:
        code = exc.code
        reason = _one_line(exc.reason) if exc.reason else ""
        if 300 <= code < 400:
            raise InputError(f"{self.name}: too many or unusable redirects (HTTP {code})")
        if code in (404, 410):
            raise RemoteNotFound(f"{self.name}: not found (HTTP {code})")
        if code in (401, 403):
            raise InputError(
                f"{self.name}: access denied (HTTP {code} {reason}): private, gated or expired URL?".replace(" )", ")")
            )
        if code in RETRY_STATUS:
            after = exc.headers.get("Retry-After") if exc.headers else None
            delay = float(after) if after and after.strip().isdigit() else None
            raise _Retry(f"server error (HTTP {code} {reason})".replace(" )", ")"), delay)
        raise InputError(f"{self.name}: HTTP {code} {reason}".rstrip())

    def ignores_range(self, resp: http.client.HTTPResponse) -> InputError:
        length = resp.headers.get("Content-Length")
        what = f"the whole {int(length):,}-byte file" if length and length.isdigit() else "the whole file"
        return InputError(
            f"{self.name}: the server ignores Range requests (HTTP 200 with {what}); stopped instead of downloading it"
        )

    def get_all(self, limit: int) -> bytes:
        """A whole small file (an index.json), refusing anything over ``limit`` bytes."""

        def consume(resp: http.client.HTTPResponse) -> bytes:
            if _status(resp) == 416:
                return b""
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > limit:
                raise InputError(f"{self.name}: {int(length):,} bytes is too large for an index file")
            body = self.read_body(resp, limit + 1)
            if len(body) > limit:
                raise InputError(f"{self.name}: more than {limit:,} bytes is too large for an index file")
            return body

        return self.get(consume)


class HttpSource(HttpClient):
    """A remote file read with HTTP range requests (see the module docstring).

    Opening it performs the speculative first read, so ``size`` is known and ``first_read``
    tells ``read_header`` how many bytes are already here."""

    def __init__(self, name: str, url: str | None = None, options: RemoteOptions | None = None) -> None:
        super().__init__(name, url, options)
        self.size = 0
        self._whole: bytes | None = None
        self._spans: list[tuple[int, bytes]] = []
        self._prefix = self.get(self._first, 0, self.options.first_read)
        if self.options.prefetch and self._whole is None:
            self._prefetch_markers()
        self.first_read = len(self._prefix) if self._whole is None else self.size

    def _prefetch_markers(self) -> None:
        """Fetch, now, the rest of a long header and the marker spans ``collect_markers`` will
        ask for (the same coalesced requests, found by a scan of the raw header).  Opening runs
        in one thread per shard, so a sharded checkpoint's marker round trips overlap instead of
        following each other; the requests and bytes are the same."""
        p = self._prefix
        if len(p) < 8:
            return
        (n,) = struct.unpack_from("<Q", p)
        if n > MAX_HEADER_BYTES or 8 + n > self.size:
            return
        if len(p) < 8 + n:
            p = self._prefix = p + self._range(len(p), 8 + n)
        ranges = marker_ranges(p[8 : 8 + n], 8 + n, self.size)
        if ranges:
            spans = coalesce(ranges, self.options.gap, self.options.max_span)
            blocks = _map(lambda sp: self._range(sp[0], sp[1]), spans, self.options.parallel)
            self._spans = [(sp[0], block) for sp, block in zip(spans, blocks)]

    def _first(self, resp: http.client.HTTPResponse) -> bytes:
        status = _status(resp)
        if status == 416:  # an empty file: "bytes */0"
            cr = resp.headers.get("Content-Range")
            _a, _b, total = _content_range(cr)
            if total not in (None, 0):
                raise InputError(
                    f"{self.name}: the server refused bytes 0-{self.options.first_read - 1} (HTTP 416) "
                    f"of a file it says has {total:,} bytes (Content-Range {cr!r})"
                )
            self.size = 0
            return b""
        if status != 206:
            length = resp.headers.get("Content-Length")
            limit = self.options.first_read
            if length and length.isdigit() and int(length) > limit:
                raise self.ignores_range(resp)
            body = self.read_body(resp, limit + 1)
            if len(body) > limit:
                raise self.ignores_range(resp)
            self._whole = body  # a small file served whole: nothing more to request
            self.size = len(body)
            return body
        cr = resp.headers.get("Content-Range")
        a, b, total = _content_range(cr)
        if a != 0 or b is None or total is None:
            raise InputError(
                f"{self.name}: unusable Content-Range {cr!r} in the answer to a range request "
                "(the server must report the file size, and a span from byte 0 that ends inside it)"
            )
        if b >= self.options.first_read:
            raise InputError(f"{self.name}: asked for bytes 0-{self.options.first_read - 1}, the server sent {cr!r}")
        problem = _length_problem(resp, a, b)
        if problem is not None:
            raise InputError(f"{self.name}: the server's answer contradicts itself: {problem}")
        self.size = total
        avail = b + 1
        head = self.read_body(resp, min(8, avail))
        want = len(head)
        if len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            if n <= MAX_HEADER_BYTES and 8 + n <= total:
                want = min(8 + n, avail)
            else:
                preview = head + self.read_body(resp, min(56, avail - 8))
                if _looks_like_text(preview):
                    ctype = resp.headers.get("Content-Type") or "text"
                    raise InputError(
                        f"{self.name}: not a safetensors file: the server sent {ctype.split(';')[0]} "
                        f"starting with {preview.decode('ascii')[:48]!r}"
                    )
                return head  # read_header names the problem (length too large / past the end)
        if len(head) < want:
            head += self.read_body(resp, want - len(head))
        if len(head) < want:
            raise _Retry(f"connection lost after {len(head)} of {want} bytes")
        return head  # leaving the body unread drops the connection: nothing more is read

    def _range(self, start: int, stop: int) -> bytes:
        def consume(resp: http.client.HTTPResponse) -> bytes:
            if _status(resp) != 206:
                if _status(resp) == 416:
                    raise InputError(f"{self.name}: the server refused bytes {start}-{stop - 1} (HTTP 416): file changed?")
                raise self.ignores_range(resp)
            cr = resp.headers.get("Content-Range")
            a, b, total = _content_range(cr)
            if a != start or b != stop - 1:
                raise InputError(f"{self.name}: asked for bytes {start}-{stop - 1}, the server sent {cr!r}")
            if total is not None and total != self.size:
                raise InputError(
                    f"{self.name}: the file changed size while read: {self.size:,} bytes, now {total:,} (Content-Range {cr!r})"
                )
            problem = _length_problem(resp, a, b)
            if problem is not None:
                raise InputError(f"{self.name}: the server's answer contradicts itself: {problem}")
            data = self.read_body(resp, stop - start)
            if len(data) < stop - start:
                raise _Retry(f"connection lost after {len(data)} of {stop - start} bytes")
            return data

        return self.get(consume, start, stop)

    def pread(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        if self._whole is not None:
            return self._whole[offset:end]
        p = self._prefix
        if end <= len(p):
            return p[offset:end]
        for start, block in self._spans:  # prefetched markers
            if start <= offset and end <= start + len(block):
                return block[offset - start : end - start]
        if offset < len(p):
            return p[offset:] + self._range(len(p), end)
        return self._range(offset, end)

    def pread_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Coalesce ranges closer than ``gap``; fetch the spans concurrently."""
        spans = coalesce(ranges, self.options.gap, self.options.max_span)
        blocks = _map(lambda sp: self.pread(sp[0], sp[1] - sp[0]), spans, self.options.parallel)
        return _split(ranges, spans, blocks)

    def close(self) -> None:
        """Nothing to release: no connection outlives a request."""


# -- fsspec ----------------------------------------------------------------------------------


def filesystem(url: str):
    """``(fs, path)`` for an fsspec URL, or an InputError naming the package to install."""
    scheme = url.partition("://")[0].lower()
    try:
        import fsspec
    except ImportError:
        raise InputError(f"{url}: reading {scheme}:// URLs needs fsspec: {extra_command('remote')}") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        pkg = PACKAGES.get(scheme)
        hint = f"pip install {pkg}" if pkg else _one_line(exc)
        raise InputError(
            f"{url}: reading {scheme}:// URLs needs the fsspec implementation {pkg or ''} ({hint})".replace("  ", " ")
        ) from None
    except ValueError as exc:
        if "not known" in str(exc).lower():
            raise InputError(f"{url}: unknown protocol {scheme}:// (neither http(s) nor an fsspec protocol)") from None
        raise InputError(f"{url}: {_one_line(exc)}") from None
    except Exception as exc:
        raise InputError(f"{url}: cannot open ({type(exc).__name__}: {_one_line(exc)})") from None


def _fs_error(name: str, exc: BaseException) -> InputError:
    if isinstance(exc, FileNotFoundError):
        return RemoteNotFound(f"{name}: not found")
    if isinstance(exc, PermissionError):
        return InputError(f"{name}: access denied ({_one_line(exc)})")
    if isinstance(exc, IsADirectoryError):
        return InputError(f"{name}: is a folder, expected a .safetensors file")
    if isinstance(exc, TimeoutError):
        return InputError(f"{name}: timed out")
    return InputError(f"{name}: cannot read ({type(exc).__name__}: {_one_line(exc)})")


class FsspecSource:
    """A file of any fsspec filesystem, read with exact range requests (no read-ahead)."""

    def __init__(self, name: str, url: str | None = None, options: RemoteOptions | None = None) -> None:
        self.name = name
        self.options = options or RemoteOptions()
        self.first_read = self.options.first_read
        self.reads = 0
        self.bytes_read = 0
        self._lock = threading.Lock()
        fs, path = filesystem(url or name)
        try:
            self._f = fs.open(path, "rb", cache_type="none")
            size = getattr(self._f, "size", None)
            self.size = int(size if size is not None else fs.size(path))
        except InputError:
            raise
        except Exception as exc:
            raise _fs_error(name, exc) from None
        self.reads = 1  # the size lookup (stat / HEAD)

    def pread(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        if self.options.deadline is not None and self.options.remaining() <= 0:
            raise InputError(
                f"{self.name}: not read within {self.options.timeout:g} s ({option('--timeout', 'timeout')} bounds the whole remote read)"
            )
        with self._lock:
            try:
                self._f.seek(offset)
                data = self._f.read(end - offset)
            except Exception as exc:
                raise _fs_error(self.name, exc) from None
            self.reads += 1
            self.bytes_read += len(data)
        return data

    def pread_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        spans = coalesce(ranges, self.options.gap, self.options.max_span)
        return _split(ranges, spans, [self.pread(s, e - s) for s, e, _ in spans])

    def close(self) -> None:
        f = self.__dict__.pop("_f", None)
        if f is not None:
            try:
                f.close()
            except Exception:
                pass


# -- resolving URLs into a shard set ---------------------------------------------------------


def is_http(url: str) -> bool:
    return url[:7].lower() == "http://" or url[:8].lower() == "https://"


def _path_part(url: str) -> str:
    """The URL without query and fragment (what names and suffix tests look at)."""
    return url.split("#", 1)[0].split("?", 1)[0]


def open_source(name: str, url: str | None = None, options: RemoteOptions | None = None):
    """An opened ``HttpSource`` or ``FsspecSource`` for one remote file."""
    return HttpSource(name, url, options) if is_http(url or name) else FsspecSource(name, url, options)


def fetch_index(url: str, options: RemoteOptions) -> tuple[str, dict[str, int]]:
    """The text of a remote index.json and what fetching it cost ``{"requests", "bytes"}``."""
    if is_http(url):
        client = HttpClient(url, options=options)
        data = client.get_all(MAX_INDEX_BYTES)
        io = {"requests": client.reads, "bytes": client.bytes_read}
    else:
        src = FsspecSource(url, options=options)
        try:
            if src.size > MAX_INDEX_BYTES:
                raise InputError(f"{url}: {src.size:,} bytes is too large for an index file")
            data = src.pread(0, src.size)
        finally:
            src.close()
        io = {"requests": src.reads, "bytes": src.bytes_read}
    try:
        return data.decode("utf-8"), io
    except UnicodeDecodeError:
        raise InputError(f"{url}: index is not UTF-8 text (not an index.json?)") from None


def list_folder(url: str) -> list[str] | None:
    """Names in an fsspec folder (``None`` when ``url`` is not a folder); HTTP cannot list."""
    if is_http(url):
        return None
    fs, path = filesystem(url)
    try:
        if not fs.isdir(path):
            return None
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
    except Exception as exc:
        raise _fs_error(url, exc) from None


def join(base_url: str, name: str) -> tuple[str, str]:
    """(display name, request URL) of ``name`` relative to the folder of ``base_url``."""
    folder = _path_part(base_url).rsplit("/", 1)[0]
    display = f"{folder}/{name}"
    if is_http(base_url):
        from urllib.parse import quote, urljoin

        return display, urljoin(base_url, quote(name))
    return display, display


def _one_checkpoint(url: str, base: str, names: list[str], options: RemoteOptions, fetched: dict) -> None:
    """Raise ``SeparateCheckpoints`` when a folder URL holds several
    checkpoints by the rule every input follows (``comfyquant.io.shards``)."""
    from .shards import SeparateCheckpoints, folder_reason, group_folder

    def index_shards(index: str) -> list[str] | None:
        try:
            fetched[index] = fetch_index(index, options)
            return read_index(index, fetched[index][0])[0]
        except InputError:
            return None

    groups = group_folder(base.rstrip("/"), names, index_shards, lambda folder, name: f"{folder}/{name}")
    if len(groups) > 1:
        raise SeparateCheckpoints(url, groups, folder_reason(groups))


def open_remote(paths: list[str], options: RemoteOptions | None = None) -> tuple[ShardSet, list]:
    """Resolve URLs (files, index.json, fsspec folders) and open every shard, concurrently.

    Like ``resolve_local``: an index brings its shards and a shard it
    names that does not exist (404) is reported as missing by the checkpoint."""
    options = (options or RemoteOptions()).started()  # --timeout bounds this checkpoint's whole read
    local = [p for p in paths if not is_url(p)]
    if local:
        raise InputError(f"{local[0]}: cannot mix local paths and URLs in one checkpoint")
    ss = ShardSet()
    plan: dict[str, tuple[str, bool]] = {}  # display name -> (request URL, named by an index)

    fetched: dict[str, tuple[str, dict]] = {}  # indexes read to group a folder: not fetched twice

    def use_index(url: str) -> None:
        text, io = fetched.pop(url, None) or fetch_index(url, options)
        _shards, wm = read_index(url, text)
        ss.index_path = url
        ss.index_dir = _path_part(url).rsplit("/", 1)[0]
        ss.weight_map.update(wm)
        ss.index_io[url] = io
        for shard in sorted(set(wm.values())):
            name, target = join(url, shard)
            plan.setdefault(name, (target, True))

    for url in paths:
        path = _path_part(url)
        if path.endswith(".json"):
            use_index(url)
        elif is_http(url):
            if path.endswith("/") or path.count("/") < 3:
                raise InputError(
                    f"{url}: an HTTP server cannot list a folder: give the URL of the .safetensors "
                    "file(s) or of the *.safetensors.index.json"
                )
            plan.setdefault(url, (url, False))
        elif not path.endswith(".safetensors") and (names := list_folder(url)) is not None:
            base = url.rstrip("/") + "/"
            indexes = [n for n in names if n.endswith(".safetensors.index.json")]
            files = [n for n in names if n.endswith(".safetensors")]
            if not indexes and not files:
                raise InputError(f"{url}: folder holds no .safetensors files")
            _one_checkpoint(url, base, indexes + files, options, fetched)
            for n in indexes:
                use_index(base + n)
            for n in files if not indexes else ():
                plan.setdefault(base + n, (base + n, False))
        else:
            plan.setdefault(url, (url, False))

    def open_one(item: tuple[str, tuple[str, bool]]):
        name, (target, from_index) = item
        try:
            return open_source(name, target, options)
        except RemoteNotFound:
            if from_index:
                return None
            raise

    items = list(plan.items())
    sources: list = []
    failure: BaseException | None = None
    if len(items) > 1 and options.parallel > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(options.parallel, len(items))) as pool:
            futures = [pool.submit(open_one, it) for it in items]
        results = []
        for f in futures:
            exc = f.exception()
            if exc is not None and failure is None:
                failure = exc
            results.append(None if exc is not None else f.result())
    else:
        results = []
        for it in items:
            try:
                results.append(open_one(it))
            except InputError as exc:
                failure = exc
                break
    if failure is not None:
        for s in results:
            if s is not None:
                s.close()
        raise failure
    for (name, _), src in zip(items, results):
        if src is None:
            ss.missing.append(name)
        else:
            sources.append(src)
    ss.files = [s.name for s in sources]
    if not sources:
        where = ss.index_path or ", ".join(paths)
        raise InputError(f"{where}: none of the shards the index names exist: {', '.join(ss.missing[:3])}")
    return ss, sources
