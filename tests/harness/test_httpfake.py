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
