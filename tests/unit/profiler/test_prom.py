"""The Prometheus HTTP API client (exporter/profiler/prom.py) against small servers on 127.0.0.1:
path prefix, bearer token re-read, retries with bounded jittered backoff, TLS with a private CA.

Every server here is the suite's one Prometheus stand-in (tests/harness/prom.FakePrometheus); the byte caps,
broken framing and trickled answers use its raw replies (``Reply(raw=...)``: bytes on the wire as they are).
The two bare sockets are no stand-in: a listener that never accepts (a full accept queue) and a closed port."""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.profiler.prom import (
    BAD_QUERY,
    BAD_RESPONSE,
    HTTP_5XX,
    TIMEOUT,
    TOO_MANY_SAMPLES,
    UNREACHABLE,
    ParseCost,
    PromClient,
    PromError,
)
from tests.harness.httpfake import Reply, Request, json_reply
from tests.harness.prom import FakePrometheus

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"node": "n", "gpu": "0"}, "value": [1.0, "0.5"]},
    {"metric": {"node": "n", "gpu": "1"}, "value": [1.0, "NaN"]},
]}}


@pytest.fixture
def api_factory() -> Iterator[Any]:
    made: list[FakePrometheus] = []

    def make(answers: list[tuple[int, Any]], tls: ssl.SSLContext | None = None) -> FakePrometheus:
        made.append(FakePrometheus(answers=answers, tls=tls))
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
    (200, {"status": "error", "errorType": "execution", "error": "exceeded the engine's limit"}, BAD_QUERY),
    # a limit's refusal, by Prometheus' own wording (--query.max-samples): the caller splits, never a retry
    (200, {"status": "error", "errorType": "execution", "error": "query processing would load too many samples "
                                                                 "into memory in query execution"}, TOO_MANY_SAMPLES),
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


def raw_server(reply: bytes) -> FakePrometheus:
    """The Prometheus stand-in answering each request with ``reply``'s bytes as they are, then closing."""
    return FakePrometheus(lambda req, query: Reply(raw=reply))


@pytest.mark.parametrize(("reply", "named"), [
    # the connection closes half-way through the announced Content-Length
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
     b'{"status": "success", "data": {"res', "IncompleteRead(0 bytes read, 365 more expected)"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "BadStatusLine"),  # not HTTP at all
])
def test_broken_http_answers(reply: bytes, named: str) -> None:
    server = raw_server(reply)
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", retries=3, sleep=lambda s: None).query("up", 1.0)
    finally:
        server.close()
    msg = str(exc.value)
    assert exc.value.kind == BAD_RESPONSE and named in msg
    assert f"http://127.0.0.1:{server.port}/api/v1/query" in msg and "\n" not in msg


def test_bad_urls_are_refused() -> None:
    # ":9090" has a netloc but no host: connecting to "" would reach this machine, not a Prometheus
    for url in ("prometheus:9090", "ftp://x", "http://", "http://:9090", "https://user@:9090/prom"):
        with pytest.raises(ValueError):
            PromClient(url)


def _self_signed(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A certificate for 127.0.0.1 (openssl) and a server context serving it."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return cert, ctx


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_a_private_ca(api_factory: Any, tmp_path: Path) -> None:
    cert, ctx = _self_signed(tmp_path)
    api = api_factory([(200, VECTOR)] * 3, tls=ctx)
    ok = PromClient(f"https://127.0.0.1:{api.port}", ca_file=str(cert))
    assert len(ok.query("up", 1.0)) == 2
    untrusted = PromClient(f"https://127.0.0.1:{api.port}", retries=0)
    with pytest.raises(PromError) as exc:
        untrusted.query("up", 1.0)
    assert exc.value.kind == UNREACHABLE and "CERTIFICATE_VERIFY_FAILED" in str(exc.value)


# ---- hostile servers (issue 16) ------------------------------------------------------------------


def redirector(code: int, location: str, tls: ssl.SSLContext | None = None) -> FakePrometheus:
    """The Prometheus stand-in answering every POST with ``code`` and ``Location: location`` (``{port}``: its
    own)."""
    srv = FakePrometheus(lambda req, query: Reply(code, headers={"Location": location.replace("{port}", str(port))}),
                         tls=tls)
    port = srv.port
    return srv


def _headers(srv: FakePrometheus) -> list[dict[str, str]]:
    return [headers for _, headers, _ in srv.seen]


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_credentials_never_follow_a_redirect_to_another_origin(api_factory: Any, tmp_path: Path, code: int) -> None:
    elsewhere = api_factory([(200, VECTOR)])  # another port of the same host: another origin
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    red = redirector(code, f"http://127.0.0.1:{elsewhere.port}/api/v1/query")
    try:
        client = PromClient(f"http://127.0.0.1:{red.port}", token_file=str(token), retries=0,
                            headers={"X-Scope-OrgID": "tenant-a"})
        with pytest.raises(PromError) as exc:
            client.query("up", 1.0)
    finally:
        red.close()
    assert _headers(red)[0]["authorization"] == "Bearer s3cret"  # the configured origin gets it
    assert elsewhere.seen == []  # the other origin got nothing at all
    assert exc.value.kind == BAD_RESPONSE and "not followed" in str(exc.value)
    assert str(exc.value).endswith("set --prometheus-url to the final address"), "the error says what to do"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_to_http_downgrade_is_not_followed(tmp_path: Path) -> None:
    cert, ctx = _self_signed(tmp_path)
    red = redirector(308, "http://127.0.0.1:{port}/api/v1/query", tls=ctx)  # same host and port, plain http
    token = tmp_path / "token"
    token.write_text("s3cret")
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"https://127.0.0.1:{red.port}", ca_file=str(cert), token_file=str(token),
                       retries=0).query("up", 1.0)
    finally:
        red.close()
    assert len(red.seen) == 1 and "not followed" in str(exc.value)


def test_same_origin_308_is_followed_with_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    # a proxy on the same origin that moves the API under /prom

    def answer(req: Request, query: str) -> Reply:
        if not req.path.startswith("/prom/"):
            return Reply(308, headers={"Location": "/prom" + req.path})
        return json_reply(VECTOR, headers={})

    with FakePrometheus(answer) as srv:
        got = PromClient(srv.url, token_file=str(token)).query("up", 1.0)
    assert len(got) == 2
    assert [(r.path, r.headers.get("authorization")) for r in srv.requests] == [
        ("/api/v1/query", "Bearer s3cret"), ("/prom/api/v1/query", "Bearer s3cret")]


def hops(code: int, n: int) -> FakePrometheus:
    """The Prometheus stand-in as a same-origin proxy that moves the API ``n`` times (``/1/api/v1/query``,
    ``/1/2/...``) with ``code``, then answers."""

    def answer(req: Request, query: str) -> Reply:
        depth = req.path.count("/") - 3  # "/api/v1/query" is depth 0
        if depth < n:
            return Reply(code, headers={"Location": f"/{depth + 1}{req.path}"})
        return json_reply(VECTOR, headers={})

    return FakePrometheus(answer)


def _hits(srv: FakePrometheus) -> list[tuple[str, str | None]]:
    """Each request's path and Authorization."""
    return [(path, headers.get("authorization")) for path, headers, _ in srv.seen]


@pytest.mark.parametrize("code", [307, 308])
def test_up_to_three_same_origin_redirects_are_followed_with_the_token(tmp_path: Path, code: int) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    for n in (1, 3):
        srv = hops(code, n)
        try:
            got = PromClient(f"http://127.0.0.1:{srv.port}", token_file=str(token), retries=0).query("up", 1.0)
        finally:
            srv.close()
        assert len(got) == 2
        assert [h[0] for h in _hits(srv)] == ["/api/v1/query", "/1/api/v1/query", "/2/1/api/v1/query",
                                              "/3/2/1/api/v1/query"][:n + 1]
        assert {h[1] for h in _hits(srv)} == {"Bearer s3cret"}


def test_a_fourth_redirect_is_refused_naming_where_it_pointed(tmp_path: Path) -> None:
    srv = hops(307, 10)
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{srv.port}", retries=0).query("up", 1.0)
    finally:
        srv.close()
    assert len(_hits(srv)) == 4, "followed more or fewer than 3 redirects"
    assert exc.value.kind == BAD_RESPONSE
    assert str(exc.value).startswith(f"http://127.0.0.1:{srv.port}/4/3/2/1/api/v1/query: more than 3 redirects")


@pytest.mark.parametrize(("location", "asked"), [
    ("{url}", "/"),  # the origin alone, no path: its root, "/" on the request line (HTTP/1.1 5.3.1)
    ("/prom/api/v1/query?tenant=a%20b&x=1", "/prom/api/v1/query?tenant=a%20b&x=1"),  # the query goes along
])
def test_a_redirect_asks_for_its_path_and_query(location: str, asked: str) -> None:
    def answer(req: Request, query: str) -> Reply:
        if req.path == asked:
            return json_reply(VECTOR, headers={})
        return json_reply(VECTOR, 307, headers={"Location": location.replace("{url}", srv.url)})

    with FakePrometheus(answer) as srv:
        got = PromClient(srv.url, retries=0).query("up", 1.0)
    assert [r.path for r in srv.requests] == ["/api/v1/query", asked] and len(got) == 2


@pytest.mark.parametrize("code", [301, 307, 308])
def test_a_redirect_without_a_location_is_refused_at_once(code: int) -> None:
    with FakePrometheus(lambda req, query: Reply(code)) as srv, pytest.raises(PromError) as exc:
        PromClient(srv.url, retries=0).query("up", 1.0)
    seen = [r.path for r in srv.requests]
    assert seen == ["/api/v1/query"] and exc.value.kind == BAD_RESPONSE
    assert f"HTTP {code} redirect without a Location" in str(exc.value)


def trickler(every: float = 0.2, length: int = 100000) -> FakePrometheus:
    """The Prometheus stand-in sending a valid header announcing ``length`` bytes, then one body byte every
    ``every`` s, until the client hangs up or it stops."""
    return FakePrometheus(lambda req, query: Reply(raw=b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length,
                                                   more=b" ", every=every))


@pytest.mark.timeout(20)  # without a connect timeout it would hang for minutes
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_that_never_accepts_is_a_timeout_within_the_deadline(scheme: str) -> None:
    """Connecting is under the deadline too: a listener whose accept queue is full drops the SYN
    (the client retransmits for minutes), as a blackholed address does."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill = []
    for _ in range(3):  # fill the accept queue: nothing is ever accepted
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fill.append(c)
    try:
        start = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"{scheme}://127.0.0.1:{port}", timeout=1.0, retries=0).query("up", 1.0)
        took = time.monotonic() - start
    finally:
        for c in (*fill, srv):
            c.close()
    assert exc.value.kind == TIMEOUT and "no answer within 1s" in str(exc.value)
    assert took < 10, f"{took:.1f}s for a 1 s deadline"


def test_a_deadline_that_has_passed_asks_nothing(api_factory: Any) -> None:
    api = api_factory([(200, VECTOR)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", timeout=1e-9, retries=0).query("up", 1.0)
    assert exc.value.kind == TIMEOUT and str(exc.value).endswith("/api/v1/query: no answer within 1e-09s")
    assert api.seen == []


def test_a_deadline_under_a_second_is_kept_not_rounded_down(api_factory: Any) -> None:
    api = api_factory([(200, VECTOR)])
    assert len(PromClient(f"http://127.0.0.1:{api.port}", timeout=0.95, retries=0).query("up", 1.0)) == 2


def test_one_deadline_bounds_a_trickling_server() -> None:
    import time

    server = trickler(every=0.2)  # each read succeeds well within the timeout
    try:
        t0 = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", timeout=1.0, retries=0).query("up", 1.0)
        took = time.monotonic() - t0
    finally:
        server.close()
    assert exc.value.kind == "prometheus_timeout"
    assert re.fullmatch(rf"http://127\.0\.0\.1:{server.port}/api/v1/query: no (complete )?answer within 1s",
                        str(exc.value)), str(exc.value)
    assert took < 3.0, f"held for {took:.1f}s with a 1 s timeout"


def test_answers_over_the_cap_are_refused_unread(api_factory: Any) -> None:
    big = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": f"n{i}", "gpu": "0"}, "value": [1.0, "0.5"]} for i in range(2000)]}}
    size = len(json.dumps(big))
    api = api_factory([(200, big)] * 4)
    url = f"http://127.0.0.1:{api.port}"
    with pytest.raises(PromError) as exc:
        PromClient(url, max_response_bytes=size - 1, retries=2).query("up", 1.0)
    assert exc.value.kind == "prometheus_response_too_large"
    assert "--prometheus-max-response-bytes" in str(exc.value) and "\n" not in str(exc.value)
    assert len(api.seen) == 1  # not retried: the same query would be as large again
    ok = PromClient(url, max_response_bytes=size)
    assert len(ok.query("up", 1.0)) == 2000 and ok.largest_response_bytes == size


def test_an_announced_length_over_the_cap_is_refused_before_the_body() -> None:
    """The cap is enforced on the Content-Length header, not only on what arrives: a server that
    announces more than the cap and then trickles is refused at once, not read until the timeout."""
    import time

    server = trickler(every=0.2, length=10 * 2**30)
    try:
        t0 = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", timeout=5.0, retries=0,
                       max_response_bytes=1000).query("up", 1.0)
        took = time.monotonic() - t0
    finally:
        server.close()
    assert exc.value.kind == "prometheus_response_too_large", str(exc.value)
    assert str(exc.value) == (f"http://127.0.0.1:{server.port}/api/v1/query: the answer announces {10 * 2**30} bytes, "
                              "more than --prometheus-max-response-bytes (1000 bytes); not read")
    assert took < 2.5, f"read for {took:.1f}s before refusing"


def endless() -> FakePrometheus:
    """The Prometheus stand-in answering 200 without a length (HTTP/1.0: the body ends at close), sending
    forever."""
    return FakePrometheus(lambda req, query: Reply(raw=b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[",
                                                   more=b"0," * 32768))


@pytest.mark.parametrize("cap", [1000, 3 * 2**19])  # under one read, and over the 1 MiB a read takes
def test_an_endless_answer_is_refused_once_it_passes_the_cap(cap: int) -> None:
    """Counted over every read: an answer without a length is refused as soon as it passes the cap,
    not read to its end (it has none) or until the deadline."""
    server = endless()
    client = PromClient(f"http://127.0.0.1:{server.port}", timeout=5.0, retries=0, max_response_bytes=cap,
                        max_parse_bytes=2**30)
    try:
        start = time.monotonic()
        with pytest.raises(PromError) as exc:
            client.query("up", 1.0)
        took = time.monotonic() - start
    finally:
        server.close()
    assert exc.value.kind == "prometheus_response_too_large", str(exc.value)
    assert str(exc.value) == (f"http://127.0.0.1:{server.port}/api/v1/query: the answer is longer than "
                              f"--prometheus-max-response-bytes ({cap} bytes); not read")
    assert took < 4, f"read for {took:.1f}s"
    assert client.largest_response_bytes == 0


def test_an_error_answer_is_judged_by_its_status_not_its_parse_cost(api_factory: Any) -> None:
    """An error answer is never parsed whole (its first 64 KiB name the error), so the parse bound
    does not apply: a 400 stays a bad query."""
    doc = {"status": "error", "errorType": "bad_data", "error": "parse error", "x": [0] * 20000}  # under 64 KiB
    api = api_factory([(400, doc)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", retries=0, max_parse_bytes=10000).query("up", 1.0)
    assert exc.value.kind == BAD_QUERY and str(exc.value).endswith("HTTP 400: bad_data: parse error")


def test_answer_without_length_is_capped_while_read() -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * 5000 + b"]}}"
    server = raw_server(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", max_response_bytes=1000, retries=0).query("up", 1.0)
    finally:
        server.close()
    assert exc.value.kind == "prometheus_response_too_large"


def test_server_text_is_escaped_and_cut_in_logs(api_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    forged = "bad query\n2030-01-01 00:00:00 ERROR exporter: forged line\x1b[31m" + "x" * 1_000_000
    api = api_factory([(400, {"status": "error", "errorType": "bad_data", "error": forged}),
                       (200, {**VECTOR, "warnings": [f"PromQL warning: {i}\nforged" for i in range(500)]})])
    client = PromClient(f"http://127.0.0.1:{api.port}")
    with pytest.raises(PromError) as exc:
        client.query("up", 1.0)
    msg = str(exc.value)
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 600 and "forged line" in msg
    with caplog.at_level("WARNING", logger="exporter.profiler.prom"):
        client.query("up", 1.0)
    lines = [r.getMessage() for r in caplog.records]
    assert 1 <= len(lines) <= 5, lines
    assert all("\n" not in m and len(m) < 500 for m in lines)
    assert any("500" in m or "497" in m for m in lines)  # the rest is counted, not dropped silently


@pytest.mark.parametrize(("name", "value"), [("X-Scope-OrgID", "a\r\nInjected: 1"), ("Bad Name", "v"),
                                             ("Host", "evil"), ("", "v")])
def test_bad_extra_headers_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        PromClient("http://127.0.0.1:9", headers={name: value})


@pytest.mark.parametrize("body", [
    # bare JSON constants Python's json accepts but Prometheus never sends
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[NaN,"1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[Infinity,"1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[-Infinity,"1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,NaN]]}]}}',
    # a number beyond float range is infinity to Python's json
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1e999,"1"]]}]}}',
    # timestamps as strings that float() takes
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[["NaN","1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[["+Inf","1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"],["-inf","2"]]}]}}',
])
def test_non_finite_timestamps_are_bad_responses(api_factory: Any, body: bytes) -> None:
    """Issue 26: a NaN or infinite timestamp was handed on and failed later as an internal error."""
    api = api_factory([(200, body)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", retries=0).query_range("up", 0, 60, 15)
    assert exc.value.kind == BAD_RESPONSE and "\n" not in str(exc.value)


@pytest.mark.parametrize("body", [
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[NaN,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":["Inf","1"]}]}}',
    b'{"status":"success","data":{"resultType":"scalar","result":[Infinity,"1"]}}',
])
def test_non_finite_instant_timestamps_are_bad_responses(api_factory: Any, body: bytes) -> None:
    api = api_factory([(200, body)])
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{api.port}", retries=0).query("up", 1.0)
    assert exc.value.kind == BAD_RESPONSE


def test_nan_values_as_prometheus_sends_them_are_kept(api_factory: Any) -> None:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {}, "values": [[1, "NaN"], [2.5, "+Inf"], [4, "-Inf"], [5, "0.5"]]}]}}
    api = api_factory([(200, doc)])
    got = PromClient(f"http://127.0.0.1:{api.port}", retries=0).query_range("up", 0, 60, 15)
    pts = got[0].points
    assert [t for t, _ in pts] == [1.0, 2.5, 4.0, 5.0]
    assert pts[0][1] != pts[0][1] and pts[1][1] == float("inf") and pts[2][1] == float("-inf") and pts[3][1] == 0.5


def body_trickler(framing: str, every: float = 0.2,
                  start: bytes = b'{"status":"success","data":{"resultType":"vector","result":[') -> FakePrometheus:
    """The Prometheus stand-in sending a valid JSON start (or ``start``), then a space every ``every`` s, without
    a Content-Length (``http10``: read until close) or chunked: only the deadline (or its stop) ends the answer."""
    if framing == "http10":
        reply = Reply(raw=b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + start, more=b" ",
                      every=every)
    else:
        reply = Reply(raw=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(start) + start
                      + b"\r\n", more=b"1\r\n \r\n", every=every)
    return FakePrometheus(lambda req, query: reply)


@pytest.mark.parametrize("framing", ["http10", "chunked"])
def test_trickling_answer_at_the_deadline_is_a_timeout(framing: str) -> None:
    """Issue 26: an answer cut at the deadline was parsed as if complete (bad_response)."""
    import time

    server = body_trickler(framing)
    try:
        t0 = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", timeout=1.0, retries=0).query("up", 1.0)
        took = time.monotonic() - t0
    finally:
        server.close()
    assert exc.value.kind == "prometheus_timeout", str(exc.value)
    assert re.fullmatch(rf"http://127\.0\.0\.1:{server.port}/api/v1/query: no (complete )?answer within 1s",
                        str(exc.value)), str(exc.value)
    assert took < 3.0


@pytest.mark.parametrize("body", [
    b"[" + b"{}," * 400_000 + b"{}]",  # 1.2 MB: 30 MB of objects
    b'{"status":"success","data":{"resultType":"vector","result":[' + b"[[]]," * 300_000 + b"[]]}}",
    b'{"status":"success","data":{"resultType":"vector","result":["\xc3\xa9' + b"a" * 1_000_000 + b'"]}}',
])
def test_answers_that_would_parse_into_too_much_memory_are_refused(api_factory: Any, body: bytes) -> None:
    """Issue 26: the byte cap alone let 15 MiB of ``[{},{},...]`` take gigabytes once parsed."""
    api = api_factory([(200, body)] * 3)
    client = PromClient(f"http://127.0.0.1:{api.port}", retries=2, max_parse_bytes=4 * 1024 * 1024)
    with pytest.raises(PromError) as exc:
        client.query("up", 1.0)
    assert exc.value.kind == "prometheus_response_too_large" and len(api.seen) == 1
    assert "--prometheus-max-parse-bytes" in str(exc.value)
    assert client.largest_response_bytes == 0  # refused while read, never parsed


def test_the_parse_bound_lets_real_answers_through(api_factory: Any) -> None:
    big = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": f"n{i}", "gpu": "0", "uuid": f"GPU-{i:08d}"}, "value": [1.0, "0.5"]} for i in range(5000)]}}
    api = api_factory([(200, big)])
    got = PromClient(f"http://127.0.0.1:{api.port}").query("up", 1.0)  # the default bound
    assert len(got) == 5000 and got[4999].labels["uuid"] == "GPU-00004999"


def test_defaults_retry_twice_with_jittered_backoff_from_half_a_second(api_factory: Any) -> None:
    """retries 2 and backoff 0.5 s (the profiler passes its own timeout and retries, never a backoff):
    delays are drawn from [0, 0.5] then [0, 1.0]."""
    api = api_factory([(503, {"status": "error"})])
    slept: list[float] = []
    for _ in range(20):
        with pytest.raises(PromError):
            PromClient(f"http://127.0.0.1:{api.port}", sleep=slept.append).query("up", 1.0)
    assert len(api.seen) == 60 and len(slept) == 40
    assert all(0 <= d <= 0.5 for d in slept[0::2]) and all(0 <= d <= 1.0 for d in slept[1::2])
    assert max(slept[1::2]) > 0.5, "the second delay doubles the range"


def test_a_refused_connection_is_unreachable_and_named() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(PromError) as exc:
        PromClient(f"http://127.0.0.1:{port}", retries=0).query("up", 1.0)
    assert exc.value.kind == UNREACHABLE
    assert str(exc.value).startswith(f"http://127.0.0.1:{port}/api/v1/query: ") and "refused" in str(exc.value)


def test_construction_errors_name_the_culprit() -> None:
    with pytest.raises(ValueError, match=r"^Prometheus URL 'ftp://x' must be http:// or https:// with a host$"):
        PromClient("ftp://x")
    with pytest.raises(ValueError, match=r"^header 'Bad Name': not a valid HTTP header name and value$"):
        PromClient("http://127.0.0.1:9090", headers={"Bad Name": "v"})


def test_a_trailing_slash_and_negative_retries(api_factory: Any) -> None:
    api = api_factory([(503, {"status": "error"}), (200, VECTOR)])
    with pytest.raises(PromError):
        PromClient(f"http://127.0.0.1:{api.port}/", retries=-1).query("up", 1.0)  # no retry at all
    assert [p for p, _, _ in api.seen] == ["/api/v1/query"]  # and no "//" from the trailing slash


@pytest.mark.parametrize(("url", "token", "warned"), [
    ("http://prometheus.example:9090", True, True),  # a token over plain http to another host
    ("http://127.0.0.1:9090", True, False), ("http://localhost:9090", True, False), ("http://[::1]:9090", True, False),
    ("http://prometheus.example:9090", False, False), ("https://prometheus.example:9090", True, False),
])
def test_a_token_over_plain_http_is_warned_about(url: str, token: bool, warned: bool, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "t").write_text("s3cret")
    PromClient(url, token_file=str(tmp_path / "t") if token else None)
    said = [r.getMessage() for r in caplog.records if r.name == "exporter.profiler.prom"]
    assert said == ([f"sending a bearer token to {url} over plain http"] if warned else [])


# ---- the caps and error lines at their exact bounds (issue 30, prom-caps) ----------------------------


def test_a_refused_redirect_names_each_url_cut_to_its_bound() -> None:
    """One line whatever the URLs' length: the hop's URL cut to 300 characters, where it pointed (the
    server's text) to 200 (docs/profiler.md), the configured URL to 100, each cut marked "..."."""
    prefix = "/" + "p" * 150
    hop = "/" + "h" * 400  # same origin: followed
    away = "https://127.0.0.1:9/" + "e" * 300  # another origin (the scheme): refused, never asked

    def answer(req: Request, query: str) -> Reply:
        return Reply(307, headers={"Location": away if req.path == hop else hop})

    with FakePrometheus(answer) as srv, pytest.raises(PromError) as exc:
        PromClient(srv.url + prefix, retries=0).query("up", 1.0)
    assert [r.path for r in srv.requests] == [prefix + "/api/v1/query", hop]
    assert exc.value.kind == BAD_RESPONSE
    assert str(exc.value) == (
        f"{(srv.url + hop)[:300]}...: HTTP 307 redirect to {away[:200]}... not followed (only 307/308 within "
        f"{(srv.url + prefix)[:100]}...'s origin; credentials never leave it): set --prometheus-url to the final "
        "address")


def test_a_blank_status_line_is_a_broken_answer_named_without_a_trailing_blank() -> None:
    server = raw_server(b"\r\n")  # BadStatusLine with no printable text of its own
    try:
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", retries=0).query("up", 1.0)
    finally:
        server.close()
    assert exc.value.kind == BAD_RESPONSE
    assert str(exc.value) == f"http://127.0.0.1:{server.port}/api/v1/query: broken HTTP answer: BadStatusLine"


def test_a_bad_header_name_is_named_cut_to_80_characters() -> None:
    name = "Bad Name " + "x" * 100
    with pytest.raises(ValueError) as exc:
        PromClient("http://127.0.0.1:9090", headers={name: "v"})
    assert str(exc.value) == f"header {name[:80] + '...'!r}: not a valid HTTP header name and value"


def _exactly(size: int) -> bytes:
    """VECTOR as a JSON answer of exactly ``size`` bytes (blanks before its last brace)."""
    doc = json.dumps(VECTOR).encode()
    return doc[:-1] + b" " * (size - len(doc)) + b"}"


def _framed(framing: str, body: bytes) -> bytes:
    """A 200 answer carrying ``body``: with its length, chunked (in 7,000-byte chunks), or read to the close."""
    if framing == "length":
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    if framing == "chunked":
        chunks = [body[i:i + 7000] for i in range(0, len(body), 7000)]
        return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n")
    return b"HTTP/1.0 200 OK\r\n\r\n" + body


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
@pytest.mark.parametrize("cap", [1000, 3 * 2**19])  # under one read, and over the 1 MiB a read takes
def test_an_answer_of_exactly_the_cap_is_read_and_one_byte_more_refused(cap: int, framing: str) -> None:
    """--prometheus-max-response-bytes is the longest answer taken, to the byte, whatever the framing."""
    for size in (cap, cap + 1):
        server = raw_server(_framed(framing, _exactly(size)))
        client = PromClient(f"http://127.0.0.1:{server.port}", retries=0, max_response_bytes=cap)
        try:
            if size == cap:
                assert len(client.query("up", 1.0)) == 2 and client.largest_response_bytes == cap
            else:
                with pytest.raises(PromError) as exc:
                    client.query("up", 1.0)
                assert exc.value.kind == "prometheus_response_too_large", str(exc.value)
                assert client.largest_response_bytes == 0
        finally:
            server.close()


def _holder(body: bytes) -> FakePrometheus:
    """Answers 200 without a length (HTTP/1.0: the body would end at the close) with ``body``, then holds
    the connection open until ``stop``: only the client can end the answer before its deadline."""
    return body_trickler("http10", every=3600, start=body)


@pytest.mark.parametrize("cap", [1000, 3 * 2**19])
def test_one_byte_over_the_cap_is_refused_at_once_when_the_server_then_stalls(cap: int) -> None:
    """The client never waits for more than one byte past the cap: a server that sends cap + 1 bytes and
    then stalls is refused then, not when the deadline cuts it."""
    server = _holder(b" " * (cap + 1))
    try:
        start = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", timeout=10.0, retries=0,
                       max_response_bytes=cap).query("up", 1.0)
        took = time.monotonic() - start
    finally:
        server.close()
    assert str(exc.value) == (f"http://127.0.0.1:{server.port}/api/v1/query: the answer is longer than "
                              f"--prometheus-max-response-bytes ({cap} bytes); not read")
    assert took < 5.0, f"refused after {took:.1f}s of a 10 s deadline: it waited for more than the cap"


def test_the_parse_bound_is_judged_on_every_mebibyte_as_it_arrives() -> None:
    """An answer whose first MiB alone would parse into more than --prometheus-max-parse-bytes is refused
    once that MiB is in, even when the server then stalls: not held to the deadline, not read further."""
    body = b"[" + b"{}," * 400_000  # 1.2 MB of {}: its first MiB is some 44 MB of objects
    first = ParseCost()
    first.add(body[:2**20])
    server = _holder(body)
    try:
        start = time.monotonic()
        with pytest.raises(PromError) as exc:
            PromClient(f"http://127.0.0.1:{server.port}", timeout=10.0, retries=0).query("up", 1.0)  # 32 MiB
        took = time.monotonic() - start
    finally:
        server.close()
    assert str(exc.value) == (
        f"http://127.0.0.1:{server.port}/api/v1/query: the answer would take more than "
        f"--prometheus-max-parse-bytes ({32 * 2**20} bytes) to parse (objects for {first.bytes} bytes in its first "
        f"{2**20} bytes); not read further")
    assert took < 5.0, f"refused after {took:.1f}s of a 10 s deadline"


def test_an_answer_that_costs_exactly_the_parse_bound_is_taken(api_factory: Any) -> None:
    """--prometheus-max-parse-bytes is inclusive, as --prometheus-max-response-bytes is: an answer whose
    counted cost is the bound is parsed, one byte less of bound refuses it."""
    body = json.dumps(VECTOR).encode()
    cost = ParseCost()
    cost.add(body)
    api = api_factory([(200, body)] * 2)
    url = f"http://127.0.0.1:{api.port}"
    assert len(PromClient(url, retries=0, max_parse_bytes=cost.bytes).query("up", 1.0)) == 2
    with pytest.raises(PromError) as exc:
        PromClient(url, retries=0, max_parse_bytes=cost.bytes - 1).query("up", 1.0)
    assert exc.value.kind == "prometheus_response_too_large" and "--prometheus-max-parse-bytes" in str(exc.value)


@pytest.mark.parametrize("prefix", ["/X", "/X//", "/prom/tenant-X/"])
def test_a_path_prefix_is_kept_to_its_last_character_less_trailing_slashes(api_factory: Any, prefix: str) -> None:
    api = api_factory([(200, VECTOR)])
    assert len(PromClient(f"http://127.0.0.1:{api.port}{prefix}", retries=0).query("up", 1.0)) == 2
    assert [p for p, _, _ in api.seen] == [prefix.rstrip("/") + "/api/v1/query"]
