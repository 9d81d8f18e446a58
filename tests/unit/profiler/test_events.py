"""The Event budget (issue 35, issue 36): per node, a burst then a slow refill, on a fake clock;
one summary Event per cycle naming those suppressed; no Event for a condition's first setting;
500 nodes failing at once among 10,000 each get their Event within two cycles.

Through the real kubernetes client and the fake API server (tests/harness/kubeapi.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler import health
from exporter.profiler.classify import GpuStats
from exporter.profiler.events import BURST, REFILL_S, SUMMARY_REASON, EventRecorder, NodeBudget
from exporter.profiler.loop import CycleResult
from exporter.profiler.plan import PlanConfig
from tests.harness.kubeapi import FakeKubeAPI

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


def test_defaults_are_client_gos_spam_filter() -> None:
    # k8s.io/client-go tools/record/events_cache.go: defaultSpamBurst = 25, defaultSpamQPS = 1/300
    assert (BURST, REFILL_S) == (25, 300.0)


def test_budget_refills_at_its_stated_rate_on_a_fake_clock() -> None:
    """Issue 36: the earlier test never moved the clock. Every step below is exact: a refill a
    little slower or faster, a bucket that overfills or is shared between nodes fails it."""
    now = [1000.0]
    b = NodeBudget(burst=3, refill_s=300.0, clock=lambda: now[0])
    assert [b.take("a") for _ in range(4)] == [True, True, True, False]
    assert b.take("b")  # another node's budget is its own
    now[0] += 299.0
    assert not b.take("a")  # 299 s: not yet one token
    now[0] += 1.0
    assert b.take("a") and not b.take("a")  # 300 s after the burst: exactly one
    now[0] += 150.0
    assert b.tokens("a") == pytest.approx(0.5)
    assert not b.take("a")  # half a token is not one, and a refused take spends nothing
    now[0] += 150.0
    assert b.take("a")
    now[0] += 10 * 300.0  # ten intervals: full again, never more than the burst
    assert b.tokens("a") == pytest.approx(3.0)
    assert [b.take("a") for _ in range(4)] == [True, True, True, False]
    now[0] += 600.0
    assert b.tokens("a") == pytest.approx(2.0)


def test_full_buckets_are_forgotten() -> None:
    now = [0.0]
    b = NodeBudget(burst=2, refill_s=10.0, clock=lambda: now[0])
    for i in range(100):
        b.take(f"n{i}")
    b.take("n0")
    assert len(b) == 100
    now[0] += 10.0  # every node but n0 is full again
    b.forget_full()
    assert len(b) == 1 and b.tokens("n0") == pytest.approx(1.0)
    now[0] += 10.0
    b.forget_full()
    assert len(b) == 0


def test_bad_budget_is_refused() -> None:
    for burst, refill in ((0, 1.0), (1, 0.0), (1, float("nan"))):
        with pytest.raises(ValueError):
            NodeBudget(burst, refill)


def test_one_summary_event_per_cycle_names_the_suppressed(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    now = [0.0]
    rec = EventRecorder(kube_client, "gpu-exporter", burst=2, refill_s=300.0, clock=lambda: now[0],
                        summary_object={"apiVersion": "v1", "kind": "Pod", "namespace": "gpu-exporter",
                                        "name": "profiler-0"})
    for status in ("False", "True", "False", "True", "False"):  # a flapping node: 2 through, 3 suppressed
        rec.record_condition("flappy", status, "GPULost" if status == "False" else "AllGPUsHealthy", status)
    rec.record_condition("steady", "False", "GPULost", "m")
    rec.record("other", "0", "growing", "m")
    rec.record("other", "1", "growing", "m")
    rec.record("other", "2", "growing", "m")  # suppressed: other's third
    assert rec.counts["dropped"] == 4
    assert rec.end_cycle() == "created"
    summaries = [e for e in kubeapi.objects("events", "gpu-exporter") if e["reason"] == SUMMARY_REASON]
    assert len(summaries) == 1
    s = summaries[0]
    assert s["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "gpu-exporter",
                                   "name": "profiler-0"}
    assert s["message"].startswith("4 Events suppressed this cycle on 2 nodes") and "flappy, other" in s["message"]
    assert rec.end_cycle() is None  # nothing suppressed since: no summary
    for status in ("False", "True"):
        rec.record_condition("flappy", status, "x", "m")  # still over budget (no time passed)
    assert rec.end_cycle() == "updated"  # the same summary Event, its count raised
    s = next(e for e in kubeapi.objects("events", "gpu-exporter") if e["reason"] == SUMMARY_REASON)
    assert s["count"] == 2 and s["message"].startswith("2 Events suppressed this cycle on 1 node ")


def _healthy(n: int) -> dict[str, GpuStats]:
    return {str(g): GpuStats(node="", gpu=str(g), up=1.0) for g in range(n)}


@pytest.mark.slow  # 10,000 nodes, two cycles: seconds; make test runs it
def test_500_of_10000_nodes_failing_at_once_each_get_their_event_within_two_cycles(
        kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    """Issue 35: the global 30 per minute let 30 of 500 through a cycle. Now every failing node
    gets its Event in the cycle that writes its transition (the second: --hysteresis 2), and
    nothing else records one."""
    gpus = 8
    cond = {"type": "GPUHealthy", "status": "True", "reason": health.HEALTHY, "message": f"{gpus} GPUs healthy",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
    names = [f"node-{i:05d}" for i in range(10000)]
    for n in names:
        kubeapi.add_node(n, conditions=[cond])
    failing = set(names[7::20])
    assert len(failing) == 500
    healthy = health.observe(_healthy(gpus))
    assert healthy.message == cond["message"]
    sick = _healthy(gpus)
    sick["3"] = GpuStats(node="", gpu="3", up=0.0)
    lost = health.observe(sick)
    observed = {n: lost if n in failing else healthy for n in names}

    # Prometheus is never asked: the cycle's write half is driven with what a read gave
    prof = make_profiler("http://127.0.0.1:9", "--hysteresis", "2", "--leader-elect-namespace", "gpu-exporter")
    t0 = time.monotonic()
    for cycle in (1, 2):
        res = CycleResult()
        prof._apply(prof._nodes(set(names), res), {}, res, observed)
        assert res.ok, res.errors
        evs = kubeapi.objects("events", "gpu-exporter")
        if cycle == 1:
            assert res.status_writes == 0 and evs == []  # seen once: the candidate waits in the annotations
    assert res.status_writes == 500
    assert sorted(e["involvedObject"]["name"] for e in evs) == sorted(failing)
    assert {(e["reason"], e["type"]) for e in evs} == {("GPUHealthyFalse", "Warning")}
    assert prof.events.counts == {"created": 500, "updated": 0, "dropped": 0, "failed": 0}
    assert not [e for e in evs if e["reason"] == SUMMARY_REASON]
    assert time.monotonic() - t0 < 600  # generous: two cycles over 10,000 nodes on a loaded 2-core machine


def test_budget_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.platform.errors import ConfigError as UsageError
    from exporter.profiler.main import parse_args

    base = ["--prometheus-url", "http://127.0.0.1:9"]
    s = parse_args(base)
    assert (s.events_burst, s.events_refill_s) == (25, 300.0)
    s = parse_args([*base, "--events-burst", "3", "--events-refill", "90s"])
    assert (s.events_burst, s.events_refill_s) == (3, 90.0)
    for bad in (["--events-burst", "0"], ["--events-refill", "0s"], ["--events-refill", "soon"]):
        with pytest.raises(UsageError):
            parse_args([*base, *bad])
    # the fleet-wide limit it replaces is refused, never accepted and ignored: flag and environment
    with pytest.raises(UsageError, match=r"\(--events-per-minute\) = '30': removed; Events are now limited per node"):
        parse_args([*base, "--events-per-minute", "30"])
    monkeypatch.setenv("PROFILER_EVENTS_PER_MINUTE", "30")
    with pytest.raises(UsageError, match="removed"):
        parse_args(base)


def test_the_event_bodies_exactly(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """What reaches the API server, field by field: the Node Events, their count patches, the summary."""
    import re

    rec = EventRecorder(kube_client, "gpu-exporter", burst=1, refill_s=3600.0, clock=lambda: 0.0)
    assert rec.timeout == 5.0 and rec.counts == {"created": 0, "updated": 0, "dropped": 0, "failed": 0}
    assert rec.summary_object == {"apiVersion": "v1", "kind": "Namespace", "name": "gpu-exporter",
                                  "uid": "gpu-exporter"}
    assert (rec.budget.burst, rec.budget.refill_s) == (1.0, 3600.0)
    assert rec.record("n1", "3", "growing", "m" * 2000) == "created"
    assert rec.record("n1", "3", "nope", "x") == "dropped"  # not a pattern with an Event
    assert rec.record_condition("n2", "True", "AllGPUsHealthy", "ok") == "created"
    posts = [r for r in kubeapi.requests if r.method == "POST"]
    assert [r.path for r in posts] == ["/api/v1/namespaces/gpu-exporter/events"] * 2
    a, b = (r.body for r in posts)
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|\+00:00)\Z")  # UTC, as the client sends it
    assert stamp.match(a["firstTimestamp"]) and a["firstTimestamp"] == a["lastTimestamp"]
    assert {k: v for k, v in a.items() if k not in ("firstTimestamp", "lastTimestamp")} == {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": a["metadata"]["name"], "namespace": "gpu-exporter"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"},
        "reason": "GPUMemoryGrowing", "message": "m" * 1024, "type": "Warning",
        "source": {"component": "gpu-exporter-profiler"}, "reportingComponent": "gpu-exporter-profiler",
        "count": 1}
    assert re.fullmatch(r"n1\.[0-9a-f]{16}", a["metadata"]["name"])
    assert (b["reason"], b["type"], b["message"], b["involvedObject"]["name"]) == (
        "GPUHealthyTrue", "Normal", "ok", "n2")
    assert a["metadata"]["name"] != b["metadata"]["name"]
    # the same Event again (another process would not know it): 409, then a patch of count and message
    rec2 = EventRecorder(kube_client, "gpu-exporter", burst=5, refill_s=1.0, clock=lambda: 0.0)
    kubeapi.clear_requests()
    assert rec2.record("n1", "3", "growing", "again") == "updated"
    assert rec2.record("n1", "3", "growing", "third") == "updated"
    patches = [r for r in kubeapi.requests if r.method == "PATCH"]
    assert [r.path for r in patches] == [f"/api/v1/namespaces/gpu-exporter/events/{a['metadata']['name']}"] * 2
    assert [(r.body["count"], r.body["message"]) for r in patches] == [(2, "again"), (3, "third")]
    assert all(stamp.match(r.body["lastTimestamp"]) and set(r.body) == {"count", "lastTimestamp", "message"}
               for r in patches)
    ev = next(e for e in kubeapi.objects("events") if e["metadata"]["name"] == a["metadata"]["name"])
    assert (ev["count"], ev["message"]) == (3, "third")
    assert rec2.counts == {"created": 0, "updated": 2, "dropped": 0, "failed": 0}
    # the summary: on the object given, one line
    assert rec.record_condition("n2", "False", "GPULost", "x") == "dropped"
    assert rec.end_cycle() == "created"
    (s,) = [e for e in kubeapi.objects("events") if e["reason"] == SUMMARY_REASON]
    assert s["involvedObject"] == {"apiVersion": "v1", "kind": "Namespace", "name": "gpu-exporter",
                                   "uid": "gpu-exporter"}
    assert s["type"] == "Warning" and s["message"] == (
        "1 Event suppressed this cycle on 1 node over their budget (1 at once, then one every 3600s per node): n2")
    many = EventRecorder(kube_client, "gpu-exporter", burst=1, refill_s=60.0, clock=lambda: 0.0)
    for i in range(12):
        many.record_condition(f"node-{i:02d}", "True", "x", "m")
        many.record_condition(f"node-{i:02d}", "False", "y", "m")
    assert many.end_cycle() == "updated"  # the namespace's one summary Event, patched
    (s,) = [e for e in kubeapi.objects("events") if e["reason"] == SUMMARY_REASON]
    assert s["message"].startswith("12 Events suppressed this cycle on 12 nodes")
    assert s["message"].endswith(": node-00, node-01, node-02, node-03, node-04, node-05, node-06, node-07, node-08, "
                                 "node-09 and 2 more")


def test_failures_are_counted_and_logged_once_per_kind(kubeapi: FakeKubeAPI, kube_client: ApiClient,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    rec = EventRecorder(kube_client, "ns-a", burst=100, refill_s=1.0, clock=lambda: 0.0)
    kubeapi.inject("POST", "events", 500, times=1)
    with caplog.at_level("WARNING", logger="exporter.profiler.events"):
        assert rec.record("n1", "0", "growing", "m") == "failed"
        assert rec.record("n1", "0", "growing", "m") == "created"  # a 500 does not stop the Events
        kubeapi.inject("POST", "events", 403, times=1)
        assert rec.record("n2", "0", "growing", "m") == "failed"
        assert rec.record("n3", "0", "growing", "m") == "dropped"  # 403: no more Events from this process
        assert rec.end_cycle() is None  # nor a summary
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("recording an Event failed: ") and "(500)" in m for m in msgs), msgs
    forbidden = [m for m in msgs if "forbidden" in m]
    assert forbidden == ["recording Events is forbidden (RBAC needs create and patch on events in namespace ns-a); "
                         "no more Events from this process"]
    assert rec.counts["failed"] == 2


def test_a_failed_count_patch_is_counted(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    first = EventRecorder(kube_client, "gpu-exporter", clock=lambda: 0.0)
    assert first.record("n1", "0", "growing", "m") == "created"
    again = EventRecorder(kube_client, "gpu-exporter", clock=lambda: 0.0)
    kubeapi.inject("PATCH", "events", 500, times=1)
    assert again.record("n1", "0", "growing", "m") == "failed"
    assert again.counts == {"created": 0, "updated": 0, "dropped": 0, "failed": 1}


def test_full_buckets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import exporter.profiler.events as events

    monkeypatch.setattr(events, "KEEP_FULL", 3)
    b = NodeBudget(burst=5, refill_s=1000.0, clock=lambda: 0.0)
    for i in range(6):
        b.take(f"n{i}")
    b.forget_full()
    assert len(b) == 3 and b.tokens("n5") == pytest.approx(4.0) and b.tokens("n0") == pytest.approx(5.0)
    with pytest.raises(ValueError, match="burst >= 1 and refill_s > 0"):
        NodeBudget(1, -1.0)


def test_names_kinds_and_the_summary_list(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    import hashlib

    rec = EventRecorder(kube_client, "gpu-exporter", burst=10, refill_s=60.0, clock=lambda: 0.0)
    assert rec.record_condition("n1", "False", "GPULost", "down") == "created"
    assert rec.record_condition("n1", "True", "AllGPUsHealthy", "up") == "created"  # another transition, its own
    assert rec.record_condition("n1", "False", "CriticalXID", "xid") == "created"
    evs = {e["reason"] + "/" + e["message"]: e for e in kubeapi.objects("events")}
    assert [(e["type"]) for k, e in sorted(evs.items())] == ["Warning", "Warning", "Normal"]
    long_node = "n" * 250
    assert rec.record(long_node, "0", "growing", "x" * 3000) == "created"
    (ev,) = [e for e in kubeapi.objects("events") if e["involvedObject"]["name"] == long_node]
    digest = hashlib.sha256(f"{long_node}/0/growing".encode()).hexdigest()[:16]
    assert ev["metadata"]["name"] == f"{'n' * 200}.{digest}"
    again = EventRecorder(kube_client, "gpu-exporter", clock=lambda: 0.0)
    kubeapi.clear_requests()
    assert again.record(long_node, "0", "growing", "y" * 3000) == "updated"
    (patch,) = [r for r in kubeapi.requests if r.method == "PATCH"]
    assert patch.body["message"] == "y" * 1024
    for count, tail in ((10, ""), (11, " and 1 more")):
        many = EventRecorder(kube_client, f"ns-{count}", burst=1, refill_s=60.0, clock=lambda: 0.0)
        for i in range(count):
            many.record_condition(f"m{i:02d}", "True", "a", "m")
            many.record_condition(f"m{i:02d}", "False", "b", "m")
        assert many.end_cycle() == "created"
        (s,) = [e for e in kubeapi.objects("events", f"ns-{count}") if e["reason"] == SUMMARY_REASON]
        assert s["message"].endswith(", m09" + tail)
        assert s["metadata"]["name"] == f"ns-{count}." + hashlib.sha256(f"ns-{count}/summary".encode()).hexdigest()[:16]
    with pytest.raises(ValueError, match=r"^an Event budget needs burst >= 1 and refill_s > 0$"):
        NodeBudget(0, 1.0)


def test_a_gpus_first_pattern_records_no_event_a_later_change_does(kubeapi: FakeKubeAPI,
                                                                   make_profiler: Any) -> None:
    """Issue 35, "no Event for a first setting": a GPU's first published pattern is one (its
    annotation records it), so a profiler's first cycle over a fleet records no pattern Event
    (7,992 at 10,000 nodes, most of that cycle's writes, before this); a published pattern that
    later turns growing or allocated-idle records one, after the hysteresis."""
    from exporter.profiler.classify import ALLOCATED_IDLE, GROWING, STEADY, GpuProfile
    from exporter.profiler.plan import GpuInput, plan_node

    cfg = PlanConfig(hysteresis=2)
    uuid = "GPU-00000000-0000-0000-0000-00000000000"
    was = plan_node({}, {"0": GpuInput(uuid + "0", GpuProfile(STEADY))}, cfg)
    kubeapi.add_node("fresh")
    kubeapi.add_node("was-steady", annotations=was)
    now = {"0": GpuInput(uuid + "0", GpuProfile(GROWING, growth_bytes_per_second=1e6)),
           "1": GpuInput(uuid + "1", GpuProfile(ALLOCATED_IDLE, holder="ml/notebook"))}
    inputs = {"fresh": now, "was-steady": now}
    # Prometheus is never asked: the write half only
    prof = make_profiler("http://127.0.0.1:9", "--hysteresis", "2", "--health-condition", "off",
                         "--leader-elect-namespace", "gpu-exporter")
    got = []
    for _ in range(3):
        res = CycleResult()
        prof._apply(prof._nodes(set(inputs), res), inputs, res)
        assert res.ok, res.errors
        got.append(sorted((e["involvedObject"]["name"], e["reason"]) for e in kubeapi.objects("events")))
    a = kubeapi.node("fresh")["metadata"]["annotations"]
    assert (a["gpu-exporter.io/gpu-0.pattern"], a["gpu-exporter.io/gpu-1.pattern"]) == (GROWING, ALLOCATED_IDLE)
    # cycle 1: "fresh" gets both patterns and was-steady its GPU 1 (first settings: no Event), GPU 0 waits;
    # cycle 2: was-steady's GPU 0 turns steady -> growing: its Event; cycle 3: nothing changed
    assert got == [[], [("was-steady", "GPUMemoryGrowing")], [("was-steady", "GPUMemoryGrowing")]]
    assert prof.events.counts == {"created": 1, "updated": 0, "dropped": 0, "failed": 0}
