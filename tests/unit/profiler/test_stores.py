"""The stores large fleets run: VictoriaMetrics (a real one), Thanos and Mimir (their wire format).

* The same labelled history, imported into a real VictoriaMetrics through its own import API
  (default flags) and backfilled into a real Prometheus, gives the same patterns and the same
  GPUHealthy conditions from both.
* Refusals are handled like caps: a store saying a query is over one of its limits, in
  VictoriaMetrics', Thanos' or Mimir's words, makes the profiler ask for half the shard;
  each is counted by kind and logged once.
* A partial answer (Thanos' ``warnings``, VictoriaMetrics cluster's ``isPartial``) fails the
  read: counted, and nothing computed from it is written.
* Mimir's ``/prometheus`` prefix and ``X-Scope-OrgID``, vmselect's ``/select/<tenant>/prometheus``.

The Thanos and Mimir stand-in is tests/harness/profiler.py's FaultProxy in front of the real
Prometheus, speaking what their API docs publish (cited in docs/profiler.md, "Stores").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.profiler import health
from exporter.profiler.classify import classify_gpu
from exporter.profiler.prom import PARTIAL, QUERY_TOO_LONG, TOO_MANY_SAMPLES, TOO_MANY_SERIES, PromClient, PromError
from exporter.profiler.queries import QueryConfig, Reader
from tests.fakes.profiler_history import labelled_set, scenario_node, write_openmetrics
from tests.harness.httpfake import Reply, json_reply
from tests.harness.profiler import FaultProxy
from tests.harness.prom import OpenMetricsWriter, Prometheus
from tests.harness.victoria import VictoriaMetrics
from tests.unit.profiler import test_health

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 120)  # older than VictoriaMetrics' -search.latencyOffset (30 s)


def _history(path: Path) -> Path:
    with OpenMetricsWriter(path) as w:
        write_openmetrics(w, labelled_set(31, END) + scenario_node(5, "scn-v", END), node_label=True)
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, VictoriaMetrics]]:
    tmp = tmp_path_factory.mktemp("stores")
    hist = _history(tmp / "h.om")
    with Prometheus(tmp / "prom", tsdb_blocks_from=hist) as prom, VictoriaMetrics(tmp / "vm") as vm:
        vm.import_openmetrics(hist)
        yield prom, vm


Patterns = dict[tuple[str, str], tuple[str, float | None]]


def _patterns(url: str, at: float = END, **cfg: Any) -> Patterns:
    snap = Reader(PromClient(url, timeout=60), QueryConfig(source="gpu-exporter", **cfg)).read(at)
    out = {}
    for key, st in snap.gpus.items():
        p = classify_gpu(st)
        out[key] = (p.pattern, None if p.period_seconds is None else round(p.period_seconds, 3))
    return out


def test_victoriametrics_gives_the_patterns_prometheus_gives(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    prom, vm = stores
    want = _patterns(prom.url)
    assert len(want) > 100 and len({p for p, _ in want.values()}) >= 5  # every pattern is in the set
    assert _patterns(vm.url) == want
    # small shards and range batches: the shards' name patterns and the step grid hold there too
    assert _patterns(vm.url, shard_gpus=16, range_gpus=3) == want


def test_the_newest_30s_need_the_latency_offset(tmp_path: Path, make_profiler: Any) -> None:
    """VictoriaMetrics flattens a range's points newer than now - 30 s (-search.latencyOffset):
    a cycle evaluated now reads other numbers than Prometheus; --prometheus-latency-offset 30s
    (the cycle evaluated 30 s ago) reads the same."""
    now = float(int(time.time()))
    with OpenMetricsWriter(tmp_path / "h.om") as w:
        write_openmetrics(w, labelled_set(32, now, span_s=2100.0, count=24), node_label=True)
    with Prometheus(tmp_path / "p", tsdb_blocks_from=tmp_path / "h.om") as prom, \
            VictoriaMetrics(tmp_path / "vm") as vm:
        vm.import_openmetrics(tmp_path / "h.om")
        at = float(int(time.time()))
        def last(url: str) -> dict[str, list[float]]:
            got = PromClient(url).query_range("gpu_utilization_ratio", at - 300, at, 5)
            return {s.labels["uuid"]: [v for _, v in s.points[-5:]] for s in got}

        flat, real = last(vm.url), last(prom.url)
        assert any(len(set(v)) == 1 for v in flat.values())
        assert any(flat[u] != v for u, v in real.items())  # the problem, seen
        prof = make_profiler(vm.url, "--source", "gpu-exporter", "--prometheus-latency-offset", "30s",
                             cluster=False)
        assert prof.clock() - prof.latency_offset_s <= time.time() - 30
        offset_at = float(int(time.time())) - 30
        assert _patterns(vm.url, at=offset_at) == _patterns(prom.url, at=offset_at)


def test_victoriametrics_gives_the_health_conditions_prometheus_gives(tmp_path: Path) -> None:
    hist = test_health._history(tmp_path / "h.om")
    with Prometheus(tmp_path / "p", tsdb_blocks_from=hist) as prom, VictoriaMetrics(tmp_path / "vm") as vm:
        vm.import_openmetrics(hist)
        for at, col in ((test_health.AT_FAULT, 0), (test_health.AT_OK, 1)):
            got = {}
            for url in (prom.url, vm.url):
                snap = Reader(PromClient(url), QueryConfig(health=True, window_s=1800)).read(at)
                per_node: dict[str, dict[str, Any]] = {}
                for (node, gpu), st in snap.gpus.items():
                    per_node.setdefault(node, {})[gpu] = st
                got[url] = {n: health.observe(g).reason for n, g in per_node.items()}
            assert got[vm.url] == got[prom.url]
            seen = {n: w[col] for n, w in test_health.WANT.items() if w[col] != health.NOT_SCRAPED}
            assert {n: r for n, r in got[vm.url].items() if n in seen} == seen


def test_both_stores_name_their_metrics(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    """The label values of __name__ over the window (a GET: Prometheus serves it to no POST), which
    leave the statistics of absent metrics out of the shards' queries."""
    for store in stores:
        names = PromClient(store.url).label_values("__name__", END - 3600, END)
        assert {"gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_up"} <= set(names)
        assert "gpu_xid_errors_total" not in names and "gpu_allocation_info" not in names


@pytest.mark.parametrize("names", [Reply(404, b"404 page not found\n"),
                                   json_reply({"status": "success", "data": ["up", "gpu_xid_errors_total"]}),
                                   json_reply({"status": "success", "data": {"names": []}})],
                         ids=["no endpoint", "not this window's", "malformed"])
def test_without_the_metric_names_every_statistic_is_asked_for(tmp_path: Path, names: Reply,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A store (or proxy) without the label values endpoint, or with an answer that cannot be this
    window's (it lacks the metric the GPUs were found by), costs only the pruning: every statistic
    is asked for, and the health conditions read are the same."""
    hist = test_health._history(tmp_path / "h.om")

    def read(url: str) -> tuple[dict[str, str], int]:
        reader = Reader(PromClient(url), QueryConfig(health=True, window_s=1800))
        snap = reader.read(test_health.AT_FAULT)
        per_node: dict[str, dict[str, Any]] = {}
        for (node, gpu), st in snap.gpus.items():
            per_node.setdefault(node, {})[gpu] = st
        return {n: health.observe(g).reason for n, g in per_node.items()}, snap.queries

    with Prometheus(tmp_path / "p", tsdb_blocks_from=hist) as prom:
        want, pruned = read(prom.url)
        with FaultProxy(prom.url, names=names) as proxy, \
                caplog.at_level(logging.INFO, logger="exporter.profiler.queries"):
            got, every = read(proxy.url)
    assert got == want
    assert every > pruned  # the history lacks some of the health metrics: their statistics cost queries
    said = [r.getMessage() for r in caplog.records if "metric names are not available" in r.getMessage()]
    assert len(said) == 1


def test_a_partial_metric_names_answer_fails_the_cycle_like_a_partial_query(
        stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    """A names answer that says some of the data is missing (vmselect's isPartial; Thanos' warnings)
    is not used, and nothing is read from that store this cycle: its queries would be partial too."""
    prom, _ = stores
    partial = json_reply({"status": "success", "isPartial": True, "data": ["gpu_up", "gpu_utilization_ratio"]})
    with FaultProxy(prom.url, names=partial) as store:
        reader = Reader(PromClient(store.url, timeout=60), QueryConfig(source="gpu-exporter"))
        with pytest.raises(PromError) as err:
            reader.read(END)
    assert err.value.kind == PARTIAL and store.queries == [""]  # the names request alone


def test_vmselect_path_prefix(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    """vmselect (the cluster) serves tenant 0's API under /select/0/prometheus; the single-node
    binary has no such path, so a proxy strips it, as vmselect routes it."""
    prom, vm = stores
    with FaultProxy(vm.url, prefix="/select/0/prometheus") as proxy:
        assert _patterns(proxy.url + "/select/0/prometheus") == _patterns(prom.url)
        with pytest.raises(PromError) as err:
            _patterns(proxy.url)  # the cluster's root is not the query API
        assert "HTTP 404" in str(err.value)


# What the stores answer when a query is over one of their limits (docs/profiler.md, "Refusals"):
VM_SERIES = (422, "error when executing query: the number of matching timeseries exceeds 100; either narrow down "
                  "the search or increase -search.max* command-line flag values at vmselect (the most likely limit "
                  "is -search.maxUniqueTimeseries)")
VM_SAMPLES = (422, "cannot select more than -search.maxSamplesPerQuery=1000 samples; possible solutions: increase "
                   "the -search.maxSamplesPerQuery; reduce time range for the query")
MIMIR_SERIES = (422, "expanding series: the query exceeded the maximum number of series (limit: 100 series) "
                     "(err-mimir-max-series-per-query). To adjust the related per-tenant limit, configure "
                     "-querier.max-fetched-series-per-query, or contact your service administrator.")
MIMIR_CHUNKS = (422, "the query exceeded the maximum number of chunks (limit: 100 chunks) "
                     "(err-mimir-max-chunks-per-query)")
THANOS_SERIES = (422, "rpc error: code = Aborted desc = exceeded series limit: limit 100 violated (got 101)")
PROM_SAMPLES = (422, "query processing would load too many samples into memory in query execution")


@pytest.mark.parametrize(("refusal", "kind"), [(VM_SERIES, TOO_MANY_SERIES), (VM_SAMPLES, TOO_MANY_SAMPLES),
                                               (MIMIR_SERIES, TOO_MANY_SERIES), (MIMIR_CHUNKS, TOO_MANY_SAMPLES),
                                               (THANOS_SERIES, TOO_MANY_SERIES), (PROM_SAMPLES, TOO_MANY_SAMPLES)])
def test_a_limit_refusal_splits_the_shard_like_a_cap(stores: tuple[Prometheus, VictoriaMetrics],
                                                     refusal: tuple[int, str], kind: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    prom, _ = stores
    want = _patterns(prom.url)
    # 40 series: a shard's statistic (one series a GPU) is refused until the shard is split twice or more
    with FaultProxy(prom.url, refuse=lambda q, series: refusal if series > 40 else None) as store:
        reader = Reader(PromClient(store.url, timeout=60), QueryConfig(source="gpu-exporter"))
        with caplog.at_level(logging.DEBUG, logger="exporter.profiler.queries"):
            snap = reader.read(END)
    got = {k: (classify_gpu(st).pattern) for k, st in snap.gpus.items()}
    assert got == {k: p for k, (p, _) in want.items()}
    assert reader.refusals[kind] >= 2 and set(reader.refusals) == {kind}
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and kind in r.getMessage()]
    assert len(warned) == 1  # logged once; the rest are counted (and at debug level)


def test_a_query_the_store_finds_too_long_is_asked_for_in_halves_down_to_one_node(
        stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    prom, _ = stores
    # a shard's query (its node pattern in backquotes) does not fit 60 bytes, even for one node; the
    # cluster-wide ones (nodes, unlabelled series) do not count
    vm_words = "too long query; got {n} bytes; mustn't exceed `-search.maxQueryLen=60` bytes"
    with FaultProxy(prom.url, refuse=lambda q, _: (422, vm_words.format(n=len(q)))
                    if len(q) > 60 and "=~`" in q else None) \
            as store:
        reader = Reader(PromClient(store.url, timeout=60), QueryConfig(source="gpu-exporter"))
        with pytest.raises(PromError) as err:
            reader.read(END)
    assert err.value.kind == QUERY_TOO_LONG and "search.maxQueryLen" in str(err.value)
    assert reader.refusals[QUERY_TOO_LONG] > 1  # halved, down to one node, before giving up


def test_no_query_sent_is_longer_than_the_limit(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    prom, _ = stores
    with FaultProxy(prom.url) as store:
        _patterns(store.url, max_query_bytes=8192, health=True)
        assert max(len(q.encode()) for q in store.queries) <= 8192
        many = len(store.queries)
    with FaultProxy(prom.url) as store:
        _patterns(store.url, health=True)
        assert max(len(q.encode()) for q in store.queries) <= 16384 and len(store.queries) <= many


THANOS_PARTIAL = {"warnings": ["fetching series: receive series from Addr: 10.0.0.7:10901 LabelSets: "
                               "{cluster=\"b\"} MinTime: 0 MaxTime: 9223372036854775807: rpc error: code = "
                               "Unavailable desc = connection refused"]}
VM_PARTIAL = {"isPartial": True}


@pytest.mark.parametrize("extra", [THANOS_PARTIAL, VM_PARTIAL])
def test_a_partial_answer_is_counted_and_nothing_is_written(stores: tuple[Prometheus, VictoriaMetrics],
                                                            extra: dict[str, Any], make_profiler: Any) -> None:
    prom, _ = stores
    with FaultProxy(prom.url, extra=extra) as store:
        out: list[str] = []

        class Out:
            def write(self, s: str) -> int:
                out.append(s)
                return len(s)

            def flush(self) -> None:
                pass

        prof = make_profiler(store.url, "--source", "gpu-exporter", cluster=False, out=Out())
        res = prof.run_cycle(at=END)
    assert not res.ok and res.patches == 0 and "".join(out) == ""
    assert prof.metrics.errors.labels(PARTIAL)._value.get() == 1


def test_promql_annotations_are_not_partial_answers(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    prom, _ = stores
    extra = {"warnings": ["PromQL warning: encountered a mix of histograms and floats for metric name \"x\""]}
    with FaultProxy(prom.url, extra=extra) as store:
        assert _patterns(store.url) == _patterns(prom.url)


def test_mimir_tenant_and_prefix(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    """Mimir serves the Prometheus API under /prometheus and needs X-Scope-OrgID (else 401 "no org id")."""
    prom, _ = stores
    with FaultProxy(prom.url, prefix="/prometheus", tenant="team-a") as mimir:
        client = PromClient(mimir.url + "/prometheus", headers={"X-Scope-OrgID": "team-a"}, timeout=60)
        snap = Reader(client, QueryConfig(source="gpu-exporter")).read(END)
        assert {k: classify_gpu(st).pattern for k, st in snap.gpus.items()} == \
            {k: p for k, (p, _) in _patterns(prom.url).items()}
        with pytest.raises(PromError) as err:
            Reader(PromClient(mimir.url + "/prometheus"), QueryConfig(source="gpu-exporter")).read(END)
        assert "HTTP 401" in str(err.value) and "no org id" in str(err.value)


def test_every_query_carries_nocache(stores: tuple[Prometheus, VictoriaMetrics]) -> None:
    """VictoriaMetrics aligns a range to multiples of its step and evaluates an instant query up to
    -search.latencyOffset earlier unless nocache=1: sent with every query (others ignore it)."""
    prom, _ = stores
    with FaultProxy(prom.url) as store:
        _patterns(store.url)
    queries = [p for p, path in zip(store.params, store.paths, strict=True) if path.startswith("/api/v1/query")]
    assert queries and all(p.get("nocache") == ["1"] for p in queries)
