"""HTTP serving: /metrics, /, /healthz, /readyz, plus routes added by other parts.

A deliberately small HTTP/1.1 server on ``socketserver``: ``http.server`` pulls in
``http.client``, ``ssl`` and ``email`` (about 8 MiB of RSS), and the stock
prometheus_client server has a listen backlog of 5 and an unbounded thread per
connection. This one has a deep backlog, a bounded number of connections (more get an
immediate 503 instead of queueing forever), a read timeout against slow or silent
clients, keep-alive, and strict limits on request size. It serves GET and HEAD only.
TLS (``ssl``) is imported only when a web config asks for it.

Rendered bytes are shared by every scraper of a collection, so cost does not grow with
the number of scrapers.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from exporter.serve.engine import Engine

if TYPE_CHECKING:
    from exporter.serve.webconfig import WebConfig

log = logging.getLogger(__name__)

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPEN_PATHS = frozenset({"/healthz"})  # liveness stays open under basic auth (kubelet probes)
MAX_LINE = 8192
MAX_HEADERS = 100
MAX_BODY = 64 * 1024
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable"}


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


class _DeadlineReader(io.RawIOBase):
    """A connection's raw reader whose reads end at ``deadline`` (monotonic seconds) when one is set.

    A socket timeout alone bounds each read, not the request: a client sending one byte per
    timeout (slowloris) would hold its connection, and one of ``--max-connections``, forever.
    """

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int | None:
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request not received within the read timeout")
            self._sock.settimeout(remaining)
        return self._raw.readinto(buf)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


# (handler, path, query) -> Response
Route = Callable[["Handler", str, str], Response]

LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter</h1><p>Vendor-neutral GPU metrics.</p>
<ul><li><a href="{metrics}">{metrics}</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> liveness</li><li><a href="/readyz">/readyz</a> readiness</li></ul>
</body></html>
"""


class Handler(socketserver.BaseRequestHandler):
    """One connection: any number of keep-alive requests, each answered in one write."""

    server: GpuHTTPServer
    command = ""
    path = ""
    request_version = "HTTP/1.1"
    headers: Headers = Headers()

    def setup(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(self.server.read_timeout)  # slow or silent clients cannot hold a thread forever
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = getattr(sock, "do_handshake", None)
        if handshake is not None:  # TLS: the handshake runs here, so a slow client cannot stall accept()
            handshake()
        self.reader = _DeadlineReader(sock)
        self.rfile = io.BufferedReader(self.reader, MAX_LINE * 2)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()

    def handle(self) -> None:
        timeout = self.server.read_timeout
        while True:
            # the whole request (and the idle wait before it) must arrive within the read timeout
            self.reader.deadline = time.monotonic() + timeout
            try:
                if not self._read_request():
                    return
            except _BadRequest as exc:
                self.request.settimeout(timeout)
                self._send(Response(exc.status, (str(exc) + "\n").encode()), head=False, keep=False)
                return
            except (TimeoutError, OSError, ValueError):
                return  # idle keep-alive connection timed out, a trickling client, or the client went away
            self.reader.deadline = None
            self.request.settimeout(timeout)  # the answer's writes: a per-write timeout again
            keep = self._keep_alive()
            resp = self._dispatch()
            self._send(resp, head=self.command == "HEAD", keep=keep)
            if not keep:
                return

    # --- parsing --------------------------------------------------------------------------------

    def _line(self) -> bytes:
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise _BadRequest(414 if not self.command else 431, "request line or header too long")
        return line

    def _read_request(self) -> bool:
        self.command = ""
        line = self._line()
        while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests (RFC 9112 2.2)
            line = self._line()
        if not line:
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, "malformed request line")
        self.command, self.path, self.request_version = parts
        headers = Headers()
        for _ in range(MAX_HEADERS + 1):
            raw = self._line()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400, "malformed header")
            headers[name.lower()] = value.strip()
        else:
            raise _BadRequest(431, "too many headers")
        self.headers = headers
        if headers.get("transfer-encoding"):
            raise _BadRequest(501, "request bodies are not supported")
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise _BadRequest(400, "bad Content-Length")
        if int(length) > MAX_BODY:
            raise _BadRequest(413, "request body too large")
        if int(length):
            self.rfile.read(int(length))  # GET/HEAD bodies carry no meaning: read and drop
        return True

    def _keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.request_version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    # --- answering ------------------------------------------------------------------------------

    def _dispatch(self) -> Response:
        try:
            if self.command not in ("GET", "HEAD"):
                return Response(405, b"only GET and HEAD\n", headers={"Allow": "GET, HEAD"})
            parts = urlsplit(self.path)
            web = self.server.web
            if web is not None and web.users and parts.path not in OPEN_PATHS \
                    and not web.check(self.headers.get("Authorization")):
                return Response(401, b"unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'})
            route = self.server.routes.get(parts.path)
            return Response(404, b"not found\n") if route is None else route(self, parts.path, parts.query)
        except Exception:  # one bad request must not kill the server
            log.exception("error serving %r", self.path[:200])
            return Response(500, b"internal error\n")

    def _send(self, resp: Response, head: bool, keep: bool) -> None:
        lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Unknown')}",
                 f"Content-Type: {resp.content_type}", f"Content-Length: {len(resp.body)}"]
        lines += [f"{k}: {v}" for k, v in (resp.headers or {}).items()]
        if not keep:
            lines.append("Connection: close")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        with contextlib.suppress(OSError):
            self.request.sendall(head_bytes if head else head_bytes + resp.body)


class GpuHTTPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the listen backlog: bursts of scrapers wait in the kernel, not fail

    def __init__(self, addr: tuple[str, int], max_connections: int, read_timeout: float,
                 web: WebConfig | None = None) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, Handler)
        self.web = web
        if web is not None and web.ssl_context is not None:
            self.socket = web.ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.routes: dict[str, Route] = {}
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._active = 0
        self._active_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            busy = self._active >= self.max_connections
            if not busy:
                self._active += 1
        if busy:
            self._reject(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed TLS handshake or a client that went away: debug, not a traceback on stderr."""
        log.debug("connection from %s failed", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active -= 1

    def _reject(self, request: socket.socket) -> None:
        """Over the connection limit: answer 503 at once, never queue forever."""
        try:
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                            b"Content-Length: 20\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
                            b"too many connections")
        except OSError:
            pass
        finally:
            self.shutdown_request(request)


def _wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


def metrics_route(engine: Engine) -> Route:
    def route(h: Handler, path: str, query: str) -> Response:
        om = _wants_openmetrics(h.headers.get("Accept", ""))
        gz = "gzip" in h.headers.get("Accept-Encoding", "")
        rendered = engine.scrape()
        body = rendered.body(openmetrics=om, gz=gz)
        headers = {"Content-Encoding": "gzip"} if gz else None
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
        return Response(200 if ok else 503, (why + "\n").encode())

    srv.routes.update({metrics_path: metrics_route(engine), "/": index, "/healthz": healthz, "/readyz": readyz})
    return srv
