"""A GPU's pattern depends on its own history only, not on the size of the fleet around it.

The same per-GPU histories (periodic, bursty, steady, idle, growing) are read from a real
Prometheus once as a fleet of 100 nodes and once among 9,900 more nodes, whose one GPU each
appeared ten minutes ago (too little history to classify: ``unknown``), with a small answer
cap that cuts the fleet into small shards. Each of the 100 nodes' GPUs must get the same
pattern and period both times. (Before: the utilisation step was the median scrape interval
of the shard; a small shard full of young GPUs stretched the step of every GPU in it, and
periodic GPUs came out bursty at 10,000 nodes.)
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.profiler.classify import classify_gpu
from exporter.profiler.fold import scrape_interval
from exporter.profiler.prom import PromClient
from exporter.profiler.queries import QueryConfig, Reader
from tests.fakes.profiler_history import GpuHistory, labelled_set, sample_times, write_openmetrics
from tests.harness.prom import OpenMetricsWriter, Prometheus

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)
CAP = 1024 * 1024  # the cap of the report: 1,478 periodic GPUs of 10,000 nodes came out bursty
SMALL = 128 * 1024  # below the list of 10,000 nodes (about 600 KB): it is asked in parts
FLEET = 10_000
TESTED = 100


def _tested() -> list[GpuHistory]:
    """100 nodes of 2 GPUs (a labelled mix), spread evenly through the node names of the big fleet."""
    hist = labelled_set(41, END, count=2 * TESTED, per_node=2)
    return [replace(h, node=f"n{int(h.node[4:]) * (FLEET // TESTED):05d}") for h in hist]


def _write_young(w: OpenMetricsWriter, nodes: list[str]) -> None:
    ts = sample_times(END, 600, 15)
    for n in nodes:
        labels = {"node": n, "gpu": "0", "uuid": f"GPU-young-{n}", "instance": f"{n}:9400", "job": "gpu-exporter"}
        w.add("gpu_utilization_ratio", labels, [(t, 0.0) for t in ts])
        w.add("gpu_memory_used_bytes", labels, [(t, 0.0) for t in ts])
        w.add("gpu_up", labels, [(t, 1.0) for t in ts])


Patterns = dict[tuple[str, str], tuple[str, float | None]]


def _read(url: str, cap: int, tested: list[GpuHistory]) -> tuple[Patterns, int]:
    client = PromClient(url, max_response_bytes=cap, timeout=60)
    snap = Reader(client, QueryConfig(source="gpu-exporter")).read(END)
    assert client.largest_response_bytes <= cap
    out = {}
    for h in tested:
        p = classify_gpu(snap.gpus[(h.node, h.gpu)])
        out[(h.node, h.gpu)] = (p.pattern, None if p.period_seconds is None else round(p.period_seconds, 6))
    return out, snap.shards


def _patterns(tmp: Path, big: bool, caplog: pytest.LogCaptureFixture) -> Patterns:
    tested = _tested()
    taken = {h.node for h in tested}
    tmp.mkdir()
    with OpenMetricsWriter(tmp / "h.om") as w:
        write_openmetrics(w, tested)
        if big:
            _write_young(w, [f"n{i:05d}" for i in range(FLEET) if f"n{i:05d}" not in taken])
    with Prometheus(tmp / "p", tsdb_blocks_from=tmp / "h.om") as p:
        out, shards = _read(p.url, CAP, tested)
        if big:
            # shards of at most 2,000 GPUs (answers of four statistics fit the cap): the 100 nodes' GPUs share
            # them with young ones
            assert shards >= -(-(FLEET - TESTED + 2 * TESTED) // 2000)
            # a list of nodes longer than the cap is asked in parts (by the names' last characters)
            reader = Reader(PromClient(p.url, max_response_bytes=SMALL), QueryConfig(source="gpu-exporter"))
            found = reader.discover(END)
            assert "the node list was refused" in caplog.text and "prometheus_response_too_large" in caplog.text
            assert len(found["gpu-exporter"]) == FLEET
    return out


def test_patterns_do_not_depend_on_fleet_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="exporter.profiler")
    small = _patterns(tmp_path / "small", big=False, caplog=caplog)
    big = _patterns(tmp_path / "big", big=True, caplog=caplog)
    assert sum(p == "periodic" for p, _ in small.values()) >= 50
    diffs = [f"{k}: {small[k]} at {TESTED} nodes, {big[k]} at {FLEET}" for k in sorted(small) if small[k] != big[k]]
    assert diffs == []


@pytest.mark.parametrize(("span", "samples", "interval"), [
    (1800, 61, 30), (1800, 60, 30),  # both ends of a closed range on a sample, or one
    (1800, 121, 15), (1800, 119, 15),  # two missed scrapes
    (1800, 31, 60), (900, 31, 30), (900, 30, 30),  # a half window, closed or half-open
    (1800, 55, 30),  # 10% missed scrapes
    (1800, 139, 13), (1800, 72, 25), (1800, 257, 7),  # unusual intervals stay themselves
])  # fmt: skip
def test_scrape_interval_from_one_gpus_count(span: float, samples: int, interval: int) -> None:
    # (1800 / 31 = 29.03 s rounded to 29 s, the first per-GPU estimate, skipped a 30 s sample every 29 steps)
    assert scrape_interval(span, samples) == interval
