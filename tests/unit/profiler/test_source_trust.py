"""Issue 36 item 1: a node name set by the scraped target is never trusted over the scrape's.

Any pod Prometheus scrapes can publish ``DCGM_FI_*{Hostname="<victim>"}`` (or AMD's ``hostname``,
or our ``gpu_host_info{node}``). Before, ``sources.dcgm`` read ``Hostname`` before the scrape's
``node`` label, so a tenant's series marked another Node ``GPUHealthy=False`` (CriticalXID "GPU 7")
and annotated phantom GPUs on it. Now the scrape's label wins wherever the scrape sets one; a
target's label is read only without it, and only from the exporters' own jobs and namespaces
(``--source-job``, ``--source-namespace``). A real Prometheus holds every attack at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler import classify, health, sources
from exporter.profiler.prom import PromClient
from exporter.profiler.queries import QueryConfig, Reader
from tests.fakes.profiler_history import (
    make_history,
    mem_constant,
    periodic_shape,
    sample_times,
    steady_shape,
    write_amd,
    write_dcgm,
    write_openmetrics,
)
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import OpenMetricsWriter, Prometheus

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)
TS = sample_times(END, 2100, 15)
TENANT = {"job": "kubernetes-pods", "instance": "10.0.0.9:8080"}


def _gpu(node: str, gpu: str) -> Any:
    return make_history(3, node, gpu, "steady", "steady", TS, steady_shape(0.6, 0.02), mem_constant(0.5))


class _Relabel:
    """Writes what a scrape made of an exporter's series: ``extra`` labels set (or overridden) by the scrape."""

    def __init__(self, writer: OpenMetricsWriter, extra: dict[str, str], drop: tuple[str, ...] = ()) -> None:
        self.writer, self.extra, self.drop = writer, extra, drop

    def add(self, name: str, labels: dict[str, str], points: list) -> None:
        labels = {k: v for k, v in {**labels, **self.extra}.items() if k not in self.drop}
        self.writer.add(name, labels, points)


def _xid(w: object, labels: dict[str, str]) -> None:
    w.add("DCGM_FI_DEV_XID_ERRORS", labels, [(t, 79.0 if t > END - 900 else 0.0) for t in TS])  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("trust-prom")
    path = tmp / "h.om"
    with OpenMetricsWriter(path) as w:
        # the victim's own dcgm-exporter, scraped by a config that sets node: GPU 0 only, healthy
        write_dcgm(_Relabel(w, {"node": "victim-node", "namespace": "gpu-operator"}), [_gpu("victim-node", "0")])
        # A: a tenant pod on tenant-node claims Hostname=victim-node; the scrape says node=tenant-node
        write_dcgm(_Relabel(w, {"node": "tenant-node", **TENANT}), [_gpu("victim-node", "7")])
        _xid(w, {"gpu": "7", "UUID": _gpu("victim-node", "7").uuid, "Hostname": "victim-node", "node": "tenant-node",
                 **TENANT})
        # B: a scrape that sets no node label, a shared job
        write_dcgm(_Relabel(w, TENANT), [_gpu("victim-node", "6")])
        _xid(w, {"gpu": "6", "UUID": _gpu("victim-node", "6").uuid, "Hostname": "victim-node", **TENANT})
        # C: the exporter's job name, from the tenant's own namespace (its own ServiceMonitor)
        write_dcgm(_Relabel(w, {"job": "dcgm-exporter", "namespace": "tenant-a"}), [_gpu("victim-node", "5")])
        # D, E: AMD's hostname, under a scrape node label and without one
        write_amd(_Relabel(w, {"node": "tenant-node", **TENANT}), [_gpu("victim-node", "4")])
        write_amd(_Relabel(w, {"job": "amd-metrics-exporter", "namespace": "tenant-a"}), [_gpu("victim-node", "3")])
        # F: our series without a node label, joined to a gpu_host_info{node=victim-node} the tenant serves
        write_openmetrics(_Relabel(w, {"job": "tenant-job", "namespace": "tenant-a", "instance": "victim-node:9400"}),
                          [_gpu("victim-node", "2")], node_label=False)
        # trusted ones without a scrape node label still work: dcgm's own job, our own job
        write_dcgm(w, [_gpu("legacy-node", "0")])
        write_openmetrics(w, [_gpu("joined-node", "0")], node_label=False)
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


def _gpus(prom: Prometheus, source: str, **kw: object) -> set[tuple[str, str]]:
    return set(Reader(PromClient(prom.url), QueryConfig(source=source, **kw)).read(END).gpus)  # type: ignore[arg-type]


def test_the_scrapes_node_label_wins_and_untrusted_target_labels_are_not_read(prom: Prometheus) -> None:
    dcgm = _gpus(prom, "dcgm")
    assert {g for n, g in dcgm if n == "victim-node"} == {"0"}
    assert ("tenant-node", "7") in dcgm and ("legacy-node", "0") in dcgm
    amd = _gpus(prom, "amd")
    assert {g for n, g in amd if n == "victim-node"} == set() and ("tenant-node", "4") in amd
    ours = _gpus(prom, "gpu-exporter")
    assert ("joined-node", "0") in ours and not {g for n, g in ours if n == "victim-node"}
    auto = _gpus(prom, "auto")
    assert {g for n, g in auto if n == "victim-node"} == {"0"}


def test_the_trusted_jobs_and_namespaces_are_a_setting(prom: Prometheus) -> None:
    wide = sources.Trust(job=".+", namespace=".*")
    assert {g for n, g in _gpus(prom, "dcgm", trust=wide) if n == "victim-node"} == {"0", "5", "6"}
    tenant_a = sources.Trust(job="dcgm-exporter", namespace="tenant-a")
    assert {g for n, g in _gpus(prom, "dcgm", trust=tenant_a) if n == "victim-node"} == {"0", "5"}
    # the scrape's label is read whatever the setting: node=tenant-node is never the victim's
    assert ("tenant-node", "7") in _gpus(prom, "dcgm", trust=wide)


def test_a_tenant_cannot_set_another_nodes_gpuhealthy(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                       make_profiler: Any) -> None:
    for n in ("victim-node", "tenant-node", "legacy-node", "joined-node"):
        kubeapi.add_node(n)
    res = make_profiler(prom.url, "--source", "auto", "--events", "off").run_cycle(at=END)
    assert res.ok, res.errors
    victim = kubeapi.node("victim-node")
    cond = {c["type"]: c for c in victim.get("status", {}).get("conditions", [])}
    assert cond[health.CONDITION]["status"] == "True", cond
    assert not any(k.startswith("gpu-exporter.io/gpu-") and k.split("/gpu-")[1].split(".")[0] != "0"
                   for k in victim["metadata"].get("annotations", {})), victim["metadata"].get("annotations")
    tenant = {c["type"]: c for c in kubeapi.node("tenant-node").get("status", {}).get("conditions", [])}
    assert tenant[health.CONDITION]["status"] == "False"  # its own node: what its scrape says it is


def test_trust_settings_are_checked() -> None:
    from exporter.platform.errors import ConfigError
    from exporter.profiler.main import parse_args

    s = parse_args(["--prometheus-url", "http://p:9090", "--source-job", "dcgm", "--source-namespace", "gpu"])
    assert s.query.trust == sources.Trust("dcgm", "gpu")
    assert parse_args(["--prometheus-url", "http://p:9090"]).query.trust == sources.Trust()
    for flag, bad in (("--source-job", "a("), ("--source-namespace", "a`b"), ("--source-job", "a\nb")):
        with pytest.raises(ConfigError, match=flag):
            parse_args(["--prometheus-url", "http://p:9090", flag, bad])


@pytest.fixture(scope="module")
def ranges_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Busy GPUs whose ranges the profiler reads by UUID, and a tenant's series that copy their UUIDs."""
    tmp = tmp_path_factory.mktemp("trust-ranges")
    path = tmp / "h.om"
    periodic = periodic_shape("square", 240.0, 0.02, high=0.9, low=0.1, duty=0.5)
    dcgm_gpu = make_history(5, "victim-node", "1", "periodic", "periodic", TS, periodic, mem_constant(0.5))
    ours_gpu = make_history(5, "victim-ours", "1", "periodic", "periodic", TS, periodic, mem_constant(0.5))
    flat = [(t, 1.0) for t in TS]
    with OpenMetricsWriter(path) as w:
        write_dcgm(_Relabel(w, {"node": "victim-node", "namespace": "gpu-operator"}), [dcgm_gpu])
        # the tenant's copy of the victim's GPU: its Hostname and UUID, no scrape node label, a shared job
        w.add("DCGM_FI_DEV_GPU_UTIL", {"gpu": "1", "UUID": dcgm_gpu.uuid, "Hostname": "victim-node", **TENANT},
              [(t, 100.0 * v) for t, v in flat])
        write_openmetrics(w, [ours_gpu])
        # ours: the victim's UUID on a series without the node label, from the tenant's own instance
        w.add("gpu_utilization_ratio", {"gpu": "1", "uuid": ours_gpu.uuid, **TENANT}, flat)
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


@pytest.mark.parametrize(("source", "node"), [("dcgm", "victim-node"), ("gpu-exporter", "victim-ours")])
def test_a_tenant_cannot_fold_its_series_into_another_gpus_range(ranges_prom: Prometheus, source: str,
                                                                  node: str) -> None:
    # the range queries select by UUID: a series that copies it must meet the aggregates' rule (the scrape's
    # node label, or a target's from the trusted jobs), or its points (max-folded) flatten the victim's cycle
    snap = Reader(PromClient(ranges_prom.url), QueryConfig(source=source)).read(END)
    st = snap.gpus[(node, "1")]
    assert st.util_range is not None
    assert max(v for v in st.util_range if v is not None) < 0.99  # 0.9 and noise; the tenant's is 1.0
    assert classify.classify_gpu(st).pattern == classify.PERIODIC
