"""HTTP serving: /metrics, /, /healthz, /readyz, plus routes added by other parts.

The stock prometheus_client server has a listen backlog of 5 and an unbounded thread
per connection; this one has a deep backlog, a bounded number of connections (more get
an immediate 503 instead of queueing forever) and a read timeout against idle clients.
Rendered bytes are shared by every scraper of a collection, so cost does not grow with
the number of scrapers.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE

from exporter.engine import Engine
from exporter.webconfig import OPEN_PATHS, WebConfig

log = logging.getLogger(__name__)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] | None = None


# (handler, path, query) -> Response
Route = Callable[["Handler", str, str], Response]

LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter</h1><p>Vendor-neutral GPU metrics.</p>
<ul><li><a href="{metrics}">{metrics}</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> liveness</li><li><a href="/readyz">/readyz</a> readiness</li></ul>
</body></html>
"""


class Handler(BaseHTTPRequestHandler):
    server: GpuHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    # Buffer the headers and body into one write (flushed per request by handle_one_request):
    # separate small writes on a keep-alive connection meet Nagle + delayed ACK = 40 ms stalls.
    wbufsize = 256 * 1024
    server_version = "gpu-exporter"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.read_timeout  # type: ignore[misc]  # slow or silent clients cannot hold a thread forever
        with contextlib.suppress(OSError):
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(self.request, ssl.SSLSocket):
            # The handshake runs here, in the connection's thread, so a slow client cannot stall accept().
            self.request.settimeout(self.server.read_timeout)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _dispatch(self, head: bool) -> None:
        try:
            parts = urlsplit(self.path)
            web = self.server.web
            if web.users and parts.path not in OPEN_PATHS and not web.check(self.headers.get("Authorization")):
                resp = Response(401, b"unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'})
            else:
                route = self.server.routes.get(parts.path)
                resp = Response(404, b"not found\n") if route is None else route(self, parts.path, parts.query)
        except Exception:  # one bad request must not kill the server
            log.exception("error serving %r", self.path[:200])
            resp = Response(500, b"internal error\n")
        self._send(resp, head)

    def _send(self, resp: Response, head: bool) -> None:
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for k, v in (resp.headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(resp.body)


class GpuHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: bursts of scrapers wait in the kernel, not fail

    def __init__(self, addr: tuple[str, int], max_connections: int, read_timeout: float,
                 web: WebConfig | None = None) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, Handler)
        self.web = web or WebConfig()
        if self.web.ssl_context is not None:
            self.socket = self.web.ssl_context.wrap_socket(self.socket, server_side=True,
                                                           do_handshake_on_connect=False)
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
        return Response(200, body, OPENMETRICS_TYPE if om else CONTENT_TYPE_LATEST, headers)

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
