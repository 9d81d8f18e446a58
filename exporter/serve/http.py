"""HTTP serving: /metrics, /, /healthz, /readyz, plus routes added by other parts.

A deliberately small HTTP/1.1 server: ``http.server`` pulls in ``http.client``, ``ssl`` and
``email`` (about 8 MiB of RSS), and the stock prometheus_client server has a listen backlog of 5
and an unbounded thread per connection. It serves GET and HEAD only. TLS (``ssl``) is imported
only when a web config asks for it.

Three kinds of work, so that no client can stall another:

* the serving thread (``serve_forever``) only accepts: it never reads, writes or handshakes;
* one I/O thread holds every connection that is waiting for a request (TLS handshake, request
  bytes arriving, idle keep-alive) in a selector, non-blocking, each under a deadline of
  ``--read-timeout`` for the whole handshake plus request. Such connections cost a file
  descriptor and a buffer, no thread and no slot; when more than ``max_waiting`` of them are open
  the oldest that never completed a request is evicted first, then the oldest idle keep-alive;
* a complete request takes one of ``--max-connections`` slots and a thread that answers it (writes
  under the same deadline); with every slot taken, the request gets 503 at once.

Basic auth failures are rate-limited per client address (a token bucket: ``FAILURE_BURST``
failures, then one more per ``FAILURE_REFILL_S``); an address over the limit gets 429 without a
bcrypt check. Credentials that already passed are never limited. ``/healthz`` and ``/readyz`` are
open under basic auth (kubelet probes send none) and then say only ``ok`` / ``not ready``.

Rendered bytes are shared by every scraper of a collection, so cost does not grow with
the number of scrapers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from exporter.serve.engine import Engine

if TYPE_CHECKING:
    from exporter.serve.webconfig import LiveWebConfig, WebConfig

log = logging.getLogger(__name__)

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROBE_PATHS = frozenset({"/healthz", "/readyz"})  # open under basic auth (kubelet probes); say only up/down
MAX_LINE = 8192
MAX_HEADERS = 100
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024
FAILURE_BURST = 10  # failed logins an address may make at once ...
FAILURE_REFILL_S = 1.0  # ... then one more per this many seconds
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_SINGLE = frozenset({"content-length", "host", "authorization", "transfer-encoding"})  # twice: 400 (smuggling)
_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] | None = None


class Headers(dict[str, str]):
    """Request headers, keyed by lower-case name."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Handler:
    """One request, as routes see it."""

    server: GpuHTTPServer
    client_address: Any
    command: str
    path: str
    request_version: str
    headers: Headers
    authorized: bool = True  # basic auth off, or these credentials passed


# (handler, path, query) -> Response
Route = Callable[[Handler, str, str], Response]

LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter</h1><p>Vendor-neutral GPU metrics.</p>
<ul><li><a href="{metrics}">{metrics}</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> liveness</li><li><a href="/readyz">/readyz</a> readiness</li></ul>
</body></html>
"""


def parse_request(buf: bytearray | bytes) -> tuple[tuple[str, str, str, Headers], int] | None:
    """((method, target, version, headers), bytes used incl. any body) once ``buf`` holds a request.

    None while it is incomplete; :class:`_BadRequest` as soon as it cannot become a valid one.
    """
    start = 0
    while buf[start:start + 1] in (b"\r", b"\n") and start < len(buf):  # stray blank lines (RFC 9112 2.2)
        start += 1
        if start > MAX_LINE:
            raise _BadRequest(400, "malformed request line")
    lines: list[bytes] = []
    pos = start
    while True:
        nl = buf.find(b"\n", pos, pos + MAX_LINE + 2)
        if nl < 0:
            if len(buf) - pos > MAX_LINE:
                raise _BadRequest(431 if lines else 414, "request line or header too long")
            return None
        line = bytes(buf[pos:nl])
        pos = nl + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > MAX_LINE:
            raise _BadRequest(431 if lines else 414, "request line or header too long")
        if not line:
            break
        lines.append(line)
        if len(lines) > MAX_HEADERS + 1 or pos - start > MAX_HEAD:
            raise _BadRequest(431, "too many headers")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] or any(c < 0x21 or c == 0x7F
                                                                                   for c in parts[1]):
        raise _BadRequest(400, "malformed request line")
    version = _VERSION.fullmatch(parts[2])
    if version is None:
        raise _BadRequest(400, "malformed request line")
    if version.group(1, 2) not in ((b"1", b"1"), (b"1", b"0")):
        raise _BadRequest(505, "only HTTP/1.0 and HTTP/1.1")
    headers = Headers()
    for raw in lines[1:]:
        name, sep, value = raw.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):  # also rejects obs-fold and "Name :"
            raise _BadRequest(400, "malformed header")
        v = value.strip(b" \t")
        if any((c < 0x20 and c != 0x09) or c == 0x7F for c in v):
            raise _BadRequest(400, "malformed header")
        key, text = name.decode("ascii").lower(), v.decode("latin-1")
        if key in headers:
            if key in _SINGLE:
                raise _BadRequest(400, f"more than one {key} header")
            text = f"{headers[key]}, {text}"
        headers[key] = text
    if "transfer-encoding" in headers:
        raise _BadRequest(501, "request bodies are not supported")
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()) or len(length) > 12:
        raise _BadRequest(400, "bad Content-Length")
    if int(length) > MAX_BODY:
        raise _BadRequest(413, "request body too large")
    if len(buf) < pos + int(length):
        return None
    # GET/HEAD bodies carry no meaning: consumed and dropped
    return (parts[0].decode("ascii"), parts[1].decode("latin-1"), parts[2].decode("ascii"), headers), pos + int(length)


def _qvalues(header: str) -> list[tuple[str, float]]:
    """``Accept``-style header -> [(lower-case value, q)]; a malformed q counts as 0."""
    out: list[tuple[str, float]] = []
    for item in header.split(","):
        value, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for p in params:
            k, _, v = p.partition("=")
            if k.strip().lower() == "q":
                q = float(v.strip()) if _QVALUE.fullmatch(v.strip()) else 0.0
        if value:
            out.append((value.lower(), q))
    return out


def _quality(ranges: list[tuple[str, float]], media: str) -> float:
    """q of ``media`` (type/subtype) under the most specific matching range (RFC 9110 12.5.1)."""
    kind = media.split("/")[0]
    best, q = -1, 0.0
    for value, vq in ranges:
        rank = 2 if value == media else 1 if value == f"{kind}/*" else 0 if value == "*/*" else -1
        if rank > best:
            best, q = rank, vq
    return q


def wants_openmetrics(accept: str) -> bool:
    """OpenMetrics only when the client ranks it above the text format (ties: text, the classic)."""
    if not accept:
        return False
    ranges = _qvalues(accept)
    om = _quality(ranges, "application/openmetrics-text")
    return om > 0 and om > _quality(ranges, "text/plain")


def wants_gzip(accept_encoding: str) -> bool:
    codings = dict(reversed(_qvalues(accept_encoding)))  # the first mention wins
    return codings.get("gzip", codings.get("*", 0.0)) > 0


@dataclass(eq=False)
class _Conn:
    sock: Any  # socket.socket or ssl.SSLSocket
    addr: Any
    deadline: float
    web: WebConfig | None = None  # the config its TLS handshake used (client_allowed_sans)
    handshaken: bool = True
    served: int = 0
    closing: bool = False  # answered with an error: reading what is left until EOF, then closed
    buf: bytearray = field(default_factory=bytearray)


class _FailureLimiter:
    """Failed basic-auth attempts per client address: a token bucket each, bounded in memory."""

    def __init__(self, burst: int = FAILURE_BURST, refill_s: float = FAILURE_REFILL_S) -> None:
        self.burst, self.refill_s = burst, refill_s
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self._lock = threading.Lock()

    def _tokens(self, addr: str, now: float) -> float:
        tokens, at = self._buckets.get(addr, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_s)

    def retry_after(self, addr: str) -> int:
        """0 when ``addr`` may try now, else whole seconds to wait."""
        with self._lock:
            tokens = self._tokens(addr, time.monotonic())
        return 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) * self.refill_s))

    def failed(self, addr: str) -> None:
        with self._lock:
            now = time.monotonic()
            tokens = self._tokens(addr, now) - 1
            if len(self._buckets) > 10000:  # many addresses: forget the ones back at a full bucket
                self._buckets = {a: v for a, v in self._buckets.items() if self._tokens(a, now) < self.burst}
                if len(self._buckets) > 10000:
                    self._buckets.clear()
            self._buckets[addr] = (tokens, now)
        if 0 <= tokens < 1:
            log.warning("basic auth: %d failed attempts from %s; its next attempts get 429 for a while",
                        self.burst, addr)


class _Bucket:
    """The web config's ``rate_limit``: one token per ``interval`` seconds, at most ``burst`` saved."""

    def __init__(self, interval: float, burst: int) -> None:
        self.interval, self.burst = interval, burst
        self._tokens, self._at = float(burst), time.monotonic()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.interval)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


def _waiting_cap(max_connections: int) -> int:
    """Connections the I/O thread holds at most: leave file descriptors for the slots and the rest."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(16, min(max(1024, 4 * max_connections), soft - max_connections - 64))


class GpuHTTPServer:
    """The listening socket, the accept loop, the I/O thread and the answering threads."""

    def __init__(self, addr: tuple[str, int], max_connections: int, read_timeout: float,
                 web: WebConfig | None = None) -> None:
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(addr)
            self.socket.listen(1024)  # the backlog: bursts of scrapers wait in the kernel, not fail
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self.live: LiveWebConfig | None = None
        if web is not None:
            from exporter.serve.webconfig import LiveWebConfig

            self.live = LiveWebConfig(web)
        self.routes: dict[str, Route] = {}
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.max_waiting = _waiting_cap(max_connections)
        self.failures = _FailureLimiter()
        self._rate: tuple[tuple[float, int], _Bucket] | None = None
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._inbox: deque[tuple[str, Any, Any]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._fresh: OrderedDict[_Conn, None] = OrderedDict()  # never completed a request; deadline order
        self._idle: OrderedDict[_Conn, None] = OrderedDict()  # keep-alive between requests; deadline order
        self._closing: OrderedDict[_Conn, None] = OrderedDict()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._io: threading.Thread | None = None
        self._next_web_check = 0.0

    @property
    def web(self) -> WebConfig | None:
        """The web config in force (answering threads: re-loaded first if its files changed)."""
        return self.live.current() if self.live is not None else None

    def _io_web(self) -> WebConfig | None:
        """The web config for the I/O thread: a change is loaded in the background, never here."""
        return self.live.current(block=False) if self.live is not None else None

    # --- the serving thread: accept only ----------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._io = threading.Thread(target=self._io_loop, name="http-io", daemon=True)
        self._io.start()
        self.socket.settimeout(poll_interval)
        try:
            while not self._stop.is_set():
                try:
                    sock, addr = self.socket.accept()
                except TimeoutError:
                    continue
                except OSError as exc:  # EMFILE and friends: back off instead of spinning
                    if self._stop.is_set():
                        break
                    log.warning("accept failed: %s", exc)
                    self._stop.wait(0.1)
                    continue
                self._post("new", sock, addr)
        finally:
            self._post("stop", None, None)
            self._io.join(5)
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        if self._io is not None:
            self._stopped.wait()

    def server_close(self) -> None:
        self._stop.set()
        if self._io is not None:
            self._io.join(5)
        for s in (self.socket, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()

    def _post(self, what: str, a: Any, b: Any) -> None:
        self._inbox.append((what, a, b))
        with contextlib.suppress(OSError):  # the pipe is full: the loop is awake anyway
            self._wake_w.send(b"\0")

    # --- the I/O thread: handshakes and request bytes, non-blocking, under deadlines --------------

    def _io_loop(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in self._sel.select(self._next_timeout()):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            while self._wake_r.recv(4096):
                                pass
                    else:
                        self._on_ready(key.data)
                while self._inbox:
                    what, a, b = self._inbox.popleft()
                    if what == "stop":
                        return
                    if what == "new":
                        self._add(a, b)
                    else:
                        self._resume(a)
                self._expire()
                if time.monotonic() >= self._next_web_check:  # notice edits and rotations without traffic
                    self._next_web_check = time.monotonic() + 1.0
                    self._io_web()
        except Exception:  # a bug here would stop all serving: make it loud
            log.exception("HTTP I/O loop failed")
            raise
        finally:
            for d in (self._fresh, self._idle, self._closing):
                for conn in list(d):
                    self._close(conn)
            self._sel.close()

    def _next_timeout(self) -> float:
        heads = [next(iter(d)).deadline for d in (self._fresh, self._idle, self._closing) if d]
        return max(0.0, min([1.0, *(h - time.monotonic() for h in heads)]))

    def _expire(self) -> None:
        now = time.monotonic()
        for d in (self._fresh, self._idle, self._closing):
            while d:
                conn = next(iter(d))
                if conn.deadline > now:
                    break
                self._close(conn)  # idle keep-alive, a silent or trickling client, a slow handshake

    def _add(self, sock: socket.socket, addr: Any) -> None:
        while len(self._fresh) + len(self._idle) >= self.max_waiting:
            victim = next(iter(self._fresh or self._idle))
            log.debug("evicting a waiting connection from %s: %d open", victim.addr, self.max_waiting)
            self._close(victim)
        conn = _Conn(sock, addr, time.monotonic() + self.read_timeout)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            web = self._io_web()
            if web is not None and web.ssl_context is not None:
                conn.sock = web.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                conn.web, conn.handshaken = web, False
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                sock.close()
            return
        self._fresh[conn] = None

    def _resume(self, conn: _Conn) -> None:
        """A keep-alive connection handed back after an answer: wait for its next request."""
        conn.deadline = time.monotonic() + self.read_timeout
        try:
            conn.sock.setblocking(False)
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            self._close(conn)
            return
        self._idle[conn] = None
        if conn.buf:  # pipelined: the next request may be here already
            self._parse(conn)

    def _on_ready(self, conn: _Conn) -> None:
        eof = False
        try:
            if not conn.handshaken and not self._handshake(conn):
                return
            while len(conn.buf) <= MAX_HEAD + MAX_BODY:
                try:
                    chunk = conn.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if type(exc).__name__ in ("SSLWantReadError", "SSLWantWriteError"):
                        break
                    raise
                if not chunk:
                    eof = True  # half-closed: a request already here is still answered
                    break
                if not conn.closing:
                    conn.buf += chunk
        except OSError:  # ssl.SSLError included: a failed handshake, a reset
            self._close(conn)
            return
        if not conn.closing:
            self._parse(conn)
        if eof and (conn in self._fresh or conn in self._idle or conn in self._closing):
            self._close(conn)  # nothing more will come: not waiting for the rest of a request

    def _handshake(self, conn: _Conn) -> bool:
        import ssl

        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return False
        conn.handshaken = True
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.web is not None and not conn.web.client_allowed(conn.sock.getpeercert()):
            log.debug("client certificate from %s has none of client_allowed_sans", conn.addr)
            self._close(conn)
            return False
        return True

    def _parse(self, conn: _Conn) -> None:
        try:
            parsed = parse_request(conn.buf)
        except _BadRequest as exc:
            self._answer_and_close(conn, exc.status, str(exc))
            return
        if parsed is None:
            if len(conn.buf) > MAX_HEAD + MAX_BODY:
                self._answer_and_close(conn, 431, "request too large")
            return
        request, used = parsed
        del conn.buf[:used]
        self._fresh.pop(conn, None)
        self._idle.pop(conn, None)
        with self._busy_lock:
            full = self._busy >= self.max_connections
            if not full:
                self._busy += 1
        if full:  # every slot is answering: 503 at once, never a queue
            self._answer_and_close(conn, 503, "too many connections", {"Retry-After": "1"})
            return
        self._sel.unregister(conn.sock)
        threading.Thread(target=self._serve, args=(conn, request), name="http-request", daemon=True).start()

    def _answer_and_close(self, conn: _Conn, status: int, message: str,
                          headers: dict[str, str] | None = None) -> None:
        """An error answer from the I/O thread: one non-blocking write, then read to EOF for a second."""
        extra = web.headers if (web := self._io_web()) is not None else {}
        data = _head(Response(status, (message + "\n").encode(), headers=headers), False, extra)
        with contextlib.suppress(OSError):
            conn.sock.send(data + (message + "\n").encode())
        self._fresh.pop(conn, None)
        self._idle.pop(conn, None)
        try:  # half-close and drain, so that the answer is not lost to a reset
            if hasattr(conn.sock, "unwrap"):
                raise OSError("TLS: close at once")
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.closing, conn.deadline = True, time.monotonic() + 1.0
        conn.buf.clear()
        self._closing[conn] = None

    def _close(self, conn: _Conn) -> None:
        for d in (self._fresh, self._idle, self._closing):
            d.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _extra_headers(self) -> dict[str, str]:
        web = self.web
        return web.headers if web is not None else {}

    # --- an answering thread: one request -------------------------------------------------------

    def _serve(self, conn: _Conn, request: tuple[str, str, str, Headers]) -> None:
        keep = False
        try:
            command, target, version, headers = request
            h = Handler(self, conn.addr, command, target, version, headers)
            conn_hdr = headers.get("connection", "").lower()
            keep = "keep-alive" in conn_hdr if version == "HTTP/1.0" else "close" not in conn_hdr
            resp = self._dispatch(h)
            data = _head(resp, keep, self._extra_headers()) + (b"" if command == "HEAD" else resp.body)
            keep = self._write(conn, data) and keep
        except Exception:  # a bug answering one request: log it, drop that connection, keep serving
            log.exception("error answering %s", conn.addr)
            keep = False
        finally:
            with self._busy_lock:
                self._busy -= 1
            if keep:
                conn.served += 1
                self._post("back", conn, None)
            else:
                with contextlib.suppress(OSError):
                    conn.sock.close()

    def _write(self, conn: _Conn, data: bytes) -> bool:
        """Send ``data`` within the read timeout for the whole answer (a slow reader cannot hold a slot)."""
        deadline = time.monotonic() + self.read_timeout
        view = memoryview(data)
        try:
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                conn.sock.settimeout(remaining)
                view = view[conn.sock.send(view):]
        except OSError:
            return False
        return True

    def _dispatch(self, h: Handler) -> Response:
        try:
            if h.command not in ("GET", "HEAD"):
                return Response(405, b"only GET and HEAD\n", headers={"Allow": "GET, HEAD"})
            parts = urlsplit(h.path)
            web = self.web
            if web is not None and web.rate_limit is not None and parts.path not in PROBE_PATHS:
                if self._rate is None or self._rate[0] != web.rate_limit:
                    self._rate = (web.rate_limit, _Bucket(*web.rate_limit))
                if not self._rate[1].allow():
                    return Response(429, b"rate limited\n", headers={"Retry-After": "1"})
            if web is not None and web.users:
                denied = self._authorize(h, web, parts.path in PROBE_PATHS)
                if denied is not None:
                    return denied
            route = self.routes.get(parts.path)
            return Response(404, b"not found\n") if route is None else route(h, parts.path, parts.query)
        except Exception:  # one bad request must not kill the server
            log.exception("error serving %r", h.path[:200])
            return Response(500, b"internal error\n")

    def _authorize(self, h: Handler, web: WebConfig, probe: bool) -> Response | None:
        """None when the request may go on (``h.authorized`` says whether its credentials passed)."""
        header = h.headers.get("authorization")
        if web.cached(header):
            return None
        h.authorized = False
        addr = str(h.client_address[0]) if isinstance(h.client_address, tuple) else str(h.client_address)
        if header is not None:
            wait = self.failures.retry_after(addr)
            if wait:
                return None if probe else Response(429, b"too many failed logins\n",
                                                   headers={"Retry-After": str(wait)})
            if web.check(header):
                h.authorized = True
                return None
            self.failures.failed(addr)
        if probe:  # open: an anonymous probe gets up or down only
            return None
        return Response(401, b"unauthorized\n",
                        headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'})


def _head(resp: Response, keep: bool, extra: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Unknown')}",
             f"Content-Type: {resp.content_type}", f"Content-Length: {len(resp.body)}"]
    lines += [f"{k}: {v}" for k, v in {**extra, **(resp.headers or {})}.items()]
    if not keep:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def metrics_route(engine: Engine) -> Route:
    def route(h: Handler, path: str, query: str) -> Response:
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        rendered = engine.scrape()
        body = rendered.body(openmetrics=om, gz=gz)
        headers = {"Vary": "Accept, Accept-Encoding"}  # caches must key on what the answer depends on
        if gz:
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, OPENMETRICS_TYPE if om else TEXT_TYPE, headers)

    return route


def build_server(engine: Engine, address: str, port: int, metrics_path: str, ready_max_age: float,
                 max_connections: int = 64, read_timeout: float = 10.0, web: WebConfig | None = None) -> GpuHTTPServer:
    srv = GpuHTTPServer((address, port), max_connections=max_connections, read_timeout=read_timeout, web=web)
    landing = LANDING.format(metrics=metrics_path).encode()

    def index(h: Handler, path: str, query: str) -> Response:
        return Response(200, landing, "text/html; charset=utf-8")

    def healthz(h: Handler, path: str, query: str) -> Response:
        return Response(200, b"ok\n")

    def readyz(h: Handler, path: str, query: str) -> Response:
        ok, why = engine.ready(ready_max_age)
        if not h.authorized:  # an anonymous probe under basic auth learns up or down, nothing else
            why = "ok" if ok else "not ready"
        return Response(200 if ok else 503, (why + "\n").encode())

    srv.routes.update({metrics_path: metrics_route(engine), "/": index, "/healthz": healthz, "/readyz": readyz})
    return srv

