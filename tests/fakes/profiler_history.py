"""Seeded synthetic GPU history with known patterns, for the profiler's tests and benchmark.

Every series is a pure function of (seed, shape parameters), so a failing case can be
re-created from its ``name``. A :class:`GpuHistory` holds raw samples (one per scrape
interval); :func:`write_openmetrics` turns a list of them into exporter-shaped series
(``gpu_utilization_ratio``, ``gpu_memory_*_bytes``, ``gpu_up``, ``gpu_host_info``) for
``promtool tsdb create-blocks-from openmetrics``, and :func:`stats_from_history` computes
what the profiler's PromQL would return, for the pure (no Prometheus) tests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from exporter.profiler.classify import GpuStats

GIB = 1024**3
Shape = Callable[[random.Random, list[float]], list[float]]


@dataclass
class GpuHistory:
    """One GPU's raw samples. ``util``/``mem_used`` entries of None are missing scrapes."""

    node: str
    gpu: str
    uuid: str
    label: str  # the pattern a correct classifier must report
    name: str  # shape description, enough to regenerate it
    times: list[float]
    util: list[float | None]
    mem_used: list[float | None]
    mem_total: float
    period_s: float | None = None
    growth_bps: float | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)


def _clip(v: float) -> float:
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v


def sample_times(end: float, span_s: float, interval: float, offset: float = 0.0) -> list[float]:
    """Scrape timestamps every ``interval`` s covering ``span_s`` seconds up to ``end``."""
    n = int(span_s // interval)
    return [round(end - (n - i) * interval - offset, 3) for i in range(n + 1)]


# ---- utilisation shapes -------------------------------------------------------------------


def idle_shape(rng: random.Random, ts: list[float]) -> list[float]:
    blip = rng.uniform(0.0, 0.03)
    return [_clip(abs(rng.gauss(0, blip / 3))) if rng.random() < 0.2 else 0.0 for _ in ts]


def steady_shape(level: float, noise: float) -> Shape:
    return lambda rng, ts: [_clip(rng.gauss(level, noise)) for _ in ts]


def _phase_fn(rng: random.Random, ts: list[float], period: float, jitter: float) -> list[float]:
    """Cycle phase 0-1 at each time; each cycle's length varies by ``jitter`` (relative sd)."""
    out: list[float] = []
    start = ts[0] - rng.uniform(0, period)
    length = period * (1 + rng.gauss(0, jitter))
    for t in ts:
        while t >= start + length:
            start += length
            length = period * (1 + rng.gauss(0, jitter))
        out.append((t - start) / length)
    return out


def periodic_shape(kind: str, period: float, noise: float, jitter: float = 0.01,
                   **kw: float) -> Shape:
    """``kind``: sine, square, dips (training with eval/checkpoint dips), sawtooth."""

    def gen(rng: random.Random, ts: list[float]) -> list[float]:
        ph = _phase_fn(rng, ts, period, jitter)
        vals: list[float] = []
        for p in ph:
            if kind == "sine":
                v = kw.get("mid", 0.5) + kw.get("amp", 0.4) * math.sin(2 * math.pi * p)
            elif kind == "square":
                v = kw.get("high", 0.9) if p < kw.get("duty", 0.5) else kw.get("low", 0.05)
            elif kind == "dips":
                v = kw.get("low", 0.05) if p < kw.get("dip", 0.2) else kw.get("high", 0.95)
            elif kind == "sawtooth":
                v = 0.1 + 0.85 * p
            else:
                raise ValueError(f"unknown periodic kind {kind!r}")
            vals.append(_clip(v + rng.gauss(0, noise)))
        return vals

    return gen


def markov_shape(on: float, off: float, dwell_on: float, dwell_off: float, noise: float) -> Shape:
    """Random on/off bursts with geometric dwell times (in samples)."""

    def gen(rng: random.Random, ts: list[float]) -> list[float]:
        state = rng.random() < 0.5
        vals = []
        for _ in ts:
            vals.append(_clip(rng.gauss(on if state else off, noise)))
            if rng.random() < 1.0 / (dwell_on if state else dwell_off):
                state = not state
        return vals

    return gen


def spikes_shape(base: float, prob: float, noise: float) -> Shape:
    def gen(rng: random.Random, ts: list[float]) -> list[float]:
        return [_clip(rng.uniform(0.5, 1.0) if rng.random() < prob else rng.gauss(base, noise))
                for _ in ts]

    return gen


def levels_shape(dwell: float, noise: float) -> Shape:
    """Piecewise-constant random levels (jobs of random size coming and going)."""

    def gen(rng: random.Random, ts: list[float]) -> list[float]:
        level = rng.uniform(0.1, 1.0)
        vals = []
        for _ in ts:
            vals.append(_clip(rng.gauss(level, noise)))
            if rng.random() < 1.0 / dwell:
                level = rng.uniform(0.05, 1.0)
        return vals

    return gen


# ---- memory shapes ------------------------------------------------------------------------


def mem_constant(frac: float, noise_bytes: float = 0.0) -> Callable[[random.Random, list[float], float], list[float]]:
    return lambda rng, ts, total: [max(0.0, frac * total + rng.gauss(0, noise_bytes)) for _ in ts]


def mem_step(before: float, after: float, at: float) -> Callable[[random.Random, list[float], float], list[float]]:
    """One allocation at fraction ``at`` of the history: a job starting, not a leak."""
    return lambda rng, ts, total: [
        (before if (t - ts[0]) < at * (ts[-1] - ts[0]) else after) * total for t in ts
    ]


def mem_leak(start_frac: float, rate_bps: float, stair_s: float = 0.0,
             noise_bytes: float = 0.0) -> Callable[[random.Random, list[float], float], list[float]]:
    """Linear growth at ``rate_bps`` bytes/s; with ``stair_s`` it grows in steps every stair_s."""

    def gen(rng: random.Random, ts: list[float], total: float) -> list[float]:
        out = []
        for t in ts:
            dt = t - ts[0]
            if stair_s:
                dt = stair_s * math.floor(dt / stair_s)
            out.append(min(total, start_frac * total + rate_bps * dt + rng.gauss(0, noise_bytes)))
        return out

    return gen


# ---- building histories --------------------------------------------------------------------


def make_history(seed: int, node: str, gpu: str, label: str, name: str, ts: list[float], util: Shape,
                 mem: Callable[[random.Random, list[float], float], list[float]], total: float = 80 * GIB,
                 period_s: float | None = None, growth_bps: float | None = None) -> GpuHistory:
    rng = random.Random(f"{seed}:{node}:{gpu}:{name}")
    u = util(rng, ts)
    m = mem(rng, ts, total)
    uuid = f"GPU-{random.Random(f'{node}/{gpu}').getrandbits(64):016x}"
    return GpuHistory(node=node, gpu=gpu, uuid=uuid, label=label, name=name, times=list(ts),
                      util=list(u), mem_used=list(m), mem_total=total, period_s=period_s,
                      growth_bps=growth_bps)


def labelled_set(seed: int, end: float, span_s: float = 2100.0, interval: float = 15.0,
                 per_node: int = 8, count: int = 120, window_s: float = 1800.0) -> list[GpuHistory]:
    """``count`` GPUs of varied shapes and noise, spread over nodes of ``per_node`` GPUs.

    Mix (of 120): 15 idle, 22 steady, 35 periodic (sine, square, dips, sawtooth; periods
    60-420 s), 30 bursty (on/off, spikes, random levels), 18 growing (linear and stepwise
    leaks, 2-40% of memory per window). Some steady and bursty GPUs get a one-off memory
    allocation mid-window, which must not be called a leak. Periods are at most a quarter
    of the window (the classifier requires four cycles) and at least four scrape intervals.
    """
    rng = random.Random(seed)
    specs: list[tuple[str, str, Shape, Callable[[random.Random, list[float], float], list[float]],
                      float | None, float | None]] = []
    total = 80 * GIB

    def mem_any(r: random.Random) -> Callable[[random.Random, list[float], float], list[float]]:
        if r.random() < 0.25:
            return mem_step(r.uniform(0.0, 0.1), r.uniform(0.3, 0.9), r.uniform(0.3, 0.7))
        return mem_constant(r.uniform(0.05, 0.9), r.choice([0.0, 2e6, 2e7]))

    weights = {"idle": 15, "steady": 22, "periodic": 35, "bursty": 30, "growing": 18}
    scale = count / sum(weights.values())
    plan = {k: max(1, round(v * scale)) for k, v in weights.items()}
    plan["periodic"] += count - sum(plan.values())
    for _ in range(plan["idle"]):
        specs.append(("idle", "idle", idle_shape, mem_constant(rng.choice([0.0, 0.01, rng.uniform(0, 0.6)])),
                      None, None))
    for _ in range(plan["steady"]):
        level = rng.uniform(0.25, 0.98)
        noise = rng.uniform(0.0, 0.1) * level
        specs.append(("steady", f"steady level={level:.2f} noise={noise:.3f}", steady_shape(level, noise),
                      mem_any(rng), None, None))
    kinds = ["sine", "square", "dips", "sawtooth"]
    max_period = min(window_s / 4.0 * 0.93, 420.0)
    for i in range(plan["periodic"]):
        kind = kinds[i % len(kinds)]
        period = rng.uniform(4 * interval, max_period)
        noise = rng.choice([0.0, 0.03, 0.06, 0.1])
        kw: dict[str, float] = {}
        if kind == "sine":
            kw = {"mid": rng.uniform(0.4, 0.6), "amp": rng.uniform(0.25, 0.4)}
        elif kind == "square":
            kw = {"high": rng.uniform(0.6, 1.0), "low": rng.uniform(0.0, 0.15), "duty": rng.uniform(0.3, 0.7)}
        elif kind == "dips":
            # a dip of at least two scrapes, else the scrape grid may miss it
            kw = {"high": rng.uniform(0.85, 1.0), "low": rng.uniform(0.0, 0.1),
                  "dip": max(2.2 * interval / period, rng.uniform(0.15, 0.3))}
        name = f"periodic {kind} period={period:.1f} noise={noise} " + " ".join(
            f"{k}={v:.2f}" for k, v in kw.items())
        specs.append(("periodic", name, periodic_shape(kind, period, noise, **kw), mem_any(rng), period, None))
    for i in range(plan["bursty"]):
        v = i % 3
        if v == 0:
            on, off = rng.uniform(0.5, 1.0), rng.uniform(0.0, 0.1)
            d_on, d_off = rng.uniform(2, 8), rng.uniform(2, 10)
            noise = rng.uniform(0.0, 0.08)
            name = f"bursty on/off on={on:.2f} dwell={d_on:.1f}/{d_off:.1f} noise={noise:.2f}"
            shape = markov_shape(on, off, d_on, d_off, noise)
        elif v == 1:
            base, prob, noise = rng.uniform(0.05, 0.2), rng.uniform(0.1, 0.35), rng.uniform(0.0, 0.03)
            name = f"bursty spikes base={base:.2f} p={prob:.2f}"
            shape = spikes_shape(base, prob, noise)
        else:
            dwell, noise = rng.uniform(3, 8), rng.uniform(0.0, 0.05)
            name = f"bursty levels dwell={dwell:.1f} noise={noise:.2f}"
            shape = levels_shape(dwell, noise)
        specs.append(("bursty", name, shape, mem_any(rng), None, None))
    for i in range(plan["growing"]):
        frac = rng.uniform(0.02, 0.4)  # of total memory per window
        rate = frac * total / window_s
        start = rng.uniform(0.05, 0.5)
        stair = rng.choice([0.0, 60.0, 120.0]) if i % 2 else 0.0
        noise = rng.choice([0.0, 1e6, 1e7])
        util_kind = i % 3
        ushape: Shape = (steady_shape(rng.uniform(0.3, 0.9), 0.03) if util_kind == 0
                         else idle_shape if util_kind == 1
                         else periodic_shape("square", rng.uniform(90, 300), 0.03))
        name = f"growing rate={rate:.0f}B/s start={start:.2f} stair={stair:.0f} noise={noise:.0e}"
        specs.append(("growing", name, ushape, mem_leak(start, rate, stair, noise), None, rate))

    ts = sample_times(end, span_s, interval)
    out = []
    for i, (label, name, ushape, mshape, period_s, growth) in enumerate(specs):
        node, gpu = f"lab-{i // per_node:03d}", str(i % per_node)
        out.append(make_history(seed, node, gpu, label, name, ts, ushape, mshape, total, period_s, growth))
    return out


# ---- to Prometheus -------------------------------------------------------------------------


def write_openmetrics(writer: object, histories: Iterable[GpuHistory], node_label: bool = True,
                      job: str = "gpu-exporter") -> None:
    """Add exporter-shaped series for ``histories`` to an :class:`OpenMetricsWriter`.

    ``node_label``: put ``node`` on every series (what the shipped scrape configs do);
    False leaves it only on ``gpu_host_info`` so the profiler must join on ``instance``.
    """
    add = writer.add  # type: ignore[attr-defined]
    hosts: dict[str, list[float]] = {}
    for h in histories:
        instance = f"{h.node}:9400"
        labels = {"gpu": h.gpu, "uuid": h.uuid, "instance": instance, "job": job, **h.extra_labels}
        if node_label:
            labels["node"] = h.node
        util = [(t, v) for t, v in zip(h.times, h.util, strict=True) if v is not None]
        mem = [(t, v) for t, v in zip(h.times, h.mem_used, strict=True) if v is not None]
        present = sorted({t for t, _ in util} | {t for t, _ in mem})
        if util:
            add("gpu_utilization_ratio", labels, util)
        if mem:
            add("gpu_memory_used_bytes", labels, mem)
            add("gpu_memory_free_bytes", labels, [(t, max(0.0, h.mem_total - v)) for t, v in mem])
        if present:
            add("gpu_memory_total_bytes", labels, [(t, h.mem_total) for t in present])
            add("gpu_up", labels, [(t, 1.0) for t in present])
            hosts.setdefault(h.node, []).extend(present)
    for node, times in hosts.items():
        labels = {"node": node, "instance": f"{node}:9400", "job": job, "cpu_model": "Synthetic CPU",
                  "kernel": "6.1.0"}
        add("gpu_host_info", labels, [(t, 1.0) for t in sorted(set(times))])


MIB = 1024.0 * 1024.0


def _points(h: GpuHistory, vals: Sequence[float | None], scale: float) -> list[tuple[float, float]]:
    return [(t, v * scale) for t, v in zip(h.times, vals, strict=True) if v is not None]


def write_dcgm(writer: object, histories: Iterable[GpuHistory], node_label: str = "Hostname",
               job: str = "dcgm-exporter", scrape_pod: str | None = None) -> None:
    """The same histories as NVIDIA dcgm-exporter publishes them.

    Names, types and units from dcgm-exporter's etc/default-counters.csv
    (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv):
    ``DCGM_FI_DEV_GPU_UTIL`` gauge "GPU utilization (in %)", ``DCGM_FI_DEV_FB_USED`` /
    ``DCGM_FI_DEV_FB_FREE`` gauges "Framebuffer memory used/free (in MiB)"; no total and no
    up series. Labels as its collector writes them: ``gpu``, ``UUID``, ``device``,
    ``modelName``, ``pci_bus_id`` and the node in ``Hostname`` (every release; main renames it
    ``hostname``, NVIDIA/dcgm-exporter#655, hence ``node_label``). ``extra_labels`` (pod
    attribution: ``pod``/``namespace``/``container``) go on every series. ``scrape_pod``: the
    series were scraped through a ServiceMonitor that does not honour labels: the exporter's
    ``pod``/``namespace`` become ``exported_pod``/``exported_namespace`` and ``pod`` is the
    exporter's own pod, which also gets its ``up`` series.
    """
    add = writer.add  # type: ignore[attr-defined]
    for i, h in enumerate(histories):
        labels = {"gpu": h.gpu, "UUID": h.uuid, "device": f"nvidia{h.gpu}", "modelName": "NVIDIA H100 80GB HBM3",
                  "pci_bus_id": f"00000000:{i % 256:02X}:00.0", node_label: h.node, "job": job,
                  "instance": f"{h.node}:9400", **h.extra_labels}
        if scrape_pod is not None:
            labels = _scraped(labels, f"{scrape_pod}-{h.node}", "gpu-operator")
        util = _points(h, h.util, 100.0)
        used = _points(h, h.mem_used, 1 / MIB)
        if util:
            add("DCGM_FI_DEV_GPU_UTIL", labels, util)
        if used:
            add("DCGM_FI_DEV_FB_USED", labels, used)
            add("DCGM_FI_DEV_FB_FREE", labels, [(t, h.mem_total / MIB - v) for t, v in used])


def write_amd(writer: object, histories: Iterable[GpuHistory], prefix: str = "", job: str = "amd-metrics-exporter",
              with_uuid: bool = False, scrape_pod: str | None = None) -> None:
    """The same histories as ROCm device-metrics-exporter publishes them.

    Names from its exporter (pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go, fields
    ``GPU_GFX_ACTIVITY``, ``GPU_USED_VRAM``, ``GPU_FREE_VRAM``, ``GPU_TOTAL_VRAM`` of
    pkg/exporter/proto/exporterconfig.proto, https://github.com/ROCm/device-metrics-exporter):
    ``gpu_gfx_activity`` "Graphics engine usage in Percentage (0-100)", ``gpu_used_vram`` /
    ``gpu_free_vram`` / ``gpu_total_vram`` "(in MB)", which amd-smi counts in MiB. Every name
    carries ``CommonConfig.MetricsFieldPrefix`` when one is configured (``prefix``). Labels:
    the mandatory ``gpu_id``, ``serial_number``, ``card_model``, ``gpu_partition_id``,
    ``hostname``; ``gpu_uuid`` only when enabled (``with_uuid``); pod attribution in
    ``pod``/``namespace``/``container`` (``extra_labels``).
    """
    add = writer.add  # type: ignore[attr-defined]
    for h in histories:
        labels = {"gpu_id": h.gpu, "serial_number": "SN" + h.uuid[4:].upper(), "card_model": "0x74a1",
                  "gpu_partition_id": "0", "gpu_compute_partition_type": "spx", "gpu_memory_partition_type": "nps1",
                  "deployment_mode": "baremetal", "hostname": h.node, "job": job, "instance": f"{h.node}:5000",
                  **h.extra_labels}
        if with_uuid:
            labels["gpu_uuid"] = h.uuid
        if scrape_pod is not None:
            labels = _scraped(labels, f"{scrape_pod}-{h.node}", "kube-amd-gpu")
        util = _points(h, h.util, 100.0)
        used = _points(h, h.mem_used, 1 / MIB)
        if util:
            add(prefix + "gpu_gfx_activity", labels, util)
        if used:
            add(prefix + "gpu_used_vram", labels, used)
            add(prefix + "gpu_free_vram", labels, [(t, h.mem_total / MIB - v) for t, v in used])
            add(prefix + "gpu_total_vram", labels, [(t, h.mem_total / MIB) for t, _ in used])


def _scraped(labels: dict[str, str], pod: str, namespace: str) -> dict[str, str]:
    """Labels after a scrape that does not honour the exporter's labels (Prometheus'
    ``honor_labels: false``): clashing ones are renamed ``exported_*`` and the target's win."""
    out = dict(labels)
    for name in ("pod", "namespace", "container"):
        if name in out:
            out["exported_" + name] = out.pop(name)
    out.update(pod=pod, namespace=namespace, container="exporter")
    return out


def write_up(writer: object, pods: dict[str, tuple[str, str, str]], times: Sequence[float]) -> None:
    """``up`` of scrape targets: instance -> (job, namespace, pod), as a ServiceMonitor labels them."""
    for instance, (job, ns, pod) in pods.items():
        writer.add("up", {"instance": instance, "job": job, "namespace": ns, "pod": pod},  # type: ignore[attr-defined]
                   [(t, 1.0) for t in times])


# ---- what PromQL would compute (pure tests) --------------------------------------------------


def _quantile(vals: Sequence[float], q: float) -> float:
    s = sorted(vals)
    rank = q * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def _step_sample(times: Sequence[float], vals: Sequence[float | None], start: float, end: float,
                 step: float, lookback: float = 300.0) -> list[float | None]:
    pts = [(t, v) for t, v in zip(times, vals, strict=True) if v is not None]
    out: list[float | None] = []
    j = 0
    n = round((end - start) / step)
    for i in range(n + 1):
        t = start + i * step
        while j < len(pts) and pts[j][0] <= t:
            j += 1
        if j and t - pts[j - 1][0] < lookback:
            out.append(pts[j - 1][1])
        else:
            out.append(None)
    return out


def stats_from_history(h: GpuHistory, end: float, window_s: float = 1800.0, util_step: float = 15.0,
                       mem_points: int = 30) -> GpuStats:
    """The GpuStats the profiler would build from Prometheus for ``h`` at time ``end``."""
    start = end - window_s
    win = [(t, u, m) for t, u, m in zip(h.times, h.util, h.mem_used, strict=True) if start < t <= end]
    us = [u for _, u, _ in win if u is not None]
    ms = [m for _, _, m in win if m is not None]
    early_u = [u for t, u, _ in win if u is not None and t <= start + window_s / 2]
    early_m = [m for t, _, m in win if m is not None and t <= start + window_s / 2]
    mean = sum(us) / len(us) if us else None
    std = math.sqrt(sum((u - mean) ** 2 for u in us) / len(us)) if us and mean is not None else None
    mem_step = window_s / mem_points
    return GpuStats(
        node=h.node, gpu=h.gpu, uuid=h.uuid, window_s=window_s,
        util_mean=mean, util_std=std, util_p95=_quantile(us, 0.95) if us else None,
        util_count=float(len(us)), util_early=float(len(early_u)),
        mem_used_mean=sum(ms) / len(ms) if ms else None, mem_total=h.mem_total if ms else None,
        mem_count=float(len(ms)), mem_early=float(len(early_m)),
        util_range=_step_sample(h.times, h.util, start, end, util_step),
        util_step=util_step,
        mem_range=_step_sample(h.times, h.mem_used, start, end, mem_step),
        mem_step=mem_step,
    )


# ---- the scenario node -----------------------------------------------------------------------

SCENARIO_LABELS = {
    "0": "idle", "1": "steady", "2": "periodic", "3": "bursty", "4": "growing",
    "6": "steady", "7": "unknown",
}
SCENARIO_PERIOD_S = 120.0
SCENARIO_GROWTH_BPS = 0.10 * 80 * GIB / 1800.0  # 10% of the memory per 30 minutes


def scenario_node(seed: int, node: str, end: float, span_s: float = 2100.0,
                  interval: float = 15.0) -> list[GpuHistory]:
    """One node of 8 GPUs with every case the profiler must handle:

    0 idle, 1 steady, 2 periodic (120 s), 3 bursty, 4 leaking memory (10%/30 min), 5 a GPU
    that vanished 15 minutes ago, 6 steady but its ``pod`` label changed mid-window (two
    series for one GPU), 7 utilisation reported as NaN (must be ``unknown``).
    """
    ts = sample_times(end, span_s, interval)
    h = [
        make_history(seed, node, "0", "idle", "idle", ts, idle_shape, mem_constant(0.0)),
        make_history(seed, node, "1", "steady", "steady", ts, steady_shape(0.7, 0.03), mem_constant(0.6)),
        make_history(seed, node, "2", "periodic", "periodic", ts,
                     periodic_shape("square", SCENARIO_PERIOD_S, 0.03, high=0.95, low=0.05, duty=0.6),
                     mem_constant(0.7), period_s=SCENARIO_PERIOD_S),
        make_history(seed, node, "3", "bursty", "bursty", ts, markov_shape(0.9, 0.05, 3, 4, 0.03),
                     mem_constant(0.3)),
        make_history(seed, node, "4", "growing", "growing", ts, steady_shape(0.6, 0.03),
                     mem_leak(0.2, SCENARIO_GROWTH_BPS), growth_bps=SCENARIO_GROWTH_BPS),
        make_history(seed, node, "5", "vanished", "vanished", [t for t in ts if t <= end - 900],
                     steady_shape(0.5, 0.02), mem_constant(0.5)),
    ]
    pod = make_history(seed, node, "6", "steady", "pod switch", ts, steady_shape(0.8, 0.02), mem_constant(0.4))
    cut = end - 1000

    def part(keep: Callable[[float], bool], pod_name: str) -> GpuHistory:
        return GpuHistory(**{
            **pod.__dict__,
            "util": [u if keep(t) else None for t, u in zip(ts, pod.util, strict=True)],
            "mem_used": [m if keep(t) else None for t, m in zip(ts, pod.mem_used, strict=True)],
            "extra_labels": {"pod": pod_name, "namespace": "ml", "container": "main"},
        })

    first, second = part(lambda t: t <= cut, "train-a"), part(lambda t: t > cut, "train-b")
    nan = make_history(seed, node, "7", "unknown", "nan", ts, lambda rng, t: [math.nan] * len(t), mem_constant(0.2))
    return [*h, first, second, nan]


def write_allocation(writer: object, h: GpuHistory, namespace: str, pod: str, since: float | None = None,
                     until: float | None = None, node_label: bool = True) -> None:
    """``gpu_allocation_info`` for ``h`` held by ``namespace/pod`` from ``since`` to ``until``
    (default: the whole history), as the exporter publishes it with pod attribution on."""
    labels = {"gpu": h.gpu, "uuid": h.uuid, "instance": f"{h.node}:9400", "job": "gpu-exporter",
              "namespace": namespace, "pod": pod, "container": "main", "resource": "nvidia.com/gpu",
              "device": h.uuid, "shared": "1"}
    if node_label:
        labels["node"] = h.node
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    writer.add("gpu_allocation_info", labels, [(t, 1.0) for t in h.times if lo <= t <= hi])  # type: ignore[attr-defined]
