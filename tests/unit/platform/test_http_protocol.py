"""The server's protocol functions, pure (exporter/platform/http/protocol.py): request parsing (RFC
9112), Expect: 100-continue, Accept / Accept-Encoding negotiation (RFC 9110 12.5) and the answer head.

Exact outcomes for each rule; the fuzzing of the same parser is tests/reliability/test_fuzz_inputs.py
and the same rules through a real socket are test_http_server.py. ``make mutation`` judges
protocol.py by this file.
"""

from __future__ import annotations

import pytest

from exporter.platform.http import protocol
from exporter.platform.http.protocol import BadRequest, Response, answer_head, parse_request, wants_continue

H = b"Host: x\r\n"


def _ids(value: object) -> str:
    """Short test ids (the cases hold 8 KiB lines): a hash of the case, stable across runs."""
    import zlib

    return format(zlib.crc32(repr(value).encode()), "08x")


@pytest.mark.parametrize(("data", "want"), ids=_ids, argvalues=[
    (b"GET /metrics HTTP/1.1\r\n" + H + b"\r\n", ("GET", "/metrics", "HTTP/1.1", {"host": "x"}, 34)),
    (b"HEAD / HTTP/1.0\r\n\r\n", ("HEAD", "/", "HTTP/1.0", {}, 19)),
    (b"\r\n\r\nGET / HTTP/1.0\r\n\r\n", ("GET", "/", "HTTP/1.0", {}, 22)),  # stray blank lines first
    (b"GET / HTTP/1.0\n\n", ("GET", "/", "HTTP/1.0", {}, 16)),  # bare LF line ends
    (b"GET / HTTP/1.0\r\nX-A: 1\r\nX-A: 2\r\n\r\n", ("GET", "/", "HTTP/1.0", {"x-a": "1, 2"}, 34)),
    (b"GET / HTTP/1.0\r\nAccept:  \t a/b \t\r\n\r\n", ("GET", "/", "HTTP/1.0", {"accept": "a/b"}, 36)),
    (b"GET / HTTP/1.0\r\nContent-Length: 3\r\n\r\nabcGET", ("GET", "/", "HTTP/1.0", {"content-length": "3"}, 40)),
    (b"GET /p?q=%C3%A9 HTTP/1.1\r\nHOST: y\r\n\r\n", ("GET", "/p?q=%C3%A9", "HTTP/1.1", {"host": "y"}, 37)),
    (b"GET /\xe9 HTTP/1.0\r\nX: \xe9\r\n\r\n", ("GET", "/\xe9", "HTTP/1.0", {"x": "\xe9"}, 25)),  # latin-1
    (b"\nGET / HTTP/1.0\r\n\r\n", ("GET", "/", "HTTP/1.0", {}, 19)),  # one stray LF
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1:9400\r\n\r\n", ("GET", "/", "HTTP/1.1", {"host": "127.0.0.1:9400"}, 40)),
    (b"GET / HTTP/1.0\r\nX-A: XaX\r\n\r\n", ("GET", "/", "HTTP/1.0", {"x-a": "XaX"}, 28)),
    (b"GET / HTTP/1.0\r\nContent-Length: 000000000001\r\n\r\nx",  # 12 digits: the most we read
     ("GET", "/", "HTTP/1.0", {"content-length": "000000000001"}, 49)),
])
def test_a_whole_request_is_parsed(data: bytes, want: tuple[str, str, str, dict[str, str], int]) -> None:
    parsed = parse_request(bytearray(data))
    assert parsed is not None
    (method, target, version, headers), used = parsed
    assert (method, target, version, dict(headers), used) == want
    assert headers.get("HOST") == headers.get("host")  # looked up by any case


@pytest.mark.parametrize("data", ids=_ids, argvalues=[
    b"", b"GET / HTTP/1.1", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n",
    b"GET / HTTP/1.0\r\nContent-Length: 3\r\n\r\nab", b"\r\n\r\n",
    b"GET /" + b"a" * (protocol.MAX_LINE - 5),  # a request line of exactly MAX_LINE, its end not here yet
    b"GET / HTTP/1.1\r\nX: " + b"a" * (protocol.MAX_LINE - 3),  # a header line of MAX_LINE, not ended yet
])
def test_an_incomplete_request_waits(data: bytes) -> None:
    assert parse_request(bytearray(data)) is None


LONG = b"a" * (protocol.MAX_LINE + 1)


@pytest.mark.parametrize(("data", "status", "message"), ids=_ids, argvalues=[
    (b"GET /" + LONG + b" HTTP/1.1\r\n\r\n", 414, "request line or header too long"),
    (b"GET /" + LONG, 414, "request line or header too long"),  # not even a line end yet
    (b"GET / HTTP/1.1\r\nX: " + LONG + b"\r\n\r\n", 431, "request line or header too long"),
    (b"GET / HTTP/1.1\r\nX: " + LONG, 431, "request line or header too long"),
    # a line ended by a bare LF one byte over MAX_LINE: found within the search, refused by its length
    (b"GET /" + b"a" * (protocol.MAX_LINE - 13) + b" HTTP/1.1\n\n", 414, "request line or header too long"),
    (b"GET / HTTP/1.1\nX: " + b"a" * (protocol.MAX_LINE - 2) + b"\n\n", 431, "request line or header too long"),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(protocol.MAX_HEADERS + 1)) + b"\r\n",
     431, "too many headers"),
    (b"\r\n" * (protocol.MAX_LINE + 2), 400, "malformed request line"),
    (b"GET  / HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET  HTTP/1.1\r\n\r\n", 400, "malformed request line"),  # an empty target
    (b"GET / HTTP/1.0\r\nX: a\x0c\r\n\r\n", 400, "malformed header"),  # a control at the end: not trimmed
    (b"GET / HTTP/1.1 x\r\n\r\n", 400, "malformed request line"),
    (b"G(T / HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET /a\x01 HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET / http/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET / HTTP/2.0\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1"),
    (b"GET / HTTP/1.2\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1"),
    (b"GET / HTTP/0.9\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1"),
    (b"GET / HTTP/1.1\r\nX A: 1\r\n\r\n", 400, "malformed header"),
    (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "malformed header"),
    (b"GET / HTTP/1.1\r\n folded\r\n\r\n", 400, "malformed header"),
    (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "malformed header"),
    (b"GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n", 400, "malformed header"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one host header"),
    (b"GET / HTTP/1.0\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx", 400, "more than one content-length header"),
    (b"GET / HTTP/1.0\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n", 400, "more than one authorization header"),
    (b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 501, "request bodies are not supported"),
    (b"GET / HTTP/1.0\r\nContent-Length: +1\r\n\r\nx", 400, "bad Content-Length"),
    (b"GET / HTTP/1.0\r\nContent-Length: \xb2\r\n\r\n", 400, "bad Content-Length"),
    (b"GET / HTTP/1.0\r\nContent-Length: 1234567890123\r\n\r\n", 400, "bad Content-Length"),
    (b"GET / HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % (protocol.MAX_BODY + 1), 413, "request body too large"),
    (b"GET / HTTP/1.1\r\n\r\n", 400, "HTTP/1.1 request without Host"),
])
def test_a_request_that_cannot_become_valid_is_refused(data: bytes, status: int, message: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_request(bytearray(data))
    assert (exc.value.status, str(exc.value)) == (status, message)


def test_the_limits_are_inclusive() -> None:
    blank = b"\n" * protocol.MAX_LINE  # as many stray blank lines as a line may be long: still skipped
    parsed = parse_request(blank + b"GET / HTTP/1.0\r\n\r\n")
    assert parsed is not None and parsed[1] == protocol.MAX_LINE + 18
    start = b"\r\n" * 3000  # stray blank lines (6,000 bytes) do not count against the head's 64 KiB
    head = b"GET / HTTP/1.0\r\n" + b"".join(b"X-%03d: %s\r\n" % (i, b"v" * 600) for i in range(protocol.MAX_HEADERS))
    assert len(head) < protocol.MAX_HEAD < len(start + head)
    assert parse_request(start + head + b"\r\n") is not None
    line = b"GET /" + b"a" * (protocol.MAX_LINE - len(b"GET / HTTP/1.0")) + b" HTTP/1.0"
    assert len(line) == protocol.MAX_LINE and parse_request(line + b"\r\n\r\n") is not None
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(protocol.MAX_HEADERS))
    assert parse_request(b"GET / HTTP/1.0\r\n" + many + b"\r\n") is not None
    body = b"x" * protocol.MAX_BODY
    whole = b"GET / HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    parsed = parse_request(whole + b"GET")
    assert parsed is not None and parsed[1] == len(whole)


@pytest.mark.parametrize(("data", "want"), ids=_ids, argvalues=[
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", True),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n", True),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-Continue\r\n\r\nab", True),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nab", False),  # body here
    (b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n", False),  # no body
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", False),  # no Expect
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: other\r\n\r\n", False),
    (b"GET / HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", False),  # 1.0 knows no 100
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n", False),  # head not whole
    (b"GET / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", False),  # invalid: no Host
])
def test_wants_continue(data: bytes, want: bool) -> None:
    assert wants_continue(bytearray(data)) is want


@pytest.mark.parametrize(("accept", "want"), ids=_ids, argvalues=[
    ("", False),
    ("application/openmetrics-text", True),
    ("application/openmetrics-text; version=1.0.0", True),
    ("application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),
    ("text/plain;q=0.6,application/openmetrics-text;q=0.5", False),
    ("application/openmetrics-text;q=0.5,text/plain;q=0.5", False),  # a tie: the classic text
    ("application/openmetrics-text;q=0", False),
    ("application/openmetrics-text;q=bad", False),  # a malformed q counts as 0
    ("application/openmetrics-text;q=1.0001", False),
    ("application/openmetrics-text;q=0.001,text/plain;q=0", True),
    ("APPLICATION/OPENMETRICS-TEXT", True),
    ("application/*", True),  # OpenMetrics at q=1, text/plain unnamed (0)
    ("application/*;q=0.9,text/*;q=0.8", True),
    ("*/*", False),
    ("text/*;q=0.2,*/*;q=0.5", True),
    ("text/plain", False),
    ("application/*;q=0.9,application/openmetrics-text;q=0.1,text/plain;q=0.5", False),  # the exact range wins
    ("*/*;q=0.9,application/*;q=0.1,text/plain;q=0.5", False),  # type/* before */*
    ("application/openmetrics-text;q==0.5", False),  # a malformed q counts as 0
    ("application/openmetrics-text,text/plain;q=1.0", False),  # no q is q=1: a tie
    (",,", False),
])
def test_wants_openmetrics(accept: str, want: bool) -> None:
    assert protocol.wants_openmetrics(accept) is want


@pytest.mark.parametrize(("accept_encoding", "want"), ids=_ids, argvalues=[
    ("", False), ("gzip", True), ("GZIP", True), ("gzip;q=0", False), ("deflate, gzip;q=0.1", True),
    ("*", True), ("*;q=0", False), ("gzip;q=0, *", False), ("*, gzip;q=0", False), ("identity", False),
    ("gzip;q=1, gzip;q=0", True),  # the first mention wins
])
def test_wants_gzip(accept_encoding: str, want: bool) -> None:
    assert protocol.wants_gzip(accept_encoding) is want


def test_the_answer_head() -> None:
    resp = Response(404, b"nope\n", headers={"X-B": "2"})
    assert answer_head(resp, True, {"X-A": "1"}) == (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n"
        b"X-A: 1\r\nX-B: 2\r\n\r\n")
    assert answer_head(resp, False, {}).endswith(b"X-B: 2\r\nConnection: close\r\n\r\n")
    assert answer_head(resp, True, {}, http10=True).endswith(b"X-B: 2\r\nConnection: keep-alive\r\n\r\n")
    assert answer_head(resp, False, {}, http10=True).endswith(b"Connection: close\r\n\r\n")
    assert answer_head(Response(299, b""), True, {}).startswith(b"HTTP/1.1 299 Unknown\r\n")
    assert answer_head(Response(200, b"", headers={"X-A": "mine"}), True, {"X-A": "config"}).count(b"X-A") == 1
    assert protocol.unauthorized().headers == {"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'}
    assert protocol.unauthorized().status == 401
    assert protocol.unauthorized().body == b"unauthorized\n"
