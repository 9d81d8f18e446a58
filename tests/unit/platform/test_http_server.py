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
from tests.harness.exporter import raw_request
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
    return raw_request(srv.server_address[1], data)


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


# ---- issue 36 item 9: one connection cap over every open connection, a deadline for every state ------


def server_fds(baseline: set[str], clients: list[socket.socket]) -> int:
    """Sockets this process holds open beyond ``baseline`` and the test's own client sockets: the
    server's connections (observed from /proc, not from the server's own counters)."""
    import os

    mine = {str(c.fileno()) for c in clients if c.fileno() >= 0}
    return len(set(os.listdir("/proc/self/fd")) - baseline - mine)


def test_every_open_connection_counts_against_one_cap() -> None:
    """Idle connections and connections whose malformed request was answered (the server reads what is
    left before closing) together stay under the one cap; a new client is still answered. Before:
    closing, writing and deferred connections sat outside the waiting cap, and with ``ulimit -n 1024``
    idle plus malformed-request connections took the process to 1,024 of 1,024 descriptors."""
    import os

    cap = 24
    clients: list[socket.socket] = []
    with serving() as srv:
        srv.max_open = cap
        baseline = set(os.listdir("/proc/self/fd"))
        try:
            for i in range(3 * cap):
                s = connect(srv)
                clients.append(s)
                if i % 2:  # a malformed request, never closed by the client: 400, then the server drains it
                    s.sendall(b"NOT HTTP\r\n\r\n")
            peak = 0
            for _ in range(20):  # measured between exchanges: their own client socket is closed by then
                assert exchange(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200 ")
                peak = max(peak, server_fds(baseline, clients))
            assert peak <= cap, f"{peak} server connections open with a cap of {cap}"
        finally:
            for s in clients:
                s.close()


def test_an_answer_that_never_comes_and_a_request_that_waits_for_a_slot_have_a_deadline() -> None:
    """A route that never returns holds its connection until the busy deadline, and so does a
    pipelined request waiting for a work slot (before: neither had one; each held a descriptor forever)."""
    hold = threading.Event()

    def slow(h: Handler, path: str, query: str) -> Response:
        if query == "hold":
            hold.wait(60)
        return Response(200, b"late\n")

    with serving(max_connections=4, read_timeout=0.5) as srv:
        srv.route("/slow", slow)
        try:
            with connect(srv) as a, connect(srv) as b:
                # a: its second request is pipelined and holds the one slot pipelined requests may take
                a.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /slow?hold HTTP/1.1\r\nHost: x\r\n\r\n")
                # b: its second request is pipelined too, and waits for that slot
                b.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_answer(a).startswith(b"HTTP/1.1 200 ") and read_answer(b).startswith(b"HTTP/1.1 200 ")
                assert closed(a, 30), "an answer that never comes held its connection past the deadline"
                assert closed(b, 30), "a request waiting for a slot held its connection past the deadline"
        finally:
            hold.set()


class FailingListener:
    """The listening socket, with ``accept`` failing (EMFILE) while ``failing`` is set."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.failing = sock, threading.Event()
        self.failures = 0

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failing.is_set():
            self.failures += 1
            raise OSError(24, "Too many open files")
        return self.sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_accept_failures_are_logged_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    """Before: one WARNING line per failed accept (87-95 lines in 8 s at the fd limit)."""
    import logging

    caplog.set_level(logging.INFO, logger="exporter.platform.http")
    srv = HTTPServer(("127.0.0.1", 0), max_connections=8, read_timeout=5.0)
    srv.route("/healthz", ok, "inline")
    listener = FailingListener(srv.socket)
    srv.socket = listener  # type: ignore[assignment]
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        for episode in range(2):
            listener.failing.set()
            start = listener.failures
            pending = [connect(srv) for _ in range(3)]
            wait_until(lambda start=start: listener.failures >= start + 5, 20, what="accept failing repeatedly")
            listener.failing.clear()
            for s in pending:  # accepted once the episode is over, and answered
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_answer(s).startswith(b"HTTP/1.1 200 ")
                s.close()
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "accept" in r.getMessage()]
            assert len(warnings) == episode + 1, [r.getMessage() for r in warnings]
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(10)


@pytest.mark.parametrize(("max_connections", "soft", "cap"), [
    (64, 1024, 1024 - 64 - 64),  # ulimit -n 1024: what is left after the reserve and the probe listener
    (64, 4096, 1024),  # plenty of descriptors: 1024, or four per slot
    (512, 1 << 20, 2048),
    (8, 100, 16),  # a tiny limit: still 16
])
def test_the_connection_cap_is_derived_from_the_file_limit(max_connections: int, soft: int, cap: int) -> None:
    from exporter.platform.http.limits import connection_cap

    assert connection_cap(max_connections, soft) == cap


def test_the_default_cap_leaves_descriptors_for_the_process() -> None:
    import resource

    from exporter.platform.http.limits import FD_RESERVE, PROBE_OPEN

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with serving(max_connections=64) as srv:
        assert srv.max_open <= max(16, soft - FD_RESERVE - PROBE_OPEN)


# ---- issue 36 item 5: the probe listener ------------------------------------------------------------


def test_the_probe_listener_serves_the_probes_in_plain_http_and_nothing_else(tmp_path: Any) -> None:
    """With TLS and basic auth on the main port, the probe listener answers /healthz in plain HTTP
    without credentials, and 404 for everything else (no scrape, no page): it says up or down only."""
    import ssl
    import subprocess

    import bcrypt

    from exporter.platform import webconfig

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=x",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "k.pem", "-out", "c.pem"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n"
                                      f"basic_auth_users:\n  u: {hashed}\n")
    web = webconfig.load(str(tmp_path / "web.yml"))
    with serving(web=web, probe_port=0) as srv:
        port = srv.probe_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s).startswith(b"HTTP/1.1 200 ")
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s).startswith(b"HTTP/1.1 404 ")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:  # the main port: TLS and auth as before
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s).startswith(b"HTTP/1.1 401 ")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s).startswith(b"HTTP/1.1 200 ")


def test_the_probe_listener_has_its_own_cap_and_the_main_port_cannot_fill_it() -> None:
    """The main port at its cap (idle sockets) takes nothing from the probe listener; idle sockets on
    the probe port itself evict the oldest of their own kind, and a probe is still answered."""
    from exporter.platform.http.limits import PROBE_OPEN

    clients: list[socket.socket] = []
    with serving(probe_port=0) as srv:
        srv.max_open = 16
        try:
            clients += [connect(srv) for _ in range(40)]
            port = srv.probe_address[1]
            clients += [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(PROBE_OPEN + 20)]
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert read_answer(s).startswith(b"HTTP/1.1 200 ")
            wait_until(lambda: len(srv._probe_open) <= PROBE_OPEN and len(srv._open) <= 16, 10,
                       what="both caps held")
        finally:
            for s in clients:
                s.close()


def test_the_profilers_probe_port() -> None:
    """``gpu-exporter profile --probe-port``: its /healthz on a plain listener of its own, nothing else
    there; the same port as --listen-port is refused at start-up."""
    from exporter.platform.configfile import ConfigError
    from exporter.profiler import main as profiler_main
    from exporter.profiler.loop import ProfilerMetrics, make_server
    from tests.harness.profiler_http import AlwaysHealthy

    srv = make_server("127.0.0.1", 0, ProfilerMetrics(), AlwaysHealthy(), probe_port=0)  # type: ignore[arg-type]
    loop = threading.Thread(target=srv.serve_forever, daemon=True)
    loop.start()
    try:
        for path, status in (("/healthz", b"200"), ("/metrics", b"404"), ("/readyz", b"404")):
            with socket.create_connection(("127.0.0.1", srv.probe_address[1]), timeout=10) as s:
                s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_answer(s).startswith(b"HTTP/1.1 " + status + b" "), path
    finally:
        srv.shutdown()
        srv.server_close()
        loop.join(10)
    with pytest.raises(ConfigError, match="the same as --listen-port"):
        profiler_main.parse_args(["--prometheus-url", "http://127.0.0.1:9090", "--listen-port", "9500",
                                  "--probe-port", "9500"], environ={})
