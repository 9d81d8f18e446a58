"""The profiler's PromQL: at most four queries per cycle, whatever the number of nodes.

All queries are for the whole cluster:

1. utilisation aggregates (instant), grouped by (node, gpu, uuid): mean, stddev, 95th
   percentile, sample count, count in the older half of the window, count in the
   freshness period;
2. memory aggregates (instant): mean used, mean free, total, ``deriv`` of used, counts,
   last ``gpu_up``;
3. utilisation range (query_range) of only the GPUs whose variation could be a period
   (not idle, coefficient of variation near or above the steady threshold, decided from
   query 1), selected by ``uuid``;
4. memory used range (query_range, coarse step) of only the GPUs whose ``deriv`` could
   be a leak (from query 2), selected by ``uuid``.

Queries 3 and 4 are skipped when no GPU needs them. They select raw series and the
per-GPU folding is done here: Prometheus 2.x evaluates an aggregation in a range query at
every step, which measured five times slower than selecting the series.

Node identity: the shipped scrape configs put a ``node`` label on every series. A series
without it (a user's own scrape config) is joined to ``gpu_host_info`` on ``instance``,
which carries the exporter's own ``node`` label. Both branches run in queries 1 and 2
(``or``), so a cluster mixing the two works and the join costs nothing when every series
has the label; queries 3 and 4 map series to nodes through their ``uuid``. Per-GPU series
may carry ``pod``/``namespace``/``container`` (attribution) and be scraped by more than
one job: ``max by (node, gpu, uuid)`` (and its equivalent here for ranges) folds those
into one series per GPU.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.profiler.classify import GpuStats, Thresholds, finite
from exporter.profiler.prom import BAD_RESPONSE, PromClient, PromError, RangeSeries

log = logging.getLogger(__name__)

UTIL = "gpu_utilization_ratio"
MEM_USED = "gpu_memory_used_bytes"
MEM_FREE = "gpu_memory_free_bytes"
MEM_TOTAL = "gpu_memory_total_bytes"
UP = "gpu_up"
HOST_INFO = "gpu_host_info"

EMPTY = "prometheus_empty"  # error kind: every query answered, none had a GPU series
QUERIES_PER_CYCLE = 4  # at most

T = TypeVar("T")
U = TypeVar("U")

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

    def _host(self, at: str) -> str:
        nl = self.cfg.node_label
        if nl == "node":
            return f"max by (instance, {nl}) ({HOST_INFO}{at})"
        return f'max by (instance, {nl}) (label_replace({HOST_INFO}{at}, "{nl}", "$1", "node", "(.+)"))'

    def per_gpu(self, fn: Callable[[str], str], at: str = "") -> str:
        """``max by (node, gpu, uuid)`` of ``fn(selector matcher)``, with the join fallback.

        ``fn`` receives the matcher to put inside the metric's braces, e.g.
        ``lambda m: f"avg_over_time(gpu_utilization_ratio{{{m}}}[1800s])"``. ``at`` (`` @ end()``)
        pins the join too, so that Prometheus evaluates the whole expression once per range
        query instead of once per step (step-invariant expressions).
        """
        nl = self.cfg.node_label
        has_node = nl + '!=""'
        no_node = nl + '=""'
        labelled = fn(has_node)
        joined = f"{fn(no_node)} * on (instance) group_left ({nl}) {self._host(at)}"
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
            "deriv": lambda m: f"deriv({MEM_USED}{{{m}}}[{w}])",
            "up": lambda m: f"last_over_time({UP}{{{m}}}[{f}])",
        }
        return " or ".join(self.tag(self.per_gpu(fn), stat) for stat, fn in parts.items())

    def util_range(self, uuids: Iterable[str]) -> str:
        """Raw utilisation series of the GPUs with these UUIDs (a query_range)."""
        return f"{UTIL}{{uuid=~{uuid_regex(uuids)}}}"

    def mem_range(self, uuids: Iterable[str]) -> str:
        """Raw memory-used series of the GPUs with these UUIDs (a query_range)."""
        return f"{MEM_USED}{{uuid=~{uuid_regex(uuids)}}}"


def uuid_regex(uuids: Iterable[str]) -> str:
    """A PromQL raw-string (backquoted) regex matching exactly these UUIDs."""
    return "`" + "|".join(re.sub(r"([^A-Za-z0-9_])", r"\\\1", u) for u in sorted(set(uuids))) + "`"


def selectable(uuid: str) -> bool:
    """Whether a UUID can be put into :func:`uuid_regex` (no backquote, not empty)."""
    return bool(uuid) and "`" not in uuid and uuid.isprintable()


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
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promql")

    def read(self, at: float) -> Snapshot:
        """All queries evaluated at unix time ``at``; raises PromError on any failure.

        A failed query fails the whole read: classifying from part of the data could write
        a wrong annotation (a GPU without its range would look unknown, for instance).
        The two instant queries run side by side, then the two range queries: Prometheus
        computes one while we parse the other.
        """
        cfg = self.cfg
        util, mem = self._both(lambda: self.client.query(self.builder.util_stats(), at),
                               lambda: self.client.query(self.builder.mem_stats(), at))
        queries = 2
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
        # nearest whole second: a step even slightly longer than the scrape interval skips a
        # sample now and then, and that beat looks like a period of its own
        step = float(max(1, round(max(step, cfg.min_step_s, cfg.window_s / cfg.max_points))))
        mem_step = float(max(1, math.ceil(cfg.window_s / cfg.mem_points)))

        gpus: dict[tuple[str, str], GpuStats] = {}
        raw: dict[tuple[str, str], dict[str, float]] = {}
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
                util_fresh=v.get("util_fresh", 0.0), mem_fresh=v.get("mem_fresh", 0.0),
                util_step=step, mem_step=mem_step,
            )  # fmt: skip
            prev = gpus.get((node, gpu))
            # a GPU replaced at the same index: the fresh one (then the one with more data) wins
            if prev is None or (st.fresh, st.util_count or 0) > (prev.fresh, prev.util_count or 0):
                gpus[(node, gpu)] = st
                raw[(node, gpu)] = v

        # range series are matched to GPUs by their node label, or (series without one) by a
        # UUID seen on one GPU only: simulated or cloned GPUs can share a UUID across nodes
        seen = Counter(st.uuid for st in gpus.values())
        by_uuid: dict[str, tuple[str, str]] = {}
        want_util: list[str] = []
        want_mem: list[str] = []
        for key, st in gpus.items():
            if not st.fresh or not selectable(st.uuid):
                continue
            if seen[st.uuid] == 1:
                by_uuid[st.uuid] = key
            if self._wants_util_range(st):
                want_util.append(st.uuid)
            if self._wants_mem_range(st, raw[key].get("mem_deriv")):
                want_mem.append(st.uuid)

        start = at - cfg.window_s
        mem_start = start + mem_step / 2  # one point per half-open interval of the window
        util_q = (lambda: self.client.query_range(self.builder.util_range(want_util), start, at, step)) \
            if want_util else None
        mem_q = (lambda: self.client.query_range(self.builder.mem_range(want_mem), mem_start, at, mem_step)) \
            if want_mem else None
        util_ranges, mem_ranges = self._both(util_q, mem_q)
        queries += bool(want_util) + bool(want_mem)
        dup = sorted(u for u, c in seen.items() if c > 1 and u)
        if dup:
            log.warning("%d GPU UUIDs appear on more than one node (%s...): their range series are matched by "
                        "the %r label only", len(dup), dup[0], cfg.node_label)
        self._attach(gpus, by_uuid, util_ranges, start, at, step, "util_range")
        self._attach(gpus, by_uuid, mem_ranges, mem_start, at, mem_step, "mem_range")
        if dropped:
            log.warning("%d aggregate series had no %r label and no %s to join on instance; ignored",
                        dropped, cfg.node_label, HOST_INFO)
        return Snapshot(at=at, gpus=gpus, queries=queries, util_step=step, mem_step=mem_step,
                        dropped_series=dropped)

    def _wants_util_range(self, st: GpuStats) -> bool:
        """Could the classifier need this GPU's range? (a margin below its thresholds)"""
        th = self.cfg.thresholds
        mean, std, p95 = finite(st.util_mean), finite(st.util_std), finite(st.util_p95)
        if mean is None or std is None:
            return False
        busy = mean >= 0.8 * th.idle_util_mean or (p95 is not None and p95 >= 0.8 * th.idle_util_p95)
        return busy and std > 0.8 * th.steady_cv * mean

    def _wants_mem_range(self, st: GpuStats, deriv: float | None) -> bool:
        """Could memory be growing? ``deriv`` (bytes/s) over the window, half the threshold."""
        d, total = finite(deriv), finite(st.mem_total)
        if d is None or total is None:
            return False
        return d * self.cfg.window_s > 0.5 * self.cfg.thresholds.growth_min_fraction * total

    def _both(self, a: Callable[[], T] | None, b: Callable[[], U] | None) -> tuple[T | list[Any], U | list[Any]]:
        """Run two queries side by side (either may be None: an empty result)."""
        self.queries_sent += (a is not None) + (b is not None)
        if a is None or b is None:
            return (a() if a else []), (b() if b else [])
        fut = self._pool.submit(b)
        try:
            ra = a()
        except BaseException:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - the first error is the one reported
                pass
            raise
        return ra, fut.result()

    def _attach(self, gpus: dict[tuple[str, str], GpuStats], by_uuid: dict[str, tuple[str, str]],
                series: list[RangeSeries], start: float, end: float, step: float, attr: str) -> None:
        """Put range points on their GPU; several series of one GPU (pods, jobs) fold by max."""
        n = math.floor((end - start) / step + 1e-9)
        out: dict[tuple[str, str], list[float | None]] = {}
        nl = self.cfg.node_label
        for rs in series:
            uuid = rs.labels.get("uuid", "")
            node = rs.labels.get(nl)
            key = (node, rs.labels.get("gpu", "")) if node else by_uuid.get(uuid)
            if key is None or key not in gpus or gpus[key].uuid != uuid:
                continue
            vals = out.get(key)
            if vals is None:
                vals = out[key] = [None] * (n + 1)
            for t, v in rs.points:
                i = round((t - start) / step)
                if 0 <= i <= n and math.isfinite(v):
                    old = vals[i]
                    vals[i] = v if old is None or v > old else old
        for key, vals in out.items():
            setattr(gpus[key], attr, vals)


def by_node(snapshot: Snapshot) -> dict[str, dict[str, GpuStats]]:
    """Group a snapshot's GPUs by node name."""
    out: dict[str, dict[str, GpuStats]] = {}
    for (node, gpu), st in snapshot.gpus.items():
        out.setdefault(node, {})[gpu] = st
    return out

