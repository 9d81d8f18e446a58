"""allocated-idle: a GPU a pod holds for the whole window while it does nothing; its node
annotations and the Event on the Node, through a real Prometheus and the fake API server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler.events import EventRecorder
from tests.fakes.profiler_history import scenario_node, write_allocation, write_openmetrics
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import OpenMetricsWriter, Prometheus

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"
END = float(int(time.time()) - 60)


def test_allocated_idle_annotations_and_one_event(tmp_path: Path, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    hist = [h for h in scenario_node(13, "alloc", END) if h.gpu in ("0", "1")]
    idle, busy = hist[0], hist[1]
    late = next(h for h in scenario_node(14, "alloc2", END) if h.gpu == "0")
    with OpenMetricsWriter(tmp_path / "h.om") as w:
        write_openmetrics(w, [idle, busy, late])
        write_allocation(w, idle, "ml", "notebook-" + "x" * 240)  # held all along, idle: allocated-idle
        write_allocation(w, busy, "ml", "trainer")  # held all along, busy: steady
        write_allocation(w, late, "web", "new", since=END - 600)  # idle, but held only 10 minutes: idle
    with Prometheus(tmp_path / "p", tsdb_blocks_from=tmp_path / "h.om") as prom:
        kubeapi.add_node("alloc")
        kubeapi.add_node("alloc2")
        # Events on (the default), in the namespace --leader-elect-namespace names (with or without --leader-elect)
        prof = make_profiler(prom.url, "--leader-elect-namespace", "gpu-exporter")
        r1 = prof.run_cycle(at=END)
        assert r1.ok, r1.errors
        a = kubeapi.node("alloc")["metadata"]["annotations"]
        assert a[P + "gpu-0.pattern"] == "allocated-idle"
        holder = a[P + "gpu-0.holder"]
        assert holder == "ml/notebook-" + "x" * 240 and len(holder) <= 320
        assert a[P + "gpu-1.pattern"] == "steady" and P + "gpu-1.holder" not in a
        assert a[P + "allocated-idle-gpus"] == "1"
        b = kubeapi.node("alloc2")["metadata"]["annotations"]
        assert b[P + "gpu-0.pattern"] == "idle" and P + "allocated-idle-gpus" not in b

        # a first pattern is a first setting: no Event (issue 35), the annotation records it
        assert kubeapi.objects("events", "gpu-exporter") == []
        # unchanged pattern: no Event, no write
        kubeapi.clear_requests()
        r2 = prof.run_cycle(at=END)
        assert r2.ok and kubeapi.patches() == [] and kubeapi.objects("events") == []
        # a GPU that was idle and turns allocated-idle (after the hysteresis, 2): one Event
        kubeapi.edit_node("alloc", annotations={P + "gpu-0.pattern": "idle"})
        assert prof.run_cycle(at=END).ok and kubeapi.objects("events") == []
        assert prof.run_cycle(at=END).ok
        assert kubeapi.node("alloc")["metadata"]["annotations"][P + "gpu-0.pattern"] == "allocated-idle"
        evs = kubeapi.objects("events", "gpu-exporter")
        assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in evs] == [
            ("Node", "alloc", "GPUAllocatedButIdle")]
        assert "ml/notebook-" in evs[0]["message"] and evs[0]["type"] == "Warning"
        assert prof.run_cycle(at=END).ok and len(kubeapi.objects("events")) == 1
        assert prof.events.counts["created"] == 1 and prof.events.counts["updated"] == 0


def test_events_are_limited_per_node_and_forbidden_is_one_warning(kubeapi: FakeKubeAPI, kube_client: ApiClient,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    rec = EventRecorder(kube_client, "gpu-exporter", burst=3, refill_s=20.0, clock=lambda: now[0])
    got = [rec.record("n0", str(g), "growing", "m") for g in range(5)]
    assert got == ["created"] * 3 + ["dropped"] * 2
    assert [rec.record(f"n{i}", "0", "growing", "m") for i in range(1, 6)] == ["created"] * 5  # other nodes: theirs
    now[0] += 20.0  # one token back for n0
    assert rec.record("n0", "0", "growing", "again") == "updated"  # same change again: count + 1
    ev = next(e for e in kubeapi.objects("events") if e["involvedObject"]["name"] == "n0"
              and e["message"] == "again")
    assert ev["count"] == 2
    assert {r.verb for r in kubeapi.requests} <= {"create", "patch"}
    now[0] += 60.0
    kubeapi.inject("POST", "events", 403, times=5)
    with caplog.at_level("WARNING", logger="exporter.profiler.events"):
        assert [rec.record(f"m{i}", "0", "growing", "m") for i in range(3)] == ["failed", "dropped", "dropped"]
    assert len([r for r in caplog.records if "forbidden" in r.getMessage()]) == 1


def test_hostile_uuid_and_holders_never_reach_the_node(tmp_path: Path, kubeapi: FakeKubeAPI,
                                                       make_profiler: Any) -> None:
    """Issue 26: a 64 KiB uuid with newlines and terminal escapes, and holders with control
    characters, were written to the Node verbatim. Now each is skipped and counted."""
    import dataclasses

    from prometheus_client.parser import text_string_to_metric_families

    hostile_uuid = "GPU-1\nforged: yes\x1b[31m" + "x" * 65536
    hist = [h for h in scenario_node(13, "hostile", END) if h.gpu in ("0", "1")]
    idle = dataclasses.replace(hist[0], uuid=hostile_uuid)
    other = hist[1]
    with OpenMetricsWriter(tmp_path / "h.om") as w:
        write_openmetrics(w, [idle, other])
        write_allocation(w, idle, "ml", "note\x07book")  # a bell in a pod name: not a Kubernetes name
        write_allocation(w, idle, "ml", "trainer")
        write_allocation(w, idle, "ML", "upper")
    with Prometheus(tmp_path / "p", tsdb_blocks_from=tmp_path / "h.om") as prom:
        kubeapi.add_node("hostile")
        prof = make_profiler(prom.url, "--events", "off")
        r1 = prof.run_cycle(at=END)
        assert r1.ok, r1.errors
        a = kubeapi.node("hostile")["metadata"]["annotations"]
        assert a[P + "gpu-0.pattern"] == "allocated-idle"
        assert P + "gpu-0.uuid" not in a and a[P + "gpu-1.uuid"] == other.uuid
        assert a[P + "gpu-0.holder"] == "ml/trainer"
        assert all(v.isprintable() and len(v) <= 320 for k, v in a.items() if k.startswith(P) and k != P + "owned-keys")
        counted = {s.labels["label"]: s.value for f in text_string_to_metric_families(
            prof.metrics.exposition().decode()) for s in f.samples
            if s.name == "gpu_profiler_label_values_rejected_total"}
        assert counted["uuid"] >= 1 and counted["holder"] >= 2
