"""The profiler's PromQL, as text: what one cycle asks of Prometheus. Pure (no I/O), tested alone.

A cycle asks, evaluated at one instant:

0. **nodes** (instant): GPUs per node with a ``gpu_up`` sample in the window,
   ``count by (node)``: one sample per node. The nodes are cut into shards of about
   ``shard_gpus`` GPUs (default 2,000), each selected by a short name pattern, never a list
   of its nodes (:func:`plan_shards`, :func:`shard_pattern`): a query's length does not grow
   with the fleet, and :func:`pack` keeps each under ``max_query_bytes``.
Then, per shard (``{node=~`gpu-node-0[0-1].*|gpu-node-02[0-4].*`}``):

1. utilisation aggregates (instant), grouped by (node, gpu, uuid): mean, stddev, 95th
   percentile, sample count, count in the older half of the window, count in the
   freshness period; and the mean and sample count of the whole GPU's SM activity
   (``gpu_sm_active_ratio{gpu_instance=""}``, NVIDIA GPM: absent elsewhere) for ``underused``;
2. memory aggregates (instant): mean used, mean free, total, ``deriv`` of used, the count
   in the freshness period, last ``gpu_up``;
3. allocation (instant): how many samples of the window each ``gpu_allocation_info``
   holder (namespace, pod) covers (pod attribution; empty without it);
4. utilisation range (query_range) of only the GPUs whose variation could be a period
   (not idle, coefficient of variation near or above the steady threshold, decided from
   query 1), selected by ``uuid``, in batches of at most ``range_gpus`` GPUs;
5. memory used range (query_range, coarse step) of only the GPUs whose ``deriv`` could
   be a leak (from query 2), selected by ``uuid``, batched the same way, with (instant)
   their memory-used sample counts over the window and its older half (:meth:`QueryBuilder.mem_counts`).

The first query of the cycle counts the series without the node label: when there are none
(the shipped scrape configs), the shards' aggregates leave out the join branch, whose
``{node=""}`` selectors cost time in proportion to the whole fleet, in every shard.

A shard's aggregates are one query per statistic (:class:`Part`), bare: no ``label_replace``
of every series with its ``stat``, no ``or`` hashing the parts' samples (the store's CPU for
a 10,000-node read fell by 15%). Only the parts that name their series themselves (a label
made part of the stat, the allocation's holders) are joined, by a balanced tree of ``or``
(:func:`union`): a left-deep chain costs Prometheus 2 a hash of every sample gathered so far
at each ``or``, empty parts included. The optional statistics of metrics the store does not
hold (:meth:`QueryBuilder.has`, from the cycle's metric names) are not asked for.

Sources: the metric names, units and identity labels come from a :class:`Source`
(sources.py): ours, dcgm-exporter's or AMD's. With ``source=auto`` the nodes query asks
every source at once. Queries 4 and 5 select raw series (the per-GPU folding is fold.py's):
Prometheus 2.x evaluates an aggregation in a range query at every step, which measured five
times slower than selecting the series.

Node identity: the shipped scrape configs put a ``node`` label on every series. A series
without it (a user's own scrape config) is joined to ``gpu_host_info`` on ``instance``,
which carries the exporter's own ``node`` label. Both branches run in every aggregate
query (``or``), so a cluster mixing the two works and the join costs nothing when every
series has the label; the range queries map series to nodes through their ``uuid``.
Per-GPU series may carry ``pod``/``namespace``/``container`` (attribution) and be scraped
by more than one job: ``max by (node, gpu, uuid)`` folds those into one series per GPU.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.profiler import sources
from exporter.profiler.classify import Thresholds
from exporter.profiler.health import XidRules
from exporter.profiler.sources import Source

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

# the longest single part of an aggregate query (7.5 KB: a dcgm-exporter health statistic over four
# node labels, for 253-character node names full of escaped dots) fits this
MIN_QUERY_BYTES = 8192

_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


_PCI = 'pci_bus_id=~"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}[.][0-7]"'  # a bus id, nothing else
_STATES = 'state=~"degraded|failed|hung|lost"'  # gpu_health_state's states but ok (exporter/core/gpu_health.py)


class Part(NamedTuple):
    """One statistic of a shard's aggregates, per GPU: ``expr``, and ``stat``, its name, or None when
    the expression names its series itself (a label made part of the stat, ``xid_<code>``, or the
    allocation's holders). A named statistic is sent as a query of its own, bare: the store then
    spends nothing on a ``label_replace`` of every series or on an ``or`` hashing the parts' samples,
    and the answers carry no ``stat`` label (the reader knows whose answer it is)."""

    stat: str | None
    expr: str

    @property
    def tagged(self) -> str:
        """The expression with its ``stat`` label, for a union of parts."""
        return self.expr if self.stat is None else QueryBuilder.tag(self.expr, self.stat)


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
    # also read each GPU's PCI bus id (ours: gpu_info's pci_bus_id, one series per GPU): --device-taints
    # finds AMD's DRA devices by it (its driver publishes pciAddr, no UUID amd-smi knows)
    pci: bool = False
    trust: sources.Trust = field(default_factory=sources.Trust)  # whose target-set node labels are believed
    # --xid-severity: (XID code or event, fatal|warn|ignore) over NVIDIA's catalogue (health.XidRules)
    xid_severity: tuple[tuple[int | str, str], ...] = ()
    max_query_bytes: int = 16384  # longest query expression (VictoriaMetrics' default -search.maxQueryLen)

    def __post_init__(self) -> None:
        if self.max_query_bytes < MIN_QUERY_BYTES:
            raise ValueError(f"max query bytes {self.max_query_bytes} must be at least {MIN_QUERY_BYTES}")
        if not _LABEL_RE.match(self.node_label):
            raise ValueError(f"node label {self.node_label!r} is not a valid Prometheus label name")
        if self.source not in sources.CHOICES:
            raise ValueError(f"source {self.source!r} is not one of {', '.join(sources.CHOICES)}")


class QueryBuilder:
    """Builds the PromQL text for a :class:`QueryConfig` and one :class:`Source` (pure, testable)."""

    def __init__(self, cfg: QueryConfig, source: Source | None = None) -> None:
        self.cfg = cfg
        self.source = source or sources.gpu_exporter(cfg.node_label, cfg.trust)
        self.ours = self.source.name == sources.OURS
        nl = cfg.node_label
        self.by = f"{nl}, gpu, uuid" if self.ours else ", ".join(self.source.identity)
        self.join = self.ours  # include the gpu_host_info join for series without the node label
        # node labels the shards select on: those that named a node in the last discovery
        self.node_labels: tuple[str, ...] = self.source.node_labels
        # the metric names the store holds for this window (Reader.discover: its label values of
        # __name__); None: not known, every statistic is asked for
        self.present: frozenset[str] | None = None

    def has(self, metric: str | None) -> bool:
        """Whether the store may hold ``metric``: a statistic of a metric it does not hold is an empty
        answer, left out of the shards' queries rather than evaluated (an absent metric's part still
        costs the store 5-20 ms a shard: its node pattern matched against every node name). An
        optional statistic only: the ones every GPU needs are asked for whatever the names said."""
        if not metric:
            return False
        if self.present is None:
            return True
        if self.source.any_prefix:  # selected as ``__name__=~".*metric"``
            return any(n.endswith(metric) for n in self.present)
        return metric in self.present

    def sel(self, metric: str, matchers: str) -> str:
        return self.source.selector(metric, matchers)

    def _host(self, at: str, nodes: str | None = None) -> str:
        nl = self.cfg.node_label
        # gpu_host_info's node is the exporter's own label: believed only from a trusted job/namespace
        trust = self.cfg.trust.matchers()
        sel = f"{{node=~{nodes}, {trust}}}" if nodes else f"{{{trust}}}"
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
            branches = [fn(self.source.node_matcher(lab, nodes)) for lab in self.node_labels]
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
        names = s.util if s.present_by_util else f"{s.util}/{s.mem_used}"
        return names + (" (any name prefix)" if s.any_prefix else "")

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
            inner = self.per_gpu(lambda m: f"last_over_time({self.sel(s.util, m)}[{w}])" + (
                "" if s.present_by_util else f" or last_over_time({self.sel(s.mem_used, m)}[{w}])"), nodes=names)
            by = ", ".join(self.node_labels)
        return f'label_replace(count by ({by}) ({inner}), "source", "{s.name}", "", "")'

    @staticmethod
    def tag(expr: str, stat: str) -> str:
        return f'label_replace({expr}, "stat", "{stat}", "gpu", ".*")'

    def util_stats(self, nodes: str | None = None) -> str:
        """The utilisation aggregates of a shard in one query (:meth:`util_parts` joined)."""
        return union([p.tagged for p in self.util_parts(nodes)])

    def mem_stats(self, nodes: str | None = None) -> str:
        """The memory (and health, score) aggregates of a shard in one query."""
        return union([p.tagged for p in self.mem_parts(nodes)])

    def shard_queries(self, nodes: str | None, limit: int, most: int) -> list[tuple[str, str | None, str]]:
        """A shard's aggregate queries as sent, (group: util, mem or alloc; the statistic or None; the
        query): a named statistic alone and bare (:class:`Part`), the others joined by :func:`pack`
        into queries of at most ``most`` parts and ``limit`` bytes."""
        out: list[tuple[str, str | None, str]] = []
        for group, parts in (("util", self.util_parts(nodes)), ("mem", self.mem_parts(nodes)),
                             ("alloc", self.allocation_parts(nodes))):
            out += [(group, p.stat, p.expr) for p in parts if p.stat is not None]
            out += [(group, None, q) for q in pack([p.tagged for p in parts if p.stat is None], limit, most)]
        return out

    def util_parts(self, nodes: str | None = None) -> list[Part]:
        """One expression per utilisation statistic."""
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
        if self.has(s.sm):
            # whole GPUs only (a MIG instance has its own series): underused where the series exists
            parts["sm_mean"] = lambda m: f"avg_over_time({sel(s.sm, m + ', ' + s.sm_whole)}[{w}])"
            parts["sm_count"] = lambda m: f"count_over_time({sel(s.sm, m + ', ' + s.sm_whole)}[{w}])"
        return [Part(stat, self.per_gpu(fn, nodes=nodes)) for stat, fn in parts.items()]

    def mem_parts(self, nodes: str | None = None) -> list[Part]:
        """One expression per memory, health and score statistic."""
        w = duration(self.cfg.window_s)
        f = duration(self.cfg.fresh_s)
        s = self.source
        used = s.mem_used
        sel = self.sel
        # memory-used's sample counts (count, early) decide only the growth test, which needs the
        # memory range: they are asked for with it, for its GPUs alone (mem_counts), not here
        parts: dict[str, Callable[[str], str]] = {
            "used": lambda m: f"avg_over_time({sel(used, m)}[{w}])",
            "fresh": lambda m: f"count_over_time({sel(used, m)}[{f}])",
            "deriv": lambda m: f"deriv({sel(used, m)}[{w}])",
        }
        if self.has(s.mem_free):
            parts["free"] = lambda m: f"avg_over_time({sel(s.mem_free, m)}[{w}])"
        if self.has(s.mem_total):
            parts["total"] = lambda m: f"max_over_time({sel(s.mem_total, m)}[{w}])"
        if self.has(s.health.up):
            parts["up"] = lambda m: f"last_over_time({sel(s.health.up, m)}[{f}])"
        if self.cfg.health:
            parts.update(self._health_parts())
        if self.ours:
            parts.update(self._score_parts())
        # labels that become part of the stat (health.py): the XID counter's code (one series per
        # code that rose, stat xid_<code>) and the exporter's health state with its cause
        # (state_<state>|<cause>: one series, the GPU's state when it is not ok)
        keep = {"xid": "xid", "state": "state", "pci": "pci_bus_id"} if self.cfg.health else {}
        out = []
        for stat, fn in parts.items():
            if stat == "state" and stat in keep:
                by = self.per_gpu(fn, nodes=nodes, by=", state, cause")
                joined = f'label_join({by}, "stat", "|", "state", "cause")'
                out.append(Part(None, f'label_replace({joined}, "stat", "state_$1", "stat", "(.*)")'))
            elif stat in keep and (stat != "xid" or s.health.xid_counter):
                by = self.per_gpu(fn, nodes=nodes, by=", " + keep[stat])
                out.append(Part(None, f'label_replace({by}, "stat", "{stat}_$1", "{keep[stat]}", "(.*)")'))
            else:
                out.append(Part(stat, self.per_gpu(fn, nodes=nodes)))
        return out

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
        parts: dict[str, Callable[[str], str]] = {}
        if self.has(XID):
            parts["score_xid"] = rise(XID, "")
        if self.has(ECC):
            parts["score_ecc"] = rise(ECC, ', error_type="uncorrected", counter="volatile"')
        if self.has(THROTTLE):
            parts["score_throttle"] = lambda m: f'avg_over_time({THROTTLE}{{{m}, reason=~"{slow}"}}[{w}])'
        return parts

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

        if self.has(h.xid_counter):
            # every code but those ignored (health.py sorts fatal from warn); only numbers: a
            # scraped target's odd xid label cannot add series to the answer
            ignored = "|".join(str(c) for c in XidRules(dict(self.cfg.xid_severity)).ignored())
            parts["xid"] = rise(h.xid_counter, f', xid=~"[0-9]{{1,5}}", xid!~"{ignored}"')
        if self.has(h.xid_last):
            x = h.xid_last
            parts["xid_min"] = lambda m: f"min_over_time({sel(x, m)}[{w}])"
            parts["xid_max"] = lambda m: f"max_over_time({sel(x, m)}[{w}])"
            parts["xid_last"] = lambda m: f"last_over_time({sel(x, m)}[{w}])"
            parts["xid_changes"] = lambda m: f"changes({sel(x, m)}[{w}])"
            parts["xid_before"] = lambda m: f"last_over_time({sel(x, m)}[{w}] offset {w})"
        if self.has(h.ecc_uncorrectable):
            parts["ecc"] = rise(h.ecc_uncorrectable, ", " + h.ecc_matcher if h.ecc_matcher else "")
        if self.has(h.remap_failed):
            parts["remap"] = lambda m: f"last_over_time({sel(h.remap_failed, m)}[{f}])"
        if self.has(h.retire_pending):
            parts["retire"] = lambda m: f"last_over_time({sel(h.retire_pending, m)}[{f}])"
        if self.has(h.pcie_width):
            parts["width"] = lambda m: f"last_over_time({sel(h.pcie_width, m)}[{f}])"
        if h.pcie_width and self.has(h.pcie_width_max):
            parts["width_max"] = lambda m: f"last_over_time({sel(h.pcie_width_max, m)}[{f}])"
        if self.has(h.state):
            # the exporter's own verdict, where it is not ok (nearly never: an empty part); the
            # states are a fixed set, so a target's odd label cannot add series
            parts["state"] = lambda m: (f'last_over_time({sel(h.state, m + ", " + _STATES)}[{f}]) == 1')
        if self.cfg.pci and self.ours and self.has("gpu_info"):  # stat pci_<bus id> (taints.py canonicalises it)
            parts["pci"] = lambda m: f'last_over_time({sel("gpu_info", m + ", " + _PCI)}[{f}])'
        return parts

    def allocation_parts(self, nodes: str | None = None) -> list[Part]:
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
        if self.ours and not self.has(ALLOCATION):  # no pod attribution in this fleet
            return []
        exported_sel = ', exported_pod!=""'
        plain_sel = ', exported_pod="", pod!=""'
        exported = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + exported_sel)}[{w}])",
                                nodes=nodes, by=", exported_namespace, exported_pod")
        if self.ours:
            plain = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + plain_sel)}[{w}])",
                                 nodes=nodes, by=", namespace, pod")
            return [Part(None, exported), Part(None, plain)]  # label sets apart: their ``or`` is their concatenation
        plain = self.per_gpu(lambda m: f"count_over_time({self.sel(metric, m + plain_sel)}[{w}])",
                             nodes=nodes, by=", namespace, pod, job")
        return [Part(None, exported),
                Part(None, f"({plain} unless on (namespace, pod, job) group by (namespace, pod, job) (up))")]

    def util_range(self, uuids: Iterable[str], label: str = "uuid") -> str:
        """Raw utilisation series of the GPUs with these UUIDs (a query_range; which of them are
        believed is fold.attach_range's: ``Source.believed``)."""
        return self.sel(self.source.util, f"{label}=~{uuid_regex(uuids)}")

    def mem_range(self, uuids: Iterable[str], label: str = "uuid") -> str:
        """Raw memory-used series of the GPUs with these UUIDs (a query_range, as :meth:`util_range`)."""
        return self.sel(self.source.mem_used, f"{label}=~{uuid_regex(uuids)}")

    def mem_counts(self, uuids: Iterable[str], label: str = "uuid", nodes: str | None = None) -> str:
        """Memory-used's sample counts over the window (``count``) and its older half
        (``early``) of the GPUs with these UUIDs (instant): the growth test's minimums, asked
        for with the memory range of the GPUs that get one, not for every GPU in the memory
        aggregates (two series reads of every GPU, about a sixth of the store's work a cycle).
        ``nodes``: the shard's :func:`shard_pattern` (None: any node, which costs the store a
        scan of every node's series)."""
        w = duration(self.cfg.window_s)
        half = duration(self.cfg.window_s / 2)
        used, ids = self.source.mem_used, f"{label}=~{uuid_regex(uuids)}"
        # per_gpu: the node named by the scrape's label, a target's only from the trusted jobs
        return union([
            self.tag(self.per_gpu(lambda m: f"count_over_time({self.sel(used, m + ', ' + ids)}[{w}])", nodes=nodes),
                     "count"),
            self.tag(self.per_gpu(lambda m: f"count_over_time({self.sel(used, m + ', ' + ids)}[{half}] offset {half})",
                                  nodes=nodes), "early")])


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
    return "`" + "|".join(_literal(u) for u in sorted(set(uuids))) + "`"



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


def selectable(uuid: str) -> bool:
    """Whether a UUID can be put into :func:`uuid_regex` (no backquote, not empty)."""
    return bool(uuid) and "`" not in uuid and uuid.isprintable()



def plan_shards(gpus_per_node: dict[str, int], shard_gpus: int) -> list[list[str]]:
    """The fleet's nodes cut into shards of at most ``shard_gpus`` GPUs, each a run of the
    sorted names that :func:`shard_pattern` selects in a few bytes (no list of nodes).

    A shard is filled up to ``shard_gpus`` (a node with more GPUs than that is a shard of its
    own) unless its pattern would then be longer than ``2·L + 20`` bytes for its longest name
    of L characters; then it ends earlier, at the start of the last subtree of the names' trie
    it cut into, until the pattern fits (one name always does). The pattern is a union of the
    trie's subtrees (:func:`shard_pattern`), so a shard is no longer a whole subtree: 10,000
    nodes named ``gpu-node-0000`` ... make 40 shards of 2,000 GPUs, where whole subtrees made 50
    of 1,600, and every shard's aggregates select that many more series per query.
    """
    names = sorted(gpus_per_node)
    total = [0]
    for n in names:
        total.append(total[-1] + max(1, gpus_per_node[n]))
    shards: list[list[str]] = []
    i = 0
    while i < len(names):
        # the last node that keeps the shard within shard_gpus (at least the first one)
        j = max(i, bisect_right(total, total[i] + shard_gpus, i + 1) - 2)
        while j > i and len(_pattern(names, i, j)) > 2 * max(map(len, names[i:j + 1])) + 20:
            k = len(_common_prefix([names[i], names[j]]))
            last_child = _subtree(names, names[j][:k + 1], i)[0]
            j = last_child - 1 if last_child - 1 > i else j - 1
        shards.append(names[i:j + 1])
        i = j + 1
    return shards


def _subtree(names: Sequence[str], prefix: str, lo: int = 0) -> tuple[int, int]:
    """The names (sorted) that begin with ``prefix``: ``names[a:b]``, as (a, b)."""
    a = bisect_left(names, prefix, lo)
    return a, bisect_left(names, True, a, key=lambda n: not n.startswith(prefix))


def _pattern(names: Sequence[str], i: int, j: int) -> str:
    """A regex (without its quotes) matching ``names[i..j]`` and no other of ``names``: the
    fewest subtrees of their trie that make up the run, joined with ``|``."""
    return "|".join(_pieces(names, i, j))


def _pieces(names: Sequence[str], i: int, j: int) -> list[str]:
    first, last = names[i], names[j]
    if i == j:
        return [_literal(first)]
    k = len(_common_prefix([first, last]))
    prefix = first[:k]
    a, b = _subtree(names, prefix)
    if (a, b) == (i, j + 1):
        # the whole subtree (the prefix itself a name or not); never a pattern that matches the
        # empty string: node=~".*" would select the series with no node label too, whose node the
        # scraped target names (sources.Source.node_matcher, the trust boundary of issue 36)
        return [_literal(prefix) + (".*" if prefix else ".+")]
    if len(first) == k:  # the prefix is itself one of the names, sorted before its subtree
        return [_literal(first), *_pieces(names, i + 1, j)]
    # first and last differ at k: a tail of first's child, whole children, a head of last's child
    left = _subtree(names, prefix + first[k], a)
    right = _subtree(names, prefix + last[k], left[1])
    out: list[str] = []
    lo, hi = left[0], right[1] - 1  # the whole children's names, as indexes
    if left[0] != i:
        out += _pieces(names, i, left[1] - 1)
        lo = left[1]
    tail: list[str] = []
    if right[1] != j + 1:
        tail = _pieces(names, right[0], j)
        hi = right[0] - 1
    if lo <= hi:
        c, d = names[lo][k], names[hi][k]
        out.append(_literal(prefix) + (_literal(c) if c == d else f"[{_class_char(c)}-{_class_char(d)}]") + ".*")
    return out + tail


def _common_prefix(names: list[str]) -> str:
    """The characters ``names`` all begin with (character by character, not path components)."""
    a, b = min(names), max(names)
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return a[:k]


def _literal(text: str) -> str:
    """``text`` as an RE2 literal: its metacharacters escaped (as Go's regexp.QuoteMeta)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _class_char(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}"


def shard_pattern(nodes: Iterable[str], fleet: Sequence[str] | None = None) -> str:
    """A PromQL raw-string regex for a shard of :func:`plan_shards`, of a size that does not
    grow with the shard.

    With ``fleet`` (every node name of the source, sorted), the trie's subtrees that make up
    the run from the shard's first name to its last (``gpu-node-0[0-1].*|gpu-node-02[0-4].*``):
    it matches exactly those of the fleet's names. Without it, the names' common prefix and the
    range of the characters after it (``gpu-node-0[0-2].*``), the prefix alone being a name
    too when it is one of them: it matches every one of ``nodes`` and possibly some of their
    neighbours' (the answers' series of nodes outside the shard are ignored: fold.py).
    """
    names = sorted(set(nodes))
    if not names:
        raise ValueError("pattern of no nodes")
    first, last = names[0], names[-1]
    if fleet is not None:
        i, j = bisect_left(fleet, first), bisect_left(fleet, last)
        if i < len(fleet) and j < len(fleet) and fleet[i] == first and fleet[j] == last:
            return "`" + _pattern(fleet, i, j) + "`"
    if first == last:
        return "`" + _literal(first) + "`"
    prefix = _common_prefix([first, last])
    k = len(prefix)
    lo, hi = (names[1] if len(first) == k else first)[k], last[k]
    chars = _literal(lo) if lo == hi else f"[{_class_char(lo)}-{_class_char(hi)}]"
    tail = f"(?:{chars}.*)?" if len(first) == k else f"{chars}.*"
    return "`" + _literal(prefix) + tail + "`"


def query_bytes(expr: str) -> int:
    """The length a store checks against its limit (VictoriaMetrics' -search.maxQueryLen,
    Mimir's max_query_expression_size_bytes): bytes of the expression's UTF-8."""
    return len(expr.encode())


def pack(parts: list[str], limit: int, most: int | None = None) -> list[str]:
    """Parts (each with its own ``stat`` label, or its own label set) joined by :func:`union`
    into as few queries of at most ``limit`` bytes, and of at most ``most`` parts, as the order
    allows. The answers' union is the union's answer, so cutting it changes nothing but the
    number of queries; a part longer than ``limit`` alone is a query of its own (the client
    refuses it: too long)."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for part in parts:
        n = query_bytes(part)
        if cur and (size + n + _OR_BYTES > limit or len(cur) == most):
            out.append(union(cur))
            cur, size = [], 0
        size += n + (_OR_BYTES if cur else 0)
        cur.append(part)
    if cur:
        out.append(union(cur))
    return out


_OR_BYTES = len("( or )")  # what union adds per part joined
