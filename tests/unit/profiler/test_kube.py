"""Node writes with the real ``kubernetes`` client against the fake API server.

Prometheus is real too (backfilled history ending now, so ``--once`` runs see it): three
nodes of two GPUs each, GPU 0 steady at 70%, GPU 1 idle.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler import loop
from exporter.profiler.annotate import NodeStore
from exporter.profiler.loop import Profiler
from exporter.profiler.main import run
from tests.fakes.profiler_history import idle_shape, make_history, mem_constant, sample_times, steady_shape
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.profiler import build_profiler, history_file
from tests.harness.prom import Prometheus

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"
NODES = ("k-0", "k-1", "k-2")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("profiler-kube")
    end = float(int(time.time()))
    ts = sample_times(end, 2100, 15)
    hist = []
    for n in NODES:
        hist.append(make_history(1, n, "0", "steady", "steady", ts, steady_shape(0.7, 0.02), mem_constant(0.6)))
        hist.append(make_history(1, n, "1", "idle", "idle", ts, idle_shape, mem_constant(0.0)))
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


@pytest.fixture
def kubeconfig(kubeapi: FakeKubeAPI, tmp_path: Path) -> Path:
    """The kubeconfig of ``kubeapi`` (the file ``kube_client`` reads too), for the profiler's own --kubeconfig."""
    return kubeapi.kubeconfig(tmp_path / "kubeconfig")


def _profiler(make_profiler: Any, prom: Prometheus, one_writer: bool = False) -> Profiler:
    """A profiler from the one fixture: no GPUHealthy condition and no Events (only the annotations are written),
    the API server's retries without the real backoff's wait; ``one_writer``: patches one at a time."""
    return make_profiler(prom.url, "--health-condition", "off", "--events", "off",
                         tune={"store.backoff": 0.01, "store.timeout": 5, **({"_writers": None} if one_writer else {})})


def expected_patch(uuid0: str, uuid1: str) -> dict[str, str]:
    return {
        P + "gpu-0.pattern": "steady", P + "gpu-0.uuid": uuid0,
        P + "gpu-1.pattern": "idle", P + "gpu-1.uuid": uuid1,
        P + "pattern": "steady",
        P + "idle-gpus": "1",
        P + "best-gpu": "1",
        P + "best-gpu-score": "1.00",
        P + "owned-keys": "best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern,gpu-0.uuid,gpu-1.pattern,gpu-1.uuid",
    }


def uuids(prom: Prometheus, node: str) -> tuple[str, str]:
    got = {s["metric"]["gpu"]: s["metric"]["uuid"] for s in prom.query(f'gpu_up{{node="{node}"}}')}
    return got["0"], got["1"]


def test_exact_patches_then_no_writes(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    created = {n: kubeapi.add_node(n)["metadata"]["resourceVersion"] for n in NODES}
    prof = _profiler(make_profiler, prom)
    r = prof.run_cycle()
    assert r.ok and r.patches == 3
    for n in NODES:
        (req,) = kubeapi.patches(n)
        assert req.content_type == "application/merge-patch+json"
        want = expected_patch(*uuids(prom, n))
        assert req.body == {"metadata": {"resourceVersion": created[n], "annotations": want}}
        assert kubeapi.node(n)["metadata"]["annotations"] == want
    kubeapi.clear_requests()
    handed = _Handed(prof._writers)
    prof._writers = handed  # type: ignore[assignment]
    r2 = prof.run_cycle()
    assert r2.ok and r2.patches == 0 and r2.unchanged == 3
    assert [(q.method, q.path) for q in kubeapi.requests] == [("GET", "/api/v1/nodes")]
    # nothing to write, nothing handed to the patch threads (at 10,000 nodes the hand-offs took seconds)
    assert handed.nodes == []
    # a node whose annotation someone removed needs a patch: it alone goes to the patch threads
    kubeapi.edit_node("k-1", annotations={P + "gpu-0.pattern": None})
    planned: list[dict[str, str]] = []
    plan_node = loop.plan_node

    def counted(current: dict[str, str], *args: Any) -> dict[str, str]:
        planned.append(current)
        return plan_node(current, *args)

    monkeypatch.setattr(loop, "plan_node", counted)
    r3 = prof.run_cycle()
    assert r3.ok and r3.patches == 1 and r3.unchanged == 2
    assert handed.nodes == ["k-1"]
    assert len(planned) == 3  # each node planned once: the patch thread starts from the cycle's plan
    assert kubeapi.node("k-1")["metadata"]["annotations"] == expected_patch(*uuids(prom, "k-1"))


class _Handed:
    """The profiler's patch thread pool, noting the nodes handed to it."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.nodes: list[str] = []

    def map(self, fn: Any, targets: Any, *more: Any) -> Any:
        targets = list(targets)
        self.nodes += [t[0].name for t in targets]
        return self.pool.map(fn, targets, *more)


def test_foreign_annotations_survive_and_stale_owned_keys_go(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                             make_profiler: Any) -> None:
    foreign = {
        "example.com/owner": "team-a",
        "gpu-exporter.io/comment": "written by a person",
        "other.gpu-exporter.io/pattern": "x",
        "gpu-exporter.io.v0/pattern": "y",
        "nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX512F",
    }
    stale = {P + "gpu-7.pattern": "bursty", P + "gpu-7.uuid": "GPU-gone", P + "pending": "gpu-7.pattern=idle:1",
             P + "owned-keys": "gpu-7.pattern,gpu-7.uuid,pending"}
    kubeapi.add_node("k-0", annotations={**foreign, **stale})
    prof = _profiler(make_profiler, prom)
    assert prof.run_cycle().ok
    (req,) = kubeapi.patches("k-0")
    sent = req.body["metadata"]["annotations"]
    assert {k for k, v in sent.items() if v is None} == {P + "gpu-7.pattern", P + "gpu-7.uuid", P + "pending"}
    assert not set(sent) & set(foreign)
    assert kubeapi.node("k-0")["metadata"]["annotations"] == {**foreign, **expected_patch(*uuids(prom, "k-0"))}


def test_conflict_rereads_and_retries(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    kubeapi.add_node("k-0")
    kubeapi.inject("PATCH", r"/nodes/k-0$", 409, times=1)
    prof = _profiler(make_profiler, prom)
    r = prof.run_cycle()
    assert r.ok and r.patches == 1
    calls = [(q.method, q.path, q.status) for q in kubeapi.requests]
    assert calls == [("GET", "/api/v1/nodes", 200), ("PATCH", "/api/v1/nodes/k-0", 409),
                     ("GET", "/api/v1/nodes/k-0", 200), ("PATCH", "/api/v1/nodes/k-0", 200)]
    assert kubeapi.node("k-0")["metadata"]["annotations"] == expected_patch(*uuids(prom, "k-0"))


def test_real_concurrent_edit_is_not_overwritten(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                 make_profiler: Any) -> None:
    kubeapi.add_node("k-0")
    prof = _profiler(make_profiler, prom)
    # hold our PATCH at the server while another writer changes the node: the patch carries
    # the resourceVersion it was planned from, so the server refuses it (409) and we re-plan
    kubeapi.inject("PATCH", r"/nodes/k-0$", None, delay=2.0)
    worker = threading.Thread(target=prof.run_cycle)
    worker.start()
    wait_until(lambda: kubeapi.patches("k-0"), timeout=30, what="the profiler's PATCH to arrive")
    kubeapi.edit_node("k-0", annotations={P + "gpu-0.pattern": "bursty", "example.com/x": "1"})
    worker.join(60)
    assert [q.status for q in kubeapi.patches("k-0")] == [409, 200]
    ann = kubeapi.node("k-0")["metadata"]["annotations"]
    assert ann == {**expected_patch(*uuids(prom, "k-0")), "example.com/x": "1"}


def test_persistent_conflict_is_counted_and_others_still_written(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                                 make_profiler: Any) -> None:
    for n in NODES:
        kubeapi.add_node(n)
    kubeapi.inject("PATCH", r"/nodes/k-1$", 409, times=100)
    prof = _profiler(make_profiler, prom)
    r = prof.run_cycle()
    assert r.errors == ["kube_conflict"] and r.patches == 2
    assert len(kubeapi.patches("k-1")) == 4  # first try + 3 retries, each after a fresh GET
    assert P + "pattern" in kubeapi.node("k-0")["metadata"]["annotations"]
    assert P + "pattern" in kubeapi.node("k-2")["metadata"]["annotations"]


def test_forbidden_names_the_verb_and_stops_writing(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    for n in NODES:
        kubeapi.add_node(n)
    kubeapi.inject("PATCH", r"/nodes/", 403, times=100)
    prof = _profiler(make_profiler, prom, one_writer=True)
    with caplog.at_level(logging.ERROR):
        r = prof.run_cycle()
    assert r.errors == ["kube_forbidden"]
    assert len(kubeapi.patches()) == 1  # the first 403 stops the cycle's writes
    msg = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "needs RBAC verb 'patch' on 'nodes'" in msg
    assert b'gpu_profiler_errors_total{kind="kube_forbidden"} 1\n' in prof.metrics.exposition()
    kubeapi.clear_injections()
    assert prof.run_cycle().patches == 3  # permission granted: the next cycle catches up


def test_forbidden_list_names_list(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any,
                                   caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.add_node("k-0")
    kubeapi.inject("GET", r"/api/v1/nodes$", 403)
    prof = _profiler(make_profiler, prom)
    with caplog.at_level(logging.ERROR):
        r = prof.run_cycle()
    assert r.errors == ["kube_forbidden"] and kubeapi.patches() == []
    assert "needs RBAC verb 'list' on 'nodes'" in caplog.text


def test_server_errors_are_retried_with_a_bound(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    for n in NODES:
        kubeapi.add_node(n)
    kubeapi.inject("PATCH", r"/nodes/k-0$", 500, times=2)  # transient
    kubeapi.inject("PATCH", r"/nodes/k-2$", 503, times=100)  # lasting
    prof = _profiler(make_profiler, prom)
    r = prof.run_cycle()
    assert [q.status for q in kubeapi.patches("k-0")] == [500, 500, 200]
    assert [q.status for q in kubeapi.patches("k-2")] == [503] * 4  # 1 + 3 retries, then give up
    assert r.errors == ["kube_server_error"] and r.patches == 2
    assert P + "pattern" in kubeapi.node("k-1")["metadata"]["annotations"]


def test_deleted_node_is_skipped(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    for n in NODES:
        kubeapi.add_node(n)
    kubeapi.inject("PATCH", r"/nodes/k-1$", 404)
    r = _profiler(make_profiler, prom).run_cycle()
    assert r.ok and r.errors == [] and r.patches == 2


def test_api_server_unreachable_is_counted(prom: Prometheus, tmp_path: Path) -> None:
    with FakeKubeAPI() as dead:
        kc = dead.kubeconfig(tmp_path / "kc")
    # not the make_profiler fixture (whose API server runs): the same wiring, for a server that has already stopped
    prof = build_profiler(prom.url, "--health-condition", "off", "--events", "off", kubeconfig=kc,
                          tune={"store.backoff": 0.01, "store.timeout": 5})
    r = prof.run_cycle()
    assert r.errors == ["kube_unreachable"] and r.patches == 0


def test_hysteresis_state_survives_once_runs(prom: Prometheus, kubeapi: FakeKubeAPI, kubeconfig: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    u0, u1 = uuids(prom, "k-0")
    published = {**expected_patch(u0, u1), P + "gpu-0.pattern": "bursty", P + "pattern": "bursty"}
    kubeapi.add_node("k-0", annotations=published)
    argv = ["--once", "--prometheus-url", prom.url, "--kubeconfig", str(kubeconfig), "--log-level", "warning"]
    assert run(argv) == 0  # 1st run: the data says steady, held by the hysteresis
    ann = kubeapi.node("k-0")["metadata"]["annotations"]
    assert ann[P + "gpu-0.pattern"] == "bursty" and ann[P + "pending"] == "gpu-0.pattern=steady:1"
    assert run(argv) == 0  # 2nd run (a new process would read the same state from the node)
    assert kubeapi.node("k-0")["metadata"]["annotations"] == expected_patch(u0, u1)
    kubeapi.clear_requests()
    assert run(argv) == 0  # 3rd run: nothing to change
    assert kubeapi.patches() == []
    assert capsys.readouterr().out == ""


def test_once_dry_run_prints_and_sends_nothing(prom: Prometheus, kubeapi: FakeKubeAPI, kubeconfig: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    kubeapi.add_node("k-0", annotations={"example.com/owner": "a"})
    argv = ["--once", "--dry-run", "--prometheus-url", prom.url, "--kubeconfig", str(kubeconfig)]
    assert run(argv) == 0
    assert kubeapi.patches() == []
    line, status = capsys.readouterr().out.splitlines()
    want = expected_patch(*uuids(prom, "k-0"))
    assert json.loads(line) == {"node": "k-0", "patch": {"metadata": {"annotations": want}}}
    (cond,) = json.loads(status)["patch"]["status"]["conditions"]  # the GPUHealthy condition it would set
    assert json.loads(status)["node"] == "k-0" and cond["type"] == "GPUHealthy" and cond["status"] == "True"
    assert kubeapi.node("k-0")["metadata"]["annotations"] == {"example.com/owner": "a"}
    assert "conditions" not in kubeapi.node("k-0")["status"]


def test_listing_nodes_follows_continue_past_the_first_page(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """Survivor of issue 36: 501 nodes are two pages of 500; both are read (the continue token followed)."""
    for i in range(501):
        kubeapi.add_node(f"page-{i:03d}")
    nodes = NodeStore(kube_client).list_nodes()
    assert len(nodes) == 501 and "page-500" in nodes and "page-000" in nodes
    lists = [r for r in kubeapi.requests if r.verb == "list" and r.resource == "nodes"]
    assert len(lists) == 2 and "continue" not in lists[0].query and lists[1].query.get("continue")
