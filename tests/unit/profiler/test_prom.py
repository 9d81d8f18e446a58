"""The Prometheus HTTP API client (exporter/profiler/prom.py) against small servers on 127.0.0.1:
path prefix, bearer token re-read, retries with bounded jittered backoff, TLS with a private CA."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.profiler.prom import BAD_QUERY, BAD_RESPONSE, HTTP_5XX, UNREACHABLE, PromClient, PromError

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"node": "n", "gpu": "0"}, "value": [1.0, "0.5"]},
    {"metric": {"node": "n", "gpu": "1"}, "value": [1.0, "NaN"]},
]}}


class Api:
    """Answers POSTs with ``answers`` in turn (status, body); records path and headers."""

    def __init__(self, answers: list[tuple[int, Any]], tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers
        self.seen: list[tuple[str, dict[str, str], str]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                outer.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                code, doc = outer.answers[min(len(outer.seen), len(outer.answers)) - 1]
                data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api_factory() -> Iterator[Any]:
    made: list[Api] = []

    def make(answers: list[tuple[int, Any]], tls: ssl.SSLContext | None = None) -> Api:
        made.append(Api(answers, tls))
        return made[-1]

    yield make
    for a in made:
        a.close()


def test_prefix_token_and_values(api_factory: Any, tmp_path: Path) -> None:
    api = api_factory([(200, VECTOR)])
    token = tmp_path / "token"
    token.write_text("first\n")
    c = PromClient(f"http://127.0.0.1:{api.port}/prom/", token_file=str(token))
    got = c.query("up", 1234.5)
    assert (got[0].labels["gpu"], got[0].value) == ("0", 0.5)
    assert got[1].value != got[1].value  # NaN stays NaN
    path, headers, body = api.seen[0]
    assert path == "/prom/api/v1/query" and headers["authorization"] == "Bearer first"
    assert "query=up" in body and "time=1234.500" in body
    token.write_text("rotated")
    c.query("up", 1.0)
    assert api.seen[1][1]["authorization"] == "Bearer rotated"


def test_retries_are_bounded_and_jittered(api_factory: Any) -> None:
    api = api_factory([(503, {"status": "error"})] * 10)
    slept: list[float] = []
    c = PromClient(f"http://127.0.0.1:{api.port}", retries=3, backoff=0.2, sleep=slept.append)
    with pytest.raises(PromError) as exc:
        c.query("up", 1.0)
    assert exc.value.kind == HTTP_5XX and len(api.seen) == 4 and c.requests_sent == 4
    assert len(slept) == 3
    assert all(0 <= d <= 0.2 * 2**i for i, d in enumerate(slept))  # full jitter under the exponential cap


def test_transient_error_then_success(api_factory: Any) -> None:
    api = api_factory([(500, b"oops"), (200, VECTOR)])
    c = PromClient(f"http://127.0.0.1:{api.port}", retries=2, sleep=lambda s: None)
    assert len(c.query("up", 1.0)) == 2 and len(api.seen) == 2


@pytest.mark.parametrize(("code", "body", "kind"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}, BAD_QUERY),
    (200, {"status": "error", "errorType": "execution", "error": "too many samples"}, BAD_QUERY),
    (200, b"<html>proxy login</html>", BAD_RESPONSE),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": [], "value": [1, "1"]}]}},
     BAD_RESPONSE),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1]}]}},
     BAD_RESPONSE),
    (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, BAD_RESPONSE),
    (200, {"status": "success"}, BAD_RESPONSE),
    # label values must be strings: {"node": 5} is not node "5"
    (200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": 5, "gpu": "0"}, "value": [1, "1"]}]}}, BAD_RESPONSE),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": "n", "uuid": ["x"]}, "value": [1, "1"]}]}}, BAD_RESPONSE),
    # a value that only looks like a pair ("x1"[1] == "1") or is a JSON true
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "x1"}]}},
     BAD_RESPONSE),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, True]}]}},
     BAD_RESPONSE),
    (200, b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, 1'
     + b"0" * 400 + b"]}]}}", BAD_RESPONSE),  # an integer beyond float range
    (200, b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", BAD_RESPONSE),
])
def test_bad_answers_are_not_retried(api_factory: Any, code: int, body: Any, kind: str) -> None:
    api = api_factory([(code, body)])
    c = PromClient(f"http://127.0.0.1:{api.port}", retries=3, sleep=lambda s: None)
    with pytest.raises(PromError) as exc:
        c.query("up", 1.0)
    assert exc.value.kind == kind and len(api.seen) == 1


@pytest.mark.parametrize("values", [{"12": "0"}, "12", [[1, "0.5", 7]], [["1", None]]])
def test_malformed_range_answers(api_factory: Any, values: Any) -> None:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
    api = api_factory([(200, doc)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", retries=0).query_range("up", 0, 60, 15)
    assert exc.value.kind == BAD_RESPONSE and "malformed matrix" in str(exc.value)


def test_range_label_values_must_be_strings(api_factory: Any) -> None:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"node": "n-0"}, "values": [[1, "1"]]}, {"metric": {"node": 5}, "values": [[1, "1"]]}]}}
    api = api_factory([(200, doc)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", retries=0).query_range("up", 0, 60, 15)
    assert exc.value.kind == BAD_RESPONSE and "label 'node' is int, not a string" in str(exc.value)


def test_odd_warnings_are_ignored(api_factory: Any) -> None:
    api = api_factory([(200, {**VECTOR, "warnings": 5})])
    assert len(PromClient(f"http://127.0.0.1:{api.port}").query("up", 1.0)) == 2


class RawServer:
    """Accepts connections on 127.0.0.1, reads the request, sends ``reply`` bytes and closes."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                body = head.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in head else b""
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                conn.sendall(self.reply)


@pytest.mark.parametrize(("reply", "named"), [
    # the connection closes half-way through the announced Content-Length
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
     b'{"status": "success", "data": {"res', "IncompleteRead"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "BadStatusLine"),  # not HTTP at all
])
def test_broken_http_answers(reply: bytes, named: str) -> None:
    server = RawServer(reply)
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", retries=3, sleep=lambda s: None).query("up", 1.0)
    finally:
        server.sock.close()
    msg = str(exc.value)
    assert exc.value.kind == BAD_RESPONSE and named in msg
    assert f"http://127.0.0.1:{server.port}/api/v1/query" in msg and "\n" not in msg


def test_bad_urls_are_refused() -> None:
    for url in ("prometheus:9090", "ftp://x", "http://"):
        with pytest.raises(ValueError):
            PromClient(url)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_a_private_ca(api_factory: Any, tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    api = api_factory([(200, VECTOR)] * 3, tls=ctx)
    ok = PromClient(f"https://127.0.0.1:{api.port}", ca_file=str(cert))
    assert len(ok.query("up", 1.0)) == 2
    untrusted = PromClient(f"https://127.0.0.1:{api.port}", retries=0)
    with pytest.raises(PromError) as exc:
        untrusted.query("up", 1.0)
    assert exc.value.kind == UNREACHABLE and "CERTIFICATE_VERIFY_FAILED" in str(exc.value)
