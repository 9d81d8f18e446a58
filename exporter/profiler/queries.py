"""The profiler's PromQL: a fixed set of queries per cycle, whatever the number of nodes.

Four queries per cycle, all for the whole cluster, grouped by (node, gpu, uuid):

1. utilisation aggregates (instant): mean, stddev, 95th percentile, sample count, count in
   the older half of the window, count in the freshness period;
2. memory aggregates (instant): mean used, mean free, total, counts, last ``gpu_up``;
3. utilisation range (query_range): only for GPUs whose variation could be a period
   (coefficient of variation and level above the thresholds, filtered in PromQL with
   ``@ end()`` so the filter is evaluated once, at the end of the range);
4. memory used range (query_range, coarse step): only for GPUs whose ``deriv`` over the
   window could be a leak.

Node identity: the shipped scrape configs put a ``node`` label on every series. A series
without it (a user's own scrape config) is joined to ``gpu_host_info`` on ``instance``,
which carries the exporter's own ``node`` label. Both branches run in every query (``or``),
so a cluster mixing the two works and the join costs nothing when every series has the
label. Per-GPU series may carry ``pod``/``namespace``/``container`` (attribution) and be
scraped by more than one job: ``max by (node, gpu, uuid)`` folds those into one series.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.profiler.classify import GpuStats, Thresholds
from exporter.profiler.prom import BAD_RESPONSE, PromClient, PromError, RangeSeries

log = logging.getLogger(__name__)

UTIL = "gpu_utilization_ratio"
MEM_USED = "gpu_memory_used_bytes"
MEM_FREE = "gpu_memory_free_bytes"
MEM_TOTAL = "gpu_memory_total_bytes"
UP = "gpu_up"
HOST_INFO = "gpu_host_info"

EMPTY = "prometheus_empty"  # error kind: every query answered, none had a GPU series
QUERIES_PER_CYCLE = 4

_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def duration(seconds: float) -> str:
    """PromQL duration for whole seconds (``1800s``)."""
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class QueryConfig:
    """Window and label choices for one cycle's queries."""

    window_s: float = 1800.0
    fresh_s: float = 300.0  # a GPU with no sample this recent is gone
    step_s: float | None = None  # utilisation range step; None: the median scrape interval
    min_step_s: float = 5.0
    max_points: int = 500  # cap on points per utilisation range series
    mem_points: int = 30  # points of the memory range (Theil-Sen is O(N^2))
    node_label: str = "node"
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        if not _LABEL_RE.match(self.node_label):
            raise ValueError(f"node label {self.node_label!r} is not a valid Prometheus label name")


class QueryBuilder:
    """Builds the PromQL text for a :class:`QueryConfig` (pure, testable)."""

    def __init__(self, cfg: QueryConfig) -> None:
        self.cfg = cfg
        nl = cfg.node_label
        self.by = f"{nl}, gpu, uuid"
        host = f"max by (instance, {nl}) ({HOST_INFO})"
        if nl != "node":
            host = f'max by (instance, {nl}) (label_replace({HOST_INFO}, "{nl}", "$1", "node", "(.+)"))'
        self._host = host

    def per_gpu(self, fn: Callable[[str], str]) -> str:
        """``max by (node, gpu, uuid)`` of ``fn(selector matcher)``, with the join fallback.

        ``fn`` receives the matcher to put inside the metric's braces, e.g.
        ``lambda m: f"avg_over_time(gpu_utilization_ratio{{{m}}}[1800s])"``.
        """
        nl = self.cfg.node_label
        has_node = nl + '!=""'
        no_node = nl + '=""'
        labelled = fn(has_node)
        joined = f"{fn(no_node)} * on (instance) group_left ({nl}) {self._host}"
        return f"max by ({self.by}) ({labelled} or ({joined}))"

    @staticmethod
    def tag(expr: str, stat: str) -> str:
        return f'label_replace({expr}, "stat", "{stat}", "gpu", ".*")'

    def util_stats(self) -> str:
        w = duration(self.cfg.window_s)
        half = duration(self.cfg.window_s / 2)
        f = duration(self.cfg.fresh_s)
        parts = {
            "mean": lambda m: f"avg_over_time({UTIL}{{{m}}}[{w}])",
            "std": lambda m: f"stddev_over_time({UTIL}{{{m}}}[{w}])",
            "p95": lambda m: f"quantile_over_time(0.95, {UTIL}{{{m}}}[{w}])",
            "count": lambda m: f"count_over_time({UTIL}{{{m}}}[{w}])",
            "early": lambda m: f"count_over_time({UTIL}{{{m}}}[{half}] offset {half})",
            "fresh": lambda m: f"count_over_time({UTIL}{{{m}}}[{f}])",
        }
        return " or ".join(self.tag(self.per_gpu(fn), stat) for stat, fn in parts.items())

    def mem_stats(self) -> str:
        w = duration(self.cfg.window_s)
        half = duration(self.cfg.window_s / 2)
        f = duration(self.cfg.fresh_s)
        parts = {
            "used": lambda m: f"avg_over_time({MEM_USED}{{{m}}}[{w}])",
            "free": lambda m: f"avg_over_time({MEM_FREE}{{{m}}}[{w}])",
            "total": lambda m: f"max_over_time({MEM_TOTAL}{{{m}}}[{w}])",
            "count": lambda m: f"count_over_time({MEM_USED}{{{m}}}[{w}])",
            "early": lambda m: f"count_over_time({MEM_USED}{{{m}}}[{half}] offset {half})",
            "fresh": lambda m: f"count_over_time({MEM_USED}{{{m}}}[{f}])",
            "up": lambda m: f"last_over_time({UP}{{{m}}}[{f}])",
        }
        return " or ".join(self.tag(self.per_gpu(fn), stat) for stat, fn in parts.items())

    def util_range(self) -> str:
        th = self.cfg.thresholds
        w = duration(self.cfg.window_s)
        on = f"on ({self.by})"
        mean = self.per_gpu(lambda m: f"avg_over_time({UTIL}{{{m}}}[{w}] @ end())")
        std = self.per_gpu(lambda m: f"stddev_over_time({UTIL}{{{m}}}[{w}] @ end())")
        p95 = self.per_gpu(lambda m: f"quantile_over_time(0.95, {UTIL}{{{m}}}[{w}] @ end())")
        # a margin below the classifier's thresholds, so no borderline GPU misses its range
        cv = 0.8 * th.steady_cv
        busy = f"({mean} >= {0.8 * th.idle_util_mean:g} or {p95} >= {0.8 * th.idle_util_p95:g})"
        want = f"(({std} > {cv:g} * {mean}) and {on} {busy})"
        return f"{self.per_gpu(lambda m: f'{UTIL}{{{m}}}')} and {on} {want}"

    def mem_range(self) -> str:
        th = self.cfg.thresholds
        w = duration(self.cfg.window_s)
        ws = self.cfg.window_s
        on = f"on ({self.by})"
        deriv = self.per_gpu(lambda m: f"deriv({MEM_USED}{{{m}}}[{w}] @ end())")
        total = self.per_gpu(lambda m: f"max_over_time({MEM_TOTAL}{{{m}}}[{w}] @ end())")
        want = f"({deriv} * {ws:g} > {0.5 * th.growth_min_fraction:g} * {total})"
        return f"{self.per_gpu(lambda m: f'{MEM_USED}{{{m}}}')} and {on} {want}"


@dataclass
class Snapshot:
    """Everything one cycle read: per-GPU stats keyed by (node, gpu), and bookkeeping."""

    at: float
    gpus: dict[tuple[str, str], GpuStats]
    queries: int
    util_step: float
    mem_step: float
    dropped_series: int = 0  # series with no node (no label and no gpu_host_info to join)


def _key(labels: dict[str, str], node_label: str) -> tuple[str, str, str] | None:
    node = labels.get(node_label, "")
    gpu = labels.get("gpu", "")
    if not node or not gpu:
        return None
    return node, gpu, labels.get("uuid", "")


def _median_interval(counts: list[float], window_s: float) -> float | None:
    good = [window_s / c for c in counts if c and c > 1 and math.isfinite(c)]
    return statistics.median(good) if good else None


class Reader:
    """Runs the cycle's queries against one :class:`PromClient` and assembles GpuStats."""

    def __init__(self, client: PromClient, cfg: QueryConfig) -> None:
        self.client = client
        self.cfg = cfg
        self.builder = QueryBuilder(cfg)
        self.queries_sent = 0  # logical queries, cumulative (HTTP retries not counted)

    def read(self, at: float) -> Snapshot:
        """All four queries evaluated at unix time ``at``; raises PromError on any failure.

        A failed query fails the whole read: classifying from part of the data could write
        a wrong annotation (a GPU without its range would look unknown, for instance).
        """
        cfg = self.cfg
        queries = 0
        queries += 1
        self.queries_sent += 1
        util = self.client.query(self.builder.util_stats(), at)
        queries += 1
        self.queries_sent += 1
        mem = self.client.query(self.builder.mem_stats(), at)
        stats: dict[tuple[str, str, str], dict[str, float]] = {}
        dropped = 0
        for prefix, samples in (("util_", util), ("mem_", mem)):
            for s in samples:
                k = _key(s.labels, cfg.node_label)
                stat = s.labels.get("stat")
                if stat is None:
                    raise PromError(BAD_RESPONSE, "aggregate series without its 'stat' label")
                if k is None:
                    dropped += 1
                    continue
                stats.setdefault(k, {})[prefix + stat] = s.value
        if not stats:
            raise PromError(EMPTY, f"no GPU series ({UTIL}, {MEM_USED}) in Prometheus for the last "
                                   f"{duration(cfg.window_s)}: check --prometheus-url and the scrape config")

        step = cfg.step_s
        if step is None:
            counts = [v["util_count"] for v in stats.values() if "util_count" in v]
            step = _median_interval(counts, cfg.window_s) or 15.0
        step = max(step, cfg.min_step_s, cfg.window_s / cfg.max_points)
        step = float(math.ceil(step))
        mem_step = float(max(1, math.ceil(cfg.window_s / cfg.mem_points)))
        start = at - cfg.window_s
        queries += 1
        self.queries_sent += 1
        util_ranges = self.client.query_range(self.builder.util_range(), start, at, step)
        queries += 1
        self.queries_sent += 1
        mem_ranges = self.client.query_range(self.builder.mem_range(), start + mem_step / 2, at, mem_step)

        gpus: dict[tuple[str, str], GpuStats] = {}
        chosen_uuid: dict[tuple[str, str], str] = {}
        for (node, gpu, uuid), v in stats.items():
            fresh = any(v.get(s, 0.0) > 0 for s in ("util_fresh", "mem_fresh"))
            fresh = fresh or math.isfinite(v.get("mem_up", math.nan))
            st = GpuStats(
                node=node, gpu=gpu, uuid=uuid, window_s=cfg.window_s, fresh=fresh,
                up=v.get("mem_up"),
                util_mean=v.get("util_mean"), util_std=v.get("util_std"), util_p95=v.get("util_p95"),
                util_count=v.get("util_count"), util_early=v.get("util_early"),
                mem_used_mean=v.get("mem_used"), mem_total=v.get("mem_total"), mem_free_mean=v.get("mem_free"),
                mem_count=v.get("mem_count"), mem_early=v.get("mem_early"),
                util_step=step, mem_step=mem_step,
            )  # fmt: skip
            prev = gpus.get((node, gpu))
            # a GPU replaced at the same index: the fresh one (then the one with more data) wins
            if prev is None or (st.fresh, st.util_count or 0) > (prev.fresh, prev.util_count or 0):
                gpus[(node, gpu)] = st
                chosen_uuid[(node, gpu)] = uuid
        self._attach(gpus, chosen_uuid, util_ranges, start, at, step, "util_range")
        self._attach(gpus, chosen_uuid, mem_ranges, start + mem_step / 2, at, mem_step, "mem_range")
        if dropped:
            log.warning("%d aggregate series had no %r label and no %s to join on instance; ignored",
                        dropped, cfg.node_label, HOST_INFO)
        return Snapshot(at=at, gpus=gpus, queries=queries, util_step=step, mem_step=mem_step,
                        dropped_series=dropped)

    def _attach(self, gpus: dict[tuple[str, str], GpuStats], chosen: dict[tuple[str, str], str],
                series: list[RangeSeries], start: float, end: float, step: float, attr: str) -> None:
        n = math.floor((end - start) / step + 1e-9)
        for rs in series:
            k = _key(rs.labels, self.cfg.node_label)
            if k is None or chosen.get(k[:2]) != k[2]:
                continue
            vals: list[float | None] = [None] * (n + 1)
            for t, v in rs.points:
                i = round((t - start) / step)
                if 0 <= i <= n and math.isfinite(v):
                    vals[i] = v
            setattr(gpus[k[:2]], attr, vals)


def by_node(snapshot: Snapshot) -> dict[str, dict[str, GpuStats]]:
    """Group a snapshot's GPUs by node name."""
    out: dict[str, dict[str, GpuStats]] = {}
    for (node, gpu), st in snapshot.gpus.items():
        out.setdefault(node, {})[gpu] = st
    return out

