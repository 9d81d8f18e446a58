"""exporter/k8s/watch.py: list + watch through the real kubernetes client against the fake API server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api

from exporter.k8s.watch import Watcher
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
    assert watcher.errors == 0  # 410 is the protocol, not an outage


def test_forbidden_is_retried_and_the_last_objects_are_kept(kubeapi: FakeKubeAPI, watcher: Watcher, seen: _Seen,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.inject("GET", r"^/api/v1/pods$", 403, times=2)
    kubeapi.add_pod("a", node="node-1")
    watcher.start()
    wait_until(lambda: seen.names() == {"a"}, what="recovery after two 403 answers")
    assert watcher.errors == 2
    assert "needs get, list and watch on pods" in caplog.text
