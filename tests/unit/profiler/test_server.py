"""The profiler's own HTTP endpoint under hostile clients (issue 16): read timeouts, one
deadline per connection, a connection limit, and no tracebacks."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from exporter.profiler.loop import ProfilerMetrics, make_server
from tests.harness.poll import wait_until
from tests.harness.profiler_http import AlwaysHealthy


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = make_server("127.0.0.1", 0, ProfilerMetrics(), AlwaysHealthy(),  # type: ignore[arg-type]
                      read_timeout_s=0.5, deadline_s=1.5, max_connections=8)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer, path: str = "/healthz") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _closed(s: socket.socket) -> bool:
    s.settimeout(0.05)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_idle_connections_are_bounded_then_evicted(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        # over the limit: closed at once instead of a thread each
        wait_until(lambda: sum(_closed(s) for s in idle) >= 32, timeout=5, what="connections over the limit closed")
        # the rest are evicted by the read timeout; then the endpoint answers again
        wait_until(lambda: all(_closed(s) for s in idle), timeout=5, what="idle connections evicted")
        with urllib.request.urlopen(_url(server), timeout=5) as r:
            assert r.status == 200
    finally:
        for s in idle:
            s.close()


def test_a_trickling_client_is_cut_at_the_deadline(server: ThreadingHTTPServer) -> None:
    s = socket.create_connection(("127.0.0.1", server.server_address[1]))
    t0 = time.monotonic()
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        cut = False
        while time.monotonic() - t0 < 6:
            try:
                s.sendall(b"X-A: b\r\n")  # one header line per 0.2 s: every read is within its timeout
            except OSError:
                cut = True
                break
            if _closed(s):
                cut = True
                break
            time.sleep(0.15)  # the trickle itself: the client's pace, not a synchronisation
    finally:
        s.close()
    took = time.monotonic() - t0
    assert cut and took < 3.5, f"held for {took:.1f}s with a 1.5 s deadline"


def test_reset_connections_log_no_traceback(server: ThreadingHTTPServer, capfd: pytest.CaptureFixture[str]) -> None:
    port = server.server_address[1]
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.close()  # RST before the answer is written
        bad = socket.create_connection(("127.0.0.1", port))
        bad.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n")  # a TLS hello
        bad.close()
    with urllib.request.urlopen(_url(server, "/metrics"), timeout=5) as r:
        assert r.status == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]
