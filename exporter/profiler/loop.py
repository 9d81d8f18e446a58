"""The profiler cycle, its loop, and its own HTTP endpoint (``/metrics``, ``/healthz``).

A cycle: read the snapshot from Prometheus (``3 + S·A + R`` queries for S shards of A aggregate
queries and R range batches, docs/profiler.md), list the Nodes (1 call), classify
every reporting GPU, plan each node's annotations, and patch only nodes whose plan differs
from what they carry. Any failure is counted in ``gpu_profiler_errors_total{kind}`` and ends
that step, never the loop; when the read fails nothing is written at all.

Logging is per outage, not per cycle (as the exporter's engine does for a backend): the
first failure of an error kind is logged at ERROR, its repeats at DEBUG while that kind keeps
failing, and one INFO line says when it cleared. A kind clears on the first cycle that gets
through the step where it arises without it (a Prometheus kind once a read succeeds, a
Kubernetes kind once the writes ran, ``internal`` once a cycle ends normally).

``/healthz`` is liveness: 200 while the loop thread runs and is not stuck, 503 otherwise
(a cycle running longer than ``stall_after_s``, or no cycle finished for
``interval + stall_after_s``).
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.core.schema import PROFILER_FAMILY_BY_NAME, Family
from exporter.platform.exposition import answer_headers, encode, write_metrics
from exporter.platform.http import Handler, HTTPServer, Response, wants_gzip, wants_openmetrics
from exporter.profiler import annotate, health, prom, queries
from exporter.profiler.annotate import Conflict, KubeError, NodeGone, NodeInfo, NodeStore
from exporter.profiler.classify import ALLOCATED_IDLE, GROWING, GpuStats, classify_gpu
from exporter.profiler.events import EventRecorder
from exporter.profiler.health import XidRules
from exporter.profiler.leader import LeaderElector
from exporter.profiler.plan import (
    PENDING,
    GpuInput,
    PlanConfig,
    clean_holders,
    diff,
    has_our_keys,
    owned_names,
    parse_pending,
    plan_node,
    valid_gpu_id,
    valid_uuid,
)
from exporter.profiler.prom import PromError, printable
from exporter.profiler.queries import Reader
from exporter.profiler.taints import DeviceTaints, Failed

if TYPE_CHECKING:
    from exporter.platform.webconfig import WebConfig

log = logging.getLogger(__name__)

INTERNAL = "internal"
ERROR_KINDS = (*prom.KINDS, queries.EMPTY, *annotate.KINDS, INTERNAL)
CONFLICT_RETRIES = 3


# a node's plan (Profiler._plan): write the condition, the annotations it should carry, the patch to them
_NodePlan = tuple[bool, dict[str, str], dict[str, str | None]]


@dataclass
class _Outage:
    """An error kind failing on consecutive cycles: when it began (monotonic), and for how many cycles."""

    started: float
    cycles: int = 0
    counted_in: int = -1  # the last cycle (cycles_done) counted


@dataclass
class CycleResult:
    """What one cycle did (also what ``--once`` reports)."""

    ok: bool = True
    duration_s: float = 0.0
    read_s: float = 0.0  # Prometheus queries and parsing
    classify_s: float = 0.0  # statistics for every GPU
    write_s: float = 0.0  # listing nodes, planning, patching
    queries: int = 0
    nodes_seen: int = 0  # nodes with GPU data or with our annotations
    patches: int = 0  # merge patches sent (dry run: that would be sent)
    unchanged: int = 0
    shards: int = 0  # node shards read from Prometheus
    largest_response_bytes: int = 0  # the longest Prometheus answer read so far
    events: int = 0  # Kubernetes Events recorded
    status_writes: int = 0  # GPUHealthy condition patches (nodes/status) sent (dry run: that would be sent)
    errors: list[str] = field(default_factory=list)  # kinds
    patterns: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, gpu) -> published


def _peak_rss() -> str:
    """This process image's peak resident memory (Linux ``VmHWM``), e.g. ``181.2 MiB``.

    Not ``getrusage``: Linux carries ``ru_maxrss`` across ``exec``, so a profiler started by
    a large process would report its parent's size.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return f"{int(line.split()[1]) / 1024:.1f} MiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _row(name: str) -> Family:
    return PROFILER_FAMILY_BY_NAME[name]


class _PatternCollector(Collector):
    """``gpu_profile_pattern{node,gpu,pattern} 1`` for the patterns last published."""

    def __init__(self) -> None:
        self.patterns: dict[tuple[str, str], str] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        row = _row("gpu_profile_pattern")
        fam = GaugeMetricFamily(row.name, row.help, labels=list(row.labels))
        for (node, gpu), pattern in sorted(self.patterns.items()):
            fam.add_metric([node, gpu, pattern], 1.0)
        yield fam


class _StateCollector(Collector):
    """Leadership, Events and the largest Prometheus answer, read when scraped."""

    def __init__(self) -> None:
        self.profiler: Profiler | None = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        p = self.profiler
        if p is None:
            return
        if p.elector is not None:
            row = _row("gpu_profiler_leader")
            yield GaugeMetricFamily(row.name, row.help, value=1.0 if p.elector.leading.is_set() else 0.0)
        if p.events is not None:
            row = _row("gpu_profiler_events_total")
            fam = CounterMetricFamily(row.base, row.help, labels=list(row.labels))
            for result, n in sorted(p.events.counts.items()):
                fam.add_metric([result], float(n))
            yield fam
        row = _row("gpu_profiler_prometheus_largest_response_bytes")
        yield GaugeMetricFamily(row.name, row.help, value=float(p.reader.client.largest_response_bytes))
        row = _row("gpu_profiler_prometheus_refusals_total")
        refused = CounterMetricFamily(row.base, row.help, labels=list(row.labels))
        for kind in prom.SPLIT_KINDS:
            refused.add_metric([kind], float(p.reader.refusals.get(kind, 0)))
        yield refused


class ProfilerMetrics:
    """The profiler's own metrics, in a private registry (never the process-global one); each is made from
    its row of ``schema.PROFILER_FAMILIES`` and written by the exporter's writer (exporter/platform/exposition.py)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def made(kind: Any, name: str, **kw: Any) -> Any:
            row = _row(name)
            return kind(row.base, row.help, list(row.labels), registry=r, **kw)

        self.cycles = made(Counter, "gpu_profiler_cycles_total")
        self.duration = made(Histogram, "gpu_profiler_cycle_duration_seconds",
                             buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.queries = made(Counter, "gpu_profiler_prometheus_queries_total")
        self.requests = made(Counter, "gpu_profiler_prometheus_requests_total")
        self.patched = made(Counter, "gpu_profiler_nodes_patched_total")
        self.errors = made(Counter, "gpu_profiler_errors_total")
        self.last_success = made(Gauge, "gpu_profiler_last_success_timestamp_seconds")
        self.gpus = made(Gauge, "gpu_profiler_gpus")
        self.rejected = made(Counter, "gpu_profiler_label_values_rejected_total")
        for label in ("uuid", "holder"):
            self.rejected.labels(label)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        for res in ("ok", "failed"):
            self.cycles.labels(res)
        self.pattern_collector = _PatternCollector()
        r.register(self.pattern_collector)
        self._state = _StateCollector()
        r.register(self._state)

    def attach(self, profiler: Profiler) -> None:
        """Metrics read from the profiler's parts at scrape time (leadership, Events, answer sizes)."""
        self._state.profiler = profiler

    def exposition(self, openmetrics: bool = False) -> bytes:
        """Prometheus text 0.0.4, or OpenMetrics 1.0, of every family (no ``*_created`` samples)."""
        return write_metrics(self.registry.collect(), PROFILER_FAMILY_BY_NAME, openmetrics)


class Profiler:
    """One profiler: a Prometheus reader, a node store (None: dry run without a cluster)."""

    def __init__(self, reader: Reader, store: NodeStore | None, plan: PlanConfig, dry_run: bool = False,
                 out: IO[str] | None = None, metrics: ProfilerMetrics | None = None,
                 clock: Callable[[], float] = time.time, write_concurrency: int = 4,
                 elector: LeaderElector | None = None, events: EventRecorder | None = None,
                 health: bool = False, latency_offset_s: float = 0.0,
                 taints: DeviceTaints | None = None) -> None:
        self.reader = reader
        self.elector = elector
        self.events = events
        self.store = store
        self.plan = plan
        self.dry_run = dry_run or store is None
        self.out = out if out is not None else sys.stdout
        self.metrics = metrics or ProfilerMetrics()
        self.metrics.attach(self)
        self.clock = clock
        # a cycle evaluates this long before now: the store's newest points may still be filling
        # in (VictoriaMetrics' -search.latencyOffset hides and flattens its newest 30 s)
        self.latency_offset_s = latency_offset_s
        # dry run: what the nodes would carry had the patches been sent (keeps hysteresis going)
        self._overlay: dict[str, dict[str, str]] = {}
        self._cond_overlay: dict[str, dict[str, str]] = {}
        if health and not reader.cfg.health:
            raise ValueError("the GPUHealthy condition needs the reader's health fields (QueryConfig(health=True))")
        self.health = health  # set the GPUHealthy Node condition (needs patch on nodes/status)
        if taints is not None and not reader.cfg.health:
            raise ValueError("device taints need the reader's health fields (QueryConfig(health=True))")
        self.taints = taints  # --device-taints: a DeviceTaintRule per failed GPU (taints.py)
        self._xid_rules = XidRules(dict(reader.cfg.xid_severity))  # catalogue + --xid-severity
        self._at = 0.0  # the cycle's evaluation time
        self.cycle_started: float | None = None  # monotonic, while a cycle runs
        self.last_cycle_end: float = time.monotonic()
        self.cycles_done = 0
        self._outages: dict[str, _Outage] = {}  # error kind -> outage, while failing
        self._cleared: set[str] = set()  # kinds this cycle got past the step of without failing
        # patches to different nodes are independent; a few in flight hide API server latency
        self._writers = ThreadPoolExecutor(write_concurrency, thread_name_prefix="patch") \
            if write_concurrency > 1 else None

    # ---- one cycle ----

    def run_cycle(self, at: float | None = None) -> CycleResult:
        """One full cycle evaluated at unix time ``at`` (default: now). Never raises."""
        t0 = time.monotonic()
        self.cycle_started = t0
        res = CycleResult()
        requests_before = self.reader.client.requests_sent
        queries_before = self.reader.queries_sent
        self._cleared = set()
        # A cycle allocates millions of short-lived, acyclic objects (parsed answers, points);
        # the generational collector's passes over them cost about a fifth of the cycle's CPU.
        # Reference counting frees them anyway; the few cycles made meanwhile go at the end.
        collect = gc.isenabled()
        gc.disable()
        try:
            self._cycle(self.clock() - self.latency_offset_s if at is None else at, res)
            self._cleared.add(INTERNAL)
        except Exception as exc:  # noqa: BLE001 - a bug must not end the loop; logged with its traceback
            self._fail(res, INTERNAL, f"profiler cycle failed unexpectedly: {exc}", exc_info=True)
        finally:
            if collect:
                gc.enable()
                gc.collect(0)  # the young generation only: a full pass would rescan the whole heap
        self._end_outages(res)
        res.duration_s = time.monotonic() - t0
        res.queries = self.reader.queries_sent - queries_before
        m = self.metrics
        m.duration.observe(res.duration_s)
        m.queries.inc(res.queries)
        m.requests.inc(self.reader.client.requests_sent - requests_before)
        m.cycles.labels("ok" if res.ok else "failed").inc()
        if res.ok:
            m.last_success.set(self.clock())
        self.cycle_started = None
        self.last_cycle_end = time.monotonic()
        self.cycles_done += 1
        res.largest_response_bytes = self.reader.client.largest_response_bytes
        log.info("cycle: %.2fs (read %.2fs, classify %.2fs, write %.2fs), %d queries in %d shards, largest answer "
                 "%d bytes, peak RSS %s, %d nodes, %d patches%s, %d unchanged, %d condition writes, errors: %s",
                 res.duration_s, res.read_s, res.classify_s, res.write_s, res.queries, res.shards,
                 res.largest_response_bytes, _peak_rss(), res.nodes_seen, res.patches,
                 " (dry run)" if self.dry_run else "", res.unchanged, res.status_writes, ",".join(res.errors) or "none")
        return res

    def _fail(self, res: CycleResult, kind: str, message: str, exc_info: bool = False) -> None:
        """Count an error of ``kind``; log it at ERROR only when it starts an outage of that kind."""
        res.ok = False
        res.errors.append(kind)
        message = printable(message, 1000)  # server texts end up in here: one line, bounded
        self.metrics.errors.labels(kind).inc()  # every error, whatever is logged
        outage = self._outages.get(kind)
        if outage is None:
            outage = self._outages[kind] = _Outage(time.monotonic())
            log.error("%s [%s; repeats are logged at debug until it clears]", message, kind, exc_info=exc_info)
        else:
            log.debug("%s [%s, still failing]", message, kind, exc_info=exc_info)
        if outage.counted_in != self.cycles_done:
            outage.counted_in = self.cycles_done
            outage.cycles += 1

    def _end_outages(self, res: CycleResult) -> None:
        """One INFO line for each outage this cycle got past without its error."""
        for kind in sorted(self._outages):
            if kind in self._cleared and kind not in res.errors:
                outage = self._outages.pop(kind)
                log.info("%s cleared after %d failed cycle%s (%.0fs)", kind, outage.cycles,
                         "" if outage.cycles == 1 else "s", time.monotonic() - outage.started)

    def _cycle(self, at: float, res: CycleResult) -> None:
        t0 = time.monotonic()
        self._at = at
        inputs: dict[str, dict[str, GpuInput]] = {}
        counts: dict[str, int] = {}
        seen: set[str] = set()
        observed: dict[str, health.Observed] = {}
        view = Failed() if self.taints is not None else None
        classify_s = 0.0
        critical = self._xid_rules

        def consume(gpus: Mapping[tuple[str, str], GpuStats]) -> None:
            # one shard at a time: only the compact profiles outlive it
            nonlocal classify_s
            c0 = time.monotonic()
            if self.health:
                # a node's GPUs all come in one shard: its condition is decided here, kept compact
                per_node: dict[str, dict[str, GpuStats]] = {}
                for (node, gpu), st in gpus.items():
                    per_node.setdefault(node, {})[gpu] = st
                for node, node_gpus in per_node.items():
                    obs = observed[node] = health.observe(node_gpus, critical)
                    if view is not None:
                        view.add_node(node, node_gpus, critical, obs.status == health.TRUE)
            for (node, gpu), st in gpus.items():
                seen.add(node)
                if not st.fresh:
                    continue  # gone: its keys are removed (or the node has no data)
                if not valid_gpu_id(gpu):
                    log.warning("node %s: gpu label %s cannot be part of an annotation key; skipped",
                                printable(node, 80), printable(repr(gpu), 40))
                    continue
                prof = classify_gpu(st, self.plan.thresholds)
                uuid = st.uuid
                if uuid and not valid_uuid(uuid):  # 64 KiB with newlines and escapes reached a Node once
                    self.metrics.rejected.labels("uuid").inc()
                    log.debug("node %s gpu %s: uuid %s is not a UUID; not written", printable(node, 80),
                              gpu, printable(repr(uuid), 80))
                    uuid = ""
                bad_holders = clean_holders(prof.holder)[1]
                if bad_holders:
                    self.metrics.rejected.labels("holder").inc(bad_holders)
                inputs.setdefault(node, {})[gpu] = GpuInput(uuid, prof)
                counts[prof.pattern] = counts.get(prof.pattern, 0) + 1
            classify_s += time.monotonic() - c0

        try:
            snap = self.reader.read_shards(at, consume)
        except PromError as exc:
            self._fail(res, exc.kind, f"reading Prometheus failed, nothing written this cycle: {exc}")
            return
        finally:
            res.classify_s = classify_s
            res.read_s = time.monotonic() - t0 - classify_s
        res.shards = snap.shards
        self._cleared.update(prom.KINDS, (queries.EMPTY,))
        self.metrics.gpus.clear()
        for pattern, n in counts.items():
            self.metrics.gpus.labels(pattern).set(n)

        t0 = time.monotonic()
        try:
            nodes = self._nodes(seen, res)
            self._apply(nodes, inputs, res, observed)
            if self.taints is not None and view is not None and nodes is not None:
                self.taints.sync(view)  # after the conditions: the rules follow what they say
        finally:
            res.write_s = time.monotonic() - t0

    def _apply(self, nodes: dict[str, NodeInfo] | None, inputs: dict[str, dict[str, GpuInput]],
               res: CycleResult, observed: dict[str, health.Observed] | None = None) -> None:
        if nodes is None:
            return
        try:
            self._write_all(nodes, inputs, res, observed or {})
        finally:
            if self.events is not None and not self.dry_run:
                self.events.end_cycle()  # one summary Event when any was over its node's budget
        self._cleared.update(annotate.KINDS)  # every node planned and written (or its error counted)

    def _write_all(self, nodes: dict[str, NodeInfo], inputs: dict[str, dict[str, GpuInput]],
                   res: CycleResult, observed: dict[str, health.Observed] | None = None) -> None:
        observed = observed or {}
        gone = health.Observed(health.UNKNOWN, health.NOT_SCRAPED, "no sample from the node's GPU exporter in the "
                                                                   "window")

        unknown_nodes = sorted(set(inputs) - set(nodes))
        if unknown_nodes:
            log.debug("%d nodes report GPUs but are not in the cluster (or not selected): %s",
                      len(unknown_nodes), ", ".join(unknown_nodes[:5]))
        targets = []
        for name in sorted(nodes):
            info = nodes[name]
            gpus = inputs.get(name, {})
            obs = observed.get(name)
            if obs is None and self.health and info.condition is not None:
                obs = gone  # the node had the condition and Prometheus has nothing of it now
            if gpus or obs is not None or has_our_keys(info.annotations, self.plan.prefix):
                targets.append((info, gpus, obs))  # else: no GPU data and nothing of ours, not a GPU node
        res.nodes_seen = len(targets)
        forbidden = threading.Event()

        def one(target: tuple[NodeInfo, dict[str, GpuInput], health.Observed | None], plan: _NodePlan | None = None
                ) -> tuple[str, dict[str, str] | None, str, str, bool]:
            info, gpus, obs = target
            if forbidden.is_set():
                return info.name, None, "skipped", "", False
            try:
                final, outcome, wrote = self._write(info, gpus, obs, plan)
                return info.name, final, outcome, "", wrote
            except KubeError as exc:
                if exc.kind == annotate.KUBE_FORBIDDEN:
                    forbidden.set()  # every other node would fail the same way: stop writing
                return info.name, None, exc.kind, f"node {info.name}: {exc}", False  # logged in this thread

        # dry run: in order, so the printed patches come out sorted by node
        if self.dry_run or self._writers is None:
            results: Iterable[tuple[str, dict[str, str] | None, str, str, bool]] = map(one, targets)
        else:
            # A node that already carries what this cycle found is decided here: handing it to a patch
            # thread cost more than planning it (a no-change cycle at 10,000 nodes spent seconds on
            # 10,000 hand-offs and the threads' GIL contention). Only nodes with a write go there.
            # The plan made here is the one a patch thread starts from (not made twice).
            decided, to_write, plans = [], [], []
            for target in targets:
                plan = self._plan(*target)
                write_cond, desired, patch = plan
                if patch or write_cond:
                    to_write.append(target)
                    plans.append(plan)
                else:
                    decided.append((target[0].name, desired, "unchanged", "", False))
            results = itertools.chain(decided, self._writers.map(one, to_write, plans))
        patterns: dict[tuple[str, str], str] = {}
        prefix = self.plan.prefix + "/gpu-"
        for name, final, outcome, message, wrote in results:
            res.status_writes += wrote
            if outcome == "patched":
                res.patches += 1
            elif outcome == "unchanged":
                res.unchanged += 1
            elif outcome in annotate.KINDS:
                self._fail(res, outcome, message)
            if final is None:
                if outcome != "gone":
                    self._keep_patterns(name, patterns)  # not written: the node still carries the old ones
                continue
            for key, value in final.items():
                if key.startswith(prefix) and key.endswith(".pattern"):
                    patterns[(name, key[len(prefix):-len(".pattern")])] = value
        res.patterns = patterns
        self.metrics.pattern_collector.patterns = patterns

    def _keep_patterns(self, node: str, patterns: dict[tuple[str, str], str]) -> None:
        for (n, g), p in self.metrics.pattern_collector.patterns.items():
            if n == node:
                patterns[(n, g)] = p

    def _nodes(self, seen: set[str], res: CycleResult) -> dict[str, NodeInfo] | None:
        if self.store is None:
            # dry run without a cluster: every node seen in Prometheus, as we last left it
            names = seen | set(self._overlay) | set(self._cond_overlay)
            return {n: NodeInfo(n, dict(self._overlay.get(n, {})), "", self._cond_overlay.get(n)) for n in names}
        try:
            nodes = self.store.list_nodes()
        except KubeError as exc:
            self._fail(res, exc.kind, f"listing nodes failed, nothing written this cycle: {exc}")
            return None
        if self.dry_run:
            for name, ann in self._overlay.items():
                if name in nodes:
                    nodes[name].annotations = dict(ann)
            for name, cond in self._cond_overlay.items():
                if name in nodes:
                    nodes[name].condition = cond
        return nodes

    def _plan(self, info: NodeInfo, gpus: dict[str, GpuInput], obs: health.Observed | None) -> _NodePlan:
        """(write the GPUHealthy condition, our annotations as the node should carry them, the merge
        patch that gets them there: empty when it carries them) for the node as ``info`` has it."""
        write_cond, extra = self._plan_condition(info, obs)
        desired = plan_node(info.annotations, gpus, self.plan, extra)
        return write_cond, desired, diff(info.annotations, desired, self.plan.prefix)

    def _write(self, info: NodeInfo, gpus: dict[str, GpuInput], obs: health.Observed | None = None,
               plan: _NodePlan | None = None) -> tuple[dict[str, str] | None, str, bool]:
        """Plan and patch one node: (our annotations as the node now carries them, outcome,
        whether its GPUHealthy condition was written).

        Outcome: ``unchanged``, ``patched`` (dry run: printed) or ``gone`` (deleted meanwhile).
        A 409 re-reads the node and plans again, up to CONFLICT_RETRIES times. The condition
        (``obs``: what this cycle saw, None: no condition) goes after the annotations, which
        carry its pending candidate. ``plan``: :meth:`_plan` of ``info``, when the caller made it already.
        """
        for _ in range(CONFLICT_RETRIES + 1):
            write_cond, desired, patch = plan if plan is not None else self._plan(info, gpus, obs)
            plan = None  # after a 409 the node is read again, and planned again
            if not patch:
                return desired, "unchanged", self._set_condition(info, obs, write_cond)
            if self.dry_run:
                doc = {"node": info.name, "patch": {"metadata": {"annotations": patch}}}
                self.out.write(json.dumps(doc, sort_keys=True) + "\n")
                self.out.flush()
                merged = {k: v for k, v in {**info.annotations, **patch}.items() if v is not None}
                self._overlay[info.name] = merged
                return desired, "patched", self._set_condition(info, obs, write_cond)
            assert self.store is not None
            if self.elector is not None and not self.elector.is_leader():
                # fenced: another replica may lead by now, and its patches are the ones to keep
                return None, "not_leader", False
            try:
                self.store.patch_annotations(info.name, patch, info.resource_version)
                self.metrics.patched.inc()
                self._record_events(info, patch)
                return desired, "patched", self._set_condition(info, obs, write_cond)
            except NodeGone:
                log.info("node %s was deleted; skipped", info.name)
                return None, "gone", False
            except Conflict:
                log.info("node %s changed while we planned it (409); reading it again", info.name)
                fresh = self.store.get_node(info.name)
                if fresh is None:
                    return None, "gone", False
                info = fresh
        raise KubeError(annotate.KUBE_CONFLICT, f"node {info.name} still conflicting after {CONFLICT_RETRIES} retries")

    def _plan_condition(self, info: NodeInfo, obs: health.Observed | None
                        ) -> tuple[bool, dict[str, tuple[str, int]] | None]:
        """(write the observed condition now, the pending entry to keep in the annotations)."""
        if obs is None:
            return False, None
        p = self.plan.prefix
        pending = None
        if PENDING in owned_names(info.annotations, p):
            pending = parse_pending(info.annotations.get(f"{p}/{PENDING}")).get(health.PENDING_NAME)
        published = health.published_value(info.condition)
        write, keep = health.decide(published, obs.value, pending, self.plan.hysteresis)
        if not write and published == obs.value and not health.same(info.condition, obs):
            write = True  # the same cause on other GPUs: the message changes, the transition time stays
        return write, {health.PENDING_NAME: keep} if keep else None

    def _set_condition(self, info: NodeInfo, obs: health.Observed | None, write: bool) -> bool:
        """Write the GPUHealthy condition (leader only) and, on a transition, record an Event.

        A 409 reads the node again and retries once (as the annotations do); a second one raises
        :class:`KubeError` ``kube_conflict`` for this node alone."""
        if obs is None or not write:
            return False
        # the evaluation time (now, or --at when a past window is replayed)
        now = datetime.fromtimestamp(self._at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = health.condition(obs, info.condition, now)
        if self.dry_run:
            doc = {"node": info.name, "patch": {"status": {"conditions": [cond]}}}
            self.out.write(json.dumps(doc, sort_keys=True) + "\n")
            self.out.flush()
            self._cond_overlay[info.name] = cond
            return True
        assert self.store is not None
        if self.elector is not None and not self.elector.is_leader():
            return False
        try:
            self.store.patch_condition(info.name, cond)
        except NodeGone:
            return False
        except Conflict:
            # as for the annotations: read the node again, plan the condition on what it carries
            # now, and try once more; a second 409 is this node's kube_conflict, counted by the caller
            log.info("node %s status changed while we wrote GPUHealthy (409); reading it again", info.name)
            fresh = self.store.get_node(info.name)
            if fresh is None:
                return False
            info = fresh
            if not self._plan_condition(info, obs)[0]:
                return False  # what the node carries now needs no write
            cond = health.condition(obs, info.condition, now)
            try:
                self.store.patch_condition(info.name, cond)
            except NodeGone:
                return False
            except Conflict:
                raise KubeError(annotate.KUBE_CONFLICT, f"node {info.name} status: still conflicting after a "
                                                        "retry (409)") from None
        previous = health.published_value(info.condition)
        if self.events is not None and previous is not None and previous != obs.value:
            # a transition; the first setting needs none (the condition's lastTransitionTime says it)
            self.events.record_condition(info.name, obs.status, obs.reason,
                                         f"{health.CONDITION} {obs.status} ({obs.reason}): {obs.message}")
        return True

    def _record_events(self, info: NodeInfo, patch: Mapping[str, str | None]) -> None:
        """An Event for each GPU whose published pattern this patch turned growing or allocated-idle.

        Never for a GPU's first pattern (issue 35: no Event for a first setting; the annotation
        records it): at a fleet's first cycle those were most of the cycle's writes."""
        if self.events is None:
            return
        p = self.plan.prefix + "/gpu-"
        for key, value in patch.items():
            if not (key.startswith(p) and key.endswith(".pattern")) or value not in (GROWING, ALLOCATED_IDLE):
                continue
            if info.annotations.get(key) in (None, value):
                continue  # a first setting, or no change
            gpu = key[len(p):-len(".pattern")]
            detail = patch.get(f"{p}{gpu}.holder") or patch.get(f"{p}{gpu}.memory-growth-bytes-per-second")
            what = ("held by " + str(detail) if value == ALLOCATED_IDLE else f"memory used rising {detail} B/s") \
                if detail else value
            self.events.record(info.name, gpu, value, f"GPU {gpu} is {value}: {what} "
                                                       f"(window {self.reader.cfg.window_s / 60:g} min)")

    # ---- loop ----

    @property
    def standby(self) -> bool:
        """A replica waiting for the lease: it reads and writes nothing."""
        return self.elector is not None and not self.elector.leading.is_set()

    def loop(self, interval_s: float, stop: threading.Event) -> None:
        """Run cycles every ``interval_s`` (start to start) until ``stop`` is set; with leader
        election, only while this replica leads (a cycle starts as soon as it takes over)."""
        while not stop.is_set():
            if self.elector is not None and not self.elector.leading.is_set():
                self.last_cycle_end = time.monotonic()  # standing by is not being stuck
                self.elector.leading.wait(0.2)
                continue
            started = time.monotonic()
            self.run_cycle()
            deadline = started + interval_s
            while not stop.is_set() and time.monotonic() < deadline:
                if self.elector is not None and not self.elector.leading.is_set():
                    break
                stop.wait(min(0.2, max(0.0, deadline - time.monotonic())))


class Health:
    """Liveness of a loop thread driving a :class:`Profiler`."""

    def __init__(self, profiler: Profiler, interval_s: float, stall_after_s: float,
                 thread: threading.Thread | None = None) -> None:
        self.profiler = profiler
        self.interval_s = interval_s
        self.stall_after_s = stall_after_s
        self.thread = thread

    def check(self) -> tuple[bool, str]:
        now = time.monotonic()
        if self.thread is not None and not self.thread.is_alive():
            return False, "profiler loop is not running"
        started = self.profiler.cycle_started
        if started is not None and now - started > self.stall_after_s:
            return False, f"cycle running for {now - started:.0f}s (limit {self.stall_after_s:.0f}s)"
        idle = now - self.profiler.last_cycle_end
        if started is None and idle > self.interval_s + self.stall_after_s:
            return False, f"no cycle for {idle:.0f}s"
        if self.profiler.standby and self.profiler.elector is not None:
            return True, f"ok: standing by, {printable(self.profiler.elector.holder or 'nobody', 100)} leads"
        return True, f"ok: {self.profiler.cycles_done} cycles"


_LANDING = b"""<html><head><title>gpu-exporter profiler</title></head><body>
<h1>gpu-exporter profiler</h1><p><a href="/metrics">/metrics</a> <a href="/healthz">/healthz</a></p>
</body></html>
"""


SERVER_READ_TIMEOUT_S = 5.0  # a request (or taking an answer) on the profiler's own endpoint
SERVER_REQUEST_DEADLINE_S = 10.0  # at most this, whatever the read timeout
SERVER_MAX_CONNECTIONS = 32  # /metrics answered at once; /healthz never takes a slot
EXPOSITION_TTL_S = 0.5  # /metrics bytes are shared for this long (the figures change once per cycle)


def make_server(address: str, port: int, metrics: ProfilerMetrics, health: Health,
                read_timeout_s: float = SERVER_READ_TIMEOUT_S, deadline_s: float = SERVER_REQUEST_DEADLINE_S,
                max_connections: int = SERVER_MAX_CONNECTIONS, web: WebConfig | None = None,
                probe_port: int | None = None) -> HTTPServer:
    """The profiler's HTTP server (not started): ``/metrics``, ``/healthz``, ``/``.

    The exporter's server (exporter/platform/http/), so the same fairness, limits, TLS and basic
    auth (``--web.config.file``): a request, or taking its answer, ends after
    ``min(read_timeout_s, deadline_s)``; ``/healthz`` is answered on the I/O thread, never behind a
    scrape, and is open under basic auth (saying only ok / not ok to an anonymous probe).
    """
    srv = HTTPServer((address, port), max_connections=max_connections,
                     read_timeout=min(read_timeout_s, deadline_s), web=web, probe_paths=frozenset({"/healthz"}),
                     probe_port=probe_port)

    # (openmetrics, gzip) -> (when rendered, bytes): each format and encoding rendered at most once per
    # EXPOSITION_TTL_S and shared, so a flood of scrapes costs what one does
    cache: dict[tuple[bool, bool], tuple[float, bytes]] = {}
    cache_lock = threading.Lock()

    def negotiated(h: Handler) -> tuple[bool, bool]:
        return wants_openmetrics(h.headers.get("Accept", "")), wants_gzip(h.headers.get("Accept-Encoding", ""))

    def metrics_route(h: Handler, path: str, query: str) -> Response:
        key = negotiated(h)
        with cache_lock:
            now = time.monotonic()
            last = cache.get(key)
            if last is None or now - last[0] >= EXPOSITION_TTL_S:
                last = cache[key] = (now, encode(metrics.exposition(openmetrics=key[0]), gz=key[1]))
        return Response(200, last[1], *answer_headers(*key))

    def metrics_fast(h: Handler, path: str, query: str) -> Response | None:
        key = negotiated(h)
        last = cache.get(key)  # the I/O thread: bytes already rendered, no lock, no work
        if last is None or time.monotonic() - last[0] >= EXPOSITION_TTL_S:
            return None
        return Response(200, last[1], *answer_headers(*key))

    def healthz(h: Handler, path: str, query: str) -> Response:
        ok, why = health.check()
        if not h.authorized:  # an anonymous probe under basic auth learns up or down, nothing else
            why = "ok" if ok else "not ok"
        return Response(200 if ok else 503, (why + "\n").encode())

    def landing(h: Handler, path: str, query: str) -> Response:
        return Response(200, _LANDING, "text/html; charset=utf-8")

    srv.route("/metrics", metrics_route, fast=metrics_fast)
    srv.route("/healthz", healthz, "inline")  # reads a few fields: on the I/O thread, never behind a scrape
    srv.route("/", landing, "inline")
    return srv
