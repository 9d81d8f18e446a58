"""Profiler faults: Prometheus down, slow, 500, truncated; the API server 409, 403, 500, hanging.

The profiler's cycle runs in this process against a real Prometheus (backfilled history:
one node, GPU 0 steady, GPU 1 idle) behind a switchable proxy, and the fake API server. For
each fault: the cycle never raises, no annotation is written from missing data, the error is
counted by kind in ``gpu_profiler_errors_total``, and the first cycle after the fault clears
restores the node's annotations (they are deleted by "another writer" during the fault, so
recovery has something to do).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler.loop import Profiler
from tests.fakes.profiler_history import idle_shape, make_history, mem_constant, sample_times, steady_shape
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.profiler import FaultProxy, history_file
from tests.harness.prom import Prometheus
from tests.reliability.support import Result

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"
NODE = "rel-0"
CYCLES = 3  # cycles while a fault lasts
LOGGERS = "exporter.profiler"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("rel-profiler")
    end = float(int(time.time()))
    ts = sample_times(end, 2100, 15)
    hist = [make_history(5, NODE, "0", "steady", "steady", ts, steady_shape(0.8, 0.02), mem_constant(0.5)),
            make_history(5, NODE, "1", "idle", "idle", ts, idle_shape, mem_constant(0.0))]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


@pytest.fixture
def api(kubeapi: FakeKubeAPI) -> FakeKubeAPI:
    """The suite's fake API server (tests/conftest.py) with NODE, annotated by another owner."""
    kubeapi.add_node(NODE, annotations={"example.com/owner": "team-a"})
    return kubeapi


def profiler(make_profiler: Any, url: str, prom_timeout: float = 1.0, kube_timeout: float = 5.0,
             kube_retries: int = 3) -> Profiler:
    """A profiler from the one fixture: one Prometheus retry, no GPUHealthy condition and no Events (only the
    annotations are written); the API server's timeout and retries (no flag sets them), no real backoff."""
    return make_profiler(url, "--prometheus-timeout", f"{prom_timeout:g}", "--prometheus-retries", "1",
                         "--health-condition", "off", "--events", "off",
                         tune={"reader.client.backoff": 0.01, "store.backoff": 0.01, "store.timeout": kube_timeout,
                               "store.retries": kube_retries})


def ours(api: FakeKubeAPI) -> dict[str, str]:
    return {k: v for k, v in api.node(NODE)["metadata"]["annotations"].items() if k.startswith(P)}


def error_count(prof: Profiler, kind: str) -> float:
    for line in prof.metrics.exposition().decode().splitlines():
        if line.startswith(f'gpu_profiler_errors_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no gpu_profiler_errors_total series for {kind}")


def wipe(api: FakeKubeAPI, keys: dict[str, str]) -> None:
    """Another writer removes our annotations: recovery must put them back."""
    api.edit_node(NODE, annotations=dict.fromkeys(keys))


def fault_cycles(prof: Profiler, caplog: pytest.LogCaptureFixture) -> tuple[list[list[str]], int, int]:
    """CYCLES cycles: (their error kinds, ERROR log lines, tracebacks)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGERS):
        kinds = [prof.run_cycle().errors for _ in range(CYCLES)]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    return kinds, len(errors), sum(1 for r in errors if r.exc_info)


def recovery(prof: Profiler, api: FakeKubeAPI, good: dict[str, str]) -> tuple[int, float]:
    """Cycles (and seconds) until the node carries ``good`` again."""
    t0 = time.monotonic()
    for n in range(1, 4):
        r = prof.run_cycle()
        if r.ok and ours(api) == good:
            return n, round(time.monotonic() - t0, 2)
    raise AssertionError(f"not recovered: {ours(api)}")


PROM_FAULTS = [
    pytest.param("down", "prometheus_unreachable",
                 "the proxy in front of Prometheus stops listening (connection refused)", id="down"),
    pytest.param("slow", "prometheus_timeout", "every answer comes after 3 s (client timeout 1 s)", id="slow"),
    pytest.param("500", "prometheus_http_5xx", "every query answers HTTP 500", id="500"),
    pytest.param("truncated", "prometheus_bad_response", "every answer is the first half of Prometheus' JSON",
                 id="truncated"),
    pytest.param("cut", "prometheus_bad_response",
                 "the connection closes half-way through each answer's announced Content-Length", id="cut"),
]


@pytest.mark.parametrize(("fault", "kind", "done"), PROM_FAULTS)
def test_prometheus_fault(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any, caplog: pytest.LogCaptureFixture,
                          fault: str, kind: str, done: str, result: Result) -> None:
    with FaultProxy(prom.url, delay=3.0) as proxy:
        prof = profiler(make_profiler, proxy.url)
        assert prof.run_cycle().ok
        good = ours(api)
        assert good[P + "gpu-0.pattern"] == "steady" and good[P + "gpu-1.pattern"] == "idle"
        wipe(api, good)
        api.clear_requests()
        if fault == "down":
            proxy.down()
        else:
            proxy.mode = fault
        kinds, log_lines, tracebacks = fault_cycles(prof, caplog)
        writes = [r for r in api.requests if r.method != "GET"]
        during = ours(api)
        counted = error_count(prof, kind)
        if fault == "down":
            proxy.up()
        proxy.mode = None
        cycles, secs = recovery(prof, api, good)
    result.scenario = f"Prometheus {fault} (profiler)"
    result.done = done + f", for {CYCLES} cycles; meanwhile another writer deletes our annotations"
    observed = sorted({k for ks in kinds for k in ks})
    result.happened = (f"each cycle stopped after the read and wrote nothing (no list, no patch), counted "
                       f"{', '.join(observed)}" + (f" with {tracebacks} tracebacks" if tracebacks else "")
                       + "; the first cycle after the fault wrote the annotations back")
    result.figures = {"error_kinds": sorted({k for ks in kinds for k in ks}), "errors_counted": counted,
                      "writes_during": len(writes), "error_log_lines": log_lines, "tracebacks": tracebacks,
                      "recovery_cycles": cycles, "recovery_s": secs}
    assert kinds == [[kind]] * CYCLES
    assert counted == CYCLES
    assert writes == [] and during == {}, "nothing may be written from a failed read"
    assert tracebacks == 0 and log_lines <= CYCLES
    assert cycles == 1


KUBE_FAULTS = [
    ("409", "kube_conflict", dict(status=409, times=1000), "every PATCH answers 409 Conflict"),
    ("403", "kube_forbidden", dict(status=403, times=1000), "every PATCH answers 403 Forbidden"),
    ("500", "kube_server_error", dict(status=500, times=1000), "every PATCH answers 500"),
    ("hang", "kube_unreachable", dict(status=504, times=1000, delay=3.0),
     "every PATCH is held 3 s and never applied (client timeout 1 s)"),
]


@pytest.mark.parametrize(("fault", "kind", "inject", "done"), KUBE_FAULTS, ids=[f[0] for f in KUBE_FAULTS])
def test_api_server_fault(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any, caplog: pytest.LogCaptureFixture,
                          fault: str, kind: str, inject: dict[str, object], done: str, result: Result) -> None:
    prof = profiler(make_profiler, prom.url, kube_timeout=1.0, kube_retries=1)
    assert prof.run_cycle().ok
    good = ours(api)
    wipe(api, good)
    api.clear_requests()
    api.inject("PATCH", r"^/api/v1/nodes/", **inject)  # type: ignore[arg-type]
    kinds, log_lines, tracebacks = fault_cycles(prof, caplog)
    patches = len(api.patches())
    counted = error_count(prof, kind)
    api.clear_injections()
    during = ours(api)
    cycles, secs = recovery(prof, api, good)
    result.scenario = f"API server {fault} (profiler)"
    result.done = done + f", for {CYCLES} cycles; our annotations had been deleted by another writer"
    observed = sorted({k for ks in kinds for k in ks})
    result.happened = (f"each cycle counted {', '.join(observed)} and carried on; the node never carried a wrong "
                       "value; the first cycle after the fault wrote the annotations")
    result.figures = {"error_kinds": sorted({k for ks in kinds for k in ks}), "errors_counted": counted,
                      "patches_sent": patches, "error_log_lines": log_lines, "tracebacks": tracebacks,
                      "recovery_cycles": cycles, "recovery_s": secs}
    assert kinds == [[kind]] * CYCLES
    assert counted == CYCLES
    assert during in ({}, good), f"a wrong value on the node: {during}"
    assert tracebacks == 0 and log_lines <= CYCLES
    assert cycles == 1


def test_profiler_logs_one_line_per_outage(prom: Prometheus, api: FakeKubeAPI, make_profiler: Any,
                                           caplog: pytest.LogCaptureFixture, result: Result) -> None:
    with FaultProxy(prom.url, delay=3.0) as proxy:
        prof = profiler(make_profiler, proxy.url)
        assert prof.run_cycle().ok
        proxy.mode = "500"
        _, log_lines, _ = fault_cycles(prof, caplog)
    result.scenario = "profiler log lines per outage"
    result.done = f"Prometheus answers 500 for {CYCLES} cycles"
    result.happened = f"{log_lines} ERROR lines: " + ("one for the outage" if log_lines == 1 else "one per cycle")
    result.figures = {"cycles": CYCLES, "error_log_lines": log_lines}
    assert log_lines == 1
