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
the fleet. Prometheus and this process work side by side: the next shard's aggregates are
asked for while a shard is parsed, and a shard is classified while the next one's range
queries run (at most one shard waits to be classified).

The aggregates' parts (one per statistic, each with its ``stat`` label) are joined by a
balanced tree of ``or`` (:func:`union`): a left-deep chain costs Prometheus 2 a hash of
every sample gathered so far at each ``or``, empty parts included.

Sources: the metric names, units and identity labels come from a :class:`Source`
(sources.py): ours, dcgm-exporter's or AMD's. Values are scaled to SI and labels mapped
to (node, gpu, uuid) here, after the answers arrive, so the classification never sees which
exporter spoke. With ``source=auto`` the nodes query asks every source at once and a node
published by ours is read from ours. Each GPU's range step is its own scrape interval
(:meth:`Reader._step`), never one shared by its shard: a GPU's pattern must not depend on
which GPUs share its shard, that is on the fleet's size.

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

import functools
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from exporter.profiler import sources
from exporter.profiler.classify import GpuStats, Thresholds, finite
from exporter.profiler.prom import BAD_RESPONSE, TOO_LARGE, PromClient, PromError, RangeSeries, Sample, printable
from exporter.profiler.sources import Source

log = logging.getLogger(__name__)

UTIL = "gpu_utilization_ratio"
SM_ACTIVE = "gpu_sm_active_ratio"
MEM_USED = "gpu_memory_used_bytes"
MEM_FREE = "gpu_memory_free_bytes"
MEM_TOTAL = "gpu_memory_total_bytes"
UP = "gpu_up"
HOST_INFO = "gpu_host_info"
ALLOCATION = "gpu_allocation_info"
XID = "gpu_xid_errors_total"
ECC = "gpu_ecc_errors_total"
THROTTLE = "gpu_throttle_reason_active"
# clock event reasons that mean the GPU runs below its clocks because of heat, power or hardware
SCORE_THROTTLE_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown",
                          "sw_power_cap")
# every metric a shard's aggregates select: series of any of them without the node label need the join
JOINED_METRICS = (UTIL, SM_ACTIVE, MEM_USED, MEM_FREE, MEM_TOTAL, UP, ALLOCATION)

# the health fields' stats (health.py reads them from GpuStats.health; ``up`` is GpuStats.up)
HEALTH_STATS = ("xid", "xid_min", "xid_max", "xid_last", "xid_changes", "xid_before", "ecc", "remap", "retire", "width",
                "width_max")
_HEALTH_KEYS = tuple(("mem_" + name, name) for name in HEALTH_STATS)  # as the memory query's stats arrive

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
    step_s: float | None = None  # utilisation range step; None: each GPU's own scrape interval
    min_step_s: float = 5.0
    max_points: int = 500  # cap on points per utilisation range series
    mem_points: int = 30  # points of the memory range (Theil-Sen is O(N^2))
    node_label: str = "node"
    thresholds: Thresholds = field(default_factory=Thresholds)
    shard_gpus: int = 2000  # GPUs per shard of the aggregate queries (about 2-3 MB per answer)
    range_gpus: int = 1000  # GPUs per range query (500 points each: about 15 MB at most)
    source: str = sources.AUTO  # gpu-exporter, dcgm, amd, or auto: whichever Prometheus holds, per node
    health: bool = False  # also read the health fields (the GPUHealthy condition)
    critical_xids: tuple[int, ...] = sources.CRITICAL_XIDS

    def __post_init__(self) -> None:
        if not _LABEL_RE.match(self.node_label):
            raise ValueError(f"node label {self.node_label!r} is not a valid Prometheus label name")
        if self.source not in sources.CHOICES:
            raise ValueError(f"source {self.source!r} is not one of {', '.join(sources.CHOICES)}")


class QueryBuilder:
    """Builds the PromQL text for a :class:`QueryConfig` and one :class:`Source` (pure, testable)."""

    def __init__(self, cfg: QueryConfig, source: Source | None = None) -> None:
        self.cfg = cfg
        self.source = source or sources.gpu_exporter(cfg.node_label)
        self.ours = self.source.name == sources.OURS
        nl = cfg.node_label
        self.by = f"{nl}, gpu, uuid" if self.ours else ", ".join(self.source.identity)
        self.join = self.ours  # include the gpu_host_info join for series without the node label
        # node labels the shards select on: those that named a node in the last discovery
        self.node_labels: tuple[str, ...] = self.source.node_labels

    def sel(self, metric: str, matchers: str) -> str:
        return self.source.selector(metric, matchers)

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
        (node, gpu, uuid). Another exporter's series: one branch per label that may name the
        node (``Hostname``, ``hostname``, ...), every identity label kept.
        """
        if not self.ours:
            branches = [fn(f"{lab}=~{nodes}" if nodes else f'{lab}!=""') for lab in self.node_labels]
            return f"max by ({self.by}{by}) ({' or '.join(branches)})"
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

    def presence(self) -> str:
        """The series whose presence in the window makes a GPU part of the fleet."""
        s = self.source
        if self.ours:
            return UP
        return f"{s.util}/{s.mem_used}" + (" (any name prefix)" if s.any_prefix else "")

    def nodes(self, names: str | None = None) -> str:
        """GPUs per node with a sample in the window: the shards are cut from this.

        ``names``: a PromQL raw-string regex the node names must match (a part of the fleet,
        when the whole answer is over the size cap: :func:`name_parts`).

        Ours: ``gpu_up``, which the exporter publishes for every GPU it lists, lost ones
        included; asking for it alone costs a third of asking for every metric the statistics
        read. Another exporter: its utilisation or memory-used series. Tagged with the source
        (``source`` label), so that :func:`discovery` asks every source in one query.
        """
        w = duration(self.cfg.window_s)
        s = self.source
        if self.ours:
            inner = self.per_gpu(lambda m: f"last_over_time({UP}{{{m}}}[{w}])", nodes=names)
            by = self.cfg.node_label
        else:
            inner = self.per_gpu(lambda m: f"last_over_time({self.sel(s.util, m)}[{w}]) or "
                                           f"last_over_time({self.sel(s.mem_used, m)}[{w}])", nodes=names)
            by = ", ".join(self.node_labels)
        return f'label_replace(count by ({by}) ({inner}), "source", "{s.name}", "", "")'

    @staticmethod
    def tag(expr: str, stat: str) -> str:
        return f'label_replace({expr}, "stat", "{stat}", "gpu", ".*")'

    def util_stats(self, nodes: str | None = None) -> str:
        w = duration(self.cfg.window_s)
        half = duration(self.cfg.window_s / 2)
        f = duration(self.cfg.fresh_s)
        s = self.source
        u = s.util
        sel = self.sel
        parts: dict[str, Callable[[str], str]] = {
            "mean": lambda m: f"avg_over_time({sel(u, m)}[{w}])",
            "std": lambda m: f"stddev_over_time({sel(u, m)}[{w}])",
            "p95": lambda m: f"quantile_over_time(0.95, {sel(u, m)}[{w}])",
            "count": lambda m: f"count_over_time({sel(u, m)}[{w}])",
            "early": lambda m: f"count_over_time({sel(u, m)}[{half}] offset {half})",
            "fresh": lambda m: f"count_over_time({sel(u, m)}[{f}])",
        }
        if s.sm:
            # whole GPUs only (a MIG instance has its own series): underused where the series exists
            parts["sm_mean"] = lambda m: f"avg_over_time({sel(s.sm, m + ', ' + s.sm_whole)}[{w}])"
            parts["sm_count"] = lambda m: f"count_over_time({sel(s.sm, m + ', ' + s.sm_whole)}[{w}])"
        return union([self.tag(self.per_gpu(fn, nodes=nodes), stat) for stat, fn in parts.items()])

    def mem_stats(self, nodes: str | None = None) -> str:
        w = duration(self.cfg.window_s)
        half = duration(self.cfg.window_s / 2)
        f = duration(self.cfg.fresh_s)
        s = self.source
        used = s.mem_used
        sel = self.sel
        parts: dict[str, Callable[[str], str]] = {
            "used": lambda m: f"avg_over_time({sel(used, m)}[{w}])",
            "count": lambda m: f"count_over_time({sel(used, m)}[{w}])",
            "early": lambda m: f"count_over_time({sel(used, m)}[{half}] offset {half})",
            "fresh": lambda m: f"count_over_time({sel(used, m)}[{f}])",
            "deriv": lambda m: f"deriv({sel(used, m)}[{w}])",
        }
        if s.mem_free:
            parts["free"] = lambda m: f"avg_over_time({sel(s.mem_free, m)}[{w}])"
        if s.mem_total:
            parts["total"] = lambda m: f"max_over_time({sel(s.mem_total, m)}[{w}])"
        if s.health.up:
            parts["up"] = lambda m: f"last_over_time({sel(s.health.up, m)}[{f}])"
        if self.cfg.health:
            parts.update(self._health_parts())
        if self.ours:
            parts.update(self._score_parts())
        return union([self.tag(self.per_gpu(fn, nodes=nodes), stat) for stat, fn in parts.items()])

    def _score_parts(self) -> dict[str, Callable[[str], str]]:
        """What the availability score discounts (issue 28; classify.health_factor): any XID and
        any uncorrectable ECC error in the window, and the share of the window with a thermal,
        power or hardware slowdown active. Our families only; read in the memory query."""
        w = duration(self.cfg.window_s)

        def rise(metric: str, extra: str) -> Callable[[str], str]:
            def fn(m: str) -> str:  # a series born in the window counts whole (its first sample is an error)
                s = f"{metric}{{{m}{extra}}}"
                return (f"(max_over_time({s}[{w}]) - last_over_time({s}[{w}] offset {w})) or "
                        f"(max_over_time({s}[{w}]) unless last_over_time({s}[{w}] offset {w}))")
            return fn

        slow = "|".join(SCORE_THROTTLE_REASONS)
        return {
            "score_xid": rise(XID, ""),
            "score_ecc": rise(ECC, ', error_type="uncorrected", counter="volatile"'),
            "score_throttle": lambda m: f'avg_over_time({THROTTLE}{{{m}, reason=~"{slow}"}}[{w}])',
        }

    def _health_parts(self) -> dict[str, Callable[[str], str]]:
        """Health fields, read in the memory query (no query of their own): see health.py."""
        w = duration(self.cfg.window_s)
        f = duration(self.cfg.fresh_s)
        h = self.source.health
        sel = self.sel
        parts: dict[str, Callable[[str], str]] = {}

        def rise(metric: str, extra: str) -> Callable[[str], str]:
            # a counter's rise in the window; a series born in the window counts whole (its
            # first sample is an error already counted: increase() would not see it)
            def fn(m: str) -> str:
                s = sel(metric, m + extra)
                return (f"(max_over_time({s}[{w}]) - last_over_time({s}[{w}] offset {w})) or "
                        f"(max_over_time({s}[{w}]) unless last_over_time({s}[{w}] offset {w}))")
            return fn

        codes = "|".join(str(c) for c in self.cfg.critical_xids)
        if h.xid_counter:
            parts["xid"] = rise(h.xid_counter, f', xid=~"{codes}"')
        if h.xid_last:
            x = h.xid_last
            parts["xid_min"] = lambda m: f"min_over_time({sel(x, m)}[{w}])"
            parts["xid_max"] = lambda m: f"max_over_time({sel(x, m)}[{w}])"
            parts["xid_last"] = lambda m: f"last_over_time({sel(x, m)}[{w}])"
            parts["xid_changes"] = lambda m: f"changes({sel(x, m)}[{w}])"
            parts["xid_before"] = lambda m: f"last_over_time({sel(x, m)}[{w}] offset {w})"
        if h.ecc_uncorrectable:
            parts["ecc"] = rise(h.ecc_uncorrectable, ", " + h.ecc_matcher if h.ecc_matcher else "")
        if h.remap_failed:
            parts["remap"] = lambda m: f"last_over_time({sel(h.remap_failed, m)}[{f}])"
        if h.retire_pending:
            parts["retire"] = lambda m: f"last_over_time({sel(h.retire_pending, m)}[{f}])"
        if h.pcie_width:
            parts["width"] = lambda m: f"last_over_time({sel(h.pcie_width, m)}[{f}])"
            parts["width_max"] = lambda m: f"last_over_time({sel(h.pcie_width_max, m)}[{f}])"
        return parts

    def allocation(self, nodes: str | None = None) -> str:
        """Samples of the window in which each (namespace, pod) held each GPU.

        Ours: ``gpu_allocation_info``; another exporter: its utilisation series, which carry
        the workload's ``pod``/``namespace`` while a pod holds the GPU. A scrape that does not
        honour the exporter's labels renames them ``exported_pod``/``exported_namespace`` and
        puts the exporter's own pod in ``pod``: those are read first, and a ``pod`` that is a
        scrape target of the same job (``up``: the exporter itself) is never a workload.
        """
        w = duration(self.cfg.window_s)
        s = self.source
        metric = ALLOCATION if self.ours else s.util
        exported_sel = ', exported_pod!=""'
        plain_sel = ', exported_pod="", pod!=""'
        exported = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + exported_sel)}[{w}])",
                                nodes=nodes, by=", exported_namespace, exported_pod")
        if self.ours:
            plain = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + plain_sel)}[{w}])",
                                 nodes=nodes, by=", namespace, pod")
            return f"{exported} or {plain}"
        plain = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + plain_sel)}[{w}])",
                             nodes=nodes, by=", namespace, pod, job")
        return f"{exported} or ({plain} unless on (namespace, pod, job) group by (namespace, pod, job) (up))"

    def util_range(self, uuids: Iterable[str], label: str = "uuid") -> str:
        """Raw utilisation series of the GPUs with these UUIDs (a query_range)."""
        return self.sel(self.source.util, f"{label}=~{uuid_regex(uuids)}")

    def mem_range(self, uuids: Iterable[str], label: str = "uuid") -> str:
        """Raw memory-used series of the GPUs with these UUIDs (a query_range)."""
        return self.sel(self.source.mem_used, f"{label}=~{uuid_regex(uuids)}")


def union(terms: list[str]) -> str:
    """``a or b or c ...`` as a balanced tree of ``or``: Prometheus 2 evaluates ``x or y`` by
    hashing every sample of both sides, so the left-deep chain that plain ``or`` parses into
    handles the first parts' samples once per later part: O(n·k) for k parts of n samples, and
    the empty parts (health and score fields a fleet does not publish) cost as much as full
    ones. Balanced: O(n·log k); the same answer, since every part has its own ``stat`` label.
    A 2,000-GPU shard's memory query (27 parts): 541 to 422 ms of Prometheus CPU."""
    if not terms:
        raise ValueError("union of no terms")
    while len(terms) > 1:
        terms = [f"({terms[i]} or {terms[i + 1]})" if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def uuid_regex(uuids: Iterable[str]) -> str:
    """A PromQL raw-string (backquoted) regex matching exactly these UUIDs.

    Only RE2's metacharacters are escaped (as Go's regexp.QuoteMeta): an alternation of plain
    literals is what Prometheus turns into direct index lookups instead of matching every
    value of the label (an escaped ``-`` would defeat that).
    """
    return "`" + "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", u) for u in sorted(set(uuids))) + "`"


# scrape intervals people configure (seconds): an estimate within 12% of one is taken to be it
_SCRAPE_INTERVALS = (1, 2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300, 600)


@functools.lru_cache(maxsize=4096)  # a few (span, count) pairs per fleet, asked for every GPU every cycle
def scrape_interval(span_s: float, samples: float) -> float:
    """The scrape interval that put ``samples`` samples in ``span_s`` seconds, in whole seconds.

    ``span / (n - 0.5)``: a range holds n or n + 1 samples of a regular series depending on
    where its ends fall (Prometheus 2 includes both). Snapped to a usual interval within 12%
    (missed scrapes, a few per cent, must not stretch it), else rounded: a step even slightly
    longer than the real interval skips a sample now and then, and that beat looks like a
    period of its own.
    """
    est = span_s / max(samples - 0.5, 0.5)
    usual = min(_SCRAPE_INTERVALS, key=lambda p: abs(math.log(p / est)))
    return float(usual) if abs(usual - est) <= 0.12 * est else float(max(1, round(est)))


# the last character of a node name (a DNS name: [a-z0-9], anything else falls in the last class)
_NAME_CLASSES = ("[0-4]", "[5-9]", "[a-h]", "[i-q]", "[r-z]", "[^0-9a-z]")
_MAX_NAME_DEPTH = 4  # 6^4 parts at most: a node list 1,296 times the cap is not split further


def name_parts(part: tuple[str, int] | None) -> list[tuple[str, int]]:
    """Split a part of the fleet's node names in smaller ones (empty: cannot be split).

    A part is (suffix regex, open): the names ending in ``suffix``, after anything when
    ``open``, exactly ``suffix`` when not. The whole fleet (None) splits by the last
    character, an open part by the character before its suffix, plus the names that are the
    suffix alone.
    """
    if part is None:
        return [(c, 1) for c in _NAME_CLASSES]
    suffix, is_open = part
    if not is_open or suffix.count("[") >= _MAX_NAME_DEPTH:
        return []
    return [(c + suffix, 1) for c in _NAME_CLASSES] + [(suffix, 0)]


def name_regex(names: Iterable[str]) -> str:
    """A PromQL raw-string regex matching exactly these node names (as :func:`uuid_regex`)."""
    return uuid_regex(names)


def selectable(uuid: str) -> bool:
    """Whether a UUID can be put into :func:`uuid_regex` (no backquote, not empty)."""
    return bool(uuid) and "`" not in uuid and uuid.isprintable()


@dataclass
class FleetReading:
    """Everything one cycle read: per-GPU stats keyed by (node, gpu), and bookkeeping."""

    at: float
    gpus: dict[tuple[str, str], GpuStats]
    queries: int
    util_step: float
    mem_step: float
    shards: int = 1


def _key(labels: dict[str, str], node_label: str) -> tuple[str, str, str] | None:
    node = labels.get(node_label, "")
    gpu = labels.get("gpu", "")
    if not node or not gpu:
        return None
    return node, gpu, labels.get("uuid", "")


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
        names = (sources.OURS, sources.DCGM, sources.AMD) if cfg.source == sources.AUTO else (cfg.source,)
        # one builder per source; ``builder`` is ours (or the one source asked for)
        self.builders = {n: QueryBuilder(cfg, sources.make(n, cfg.node_label)) for n in names}
        self.builder = self.builders.get(sources.OURS) or self.builders[names[0]]
        self.queries_sent = 0  # logical queries, cumulative (HTTP retries not counted)
        # a shard's 3 aggregates, the next shard's 3 (prefetched) and 2 range batches
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="promql")
        self.last: FleetReading | None = None  # bookkeeping of the last read (gpus empty when streamed)
        self._idle: Callable[[], None] | None = None  # while a read runs: classify the shard read before
        self.picked: dict[str, int] = {}  # source -> nodes, as last discovered (logged when it changes)

    def read(self, at: float) -> FleetReading:
        """All queries evaluated at unix time ``at``, every GPU kept; raises PromError on any failure."""
        gpus: dict[tuple[str, str], GpuStats] = {}
        snap = self.read_shards(at, gpus.update)
        snap.gpus = gpus
        return snap

    def discover(self, at: float) -> dict[str, dict[str, int]]:
        """GPUs per node, per source, from one query over every source asked for.

        A node whose GPUs our exporter publishes is read from our series even where another
        exporter runs too. Raises ``prometheus_empty`` naming what was looked for.
        """
        cfg = self.cfg
        if sources.OURS in self.builders:
            self.queries_sent += 1
            counts = self.client.query(self.builder.unlabelled(), at)
            # anything but a clean 0 (no answer, NaN, garbage) keeps the join: never drop data
            self.builder.join = not (len(counts) == 1 and counts[0].value == 0)
        for b in self.builders.values():
            b.node_labels = b.source.node_labels  # every candidate, to find which are in use
        found: dict[str, dict[str, int]] = {n: {} for n in self.builders}
        used: dict[str, set[str]] = {n: set() for n in self.builders}
        bad_names = 0
        for s in self._node_counts(at):
            found_by = self.builders.get(s.labels.get("source", ""))
            if found_by is None:
                continue
            b = found_by
            label = next((n for n in b.node_labels if s.labels.get(n)), "")
            node = s.labels.get(label, "")
            if node and selectable(node):
                # the count only sizes the shards: a garbage value must not drop the node
                n = int(s.value) if math.isfinite(s.value) and 0 < s.value < 1e6 else 8
                found[b.source.name][node] = found[b.source.name].get(node, 0) + n
                used[b.source.name].add(label)
            else:
                bad_names += 1
        if bad_names:
            log.warning("%d nodes have a name that cannot be selected in PromQL; skipped", bad_names)
        for name, b in self.builders.items():
            b.node_labels = tuple(n for n in b.source.node_labels if n in used[name]) or b.source.node_labels
        taken: set[str] = set()
        for name in self.builders:  # ours first
            found[name] = {n: c for n, c in found[name].items() if n not in taken}
            taken.update(found[name])
        if not taken:
            looked = "; ".join(f"{b.presence()} ({name})" for name, b in self.builders.items())
            raise PromError(EMPTY, f"no GPU series in Prometheus for the last {duration(cfg.window_s)}: looked for "
                                   f"{looked}; check --prometheus-url, --source and the scrape config")
        picked = {n: len(v) for n, v in found.items() if v}
        if picked != self.picked:
            log.info("source %s: %s", cfg.source, ", ".join(f"{n} for {c} nodes" for n, c in picked.items()))
            self.picked = picked
        return found

    def _node_counts(self, at: float) -> list[Sample]:
        """The nodes query's answer; one over the size cap is asked again in parts of the
        fleet, cut by the last characters of the node names (:func:`name_parts`)."""
        out: list[Sample] = []
        todo: list[tuple[str, int] | None] = [None]
        while todo:
            part = todo.pop()
            names = None if part is None else "`.*" + part[0] + "`" if part[1] else "`" + part[0] + "`"
            self.queries_sent += 1
            try:
                out += self.client.query(" or ".join(b.nodes(names) for b in self.builders.values()), at)
            except PromError as exc:
                subs = name_parts(part)
                if exc.kind != TOO_LARGE or not subs:
                    raise
                log.info("the node list was over the size cap: asking for it in %d parts", len(subs))
                todo += subs
        return out

    def read_shards(self, at: float, consume: Callable[[dict[tuple[str, str], GpuStats]], None]) -> FleetReading:
        """Read shard by shard, handing each shard's GPUs to ``consume`` before the next is read.

        A failed query fails the whole read (the caller then writes nothing): classifying
        from part of the data could write a wrong annotation (a GPU without its range would
        look unknown, for instance). Returns the bookkeeping, with ``gpus`` empty.
        """
        cfg = self.cfg
        before = self.queries_sent
        found = self.discover(at)
        queries = self.queries_sent - before
        dropped = 0
        steps: Counter[float] = Counter()
        mem_step = float(max(1, math.ceil(cfg.window_s / cfg.mem_points)))
        todo = [(name, nodes) for name, per_node in found.items() for nodes in plan_shards(per_node, cfg.shard_gpus)]
        done = 0
        prefetched: dict[tuple[str, tuple[str, ...]], list[Future[list[Sample]]]] = {}
        # A shard read waits for Prometheus twice: for its aggregates (prefetched while the
        # shard before is worked on) and for its range queries. The shard before is handed to
        # ``consume`` (classified) during the second wait, so that Prometheus computes ranges
        # while this process classifies instead of each idling in turn; at most one shard waits.
        waiting: dict[tuple[str, str], GpuStats] | None = None

        def flush() -> None:
            nonlocal waiting
            if waiting is not None:
                gpus, waiting = waiting, None
                consume(gpus)

        self._idle = flush
        try:
            while todo:
                name, nodes = todo.pop(0)
                b = self.builders[name]
                stats = prefetched.pop((name, tuple(nodes)), None) or self._stats(b, nodes, at)
                if todo and (todo[0][0], tuple(todo[0][1])) not in prefetched:
                    # Prometheus computes the next shard while this one is parsed and classified
                    prefetched[(todo[0][0], tuple(todo[0][1]))] = self._stats(self.builders[todo[0][0]], todo[0][1], at)
                try:
                    gpus, q, d, shard_steps = self._read_shard(b, nodes, at, mem_step, stats)
                except PromError as exc:
                    if exc.kind != TOO_LARGE or len(nodes) == 1:
                        for futures in prefetched.values():
                            _settle(futures)
                        flush()  # the shards before this one were classified, as without the overlap
                        raise
                    half = len(nodes) // 2
                    log.info("an answer for %d nodes was over the size cap: asking for %d and %d", len(nodes), half,
                             len(nodes) - half)
                    todo[:0] = [(name, nodes[:half]), (name, nodes[half:])]
                    queries += 3
                    continue
                queries += q
                dropped += d
                steps.update(shard_steps)
                done += 1
                flush()  # the shard before, if this one had no range query to classify it during
                waiting = gpus
            flush()
        finally:
            self._idle = None
        if dropped:
            log.warning("%d aggregate series had no node or GPU label; ignored", dropped)
        self.last = FleetReading(at=at, gpus={}, queries=queries,
                             util_step=steps.most_common(1)[0][0] if steps else 0.0,
                             mem_step=mem_step, shards=done)
        return self.last

    def _stats(self, b: QueryBuilder, nodes: list[str], at: float) -> list[Future[list[Sample]]]:
        """The shard's three aggregate queries, submitted to run side by side."""
        sel = name_regex(nodes)
        self.queries_sent += 3
        return [self._pool.submit(self.client.query, expr, at) for expr in
                (b.util_stats(sel), b.mem_stats(sel), b.allocation(sel))]

    def _step(self, v: dict[str, float]) -> float:
        """This GPU's utilisation range step: ``--step``, else its own scrape interval.

        From its own samples, never from other GPUs' (a shard's median made the step, and so
        the patterns, depend on which GPUs shared the shard, that is on the fleet's size): see
        :func:`scrape_interval`. The whole window's count gives it, or the denser half's when
        the halves differ by more than a tenth (a GPU that appeared or paused mid-window).
        """
        cfg = self.cfg
        step = cfg.step_s
        if step is None:
            count, early = finite(v.get("util_count")), finite(v.get("util_early"))
            step = 15.0
            if count is not None and early is not None and count > 1:
                late = count - early
                if min(early, late) >= 0.9 * max(early, late):
                    step = scrape_interval(cfg.window_s, count)
                elif max(early, late) > 1:
                    step = scrape_interval(cfg.window_s / 2, max(early, late))
        return float(max(1, round(max(step, cfg.min_step_s, cfg.window_s / cfg.max_points))))

    def _read_shard(self, b: QueryBuilder, nodes: list[str], at: float, mem_step: float,
                    futures: list[Future[list[Sample]]]
                    ) -> tuple[dict[tuple[str, str], GpuStats], int, int, Counter[float]]:
        """(GPUs of these nodes, queries sent, series dropped, utilisation steps used)."""
        cfg = self.cfg
        src = b.source
        key_of = _ours_key(cfg.node_label) if b.ours else src.key
        in_shard = set(nodes)
        util, mem, alloc = _settle(futures)
        queries = 3
        stats: dict[tuple[str, str, str], dict[str, float]] = {}
        uuid_labels: dict[str, str] = {}
        dropped = 0
        nl = cfg.node_label
        for prefix, samples in (("util_", util), ("mem_", mem)):
            names: dict[str, str] = {}  # stat -> prefixed name, made once per answer, not per series
            for s in samples:
                labels = s.labels
                if b.ours:  # _key inlined: the loop runs for every series of every shard
                    node, gpu = labels.get(nl, ""), labels.get("gpu", "")
                    k = (node, gpu, labels.get("uuid", "")) if node and gpu else None
                else:
                    k = key_of(labels)
                stat = labels.get("stat")
                if stat is None:
                    raise PromError(BAD_RESPONSE, "aggregate series without its 'stat' label")
                if k is None:
                    dropped += 1
                    continue
                if k[0] not in in_shard:
                    continue  # named by a label of higher rank than the one that selected it
                v = stats.get(k)
                if v is None:
                    v = stats[k] = {}
                name = names.get(stat)
                if name is None:
                    name = names[stat] = prefix + stat
                old = v.get(name)
                # one GPU scraped by several jobs (or named by several labels): the larger value
                v[name] = s.value if old is None or not s.value <= old else old
                if k[2] and k[2] not in uuid_labels:
                    uuid_labels[k[2]] = "uuid" if b.ours else src.uuid_label(labels)
        del util, mem
        holders: dict[tuple[str, str, str], dict[str, float]] = {}
        for s in alloc:
            k = key_of(s.labels)
            ns = s.labels.get("exported_namespace") or s.labels.get("namespace", "")
            pod = s.labels.get("exported_pod") or s.labels.get("pod", "")
            if k is not None and ns and pod and math.isfinite(s.value):
                held = holders.setdefault(k, {})
                held[f"{ns}/{pod}"] = max(s.value, held.get(f"{ns}/{pod}", 0.0))
        del alloc

        us, ms = src.util_scale, src.mem_scale
        gpus: dict[tuple[str, str], GpuStats] = {}
        raw: dict[tuple[str, str], dict[str, float]] = {}
        for (node, gpu, uuid), v in stats.items():
            fresh = any(v.get(s, 0.0) > 0 for s in ("util_fresh", "mem_fresh"))
            fresh = fresh or math.isfinite(v.get("mem_up", math.nan))
            total = v.get("mem_total")
            if total is None and "mem_used" in v and "mem_free" in v:
                total = v["mem_used"] + v["mem_free"]  # no total series (dcgm): used + free
            st = GpuStats(
                node=node, gpu=gpu, uuid=uuid, window_s=cfg.window_s, fresh=fresh,
                up=v.get("mem_up"),
                util_mean=_scaled(v.get("util_mean"), us), util_std=_scaled(v.get("util_std"), us),
                util_p95=_scaled(v.get("util_p95"), us),
                util_count=v.get("util_count"), util_early=v.get("util_early"),
                mem_used_mean=_scaled(v.get("mem_used"), ms), mem_total=_scaled(total, ms),
                mem_free_mean=_scaled(v.get("mem_free"), ms),
                mem_count=v.get("mem_count"), mem_early=v.get("mem_early"),
                util_fresh=v.get("util_fresh", 0.0), mem_fresh=v.get("mem_fresh", 0.0),
                util_step=self._step(v), mem_step=mem_step,
                sm_mean=v.get("util_sm_mean"), sm_count=v.get("util_sm_count"),
                xid_rise=v.get("mem_score_xid"), ecc_rise=v.get("mem_score_ecc"),
                throttle_ratio=v.get("mem_score_throttle"),
            )  # fmt: skip
            if cfg.health:
                # only the fields a GPU has (none, on most fleets): health.py skips a GPU without any
                fields = {name: v[key] for key, name in _HEALTH_KEYS if key in v}
                if fields:
                    st.health = fields
            holder = holders.get((node, gpu, uuid))
            if holder:
                st.holders = holder
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
        want_util: dict[tuple[float, str], list[str]] = {}
        want_mem: dict[str, list[str]] = {}
        steps: Counter[float] = Counter()
        for key, st in gpus.items():
            label = uuid_labels.get(st.uuid, "")
            if not st.fresh:
                continue
            steps[st.util_step] += 1
            if not label or not selectable(st.uuid):
                continue
            if seen[st.uuid] == 1:
                by_uuid[st.uuid] = key
            if self._wants_util_range(st):
                want_util.setdefault((st.util_step, label), []).append(st.uuid)
            if self._wants_mem_range(st, _scaled(raw[key].get("mem_deriv"), ms)):
                want_mem.setdefault(label, []).append(st.uuid)
        del raw
        dup = sorted(u for u, c in seen.items() if c > 1 and u)
        if dup:
            log.warning("%d GPU UUIDs appear on more than one node (%s...): their range series are matched by "
                        "the node label only", len(dup), printable(dup[0], 80))

        start = at - cfg.window_s
        mem_start = start + mem_step / 2  # one point per half-open interval of the window
        batches: list[_Batch] = []
        for (step, label), uuids in sorted(want_util.items()):
            batches += [_Batch(u, "util_range", start, step, label, us) for u in _batches(uuids, cfg.range_gpus)]
        for label, uuids in sorted(want_mem.items()):
            batches += [_Batch(u, "mem_range", mem_start, mem_step, label, ms)
                        for u in _batches(uuids, cfg.range_gpus)]
        while batches:
            pair = batches[:2]
            del batches[:2]
            calls = [self._range_call(b, bt, at) for bt in pair]
            results = self._all(*calls, idle=self._idle)
            queries += len(pair)
            for bt, res in zip(pair, results, strict=True):
                if isinstance(res, PromError):
                    if res.kind != TOO_LARGE or len(bt.uuids) == 1:
                        raise res
                    half = len(bt.uuids) // 2  # too large: ask for it in two halves
                    batches[:0] = [replace(bt, uuids=bt.uuids[:half]), replace(bt, uuids=bt.uuids[half:])]
                    continue
                self._attach(gpus, by_uuid, res, bt, at, key_of)
        return gpus, queries, dropped, steps

    def _range_call(self, b: QueryBuilder, bt: _Batch, at: float) -> Callable[[], list[RangeSeries] | PromError]:
        fn = b.util_range if bt.attr == "util_range" else b.mem_range

        def call() -> list[RangeSeries] | PromError:
            try:
                return self.client.query_range(fn(bt.uuids, bt.label), bt.start, at, bt.step)
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

    def _all(self, *calls: Callable[[], T], idle: Callable[[], None] | None = None) -> list[T]:
        """Run queries side by side (Prometheus answers one while we parse another); ``idle``:
        this thread's own work meanwhile (then every query runs on the pool)."""
        self.queries_sent += len(calls)
        futures = [self._pool.submit(c) for c in (calls if idle else calls[1:])]
        first: BaseException | None = None
        out: list[T] = []
        try:
            if idle:
                idle()
            else:
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
                series: list[RangeSeries], bt: _Batch, end: float,
                key_of: Callable[[dict[str, str]], tuple[str, str, str] | None]) -> None:
        """Put range points on their GPU; several series of one GPU (pods, jobs) fold by max."""
        start, step, attr, scale = bt.start, bt.step, bt.attr, bt.scale
        n = math.floor((end - start) / step + 1e-9)
        for rs in series:
            k = key_of(rs.labels)
            uuid = rs.labels.get(bt.label, "")
            key = (k[0], k[1]) if k is not None else by_uuid.get(uuid)
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
                    v *= scale
                    old = vals[i]
                    vals[i] = v if old is None or v > old else old


@dataclass(frozen=True)
class _Batch:
    """One range query's GPUs and how to read them."""

    uuids: list[str]
    attr: str  # util_range or mem_range
    start: float
    step: float
    label: str  # the label selecting them (uuid, UUID, gpu_uuid, serial_number)
    scale: float  # to SI


def _scaled(x: float | None, scale: float) -> float | None:
    return None if x is None else x * scale


def _ours_key(node_label: str) -> Callable[[dict[str, str]], tuple[str, str, str] | None]:
    return lambda labels: _key(labels, node_label)


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

