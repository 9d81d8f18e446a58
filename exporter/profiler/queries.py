"""The profiler's reads: the cycle's queries sent to Prometheus, shard by shard (the I/O side).

The query text is promql.py's (pure), the folding of answers into per-GPU statistics
fold.py's (pure); this module sends them and keeps a cycle's memory and time bounded.

Queries per cycle, for N nodes of G GPUs each, S shards (ceil(N·G / shard_gpus), one more
where a shard's pattern would be too long: promql.plan_shards): ``3 + S·A + R`` where A, a
shard's aggregate queries, is one per statistic of a metric the store holds (promql.Part,
QueryBuilder.has: 11 for ours with utilisation, memory and gpu_up only, up to 24 with the health
fields and everything published) plus ceil(L/4) for the L statistics named after a label and the
allocation's (PARTS_PER_QUERY), and R, the range batches and the memory counts of the memory
range's GPUs (promql's ``mem_counts``), is at most ``3·S`` while a shard's ranges fit one batch
(a cluster with few periodic, bursty or leaking GPUs has R near 0); more when a query would pass
``max_query_bytes`` (docs/profiler.md, "Bytes per query").

A store's refusal of a query over one of its limits (too long, too many series or samples:
prom.SPLIT_KINDS) is handled as an answer over the cap; each is counted in ``refusals``.

Every answer must fit ``--prometheus-max-response-bytes``: the shard and batch sizes keep
answers near a tenth of the default cap, and an answer refused as too large splits its
shard or batch in two and asks again (down to one node or one GPU). Each shard is folded
into compact per-GPU results before the next is read, so memory follows the shard, not
the fleet. Prometheus and this process work side by side: the next shard's aggregates are
asked for while a shard is parsed, and a shard is classified while the next one's range
queries run (at most one shard waits to be classified).

With ``source=auto`` the nodes query asks every source at once and a node published by
ours is read from ours.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

from exporter.profiler import sources
from exporter.profiler.classify import GpuStats
from exporter.profiler.fold import Answers, attach_counts, attach_range, fold_shard, ours_key, scrape_interval
from exporter.profiler.prom import (
    HTTP_5XX,
    PARTIAL,
    SPLIT_KINDS,
    TIMEOUT,
    UNREACHABLE,
    PromClient,
    PromError,
    RangeSeries,
    Sample,
    printable,
)
from exporter.profiler.promql import (
    UP,
    QueryBuilder,
    QueryConfig,
    duration,
    name_parts,
    plan_shards,
    query_bytes,
    selectable,
    shard_pattern,
    uuid_regex,
)

__all__ = ["EMPTY", "FleetReading", "QueryConfig", "Reader", "scrape_interval"]

log = logging.getLogger(__name__)

EMPTY = "prometheus_empty"  # error kind: every query answered, none had a GPU series
# Parts joined in one query where they name their series themselves (promql.Part with no stat: the
# statistics named after a label, the allocation's holders; a named statistic is a query of its own).
# Prometheus and VictoriaMetrics evaluate ``a or b`` by hashing every sample of both sides, at every
# level of the union's tree: 26 statistics in two queries cost them 20-30% more CPU than in queries
# of four, and an answer of four a shard's GPUs stays below the parse bound.
PARTS_PER_QUERY = 4

T = TypeVar("T")
_Asked = tuple[str, str | None, Future[list[Sample]]]  # (group, the statistic or None, its answer to come)

@dataclass
class FleetReading:
    """Everything one cycle read: per-GPU stats keyed by (node, gpu), and bookkeeping."""

    at: float
    gpus: dict[tuple[str, str], GpuStats]
    queries: int
    util_step: float
    mem_step: float
    shards: int = 1



class Reader:
    """Runs the cycle's queries against one :class:`PromClient` and assembles GpuStats."""

    def __init__(self, client: PromClient, cfg: QueryConfig) -> None:
        self.client = client
        self.cfg = cfg
        asked = (sources.OURS, sources.DCGM, sources.AMD) if cfg.source == sources.AUTO else (cfg.source,)
        names = tuple(n for a in asked for n in sources.expand(a))
        # one builder per source; ``builder`` is ours (or the one source asked for)
        self.builders = {n: QueryBuilder(cfg, sources.make(n, cfg.node_label, cfg.trust)) for n in names}
        self.builder = self.builders.get(sources.OURS) or self.builders[names[0]]
        self.queries_sent = 0  # logical queries, cumulative (HTTP retries not counted)
        # a shard's aggregates, the next shard's (prefetched) and 2 range batches share them: 6 answers at most
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="promql")
        self.last: FleetReading | None = None  # bookkeeping of the last read (gpus empty when streamed)
        self._idle: Callable[[], None] | None = None  # while a read runs: classify the shard read before
        self.picked: dict[str, int] = {}  # source -> nodes, as last discovered (logged when it changes)
        self.refusals: Counter[str] = Counter()  # kind -> refusals a smaller question avoided, cumulative
        self._names_failed = False  # the metric names query failed once (logged once)

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
        self._metric_names(at)
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
        if any(found[n] and not (b.has(UP if b.ours else b.source.util) or b.has(b.source.mem_used))
               for n, b in self.builders.items()):
            # the names answer lacks a metric whose series were just found: it is not this window's (a proxy's
            # cache, another tenant): every statistic is asked for
            self._no_names("the metric names answer lacks the metrics the GPUs were found by")
        taken: set[str] = set()
        for name in self.builders:  # ours first
            found[name] = {n: c for n, c in found[name].items() if n not in taken}
            taken.update(found[name])
        if not taken:
            self._unlabelled(at)
            looked = "; ".join(f"{b.presence()} ({name})" for name, b in self.builders.items())
            raise PromError(EMPTY, f"no GPU series in Prometheus for the last {duration(cfg.window_s)}: looked for "
                                   f"{looked}; check --prometheus-url, --source and the scrape config")
        picked = {n: len(v) for n, v in found.items() if v}
        if picked != self.picked:
            log.info("source %s: %s", cfg.source, ", ".join(f"{n} for {c} nodes" for n, c in picked.items()))
            self.picked = picked
        return found

    def _metric_names(self, at: float) -> None:
        """The metric names the store holds for the window (and the window before it, which the
        counters' rises read), for every builder to leave out the statistics of metrics nobody
        publishes (``QueryBuilder.has``): a fleet without XIDs, pod attribution or GPM costs nothing
        for them. A store that does not answer (an API without the endpoint, a malformed answer) only
        loses that: every statistic is asked for, as before. A store that is down, or whose answer is
        partial (a store behind Thanos or vmselect missing), fails the read here, as its queries would."""
        self.queries_sent += 1
        try:
            names: frozenset[str] | None = frozenset(
                self.client.label_values("__name__", at - 2 * self.cfg.window_s, at))
        except PromError as exc:
            if exc.kind in (UNREACHABLE, TIMEOUT, HTTP_5XX, PARTIAL):  # so would the cycle's queries: counted, no write
                raise
            self._no_names(str(exc))
            return
        for b in self.builders.values():
            b.present = names

    def _no_names(self, why: str) -> None:
        """Every statistic asked for this cycle: the store's metric names are not to be had (logged once)."""
        if not self._names_failed:
            log.info("the store's metric names are not available (%s): every statistic is asked for", why)
        self._names_failed = True
        for b in self.builders.values():
            b.present = None

    def _unlabelled(self, at: float) -> None:
        """No node found: if another exporter's series are there all the same, none carries a node
        label this profiler reads (or trusts): say which series and which labels were tried."""
        w = duration(self.cfg.window_s)
        for name, b in self.builders.items():
            s = b.source
            if b.ours:
                continue
            self.queries_sent += 1
            found = self.client.query(f"count by (__name__) (last_over_time({s.selector(s.util, '')}[{w}]))", at)
            metrics = sorted({x.labels.get("__name__", s.util) for x in found if x.value > 0})
            if metrics:
                tried = ", ".join(f"`{n}`" for n in s.node_labels)
                raise PromError(EMPTY, f"{'/'.join(metrics)} series ({name}) in Prometheus for the last {w}, but none "
                                       f"with a node label the profiler reads: tried {tried} (a target's own "
                                       "Hostname/hostname only from jobs --source-job trusts); relabel the node name "
                                       "into --node-label in the scrape config")

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
                if exc.kind not in SPLIT_KINDS or not subs:
                    raise
                self._refused(exc, f"the node list was refused: asking for it in {len(subs)} parts")
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
        fleets = {name: sorted(per_node) for name, per_node in found.items()}  # a shard's pattern selects
        # exactly its nodes among its source's (promql.shard_pattern), halves of a refused shard too
        done = 0
        prefetched: dict[tuple[str, tuple[str, ...]], list[_Asked]] = {}
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
                stats = prefetched.pop((name, tuple(nodes)), None) or self._stats(b, nodes, fleets[name], at)
                if todo and (todo[0][0], tuple(todo[0][1])) not in prefetched:
                    # Prometheus computes the next shard while this one is parsed and classified
                    nxt, nxt_nodes = todo[0]
                    prefetched[(nxt, tuple(nxt_nodes))] = self._stats(self.builders[nxt], nxt_nodes, fleets[nxt], at)
                try:
                    gpus, q, d, shard_steps = self._read_shard(b, nodes, shard_pattern(nodes, fleets[name]), at,
                                                               mem_step, stats)
                except PromError as exc:
                    if exc.kind not in SPLIT_KINDS or len(nodes) == 1:
                        for futures in prefetched.values():
                            _settle([f for _, _, f in futures])
                        flush()  # the shards before this one were classified, as without the overlap
                        raise
                    half = len(nodes) // 2
                    self._refused(exc, f"a query for {len(nodes)} nodes was refused: asking for {half} and "
                                       f"{len(nodes) - half}")
                    todo[:0] = [(name, nodes[:half]), (name, nodes[half:])]
                    queries += len(stats)
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

    def _stats(self, b: QueryBuilder, nodes: list[str], fleet: list[str], at: float) -> list[_Asked]:
        """The shard's aggregate queries (utilisation, memory, allocation), submitted to run side by
        side: a named statistic alone and bare (promql.Part), the others in queries of at most
        PARTS_PER_QUERY parts and ``max_query_bytes``."""
        exprs = b.shard_queries(shard_pattern(nodes, fleet), self.cfg.max_query_bytes, PARTS_PER_QUERY)
        self.queries_sent += len(exprs)
        return [(group, stat, self._pool.submit(self.client.query, expr, at)) for group, stat, expr in exprs]

    def _refused(self, exc: PromError, action: str) -> None:
        """Count a refusal (an answer over a cap, a query over one of the store's limits) that
        a smaller question avoids; logged once per kind, then at debug level."""
        self.refusals[exc.kind] += 1
        if self.refusals[exc.kind] == 1:
            log.warning("%s (the first %s; the next are counted in gpu_profiler_prometheus_refusals_total): %s",
                        action, exc.kind, exc)
        else:
            log.debug("%s: %s", action, exc)

    def _read_shard(self, b: QueryBuilder, nodes: list[str], pattern: str, at: float, mem_step: float,
                    futures: list[_Asked]) -> tuple[dict[tuple[str, str], GpuStats], int, int, Counter[float]]:
        """(GPUs of these nodes, queries sent, series dropped, utilisation steps used)."""
        cfg = self.cfg
        src = b.source
        key_of = ours_key(cfg.node_label) if b.ours else src.key
        answers = _settle([f for _, _, f in futures])
        groups: dict[str, Answers] = {"util": [], "mem": [], "alloc": []}
        for (group, stat, _), samples in zip(futures, answers, strict=True):
            groups[group].append((stat, samples))
        del answers
        util, mem = groups["util"], groups["mem"]
        alloc = [s for _, samples in groups["alloc"] for s in samples]
        del groups
        queries = len(futures)
        fold = fold_shard(cfg, src, nodes, util, mem, alloc, mem_step)
        del util, mem, alloc
        gpus = fold.gpus
        if fold.shared_uuids:
            log.warning("%d GPU UUIDs appear on more than one node (%s...): their range series are matched by "
                        "the node label only", len(fold.shared_uuids), printable(fold.shared_uuids[0], 80))

        start = at - cfg.window_s
        mem_start = start + mem_step / 2  # one point per half-open interval of the window
        us, ms = src.util_scale, src.mem_scale
        batches: list[_Batch] = []
        for (step, label), uuids in sorted(fold.want_util.items()):
            batches += [_Batch(u, "util_range", start, step, label, us)
                        for u in self._batches(uuids, b.util_range, label)]
        for label, uuids in sorted(fold.want_mem.items()):
            batches += [_Batch(u, "mem_range", mem_start, mem_step, label, ms)
                        for u in self._batches(uuids, b.mem_range, label)]
            # the growth test's sample counts, for the same GPUs: selected by the shard's pattern too, where
            # a bare node!="" would make the store scan every node's series
            counts = functools.partial(b.mem_counts, nodes=pattern)
            batches += [_Batch(u, "mem_counts", at, 0.0, label, 1.0) for u in self._batches(uuids, counts, label)]
        while batches:
            pair = batches[:2]
            del batches[:2]
            calls = [self._range_call(b, bt, at, pattern) for bt in pair]
            results = self._all(*calls, idle=self._idle)
            queries += len(pair)
            for bt, res in zip(pair, results, strict=True):
                if isinstance(res, PromError):
                    if res.kind not in SPLIT_KINDS or len(bt.uuids) == 1:
                        raise res
                    half = len(bt.uuids) // 2  # refused: ask for it in two halves
                    self._refused(res, f"a range query for {len(bt.uuids)} GPUs was refused: asking for {half} and "
                                       f"{len(bt.uuids) - half}")
                    batches[:0] = [replace(bt, uuids=bt.uuids[:half]), replace(bt, uuids=bt.uuids[half:])]
                    continue
                if bt.attr == "mem_counts":
                    attach_counts(gpus, fold.by_uuid, res, key_of, label=bt.label)  # type: ignore[arg-type]
                else:
                    attach_range(gpus, fold.by_uuid, res, key_of, attr=bt.attr,  # type: ignore[arg-type]
                                 label=bt.label, start=bt.start, step=bt.step, end=at, scale=bt.scale,
                                 believed=src.believed)
        return gpus, queries, fold.dropped, fold.steps

    def _batches(self, uuids: list[str], query: Callable[[list[str], str], str], label: str) -> list[list[str]]:
        """UUIDs in batches of at most ``range_gpus``, each ``query`` of them at most
        ``max_query_bytes`` (its UUID regex may appear in it more than once: one per branch)."""
        cfg = self.cfg
        overhead = query_bytes(query([], label))
        copies = query(["x"], label).count(uuid_regex(["x"]))
        out: list[list[str]] = []
        cur: list[str] = []
        size = overhead
        for u in uuids:
            n = copies * (query_bytes(uuid_regex([u])) - 1)  # the UUID quoted, and its "|"
            if cur and (len(cur) >= cfg.range_gpus or size + n > cfg.max_query_bytes):
                out.append(cur)
                cur, size = [], overhead
            cur.append(u)
            size += n
        if cur:
            out.append(cur)
        return out

    def _range_call(self, b: QueryBuilder, bt: _Batch, at: float, pattern: str
                    ) -> Callable[[], list[RangeSeries] | list[Sample] | PromError]:
        fn = b.util_range if bt.attr == "util_range" else b.mem_range

        def call() -> list[RangeSeries] | list[Sample] | PromError:
            try:
                if bt.attr == "mem_counts":
                    return self.client.query(b.mem_counts(bt.uuids, bt.label, nodes=pattern), at)
                return self.client.query_range(fn(bt.uuids, bt.label), bt.start, at, bt.step)
            except PromError as exc:
                if exc.kind in SPLIT_KINDS:
                    return exc  # the caller splits the batch
                raise

        return call

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


@dataclass(frozen=True)
class _Batch:
    """One range query's GPUs and how to read them."""

    uuids: list[str]
    attr: str  # util_range or mem_range (query_range), or mem_counts (instant, at ``start``)
    start: float
    step: float
    label: str  # the label selecting them (uuid, UUID, gpu_uuid, serial_number)
    scale: float  # to SI



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



