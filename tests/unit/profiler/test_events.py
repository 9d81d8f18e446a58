"""The Event budget (issue 35, issue 36): per node, a burst then a slow refill, on a fake clock;
one summary Event per cycle naming those suppressed; no Event for a condition's first setting;
500 nodes failing at once among 10,000 each get their Event within two cycles.

Through the real kubernetes client and the fake API server (tests/harness/kubeapi.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from exporter.profiler import health
from exporter.profiler.annotate import NodeStore
from exporter.profiler.classify import GpuStats
from exporter.profiler.events import BURST, REFILL_S, SUMMARY_REASON, EventRecorder, NodeBudget
from exporter.profiler.loop import CycleResult, Profiler
from exporter.profiler.plan import PlanConfig
from exporter.profiler.prom import PromClient
from exporter.profiler.queries import QueryConfig, Reader
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


def test_500_of_10000_nodes_failing_at_once_each_get_their_event_within_two_cycles(
        kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
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

    reader = Reader(PromClient("http://127.0.0.1:9"), QueryConfig(health=True))  # never asked: the cycle's
    rec = EventRecorder(kube_client, "gpu-exporter")  # write half is driven with what a read gave
    prof = Profiler(reader, NodeStore(kube_client), PlanConfig(hysteresis=2), health=True, events=rec)
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
    assert rec.counts == {"created": 500, "updated": 0, "dropped": 0, "failed": 0}
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
