"""Self-tests for tests/harness/httpfake.py: what the stand-ins built on it rely on."""

from __future__ import annotations

import http.client

import pytest

from tests.harness.httpfake import FakeHTTP, Reply, Request, json_reply


def test_requests_are_recorded_and_answered() -> None:
    def answer(req: Request) -> Reply:
        return json_reply({"path": req.path, "n": len(req.body)}, 201, headers={"Content-Type": "x/y", "X-A": "1"})

    with FakeHTTP(answer) as fake:
        conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
        conn.request("POST", "/api/v1/query?x=1", body=b"query=up", headers={"X-Scope-OrgID": "team-a"})
        r = conn.getresponse()
        assert (r.status, r.getheader("Content-Type"), r.getheader("X-A")) == (201, "x/y", "1")
        assert r.read() == b'{"path": "/api/v1/query?x=1", "n": 8}'
        conn.close()
    (req,) = fake.requests
    assert (req.method, req.path, req.body) == ("POST", "/api/v1/query?x=1", b"query=up")
    assert req.headers["x-scope-orgid"] == "team-a" and fake.url == f"http://127.0.0.1:{fake.port}"


def test_http11_keeps_the_connection_and_http10_closes_it() -> None:
    for http11, kept in ((True, True), (False, False)):
        with FakeHTTP(lambda req: Reply(200, b"ok"), http11=http11) as fake:
            conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
            conn.request("GET", "/")
            r = conn.getresponse()
            assert r.read() == b"ok" and r.will_close is not kept
            conn.close()


def test_a_cut_answer_announces_more_than_it_sends() -> None:
    with FakeHTTP(lambda req: Reply(200, b"half", length=8, close=True), http11=True) as fake:
        conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
        conn.request("GET", "/")
        r = conn.getresponse()
        with pytest.raises(http.client.IncompleteRead):
            r.read()
        conn.close()


def test_down_refuses_and_up_listens_again_on_the_same_port() -> None:
    fake = FakeHTTP(lambda req: Reply(200, b"ok"))
    port = fake.port
    fake.down()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises(ConnectionRefusedError):
        conn.request("GET", "/")
    conn.close()
    fake.up()
    assert fake.port == port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"ok"
    conn.close()
    fake.close()
    assert len(fake.requests) == 1


def _exchange(port: int, wanted: int) -> bytes:
    """``wanted`` bytes (or what came before the close) of the answer to one POST, read off the socket."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nquery=up")
        got = b""
        while len(got) < wanted:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_a_raw_answer_goes_out_as_it_is_then_closes() -> None:
    with FakeHTTP(lambda req: Reply(raw=b"SSH-2.0-OpenSSH_9.6\r\n\r\n")) as fake:
        assert _exchange(fake.port, 1 << 20) == b"SSH-2.0-OpenSSH_9.6\r\n\r\n"  # not HTTP, and the close
    assert fake.requests[0].body == b"query=up"


def test_a_trickle_sends_more_until_the_server_stops() -> None:
    import socket

    fake = FakeHTTP(lambda req: Reply(raw=b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", more=b" ", every=0.01))
    got = _exchange(fake.port, 40 + 5)  # the head, then five trickled bytes
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"     ")
    with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b" "):  # trickling
            got += s.recv(65536)
        fake.down()  # stops the trickle: the client sees the close, not its own timeout
        while chunk := s.recv(65536):
            assert chunk.strip() == b""
