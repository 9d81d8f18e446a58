"""The profiler's reads (exporter/profiler/queries.py ``Reader``), its classification and a full cycle
against a real Prometheus holding backfilled synthetic history.

Its neighbours: tests/unit/profiler/test_prom.py tests the Prometheus HTTP client (exporter/profiler/prom.py)
against small fake servers; tests/harness/test_prom.py tests the real-Prometheus harness itself.

One server per module holds: a labelled set of 120 GPUs whose series carry the ``node``
label (as the shipped scrape configs produce), another 120 without it (joined on
``instance`` with ``gpu_host_info``), and a scenario node with every special case.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from exporter.profiler.classify import classify_gpu
from exporter.profiler.loop import Profiler
from exporter.profiler.prom import PromClient
from exporter.profiler.queries import QueryConfig, Reader
from tests.fakes.profiler_history import (
    SCENARIO_GROWTH_BPS,
    SCENARIO_LABELS,
    SCENARIO_PERIOD_S,
    GpuHistory,
    labelled_set,
    scenario_node,
)
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.profiler import history_file
from tests.harness.prom import Prometheus

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)
P = "gpu-exporter.io/"


def _joined_set() -> list[GpuHistory]:
    return [replace(h, node=h.node.replace("lab-", "join-"), uuid=h.uuid.replace("GPU-", "GPU-J"))
            for h in labelled_set(22, END)]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("profiler-prom")
    with_label = labelled_set(21, END) + scenario_node(3, "scn-a", END)
    from tests.fakes.profiler_history import write_openmetrics
    from tests.harness.prom import OpenMetricsWriter

    path = tmp / "history.om"
    with OpenMetricsWriter(path) as w:
        write_openmetrics(w, with_label, node_label=True)
        # a user's own scrape config without a node label: its gpu_host_info is believed only from the
        # exporter's own job (--source-job, issue 36), here the shipped name under another scrape config
        write_openmetrics(w, _joined_set(), node_label=False, job="gpu-exporter")
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


def _accuracy(snap_gpus: dict, hist: list[GpuHistory]) -> tuple[int, list[str]]:
    ok, wrong = 0, []
    for h in hist:
        st = snap_gpus.get((h.node, h.gpu))
        p = classify_gpu(st) if st is not None else None
        good = p is not None and p.pattern == h.label
        if good and h.period_s is not None:
            assert p is not None and p.period_seconds is not None
            good = abs(p.period_seconds - h.period_s) <= 0.1 * h.period_s
        ok += good
        if not good:
            wrong.append(f"{h.node}/{h.gpu} {h.name} -> {p}")
    return ok, wrong


def test_labelled_sets_classified_through_prometheus(prom: Prometheus) -> None:
    client = PromClient(prom.url)
    reader = Reader(client, QueryConfig())
    snap = reader.read(END)
    # the metric names, nodes, unlabelled; 12 aggregates, each statistic alone (promql.Part: utilisation's 6,
    # memory's 6; the history has no SM activity, health fields or gpu_allocation_info, so their statistics
    # are not asked for: QueryBuilder.has); 2 ranges and the memory range's GPUs' sample counts
    # (promql.mem_counts)
    assert snap.queries == 18 and client.requests_sent == 18
    assert snap.util_step == 15.0  # the median scrape interval of the history
    for hist in (labelled_set(21, END), _joined_set()):
        ok, wrong = _accuracy(snap.gpus, hist)
        assert len(hist) >= 100
        assert ok >= 0.95 * len(hist), f"{ok}/{len(hist)}: {wrong}"


GOLDEN = Path(__file__).parents[2] / "fixtures" / "profiler" / "classification-507cf89.json"


def _classes(snap_gpus: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for (n, g), st in sorted(snap_gpus.items()):
        if not st.fresh:
            out[f"{n}/{g}"] = ["gone", None, None]
            continue
        pr = classify_gpu(st)
        out[f"{n}/{g}"] = [pr.pattern, pr.period_seconds, pr.growth_bytes_per_second]
    return out


def _same(got: dict[str, list], want: dict[str, list]) -> list[str]:
    diffs = []
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key), want.get(key)
        if g is None or w is None or g[0] != w[0] or any(
                (a is None) != (b is None) or (a is not None and abs(a - b) > 1e-9 * max(1.0, abs(b)))
                for a, b in zip(g[1:], w[1:], strict=True)):
            diffs.append(f"{key}: {g} != {w}")
    return diffs


@pytest.mark.parametrize(("shard_gpus", "range_gpus", "cap"), [
    (2000, 1000, 16 * 1024 * 1024),  # the defaults: one shard for these 31 nodes
    (16, 3, 16 * 1024 * 1024),  # two nodes per shard, three GPUs per range query
    (2000, 1000, 16 * 1024),  # answers over a 16 KiB cap split their shard or batch until they fit
])
def test_classification_is_todays_whatever_the_sharding(prom: Prometheus, shard_gpus: int, range_gpus: int,
                                                        cap: int) -> None:
    # the labelled histories classified by the single-query profiler of commit 507cf89
    want = json.loads(GOLDEN.read_text())["classes"]
    client = PromClient(prom.url, max_response_bytes=cap)
    reader = Reader(client, QueryConfig(shard_gpus=shard_gpus, range_gpus=range_gpus))
    snap = reader.read(END)
    assert _same(_classes(snap.gpus), want) == []
    assert client.largest_response_bytes <= cap
    nodes = len({k.split("/")[0] for k in want})
    if shard_gpus == 16:
        # queries = 3 + 12 x shards + range batches (at most 3 per shard when a shard's ranges fit a batch:
        # utilisation, memory and the memory range's counts; more here: three GPUs per batch)
        # two nodes per shard at most; a few alone, where their names' trie cuts a pair (promql.plan_shards)
        assert -(-nodes // 2) <= snap.shards <= nodes
        ranges = snap.queries - 3 - 12 * snap.shards
        assert 0 < ranges <= 3 * snap.shards * -(-16 // range_gpus)
    elif cap == 16 * 1024:
        assert snap.shards > 1  # the default shard did not fit 16 KiB
    else:
        assert snap.shards == 1 and snap.queries == 18
    assert reader.builder.join  # the join-set has no node label: the join branch stays


def test_scenario_node_every_case(prom: Prometheus) -> None:
    snap = Reader(PromClient(prom.url), QueryConfig()).read(END)
    gpus = {g: st for (n, g), st in snap.gpus.items() if n == "scn-a"}
    assert set(gpus) == {str(i) for i in range(8)}  # the pod switch did not split GPU 6
    assert not gpus["5"].fresh and all(gpus[g].fresh for g in gpus if g != "5")
    prof = {g: classify_gpu(st) for g, st in gpus.items() if st.fresh}
    assert {g: p.pattern for g, p in prof.items()} == SCENARIO_LABELS
    assert prof["2"].period_seconds == pytest.approx(SCENARIO_PERIOD_S, rel=0.1)
    assert prof["4"].growth_bytes_per_second == pytest.approx(SCENARIO_GROWTH_BPS, rel=0.1)


def test_full_cycle_annotates_nodes_and_then_goes_quiet(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                         make_profiler: Callable[..., Profiler]) -> None:
    api = kubeapi
    foreign = {"example.com/owner": "team-a", "gpu-exporter.io.bak/pattern": "old"}
    # scn-a was annotated by an earlier run, when GPU 5 still existed
    api.add_node("scn-a", annotations={
        **foreign,
        P + "gpu-5.pattern": "steady", P + "gpu-5.uuid": "GPU-old",
        P + "owned-keys": "gpu-5.pattern,gpu-5.uuid",
    })
    # a node whose exporter is gone: it carries our annotations but has no data now
    api.add_node("silent", annotations={P + "gpu-0.pattern": "bursty", P + "pattern": "bursty",
                                        P + "owned-keys": "pattern,gpu-0.pattern"})
    api.add_node("cpu-only", annotations={"example.com/owner": "team-b"})
    api.add_node("lab-000")
    out = io.StringIO()
    prof = make_profiler(prom.url, "--events", "off", "--health-condition", "off", out=out)

    r1 = prof.run_cycle(at=END)
    assert r1.ok and r1.errors == [] and r1.queries == 18
    patches = {r.node: r for r in api.patches()}
    assert set(patches) == {"scn-a", "silent", "lab-000"}  # cpu-only has nothing of ours: untouched
    req = patches["scn-a"]
    assert req.content_type == "application/merge-patch+json"
    sent = req.body["metadata"]["annotations"]
    assert req.body["metadata"]["resourceVersion"] == "1"  # what it was computed from
    period = int(sent.pop(P + "gpu-2.period-seconds"))
    growth = int(sent.pop(P + "gpu-4.memory-growth-bytes-per-second"))
    assert period == pytest.approx(SCENARIO_PERIOD_S, rel=0.1)
    assert growth == pytest.approx(SCENARIO_GROWTH_BPS, rel=0.1)
    uuids = {g: sent.pop(f"{P}gpu-{g}.uuid") for g in "0123467"}
    assert all(u.startswith("GPU-") for u in uuids.values())
    best = sent.pop(P + "best-gpu")
    score = float(sent.pop(P + "best-gpu-score"))
    assert best == "0" and score == pytest.approx(1.0, abs=0.01)  # the idle, empty GPU
    assert sent == {
        P + "gpu-0.pattern": "idle", P + "gpu-1.pattern": "steady", P + "gpu-2.pattern": "periodic",
        P + "gpu-3.pattern": "bursty", P + "gpu-4.pattern": "growing", P + "gpu-6.pattern": "steady",
        P + "gpu-7.pattern": "unknown",
        P + "gpu-5.pattern": None, P + "gpu-5.uuid": None,  # the vanished GPU's keys go
        P + "pattern": "steady",
        P + "idle-gpus": "1",
        P + "owned-keys": ("best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern,gpu-0.uuid,gpu-1.pattern,"
                           "gpu-1.uuid,gpu-2.pattern,gpu-2.period-seconds,gpu-2.uuid,gpu-3.pattern,gpu-3.uuid,"
                           "gpu-4.memory-growth-bytes-per-second,gpu-4.pattern,gpu-4.uuid,gpu-6.pattern,"
                           "gpu-6.uuid,gpu-7.pattern,gpu-7.uuid"),
    }
    node = api.node("scn-a")["metadata"]["annotations"]
    assert {k: node[k] for k in foreign} == foreign
    # the silent node keeps its published pattern for now (hysteresis), nothing else written
    assert patches["silent"].body["metadata"]["annotations"] == {
        P + "pending": "gpu-0.pattern=unknown:1",
        P + "owned-keys": "pattern,pending,gpu-0.pattern"}
    assert prof.metrics.pattern_collector.patterns[("scn-a", "2")] == "periodic"

    api.clear_requests()
    r2 = prof.run_cycle(at=END)
    assert [r.node for r in api.patches()] == ["silent"] and r2.unchanged == 2
    assert api.node("silent")["metadata"]["annotations"] == {
        P + "gpu-0.pattern": "unknown", P + "pattern": "unknown", P + "owned-keys": "pattern,gpu-0.pattern"}

    api.clear_requests()
    r3 = prof.run_cycle(at=END)
    assert api.patches() == [] and r3.patches == 0 and r3.unchanged == 3
    assert [r.method for r in api.requests] == ["GET"]  # one list, nothing else
    assert out.getvalue() == ""  # not a dry run: nothing printed


def test_dry_run_without_cluster_prints_patches(prom: Prometheus, make_profiler: Callable[..., Profiler]) -> None:
    out = io.StringIO()
    prof = make_profiler(prom.url, "--health-condition", "off", cluster=False, out=out)
    r = prof.run_cycle(at=END)
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    nodes = [d["node"] for d in docs]
    assert nodes == sorted(nodes) and "scn-a" in nodes and len(nodes) == r.patches
    ann = next(d for d in docs if d["node"] == "scn-a")["patch"]["metadata"]["annotations"]
    assert ann[P + "gpu-2.pattern"] == "periodic"
    # the overlay keeps the would-be state: the same data again prints nothing
    out.truncate(0)
    out.seek(0)
    assert prof.run_cycle(at=END).patches == 0 and out.getvalue() == ""


def test_uuids_shared_across_nodes_do_not_mix_ranges(tmp_path: Path) -> None:
    # simulated or cloned GPUs can repeat a UUID on every node; the node label keeps them apart
    a = [h for h in scenario_node(5, "dup-a", END) if h.gpu in ("2", "3")]
    b = [replace(h, node="dup-b", uuid=a[i % 2].uuid) for i, h in
         enumerate(h for h in scenario_node(6, "dup-b", END) if h.gpu in ("3", "2"))]
    assert {h.uuid for h in a} == {h.uuid for h in b}
    with Prometheus(tmp_path / "p", tsdb_blocks_from=history_file(tmp_path / "h.om", a + b)) as p:
        reader = Reader(PromClient(p.url), QueryConfig())
        snap = reader.read(END)
    # every series has the node label: the shards' queries leave the join out (it scans the fleet)
    assert not reader.builder.join and "gpu_host_info" not in reader.builder.util_stats("`dup-a`")
    got = {(n, g): classify_gpu(st).pattern for (n, g), st in snap.gpus.items()}
    assert got == {("dup-a", "2"): "periodic", ("dup-a", "3"): "bursty",
                   ("dup-b", "3"): "bursty", ("dup-b", "2"): "periodic"}


def test_lost_gpu_is_unknown_not_removed(tmp_path: Path) -> None:
    # the exporter reports a GPU that fell off the bus as gpu_up 0 and nothing else
    hist = [h for h in scenario_node(7, "lost", END) if h.gpu in ("0", "1")]
    from tests.fakes.profiler_history import write_openmetrics
    from tests.harness.prom import OpenMetricsWriter

    lost = hist[1]
    cut = END - 600
    lost.util = [u if t <= cut else None for t, u in zip(lost.times, lost.util, strict=True)]
    lost.mem_used = [m if t <= cut else None for t, m in zip(lost.times, lost.mem_used, strict=True)]
    with OpenMetricsWriter(tmp_path / "h.om") as w:
        write_openmetrics(w, hist)
        labels = {"gpu": "1", "uuid": lost.uuid, "instance": "lost:9400", "job": "gpu-exporter", "node": "lost"}
        w.add("gpu_up", labels | {"state": "lost"}, [(t, 0.0) for t in lost.times if t > cut])
    with Prometheus(tmp_path / "p", tsdb_blocks_from=tmp_path / "h.om") as p:
        snap = Reader(PromClient(p.url), QueryConfig()).read(END)
    st = snap.gpus[("lost", "1")]
    assert st.fresh and st.up == 0.0
    assert classify_gpu(st).pattern == "unknown"
    assert classify_gpu(snap.gpus[("lost", "0")]).pattern == "idle"


def test_step_is_the_scrape_interval_despite_missed_scrapes(tmp_path: Path) -> None:
    # two missed scrapes make the window's count 119: 1800/119 = 15.1 s must still give a
    # 15 s step, else the range skips a sample every 15 steps and that beat looks periodic
    hist = [h for h in scenario_node(8, "gaps", END) if h.gpu in ("1", "2")]
    for h in hist:
        for i in (40, 80):
            h.util[-i] = None
            h.mem_used[-i] = None
    with Prometheus(tmp_path / "p", tsdb_blocks_from=history_file(tmp_path / "h.om", hist)) as p:
        snap = Reader(PromClient(p.url), QueryConfig()).read(END)
    assert snap.gpus[("gaps", "1")].util_count == 119
    assert snap.util_step == 15.0
    prof = classify_gpu(snap.gpus[("gaps", "2")])
    assert prof.pattern == "periodic" and prof.period_seconds == pytest.approx(SCENARIO_PERIOD_S, rel=0.1)


def test_aggregate_parts_are_joined_by_a_balanced_or() -> None:
    # Prometheus 2 hashes both sides of every `or`: a left-deep chain (`a or b or c ...`, as
    # PromQL parses it) handles the first parts' samples once per later part; a balanced tree
    # log2(k) times, with the same answer
    from exporter.profiler.promql import QueryBuilder, union

    assert union(["a"]) == "a"
    assert union(["a", "b", "c", "d", "e"]) == "(((a or b) or (c or d)) or e)"
    with pytest.raises(ValueError):
        union([])
    for health in (True, False):
        b = QueryBuilder(QueryConfig(health=health))
        for expr in (b.mem_stats("`n1`"), b.util_stats("`n1`")):
            ors: dict[int, int] = {}  # nesting depth -> `or`s at that depth
            depth = 0
            for i, ch in enumerate(expr):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if expr.startswith(" or ", i):
                    ors[depth] = ors.get(depth, 0) + 1
            assert 0 not in ors, "a chain of `or` at the top level"
            assert ors.get(1) == 1, "the top level is one `or` of two halves"
