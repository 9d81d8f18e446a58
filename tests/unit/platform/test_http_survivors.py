"""Issue 36's survivors: one-line bugs planted in the server and the web config that the whole suite
missed. Each test here was seen to fail with its bug planted by hand (named in each docstring).

In-process (a real HTTPServer on 127.0.0.1 with real TLS handshakes), so ``make mutation`` sees them.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.platform import webconfig
from exporter.platform.http import Handler, HTTPServer, Response
from tests.unit.platform.test_http_server import closed, connect, read_answer, serving
from tests.unit.serve.test_webconfig import make_ca, make_leaf


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_leaf(d, "server", "IP:127.0.0.1,DNS:localhost")
    make_leaf(d, "client-ok", "DNS:prometheus.example")
    make_leaf(d, "client-other", "DNS:other.example")
    return d


def tls_config(pki: Path, d: Path, auth: str, sans: str | None) -> Path:
    lines = ["tls_server_config:", f"  cert_file: {pki / 'server.crt'}", f"  key_file: {pki / 'server.key'}",
             f"  client_ca_file: {pki / 'ca.crt'}", f"  client_auth_type: {auth}"]
    if sans is not None:
        lines.append(f"  client_allowed_sans: [{sans}]")
    path = d / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def answered(srv: HTTPServer, pki: Path, cert: str | None) -> bool:
    """Whether a TLS client with ``cert`` (None: no certificate) gets an answer to GET /healthz."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    try:
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return read_answer(s).startswith(b"HTTP/1.1 200 ")
    except (OSError, ssl.SSLError):
        return False


# ---- the waiting-connection cap -------------------------------------------------------------------


def test_a_keep_alive_connection_that_completed_a_request_survives_a_flood_of_silent_sockets() -> None:
    """At the cap, silent sockets (never a request) go before a keep-alive connection that completed
    one. Planted: the idle keep-alive evicted before the silent ones (``_victim`` tries ``_idle``
    first): this connection is closed and its second request gets nothing."""
    silent: list[socket.socket] = []
    with serving() as srv:
        srv.max_open = 16
        with connect(srv) as keep:
            keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(keep).startswith(b"HTTP/1.1 200 ")
            try:
                silent += [connect(srv) for _ in range(3 * 16)]
                with connect(srv) as probe:  # the last of the flood: accepted, so every silent one was too
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert read_answer(probe).startswith(b"HTTP/1.1 200 ")
                keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_answer(keep).startswith(b"HTTP/1.1 200 "), "the keep-alive connection was evicted"
            finally:
                for s in silent:
                    s.close()


# ---- --max-connections --------------------------------------------------------------------------


def test_exactly_n_requests_are_held_and_the_next_gets_503_at_once() -> None:
    """``--max-connections 4``: four requests held by a route that waits; the fifth gets 503 with
    Retry-After at once (no queue), and the four are answered when the route returns. Planted:
    ``pending > max_connections`` for ``>=`` (one request too many queued): the fifth waits instead."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def held(h: Handler, path: str, query: str) -> Response:
        started.release()
        release.wait(30)
        return Response(200, b"held\n")

    with serving(max_connections=4) as srv:
        srv.route("/held", held)
        conns = [connect(srv) for _ in range(4)]
        try:
            for c in conns:
                c.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
            for _ in range(4):
                assert started.acquire(timeout=10), "the four requests did not all reach the route"
            with connect(srv, timeout=5) as fifth:
                t0 = time.monotonic()
                fifth.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = read_answer(fifth)
                assert answer.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 1\r\n" in answer, answer
                assert time.monotonic() - t0 < 5  # at once, not after one of the four ends
            release.set()
            assert [read_answer(c).startswith(b"HTTP/1.1 200 ") for c in conns] == [True] * 4
        finally:
            release.set()
            for c in conns:
                c.close()


# ---- client certificates ------------------------------------------------------------------------


@pytest.fixture
def mtls(pki: Path, tmp_path: Path) -> Iterator[tuple[HTTPServer, Path]]:
    cfg = tls_config(pki, tmp_path, "RequireAndVerifyClientCert", "prometheus.example")
    with serving(web=webconfig.load(str(cfg))) as srv:
        yield srv, cfg


def test_a_reload_that_drops_client_allowed_sans_is_refused(pki: Path, mtls: tuple[HTTPServer, Path],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Planted: ``_weakens`` without its client_allowed_sans check: the reload is taken and the other
    client's certificate (valid, but not an allowed SAN) is admitted."""
    srv, cfg = mtls
    assert answered(srv, pki, "client-ok") and not answered(srv, pki, "client-other")
    tls_config(pki, cfg.parent, "RequireAndVerifyClientCert", None)  # the same file, without the SANs
    assert srv.live is not None
    assert srv.live.reload() is False
    assert "drops client_allowed_sans" in caplog.text
    assert srv.live.current().allowed_sans == frozenset({"prometheus.example"})
    assert not answered(srv, pki, "client-other"), "the other client was admitted after the refused reload"
    assert answered(srv, pki, "client-ok")


@pytest.mark.parametrize(("auth", "without_cert"), [("RequireAndVerifyClientCert", False),
                                                    ("VerifyClientCertIfGiven", True)])
def test_client_auth_type_without_allowed_sans(pki: Path, tmp_path: Path, auth: str, without_cert: bool) -> None:
    """Without client_allowed_sans (whose check refuses certificate-less clients by itself), the two
    verifying types differ exactly on a client with no certificate. Planted: the two swapped in
    ``CLIENT_AUTH``: RequireAndVerifyClientCert admits a client without one (fails open)."""
    cfg = tls_config(pki, tmp_path, auth, None)
    with serving(web=webconfig.load(str(cfg))) as srv:
        assert answered(srv, pki, None) is without_cert
        assert answered(srv, pki, "client-ok") and answered(srv, pki, "client-other")  # verified: any SAN


def test_a_certificate_of_another_ca_is_refused(pki: Path, tmp_path: Path) -> None:
    d = tmp_path / "rogue"
    d.mkdir()
    make_ca(d, "ca")
    make_leaf(d, "client-ok", "DNS:prometheus.example")
    cfg = tls_config(pki, tmp_path, "VerifyClientCertIfGiven", None)
    with serving(web=webconfig.load(str(cfg))) as srv:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(d / "client-ok.crt", d / "client-ok.key")
        with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as raw:
            try:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert closed(s), "a certificate of another CA was admitted"
            except (OSError, ssl.SSLError):
                pass  # refused in the handshake
