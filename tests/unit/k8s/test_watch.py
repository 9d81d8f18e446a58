"""exporter/k8s/watch.py: list + watch through the real kubernetes client against the fake API server."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from exporter.k8s.watch import Backoff, Watcher, no_retries
from tests.harness.clock import FakeClock
from tests.harness.httpfake import JSON, FakeHTTP, Reply, Request, json_reply
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until


class _Seen:
    def __init__(self) -> None:
        self.last: Mapping[str, Any] = {}
        self.calls = 0

    def __call__(self, objects: Mapping[str, Any]) -> None:
        self.last = objects
        self.calls += 1

    def names(self) -> set[str]:
        return {o["metadata"]["name"] for o in self.last.values()}


@pytest.fixture
def seen() -> _Seen:
    return _Seen()


@pytest.fixture
def watcher(kube_client: ApiClient, seen: _Seen) -> Iterator[Watcher]:
    w = Watcher("pods", CoreV1Api(kube_client).list_pod_for_all_namespaces, seen,
                field_selector="spec.nodeName=node-1", timeout_seconds=2, request_timeout=5, max_backoff=0.2)
    yield w
    w.stop()


def test_lists_then_follows_changes_on_this_node_only(kubeapi: FakeKubeAPI, watcher: Watcher, seen: _Seen) -> None:
    kubeapi.add_pod("a", node="node-1")
    kubeapi.add_pod("other-node", node="node-2")
    watcher.start()
    wait_until(lambda: seen.names() == {"a"}, what="the list")
    kubeapi.add_pod("b", node="node-1")
    kubeapi.add_pod("c", node="node-2")
    wait_until(lambda: seen.names() == {"a", "b"}, what="ADDED through the watch")
    kubeapi.delete_pod("default", "a")
    wait_until(lambda: seen.names() == {"b"}, what="DELETED through the watch")
    assert watcher.lists == 1  # followed by the watch, not by listing again
    verbs = {(r.verb, r.query.get("fieldSelector")) for r in kubeapi.requests if r.resource == "pods"}
    assert verbs <= {("list", "spec.nodeName=node-1"), ("watch", "spec.nodeName=node-1")}
    assert ("watch", "spec.nodeName=node-1") in verbs


def test_resumes_after_the_watch_times_out_without_listing_again(kubeapi: FakeKubeAPI, watcher: Watcher,
                                                                  seen: _Seen) -> None:
    kubeapi.add_pod("early", node="node-2")  # the list's resourceVersion is then above 0
    watcher.start()
    wait_until(lambda: watcher.synced.is_set(), what="the list")
    wait_until(lambda: sum(1 for r in kubeapi.requests if r.verb == "watch") >= 2, timeout=15,
               what="a second watch after the first one's timeoutSeconds")
    kubeapi.add_pod("late", node="node-1")
    wait_until(lambda: seen.names() == {"late"}, what="the resumed watch")
    assert watcher.lists == 1
    second = [r for r in kubeapi.requests if r.verb == "watch"][1]
    assert second.query.get("resourceVersion") not in (None, "", "0")


def test_410_expired_lists_again(kubeapi: FakeKubeAPI, watcher: Watcher, seen: _Seen) -> None:
    kubeapi.add_pod("a", node="node-1")
    watcher.start()
    wait_until(lambda: seen.names() == {"a"})
    kubeapi.expire_watches()  # ends the watch; resuming from the old version gets 410
    kubeapi.add_pod("b", node="node-1")
    wait_until(lambda: watcher.lists >= 2, what="a new list after 410 Expired")
    wait_until(lambda: seen.names() == {"a", "b"})
    assert watcher.relists >= 1


def test_forbidden_is_retried_and_the_last_objects_are_kept(kubeapi: FakeKubeAPI, watcher: Watcher, seen: _Seen,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.inject("GET", r"^/api/v1/pods$", 403, times=2)
    kubeapi.add_pod("a", node="node-1")
    watcher.start()
    wait_until(lambda: seen.names() == {"a"}, what="recovery after two 403 answers")
    assert watcher.errors == 2
    assert "needs get, list and watch on pods" in caplog.text


# --- issue 36 item 3: every watch failure backs off as client-go's reflector does --------------------------------


def _pod(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "5"}}


def _scripted(watch_reply: Callable[[Request], Reply]) -> FakeHTTP:
    """An API server whose list is one pod and whose every watch answers ``watch_reply``."""

    def answer(req: Request) -> Reply:
        if "watch=true" in req.path or "watch=True" in req.path:
            return watch_reply(req)
        return json_reply({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"},
                           "items": [_pod("a", "u-a")]})

    return FakeHTTP(answer)


def _client(url: str) -> CoreV1Api:
    cfg = Configuration()
    cfg.host = url
    return CoreV1Api(no_retries(ApiClient(cfg)))  # as serve/main.py builds it


def _status_line(code: int, reason: str) -> bytes:
    return json.dumps({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                   "reason": reason, "code": code, "message": reason}}).encode() + b"\n"


FAILURES: dict[str, Callable[[Request], Reply]] = {
    "410 Expired": lambda r: Reply(200, _status_line(410, "Expired"), JSON),
    "429 Retry-After": lambda r: json_reply({"kind": "Status", "code": 429}, 429, {**JSON, "Retry-After": "7"}),
    "500": lambda r: json_reply({"kind": "Status", "code": 500}, 500),
    "closed stream": lambda r: Reply(200, b"", JSON),
    "garbage line": lambda r: Reply(200, b"{not json\n", JSON),
    "not an object": lambda r: Reply(200, b"[1, 2]\n", JSON),
    "endless line": lambda r: Reply(200, b"x" * 70_000, JSON),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_every_watch_failure_backs_off_exponentially_with_jitter_and_a_cap(kind: str,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Before: a watch answering 410 every time was listed again at once, 317-375 times a second, nothing
    counted or logged. Now each failure of any kind waits client-go's backoff (0.8 s doubling, jitter up to
    as much again, capped), counts the relist and the error, and logs one line for the whole outage."""
    clock = FakeClock(park_after=12)
    seen = _Seen()
    rand = iter([0.0, 1.0, 0.5] * 10)
    with _scripted(FAILURES[kind]) as server:
        w = Watcher("pods", _client(server.url).list_pod_for_all_namespaces, seen, timeout_seconds=5,
                    request_timeout=5, max_backoff=30.0, clock=clock, max_object_bytes=65536,
                    backoff=Backoff(initial=0.8, cap=30.0, clock=clock, rand=lambda: next(rand)))
        with caplog.at_level(logging.DEBUG, logger="exporter.k8s.watch"):
            w.start()
            try:
                assert clock.parked.wait(30), f"{len(clock.waits)} waits"
            finally:
                w.stop()
    assert seen.names() == {"a"}  # the last known pods are kept
    floor = 7.0 if kind == "429 Retry-After" else 0.0
    base = [min(30.0, 0.8 * 2 ** i) for i in range(12)]
    jitter = [0.0, 1.0, 0.5] * 4
    want = [min(30.0, max(b * (1 + j), floor)) for b, j in zip(base, jitter, strict=True)]
    assert clock.waits == pytest.approx(want)
    assert max(clock.waits) == 30.0  # the cap holds, jitter included
    assert w.relists == 11 and w.lists == 12
    assert w.errors + w.expired == 12
    assert (w.expired == 12) == (kind == "410 Expired")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    values = {m.name: {s.labels["resource"]: s.value for s in m.samples} for m in w.families()}
    assert values == {"gpu_exporter_watch_relists": {"pods": 11.0}, "gpu_exporter_watch_errors": {"pods": 12.0}}


def test_the_backoff_starts_again_after_a_quiet_spell() -> None:
    clock = FakeClock()
    b = Backoff(initial=0.8, cap=30.0, reset_after=120.0, clock=clock, rand=lambda: 0.0)
    assert [b.next() for _ in range(3)] == pytest.approx([0.8, 1.6, 3.2])
    clock.now += 119.0
    assert b.next() == pytest.approx(6.4)  # still the same outage
    clock.now += 6.4 + 121.0
    assert b.next() == pytest.approx(0.8)
    assert b.next(floor=1e9) == 30.0  # a Retry-After is honoured up to the cap


def test_a_relist_after_410_drops_what_was_deleted_in_the_gap(kubeapi: FakeKubeAPI, kube_client: ApiClient,
                                                              seen: _Seen) -> None:
    """Survivor of issue 36: the relist must replace the set, not merge into it."""
    kubeapi.add_pod("a", node="node-1")
    kubeapi.add_pod("b", node="node-1")
    clock = FakeClock()
    w = Watcher("pods", CoreV1Api(kube_client).list_pod_for_all_namespaces, seen,
                field_selector="spec.nodeName=node-1", timeout_seconds=30, request_timeout=5, clock=clock)
    w.start()
    try:
        wait_until(lambda: seen.names() == {"a", "b"}, what="the list")
        wait_until(lambda: any(r.verb == "watch" for r in kubeapi.requests), what="the watch")
        with kubeapi._lock:  # a gap: the watch ends and b goes while nobody watches (no event for it is served)
            kubeapi._compacted = kubeapi._rv + 10
            kubeapi._changed.notify_all()
        kubeapi.delete_pod("default", "b")
        kubeapi.expire_watches()
        wait_until(lambda: w.lists >= 2, what="a list again after 410")
        wait_until(lambda: seen.names() == {"a"}, what="b gone after the relist")
    finally:
        w.stop()
