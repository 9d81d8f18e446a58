"""Hostile clients against the exporter's HTTP server (issue 16): nobody can stall or starve the scrapers.

The exporter is the real process on 127.0.0.1; hostile clients are raw sockets and real TLS.
"""

from __future__ import annotations

import gzip
import http.client
import select
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.exporter import ExporterProcess, peer_closed, raw_request
from tests.harness.hostile import honest_scrapers
from tests.harness.poll import wait_until
from tests.reliability.support import PROM_HEADERS, percentile

HOSTILE = 256
SCRAPERS = 50


@pytest.fixture(scope="module")
def ex() -> Iterator[ExporterProcess]:
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2"]) as e:
        yield e


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.9\r\n\r\n", 505),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
    (b"GET /metrics HTTP/1.1x\r\n\r\n", 400),
    (b"GET /metrics http/1.1\r\n\r\n", 400),
    (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX A: 1\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", 400),
    (b"GET /met\x01rics HTTP/1.1\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
])
def test_ambiguous_requests_are_refused(ex: ExporterProcess, request_bytes: bytes, status: int) -> None:
    answer = raw_request(ex.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:100]
    assert b"Connection: close" in answer


@pytest.mark.parametrize(("accept", "openmetrics"), [
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),  # Prometheus
    ("application/openmetrics-text;q=0, text/plain", False),
    ("application/openmetrics-text;q=0.4, text/plain;q=0.5", False),
    ("text/plain;q=0.2, application/openmetrics-text;q=0.3", True),
    ("application/*;q=0.9, text/*;q=0.1", True),
    ("*/*", False),
    ("application/openmetrics-text;q=x", False),
    ("", False),
])
def test_accept_q_values(ex: ExporterProcess, accept: str, openmetrics: bool) -> None:
    status, body, headers = ex.get("/metrics", {"Accept": accept} if accept else {})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text" if openmetrics else "text/plain")
    assert body.rstrip().endswith(b"# EOF") == openmetrics
    assert {v.strip() for v in headers["Vary"].split(",")} == {"Accept", "Accept-Encoding"}


def test_accept_encoding_q_values(ex: ExporterProcess) -> None:
    for value, gz in (("gzip", True), ("gzip;q=0", False), ("br, *;q=0.5", True), ("*;q=0, identity", False),
                      ("gzip;q=0, *", False)):
        status, body, headers = ex.get("/metrics", {"Accept-Encoding": value})
        assert status == 200 and (headers.get("Content-Encoding") == "gzip") == gz, value
        assert (gzip.decompress(body) if gz else body).startswith(b"# HELP")


# ---- 256 hostile connections against 50 honest scrapers ---------------------------------------------


def _tls_files(d: Path) -> tuple[Path, Path]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", "tls.key", "-out", "tls.crt"], cwd=d, check=True, capture_output=True, timeout=60)
    return d / "tls.crt", d / "tls.key"


class Hostile:
    """Holds ``n`` hostile connections open, a third of each kind, and reconnects any the server closes.

    idle: connect and send nothing; slow handshake (TLS) or slow request line (plain): a few bytes of a
    ClientHello / request, then one more byte per round; trickle: a completed handshake (TLS), then a
    request one byte per round. One thread drives them all, one round every 0.2 s.
    """

    def __init__(self, port: int, n: int, ctx: ssl.SSLContext | None) -> None:
        self.port, self.n, self.ctx = port, n, ctx
        self.socks: list[tuple[str, socket.socket]] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, kind: str) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        if kind == "trickle" and self.ctx is not None:
            s = self.ctx.wrap_socket(s, server_hostname="127.0.0.1")  # a real handshake, then silence
        if kind == "slow":
            s.sendall(self.hello[:5] if self.ctx is not None else b"GET /metr")
        s.setblocking(False)
        return s

    @property
    def hello(self) -> bytes:
        """A real ClientHello (the first flight of a TLS client), to be sent a byte at a time."""
        assert self.ctx is not None
        out = ssl.MemoryBIO()
        obj = self.ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            obj.do_handshake()
        return out.read()

    def __enter__(self) -> Hostile:
        kinds = ["idle", "slow", "trickle"]
        self.socks = [(kinds[i % 3], self._open(kinds[i % 3])) for i in range(self.n)]
        self._thread.start()
        return self

    def _run(self) -> None:
        payload = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 10_000
        hello = self.hello if self.ctx is not None else b""
        step = 0
        while not self._stop.wait(0.2):
            step += 1
            poller = select.poll()
            for _, s in self.socks:
                poller.register(s, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(0)}
            for i, (kind, s) in enumerate(self.socks):
                try:
                    if kind == "trickle":
                        s.send(payload[step % len(payload): step % len(payload) + 1])
                    elif kind == "slow":
                        s.send(hello[5 + step: 6 + step] if self.ctx is not None else b"i")
                    if s.fileno() in readable and s.recv(65536) == b"":
                        raise ConnectionResetError
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass  # TLS 1.3 session tickets: readable, but no data and no close
                except OSError:
                    s.close()
                    self.reconnects += 1
                    try:
                        self.socks[i] = (kind, self._open(kind))
                    except OSError:
                        pass

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for _, s in self.socks:
            s.close()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_hostile_connections_do_not_starve_honest_scrapers(tmp_path: Path, tls: bool) -> None:
    """256 hostile connections (idle, slow handshake, trickle) against the default --max-connections 64:
    50 concurrent keep-alive scrapers see no error and a p99 under 250 ms."""
    args = ["--backend", "simulated", "--simulated-gpus", "2"]
    ctx = None
    if tls:
        crt, key = _tls_files(tmp_path)
        web = tmp_path / "web.yml"
        web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
        args += ["--web.config.file", str(web)]
        ctx = ssl.create_default_context(cafile=str(crt))
    with ExporterProcess(args, wait=False) as ex:
        def up() -> bool:
            conn = (http.client.HTTPSConnection("127.0.0.1", ex.port, timeout=5, context=ctx) if ctx
                    else http.client.HTTPConnection("127.0.0.1", ex.port, timeout=5))
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        wait_until(up, 20, what="the exporter")
        with Hostile(ex.port, HOSTILE, ctx) as hostile:
            lat, errors = honest_scrapers(ex.port, 4.0, 0.5, PROM_HEADERS, SCRAPERS, ctx)
        assert ex.proc.poll() is None
        assert "Traceback" not in ex.log()
    assert errors == [], errors[:10]
    assert len(lat) >= SCRAPERS * 5
    assert percentile(lat, 99) < 0.25, f"p99 {percentile(lat, 99):.3f}s, max {max(lat):.3f}s"
    assert hostile.reconnects < HOSTILE  # the hostile ones were held (for up to --read-timeout), not refused


def test_waiting_connections_beyond_the_cap_evict_the_oldest() -> None:
    """More silent connections than the server holds: the oldest are closed, and scrapes still work."""
    n = 1100  # the cap is 1024 waiting connections (fewer when the file limit is lower)
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "1"]) as ex:
        socks = []
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", ex.port), timeout=10))

        def evicted() -> int:
            closed = 0
            for s in socks[:200]:
                s.setblocking(False)
                try:
                    closed += s.recv(1) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
            return closed

        assert wait_until(lambda: evicted() >= n - 1024, 10, what="the oldest connections to be evicted")
        assert ex.get("/metrics")[0] == 200
        assert all(not peer_closed(s) for s in socks[-50:])  # the newest are still held
        for s in socks:
            s.close()
