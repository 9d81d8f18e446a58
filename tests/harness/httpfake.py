"""One fake HTTP server for the suite's small stand-ins: Prometheus answers, proxies, scrape targets.

A :class:`FakeHTTP` listens on 127.0.0.1 (a free port, or a given one so that it can go
:meth:`~FakeHTTP.down` and come back :meth:`~FakeHTTP.up` on it), records every request and answers
each with the :class:`Reply` that its ``answer`` function returns (called in the request's thread,
so it may block, e.g. to hold a request). Every answer carries a ``Content-Length``, and goes out
in one write. A client that hangs up mid-answer ends that connection quietly.

What an HTTP library cannot write is a :class:`Reply` too: ``raw`` bytes sent as they are (a malformed
status line, a body cut short of its Content-Length, chunked or close-delimited framing), then ``more``
sent again every ``every`` seconds (a trickle, or an endless answer) until the client hangs up or the
server stops. Only a listener that never accepts stays a bare socket in its test. The fake Kubernetes
API (tests/harness/kubeapi.py) has its own server for its watch streams.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self


@dataclass(frozen=True)
class Request:
    """One request as it arrived: ``headers`` with lower-case names, ``body`` as sent."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """An answer: ``headers`` go out before ``Content-Length``, which is ``len(body)`` unless ``length``
    announces another (a cut answer); ``close`` ends the connection after the body, both ways."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    length: int | None = None
    close: bool = False
    raw: bytes | None = None  # sent as they are instead of status, headers and body; the connection then closes
    more: bytes = b""  # after ``raw``: sent again every ``every`` s until the client hangs up or the server stops
    every: float = 0.0


JSON = {"Content-Type": "application/json"}


def json_reply(doc: Any, status: int = 200, headers: Mapping[str, str] = JSON) -> Reply:
    """``doc`` as a JSON answer (``bytes`` are sent as they are)."""
    return Reply(status, doc if isinstance(doc, bytes) else json.dumps(doc).encode(), headers)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    wbufsize = 1 << 20  # status, headers and body in one write: no Nagle / delayed-ACK stall per answer

    def _serve(self) -> None:
        fake = self.server.fake
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        with fake.lock:
            fake.requests.append(req)
        reply = fake.answer(req)
        if reply.raw is not None:
            self._send_raw(reply, fake.stopped)
            return
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body) if reply.length is None else reply.length))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client gave up (a timeout, a refused answer)
        if reply.close:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _send_raw(self, reply: Reply, stopped: threading.Event) -> None:
        """``raw``, then ``more`` every ``every`` s (as fast as the client reads with 0) until the client hangs
        up or ``stopped``; then the connection closes."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.sendall(reply.raw or b"")
            while reply.more and not stopped.wait(reply.every):
                self.connection.sendall(reply.more)
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeHTTP


class FakeHTTP:
    """A running HTTP server on 127.0.0.1 answering with ``answer(request)``; see the module doc.

    ``port``: 0 for a free one (kept across :meth:`down` and :meth:`up`); ``tls``: a server context
    (HTTPS); ``http11``: keep connections open between requests (HTTP/1.1), as Prometheus does.
    ``requests`` lists what arrived, in order. Stop it with :meth:`close` or a ``with`` block.
    """

    def __init__(self, answer: Callable[[Request], Reply], *, port: int = 0, tls: ssl.SSLContext | None = None,
                 http11: bool = False) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()  # set while down: ends the answers that send ``more``
        self._tls = tls
        self._handler = type("Handler", (_Handler,), {"protocol_version": "HTTP/1.1" if http11 else "HTTP/1.0"})
        self._server: _Server | None = None
        self.port = port
        self.up()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def up(self) -> Self:
        """Listen (again) on ``port``; a no-op while listening."""
        if self._server is None:
            self.stopped.clear()
            server = _Server(("127.0.0.1", self.port), self._handler)
            server.fake = self
            self.port = int(server.server_address[1])  # the free port, when 0 was asked for
            if self._tls is not None:
                server.socket = self._tls.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, args=(0.05,), name=f"fake-http-{self.port}",
                             daemon=True).start()
            self._server = server
        return self

    def down(self) -> None:
        """Stop listening: new connections are refused until :meth:`up`."""
        server, self._server = self._server, None
        self.stopped.set()
        if server is not None:
            server.shutdown()
            server.server_close()

    close = down

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
