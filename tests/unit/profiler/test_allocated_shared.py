"""allocated-idle on shared GPUs (time-slicing, MPS) and on DRA-allocated ones (the same pod labels):
a shared GPU is allocated-idle only when every holder is idle. The real profiler reads a real
Prometheus fed with exporter-shaped series, per-pod readings (--per-process) included."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fakes.profiler_history import GpuHistory, scenario_node, write_openmetrics
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import OpenMetricsWriter, Prometheus

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"
END = float(int(time.time()) - 60)


def share(w: OpenMetricsWriter, h: GpuHistory, holders: dict[str, float | None], resource: str) -> None:
    """``gpu_allocation_info`` of a GPU shared by ``holders`` ("namespace/pod") all window, each with
    its per-pod utilisation (``gpu_pod_utilization_ratio``; None: no per-pod reading)."""
    for i, (holder, util) in enumerate(sorted(holders.items())):
        ns, pod = holder.split("/")
        base = {"gpu": h.gpu, "uuid": h.uuid, "instance": f"{h.node}:9400", "job": "gpu-exporter", "node": h.node,
                "namespace": ns, "pod": pod, "container": "main"}
        device = f"{h.uuid}::{i}" if resource.startswith("nvidia.com/") else f"gpu-{h.gpu}"
        w.add("gpu_allocation_info", {**base, "resource": resource, "device": device, "shared": str(len(holders))},
              [(t, 1.0) for t in h.times])
        if util is not None:
            w.add("gpu_pod_utilization_ratio", base, [(t, util) for t in h.times])


def test_shared_gpu_is_allocated_idle_only_when_every_holder_is(tmp_path: Path, kubeapi: FakeKubeAPI,
                                                                make_profiler: Any) -> None:
    hist = {h.gpu: h for h in scenario_node(21, "shared", END)}
    idle, busy = hist["0"], hist["1"]  # idle all window; steady at 0.7
    dra = next(h for h in scenario_node(22, "dra", END) if h.gpu == "0")  # idle, DRA-allocated
    with OpenMetricsWriter(tmp_path / "h.om") as w:
        write_openmetrics(w, [idle, busy, dra])
        share(w, idle, {"ml/a": 0.0, "ml/b": 0.01}, "nvidia.com/gpu.shared")  # both idle: allocated-idle
        share(w, busy, {"ml/c": 0.7, "ml/d": 0.0}, "nvidia.com/gpu.shared")  # d idle, c not: not allocated-idle
        share(w, dra, {"web/x": None, "web/y": None}, "gpu.nvidia.com")  # DRA claims, no per-pod reading
    with Prometheus(tmp_path / "p", tsdb_blocks_from=tmp_path / "h.om") as prom:
        kubeapi.add_node("shared")
        kubeapi.add_node("dra")
        prof = make_profiler(prom.url, "--events", "off")
        r = prof.run_cycle(at=END)
        assert r.ok, r.errors
        a = kubeapi.node("shared")["metadata"]["annotations"]
        assert a[P + "gpu-0.pattern"] == "allocated-idle"
        assert a[P + "gpu-0.holder"] == "ml/a,ml/b"  # every holder named
        assert a[P + "gpu-1.pattern"] == "steady" and P + "gpu-1.holder" not in a
        assert a[P + "allocated-idle-gpus"] == "1"
        d = kubeapi.node("dra")["metadata"]["annotations"]
        assert d[P + "gpu-0.pattern"] == "allocated-idle" and d[P + "gpu-0.holder"] == "web/x,web/y"
