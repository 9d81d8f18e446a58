"""The profiler's PromQL: statistics computed by Prometheus, a few answers per shard of nodes.

A cycle asks, evaluated at one instant:

0. **nodes** (instant): GPUs per node with a ``gpu_up`` sample in the window,
   ``count by (node)``: one sample per node. The nodes are cut into shards of about
   ``shard_gpus`` GPUs (default 2,000).
Then, per shard (``{node=~"n1|n2|..."}``):

1. utilisation aggregates (instant), grouped by (node, gpu, uuid): mean, stddev, 95th
   percentile, sample count, count in the older half of the window, count in the
   freshness period; and the mean and sample count of the whole GPU's SM activity
   (``gpu_sm_active_ratio{gpu_instance=""}``, NVIDIA GPM: absent elsewhere) for ``underused``;
2. memory aggregates (instant): mean used, mean free, total, ``deriv`` of used, counts,
   last ``gpu_up``;
3. allocation (instant): how many samples of the window each ``gpu_allocation_info``
   holder (namespace, pod) covers (pod attribution; empty without it);
4. utilisation range (query_range) of only the GPUs whose variation could be a period
   (not idle, coefficient of variation near or above the steady threshold, decided from
   query 1), selected by ``uuid``, in batches of at most ``range_gpus`` GPUs;
5. memory used range (query_range, coarse step) of only the GPUs whose ``deriv`` could
   be a leak (from query 2), selected by ``uuid``, batched the same way.

Queries per cycle, for N nodes of G GPUs each, S = ceil(N·G / shard_gpus) shards:
``2 + 3·S + R`` where R, the range batches, is at most ``2·S`` while a shard's ranges fit
one batch (a cluster with few periodic, bursty or leaking GPUs has R near 0). 10,000 nodes
x 8 GPUs: 40 shards, about 200 queries; 100 nodes: 1 shard, at most 7 queries. The first
query of the cycle counts the series without the node label: when there are none (the
shipped scrape configs), the shards' aggregates leave out the join branch, whose
``{node=""}`` selectors cost time in proportion to the whole fleet, in every shard.

Every answer must fit ``--prometheus-max-response-bytes``: the shard and batch sizes keep
answers near a tenth of the default cap, and an answer refused as too large splits its
shard or batch in two and asks again (down to one node or one GPU). Each shard is folded
into compact per-GPU results before the next is read, so memory follows the shard, not
the fleet.

Queries 4 and 5 select raw series and the per-GPU folding is done here: Prometheus 2.x
evaluates an aggregation in a range query at every step, which measured five times slower
than selecting the series.

Node identity: the shipped scrape configs put a ``node`` label on every series. A series
without it (a user's own scrape config) is joined to ``gpu_host_info`` on ``instance``,
which carries the exporter's own ``node`` label. Both branches run in every aggregate
query (``or``), so a cluster mixing the two works and the join costs nothing when every
series has the label; the range queries map series to nodes through their ``uuid``.
Per-GPU series may carry ``pod``/``namespace``/``container`` (attribution) and be scraped
by more than one job: ``max by (node, gpu, uuid)`` (and its equivalent here for ranges)
folds those into one series per GPU.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from exporter.profiler.classify import GpuStats, Thresholds, finite
from exporter.profiler.prom import BAD_RESPONSE, TOO_LARGE, PromClient, PromError, RangeSeries, Sample, printable

log = logging.getLogger(__name__)

UTIL = "gpu_utilization_ratio"
SM_ACTIVE = "gpu_sm_active_ratio"
MEM_USED = "gpu_memory_used_bytes"
MEM_FREE = "gpu_memory_free_bytes"
MEM_TOTAL = "gpu_memory_total_bytes"
UP = "gpu_up"
HOST_INFO = "gpu_host_info"
ALLOCATION = "gpu_allocation_info"
# every metric a shard's aggregates select: series of any of them without the node label need the join
JOINED_METRICS = (UTIL, SM_ACTIVE, MEM_USED, MEM_FREE, MEM_TOTAL, UP, ALLOCATION)

EMPTY = "prometheus_empty"  # error kind: every query answered, none had a GPU series

T = TypeVar("T")

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
    shard_gpus: int = 2000  # GPUs per shard of the aggregate queries (about 2-3 MB per answer)
    range_gpus: int = 1000  # GPUs per range query (500 points each: about 15 MB at most)

    def __post_init__(self) -> None:
        if not _LABEL_RE.match(self.node_label):
            raise ValueError(f"node label {self.node_label!r} is not a valid Prometheus label name")


class QueryBuilder:
    """Builds the PromQL text for a :class:`QueryConfig` (pure, testable)."""

    def __init__(self, cfg: QueryConfig) -> None:
        self.cfg = cfg
        nl = cfg.node_label
        self.by = f"{nl}, gpu, uuid"
        self.join = True  # include the gpu_host_info join for series without the node label

    def _host(self, at: str, nodes: str | None = None) -> str:
        nl = self.cfg.node_label
        sel = f"{{node=~{nodes}}}" if nodes else ""
        if nl == "node":
            return f"max by (instance, {nl}) ({HOST_INFO}{sel}{at})"
        return f'max by (instance, {nl}) (label_replace({HOST_INFO}{sel}{at}, "{nl}", "$1", "node", "(.+)"))'

    def per_gpu(self, fn: Callable[[str], str], at: str = "", nodes: str | None = None, by: str = "") -> str:
        """``max by (node, gpu, uuid)`` of ``fn(selector matcher)``, with the join fallback.

        ``fn`` receives the matcher to put inside the metric's braces, e.g.
        ``lambda m: f"avg_over_time(gpu_utilization_ratio{{{m}}}[1800s])"``. ``at`` (`` @ end()``)
        pins the join too, so that Prometheus evaluates the whole expression once per range
        query instead of once per step (step-invariant expressions). ``nodes``: a
        :func:`name_regex` limiting both branches to a shard; ``by``: labels kept besides
        (node, gpu, uuid).
        """
        nl = self.cfg.node_label
        has_node = f"{nl}=~{nodes}" if nodes else nl + '!=""'
        no_node = nl + '=""'
        labelled = fn(has_node)
        if not self.join:
            return f"max by ({self.by}{by}) ({labelled})"
        joined = f"({fn(no_node)}) * on (instance) group_left ({nl}) {self._host(at, nodes)}"
        return f"max by ({self.by}{by}) ({labelled} or ({joined}))"

    def unlabelled(self) -> str:
        """How many series of the metrics the shards read lack the node label (then the join
        branch is needed). A ``{node=""}`` selector scans every series of its metric: asked once
        per cycle here instead of in every shard's every aggregate, where it made the cost of a
        shard grow with the fleet."""
        w = duration(self.cfg.window_s)
        nl = self.cfg.node_label
        return " + ".join(f'(count(last_over_time({name}{{{nl}=""}}[{w}])) or vector(0))'
                          for name in JOINED_METRICS)

    def nodes(self) -> str:
        """GPUs per node with a ``gpu_up`` sample in the window: the shards are cut from this.

        The exporter publishes ``gpu_up`` for every GPU it lists, lost ones included; asking
        for it alone costs a third of asking for every metric the statistics read.
        """
        w = duration(self.cfg.window_s)
        return f"count by ({self.cfg.node_label}) ({self.per_gpu(lambda m: f'last_over_time({UP}{{{m}}}[{w}])')})"

    @staticmethod
    def tag(expr: str, stat: str) -> str:
        return f'label_replace({expr}, "stat", "{stat}", "gpu", ".*")'

    def util_stats(self, nodes: str | None = None) -> str:
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
            # whole GPUs only (a MIG instance has its own series): underused where the series exists
            "sm_mean": lambda m: f'avg_over_time({SM_ACTIVE}{{{m}, gpu_instance=""}}[{w}])',
            "sm_count": lambda m: f'count_over_time({SM_ACTIVE}{{{m}, gpu_instance=""}}[{w}])',
        }
        return " or ".join(self.tag(self.per_gpu(fn, nodes=nodes), stat) for stat, fn in parts.items())

    def mem_stats(self, nodes: str | None = None) -> str:
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
        return " or ".join(self.tag(self.per_gpu(fn, nodes=nodes), stat) for stat, fn in parts.items())

    def allocation(self, nodes: str | None = None) -> str:
        """Samples of the window in which each (namespace, pod) held each GPU."""
        w = duration(self.cfg.window_s)
        return self.per_gpu(lambda m: f"count_over_time({ALLOCATION}{{{m}}}[{w}])", nodes=nodes,
                            by=", namespace, pod")

    def util_range(self, uuids: Iterable[str]) -> str:
        """Raw utilisation series of the GPUs with these UUIDs (a query_range)."""
        return f"{UTIL}{{uuid=~{uuid_regex(uuids)}}}"

    def mem_range(self, uuids: Iterable[str]) -> str:
        """Raw memory-used series of the GPUs with these UUIDs (a query_range)."""
        return f"{MEM_USED}{{uuid=~{uuid_regex(uuids)}}}"


def uuid_regex(uuids: Iterable[str]) -> str:
    """A PromQL raw-string (backquoted) regex matching exactly these UUIDs.

    Only RE2's metacharacters are escaped (as Go's regexp.QuoteMeta): an alternation of plain
    literals is what Prometheus turns into direct index lookups instead of matching every
    value of the label (an escaped ``-`` would defeat that).
    """
    return "`" + "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", u) for u in sorted(set(uuids))) + "`"


def name_regex(names: Iterable[str]) -> str:
    """A PromQL raw-string regex matching exactly these node names (as :func:`uuid_regex`)."""
    return uuid_regex(names)


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
    shards: int = 1


def _key(labels: dict[str, str], node_label: str) -> tuple[str, str, str] | None:
    node = labels.get(node_label, "")
    gpu = labels.get("gpu", "")
    if not node or not gpu:
        return None
    return node, gpu, labels.get("uuid", "")


def _median_interval(counts: list[float], window_s: float) -> float | None:
    good = [window_s / c for c in counts if c and c > 1 and math.isfinite(c)]
    return statistics.median(good) if good else None


def plan_shards(gpus_per_node: dict[str, int], shard_gpus: int) -> list[list[str]]:
    """Consecutive (sorted) nodes packed into shards of at most ``shard_gpus`` GPUs (a node
    with more GPUs than that is a shard of its own)."""
    shards: list[list[str]] = []
    cur: list[str] = []
    n = 0
    for node in sorted(gpus_per_node):
        g = max(1, gpus_per_node[node])
        if cur and n + g > shard_gpus:
            shards.append(cur)
            cur, n = [], 0
        cur.append(node)
        n += g
    if cur:
        shards.append(cur)
    return shards


class Reader:
    """Runs the cycle's queries against one :class:`PromClient` and assembles GpuStats."""

    def __init__(self, client: PromClient, cfg: QueryConfig) -> None:
        self.client = client
        self.cfg = cfg
        self.builder = QueryBuilder(cfg)
        self.queries_sent = 0  # logical queries, cumulative (HTTP retries not counted)
        # a shard's 3 aggregates, the next shard's 3 (prefetched) and 2 range batches
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="promql")
        self.last: Snapshot | None = None  # bookkeeping of the last read (gpus empty when streamed)

    def read(self, at: float) -> Snapshot:
        """All queries evaluated at unix time ``at``, every GPU kept; raises PromError on any failure."""
        gpus: dict[tuple[str, str], GpuStats] = {}
        snap = self.read_shards(at, gpus.update)
        snap.gpus = gpus
        return snap

    def read_shards(self, at: float, consume: Callable[[dict[tuple[str, str], GpuStats]], None]) -> Snapshot:
        """Read shard by shard, handing each shard's GPUs to ``consume`` before the next is read.

        A failed query fails the whole read (the caller then writes nothing): classifying
        from part of the data could write a wrong annotation (a GPU without its range would
        look unknown, for instance). Returns the bookkeeping, with ``gpus`` empty.
        """
        cfg = self.cfg
        self.queries_sent += 1
        counts = self.client.query(self.builder.unlabelled(), at)
        # anything but a clean 0 (no answer, NaN, garbage) keeps the join: never drop data
        self.builder.join = not (len(counts) == 1 and counts[0].value == 0)
        per_node: dict[str, int] = {}
        bad_names = 0
        self.queries_sent += 1
        for s in self.client.query(self.builder.nodes(), at):
            node = s.labels.get(cfg.node_label, "")
            if node and selectable(node):
                # the count only sizes the shards: a garbage value must not drop the node
                per_node[node] = int(s.value) if math.isfinite(s.value) and 0 < s.value < 1e6 else 8
            else:
                bad_names += 1
        if bad_names:
            log.warning("%d nodes have a name that cannot be selected in PromQL; skipped", bad_names)
        if not per_node:
            raise PromError(EMPTY, f"no GPU series ({UTIL}, {MEM_USED}) in Prometheus for the last "
                                   f"{duration(cfg.window_s)}: check --prometheus-url and the scrape config")
        queries = 2
        dropped = 0
        steps: list[float] = []
        mem_step = float(max(1, math.ceil(cfg.window_s / cfg.mem_points)))
        todo = plan_shards(per_node, cfg.shard_gpus)
        done = 0
        prefetched: dict[tuple[str, ...], list[Future[list[Sample]]]] = {}
        while todo:
            nodes = todo.pop(0)
            stats = prefetched.pop(tuple(nodes), None) or self._stats(nodes, at)
            if todo and tuple(todo[0]) not in prefetched:
                # Prometheus computes the next shard while this one is parsed and classified
                prefetched[tuple(todo[0])] = self._stats(todo[0], at)
            try:
                gpus, q, d, step = self._read_shard(nodes, at, mem_step, stats)
            except PromError as exc:
                if exc.kind != TOO_LARGE or len(nodes) == 1:
                    for futures in prefetched.values():
                        _settle(futures)
                    raise
                half = len(nodes) // 2
                log.info("an answer for %d nodes was over the size cap: asking for %d and %d", len(nodes), half,
                         len(nodes) - half)
                todo[:0] = [nodes[:half], nodes[half:]]
                queries += 3
                continue
            queries += q
            dropped += d
            steps.append(step)
            done += 1
            consume(gpus)
        if dropped:
            log.warning("%d aggregate series had no %r or 'gpu' label; ignored", dropped, cfg.node_label)
        self.last = Snapshot(at=at, gpus={}, queries=queries, util_step=steps[0] if steps else 0.0,
                             mem_step=mem_step, dropped_series=dropped, shards=done)
        return self.last

    def _stats(self, nodes: list[str], at: float) -> list[Future[list[Sample]]]:
        """The shard's three aggregate queries, submitted to run side by side."""
        sel = name_regex(nodes)
        self.queries_sent += 3
        return [self._pool.submit(self.client.query, expr, at) for expr in
                (self.builder.util_stats(sel), self.builder.mem_stats(sel), self.builder.allocation(sel))]

    def _read_shard(self, nodes: list[str], at: float, mem_step: float,
                    futures: list[Future[list[Sample]]]) -> tuple[dict[tuple[str, str], GpuStats], int, int, float]:
        """(GPUs of these nodes, queries sent, series dropped, utilisation step)."""
        cfg = self.cfg
        util, mem, alloc = _settle(futures)
        queries = 3
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
        del util, mem
        holders: dict[tuple[str, str, str], dict[str, float]] = {}
        for s in alloc:
            k = _key(s.labels, cfg.node_label)
            ns, pod = s.labels.get("namespace", ""), s.labels.get("pod", "")
            if k is not None and ns and pod and math.isfinite(s.value):
                holders.setdefault(k, {})[f"{ns}/{pod}"] = s.value
        del alloc

        step = cfg.step_s
        if step is None:
            counts = [v["util_count"] for v in stats.values() if "util_count" in v]
            step = _median_interval(counts, cfg.window_s) or 15.0
        # nearest whole second: a step even slightly longer than the scrape interval skips a
        # sample now and then, and that beat looks like a period of its own
        step = float(max(1, round(max(step, cfg.min_step_s, cfg.window_s / cfg.max_points))))

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
                sm_mean=v.get("util_sm_mean"), sm_count=v.get("util_sm_count"),
            )  # fmt: skip
            held = holders.get((node, gpu, uuid))
            if held:
                st.holders = held
            prev = gpus.get((node, gpu))
            # a GPU replaced at the same index: the fresh one (then the one with more data) wins
            if prev is None or (st.fresh, st.util_count or 0) > (prev.fresh, prev.util_count or 0):
                gpus[(node, gpu)] = st
                raw[(node, gpu)] = v
        del stats

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
        del raw
        dup = sorted(u for u, c in seen.items() if c > 1 and u)
        if dup:
            log.warning("%d GPU UUIDs appear on more than one node (%s...): their range series are matched by "
                        "the %r label only", len(dup), printable(dup[0], 80), cfg.node_label)

        start = at - cfg.window_s
        mem_start = start + mem_step / 2  # one point per half-open interval of the window
        batches = [(u, "util_range", start, step, self.builder.util_range) for u in _batches(want_util, cfg.range_gpus)]
        batches += [(u, "mem_range", mem_start, mem_step, self.builder.mem_range)
                    for u in _batches(want_mem, cfg.range_gpus)]
        while batches:
            pair = batches[:2]
            del batches[:2]
            calls = [self._range_call(b, at) for b in pair]
            results = self._all(*calls)
            queries += len(pair)
            for (uuids, attr, t0, st_, fn), res in zip(pair, results, strict=True):
                if isinstance(res, PromError):
                    if res.kind != TOO_LARGE or len(uuids) == 1:
                        raise res
                    half = len(uuids) // 2  # too large: ask for it in two halves
                    batches[:0] = [(uuids[:half], attr, t0, st_, fn), (uuids[half:], attr, t0, st_, fn)]
                    continue
                self._attach(gpus, by_uuid, res, t0, at, st_, attr)
        return gpus, queries, dropped, step

    def _range_call(self, batch: tuple[list[str], str, float, float, Callable[[Iterable[str]], str]],
                    at: float) -> Callable[[], list[RangeSeries] | PromError]:
        uuids, _attr, t0, step, fn = batch

        def call() -> list[RangeSeries] | PromError:
            try:
                return self.client.query_range(fn(uuids), t0, at, step)
            except PromError as exc:
                if exc.kind == TOO_LARGE:
                    return exc  # the caller splits the batch
                raise

        return call

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

    def _all(self, *calls: Callable[[], T]) -> list[T]:
        """Run queries side by side (Prometheus answers one while we parse another)."""
        self.queries_sent += len(calls)
        futures = [self._pool.submit(c) for c in calls[1:]]
        first: BaseException | None = None
        out: list[T] = []
        try:
            out.append(calls[0]())
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others finished
            first = exc
        for f in futures:
            try:
                out.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - the first error is the one reported
                first = first or exc
        if first is not None:
            raise first
        return out

    def _attach(self, gpus: dict[tuple[str, str], GpuStats], by_uuid: dict[str, tuple[str, str]],
                series: list[RangeSeries], start: float, end: float, step: float, attr: str) -> None:
        """Put range points on their GPU; several series of one GPU (pods, jobs) fold by max."""
        n = math.floor((end - start) / step + 1e-9)
        nl = self.cfg.node_label
        for rs in series:
            uuid = rs.labels.get("uuid", "")
            node = rs.labels.get(nl)
            key = (node, rs.labels.get("gpu", "")) if node else by_uuid.get(uuid)
            if key is None or key not in gpus or gpus[key].uuid != uuid:
                continue
            st = gpus[key]
            vals = getattr(st, attr)
            if vals is None:
                vals = [None] * (n + 1)
                setattr(st, attr, vals)
            for t, v in rs.points:
                i = round((t - start) / step)
                if 0 <= i <= n and math.isfinite(v):
                    old = vals[i]
                    vals[i] = v if old is None or v > old else old


def _settle(futures: list[Future[T]]) -> list[T]:
    """Every result; after all have finished, the first error is raised."""
    out: list[T] = []
    first: BaseException | None = None
    for f in futures:
        try:
            out.append(f.result())
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others finished
            first = first or exc
    if first is not None:
        raise first
    return out


def _batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i:i + size] for i in range(0, len(items), max(1, size))]


def by_node(snapshot: Snapshot) -> dict[str, dict[str, GpuStats]]:
    """Group a snapshot's GPUs by node name."""
    out: dict[str, dict[str, GpuStats]] = {}
    for (node, gpu), st in snapshot.gpus.items():
        out.setdefault(node, {})[gpu] = st
    return out

