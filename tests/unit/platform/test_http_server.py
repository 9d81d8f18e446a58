"""The shared HTTP server (exporter/platform/http/) in this process, on 127.0.0.1: protocol details,
the connection cap and the probe listener, through real sockets.

In-process on purpose: ``make mutation`` judges the server by these tests (mutmut sees only the
pytest process). The whole daemons against hostile clients are in test_fair_serving.py and
tests/unit/serve/test_http_hostile.py.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from exporter.platform.http import Handler, HTTPServer, Response
from tests.harness.poll import wait_until


def ok(h: Handler, path: str, query: str) -> Response:
    return Response(200, b"ok\n")


@contextmanager
def serving(max_connections: int = 8, read_timeout: float = 5.0, **kwargs: Any) -> Iterator[HTTPServer]:
    """A server with /healthz (inline) and /metrics (work lane) running its I/O loop in a thread."""
    srv = HTTPServer(("127.0.0.1", 0), max_connections=max_connections, read_timeout=read_timeout, **kwargs)
    srv.route("/healthz", ok, "inline")
    srv.route("/metrics", ok)
    loop = threading.Thread(target=srv.serve_forever, name="test-http-io", daemon=True)
    loop.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(10)


def connect(srv: HTTPServer, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=timeout)


def read_answer(s: socket.socket) -> bytes:
    """One whole answer (head and Content-Length body) from ``s``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def exchange(srv: HTTPServer, data: bytes) -> bytes:
    """Send ``data`` on a new connection, half-close, and return all the server answers."""
    with connect(srv) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def closed(s: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes ``s`` within ``timeout`` (EOF or a reset)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


# ---- issue 36 item 10: protocol nits ---------------------------------------------------------------


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /healthz HTTP/1.1\r\n\r\n", b"400"),  # RFC 9112 3.2: a 1.1 request without Host is 400
    (b"GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n", b"400"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
    (b"GET /healthz HTTP/1.1\r\nHost:\r\n\r\n", b"200"),  # empty Host: allowed (no authority in the URI)
    (b"GET /healthz HTTP/1.0\r\n\r\n", b"200"),  # HTTP/1.0 has no Host requirement
])
def test_http11_without_host_is_400(request_bytes: bytes, status: bytes) -> None:
    with serving() as srv:
        answer = exchange(srv, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer


def test_http10_keep_alive_is_said_and_kept() -> None:
    """An HTTP/1.0 client asking for keep-alive is told so (``Connection: keep-alive``) when the
    connection stays open; one that does not ask gets ``Connection: close`` and a close."""
    with serving() as srv:
        with connect(srv) as s:
            for _ in range(2):
                s.sendall(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                answer = read_answer(s)
                assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\nConnection: keep-alive\r\n" in answer, answer
        with connect(srv) as s:
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            answer = read_answer(s)
            assert b"\r\nConnection: close\r\n" in answer and b"keep-alive" not in answer
            assert closed(s)
        with connect(srv) as s:  # HTTP/1.1 keeps the connection without saying so (its default)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_answer(s)
            assert b"Connection:" not in answer


def test_expect_100_continue_gets_an_interim_answer_before_the_body() -> None:
    """RFC 9110 10.1.1: a client that sends ``Expect: 100-continue`` waits for 100 before its body."""
    with serving() as srv, connect(srv) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            chunk = s.recv(1)
            assert chunk, interim
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"hello")
        assert read_answer(s).startswith(b"HTTP/1.1 200 ")
        # the next request on the connection: a body already sent with the head gets no 100
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi")
        assert read_answer(s).startswith(b"HTTP/1.1 200 ")


def test_no_interim_answer_without_a_body_or_expect() -> None:
    with serving() as srv:
        for request in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
                        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"):
            answer = exchange(srv, request)
            assert answer.startswith(b"HTTP/1.1 200 ") and b"100 Continue" not in answer, answer
        with connect(srv) as s:  # a body expected, no Expect: nothing is sent until the body is here
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n")
            s.settimeout(0.3)
            with pytest.raises(TimeoutError):
                s.recv(1)
            s.settimeout(10)
            s.sendall(b"abc")
            assert read_answer(s).startswith(b"HTTP/1.1 200 ")


def test_serving_in_process_works() -> None:
    with serving() as srv:
        wait_until(lambda: exchange(srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200 "),
                   10, what="an answer from the work lane")
