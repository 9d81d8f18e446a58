"""The I/O loop (exporter/platform/http/server.py) judged fast: a real HTTPServer in this process on
127.0.0.1 port 0, real sockets and real TLS handshakes (an EC key made once per module), each test in
milliseconds, so that ``make mutation`` (module ``http-server``) can run every mutant against them.

Exact answers (status line, headers, bytes), which connection is closed or evicted (the server's own
connection table, keyed by the client's address, read once the server has answered a later client:
no sleep), the deadline of each state with short read timeouts, the lanes, the caps, pipelining,
HEAD, Expect/100, half-close, write back-pressure, basic auth and its limiter, the probe listener.
The slower whole-behaviour tests (real TLS client certificates, the file limit) are in
test_http_server.py and test_http_survivors.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from exporter.platform import webconfig
from exporter.platform.http import Handler, HTTPServer, Response
from exporter.platform.http import server as server_mod
from exporter.platform.http.limits import PROBE_OPEN, connection_cap
from tests.harness.poll import wait_until
from tests.unit.platform.test_http_server import closed

T = 3.0  # a client's socket timeout: a mutant that hangs the loop fails a test in this long
LOGGER = "exporter.platform.http.server"


# ---- the server and its clients ----------------------------------------------------------------


class Calls:
    """What the routes saw: (path, query, thread name, authorized, pipelined, command, version)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, bool, bool, str, str]] = []
        self.lock = threading.Lock()

    def route(self, body: bytes = b"ok\n") -> Callable[[Handler, str, str], Response]:
        def fn(h: Handler, path: str, query: str) -> Response:
            with self.lock:
                self.seen.append((path, query, threading.current_thread().name, h.authorized, h.pipelined,
                                  h.command, h.request_version))
            return Response(200, body + query.encode())
        return fn


class Holder:
    """A route that holds its answer until ``release`` is set, counting the requests it started."""

    def __init__(self, body: bytes = b"held\n") -> None:
        self.release, self.started, self.body = threading.Event(), threading.Semaphore(0), body

    def __call__(self, h: Handler, path: str, query: str) -> Response:
        self.started.release()
        self.release.wait(T)
        return Response(200, self.body)

    def wait(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=T), "a held request did not reach its route"


@contextlib.contextmanager
def running(max_connections: int = 8, read_timeout: float = 5.0, calls: Calls | None = None,
            **kwargs: Any) -> Iterator[HTTPServer]:
    """A server with /healthz (inline), /readyz (probe lane) and /metrics (work lane), its loop in a thread."""
    srv = HTTPServer(("127.0.0.1", 0), max_connections=max_connections, read_timeout=read_timeout, **kwargs)
    calls = calls or Calls()
    srv.route("/healthz", calls.route(), "inline")
    srv.route("/readyz", calls.route(b"ready\n"), "probe")
    srv.route("/metrics", calls.route(b"metrics\n"))
    loop = threading.Thread(target=srv.serve_forever, name="test-io", daemon=True)
    loop.start()
    try:
        yield srv
        # the test is over: the loop must still be running (an exception in it stops all serving, and
        # its connections then look closed to the clients, as the loop closes them on its way out)
        assert loop.is_alive(), "the I/O loop died during the test"
    finally:
        srv._stop.set()
        srv._post("stop", None, None)
        loop.join(T)
        srv.server_close()


def connect(port: int | HTTPServer, timeout: float = T) -> socket.socket:
    if isinstance(port, HTTPServer):
        port = port.server_address[1]
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    _LEFT.pop(id(s), None)
    return s


_LEFT: dict[int, bytes] = {}  # bytes of a client's next answer, read with the one before (pipelining)


def req(path: str = "/healthz", method: str = "GET", version: str = "HTTP/1.1", extra: str = "") -> bytes:
    host = "Host: x\r\n" if version == "HTTP/1.1" else ""
    return f"{method} {path} {version}\r\n{host}{extra}\r\n".encode()


def read_answer(s: Any, head_only: bool = False) -> bytes:
    """One whole answer (head and its Content-Length body, or the head alone), b'' at EOF."""
    data = _LEFT.pop(id(s), b"")
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    body = bytearray(rest)
    length = 0 if head_only else next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                                       if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    assert len(body) >= length, (head, len(body))
    if body[length:]:
        _LEFT[id(s)] = bytes(body[length:])
    return head + b"\r\n\r\n" + bytes(body[:length])


def answer(status: str, body: bytes, *headers: str, close: bool = False) -> bytes:
    """The exact answer the server writes."""
    lines = [f"HTTP/1.1 {status}", "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
             *headers, *(["Connection: close"] if close else [])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def ask(s: Any, data: bytes, head_only: bool = False) -> bytes:
    s.sendall(data)
    return read_answer(s, head_only)


def eof(s: Any) -> bool:
    """Whether the server has closed ``s`` (EOF or a reset) within T."""
    return closed(s, T)


def table(d: dict[Any, None]) -> set[Any]:
    """The addresses of a connection table of the server (read from this thread: retried if it moved)."""
    for _ in range(100):
        with contextlib.suppress(RuntimeError):
            return {c.addr for c in list(d)}
    raise AssertionError("the table kept changing")


def me(s: socket.socket) -> Any:
    return s.getsockname()


def settle(srv: HTTPServer) -> None:
    """One exchange on a fresh connection, which the server then closes itself: every earlier event has
    been handled by the time it is answered, and it leaves nothing behind in the server's tables."""
    with connect(srv) as s:
        assert ask(s, req(extra="Connection: close\r\n")).startswith(b"HTTP/1.1 200 ")
        assert eof(s)


def empty(srv: HTTPServer) -> None:
    """Wait until the server holds no connection (the clients have closed theirs)."""
    wait_until(lambda: not srv._open and not srv._probe_open, T, 0.005, what="every connection closed")


# ---- the basics: one answer each way ------------------------------------------------------------


def test_each_lane_answers_exactly_and_in_its_own_thread() -> None:
    calls = Calls()
    with running(calls=calls) as srv, connect(srv) as s:
        assert srv.lanes == {"/healthz": "inline", "/readyz": "probe", "/metrics": "work"}  # work: the default
        assert ask(s, req("/healthz")) == answer("200 OK", b"ok\n")
        assert ask(s, req("/readyz?x=1")) == answer("200 OK", b"ready\nx=1")
        assert ask(s, req("/metrics")) == answer("200 OK", b"metrics\n")
        assert ask(s, req("/nowhere")) == answer("404 Not Found", b"not found\n")
    assert [(p, q, t) for p, q, t, *_ in calls.seen] == [
        ("/healthz", "", "test-io"), ("/readyz", "x=1", "http-probe"), ("/metrics", "", "http-work")]
    assert all(a and not pl and c == "GET" and v == "HTTP/1.1" for *_, a, pl, c, v in calls.seen)


def test_methods_other_than_get_and_head_get_405_and_the_connection_stays() -> None:
    with running() as srv, connect(srv) as s:
        for method in ("POST", "PUT", "OPTIONS", "DELETE"):
            assert ask(s, req("/metrics", method)) == answer("405 Method Not Allowed", b"only GET and HEAD\n",
                                                             "Allow: GET, HEAD")
        assert ask(s, req("/metrics", "POST", "HTTP/1.0", "Connection: keep-alive\r\n")) == answer(
            "405 Method Not Allowed", b"only GET and HEAD\n", "Allow: GET, HEAD", "Connection: keep-alive")
        assert ask(s, req()) == answer("200 OK", b"ok\n")


def test_a_route_sees_the_server_the_client_and_the_headers() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def route(h: Handler, path: str, query: str) -> Response:
        seen.append((h.server, h.client_address, dict(h.headers)))
        return Response(200, b"seen\n")

    with running() as srv, connect(srv) as s:
        srv.route("/seen", route, "inline")
        assert ask(s, req("/seen", extra="X-Thing: a\r\nX-Thing: b\r\n")) == answer("200 OK", b"seen\n")
        assert seen == [(srv, me(s), {"host": "x", "x-thing": "a, b"})]


def test_head_gets_the_head_alone_and_the_connection_goes_on() -> None:
    calls = Calls()
    with running(calls=calls) as srv, connect(srv) as s:
        head = ask(s, req("/metrics", "HEAD"), head_only=True)
        assert head == answer("200 OK", b"metrics\n")[:-len(b"metrics\n")]
        assert ask(s, req("/nowhere", "HEAD"), head_only=True).startswith(b"HTTP/1.1 404 ")
        assert ask(s, req()) == answer("200 OK", b"ok\n")  # no stray body bytes came before it
    assert calls.seen[0][5] == "HEAD"


def test_a_route_that_raises_gets_500_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def boom(h: Handler, path: str, query: str) -> Response:
        raise RuntimeError("bug")

    caplog.set_level(logging.ERROR, LOGGER)
    with running() as srv:
        srv.route("/boom", boom, "inline")
        srv.route("/boom2", boom)
        with connect(srv) as s:
            assert ask(s, req("/boom?" + "q" * 300)) == answer("500 Internal Server Error", b"internal error\n")
            assert ask(s, req("/boom2")) == answer("500 Internal Server Error", b"internal error\n")
            assert ask(s, req()) == answer("200 OK", b"ok\n")
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert msgs == [f"error serving {('/boom?' + 'q' * 300)[:200]!r}", "error serving '/boom2'"]
    assert all(r.exc_info for r in caplog.records if r.name == LOGGER)


def test_a_fast_route_answers_on_the_io_thread_or_leaves_it_to_the_lane() -> None:
    seen: list[str] = []

    def fast(h: Handler, path: str, query: str) -> Response | None:
        seen.append(threading.current_thread().name)
        return Response(200, b"cached\n") if query == "cached" else None

    calls = Calls()
    with running(calls=calls) as srv:
        srv.route("/m", calls.route(b"made\n"), fast=fast)
        with connect(srv) as s:
            assert ask(s, req("/m?cached")) == answer("200 OK", b"cached\n")
            assert ask(s, req("/m?other")) == answer("200 OK", b"made\nother")
            assert ask(s, req("/m?cached", "HEAD"), head_only=True) == answer("200 OK", b"cached\n")[:-7]
            assert ask(s, req("/m?cached", version="HTTP/1.0", extra="Connection: keep-alive\r\n")) == answer(
                "200 OK", b"cached\n", "Connection: keep-alive")
    assert seen == ["test-io"] * 4
    assert [(p, t) for p, _, t, *_ in calls.seen] == [("/m", "http-work")]


def test_the_web_configs_headers_are_on_every_answer(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n")
    with running(web=webconfig.load(str(cfg))) as srv, connect(srv) as s:
        extra = ("X-Frame-Options: deny", "X-Content-Type-Options: nosniff")
        assert ask(s, req()) == answer("200 OK", b"ok\n", *extra)
        assert ask(s, req("/metrics", "POST")) == answer("405 Method Not Allowed", b"only GET and HEAD\n",
                                                         *extra, "Allow: GET, HEAD")
        assert ask(s, b"BAD\r\n\r\n") == answer("400 Bad Request", b"malformed request line\n", *extra, close=True)


# ---- keep-alive, HTTP/1.0, pipelining -----------------------------------------------------------


def test_keep_alive_and_connection_close() -> None:
    with running() as srv:
        with connect(srv) as s:
            for _ in range(3):
                assert ask(s, req()) == answer("200 OK", b"ok\n")
            settle(srv)
            assert me(s) in table(srv._idle)
            assert ask(s, req(extra="Connection: Close\r\n")) == answer("200 OK", b"ok\n", close=True)
            assert eof(s)
        with connect(srv) as s:  # HTTP/1.0: closed unless it asks, told when kept
            assert ask(s, req(version="HTTP/1.0")) == answer("200 OK", b"ok\n", close=True)
            assert eof(s)
        with connect(srv) as s:
            for _ in range(2):
                assert ask(s, req(version="HTTP/1.0", extra="Connection: Keep-Alive\r\n")) == answer(
                    "200 OK", b"ok\n", "Connection: keep-alive")
            assert ask(s, req("/metrics", version="HTTP/1.0")) == answer("200 OK", b"metrics\n", close=True)
            assert eof(s)
        empty(srv)
        assert not srv._idle and not srv._writing and not srv._fresh


def test_pipelined_requests_are_answered_in_order_and_marked_pipelined() -> None:
    calls = Calls()
    with running(calls=calls) as srv, connect(srv) as s:
        s.sendall(req("/metrics?1") + req("/healthz?2") + req("/metrics?3") + req("/readyz?4"))
        assert [read_answer(s) for _ in range(4)] == [
            answer("200 OK", b"metrics\n1"), answer("200 OK", b"ok\n2"), answer("200 OK", b"metrics\n3"),
            answer("200 OK", b"ready\n4")]
        # ten more at once: each waits for its turn (a pause of TURN_BUDGET_S), never for the next event
        t0 = time.monotonic()
        s.sendall(b"".join(req(f"/healthz?{i}") for i in range(10)))
        assert [read_answer(s) for _ in range(10)] == [answer("200 OK", b"ok\n%d" % i) for i in range(10)]
        assert time.monotonic() - t0 < T  # milliseconds; waiting for the next event would take ~1 s each
        assert ask(s, req("/metrics?5")) == answer("200 OK", b"metrics\n5")
    assert [(q, pl) for _, q, _, _, pl, *_ in calls.seen] == [
        ("1", False), ("2", True), ("3", True), ("4", True), *((str(i), i > 0) for i in range(10)), ("5", False)]


def test_a_pipelined_request_split_across_reads_is_completed() -> None:
    with running() as srv, connect(srv) as s:
        s.sendall(req("/metrics?1") + req("/healthz?2")[:10])
        assert read_answer(s) == answer("200 OK", b"metrics\n1")
        s.sendall(req("/healthz?2")[10:])
        assert read_answer(s) == answer("200 OK", b"ok\n2")


def test_pipelined_requests_hold_a_few_work_slots_and_wait_for_them_without_503() -> None:
    """``--max-connections 4``: pipelined requests together hold one work slot; another pipelined
    request waits for it (deferred, never 503), and requests sent one at a time still get slots."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold(h: Handler, path: str, query: str) -> Response:
        if query == "hold":
            started.release()
            release.wait(T)
        return Response(200, b"held\n" + query.encode())

    with running(max_connections=4) as srv:
        assert srv._pipelined_cap == 1
        srv.route("/h", hold)
        try:
            with connect(srv) as a, connect(srv) as b, connect(srv) as c:
                a.sendall(req("/h?1") + req("/h?hold"))
                assert read_answer(a) == answer("200 OK", b"held\n1")
                assert started.acquire(timeout=T)
                b.sendall(req("/h?2") + req("/h?3"))
                assert read_answer(b) == answer("200 OK", b"held\n2")
                wait_until(lambda: len(srv._deferred) == 1, T, 0.005, what="b's pipelined request deferred")
                assert srv._pipelined == 1
                assert srv._deferred[0][0].addr == me(b) and srv._deferred[0][0].events == 0  # not watched
                assert ask(c, req("/h?4")) == answer("200 OK", b"held\n4")  # one at a time: a slot at once
                release.set()
                assert read_answer(a) == answer("200 OK", b"held\nhold")
                assert read_answer(b) == answer("200 OK", b"held\n3")
                settle(srv)
                assert srv._pipelined == 0 and not srv._deferred
        finally:
            release.set()


@pytest.mark.parametrize(("max_connections", "cap"), [(1, 1), (4, 1), (6, 1), (8, 2), (16, 4), (17, 4), (64, 4)])
def test_the_pipelined_cap_is_a_quarter_of_the_slots_within_one_to_four(max_connections: int, cap: int) -> None:
    srv = HTTPServer(("127.0.0.1", 0), max_connections=max_connections, read_timeout=2.5)
    try:
        assert srv._pipelined_cap == cap and type(srv._pipelined_cap) is int
        assert srv.busy_timeout == 6 * 2.5 and srv.read_timeout == 2.5
        assert srv.max_connections == max_connections and srv.max_open == connection_cap(max_connections)
        assert (srv._work.name, srv._work.limit) == ("work", max_connections)
        assert (srv._probe.name, srv._probe.limit) == ("probe", 4)
        assert (srv._bcrypt.name, srv._bcrypt.limit) == ("bcrypt", 1)
        assert srv.probe_socket is None and srv.probe_address is None and srv.live is None
        assert srv.web is None and srv._io_web() is None
        assert srv.server_address == srv.socket.getsockname() and srv.server_address[0] == "127.0.0.1"
        assert srv.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert srv.socket.getblocking() is False
        assert srv.socket.family == socket.AF_INET and srv.socket.type == socket.SOCK_STREAM
    finally:
        srv.server_close()


# ---- errors: 400 and friends, then a drained close ----------------------------------------------


@pytest.mark.parametrize(("data", "status", "message"), [
    (b"NOT HTTP\r\n\r\n", "400 Bad Request", b"malformed request line\n"),
    (b"GET / HTTP/2.0\r\n\r\n", "505 HTTP Version Not Supported", b"only HTTP/1.0 and HTTP/1.1\n"),
    (b"GET / HTTP/1.1\r\n\r\n", "400 Bad Request", b"HTTP/1.1 request without Host\n"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", "414 URI Too Long", b"request line or header too long\n"),
    (b"GET http://[x/ HTTP/1.1\r\nHost: x\r\n\r\n", "400 Bad Request", b"malformed request target\n"),
], ids=["not-http", "http2", "no-host", "long-target", "bad-target"])  # short ids: mutmut selects by id
def test_a_bad_request_gets_its_error_then_a_half_close(data: bytes, status: str, message: bytes) -> None:
    with running() as srv, connect(srv) as s:
        assert ask(s, data) == answer(status, message, close=True)
        assert s.recv(10) == b""  # half-closed: the answer is out, EOF follows at once
        settle(srv)
        assert me(s) in table(srv._closing)  # still read from, so that the answer is not lost to a reset
        s.sendall(b"more bytes the server reads and drops\r\n\r\n" * 10)
        s.shutdown(socket.SHUT_WR)
        wait_until(lambda: me(s) not in table(srv._open), T, 0.005, what="closed at the client's EOF")
        assert not srv._closing
    server_mod.DRAIN_S, drain = 60.0, server_mod.DRAIN_S
    try:
        with running() as srv, connect(srv) as s:  # at the EOF itself, not at the drain's deadline
            assert ask(s, data) == answer(status, message, close=True)
            s.shutdown(socket.SHUT_WR)
            wait_until(lambda: me(s) not in table(srv._open), T, 0.005, what="closed at the client's EOF")
    finally:
        server_mod.DRAIN_S = drain


def test_a_request_larger_than_the_buffer_gets_431() -> None:
    """Stray blank lines (allowed before a request) plus a maximal head plus most of its body: more
    than the buffer holds while still incomplete."""
    from exporter.platform.http.protocol import MAX_BODY, MAX_HEAD

    head = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % MAX_BODY
    pad = b"X-Pad: " + b"p" * 8000 + b"\r\n"
    while len(head) + len(pad) < MAX_HEAD - 100:
        head += pad
    data = b"\r\n" * 4000 + head + b"\r\n" + b"b" * (MAX_BODY - 1000)
    with running() as srv, connect(srv) as s:
        s.sendall(data)
        assert read_answer(s) == answer("431 Request Header Fields Too Large", b"request too large\n", close=True)


def test_the_drain_after_an_error_has_its_own_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "DRAIN_S", 0.05)
    with running() as srv, connect(srv) as s:
        t0 = time.monotonic()
        assert ask(s, b"BAD\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        wait_until(lambda: me(s) not in table(srv._open), T, 0.005, what="the drain's deadline")
        assert time.monotonic() - t0 < 4.0  # DRAIN_S, not the 5 s read timeout


# ---- half-close, Expect ----------------------------------------------------------------------------


def test_a_half_closed_client_gets_its_answer_then_the_close() -> None:
    with running() as srv:
        for path, body in (("/healthz", b"ok\n"), ("/metrics", b"metrics\n")):
            with connect(srv) as s:
                s.sendall(req(path))
                s.shutdown(socket.SHUT_WR)
                # kept or not, as the EOF was read with the request or after it, then closed
                assert read_answer(s) in (answer("200 OK", body, close=True), answer("200 OK", body))
                assert s.recv(10) == b""
        with connect(srv) as s:  # half a request, then EOF: nothing to answer
            s.sendall(req()[:12])
            s.shutdown(socket.SHUT_WR)
            assert s.recv(10) == b""
        with connect(srv) as s:  # EOF with nothing sent
            s.shutdown(socket.SHUT_WR)
            assert s.recv(10) == b""
        empty(srv)
        assert not srv._fresh


def test_expect_100_continue_once_per_request() -> None:
    with running() as srv, connect(srv) as s:
        s.sendall(req(extra="Content-Length: 6\r\nExpect: 100-Continue\r\n"))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"abc")  # half the body: no second 100
        s.sendall(b"def")
        assert read_answer(s) == answer("200 OK", b"ok\n")
        s.sendall(req(extra="Content-Length: 2\r\nExpect: 100-continue\r\n"))  # the next request: its own 100
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert ask(s, b"hi") == answer("200 OK", b"ok\n")
        s.sendall(req(extra="Content-Length: 2\r\n"))  # no Expect: no 100
        assert ask(s, b"hi") == answer("200 OK", b"ok\n")


def test_a_100_continue_the_client_cannot_take_closes_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half an interim answer would garble the next one: the connection is given up."""
    sent: list[int] = []

    class Short:
        def __init__(self, sock: Any) -> None:
            self.sock = sock

        def send(self, data: Any) -> int:
            if bytes(data) == b"HTTP/1.1 100 Continue\r\n\r\n":
                sent.append(self.sock.send(bytes(data)[:5]))
                return sent[-1]
            return int(self.sock.send(data))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    with running() as srv:
        real_add = srv._add
        monkeypatch.setattr(srv, "_add", lambda sock, addr, probe=False: real_add(Short(sock), addr, probe))
        with connect(srv) as s:
            s.sendall(req(extra="Content-Length: 6\r\nExpect: 100-continue\r\n"))
            assert s.recv(100) == b"HTTP/"
            assert eof(s)
        assert sent == [5]
        settle(srv)


# ---- deadlines, one per state ----------------------------------------------------------------------


def test_a_silent_connection_is_closed_at_the_read_timeout() -> None:
    with running(read_timeout=0.1) as srv, connect(srv) as s:
        t0 = time.monotonic()
        assert eof(s)
        assert 0.09 <= time.monotonic() - t0 < T
        assert not srv._fresh and not srv._open


def test_an_idle_keep_alive_connection_is_closed_at_the_read_timeout() -> None:
    with running(read_timeout=0.15) as srv, connect(srv) as s:
        s.sendall(req())
        assert read_answer(s) == answer("200 OK", b"ok\n")
        t0 = time.monotonic()
        assert eof(s)
        assert 0.14 <= time.monotonic() - t0 < T
        assert not srv._idle and not srv._open


def test_an_answer_that_never_comes_is_closed_at_the_busy_deadline() -> None:
    release = threading.Event()

    def hang(h: Handler, path: str, query: str) -> Response:
        release.wait(T)
        return Response(200, b"late\n")

    with running(read_timeout=0.05) as srv:
        srv.route("/hang", hang)
        try:
            with connect(srv) as s:
                t0 = time.monotonic()
                s.sendall(req("/hang"))
                assert eof(s)
                assert 0.29 <= time.monotonic() - t0 < T  # 6 read timeouts, not 1
                assert not srv._busy and not srv._open
        finally:
            release.set()


def test_an_answer_that_is_not_taken_is_closed_at_the_read_timeout() -> None:
    big = b"x" * (8 << 20)
    with running(read_timeout=0.2) as srv:
        srv.route("/big", lambda h, p, q: Response(200, big), "inline")
        with connect(srv) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(req("/big"))
            wait_until(lambda: me(s) in table(srv._writing), T, 0.005, what="writing")
            wait_until(lambda: me(s) not in table(srv._open), T, 0.01, what="the writing deadline")
            assert not srv._writing


def test_a_slow_handshake_is_closed_at_the_read_timeout(tls_web: webconfig.WebConfig) -> None:
    with running(read_timeout=0.1, web=tls_web) as srv, connect(srv) as s:
        s.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        assert eof(s)
        assert not srv._open


# ---- the connection cap: who is evicted --------------------------------------------------------


def test_at_the_cap_the_oldest_silent_connection_makes_room() -> None:
    with running() as srv:
        srv.max_open = 4
        conns = [connect(srv) for _ in range(3)]
        try:
            settle(srv)  # the fourth: all four held, then it closes
            assert table(srv._open) == {me(c) for c in conns}
            conns.append(connect(srv))
            settle(srv)  # the fifth: the oldest silent one goes
            assert eof(conns[0])
            assert table(srv._open) == {me(c) for c in conns[1:]}
            conns.append(connect(srv))
            settle(srv)
            assert eof(conns[1])
            assert table(srv._open) == {me(c) for c in conns[2:]}
        finally:
            for c in conns:
                c.close()


def test_eviction_order_closing_then_silent_then_idle_then_writing(caplog: pytest.LogCaptureFixture) -> None:
    """Each new connection at the cap closes one: the one being drained after an error, then the one
    that never sent a request, then the idle keep-alive, then the answer not being taken; the new
    ones hold their answer (being made: never evicted), so the cap stays reached."""
    big = b"y" * (8 << 20)
    hold = Holder(b"held\n")
    release = hold.release

    caplog.set_level(logging.DEBUG, LOGGER)
    with running() as srv:
        srv.route("/big", lambda h, p, q: Response(200, big), "inline")
        srv.route("/hold", hold)
        srv.max_open = 4
        writing, idle, silent, closing = (connect(srv) for _ in range(4))
        new: list[socket.socket] = []
        try:
            writing.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            writing.sendall(req("/big"))
            assert ask(idle, req()) == answer("200 OK", b"ok\n")
            assert ask(closing, b"BAD\r\n\r\n").startswith(b"HTTP/1.1 400 ")
            for conn, d in ((writing, srv._writing), (idle, srv._idle), (closing, srv._closing),
                            (silent, srv._fresh)):
                wait_until(lambda conn=conn, d=d: me(conn) in table(d), T, 0.005, what="its state")
            order: list[str] = []
            for _ in range(4):
                new.append(connect(srv))
                new[-1].sendall(req("/hold"))
                hold.wait(1)  # accepted: one of the four was closed for it
                order += [n for n, c in (("writing", writing), ("idle", idle), ("silent", silent),
                                         ("closing", closing)) if n not in order and me(c) not in table(srv._open)]
                assert len(srv._open) == 4
            assert order == ["closing", "silent", "idle", "writing"]
            evictions = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]
            assert evictions == [f"closing the connection of {me(c)} for a new one: 4 open"
                                 for c in (closing, silent, idle, writing)]
            with connect(srv) as s:  # every one being answered: nothing to evict, refused
                assert eof(s)
        finally:
            release.set()
            for c in (writing, idle, silent, closing, *new):
                c.close()


def test_at_the_cap_with_every_connection_being_answered_new_ones_are_refused_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    hold = Holder(b"done\n")
    release = hold.release

    caplog.set_level(logging.INFO, LOGGER)
    with running(probe_port=0) as srv:
        srv.route("/hold", hold)
        srv.max_open = 2
        held = [connect(srv) for _ in range(2)]
        try:
            for c in held:  # a first request each (no longer silent), then one the route holds
                assert ask(c, req()) == answer("200 OK", b"ok\n")
                c.sendall(req("/hold"))
            hold.wait(len(held))
            for _ in range(3):
                with connect(srv) as s:
                    assert eof(s)  # closed at once: nothing to evict
            with connect(srv.probe_address[1]) as p:  # the probe listener is not behind the main cap
                assert ask(p, req()) == answer("200 OK", b"ok\n")
            assert srv._refusing == 3
            release.set()
            assert [read_answer(c) for c in held] == [answer("200 OK", b"done\n")] * 2
            settle(srv)
            assert srv._refusing == 0
        finally:
            release.set()
            for c in held:
                c.close()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert lines == [
        ("WARNING", "2 connections open (the cap, from the file limit), every one being answered: closing new "
                    "connections until one ends"),
        ("INFO", "accepting connections again after refusing 3 at the cap")]


# ---- the work lane's slots -------------------------------------------------------------------------


def test_exactly_max_connections_requests_are_held_and_the_next_gets_503() -> None:
    hold = Holder(b"held\n")
    release = hold.release

    with running(max_connections=2) as srv:
        srv.route("/hold", hold)
        held = [connect(srv) for _ in range(2)]
        try:
            for c in held:
                c.sendall(req("/hold"))
            hold.wait(len(held))
            with connect(srv) as s:
                assert ask(s, req("/hold")) == answer("503 Service Unavailable", b"too many requests in progress\n",
                                                      "Retry-After: 1", close=True)
                assert ask(connect(srv), req("/readyz")).startswith(b"HTTP/1.1 200 ")  # the probe lane: its own
            release.set()
            assert [read_answer(c) for c in held] == [answer("200 OK", b"held\n")] * 2
            with connect(srv) as s:
                assert ask(s, req("/hold")) == answer("200 OK", b"held\n")
        finally:
            release.set()
            for c in held:
                c.close()


# ---- big answers and a client that reads slowly --------------------------------------------------


@pytest.mark.parametrize("size", [16384, 16385, 64 * 1024, 64 * 1024 + 1, 300_000])
def test_answers_of_every_size_arrive_whole(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    with running() as srv:
        srv.route("/b", lambda h, p, q: Response(200, body), "inline")
        with connect(srv) as s:
            assert ask(s, req("/b")) == answer("200 OK", body)
            assert ask(s, req("/b", "HEAD"), head_only=True) == answer("200 OK", body)[:-size]
            assert ask(s, req()) == answer("200 OK", b"ok\n")


def test_a_client_that_does_not_read_holds_up_no_one() -> None:
    big = bytes(range(256)) * (64 << 10)  # 16 MiB: more than the socket buffers take
    with running() as srv:
        srv.route("/big", lambda h, p, q: Response(200, big), "inline")
        with connect(srv) as slow:
            slow.sendall(req("/big") + req())
            wait_until(lambda: me(slow) in table(srv._writing), T, 0.005, what="writing")
            for _ in range(3):
                settle(srv)
            assert me(slow) in table(srv._writing)
            assert read_answer(slow) == answer("200 OK", big)
            assert read_answer(slow) == answer("200 OK", b"ok\n")  # its pipelined request after it


# ---- basic auth, its limiter and the rate limit --------------------------------------------------


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("auth")
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    (d / "web.yml").write_text(f"basic_auth_users:\n  u: {hashed}\n")
    return d / "web.yml"


def basic(user: str, pw: str) -> str:
    import base64

    return "Authorization: Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode() + "\r\n"


UNAUTHORIZED = answer("401 Unauthorized", b"unauthorized\n", 'WWW-Authenticate: Basic realm="gpu-exporter", '
                      'charset="UTF-8"')


def test_basic_auth_protects_everything_but_the_probes(users_file: Path) -> None:
    calls = Calls()
    with running(calls=calls, web=webconfig.load(str(users_file))) as srv, connect(srv) as s:
        assert ask(s, req("/metrics")) == UNAUTHORIZED
        assert ask(s, req("/nowhere")) == UNAUTHORIZED
        assert ask(s, req("/metrics", "HEAD"), head_only=True) == UNAUTHORIZED[:-len(b"unauthorized\n")]
        assert ask(s, req("/metrics", extra=basic("u", "bad"))) == UNAUTHORIZED
        assert ask(s, req("/metrics", extra=basic("u", "pw"))) == answer("200 OK", b"metrics\n")
        assert ask(s, req("/metrics", extra=basic("u", "pw"))) == answer("200 OK", b"metrics\n")  # cached
        assert ask(s, req("/healthz")) == answer("200 OK", b"ok\n")  # open, anonymous
        assert ask(s, req("/readyz", extra=basic("u", "bad"))) == answer("200 OK", b"ready\n")
        assert ask(s, req("/healthz", extra=basic("u", "pw"))) == answer("200 OK", b"ok\n")
    assert [(p, a) for p, _, _, a, *_ in calls.seen] == [
        ("/metrics", True), ("/metrics", True), ("/healthz", False), ("/readyz", False), ("/healthz", True)]
    assert srv.failures._buckets.keys() == {"127.0.0.1"}


def test_a_password_is_checked_once_then_cached(users_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    web = webconfig.load(str(users_file))
    checks: list[str] = []
    real = web.check

    def counting(header: str | None) -> bool:
        checks.append(threading.current_thread().name)
        return real(header)

    monkeypatch.setattr(web, "check", counting)
    with running(web=web) as srv, connect(srv) as s:
        for _ in range(3):
            assert ask(s, req("/metrics", extra=basic("u", "pw"))) == answer("200 OK", b"metrics\n")
    assert checks == ["http-bcrypt"]


def test_failed_logins_are_limited_per_address_and_a_good_one_refunds(users_file: Path) -> None:
    with running(web=webconfig.load(str(users_file))) as srv:
        srv.failures.refill_s = 3600.0  # no refill during the test
        with connect(srv) as s:
            for _ in range(9):
                assert ask(s, req("/metrics", extra=basic("u", "bad"))) == UNAUTHORIZED
            assert ask(s, req("/metrics", extra=basic("u", "pw"))) == answer("200 OK", b"metrics\n")  # refunded
            assert ask(s, req("/metrics", extra=basic("u", "bad"))) == UNAUTHORIZED
            assert ask(s, req("/metrics", extra=basic("u", "bad"))) == answer(
                "429 Too Many Requests", b"too many failed logins\n", "Retry-After: 3600")
            assert ask(s, req("/healthz", extra=basic("u", "bad"))) == answer("200 OK", b"ok\n")  # a probe: open
            assert ask(s, req("/metrics", extra=basic("u", "pw"))) == answer("200 OK", b"metrics\n")  # cached


def test_too_many_checks_waiting_get_503_and_cost_no_failure(users_file: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "BCRYPT_WAITING", 0)
    calls = Calls()
    with running(calls=calls, web=webconfig.load(str(users_file))) as srv, connect(srv) as s:
        for _ in range(12):
            assert ask(s, req("/metrics", extra=basic("u", "bad"))) == answer(
                "503 Service Unavailable", b"too many logins being checked\n", "Retry-After: 1")
        assert ask(s, req("/readyz", extra=basic("u", "pw"))) == answer("200 OK", b"ready\n")  # anonymous
        monkeypatch.setattr(server_mod, "BCRYPT_WAITING", 1)
        assert ask(s, req("/metrics", extra=basic("u", "bad"))) == UNAUTHORIZED  # not 429: nothing charged
        assert srv.failures._tokens("127.0.0.1", time.monotonic()) < 10
    assert [(p, a) for p, _, _, a, *_ in calls.seen] == [("/readyz", False)]


def test_refusals_of_a_head_request_are_heads(users_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """401 after a check, 429 from the limiter, 503 from a full bcrypt lane: a HEAD gets the head alone
    (the connection goes on, no stray body before the next answer)."""
    with running(web=webconfig.load(str(users_file))) as srv, connect(srv) as s:
        head = req("/metrics", "HEAD", extra=basic("u", "bad"))
        assert ask(s, head, head_only=True) == UNAUTHORIZED[:-len(b"unauthorized\n")]
        srv.failures.refill_s = 3600.0
        srv.failures._buckets["127.0.0.1"] = (0.0, time.monotonic())
        assert ask(s, head, head_only=True).startswith(b"HTTP/1.1 429 ")
        srv.failures._buckets.clear()
        monkeypatch.setattr(server_mod, "BCRYPT_WAITING", 0)
        assert ask(s, head, head_only=True).startswith(b"HTTP/1.1 503 ")
        assert ask(s, req()) == answer("200 OK", b"ok\n")


def slow_checks(users_file: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[webconfig.WebConfig, threading.Event,
                                                                           threading.Event]:
    """The web config of ``users_file`` whose password checks wait for ``go`` (and set ``entered``)."""
    web = webconfig.load(str(users_file))
    go, entered = threading.Event(), threading.Event()
    real = web.check

    def slow(header: str | None) -> bool:
        entered.set()
        go.wait(T)
        return real(header)

    monkeypatch.setattr(web, "check", slow)
    return web, go, entered


def test_nothing_more_is_read_while_a_password_is_checked(users_file: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    web, go, entered = slow_checks(users_file, monkeypatch)
    with running(web=web) as srv, connect(srv) as s:
        s.sendall(req("/metrics", extra=basic("u", "pw")))
        assert entered.wait(T)
        s.sendall(req("/healthz?next"))  # sent while the check runs
        settle(srv)
        conn = next(c for c in list(srv._open) if c.addr == me(s))
        assert conn.events == 0 and not conn.buf  # not watched: not read
        go.set()
        assert read_answer(s) == answer("200 OK", b"metrics\n")
        assert read_answer(s) == answer("200 OK", b"ok\nnext")


def test_a_password_check_that_raises_is_a_refusal(users_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    web = webconfig.load(str(users_file))

    def broken(header: str | None) -> bool:
        raise RuntimeError("bcrypt broke")

    monkeypatch.setattr(web, "check", broken)
    with running(web=web) as srv, connect(srv) as s:
        assert ask(s, req("/metrics", extra=basic("u", "pw"))) == UNAUTHORIZED
        assert ask(s, req("/readyz", extra=basic("u", "pw"))) == answer("200 OK", b"ready\n")  # a probe: open


def test_a_check_that_ends_after_its_connection_closed_answers_nothing(users_file: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    web, go, entered = slow_checks(users_file, monkeypatch)
    with running(web=web, read_timeout=0.05) as srv:
        with connect(srv) as s:
            s.sendall(req("/metrics", extra=basic("u", "pw")))
            assert entered.wait(T)
            assert eof(s)  # the busy deadline
        go.set()
        settle(srv)
        empty(srv)


def test_the_rate_limit_refuses_beyond_its_burst_but_never_a_probe(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("rate_limit:\n  interval: 1h\n  burst: 2\n")
    with running(web=webconfig.load(str(cfg))) as srv, connect(srv) as s:
        assert ask(s, req("/metrics")) == answer("200 OK", b"metrics\n")
        assert ask(s, req("/nowhere")) == answer("404 Not Found", b"not found\n")
        for path in ("/metrics", "/nowhere"):
            assert ask(s, req(path)) == answer("429 Too Many Requests", b"rate limited\n", "Retry-After: 1")
        assert ask(s, req("/metrics", "HEAD"), head_only=True) == answer(
            "429 Too Many Requests", b"rate limited\n", "Retry-After: 1")[:-len(b"rate limited\n")]
        for path in ("/healthz", "/readyz"):
            assert ask(s, req(path)).startswith(b"HTTP/1.1 200 ")


# ---- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and two client certificates: EC keys (milliseconds)."""
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.crt")
    for name, san in (("server", "IP:127.0.0.1"), ("ok", "DNS:prometheus.example"), ("other", "DNS:other.example")):
        (d / f"{name}.cnf").write_text(f"subjectAltName={san}\n")
        openssl("req", *ec, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.cnf", "-out", f"{name}.crt")
    return d


def tls_file(pki: Path, d: Path, extra: str = "") -> str:
    path = d / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
                    + extra)
    return str(path)


@pytest.fixture
def tls_web(pki: Path, tmp_path: Path) -> webconfig.WebConfig:
    return webconfig.load(tls_file(pki, tmp_path))


def tls_connect(srv: HTTPServer, pki: Path, cert: str | None = None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    s = ctx.wrap_socket(connect(srv), server_hostname="127.0.0.1")
    _LEFT.pop(id(s), None)
    return s


def test_tls_answers_keep_alive_pipelining_and_errors(pki: Path, tls_web: webconfig.WebConfig) -> None:
    with running(web=tls_web) as srv:
        with tls_connect(srv, pki) as s:
            assert ask(s, req()) == answer("200 OK", b"ok\n")
            assert ask(s, req("/metrics")) == answer("200 OK", b"metrics\n")
            s.sendall(req("/metrics?1") + req("/healthz?2") + req("/readyz?3"))  # one TLS record, three requests
            assert [read_answer(s) for _ in range(3)] == [
                answer("200 OK", b"metrics\n1"), answer("200 OK", b"ok\n2"), answer("200 OK", b"ready\n3")]
            body = b"t" * 200_000
            srv.route("/big", lambda h, p, q: Response(200, body), "inline")
            assert ask(s, req("/big")) == answer("200 OK", body)
            conn = next(iter(srv._open))
            assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert conn.web is tls_web
        with tls_connect(srv, pki) as s:  # an error over TLS: the connection is closed at once, not drained
            assert ask(s, b"BAD\r\n\r\n") == answer("400 Bad Request", b"malformed request line\n", close=True)
            settle_tls(srv, pki)
            assert me(s) not in table(srv._open) and not srv._closing
            assert eof(s)
        with connect(srv) as s:  # plain HTTP on the TLS port: the handshake fails, closed
            s.sendall(req())
            assert eof(s)
        settle_tls(srv, pki)
        empty(srv)


def settle_tls(srv: HTTPServer, pki: Path) -> None:
    with tls_connect(srv, pki) as s:
        assert ask(s, req(extra="Connection: close\r\n")).startswith(b"HTTP/1.1 200 ")


def test_client_allowed_sans_closes_other_certificates_after_the_handshake(pki: Path, tmp_path: Path) -> None:
    web = webconfig.load(tls_file(pki, tmp_path, f"  client_ca_file: {pki / 'ca.crt'}\n"
                                                 "  client_auth_type: RequireAndVerifyClientCert\n"
                                                 "  client_allowed_sans: [prometheus.example]\n"))
    with running(web=web) as srv:
        with tls_connect(srv, pki, "ok") as s:
            assert ask(s, req()) == answer("200 OK", b"ok\n")
        with tls_connect(srv, pki, "other") as s:  # TLS 1.3: the handshake ends client-side first
            with contextlib.suppress(OSError):
                s.sendall(req())
            with pytest.raises(OSError):
                assert s.recv(100) == b""
                raise OSError("EOF")
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        with connect(srv) as raw, pytest.raises(OSError), \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:  # no certificate: refused
            s.sendall(req())
            if not s.recv(100):
                raise OSError("EOF")


def test_the_probe_listener_is_plain_http_open_and_serves_only_the_probes(pki: Path, tmp_path: Path,
                                                                         users_file: Path) -> None:
    cfg = tls_file(pki, tmp_path, users_file.read_text() + "rate_limit:\n  interval: 1h\n  burst: 1\n")
    calls = Calls()
    with running(web=webconfig.load(cfg), probe_port=0, calls=calls, read_timeout=3) as srv:
        port = srv.probe_address[1]
        assert srv.probe_address == srv.probe_socket.getsockname()
        assert srv.probe_socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) >= 1
        with connect(port) as p:
            for _ in range(3):  # the rate limit's burst of 1 is not spent on probes
                assert ask(p, req("/healthz")) == answer("200 OK", b"ok\n")
                assert ask(p, req("/readyz")) == answer("200 OK", b"ready\n")
            assert ask(p, req("/metrics", extra=basic("u", "pw"))) == answer("404 Not Found", b"not found\n")
            assert ask(p, req("/nowhere")) == answer("404 Not Found", b"not found\n")
            assert ask(p, req("/metrics", "HEAD"), head_only=True) == answer("404 Not Found", b"not found\n")[:-10]
            assert ask(p, req("/readyz")) == answer("200 OK", b"ready\n")  # no stray body before it
            assert me(p) in table(srv._probe_open) and me(p) not in table(srv._open)
        with tls_connect(srv, pki) as s:
            assert ask(s, req("/metrics")) == UNAUTHORIZED
    anonymous = [("/healthz", False), ("/readyz", False)] * 3 + [("/readyz", False)]
    assert [(p, a) for p, _, _, a, *_ in calls.seen] == anonymous


def test_the_probe_listener_evicts_only_its_own_and_the_main_port_cannot_fill_it() -> None:
    with running(probe_port=0) as srv:
        srv.max_open = 4
        port = srv.probe_address[1]
        main = [connect(srv) for _ in range(4)]
        probes: list[socket.socket] = []
        try:
            settle(srv)
            for i in range(PROBE_OPEN + 3):  # probe connections that send a request and then idle
                p = connect(port)
                probes.append(p)
                assert ask(p, req()) == answer("200 OK", b"ok\n"), i
            assert len(srv._probe_open) == PROBE_OPEN
            assert table(srv._probe_open) == {me(p) for p in probes[3:]}
            assert all(eof(p) for p in probes[:3])
            assert len(srv._open) <= 4 and table(srv._open) & {me(c) for c in main[1:]} == {me(c) for c in main[1:]}
        finally:
            for c in main + probes:
                c.close()


def test_a_busy_probe_listener_refuses_a_new_probe_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    hold = Holder(b"up\n")
    release = hold.release

    monkeypatch.setattr(server_mod, "PROBE_OPEN", 2)
    with running(probe_port=0) as srv:
        srv.route("/healthz", hold, "probe")
        port = srv.probe_address[1]
        held = [connect(port) for _ in range(2)]
        try:
            for c in held:
                c.sendall(req())
            hold.wait(len(held))
            with connect(port) as p:
                p.sendall(req())
                assert eof(p)
            assert len(srv._probe_open) == 2
            release.set()
            assert [read_answer(c) for c in held] == [answer("200 OK", b"up\n")] * 2
        finally:
            release.set()
            for c in held:
                c.close()


# ---- accepting, shutting down, the listeners -----------------------------------------------------


class FailingListener:
    """The listening socket, with ``accept`` failing (EMFILE) ``fail`` more times."""

    def __init__(self, sock: socket.socket, fail: int) -> None:
        self.sock, self.fail = sock, fail

    def accept(self) -> tuple[socket.socket, Any]:
        if self.fail:
            self.fail -= 1
            raise OSError(24, "Too many open files")
        return self.sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_failed_accepts_pause_the_listener_and_are_logged_once_per_episode(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "ACCEPT_PAUSE_S", 0.01)
    caplog.set_level(logging.INFO, LOGGER)
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)
    srv.route("/healthz", Calls().route(), "inline")
    listener = FailingListener(srv.socket, 5)
    srv.socket = listener  # type: ignore[assignment]
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        for episode in range(2):
            with connect(srv.server_address[1]) as s:  # closed by the server: none open at the next episode
                assert ask(s, req(extra="Connection: close\r\n")) == answer("200 OK", b"ok\n", close=True)
                assert eof(s)
                assert listener.fail == 0
                assert srv._accept_failures == 0 and srv._accept_paused_until == 0.0
            listener.fail = 3 if episode == 0 else 0
        lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
        warn = ("WARNING", "accept failed: [Errno 24] Too many open files; pausing accepts for 0.01 s at a time "
                           f"until one succeeds (0 connections open, cap {srv.max_open})")
        assert lines == [warn, ("INFO", "accepting again after 5 failed accepts"),
                         warn, ("INFO", "accepting again after 3 failed accepts")]
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(T)


def test_a_failing_probe_accept_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with running(probe_port=0) as srv:
        listener = FailingListener(srv.probe_socket, 1)  # type: ignore[arg-type]
        srv.probe_socket = listener  # type: ignore[assignment]
        with connect(srv.probe_address[1]) as p:
            assert ask(p, req()) == answer("200 OK", b"ok\n")
        assert listener.fail == 0


def test_many_connections_at_once_are_all_accepted() -> None:
    with running() as srv:
        conns = [connect(srv) for _ in range(150)]
        try:
            for c in conns:
                c.sendall(req())
            assert all(read_answer(c) == answer("200 OK", b"ok\n") for c in conns)
        finally:
            for c in conns:
                c.close()


def test_shutdown_closes_every_connection_and_server_close_the_listeners() -> None:
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0, probe_port=0)
    srv.route("/healthz", Calls().route(), "inline")
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    port, probe_port = srv.server_address[1], srv.probe_address[1]
    with connect(port) as a, connect(port) as b, connect(probe_port) as p:
        assert ask(a, req()) == answer("200 OK", b"ok\n")
        assert ask(p, req()) == answer("200 OK", b"ok\n")
        settle(srv)
        stopper = threading.Thread(target=srv.shutdown, daemon=True)
        stopper.start()
        stopper.join(T)
        assert not stopper.is_alive(), "shutdown did not return"
        assert not loop.is_alive()
        assert eof(a) and eof(b) and eof(p)
        assert not srv._open and not srv._probe_open
    srv.server_close()
    for q in (port, probe_port):
        with pytest.raises(ConnectionRefusedError):
            connect(q).close()
    assert srv.socket.fileno() == -1 and srv._wake_r.fileno() == -1 and srv._wake_w.fileno() == -1


def test_server_close_without_a_loop_returns_at_once() -> None:
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)
    t0 = time.monotonic()
    srv.server_close()
    srv.shutdown()
    assert time.monotonic() - t0 < 1.0 and srv.socket.fileno() == -1


def test_a_probe_port_in_use_fails_construction_and_leaks_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError):
            HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0, probe_port=taken.getsockname()[1])
        assert set(os.listdir("/proc/self/fd")) <= before


def test_ipv6_listens_on_ipv6() -> None:
    try:
        srv = HTTPServer(("::1", 0), max_connections=8, read_timeout=5.0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert srv.socket.family == socket.AF_INET6
    finally:
        srv.server_close()


def test_the_loop_failing_is_logged_and_raised(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)

    def broken() -> None:
        raise RuntimeError("bug in the loop")

    monkeypatch.setattr(srv, "_turn", broken)
    caplog.set_level(logging.ERROR, LOGGER)
    with pytest.raises(RuntimeError, match="bug in the loop"):
        srv.serve_forever()
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == ["HTTP I/O loop failed"]
    assert srv._stopped.is_set()
    srv.server_close()


# ---- what the loop does when a socket call fails: a bare server, its methods called directly ---------
# (a real socket pair under each connection, with a scripted failure in front: the kernel gives none of
# these on 127.0.0.1 at will)


class Fake:
    """A real socket whose listed methods first take their next scripted outcome: an exception to
    raise, or for ``send`` a byte count to let through."""

    def __init__(self, sock: socket.socket, **script: list[Any]) -> None:
        self.sock, self.script = sock, script
        self.sends: list[int] = []
        self.recvs: list[int] = []
        self.peer_cert: Any = None

    def _next(self, name: str) -> Any:
        todo = self.script.get(name)
        if not todo:
            return None
        out = todo.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    def send(self, data: Any) -> int:
        self.sends.append(len(data))
        n = self._next("send")
        return int(self.sock.send(data if n is None else bytes(data)[:n]))

    def recv(self, n: int) -> bytes:
        self.recvs.append(n)
        self._next("recv")
        return self.sock.recv(n)

    def do_handshake(self) -> None:
        self._next("do_handshake")

    def close(self) -> None:
        self._next("close")
        self.sock.close()

    def getpeercert(self) -> Any:
        return self.peer_cert

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.fixture
def bare() -> Iterator[HTTPServer]:
    """A server whose loop does not run: the test calls its methods."""
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)
    srv.route("/healthz", Calls().route(), "inline")
    yield srv
    for conn in list(srv._open):
        srv._close(conn)
    srv._sel.close()
    srv.server_close()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.settimeout(T)
    yield a, b
    a.close()
    b.close()


def attach(srv: HTTPServer, fake: Fake, handshaken: bool = True) -> Any:
    conn = server_mod._Conn(fake, ("127.0.0.1", 9), time.monotonic() + 5.0, handshaken=handshaken)
    srv._open[conn] = None
    srv._fresh[conn] = None
    srv._want(conn, server_mod.selectors.EVENT_READ)
    return conn


def busy(srv: HTTPServer, conn: Any) -> None:
    srv._fresh.pop(conn, None)
    conn.state = server_mod._BUSY
    srv._busy[conn] = None


WRITE, READ = server_mod.selectors.EVENT_WRITE, server_mod.selectors.EVENT_READ


@pytest.mark.parametrize("error", [BlockingIOError(), InterruptedError(), ssl.SSLWantWriteError(),
                                   ssl.SSLWantReadError()], ids=["blocking", "eintr", "ssl-write", "ssl-read"])
def test_a_send_that_would_block_loses_nothing_and_waits_for_writable(bare: HTTPServer, pair: Any,
                                                                        error: Exception) -> None:
    a, b = pair
    conn = attach(bare, Fake(a, send=[error]))
    busy(bare, conn)
    bare._send_answer(conn, None, Response(200, b"abc"))
    assert conn.state == server_mod._WRITE and conn.events == WRITE and conn in bare._writing
    assert conn.out and bytes(conn.out[0]) == answer("200 OK", b"abc")
    bare._flush(conn)  # writable again
    assert b.recv(1000) == answer("200 OK", b"abc")
    assert conn.state == server_mod._READ and conn in bare._idle and conn.events == READ and not bare._writing


def test_a_send_that_fails_closes_the_connection(bare: HTTPServer, pair: Any) -> None:
    a, _b = pair
    conn = attach(bare, Fake(a, send=[ConnectionResetError()]))
    busy(bare, conn)
    bare._send_answer(conn, None, Response(200, b"abc"))
    assert conn not in bare._open and not bare._writing and conn.events == 0 and a.fileno() == -1


def test_a_big_answer_goes_out_one_chunk_a_turn(bare: HTTPServer, pair: Any) -> None:
    a, _b = pair
    fake = Fake(a)
    conn = attach(bare, fake)
    busy(bare, conn)
    body = b"c" * (3 * server_mod.SEND_CHUNK)
    head = answer("200 OK", body)[:-len(body)]
    bare._send_answer(conn, None, Response(200, body))
    assert fake.sends == [len(head), server_mod.SEND_CHUNK] and conn.events == WRITE
    bare._flush(conn)
    assert fake.sends[2:] == [server_mod.SEND_CHUNK] and conn.events == WRITE


def test_a_partial_send_keeps_the_rest(bare: HTTPServer, pair: Any) -> None:
    a, b = pair
    conn = attach(bare, Fake(a, send=[3, 0]))
    busy(bare, conn)
    bare._send_answer(conn, None, Response(200, b"abc"))
    assert conn.events == WRITE and b.recv(1000) == b"HTT"
    bare._flush(conn)
    assert b.recv(1000) == answer("200 OK", b"abc")[3:]


@pytest.mark.parametrize("error", [BlockingIOError(), InterruptedError(), ssl.SSLWantWriteError(),
                                   ssl.SSLWantReadError()], ids=["blocking", "eintr", "ssl-write", "ssl-read"])
def test_a_100_continue_that_cannot_be_sent_now_is_not_sent(bare: HTTPServer, pair: Any, error: Exception) -> None:
    a, _b = pair
    conn = attach(bare, Fake(a, send=[error]))
    bare._continue(conn)
    assert conn.continued and conn in bare._open and conn.state == server_mod._READ and a.fileno() != -1


def test_a_100_continue_that_fails_closes_the_connection(bare: HTTPServer, pair: Any) -> None:
    a, _b = pair
    conn = attach(bare, Fake(a, send=[BrokenPipeError()]))
    bare._continue(conn)
    assert conn not in bare._open and a.fileno() == -1


def test_the_handshake_waits_for_what_openssl_wants(bare: HTTPServer, pair: Any) -> None:
    a, _b = pair
    fake = Fake(a, do_handshake=[ssl.SSLWantWriteError(), ssl.SSLWantReadError()])
    conn = attach(bare, fake, handshaken=False)
    assert bare._handshake(conn) is False and conn.events == WRITE and not conn.handshaken
    assert bare._handshake(conn) is False and conn.events == READ and not conn.handshaken
    assert bare._handshake(conn) is True and conn.events == READ and conn.handshaken is True
    assert conn in bare._open


def test_a_failed_handshake_closes(bare: HTTPServer, pair: Any) -> None:
    a, _b = pair
    conn = attach(bare, Fake(a, do_handshake=[ssl.SSLError("bad record")]), handshaken=False)
    assert bare._handshake(conn) is False and conn not in bare._open and a.fileno() == -1


def test_a_certificate_without_an_allowed_san_is_closed_and_logged(bare: HTTPServer, pair: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    a, b = pair
    fake = Fake(a)
    conn = attach(bare, fake, handshaken=False)
    conn.web = webconfig.WebConfig(allowed_sans=frozenset({"prometheus.example"}))
    fake.peer_cert = {"subjectAltName": (("DNS", "prometheus.example"),)}
    assert bare._handshake(conn) is True and conn in bare._open
    conn2 = attach(bare, Fake(b), handshaken=False)
    conn2.web = conn.web
    assert bare._handshake(conn2) is False and conn2 not in bare._open
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "client certificate from ('127.0.0.1', 9) has none of client_allowed_sans"]


@pytest.mark.parametrize("table_name", ["_fresh", "_idle"])
def test_an_error_answer_takes_the_connection_out_of_its_waiting_state(bare: HTTPServer, pair: Any,
                                                                       table_name: str) -> None:
    a, b = pair
    conn = attach(bare, Fake(a))
    bare._fresh.pop(conn)
    getattr(bare, table_name)[conn] = None
    bare._error(conn, 400, "bad")
    assert b.recv(1000) == answer("400 Bad Request", b"bad\n", close=True)
    assert conn not in bare._fresh and conn not in bare._idle and list(bare._closing) == [conn]
    assert conn.state == server_mod._CLOSING and conn.events == READ


@pytest.mark.parametrize("error", [BlockingIOError(), ssl.SSLWantReadError(), ssl.SSLWantWriteError()],
                         ids=["blocking", "ssl-read", "ssl-write"])
def test_a_read_that_fails_closes_and_one_that_would_block_waits(bare: HTTPServer, pair: Any,
                                                                  error: Exception) -> None:
    a, b = pair
    conn = attach(bare, Fake(a, recv=[error, ConnectionResetError()]))
    b.sendall(req())
    bare._on_readable(conn)
    assert conn in bare._open and not conn.buf and conn.state == server_mod._READ
    bare._on_readable(conn)
    assert conn not in bare._open and a.fileno() == -1


def test_a_pipelined_request_waits_unwatched_for_its_turn(bare: HTTPServer, pair: Any) -> None:
    a, b = pair
    conn = attach(bare, Fake(a))
    busy(bare, conn)
    conn.buf += req("/healthz?next")
    bare._send_answer(conn, None, Response(200, b"abc"))
    assert b.recv(1000) == answer("200 OK", b"abc")
    assert conn.events == 0 and conn.queued is True and list(bare._ready) == [conn]
    assert conn not in bare._busy and conn not in bare._writing and conn in bare._idle


@pytest.mark.parametrize(("size", "views"), [(16383, 1), (16384, 1), (16385, 2)])
def test_a_small_answer_is_one_buffer_and_a_large_one_the_body_itself(bare: HTTPServer, pair: Any, size: int,
                                                                      views: int) -> None:
    a, _b = pair
    conn = attach(bare, Fake(a, send=[BlockingIOError()]))
    busy(bare, conn)
    body = b"d" * size
    bare._send_answer(conn, None, Response(200, body))
    assert len(conn.out) == views and b"".join(bytes(v) for v in conn.out) == answer("200 OK", body)
    if views == 2:
        assert conn.out[1].obj is body  # not a copy


def test_nothing_more_is_read_while_an_answer_is_made() -> None:
    hold = Holder()
    with running() as srv:
        srv.route("/hold", hold)
        try:
            with connect(srv) as s:
                s.sendall(req("/hold"))
                hold.wait(1)
                s.sendall(req("/healthz?next"))
                settle(srv)
                conn = next(c for c in list(srv._open) if c.addr == me(s))
                assert conn.events == 0 and not conn.buf
                hold.release.set()
                assert read_answer(s) == answer("200 OK", b"held\n")
                assert read_answer(s) == answer("200 OK", b"ok\nnext")
        finally:
            hold.release.set()


def test_a_request_is_refused_as_too_large_only_past_the_buffer(bare: HTTPServer, pair: Any) -> None:
    """Exactly MAX_HEAD + MAX_BODY bytes of a request that is not complete: still read; one more: 431."""
    from exporter.platform.http.protocol import MAX_BODY, MAX_HEAD

    a, b = pair
    conn = attach(bare, Fake(a))
    head = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % MAX_BODY
    while len(head) < MAX_HEAD - 9000:
        head += b"X-Pad: " + b"p" * 8000 + b"\r\n"
    head = b"\r\n" * 4000 + head + b"\r\n"
    conn.buf += head + b"b" * (MAX_HEAD + MAX_BODY - len(head))
    assert len(conn.buf) == MAX_HEAD + MAX_BODY
    bare._parse(conn)
    assert conn.state == server_mod._READ and conn in bare._fresh
    conn.buf += b"b"
    bare._parse(conn)
    assert b.recv(1000) == answer("431 Request Header Fields Too Large", b"request too large\n", close=True)


def counting_turns(srv: HTTPServer) -> list[int]:
    """The I/O loop's turns, counted (the loop calls ``self._turn``)."""
    turns = [0]
    real = srv._turn

    def turn() -> None:
        turns[0] += 1
        real()

    srv._turn = turn  # type: ignore[method-assign]
    return turns


def test_an_idle_loop_sleeps_until_its_next_deadline() -> None:
    """No busy loop: waiting 0.2 s for a silent connection's deadline takes a few turns, not one per
    TURN_BUDGET_S (or none at all between them)."""
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=0.2)
    turns = counting_turns(srv)
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        with connect(srv) as s:
            start = turns[0]
            assert eof(s)
            assert turns[0] - start < 20, turns[0] - start
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(T)


def test_the_web_config_is_looked_at_once_a_connection_and_once_a_second(users_file: Path) -> None:
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0, web=webconfig.load(str(users_file)))
    srv.route("/healthz", Calls().route(), "inline")
    looks = [0]
    real = srv._io_web

    def io_web() -> Any:
        looks[0] += 1
        return real()

    srv._io_web = io_web  # type: ignore[method-assign]
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        with connect(srv) as s:
            for _ in range(20):
                assert ask(s, req()) == answer("200 OK", b"ok\n")
        assert looks[0] <= 6, looks[0]  # the start, this connection, and once a second
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(T)


def test_the_web_config_checked_between_requests_stays_in_force(users_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "WEB_CHECK_S", 0.0)  # looked at on every turn
    with running(web=webconfig.load(str(users_file))) as srv, connect(srv) as s:
        for _ in range(5):
            assert ask(s, req("/metrics")) == UNAUTHORIZED


def test_accepts_resume_only_after_the_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "ACCEPT_PAUSE_S", 0.05)
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)
    srv.route("/healthz", Calls().route(), "inline")
    listener = FailingListener(srv.socket, 3)
    at: list[float] = []
    real_accept = listener.accept

    def accept() -> tuple[socket.socket, Any]:
        at.append(time.monotonic())
        return real_accept()

    listener.accept = accept  # type: ignore[method-assign]
    srv.socket = listener  # type: ignore[assignment]
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        with connect(srv.server_address[1]) as s:
            assert ask(s, req()) == answer("200 OK", b"ok\n")
        gaps = [at[i + 1] - at[i] for i in range(3)]  # after each of the three failures
        assert len(at) >= 4 and min(gaps) >= 0.045, gaps
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(T)


def wrap_new(srv: HTTPServer, monkeypatch: pytest.MonkeyPatch, make: Callable[[Any], None]) -> None:
    """Call ``make(conn)`` on each connection the server adds, once it is added."""
    real_add = srv._add

    def add(sock: socket.socket, addr: Any, probe: bool = False) -> None:
        real_add(sock, addr, probe)
        conn = next(reversed(list(srv._open)), None)
        if conn is not None and conn.sock.fileno() == sock.fileno():
            make(conn)

    monkeypatch.setattr(srv, "_add", add)


def test_a_handshake_that_wants_to_write_goes_on_when_writable(pki: Path, tls_web: webconfig.WebConfig,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with running(web=tls_web) as srv:
        wrap_new(srv, monkeypatch, lambda conn: setattr(
            conn, "sock", Fake(conn.sock, do_handshake=[ssl.SSLWantWriteError(), ssl.SSLWantReadError()])))
        with tls_connect(srv, pki) as s:
            assert ask(s, req()) == answer("200 OK", b"ok\n")


def test_tls_handshakes_get_a_budget_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handshake costs CPU: once a turn has spent TURN_BUDGET_S, the other handshakes wait for the next
    turn (issue 36 item 5). Each handshake here takes 3 ms: one per turn."""
    with running() as srv:
        turns = counting_turns(srv)
        seen: list[int] = []

        class Slow(Fake):
            def do_handshake(self) -> None:
                seen.append(turns[0])
                end = time.monotonic() + 0.003
                while time.monotonic() < end:
                    pass

        def make(conn: Any) -> None:
            conn.sock, conn.handshaken = Slow(conn.sock), False

        blocked, go = threading.Event(), threading.Event()

        def block(h: Handler, path: str, query: str) -> Response:  # holds the I/O thread itself
            blocked.set()
            go.wait(T)
            return Response(200, b"unblocked\n")

        srv.route("/block", block, "inline")
        clients = [connect(srv) for _ in range(5)]
        try:
            settle(srv)  # the five are accepted (and only they are open)
            for c in list(srv._open):
                make(c)
            with connect(srv) as blocker:
                blocker.sendall(req("/block"))
                assert blocked.wait(T)
                seen.clear()  # the blocker's own handshake, if it had one
                for c in clients:  # all five requests are there when the loop next looks
                    c.sendall(req())
                go.set()
                assert read_answer(blocker).startswith(b"HTTP/1.1 200 ")
            assert [read_answer(c) for c in clients] == [answer("200 OK", b"ok\n")] * 5
            assert len(seen) == 5 and len(set(seen)) == 5, seen  # one a turn
        finally:
            go.set()
            for c in clients:
                c.close()


def test_the_loop_wakes_at_the_next_deadline_and_at_least_once_a_second(bare: HTTPServer, pair: Any) -> None:
    assert bare._next_timeout() == 1.0  # nothing open: the web config's check, once a second
    a, _ = pair
    conn = attach(bare, Fake(a))
    conn.deadline = time.monotonic() + 0.3
    assert 0.0 < bare._next_timeout() <= 0.3
    conn.deadline = time.monotonic() + 30
    assert bare._next_timeout() == 1.0
    conn.deadline = time.monotonic() - 1
    assert bare._next_timeout() == 0.0


def test_every_state_past_its_deadline_is_closed(bare: HTTPServer) -> None:
    """A connection within its deadline at the head of one state does not shield another state's."""
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        waiting = attach(bare, Fake(pairs[0][0]))
        waiting.deadline = time.monotonic() + 30
        idle = attach(bare, Fake(pairs[1][0]))
        bare._fresh.pop(idle)
        bare._idle[idle] = None
        idle.deadline = time.monotonic() - 0.001
        bare._expire()
        assert idle not in bare._open and not bare._idle and list(bare._fresh) == [waiting]
    finally:
        for x, y in pairs:
            x.close()
            y.close()


def test_one_read_a_turn_of_at_most_64_kib(bare: HTTPServer, pair: Any) -> None:
    a, b = pair
    fake = Fake(a)
    conn = attach(bare, fake)
    b.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"X-Pad: " + b"p" * 693 + b"\r\n") * 99)  # 70 KB of head
    bare._on_readable(conn)
    assert fake.recvs == [65536] and len(conn.buf) == 65536


def test_the_last_read_takes_only_what_the_buffer_has_room_for(bare: HTTPServer, pair: Any) -> None:
    from exporter.platform.http.protocol import MAX_BODY, MAX_HEAD

    a, b = pair
    fake = Fake(a)
    conn = attach(bare, fake)
    conn.buf += b"\r\n" * 100  # blank lines before a request: allowed, and not yet a request
    conn.buf += b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n"
    conn.buf += b"b" * (MAX_HEAD + MAX_BODY - 73 - len(conn.buf))
    b.sendall(b"b" * 1000)
    bare._on_readable(conn)
    assert fake.recvs == [74]  # room for one byte past the bound: enough to know it is too large


def test_a_finished_handshake_reads_the_request_at_once(bare: HTTPServer, pair: Any) -> None:
    a, b = pair
    conn = attach(bare, Fake(a), handshaken=False)
    b.sendall(req())
    bare._on_readable(conn)
    assert conn.handshaken and b.recv(1000) == answer("200 OK", b"ok\n")


def test_closing_survives_a_selector_that_forgot_it_and_a_close_that_fails(bare: HTTPServer, pair: Any) -> None:
    a, _ = pair
    fake = Fake(a, close=[OSError("EBADF")])
    conn = attach(bare, fake)
    bare._sel.unregister(fake)  # conn.events still says watched
    bare._close(conn)
    assert conn not in bare._open and conn.events == 0 and conn.state == server_mod._CLOSING


def test_a_socket_the_selector_refuses_is_closed(bare: HTTPServer) -> None:
    a, b = socket.socketpair()
    try:
        fake = Fake(a)
        conn = attach(bare, fake)
        bare._sel.unregister(fake)
        conn.events = 0
        a.close()  # its descriptor is gone: register() refuses it
        bare._want(conn, WRITE)
        assert conn not in bare._open and conn.events == 0
    finally:
        b.close()


def test_a_changed_web_config_is_loaded_off_the_io_thread(users_file: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(users_file.read_text())
    with running(web=webconfig.load(str(cfg))) as srv:
        assert srv.live is not None
        threads: list[str] = []
        real = srv.live.reload

        def reload(why: str = "changed on disk") -> bool:
            threads.append(threading.current_thread().name)
            return bool(real(why))

        srv.live.reload = reload  # type: ignore[method-assign]
        hashed = bcrypt.hashpw(b"new", bcrypt.gensalt(rounds=4)).decode()
        tmp = cfg.with_name("web.yml.tmp")
        tmp.write_text(f"basic_auth_users:\n  v: {hashed}\n")
        os.replace(tmp, cfg)
        settle(srv)  # a new connection looks at the config
        wait_until(lambda: threads, T, 0.005, what="the reload")
        assert threads[0] == "web-config-reload"
        with connect(srv) as s:
            wait_until(lambda: ask(s, req("/metrics", extra=basic("v", "new"))).startswith(b"HTTP/1.1 200 "),
                       T, 0.01, what="the new user admitted")


def test_the_probe_listener_defers_accepting_until_a_request_is_there() -> None:
    """TCP_DEFER_ACCEPT of the read timeout, at least 1 s (Linux keeps it as retransmissions: 1 s reads
    back as 1, 2 s as 3)."""
    for read_timeout, kept in ((0.5, 1), (1.0, 1), (3.0, 3)):
        srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=read_timeout, probe_port=0)
        try:
            assert srv.probe_socket is not None
            assert srv.probe_socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT) == kept
        finally:
            srv.server_close()


def test_waking_the_loop_never_blocks_a_lane(bare: HTTPServer) -> None:
    """The wake-up pipe full (the loop not reading it): posting goes on, the loop is awake anyway."""
    def post() -> None:
        for _ in range(100_000):
            bare._post("answer", None, None)

    t = threading.Thread(target=post, daemon=True)
    t.start()
    t.join(T)
    assert not t.is_alive() and len(bare._inbox) == 100_000


def test_tls_pipelining_past_the_buffer_reads_what_tls_already_decrypted(pki: Path,
                                                                         tls_web: webconfig.WebConfig) -> None:
    """A request as large as the buffer allows (64 KiB of head, 64 KiB of body), then another in the same
    TLS stream: the buffer fills in the middle of a TLS record, and the record's decrypted rest
    (``pending``) is read when the second request's turn comes (no new bytes arrive from the kernel to
    wake the loop for it)."""
    from exporter.platform.http.protocol import MAX_BODY

    pad = "".join(f"X-Pad-{i}: {'p' * 8000}\r\n" for i in range(8))
    first = req("/metrics?big", extra=f"Content-Length: {MAX_BODY}\r\n{pad}") + b"b" * MAX_BODY
    second = req("/metrics?after", extra="X-More: " + "m" * 2000 + "\r\n")
    calls = Calls()
    with running(web=tls_web, calls=calls) as srv, tls_connect(srv, pki) as s:
        s.sendall(first + second)
        assert read_answer(s) == answer("200 OK", b"metrics\nbig")
        assert read_answer(s) == answer("200 OK", b"metrics\nafter")
    assert [q for _, q, *_ in calls.seen] == ["big", "after"]


def test_deadlines_hold_while_pipelining_clients_spend_every_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined requests that take a turn's whole budget every turn do not stop the deadlines: a silent
    connection is closed at its read timeout while they are still being answered."""
    spins = [0]

    def spin(h: Handler, path: str, query: str) -> Response:
        spins[0] += 1
        end = time.monotonic() + 0.001
        while time.monotonic() < end:
            pass
        return Response(200, b"spun\n")

    with running(read_timeout=0.05) as srv:
        srv.route("/spin", spin, "inline")
        with connect(srv) as silent:
            settle(srv)
            greedy = [connect(srv) for _ in range(4)]
            try:
                for g in greedy:
                    g.sendall(req("/spin") * 60)
                assert eof(silent)
                at_close = spins[0]
                for g in greedy:
                    for _ in range(60):
                        read_answer(g)
                assert at_close < 240, "the silent connection was closed only once the pipelined requests were done"
            finally:
                for g in greedy:
                    g.close()
