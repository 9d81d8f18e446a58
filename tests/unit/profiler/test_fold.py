"""fold.py: a shard's answers to per-GPU statistics, as a pure function (no server, no client)."""

from __future__ import annotations

import pytest

from exporter.profiler import sources
from exporter.profiler.fold import attach_counts, attach_range, fold_shard, ours_key
from exporter.profiler.prom import BAD_RESPONSE, PromError, RangeSeries, Sample
from exporter.profiler.promql import QueryConfig

CFG = QueryConfig(source="gpu-exporter", window_s=1800, fresh_s=300)
OURS = sources.make(sources.OURS, "node")


def _s(stat: str, value: float, node: str = "n1", gpu: str = "0", uuid: str = "GPU-a", **extra: str) -> Sample:
    return Sample({"node": node, "gpu": gpu, "uuid": uuid, "stat": stat, **extra}, value)


def _util(mean: float, std: float, count: float = 120, node: str = "n1", gpu: str = "0",
          uuid: str = "GPU-a") -> list[Sample]:
    stats = {"mean": mean, "std": std, "p95": mean + 2 * std, "count": count, "early": count / 2, "fresh": 20}
    return [_s(stat, v, node, gpu, uuid) for stat, v in stats.items()]


def test_two_jobs_of_one_gpu_fold_to_the_larger_value_and_other_nodes_are_ignored() -> None:
    util = [*_util(0.5, 0.3), _s("mean", 0.7, job="second"), *_util(0.9, 0.0, node="n9", uuid="GPU-z")]
    mem = [_s("used", 2e9), _s("total", 8e9), _s("fresh", 20), _s("deriv", 0.0)]
    fold = fold_shard(CFG, OURS, ["n1"], [(None, util)], [(None, mem)], [], mem_step=60)
    assert set(fold.gpus) == {("n1", "0")}
    st = fold.gpus[("n1", "0")]
    assert st.util_mean == 0.7 and st.mem_used_mean == 2e9 and st.mem_total == 8e9 and st.fresh
    assert st.util_step == 15.0  # 120 samples in 30 minutes, evenly in both halves
    # a busy GPU whose variation could be a period has its utilisation range asked for, by uuid
    assert fold.want_util == {(15.0, "uuid"): ["GPU-a"]} and fold.want_mem == {}
    assert fold.by_uuid == {"GPU-a": ("n1", "0")}


def test_a_statistic_asked_for_alone_needs_no_stat_label() -> None:
    """A named statistic is its own query, bare (promql.Part): its answer's series carry no stat label,
    the reader names the answer; a union's answer beside it names its series itself."""
    gpu = {"node": "n1", "gpu": "0", "uuid": "GPU-a"}
    tagged = _util(0.5, 0.3)
    bare = [(s.labels["stat"], [Sample(gpu, s.value)]) for s in tagged]
    mem = [("used", [Sample(gpu, 2e9)]), ("total", [Sample(gpu, 8e9)]), (None, [_s("fresh", 20), _s("deriv", 0.0)])]
    want = fold_shard(CFG, OURS, ["n1"], [(None, tagged)], [(None, [_s("used", 2e9), _s("total", 8e9), _s("fresh", 20),
                                                                      _s("deriv", 0.0)])], [], mem_step=60)
    got = fold_shard(CFG, OURS, ["n1"], bare, mem, [], mem_step=60)
    assert got.gpus == want.gpus and got.gpus[("n1", "0")].util_mean == 0.5
    assert got.gpus[("n1", "0")].mem_total == 8e9 and got.want_util == want.want_util


def test_series_without_node_or_gpu_are_counted_and_a_missing_stat_is_a_bad_answer() -> None:
    fold = fold_shard(CFG, OURS, ["n1"], [(None, [Sample({"gpu": "0", "stat": "mean"}, 0.1)])], [], [], mem_step=60)
    assert fold.dropped == 1 and fold.gpus == {}
    with pytest.raises(PromError) as err:
        fold_shard(CFG, OURS, ["n1"], [(None, [Sample({"node": "n1", "gpu": "0"}, 0.1)])], [], [], mem_step=60)
    assert err.value.kind == BAD_RESPONSE


def test_allocation_holders_and_a_shared_uuid() -> None:
    util = [*_util(0.0, 0.0), *_util(0.0, 0.0, node="n2", uuid="GPU-a")]
    alloc = [Sample({"node": "n1", "gpu": "0", "uuid": "GPU-a", "namespace": "ml", "pod": "train"}, 90)]
    fold = fold_shard(CFG, OURS, ["n1", "n2"], [(None, util)], [], alloc, mem_step=60)
    assert fold.gpus[("n1", "0")].holders == {"ml/train": 90}
    assert fold.shared_uuids == ["GPU-a"] and fold.by_uuid == {}  # matched by node label only


def test_range_points_go_to_the_nearest_slot_of_the_grid_and_fold_by_max() -> None:
    fold = fold_shard(CFG, OURS, ["n1"], [(None, _util(0.5, 0.3))], [], [], mem_step=60)
    start, step, end = 1000.0, 15.0, 1060.0
    series = [RangeSeries({"node": "n1", "gpu": "0", "uuid": "GPU-a"}, [(1000.0, 0.2), (1016.0, 0.4), (1060.0, 0.9)]),
              RangeSeries({"node": "n1", "gpu": "0", "uuid": "GPU-a", "pod": "p"}, [(1015.0, 0.6), (1075.0, 1.0)]),
              RangeSeries({"node": "n1", "gpu": "0", "uuid": "GPU-other"}, [(1030.0, 1.0)])]
    attach_range(fold.gpus, fold.by_uuid, series, ours_key("node"), attr="util_range", label="uuid", start=start,
                 step=step, end=end, scale=1.0)
    assert fold.gpus[("n1", "0")].util_range == [0.2, 0.6, None, None, 0.9]


def test_memory_counts_go_to_their_gpu_by_node_or_single_uuid_and_fold_by_max() -> None:
    # the growth test's counts arrive with the memory range (promql.mem_counts), not in the aggregates
    mem = [_s("used", 2e9), _s("total", 8e9), _s("fresh", 20), _s("deriv", 1e6)]
    fold = fold_shard(CFG, OURS, ["n1"], [(None, _util(0.5, 0.3))], [(None, mem)], [], mem_step=60)
    assert fold.want_mem == {"uuid": ["GPU-a"]}
    st = fold.gpus[("n1", "0")]
    assert st.mem_count is None and st.mem_early is None
    key = ours_key("node")
    attach_counts(fold.gpus, fold.by_uuid, [
        _s("count", 100), _s("count", 120, job="second"), _s("early", 60),
        _s("early", 999, uuid="GPU-other"),  # another GPU's UUID on this node and index: not this GPU's
        _s("count", 999, node="n9"),  # a node of another shard
        Sample({"gpu": "0", "uuid": "GPU-a", "stat": "early", "job": "unlabelled"}, 70.0),  # no node: by its UUID
        _s("count", float("nan")),
    ], key, label="uuid")
    assert st.mem_count == 120 and st.mem_early == 70
    with pytest.raises(PromError) as err:
        attach_counts(fold.gpus, fold.by_uuid, [Sample({"node": "n1", "gpu": "0", "uuid": "GPU-a"}, 1.0)], key,
                      label="uuid")
    assert err.value.kind == BAD_RESPONSE
