"""Prometheus misbehaving: unreachable, slow, 5xx, malformed, NaN, empty.

The loop must log, count the error by kind, carry on, and never put a wrong annotation on
a node because data was missing. A fault-injecting proxy sits between the profiler and a
real Prometheus with backfilled history (ending now).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler.loop import Health, Profiler
from tests.fakes.profiler_history import make_history, mem_constant, periodic_shape, sample_times, steady_shape
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.profiler import FaultProxy, closed_port_url, history_file
from tests.harness.prom import Prometheus

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("profiler-faults")
    end = float(int(time.time()))
    ts = sample_times(end, 2100, 15)
    hist = [
        make_history(2, "f-0", "0", "steady", "steady", ts, steady_shape(0.8, 0.02), mem_constant(0.5)),
        make_history(2, "f-0", "1", "periodic", "periodic", ts, periodic_shape("square", 90.0, 0.02),
                     mem_constant(0.5), period_s=90.0),
    ]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


@pytest.fixture
def api(kubeapi: FakeKubeAPI) -> FakeKubeAPI:
    """The suite's fake API server (tests/conftest.py) with node f-0, annotated by another owner."""
    kubeapi.add_node("f-0", annotations={"example.com/owner": "team-a"})
    return kubeapi


def make(make_profiler: Any, url: str, timeout: float = 2.0) -> Profiler:
    """A profiler from the one fixture: a timeout, one retry, no GPUHealthy condition and no Events (only the
    annotations are written), and retries without the real backoff's wait."""
    return make_profiler(url, "--prometheus-timeout", f"{timeout:g}", "--prometheus-retries", "1",
                         "--health-condition", "off", "--events", "off",
                         tune={"reader.client.backoff": 0.01, "store.backoff": 0.01})


def good_annotations(prof: Profiler, api: FakeKubeAPI) -> dict[str, str]:
    assert prof.run_cycle().ok
    ann = api.node("f-0")["metadata"]["annotations"]
    assert ann[P + "gpu-0.pattern"] == "steady" and ann[P + "gpu-1.pattern"] == "periodic"
    return ann


def errors(prof: Profiler, kind: str) -> float:
    for line in prof.metrics.exposition().decode().splitlines():
        if line.startswith(f'gpu_profiler_errors_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no errors_total series for {kind}")


@pytest.mark.parametrize(("mode", "kind"), [
    ("500", "prometheus_http_5xx"),
    ("garbage", "prometheus_bad_response"),
    ("slow", "prometheus_timeout"),
    ("empty", "prometheus_empty"),
])
def test_bad_answers_write_nothing(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any, mode: str, kind: str,
                                   caplog: pytest.LogCaptureFixture) -> None:
    with FaultProxy(prom.url, delay=3.0) as proxy:
        prof = make(make_profiler, proxy.url, timeout=0.5)
        before = good_annotations(prof, api)
        api.clear_requests()
        proxy.mode = mode
        with caplog.at_level(logging.ERROR):
            r = prof.run_cycle()
        assert r.errors == [kind] and not r.ok
        assert errors(prof, kind) == 1
        assert api.requests == []  # not even a list: nothing will be written
        assert api.node("f-0")["metadata"]["annotations"] == before
        assert "nothing written this cycle" in caplog.text
        if mode in ("500", "slow"):
            assert proxy.requests >= 4 + 2  # the good cycle, then the first query and its retry
        proxy.mode = None
        assert prof.run_cycle().ok  # and the next cycle works again


def test_unreachable_prometheus(api: FakeKubeAPI, make_profiler: Any) -> None:
    prof = make(make_profiler, closed_port_url())
    r = prof.run_cycle()
    assert r.errors == ["prometheus_unreachable"]
    assert r.queries == 1  # the node query fails; no shard is asked for
    assert prof.reader.client.requests_sent == 2  # retried once
    assert errors(prof, "prometheus_unreachable") == 1
    assert api.requests == [] and api.node("f-0")["metadata"]["annotations"] == {"example.com/owner": "team-a"}


def test_nan_values_never_produce_a_wrong_pattern(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any) -> None:
    with FaultProxy(prom.url) as proxy:
        prof = make(make_profiler, proxy.url)
        before = good_annotations(prof, api)
        proxy.mode = "nan"
        r1 = prof.run_cycle()
        assert r1.ok  # NaN is data, not an error: the GPUs are simply not classifiable
        after1 = api.node("f-0")["metadata"]["annotations"]
        # patterns held (hysteresis); the statistics that need data (idle count, best GPU) go
        stats = {P + "idle-gpus", P + "best-gpu", P + "best-gpu-score"}
        assert {k: v for k, v in after1.items() if k not in (P + "pending", P + "owned-keys")} == \
            {k: v for k, v in before.items() if k not in stats | {P + "owned-keys"}}
        assert after1[P + "pending"] == "gpu-0.pattern=unknown:1,gpu-1.pattern=unknown:1"
        prof.run_cycle()
        after2 = api.node("f-0")["metadata"]["annotations"]
        assert after2[P + "gpu-0.pattern"] == after2[P + "gpu-1.pattern"] == "unknown"
        assert P + "gpu-1.period-seconds" not in after2 and P + "best-gpu" not in after2
        assert after2["example.com/owner"] == "team-a"
        proxy.mode = None
        prof.run_cycle()
        back = api.node("f-0")["metadata"]["annotations"]
        assert back[P + "gpu-0.pattern"] == "steady" and back[P + "gpu-1.pattern"] == "periodic"


def test_loop_carries_on_through_faults(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any) -> None:
    with FaultProxy(prom.url, mode="500") as proxy:
        prof = make(make_profiler, proxy.url)
        stop = threading.Event()
        thread = threading.Thread(target=prof.loop, args=(0.05, stop), daemon=True)
        health = Health(prof, 0.05, stall_after_s=30, thread=thread)
        thread.start()
        try:
            wait_until(lambda: errors(prof, "prometheus_http_5xx") >= 3, timeout=30, what="three failed cycles")
            assert health.check()[0] and thread.is_alive()
            proxy.mode = "garbage"
            wait_until(lambda: errors(prof, "prometheus_bad_response") >= 2, timeout=30, what="bad responses")
            assert P + "pattern" not in api.node("f-0")["metadata"]["annotations"]
            proxy.mode = None
            wait_until(lambda: api.node("f-0")["metadata"]["annotations"].get(P + "gpu-1.pattern") == "periodic",
                       timeout=30, what="annotations once Prometheus recovers")
        finally:
            stop.set()
            thread.join(30)
        assert not thread.is_alive()
        assert not health.check()[0]  # a stopped loop is not alive


def test_healthz_reports_a_stuck_cycle(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any) -> None:
    with FaultProxy(prom.url, mode="hang") as proxy:
        prof = make(make_profiler, proxy.url, timeout=60)
        stop = threading.Event()
        thread = threading.Thread(target=prof.loop, args=(60.0, stop), daemon=True)
        health = Health(prof, 60.0, stall_after_s=0.3, thread=thread)
        thread.start()
        try:
            why = wait_until(lambda: (lambda ok, w: w if not ok else None)(*health.check()), timeout=30,
                             what="healthz to notice the stuck cycle")
            assert "cycle running for" in why
            proxy.release()
            wait_until(lambda: prof.cycles_done >= 1, timeout=30, what="the held cycle to finish")
            assert health.check()[0]
        finally:
            stop.set()
            thread.join(30)


def test_metrics_endpoint_counts_kinds(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any) -> None:
    from exporter.profiler.loop import make_server
    from tests.harness.prom import check_metrics

    prof = make(make_profiler, closed_port_url())
    prof.run_cycle()
    server = make_server("127.0.0.1", 0, prof.metrics, Health(prof, 60, 120))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'gpu_profiler_errors_total{kind="prometheus_unreachable"} 1\n' in body
        assert 'gpu_profiler_errors_total{kind="kube_forbidden"} 0\n' in body  # every kind present
        assert check_metrics(body) == []
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_one_log_line_per_outage_and_one_when_it_clears(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with FaultProxy(prom.url) as proxy:
        prof = make(make_profiler, proxy.url)
        good = good_annotations(prof, api)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="exporter.profiler"):
            # the node lost our keys and every PATCH fails: a Kubernetes outage
            api.edit_node("f-0", annotations={k: None for k in good if k.startswith(P)})
            api.inject("PATCH", r"^/api/v1/nodes/", 500, times=1000)
            kinds = [prof.run_cycle().errors]
            # then Prometheus fails too: the writes are never reached, so the Kubernetes outage
            # is not over; then Prometheus comes back while the PATCHes still fail
            proxy.mode = "500"
            kinds += [prof.run_cycle().errors for _ in range(2)]
            proxy.mode = None
            kinds.append(prof.run_cycle().errors)
            api.clear_injections()
            kinds.append(prof.run_cycle().errors)
    k8s, p5 = "kube_server_error", "prometheus_http_5xx"
    assert kinds == [[k8s], [p5], [p5], [k8s], []]
    assert errors(prof, k8s) == 2 and errors(prof, p5) == 2  # the counter has every error
    ours = [r for r in caplog.records if r.name.startswith("exporter.profiler.loop") and not
            r.getMessage().startswith("cycle:")]
    lines = [(r.levelname, r.getMessage()) for r in ours if r.levelno >= logging.INFO]
    assert [(lvl, k8s in msg or p5 in msg) for lvl, msg in lines] == [("ERROR", True)] * 2 + [("INFO", True)] * 2
    assert k8s in lines[0][1] and "node f-0" in lines[0][1]
    assert p5 in lines[1][1] and "nothing written this cycle" in lines[1][1]
    assert lines[2][1].startswith(f"{p5} cleared after 2 failed cycles")
    assert lines[3][1].startswith(f"{k8s} cleared after 2 failed cycles")
    assert sum(1 for r in ours if r.levelno == logging.DEBUG and "still failing" in r.getMessage()) == 2
    assert api.node("f-0")["metadata"]["annotations"] == good


def test_collector_paused_only_during_a_cycle(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The cycle pauses the cyclic garbage collector and turns it back on, also after a bug."""
    import gc

    prof = make(make_profiler, prom.url)
    seen: list[bool] = []
    real = prof._cycle

    def spy(at: float, res: object) -> None:
        seen.append(gc.isenabled())
        real(at, res)  # type: ignore[arg-type]

    monkeypatch.setattr(prof, "_cycle", spy)
    assert gc.isenabled()
    assert prof.run_cycle().ok
    assert seen == [False] and gc.isenabled()

    def broken(at: float, res: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(prof, "_cycle", broken)
    assert prof.run_cycle().errors == ["internal"]
    assert gc.isenabled()
