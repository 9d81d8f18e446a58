"""The ``underused`` pattern: busy (high utilisation) but starved (low SM activity), judged only where
the whole GPU's SM activity series exists; the classifier alone, then through a real Prometheus."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from exporter.profiler.classify import STEADY, UNDERUSED, GpuStats, Thresholds, classify_gpu, dominant_pattern
from exporter.profiler.prom import PromClient
from exporter.profiler.promql import SM_ACTIVE
from exporter.profiler.queries import PARTS_PER_QUERY, QueryConfig, Reader
from tests.fakes.profiler_history import (
    GpuHistory,
    make_history,
    mem_constant,
    sample_times,
    steady_shape,
    write_openmetrics,
)
from tests.harness.prom import OpenMetricsWriter, Prometheus

END = float(int(time.time()) - 60)

BUSY = GpuStats(node="n", gpu="0", util_mean=0.93, util_std=0.02, util_p95=0.96, util_count=120, util_early=60,
                util_fresh=20, mem_used_mean=40e9, mem_total=80e9, mem_count=120, mem_early=60, mem_fresh=20)


@pytest.mark.parametrize(("sm_mean", "sm_count", "util_mean", "want"), [
    (0.12, 120, 0.93, UNDERUSED),
    (None, None, 0.93, STEADY),  # no SM activity series (no GPM, AMD, a MIG GPU): not judged
    (0.12, 10, 0.93, STEADY),  # too few SM samples in the window to judge
    (0.25, 120, 0.93, STEADY),  # SM activity at the threshold or above: the SMs are used
    (0.12, 120, 0.75, STEADY),  # utilisation below the threshold
    (float("nan"), 120, 0.93, STEADY),
])
def test_underused_needs_high_utilisation_and_low_sm_activity(sm_mean: float | None, sm_count: float | None,
                                                              util_mean: float, want: str) -> None:
    st = replace(BUSY, sm_mean=sm_mean, sm_count=sm_count, util_mean=util_mean, util_std=0.02 * util_mean)
    p = classify_gpu(st)
    assert p.pattern == want, p.reason
    if want == UNDERUSED:
        assert p.reason == "mean utilisation 0.930, mean SM activity 0.120"
        assert p.util_mean == 0.93 and p.score is not None


def test_thresholds_are_those_of_the_alert() -> None:
    th = Thresholds()
    assert (th.underused_util, th.underused_sm) == (0.8, 0.2)  # GPUBusyButStarved: > 80 % while < 20 %
    assert classify_gpu(replace(BUSY, sm_mean=0.12, sm_count=120), replace(th, underused_sm=0.1)).pattern == STEADY


def test_underused_wins_a_tie_over_bursty_and_steady() -> None:
    assert dominant_pattern([UNDERUSED, STEADY]) == UNDERUSED
    assert dominant_pattern([UNDERUSED, "bursty"]) == UNDERUSED
    assert dominant_pattern([UNDERUSED, "allocated-idle"]) == "allocated-idle"


def _busy(gpu: str) -> GpuHistory:
    ts = sample_times(END, 2100.0, 15.0)
    return make_history(7, "sm-node", gpu, STEADY, "busy", ts, steady_shape(0.93, 0.02), mem_constant(0.5))


# gpu -> SM activity series: (gpu_instance, level, samples from the end of the window)
SM_SERIES: dict[str, list[tuple[str, float, int]]] = {
    "0": [("", 0.12, 141)],  # starved for the whole window
    "1": [("", 0.70, 141)],  # busy and using its SMs
    "2": [],  # no GPM
    "3": [("1", 0.05, 141), ("2", 0.08, 141)],  # MIG: per-instance series only, no whole-GPU one
    "4": [("", 0.10, 5)],  # GPM appeared a minute ago: too few samples
}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("underused-prom")
    path = tmp / "history.om"
    with OpenMetricsWriter(path) as w:
        hist = [_busy(g) for g in SM_SERIES]
        write_openmetrics(w, hist)
        for h in hist:
            for instance, level, n in SM_SERIES[h.gpu]:
                labels = {"gpu": h.gpu, "uuid": h.uuid, "instance": f"{h.node}:9400", "job": "gpu-exporter",
                          "node": h.node, "gpu_instance": instance}
                w.add("gpu_sm_active_ratio", labels, [(t, level) for t in h.times[-n:]])
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


def test_underused_through_prometheus_only_where_the_series_exists(prom: Prometheus) -> None:
    client = PromClient(prom.url)
    snap = Reader(client, QueryConfig()).read(END)
    assert snap.queries == client.requests_sent
    # SM activity costs a shard its two statistics' queries (mean, count), no more
    shard = Reader(client, QueryConfig()).builder.shard_queries("`sm-node`", 16384, PARTS_PER_QUERY)
    assert sorted(stat for _, stat, q in shard if SM_ACTIVE in q) == ["sm_count", "sm_mean"]
    got = {g: classify_gpu(st) for (node, g), st in snap.gpus.items() if node == "sm-node"}
    assert {g: p.pattern for g, p in got.items()} == {"0": UNDERUSED, "1": STEADY, "2": STEADY, "3": STEADY,
                                                      "4": STEADY}
    st0 = snap.gpus[("sm-node", "0")]
    assert st0.sm_mean == pytest.approx(0.12) and st0.sm_count == 121  # the 30 min window at 15 s
    assert snap.gpus[("sm-node", "2")].sm_mean is None and snap.gpus[("sm-node", "3")].sm_mean is None
