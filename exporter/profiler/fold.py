"""Answers to GPU statistics: the folding of one shard's samples, a pure function (no I/O).

:func:`fold_shard` turns a shard's three aggregate answers (utilisation, memory,
allocation: promql.py) into one :class:`GpuStats` per GPU, and says which GPUs' raw series
the classification may need (their range queries); :func:`attach_range` puts a range
answer's points on their GPUs, :func:`attach_counts` the memory counts asked for with them.
Values are scaled to SI and labels mapped to (node, gpu, uuid) here, after the answers
arrive, so the classification never sees which exporter spoke.

Each GPU's range step is its own scrape interval (:func:`gpu_step`), never one shared by its
shard: a GPU's pattern must not depend on which GPUs share its shard, that is on the fleet's
size. Several series of one GPU (scraped by more than one job, or named by several labels)
fold into the larger value.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exporter.profiler import sources
from exporter.profiler.classify import GpuStats, finite
from exporter.profiler.prom import BAD_RESPONSE, PromError, RangeSeries, Sample
from exporter.profiler.promql import HEALTH_STATS, QueryConfig, selectable
from exporter.profiler.sources import Source

_HEALTH_KEYS = tuple(("mem_" + name, name) for name in HEALTH_STATS)  # as the memory query's stats arrive

Key = Callable[[dict[str, str]], "tuple[str, str, str] | None"]


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


def gpu_step(cfg: QueryConfig, v: dict[str, float]) -> float:
    """This GPU's utilisation range step: ``--step``, else its own scrape interval.

    From its own samples, never from other GPUs' (a shard's median made the step, and so
    the patterns, depend on which GPUs shared the shard, that is on the fleet's size): see
    :func:`scrape_interval`. The whole window's count gives it, or the denser half's when
    the halves differ by more than a tenth (a GPU that appeared or paused mid-window).
    """
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


def wants_util_range(cfg: QueryConfig, st: GpuStats) -> bool:
    """Could the classifier need this GPU's range? (a margin below its thresholds)"""
    th = cfg.thresholds
    mean, std, p95 = finite(st.util_mean), finite(st.util_std), finite(st.util_p95)
    if mean is None or std is None:
        return False
    busy = mean >= 0.8 * th.idle_util_mean or (p95 is not None and p95 >= 0.8 * th.idle_util_p95)
    return busy and std > 0.8 * th.steady_cv * mean


def wants_mem_range(cfg: QueryConfig, st: GpuStats, deriv: float | None) -> bool:
    """Could memory be growing? ``deriv`` (bytes/s) over the window, half the threshold."""
    d, total = finite(deriv), finite(st.mem_total)
    if d is None or total is None:
        return False
    return d * cfg.window_s > 0.5 * cfg.thresholds.growth_min_fraction * total


def ours_key(node_label: str) -> Key:
    """(node, gpu, uuid) of one of our series, or None without a node or a GPU index."""

    def key(labels: dict[str, str]) -> tuple[str, str, str] | None:
        node = labels.get(node_label, "")
        gpu = labels.get("gpu", "")
        if not node or not gpu:
            return None
        return node, gpu, labels.get("uuid", "")

    return key


Answers = list[tuple[str | None, list[Sample]]]  # (the statistic asked for, or None: in each series' stat label)


@dataclass
class ShardFold:
    """One shard's GPUs and what is left to ask for them.

    ``want_util``: UUIDs whose utilisation range the classification may need, by (step, the
    label that selects them); ``want_mem``: the same for the memory range, by label;
    ``by_uuid``: the GPU of each UUID seen on one GPU only (range series without a node
    label are matched by it); ``shared_uuids``: UUIDs seen on more than one node.
    """

    gpus: dict[tuple[str, str], GpuStats] = field(default_factory=dict)
    dropped: int = 0  # series without a node or a GPU label
    steps: Counter[float] = field(default_factory=Counter)  # utilisation steps of the fresh GPUs
    want_util: dict[tuple[float, str], list[str]] = field(default_factory=dict)
    want_mem: dict[str, list[str]] = field(default_factory=dict)
    by_uuid: dict[str, tuple[str, str]] = field(default_factory=dict)
    shared_uuids: list[str] = field(default_factory=list)


def fold_shard(cfg: QueryConfig, source: Source, nodes: Iterable[str], util: Answers, mem: Answers,
               alloc: list[Sample], mem_step: float) -> ShardFold:
    """GPUs of ``nodes`` from a shard's aggregate answers (see the module docstring): ``util`` and
    ``mem`` are (statistic, its answer) pairs, the statistic None for an answer whose series carry
    their own ``stat`` label (a union of parts, or a statistic named after a label).

    Series of nodes outside ``nodes`` are ignored (named by a label of higher rank than the
    one that selected them, or matched by a shard's pattern without being in it). Raises
    PromError (bad response) for an aggregate series without its ``stat`` label.
    """
    ours = source.name == sources.OURS
    key_of = ours_key(cfg.node_label) if ours else source.key
    in_shard = set(nodes)
    out = ShardFold()
    stats: dict[tuple[str, str, str], dict[str, float]] = {}
    uuid_labels: dict[str, str] = {}
    nl = cfg.node_label
    # the memory answer's stats named after a label (xid_<code>, state_<state>|<cause>, pci_<bus id>):
    # noted as each first arrives, so that a GPU's health fields need no scan of all its stats
    labelled: set[str] = set()
    for prefix, answers in (("util_", util), ("mem_", mem)):
        names: dict[str, str] = {}  # stat -> prefixed name, made once per answer, not per series
        for answer_stat, samples in answers:
            for s in samples:
                labels = s.labels
                if ours:  # the key inlined: the loop runs for every series of every shard
                    node, gpu = labels.get(nl, ""), labels.get("gpu", "")
                    k = (node, gpu, labels.get("uuid", "")) if node and gpu else None
                else:
                    k = key_of(labels)
                stat = answer_stat if answer_stat is not None else labels.get("stat")
                if stat is None:
                    raise PromError(BAD_RESPONSE, "aggregate series without its 'stat' label")
                if k is None:
                    out.dropped += 1
                    continue
                if k[0] not in in_shard:
                    continue
                v = stats.get(k)
                if v is None:
                    v = stats[k] = {}
                name = names.get(stat)
                if name is None:
                    name = names[stat] = prefix + stat
                    if _labelled(name):
                        labelled.add(name)
                old = v.get(name)
                # one GPU scraped by several jobs (or named by several labels): the larger value
                v[name] = s.value if old is None or not s.value <= old else old
                if k[2] and k[2] not in uuid_labels:
                    uuid_labels[k[2]] = "uuid" if ours else source.uuid_label(labels)
    holders: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in alloc:
        k = key_of(s.labels)
        ns = s.labels.get("exported_namespace") or s.labels.get("namespace", "")
        pod = s.labels.get("exported_pod") or s.labels.get("pod", "")
        if k is not None and ns and pod and math.isfinite(s.value):
            held = holders.setdefault(k, {})
            held[f"{ns}/{pod}"] = max(s.value, held.get(f"{ns}/{pod}", 0.0))

    us, ms = source.util_scale, source.mem_scale
    gpus = out.gpus
    raw: dict[tuple[str, str], dict[str, float]] = {}
    for (node, gpu, uuid), v in stats.items():
        fresh = (v.get("util_fresh", 0.0) > 0 or v.get("mem_fresh", 0.0) > 0
                 or math.isfinite(v.get("mem_up", math.nan)))
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
            util_step=gpu_step(cfg, v), mem_step=mem_step,
            sm_mean=v.get("util_sm_mean"), sm_count=v.get("util_sm_count"),
            xid_rise=v.get("mem_score_xid"), ecc_rise=v.get("mem_score_ecc"),
            throttle_ratio=v.get("mem_score_throttle"),
        )  # fmt: skip
        if cfg.health:
            # only the fields a GPU has (none, on most fleets): health.py skips a GPU without any
            fields = {name: v[key] for key, name in _HEALTH_KEYS if key in v}
            if labelled:
                fields.update((key[4:], v[key]) for key in labelled if key in v)
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
    for key, st in gpus.items():
        label = uuid_labels.get(st.uuid, "")
        if not st.fresh:
            continue
        out.steps[st.util_step] += 1
        if not label or not selectable(st.uuid):
            continue
        if seen[st.uuid] == 1:
            out.by_uuid[st.uuid] = key
        if wants_util_range(cfg, st):
            out.want_util.setdefault((st.util_step, label), []).append(st.uuid)
        if wants_mem_range(cfg, st, _scaled(raw[key].get("mem_deriv"), ms)):
            out.want_mem.setdefault(label, []).append(st.uuid)
    out.shared_uuids = sorted(u for u, c in seen.items() if c > 1 and u)
    return out


def attach_range(gpus: dict[tuple[str, str], GpuStats], by_uuid: dict[str, tuple[str, str]],
                 series: list[RangeSeries], key_of: Key, *, attr: str, label: str, start: float, step: float,
                 end: float, scale: float, believed: Callable[[dict[str, str]], bool] = lambda _: True) -> None:
    """Put range points on their GPU (``attr``: util_range or mem_range), scaled to SI.

    A point goes to the slot of the grid ``start + i·step`` nearest its time; several series
    of one GPU (pods, jobs) fold by max. A series is matched by its node label, else by a
    UUID seen on one GPU only (``by_uuid``), and kept only when the UUID is that GPU's and
    ``believed`` (``Source.believed``: any pod can publish a series that copies a busy GPU's
    UUID and node name, and its points would flatten that GPU's cycle or fake a leak).
    """
    n = math.floor((end - start) / step + 1e-9)
    for rs in series:
        if not believed(rs.labels):
            continue
        st = _gpu_of(gpus, by_uuid, rs.labels, key_of, label)
        if st is None:
            continue
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


def attach_counts(gpus: dict[tuple[str, str], GpuStats], by_uuid: dict[str, tuple[str, str]],
                  samples: list[Sample], key_of: Key, *, label: str) -> None:
    """Put memory-used's sample counts (``stat`` count and early: promql's ``mem_counts``) on
    their GPU, matched as :func:`attach_range` matches a series; several series fold by max."""
    for s in samples:
        attr = _COUNT_ATTRS.get(s.labels.get("stat", ""))
        if attr is None:
            raise PromError(BAD_RESPONSE, "memory count series without its 'stat' label")
        st = _gpu_of(gpus, by_uuid, s.labels, key_of, label)
        if st is None or not math.isfinite(s.value):
            continue
        old = getattr(st, attr)
        setattr(st, attr, s.value if old is None or s.value > old else old)


_COUNT_ATTRS = {"count": "mem_count", "early": "mem_early"}


def _gpu_of(gpus: dict[tuple[str, str], GpuStats], by_uuid: dict[str, tuple[str, str]], labels: dict[str, str],
            key_of: Key, label: str) -> GpuStats | None:
    """The GPU a series selected by UUID belongs to: by its node label, else by a UUID seen on one
    GPU only, and only when the UUID is that GPU's (None otherwise)."""
    k = key_of(labels)
    uuid = labels.get(label, "")
    key = (k[0], k[1]) if k is not None else by_uuid.get(uuid)
    st = gpus.get(key) if key is not None else None
    return st if st is not None and st.uuid == uuid else None


def _labelled(name: str) -> bool:
    """A memory stat named after a label's value: ``mem_xid_<code>``, ``mem_state_...``, ``mem_pci_...``."""
    return (name.startswith("mem_xid_") and name[8:].isdigit()) or name.startswith(("mem_state_", "mem_pci_"))


def _scaled(x: float | None, scale: float) -> float | None:
    return None if x is None else x * scale
