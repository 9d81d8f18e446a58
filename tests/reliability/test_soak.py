"""Soak: memory over many scrapes (exporter) and many cycles (profiler).

The exporter's RSS is read from /proc every N scrapes on one keep-alive connection. The
profiler runs in this process against a real Prometheus with backfilled history and the
fake API server; its memory is this process' RSS and the number of live Python objects
after a full garbage collection (the object count is exact, so a leak of one object per
cycle shows after 500 cycles).
"""

from __future__ import annotations

import gc
import http.client
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fakenvml import FakeNvml
from tests.fakes.profiler_history import (
    idle_shape,
    make_history,
    mem_constant,
    periodic_shape,
    sample_times,
    steady_shape,
)
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.profiler import history_file
from tests.harness.prom import Prometheus
from tests.reliability.support import Result, median_slope_per, open_fds, rss_mib, run_scrapers, scrape_once, threads

pytestmark = pytest.mark.timeout(1200)


def _warm_up(ex: ExporterProcess, conn: http.client.HTTPConnection, scrapes: int) -> None:
    """Scrape until the exporter is in its steady state: ``scrapes`` scrapes and three collections
    (GPM values appear from the second), then a burst of overlapping requests. The server answers
    each request on its own thread, and the first time two answers overlap the second malloc
    arena's heap grows once by about 0.5 MiB (seen in /proc/<pid>/smaps); without the burst that
    step lands anywhere in the run (one keep-alive client overlaps itself now and then: the
    answering thread can still be finishing when the next request arrives)."""
    pid = ex.proc.pid
    for _ in range(scrapes):
        assert scrape_once(conn)[0] == 200
    wait_until(lambda: (sample(ex.scrape(), "gpu_exporter_collections_total") or 0) >= 3, 30,
               what="three collections")
    fds = open_fds(pid)
    burst = run_scrapers(ex.port, 8, 0.5, 0.0)
    assert not burst.errors, burst.errors[:3]
    # the burst's connections are closed on the client side; the server closes its ends after
    wait_until(lambda: open_fds(pid) <= fds, 10, what="the burst's connections closed by the server")


@pytest.mark.parametrize(("scrapes", "every", "cache_ttl"), [
    pytest.param(10_000, 1_000, "1", id="10k"),
    pytest.param(100_000, 5_000, "0", id="100k", marks=pytest.mark.reliability_long),
])
def test_exporter_rss_over_scrapes(tmp_path: Path, scrapes: int, every: int, cache_ttl: str,
                                   result: Result) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys"), "--cache-ttl", cache_ttl],
                         env=fleet.env()) as ex:
        pid = ex.proc.pid
        conn = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=30)
        _warm_up(ex, conn, every)
        base_threads, base_fds = threads(pid), open_fds(pid)
        curve = [(0.0, rss_mib(pid))]
        errors = 0
        t0 = time.monotonic()
        for n in range(1, scrapes + 1):
            status, body = scrape_once(conn)
            errors += status != 200 or not body
            if n % every == 0:
                curve.append((float(n), rss_mib(pid)))
        elapsed = time.monotonic() - t0
        # Both counted with the client connected. The thread that answered the last scrape can
        # still be finishing after its answer arrives (about 1 in 150 scrapes here), and so can
        # the one counted in base_threads: wait for the count to come back, not for it to be exact.
        end_threads = wait_until(lambda: (n := threads(pid)) <= base_threads and n, 10,
                                 what=f"the exporter's threads back to {base_threads}")
        end_fds = open_fds(pid)
        conn.close()
        assert ex.proc.poll() is None
    rss = [y for _, y in curve]
    growth = rss[-1] - rss[0]
    # MiB per 10,000 scrapes after the warm-up: the median interval, so that a one-time step (the
    # second malloc arena's heap growing by about 0.5 MiB the first time two answers overlap, seen
    # in /proc/<pid>/smaps) does not read as a leak; a leak rises in most intervals
    slope = median_slope_per(curve, 10_000)
    per_scrape = "every scrape is a collection (`--cache-ttl 0`)" if cache_ttl == "0" else \
        "default `--cache-ttl 1` (a collection per second)"
    result.scenario = f"{scrapes:,} scrapes in a row"
    result.done = f"one keep-alive client scrapes 8 fake GPUs {scrapes:,} times, {per_scrape}; RSS every {every:,}"
    result.happened = "RSS flat after warm-up; no thread or file descriptor left behind"
    result.figures = {"errors": errors, "rss_before_mib": rss[0], "rss_after_mib": rss[-1],
                      "rss_max_mib": max(rss), "growth_mib": round(growth, 2),
                      "slope_mib_per_10k": round(slope, 3), "scrapes_per_s": round(scrapes / elapsed),
                      "threads": [base_threads, end_threads], "fds": [base_fds, end_fds]}
    result.curve, result.curve_label = curve, "scrapes, RSS MiB"
    assert errors == 0
    assert growth < 2.0 and max(rss) - rss[0] < 3.0, f"RSS grew {growth:.2f} MiB: {curve}"
    assert slope < 0.2
    assert end_fds == base_fds


# ---- profiler --------------------------------------------------------------------------------------

NODES = 4
GPUS_PER_NODE = 8


@pytest.fixture(scope="module")
def fleet_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("soak-prom")
    end = float(int(time.time()))
    ts = sample_times(end, 2100, 15)
    shapes = (steady_shape(0.7, 0.02), idle_shape, periodic_shape("square", 90.0, 0.02))
    hist = [make_history(9, f"soak-{n}", str(g), "x", "x", ts, shapes[g % 3], mem_constant(0.4))
            for n in range(NODES) for g in range(GPUS_PER_NODE)]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as prom:
        yield prom


def _live_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.prometheus
@pytest.mark.parametrize(("cycles", "every"), [
    pytest.param(50, 10, id="50"),
    pytest.param(500, 50, id="500", marks=pytest.mark.reliability_long),
])
def test_profiler_cycles_on_a_stable_fleet(fleet_history: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any,
                                           cycles: int, every: int, result: Result) -> None:
    # pytest's log capture keeps every record of a test: the profiler's INFO line per cycle (and the
    # kubernetes client's DEBUG lines when an earlier test left the root logger at debug) would be a
    # "leak" of the test harness, one object per cycle
    logging.disable(logging.INFO)
    try:
        for n in range(NODES):
            kubeapi.add_node(f"soak-{n}", annotations={"example.com/owner": "team-a"})
        # the annotations alone: no GPUHealthy condition and no Events (each their own writes, not this soak's subject)
        prof = make_profiler(fleet_history.url, "--health-condition", "off", "--events", "off")
        first = prof.run_cycle()
        assert first.ok and first.patches == NODES, first
        written = {n: kubeapi.node(f"soak-{n}")["metadata"]["annotations"] for n in range(NODES)}
        for _ in range(every):  # warm-up
            assert prof.run_cycle().ok
        kubeapi.clear_requests()
        curve = [(0.0, rss_mib(os.getpid()))]
        objects = [(0.0, float(_live_objects()))]
        failed = 0
        durations = []
        writes: list[str] = []
        lists = 0
        for i in range(1, cycles + 1):
            r = prof.run_cycle()
            failed += not r.ok
            durations.append(r.duration_s)
            if i % every == 0:
                # the fake API server's request log is the test's, not the profiler's memory: empty it
                seen = kubeapi.requests
                writes += [f"{q.method} {q.path}" for q in seen if q.method in ("PATCH", "PUT", "POST", "DELETE")]
                lists += sum(1 for q in seen if q.method == "GET")
                kubeapi.clear_requests()
                curve.append((float(i), rss_mib(os.getpid())))
                objects.append((float(i), float(_live_objects())))
        after = {n: kubeapi.node(f"soak-{n}")["metadata"]["annotations"] for n in range(NODES)}
    finally:
        logging.disable(logging.NOTSET)
    # caches fill during the first checkpoints (regex, lru); after that a leak of even one object per cycle shows
    growth_objects = objects[-1][1] - objects[len(objects) // 2][1]
    rss_growth = curve[-1][1] - curve[0][1]
    result.scenario = f"profiler: {cycles} cycles on a stable fleet"
    result.done = (f"{NODES} nodes x {GPUS_PER_NODE} GPUs (steady, idle, periodic) backfilled in a real Prometheus; "
                   f"the profiler's cycle runs {cycles} times against the fake API server")
    result.happened = "one patch per node in the first cycle, then no write at all; memory and live objects flat"
    result.figures = {"failed_cycles": failed, "writes_after_first": len(writes), "node_lists": lists,
                      "cycle_p50_ms": round(sorted(durations)[len(durations) // 2] * 1000, 1),
                      "test_process_rss_before_mib": curve[0][1], "test_process_rss_after_mib": curve[-1][1],
                      "live_objects_start_middle_end": [int(objects[i][1]) for i in (0, len(objects) // 2, -1)]}
    result.curve, result.curve_label = curve, "cycles, test-process RSS MiB"
    assert failed == 0
    assert writes == [] and after == written
    assert lists == cycles  # one list per cycle, nothing else
    assert growth_objects <= 5, f"live objects grew by {growth_objects:.0f} in the second half: {objects}"
    assert objects[-1][1] - objects[0][1] <= 500, f"live objects: {objects}"
    assert rss_growth < 3.0, f"RSS grew {rss_growth:.2f} MiB: {curve}"
