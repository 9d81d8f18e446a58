"""exporter/k8s/watch.py's pieces on their own: the backoff policy, Retry-After, and the bounded
decoding of list answers and watch streams (read in pieces as small as one byte)."""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any

import pytest

from exporter.k8s import watch
from exporter.k8s.watch import Backoff, TooLarge, Watcher, _JsonStream, _lines, _reader, retry_after
from tests.harness.clock import FakeClock


def test_backoff_doubles_from_initial_to_the_cap_and_jitter_stays_under_it() -> None:
    clock = FakeClock(now=0.0)
    b = Backoff(initial=1.0, cap=10.0, factor=3.0, jitter=0.5, reset_after=60.0, clock=clock, rand=lambda: 0.0)
    assert [b.next() for _ in range(4)] == [1.0, 3.0, 9.0, 10.0]
    hi = Backoff(initial=1.0, cap=10.0, factor=2.0, jitter=0.5, clock=clock, rand=lambda: 1.0)
    assert [hi.next() for _ in range(5)] == [1.5, 3.0, 6.0, 10.0, 10.0]
    assert Backoff(initial=2.0, cap=5.0, clock=clock, rand=lambda: 0.0).next(floor=3.5) == 3.5
    assert Backoff(initial=2.0, cap=5.0, clock=clock, rand=lambda: 0.0).next(floor=1.0) == 2.0


def test_backoff_resets_only_after_a_quiet_spell_longer_than_reset_after() -> None:
    clock = FakeClock(now=0.0)
    b = Backoff(initial=1.0, cap=100.0, reset_after=10.0, clock=clock, rand=lambda: 0.0)
    assert b.next() == 1.0  # the delay ends at 1.0
    clock.now = 11.0  # exactly reset_after after it: still the same outage
    assert b.next() == 2.0  # ends at 13.0
    clock.now = 23.5
    assert b.next() == 1.0
    many = Backoff(initial=1.0, cap=1e300, clock=clock, rand=lambda: 0.0)
    for _ in range(200):  # the exponent is bounded: no overflow however long the outage
        many.next()


def test_the_default_backoff_is_client_gos() -> None:
    b = Backoff()
    assert (b.initial, b.cap, b.factor, b.jitter, b.reset_after) == (0.8, 30.0, 2.0, 1.0, 120.0)
    for _ in range(50):
        assert 0.8 <= Backoff().next() <= 1.6


class _Exc(Exception):
    def __init__(self, headers: Any) -> None:
        super().__init__("x")
        self.headers = headers


@pytest.mark.parametrize(("headers", "want"), [
    ({"Retry-After": "7"}, 7.0), ({"Retry-After": "0.5"}, 0.5), ({}, 0.0), (None, 0.0),
    ({"Retry-After": "soon"}, 0.0), ({"Retry-After": "-3"}, 0.0), ({"Retry-After": "0"}, 0.0),
    ({"Retry-After": "1e9"}, 0.0), ({"Retry-After": "999999"}, 999999.0), ({"Retry-After": "nan"}, 0.0),
])
def test_retry_after(headers: Any, want: float) -> None:
    assert retry_after(_Exc(headers)) == want


def test_retry_after_of_an_error_without_headers() -> None:
    assert retry_after(ValueError("x")) == 0.0


def _one_byte_at_a_time(data: bytes) -> Any:
    buf = io.BytesIO(data)
    return lambda n: buf.read(1)


@pytest.mark.parametrize("reader", ["whole", "bytes"])
def test_a_list_is_read_member_by_member_and_item_by_item(reader: str) -> None:
    doc = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "42", "continue": ""},
           "items": [{"metadata": {"uid": "a", "name": "é"}, "n": 12345}, {"metadata": {"uid": "b"}, "x": [1.5, -2e3]},
                     {"deep": {"k": [True, False, None, "s\"q\\u00e9"]}}],
           "tail": 7}
    data = json.dumps(doc, indent=1).encode()
    read = io.BytesIO(data).read if reader == "whole" else _one_byte_at_a_time(data)
    s = _JsonStream(read, 1 << 20)
    seen: dict[str, Any] = {}
    for key in s.members():
        seen[key] = list(s.elements()) if key == "items" else s.value()
    assert seen == doc


@pytest.mark.parametrize("text", ["{}", " { } ", "{\"items\": []}", "{\"items\":[ ]}"])
def test_empty_objects_and_arrays(text: str) -> None:
    s = _JsonStream(_one_byte_at_a_time(text.encode()), 100)
    got = {k: list(s.elements()) for k in s.members()}
    assert got in ({}, {"items": []})


def test_a_number_split_across_reads_is_read_whole() -> None:
    s = _JsonStream(_one_byte_at_a_time(b'{"n": 1234567, "t": true}'), 100)
    assert {k: s.value() for k in s.members()} == {"n": 1234567, "t": True}


@pytest.mark.parametrize("text", [
    '{"a" 1}', '{"a": 1 "b": 2}', '{1: 2}', '{"items": [1 2]}', '[1]', '{"a": 1', '{"items": [1,', '',
    '{"a": tru}', '{"a": "unterminated}',
])
def test_malformed_answers_raise_value_error(text: str) -> None:
    s = _JsonStream(_one_byte_at_a_time(text.encode()), 100)
    with pytest.raises(ValueError):
        for key in s.members():
            if key == "items":
                list(s.elements())
            else:
                s.value()


def test_an_object_over_the_limit_is_refused_whole_or_in_pieces() -> None:
    big = json.dumps({"items": [{"x": "y" * 500}]}).encode()
    for read in (io.BytesIO(big).read, _one_byte_at_a_time(big)):
        s = _JsonStream(read, 200)
        with pytest.raises(TooLarge):
            for _ in s.members():
                list(s.elements())
    ok = _JsonStream(io.BytesIO(json.dumps({"items": [{"x": "y" * 150}]}).encode()).read, 200)
    assert [len(e["x"]) for k in ok.members() for e in ok.elements()] == [150]


def test_a_watch_stream_is_cut_into_bounded_lines() -> None:
    data = b'{"a":1}\n\n{"b":2}\r\n{"c":3}'
    assert list(_lines(_one_byte_at_a_time(data), 100)) == [b'{"a":1}', b"", b'{"b":2}\r', b'{"c":3}']
    assert list(_lines(io.BytesIO(b"x\n").read, 100)) == [b"x"]
    assert list(_lines(io.BytesIO(b"").read, 100)) == []
    assert list(_lines(io.BytesIO(b"y" * 100 + b"\n").read, 100)) == [b"y" * 100]
    with pytest.raises(TooLarge):
        list(_lines(io.BytesIO(b"z" * 70_000).read, 65536))


class _Resp:
    def __init__(self, data: bytes, read1: bool = True) -> None:
        self._buf = io.BytesIO(data)
        self.calls: list[str] = []
        if read1:
            self.read1 = self._read1

    def _read1(self, n: int) -> bytes:
        self.calls.append("read1")
        return self._buf.read(min(n, 3))

    def read(self, n: int) -> bytes:
        self.calls.append("read")
        return self._buf.read(n)

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_watch_reads_what_has_arrived_and_a_list_reads_in_blocks() -> None:
    r = _Resp(b"abcdef")
    assert _reader(r, stream=True)(100) == b"abc" and r.calls == ["read1"]
    r = _Resp(b"abcdef")
    assert _reader(r)(100) == b"abcdef" and r.calls == ["read"]
    r = _Resp(b"abcdef", read1=False)
    assert _reader(r, stream=True)(100) == b"abcdef"

    class Data:
        data = b"xyz"
        read = None

    read = _reader(Data())
    assert read(2) == b"xy" and read(5) == b"z" and read(5) == b""


def _list_answer(items: list[dict[str, Any]], rv: str = "9") -> bytes:
    return json.dumps({"kind": "PodList", "items": items, "metadata": {"resourceVersion": rv}}).encode()


def test_a_list_keeps_at_most_max_objects_and_only_what_keep_keeps(caplog: pytest.LogCaptureFixture) -> None:
    items = [{"metadata": {"uid": f"u{i}", "name": f"p{i}"}, "spec": {"big": "x" * 100}} for i in range(5)]
    items.append({"metadata": {"name": "no-uid"}})
    published: list[dict[str, Any]] = []
    w = Watcher("pods", lambda **kw: _Resp(_list_answer(items)), lambda o: published.append(dict(o)),
                keep=lambda o: {"metadata": o["metadata"]}, max_objects=3)
    with caplog.at_level(logging.WARNING):
        assert w._list() == "9"
        assert w._list() == "9"
    assert list(published[-1]) == ["u0", "u1", "u2"]
    assert published[-1]["u1"] == {"metadata": {"uid": "u1", "name": "p1"}}
    assert w.dropped == 4 and w.lists == 2 and w.synced.is_set()
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1


def test_a_list_without_metadata_or_items_is_empty() -> None:
    w = Watcher("pods", lambda **kw: _Resp(b'{"kind": "PodList", "items": null}'), lambda o: None)
    assert w._list() == "" and w._objects == {}


def test_watch_events_add_modify_delete_bookmark_and_cap(caplog: pytest.LogCaptureFixture) -> None:
    lines = [{"type": "ADDED", "object": {"metadata": {"uid": "a", "resourceVersion": "2"}, "v": 1}},
             {"type": "ADDED", "object": {"metadata": {"uid": "b", "resourceVersion": "3"}}},
             {"type": "MODIFIED", "object": {"metadata": {"uid": "a", "resourceVersion": "4"}, "v": 2}},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}},
             {"type": "ADDED", "object": {"metadata": {"resourceVersion": "6"}}},
             {"type": "DELETED", "object": {"metadata": {"uid": "b", "resourceVersion": "7"}}},
             {"type": "ADDED", "object": {"metadata": {"uid": "c", "resourceVersion": "8"}}},
             {"type": "ADDED", "object": {"metadata": {"uid": "d", "resourceVersion": "9"}}}]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in lines) + b"\n"
    seen: list[dict[str, Any]] = []
    w = Watcher("pods", lambda **kw: _Resp(body), lambda o: seen.append(dict(o)), max_objects=2,
                keep=lambda o: {"v": o.get("v")})
    assert w._watch("1") == "9"
    assert seen[-1] == {"a": {"v": 2}, "c": {"v": None}}
    assert w.dropped == 1 and len(seen) == 5  # the bookmark, the uid-less and the dropped one publish nothing


@pytest.mark.parametrize(("body", "error"), [
    (b'{"type": "ERROR", "object": {"code": 410}}\n', watch._Expired),
    (b'{"type": "ERROR", "object": {"code": 500, "message": "boom"}}\n', RuntimeError),
    (b"[]\n", ValueError), (b'{"type": "ADDED", "object": [1]}\n', ValueError), (b"nope\n", ValueError),
    (b"", watch._ShortWatch), (b"\n\n", watch._ShortWatch),
])
def test_watch_failures(body: bytes, error: type[Exception]) -> None:
    w = Watcher("pods", lambda **kw: _Resp(body), lambda o: None, clock=FakeClock(now=0.0))
    with pytest.raises(error):
        w._watch("1")


def test_a_watch_that_ran_its_course_ends_the_outage(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(now=0.0)

    class Slow(_Resp):
        def _read1(self, n: int) -> bytes:
            clock.now += 2.0  # the watch lasted its timeout, then ended without an event
            return b""

    def call(**kw: Any) -> _Resp:
        return Slow(b"")

    w = Watcher("pods", call, lambda o: None, clock=clock)
    w._failing = True
    with caplog.at_level(logging.INFO):
        assert w._watch("5") == "5"
    assert not w._failing and "pods watch back" in caplog.text
    assert str(watch._Expired()) == "HTTP 410 Expired (resourceVersion too old)"
    assert "closed at once" in str(watch._ShortWatch())


def test_the_first_failure_of_an_outage_is_a_warning_the_rest_debug(caplog: pytest.LogCaptureFixture) -> None:
    w = Watcher("pods", lambda **kw: None, lambda o: None)

    class Forbidden(Exception):
        status, reason = 403, "Forbidden"

    with caplog.at_level(logging.DEBUG, logger="exporter.k8s.watch"):
        w._note_failure(Forbidden(), 1.5)
        w._note_failure(ValueError("bad"), 3.0)
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warn == ["pods watch failed (HTTP 403 Forbidden); the exporter's ServiceAccount needs get, list and watch "
                    "on pods; listing again with backoff (1.5 s, at most 30 s), the last known pods are kept"]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["pods watch still failing (ValueError: bad); next try in 3.0 s"]


def test_the_selector_and_timeouts_go_with_every_request() -> None:
    calls: list[dict[str, Any]] = []

    def call(**kw: Any) -> _Resp:
        calls.append(kw)
        return _Resp(_list_answer([]) if not kw.get("watch") else b"")

    w = Watcher("pods", call, lambda o: None, field_selector="spec.nodeName=n1", timeout_seconds=7,
                request_timeout=3.0, clock=FakeClock(now=0.0))
    w._list()
    with pytest.raises(watch._ShortWatch):
        w._watch("12")
    assert calls[0] == {"field_selector": "spec.nodeName=n1", "_preload_content": False, "_request_timeout": (3.0, 3.0)}
    assert calls[1] == {"field_selector": "spec.nodeName=n1", "_preload_content": False, "watch": True,
                        "resource_version": "12", "timeout_seconds": 7, "allow_watch_bookmarks": True,
                        "_request_timeout": (3.0, 10.0)}
    bare = Watcher("pods", call, lambda o: None)
    bare._list()
    assert "field_selector" not in calls[-1]


def test_no_retries_turns_urllib3s_off() -> None:
    class Pool:
        connection_pool_kw: dict[str, Any] = {}

    class Rest:
        pool_manager = Pool()

    class Cfg:
        retries: Any = None

    class Api:
        configuration = Cfg()
        rest_client = Rest()

    api = Api()
    assert watch.no_retries(api) is api
    r = api.configuration.retries
    assert r.total == 0 and not r.respect_retry_after_header and not r.raise_on_status
    assert Pool.connection_pool_kw["retries"] is r


def test_a_stopped_watch_ends_quietly() -> None:
    w = Watcher("pods", lambda **kw: _Resp(b'{"type": "ADDED", "object": {"metadata": {"uid": "a"}}}\n'),
                lambda o: None, clock=FakeClock(now=0.0))
    w._stop.set()
    assert w._watch("3") == "3" and w._objects == {}
    assert threading.active_count() >= 1


def test_retry_after_bounds_and_messages() -> None:
    assert retry_after(_Exc({"Retry-After": "1000000"})) == 0.0  # a million seconds: not a real hint
    assert retry_after(_Exc({"Retry-After": "999999.5"})) == 999999.5
    assert str(watch._ShortWatch()) == "the watch stream closed at once, without an event"


def test_lines_split_a_chunk_of_many_and_the_limit_is_exact() -> None:
    assert list(_lines(io.BytesIO(b"a\nbb\nccc\n").read, 100)) == [b"a", b"bb", b"ccc"]
    exact = _one_byte_at_a_time(b"y" * 100 + b"\nz\n")  # 100 bytes wait for their newline: allowed
    assert list(_lines(exact, 100)) == [b"y" * 100, b"z"]
    with pytest.raises(TooLarge, match=r"^a watch event over 100 bytes$"):
        list(_lines(_one_byte_at_a_time(b"y" * 101), 100))


def test_import_client_and_wait_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import kubernetes

    from exporter.core.extras import MissingExtra

    assert watch.import_client() is kubernetes
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(MissingExtra, match="--per-process"):
        watch.import_client("--per-process")
    with pytest.raises(MissingExtra, match="the Kubernetes API"):
        watch.import_client()
    w = Watcher("pods", lambda **kw: None, lambda o: None)
    assert not watch.wait_synced(w, 0) and not watch.wait_synced(w, 0.01)
    w.synced.set()
    assert watch.wait_synced(w, 0) and watch.wait_synced(w, 5)


def test_no_retries_turns_off_every_kind_and_takes_any_client() -> None:
    class Api:
        pass

    api = Api()
    assert watch.no_retries(api) is api  # no configuration, no pool: nothing to set, nothing raised
    api.configuration = type("Cfg", (), {"retries": None})()  # type: ignore[attr-defined]
    watch.no_retries(api)
    r = api.configuration.retries  # type: ignore[attr-defined]
    assert (r.total, r.connect, r.read, r.status, r.redirect) == (0, 0, 0, 0, 0)
    assert (r.respect_retry_after_header, r.raise_on_status, r.raise_on_redirect) == (False, False, False)


def test_stop_unblocks_the_read_and_joins_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    released = threading.Event()

    class Blocking(_Resp):
        def _read1(self, n: int) -> bytes:
            released.wait(30)
            return b""

        def shutdown(self) -> None:
            released.set()

    def call(**kw: Any) -> _Resp:
        return Blocking(b"") if kw.get("watch") else _Resp(_list_answer([]))

    w = Watcher("pods", call, lambda o: None, request_timeout=5.0)
    w.start()
    assert w.synced.wait(10)
    for _ in range(3000):  # until the watch request is the one in flight
        if isinstance(w._resp, Blocking):
            break
        released.wait(0.01)
    thread = w._thread
    assert thread is not None
    w.stop()
    assert released.is_set() and not thread.is_alive() and w._thread is None

    class Closing:
        closed = False

        def close(self) -> None:
            Closing.closed = True

    w2 = Watcher("pods", call, lambda o: None)
    w2._resp = Closing()
    w2.stop()  # no shutdown(): close() instead
    assert Closing.closed

    class Broken:
        def shutdown(self) -> None:
            raise OSError("gone")

    w3 = Watcher("nodes", call, lambda o: None)
    w3._resp = Broken()
    with caplog.at_level(logging.DEBUG, logger="exporter.k8s.watch"):
        w3.stop()
    assert "closing the nodes watch failed" in caplog.text


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_failure_messages_name_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    class ServerError(Exception):
        status = 500

    for exc, why in ((ServerError(), "HTTP 500"), (watch._Expired(), "HTTP 410 Expired (resourceVersion too old)"),
                     (watch._ShortWatch(), "the watch stream closed at once, without an event"),
                     (ValueError("garbage"), "ValueError: garbage")):
        caplog.clear()
        w = Watcher("pods", lambda **kw: None, lambda o: None)
        with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
            w._note_failure(exc, 2.0)
        assert _warnings(caplog) == [f"pods watch failed ({why}); listing again with backoff (2.0 s, at most 30 s), "
                                     "the last known pods are kept"]


def test_the_loop_watches_again_after_a_watch_ends_normally_and_logs_the_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    class Parking(FakeClock):
        def wait(self, stop: threading.Event, seconds: float) -> bool:
            stop.set()  # the first backoff ends the test
            return True

    clock = Parking()
    calls: list[str] = []

    class Ends(_Resp):
        def _read1(self, n: int) -> bytes:
            clock.now += 2.0  # ran its course, no event
            return b""

    def call(**kw: Any) -> _Resp:
        if not kw.get("watch"):
            calls.append("list")
            return _Resp(_list_answer([]))
        calls.append("watch")
        if calls.count("watch") == 2:
            raise ValueError("boom")
        return Ends(b"")

    w = Watcher("pods", call, lambda o: None, clock=clock)
    with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
        w._loop()
    assert calls == ["list", "watch", "watch"]
    assert w.errors == 1 and w.relists == 0
    assert _warnings(caplog)[0].startswith("pods watch failed (ValueError: boom); listing again with backoff")


def test_the_thread_is_a_named_daemon() -> None:
    release = threading.Event()

    def call(**kw: Any) -> _Resp:
        release.wait(10)
        raise ValueError("stopped")

    w = Watcher("pods", call, lambda o: None, request_timeout=1.0)
    w.start()
    try:
        assert w._thread is not None and w._thread.name == "watch-pods" and w._thread.daemon
        first = w._thread
        w.start()  # started once only
        assert w._thread is first
    finally:
        release.set()
        w.stop()


def test_every_message_and_edge_of_one_watch(caplog: pytest.LogCaptureFixture) -> None:
    """From the watch mutation run's survivors: exact errors, log lines, and each event's edge."""
    with pytest.raises(ValueError, match=r"^a watch event that is not a JSON object$"):
        Watcher("p", lambda **kw: _Resp(b"[1]\n"), lambda o: None)._watch("1")
    with pytest.raises(ValueError, match=r"^a watch event whose object is not a JSON object$"):
        Watcher("p", lambda **kw: _Resp(b'{"type": "ADDED", "object": "x"}\n'), lambda o: None)._watch("1")
    with pytest.raises(RuntimeError, match=r"^watch error 500: boom$"):
        Watcher("p", lambda **kw: _Resp(b'{"type": "ERROR", "object": {"code": 500, "message": "boom"}}\n'),
                lambda o: None)._watch("1")
    released: list[bool] = []

    class Tracked(_Resp):
        def release_conn(self) -> None:
            released.append(True)

    events = [{"type": "ADDED", "object": {"metadata": {"uid": "a", "resourceVersion": "2"}}},
              {"type": "BOOKMARK", "object": {"metadata": {"uid": "bm", "resourceVersion": "3"}}},
              {"type": "DELETED", "object": {"metadata": {"uid": "never-seen", "resourceVersion": "4"}}},
              {"type": "ADDED", "object": {"metadata": {"uid": "over", "resourceVersion": "5"}}},
              {"type": "ADDED", "object": {"metadata": {"uid": "b", "resourceVersion": "6"}}}]
    body = b"\n".join(json.dumps(e).encode() for e in events[:2]) + b"\n\n" + \
        b"\n".join(json.dumps(e).encode() for e in events[2:]) + b"\n"
    w = Watcher("pods", lambda **kw: Tracked(body), lambda o: None, max_objects=1, clock=FakeClock())
    w._objects = {"b": {"old": True}}
    with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
        assert w._watch("1") == "6"
    assert w._objects == {"b": {"metadata": {"uid": "b", "resourceVersion": "6"}}}  # a, over: dropped; b replaced
    assert w.dropped == 2 and released == [True]
    assert _warnings(caplog) == ["pods watch: over 1 objects on this node; 1 left out (counted)"]
    # a watch of exactly one second without an event is not "closed at once"
    clock = FakeClock()

    class OneSecond(_Resp):
        def _read1(self, n: int) -> bytes:
            clock.advance(1.0)
            return b""

    w = Watcher("pods", lambda **kw: OneSecond(b""), lambda o: None, clock=clock)
    w._failing = True
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="exporter.k8s.watch"):
        assert w._watch("9") == "9"
    assert [r.getMessage() for r in caplog.records] == ["pods watch back"]


def test_release_publish_and_uid_failures_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    class NoConn(_Resp):
        def release_conn(self) -> None:
            raise OSError("closed")

    def bad_consumer(objects: Any) -> None:
        raise KeyError("consumer bug")

    w = Watcher("pods", lambda **kw: NoConn(_list_answer([{"metadata": {"uid": "a"}}])), bad_consumer)
    with caplog.at_level(logging.DEBUG, logger="exporter.k8s.watch"):
        w._list()
    msgs = {r.getMessage(): r for r in caplog.records}
    assert msgs["release_conn failed"].exc_info and msgs["release_conn failed"].levelno == logging.DEBUG
    assert msgs["pods watch: consumer failed"].exc_info and w._resp is None and w.lists == 1
    assert watch._uid([]) == "" and watch._uid({"metadata": []}) == "" and watch._uid({"metadata": "x"}) == ""
    assert watch._uid({"metadata": {"uid": 5}}) == "5" and watch._uid({"metadata": {}}) == ""


def test_the_real_clock_waits_for_stop() -> None:
    stop = threading.Event()
    c = watch.Clock()
    assert c.wait(stop, 0.01) is False
    stop.set()
    assert c.wait(stop, 30) is True
    assert abs(c.monotonic() - __import__("time").monotonic()) < 5


# ---- the survivors of the watch mutation run (docs/reliability.md, Mutation testing) ----------------


def _chunks(*chunks: bytes) -> tuple[Any, list[int]]:
    """A read function giving ``chunks`` then the end; the sizes asked, and a failure if the end is read
    more than once (a decoder that asks again after the end would spin)."""
    asked: list[int] = []
    it = iter(chunks)

    def read(n: int) -> bytes:
        asked.append(n)
        if len(asked) > len(chunks) + 1:
            raise AssertionError("read again after the end")
        return next(it, b"")

    return read, asked


def test_the_end_of_an_answer_is_read_once_and_named() -> None:
    read, asked = _chunks(b'{"items": [1')
    s = _JsonStream(read, 100)
    keys = s.members()
    assert next(keys) == "items"
    items = s.elements()
    assert next(items) == 1
    with pytest.raises(ValueError) as err:
        next(items)
    assert str(err.value) == "the answer ends early" and len(asked) == 2
    with pytest.raises(ValueError) as err:
        s.peek()  # at the end: said again, without reading again
    assert str(err.value) == "the answer ends early" and len(asked) == 2
    read, asked = _chunks(b'{"items": [')
    s = _JsonStream(read, 100)
    with pytest.raises(ValueError) as err:
        for _ in s.members():
            list(s.elements())
    assert str(err.value) == "the answer ends early" and len(asked) == 2
    # one byte at a time, a number last: the end adds nothing after it
    s = _JsonStream(_one_byte_at_a_time(b'{"items": [1'), 100)
    with pytest.raises(ValueError) as err:
        for _ in s.members():
            list(s.elements())
    assert str(err.value) == "the answer ends early"


def test_bytes_that_are_not_utf8_are_a_decoding_error() -> None:
    """Strict UTF-8: a byte that is not UTF-8, or an answer cut inside a character (the decoder's last
    flush), is a UnicodeDecodeError (a ValueError: the request failed), never skipped or replaced."""
    for text in (b'{"a": "\xff"}', b'{"a": "\xc3'):
        s = _JsonStream(io.BytesIO(text).read, 100)
        with pytest.raises(UnicodeDecodeError):
            for _ in s.members():
                s.value()
    s = _JsonStream(io.BytesIO('{"a": "é"}'.encode()).read, 100)
    assert {k: s.value() for k in s.members()} == {"a": "é"}


def test_compact_json_as_the_api_server_writes_it() -> None:
    """The API server writes JSON without spaces: every separator is one character."""
    body = b'{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"uid":"a"}},' \
           b'{"metadata":{"uid":"b"}}],"apiVersion":"v1"}'
    for read in (io.BytesIO(body).read, _one_byte_at_a_time(body)):
        w = Watcher("pods", lambda read=read, **kw: _ListResp(read), lambda o: None)
        assert w._list() == "7" and sorted(w._objects) == ["a", "b"]


class _ListResp:
    def __init__(self, read: Any) -> None:
        self.read = read
        self.released = 0

    def release_conn(self) -> None:
        self.released += 1


def test_a_list_releases_its_connection_and_reads_only_object_metadata() -> None:
    resps: list[_ListResp] = []

    def call(body: bytes) -> Any:
        def list_call(**kw: Any) -> _ListResp:
            resps.append(_ListResp(io.BytesIO(body).read))
            return resps[-1]
        return list_call

    assert Watcher("pods", call(b'{"metadata": "7", "items": []}'), lambda o: None)._list() == ""
    assert Watcher("pods", call(b'{"metadata": [1], "items": []}'), lambda o: None)._list() == ""
    assert Watcher("pods", call(b'{"metadata": {"resourceVersion": 12}, "items": []}'), lambda o: None)._list() == "12"
    assert [r.released for r in resps] == [1, 1, 1]


@pytest.mark.parametrize("whole", [True, False])
def test_the_object_limit_is_exact(whole: bool) -> None:
    """An object of exactly ``limit`` characters is read, one more is refused, also as the second item
    (where its start is not at the start of the buffer), read whole or one byte at a time."""
    def item(n: int) -> str:
        return '{"x": "' + "y" * (n - 9) + '"}'

    assert len(item(40)) == 40
    for items, ok in (([item(40)], True), ([item(41)], False), ([item(20), item(40)], True),
                      ([item(20), item(41)], False)):
        body = ('{"items": [' + ", ".join(items) + "]}").encode()
        s = _JsonStream(io.BytesIO(body).read if whole else _one_byte_at_a_time(body), 40)
        if ok:
            assert [len(json.dumps(e)) for k in s.members() for e in s.elements()] == [len(i) for i in items]
        else:
            with pytest.raises(TooLarge) as err:
                for _ in s.members():
                    list(s.elements())
            assert str(err.value) == "an object over 40 bytes"


def test_a_410_is_logged_as_one(caplog: pytest.LogCaptureFixture) -> None:
    """The loop's line for an expired watch names the expiry (the failure it handles), once."""
    clock = FakeClock(now=0.0)
    body = b'{"type": "ERROR", "object": {"code": 410}}\n'
    calls: list[dict[str, Any]] = []

    def call(**kw: Any) -> _Resp:
        calls.append(kw)
        if len(calls) > 4:
            w._stop.set()
        return _Resp(body) if kw.get("watch") else _Resp(_list_answer([]))

    w = Watcher("pods", call, lambda o: None, clock=clock, backoff=watch.Backoff(jitter=0.0, clock=clock))
    with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
        w._loop()
    assert w.expired >= 2 and w.errors == 0
    assert _warnings(caplog) == [
        "pods watch failed (HTTP 410 Expired (resourceVersion too old)); listing again with backoff (0.8 s, at most "
        "30 s), the last known pods are kept"]


def test_the_first_list_that_drops_objects_says_so(caplog: pytest.LogCaptureFixture) -> None:
    items = [{"metadata": {"uid": f"u{i}"}} for i in range(3)]
    w = Watcher("pods", lambda **kw: _Resp(_list_answer(items)), lambda o: None, max_objects=2)
    with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
        w._list()
        assert _warnings(caplog) == ["pods watch: over 2 objects on this node; 1 left out (counted)"]
        w._list()
    assert len(_warnings(caplog)) == 1 and w.dropped == 2
    w2 = Watcher("pods", lambda **kw: _Resp(_list_answer(items[:2])), lambda o: None, max_objects=2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="exporter.k8s.watch"):
        w2._list()
    assert _warnings(caplog) == [] and w2.dropped == 0


def test_stop_waits_for_the_thread_a_bounded_time_and_forgets_it(caplog: pytest.LogCaptureFixture) -> None:
    class Thread:
        def __init__(self) -> None:
            self.joins: list[float | None] = []

        def join(self, timeout: float | None = None) -> None:
            self.joins.append(timeout)

    w = Watcher("pods", lambda **kw: None, lambda o: None, request_timeout=2.5)
    t = Thread()
    w._thread = t  # type: ignore[assignment]
    w.stop()
    assert t.joins == [3.5] and w._thread is None
    w.stop()  # never started, or stopped already: nothing to join
    assert t.joins == [3.5]

    class Broken:
        def shutdown(self) -> None:
            raise OSError("gone")

        def close(self) -> None:
            pass

    w._resp = Broken()
    with caplog.at_level(logging.DEBUG, logger="exporter.k8s.watch"):
        w.stop()
    (rec,) = [r for r in caplog.records if r.name == "exporter.k8s.watch"]
    assert rec.getMessage() == "closing the pods watch failed" and rec.levelno == logging.DEBUG
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], OSError)


def test_an_answer_whose_read_is_not_a_method_is_read_from_its_data() -> None:
    class Odd:
        data = b"xyz"
        read = b"not a method"

    read = _reader(Odd())
    assert read(2) == b"xy" and read(5) == b"z" and read(5) == b""


def test_wait_synced_waits_at_most_its_timeout() -> None:
    """Any positive timeout is waited for (never forever), none is not waited for at all."""
    class Synced:
        def __init__(self) -> None:
            self.waits: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return True

        def is_set(self) -> bool:
            return False

    w = Watcher("pods", lambda **kw: None, lambda o: None)
    w.synced = Synced()  # type: ignore[assignment]
    assert watch.wait_synced(w, 0.5) is True and watch.wait_synced(w, 30) is True
    assert watch.wait_synced(w, 0) is False
    assert w.synced.waits == [0.5, 30]  # type: ignore[attr-defined]
    real = Watcher("pods", lambda **kw: None, lambda o: None)
    assert watch.wait_synced(real, 0) is False and watch.wait_synced(real, 0.01) is False
    real.synced.set()
    assert watch.wait_synced(real, 0) is True and watch.wait_synced(real, 5) is True


def test_import_client_is_the_kubernetes_package_or_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import kubernetes

    from exporter.core.extras import MissingExtra

    assert watch.import_client() is kubernetes and watch.import_client("--per-process") is kubernetes
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(MissingExtra) as err:
        watch.import_client()
    assert str(err.value).startswith("the Kubernetes API needs the kubernetes package, which the 'k8s' extra "
                                     "installs")


def test_the_limit_of_a_value_still_arriving_counts_from_its_start() -> None:
    """Where a value is not whole yet, what counts is the text from its own start: a long first item
    before it in the same read does not count, and one that goes past the limit is named the same way."""
    def item(n: int) -> str:
        return '{"x": "' + "y" * (n - 9) + '"}'

    body = ('{"items": [' + item(30) + ", " + item(40) + "]}").encode()

    def in_33s() -> Any:
        buf = io.BytesIO(body)
        return lambda n: buf.read(33)

    s = _JsonStream(in_33s(), 40)
    assert [len(json.dumps(e)) for k in s.members() for e in s.elements()] == [30, 40]
    s = _JsonStream(_one_byte_at_a_time(('{"items": [' + item(50) + "]}").encode()), 40)
    with pytest.raises(TooLarge) as err:
        for _ in s.members():
            list(s.elements())
    assert str(err.value) == "an object over 40 bytes"


@pytest.mark.parametrize(("text", "message"), [
    ('{1: 2}', "an object key that is not a string"),
    ('{"a": 1 "b": 2}', "expected ',' or '}', got '\"'"),
    ('{"items": [1 2]}', "expected ',' or ']', got '2'"),
    ('[1]', "expected '{' at character 0, got '['"),
    ('{"a" 1}', "expected ':' at character 5, got '1'"),
])
def test_malformed_answers_say_what_is_wrong(text: str, message: str) -> None:
    s = _JsonStream(io.BytesIO(text.encode()).read, 100)
    with pytest.raises(ValueError) as err:
        for key in s.members():
            if key == "items":
                list(s.elements())
            else:
                s.value()
    assert str(err.value) == message


def test_reads_are_bounded_by_the_object_limit() -> None:
    """Each read asks for 64 KiB, or the object limit up to 1 MiB: never the whole answer at once (a list
    of a node's pods is decoded item by item, so memory stays one item plus one read)."""
    for limit, size in ((100, 1 << 16), (100_000, 100_000), (4 << 20, 1 << 20)):
        read, asked = _chunks(b'{"items": []}')
        s = _JsonStream(read, limit)
        assert [list(s.elements()) for k in s.members()] == [[]]
        assert asked and set(asked) == {size}, (limit, asked)

    class DataOnly:  # an answer with its body in ``data`` and no read at all
        data = b"ab"

    read1 = _reader(DataOnly())
    assert read1(1) == b"a" and read1(5) == b"b" and read1(5) == b""
