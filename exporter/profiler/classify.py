"""Usage patterns from a window of GPU history: pure statistics, pure Python.

numpy is not a runtime dependency, so everything here is written for plain lists and
kept cheap enough for 8,000 GPUs per cycle (about 0.1 ms per GPU for the instant
statistics, a few ms for a GPU whose range has to be analysed for a period).

Inputs are what the profiler reads back from Prometheus for one GPU over the window:
aggregates computed by PromQL (mean, standard deviation, 95th percentile, sample counts)
and, only for GPUs that need them, step-sampled ranges of utilisation (for a period) and
memory used (for a trend). Units: utilisation is a ratio 0-1 (nvidia-smi
``utilization.gpu`` / 100), memory in bytes, time in seconds.

Patterns, checked in this order (the reasons for each threshold are in docs/profiler.md):

``growing``
    memory used rises steadily: Mann-Kendall trend test significant, Theil-Sen slope times
    the window at least a set fraction of the GPU's memory, and the rise present in both
    halves of the window (a single allocation step is not a leak).
``unknown``
    too few samples, no samples in the older half of the window, no recent sample, or
    the exporter reports the GPU down (``gpu_up`` 0): we do not guess.
``allocated-idle``
    idle (as below) while a pod held the GPU (``gpu_allocation_info``, pod attribution)
    for the whole window: paid for, doing nothing.
``idle``
    mean utilisation and its 95th percentile both below small thresholds.
``underused``
    busy but starved: mean utilisation high while the mean SM activity (NVIDIA GPM,
    ``gpu_sm_active_ratio`` of the whole GPU) stays low, judged only where that series has
    enough samples in the window (other GPUs go on to the tests below).
``steady``
    coefficient of variation (stddev / mean) of utilisation below a threshold.
``periodic``
    a significant autocorrelation peak (bound z/sqrt(N), not a threshold taken from the
    data) that repeats at twice its lag; harmonics are folded back to the fundamental.
``bursty``
    in use, high variation, no period.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import mul, sub, truediv
from typing import Any

IDLE = "idle"
STEADY = "steady"
PERIODIC = "periodic"
BURSTY = "bursty"
GROWING = "growing"
UNKNOWN = "unknown"
ALLOCATED_IDLE = "allocated-idle"
UNDERUSED = "underused"
PATTERNS = (IDLE, STEADY, PERIODIC, BURSTY, GROWING, UNKNOWN, ALLOCATED_IDLE, UNDERUSED)

# Tie-break for the node's dominant pattern: the more actionable pattern wins a tie.
_DOMINANCE_ORDER = (GROWING, ALLOCATED_IDLE, UNDERUSED, BURSTY, PERIODIC, STEADY, IDLE)


@dataclass(frozen=True)
class Thresholds:
    """Every classification threshold in one place (documented in docs/profiler.md)."""

    idle_util_mean: float = 0.05  # ratio: mean utilisation below this ...
    idle_util_p95: float = 0.10  # ... and 95th percentile below this -> idle
    steady_cv: float = 0.25  # stddev/mean below this -> steady
    acf_z: float = 3.0  # autocorrelation significance: |r| > z / sqrt(N)
    min_cycles: int = 4  # a period must fit this many times into the window
    min_period_steps: int = 3  # shorter periods cannot be resolved at the range step
    min_samples: int = 20  # raw samples in the window, else unknown
    max_missing_fraction: float = 0.2  # of range points; more gaps -> unknown
    growth_z: float = 2.33  # Mann-Kendall one-sided, p < 0.01
    growth_min_fraction: float = 0.01  # rise over the window, fraction of total memory
    growth_half_ratio: float = 0.3  # each half's slope >= this x the whole-window slope
    node_idle_util: float = 0.30  # node idle-GPU count: utilisation below ...
    node_idle_mem: float = 0.50  # ... and memory used ratio below
    held_fraction: float = 0.9  # allocated-idle: share of the window's scrapes a pod held the GPU
    underused_util: float = 0.8  # underused: mean utilisation at least this ...
    underused_sm: float = 0.2  # ... while mean SM activity stays below this (as GPUBusyButStarved)


@dataclass
class GpuStats:
    """What the profiler knows about one GPU for one evaluation.

    ``util_*`` and ``mem_*`` aggregates come from PromQL over the window; ``None`` (or
    NaN) means the query returned nothing usable. ``util_early``/``mem_early`` count
    samples in the older half of the window. ``util_range``/``mem_range`` are step-sampled
    values (``None`` where Prometheus had no point), present only for GPUs the range
    queries selected.
    """

    node: str
    gpu: str
    uuid: str = ""
    window_s: float = 1800.0
    fresh: bool = True  # any sample in the freshness period (else: the GPU is gone)
    up: float | None = None  # last gpu_up (1/0)
    util_mean: float | None = None
    util_std: float | None = None
    util_p95: float | None = None
    util_count: float | None = None
    util_early: float | None = None
    mem_used_mean: float | None = None
    mem_total: float | None = None
    mem_free_mean: float | None = None
    mem_count: float | None = None
    mem_early: float | None = None
    util_fresh: float | None = None  # samples in the freshness period (None: not known)
    mem_fresh: float | None = None
    util_range: list[float | None] | None = None
    util_step: float = 15.0
    mem_range: list[float | None] | None = None
    mem_step: float = 60.0
    holders: dict[str, float] | None = None  # "namespace/pod" -> samples of the window it held the GPU
    sm_mean: float | None = None  # window mean of the whole GPU's SM activity (GPM); None: no series
    sm_count: float | None = None  # its samples in the window
    health: dict[str, float] | None = None  # health fields read for the GPUHealthy condition (health.py)
    # the availability score's health (health_factor): XIDs and uncorrectable ECC errors in the
    # window, share of the window with a thermal/power/hardware slowdown; None: not published
    xid_rise: float | None = None
    ecc_rise: float | None = None
    throttle_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """The classification of one GPU. ``score`` = 0.6 x free memory ratio + 0.4 x (1 - util)."""

    pattern: str
    period_seconds: float | None = None
    growth_bytes_per_second: float | None = None
    util_mean: float | None = None  # ratio 0-1, window mean
    mem_used_ratio: float | None = None  # ratio 0-1, window mean of used / total
    score: float | None = None  # availability 0-1; None without both inputs
    reason: str = ""
    holder: str | None = None  # allocated-idle: "namespace/pod" (comma separated if shared)


@dataclass(frozen=True)
class PeriodResult:
    period_steps: float  # fundamental period in range steps (fractional after refinement)
    peak: float  # autocorrelation at the fundamental lag
    bound: float  # significance bound used


@dataclass(frozen=True)
class TrendResult:
    slope: float  # Theil-Sen slope, value units per second
    z: float  # Mann-Kendall z (positive: rising)


def finite(x: float | None) -> float | None:
    """``x`` if it is a finite number, else None (Prometheus returns NaN and +Inf as values)."""
    if x is None or not math.isfinite(x):
        return None
    return x


# ---- autocorrelation and period --------------------------------------------------------


def fill_gaps(values: Sequence[float | None], max_missing_fraction: float) -> list[float] | None:
    """Linearly interpolate missing points; None when too many are missing or an end is.

    Leading and trailing gaps are cut off rather than extrapolated.
    """
    n = len(values)
    try:
        # the common case, no gap at all: one pass (a None or a non-finite value goes the long way)
        whole = [float(v) for v in values]  # type: ignore[arg-type]
        if n and math.isfinite(math.fsum(whole)):
            return whole
    except (TypeError, OverflowError):
        pass
    idx = [i for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if not idx or n - len(idx) > max_missing_fraction * n:
        return None
    first, last = idx[0], idx[-1]
    out: list[float] = []
    prev_i = first
    for i in idx:
        v = float(values[i])  # type: ignore[arg-type]
        if i > prev_i + 1:
            pv = float(values[prev_i])  # type: ignore[arg-type]
            span = i - prev_i
            out.extend(pv + (v - pv) * (j / span) for j in range(1, span))
        out.append(v)
        prev_i = i
    assert len(out) == last - first + 1
    return out


def detrend(x: Sequence[float]) -> list[float]:
    """Remove the least-squares line (a slow drift would otherwise look like a long period)."""
    n = len(x)
    if n < 2:
        return [0.0] * n
    tm = (n - 1) / 2.0
    xm = sum(x) / n
    sxx = n * (n * n - 1) / 12.0
    sxy = sum((i - tm) * (v - xm) for i, v in enumerate(x))
    b = sxy / sxx
    return [v - xm - b * (i - tm) for i, v in enumerate(x)]


def autocorrelation(x: Sequence[float], max_lag: int) -> list[float]:
    """Biased sample autocorrelation r(0..max_lag) of a zero-mean series (r(0) = 1).

    All zeros when the series is constant.
    """
    xs = list(x)
    n = len(xs)
    squares = [0.0, *accumulate(map(mul, xs, xs))]  # squares[m]: the sum of the first m squares
    c0 = squares[n]
    if c0 <= 0.0:
        return [0.0] * (max_lag + 1)
    # This is most of a periodic GPU's classification, so each lag's sum of products is taken
    # from a distance: a·b = (|a|² + |b|² - |a - b|²) / 2, where math.dist walks both slices in
    # C without a float object per product (twice as fast as sum(map(mul, ...))). Its error is
    # a few ulps of c0, about 1e-15 in r, against a significance bound of 0.1 or more.
    dist = math.dist
    out = []
    for k in range(max_lag + 1):
        d = dist(xs[:n - k], xs[k:])
        out.append((squares[n - k] + c0 - squares[k] - d * d) / (2.0 * c0))
    return out


def _peak_near(r: Sequence[float], centre: float, tol: float) -> int | None:
    """Index of the largest value of ``r`` within ``centre ± tol`` (None if out of range)."""
    lo = max(1, math.floor(centre - tol))
    hi = min(len(r) - 1, math.ceil(centre + tol))
    if lo > hi:
        return None
    return max(range(lo, hi + 1), key=r.__getitem__)


def _interpolate_peak(r: Sequence[float], k: int) -> float:
    """Sub-step location of the peak at ``k`` by a parabola through its neighbours."""
    if 0 < k < len(r) - 1:
        a, b, c = r[k - 1], r[k], r[k + 1]
        den = a - 2 * b + c
        if den < 0:
            off = 0.5 * (a - c) / den
            if -1.0 < off < 1.0:
                return k + off
    return float(k)


def _odd_weaker(r: Sequence[float], p: float, max_lag: int, n: int) -> bool:
    """Whether r at odd multiples of ``p`` is below 0.75 x r at even multiples (scaled by N/(N-k))."""
    odd: list[float] = []
    even: list[float] = []
    j = 1
    while j * p <= max_lag:
        k = _peak_near(r, j * p, max(1.0, 0.1 * p))
        if k is not None:
            (odd if j % 2 else even).append(_peak_height(r, k) * n / (n - k))
        j += 1
    if not odd or not even:
        return False
    return sum(odd) / len(odd) < 0.75 * sum(even) / len(even)


def _peak_height(r: Sequence[float], k: int) -> float:
    """Height of the parabola through r(k-1), r(k), r(k+1): a period that is not a whole
    number of steps splits its peak over two lags, and r(k) alone underestimates it."""
    if 0 < k < len(r) - 1:
        a, b, c = r[k - 1], r[k], r[k + 1]
        den = a - 2 * b + c
        if den < 0:
            return b - (a - c) ** 2 / (8 * den)
    return r[k]


def detect_period(values: Sequence[float], z: float = 3.0, min_cycles: int = 4,
                  min_period_steps: int = 3) -> PeriodResult | None:
    """Fundamental period of ``values`` in steps, or None when there is no significant one.

    Method: detrend; biased autocorrelation r(k) up to N/2; candidate peaks are local
    maxima above the white-noise bound z/sqrt(N) (Bartlett); maxima with no real valley
    between them are noise on one broad peak and merge. The strongest peak (after scaling
    r(k) by N/(N-k) so later peaks are not penalised for having fewer pairs) may be a
    multiple of the true period, so the smallest peak whose lag divides it and whose
    height is comparable is taken as the fundamental. The peak must repeat near twice
    that lag (also above the bound), which is why a period must fit ``min_cycles`` (4)
    times into the window. A half-period harmonic (odd multiples of the lag clearly weaker
    than even ones) is doubled. The period is refined from the farthest repeat inside the ACF
    (parabolic interpolation, divided by the repeat number).
    """
    n = len(values)
    max_lag = n // 2
    if n < 4 * min_period_steps or max_lag < 2 * min_period_steps:
        return None
    d = detrend(values)
    r = autocorrelation(d, max_lag)
    if r[0] == 0.0:
        return None
    bound = z / math.sqrt(n)
    # the fundamental must repeat within the window: lag <= max_lag * 2 / min_cycles
    longest = int(max_lag * 2 // max(min_cycles, 2))
    peaks = [
        k for k in range(min_period_steps, max_lag)
        if r[k] > bound and r[k] >= r[k - 1] and r[k] > r[k + 1]
    ]  # fmt: skip
    if not peaks:
        return None
    # noise puts small wiggles on one broad peak: maxima without a real valley between
    # them (dip smaller than half the bound) are one peak, the higher one
    merged: list[int] = []
    for k in peaks:
        if merged:
            j = merged[-1]
            valley = min(r[j:k + 1])
            if min(r[j], r[k]) - valley < 0.5 * bound:
                if r[k] > r[j]:
                    merged[-1] = k
                continue
        merged.append(k)

    # positions to a fraction of a step: a period rarely is a whole number of steps, and
    # the error of a whole-step position grows with every multiple taken of it
    pos = {k: _interpolate_peak(r, k) for k in merged}
    best = max(merged, key=lambda k: r[k])  # biased r: later lags have fewer pairs, more noise
    fundamental = float(pos[best])
    for k in merged:
        if k >= best:
            break
        m = round(pos[best] / pos[k])
        if m < 2 or abs(pos[best] - m * pos[k]) > 0.5 * m + 0.5 or r[k] < 0.5 * r[best]:
            continue
        # every multiple of a true fundamental up to the best peak is a peak too
        p = pos[best] / m
        reps = [_peak_near(r, j * p, max(1.0, 0.1 * p)) for j in range(1, m)]
        if all(q is not None and r[q] > bound for q in reps):
            fundamental = p
            break
    # a half-period harmonic (two unequal bursts per cycle) passes the test above; it shows
    # as odd multiples of the lag correlating clearly less than even ones: double it
    while _odd_weaker(r, fundamental, max_lag, n):
        fundamental *= 2
    if fundamental > longest:
        return None
    # the peak must repeat: a random excursion of a correlated (bursty) series rarely does
    rep = _peak_near(r, 2 * fundamental, max(1.0, 0.2 * fundamental))
    if rep is None or r[rep] <= bound:
        return None
    # and every later multiple inside the ACF stays positively correlated
    for j in range(3, int(max_lag // fundamental) + 1):
        q = _peak_near(r, j * fundamental, max(1.0, 0.1 * j * fundamental))
        if q is None or r[q] <= 0.5 * bound:
            return None
    # refine with the farthest repeat inside the ACF: the error shrinks with the repeat number
    period = fundamental
    m = int(max_lag // fundamental)
    while m >= 2:
        kk = _peak_near(r, m * period, max(1.0, 0.1 * period))
        if kk is not None and r[kk] > bound and 0 < kk < max_lag and r[kk] >= r[kk - 1] and r[kk] >= r[kk + 1]:
            period = _interpolate_peak(r, kk) / m
            break
        m -= 1
    peak_at = min(max_lag, max(1, round(fundamental)))
    return PeriodResult(period_steps=period, peak=r[peak_at], bound=bound)


# ---- trend (memory growth) ---------------------------------------------------------------


def theil_sen_mann_kendall(ys: Sequence[float], step: float = 1.0) -> tuple[float, float]:
    """Theil-Sen slope (units per second) and Mann-Kendall z of an evenly spaced series.

    O(N^2) pairs; the caller keeps N small (tens of points). The MK variance includes the
    tie correction, which matters because memory readings often repeat exactly.
    """
    n = len(ys)
    if n < 3:
        return 0.0, 0.0
    xs = list(ys)
    slopes: list[float] = []
    extend = slopes.extend
    # one lag k at a time, every pair (i, i + k) of it in C (map), no Python step per pair: a
    # growing GPU asks for three of these, and they were most of its classification
    for k in range(1, n):
        extend(map(truediv, map(sub, xs[k:], xs[:n - k]), repeat(k, n - k)))
    slopes.sort()
    m = len(slopes)
    med = slopes[m // 2] if m % 2 else 0.5 * (slopes[m // 2 - 1] + slopes[m // 2])
    # Mann-Kendall's S, the rises minus the falls: a slope has its pair's sign (k > 0), unless the
    # difference is so tiny that dividing by k rounds it to 0, possible only for readings within
    # ~1e-270 of 0 (a larger one's differences are multiples of its ulp): count those pairs exactly
    if any(0.0 < abs(x) < 1e-270 for x in xs):
        s = sum((xs[j] > xs[i]) - (xs[j] < xs[i]) for i in range(n) for j in range(i + 1, n))
    else:
        s = (m - bisect_right(slopes, 0.0)) - bisect_left(slopes, 0.0)
    ties = Counter(xs)
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values() if t > 1)) / 18.0
    if var <= 0:
        return med / step, 0.0
    sd = math.sqrt(var)
    zval = (s - 1) / sd if s > 0 else (s + 1) / sd if s < 0 else 0.0
    return med / step, zval


def detect_growth(values: Sequence[float], step: float, total: float, window_s: float,
                  th: Thresholds) -> TrendResult | None:
    """A steady rise of memory used (bytes), or None.

    Requires a significant Mann-Kendall z, a Theil-Sen slope large enough to matter
    (slope x window >= growth_min_fraction x total memory), and the rise present in both
    halves of the window (each half's slope >= growth_half_ratio x the whole slope), so a
    job that allocated its memory once during the window is not called a leak.
    """
    n = len(values)
    if n < 10 or total <= 0:
        return None
    slope, zval = theil_sen_mann_kendall(values, step)
    if zval < th.growth_z or slope * window_s < th.growth_min_fraction * total:
        return None
    half = n // 2
    s1, _ = theil_sen_mann_kendall(values[: half + 1], step)
    s2, _ = theil_sen_mann_kendall(values[half:], step)
    if min(s1, s2) < th.growth_half_ratio * slope:
        return None
    return TrendResult(slope=slope, z=zval)


# ---- per GPU and per node ----------------------------------------------------------------


def availability_score(free_ratio: float, util: float) -> float:
    """0.6 x free memory ratio + 0.4 x (1 - utilisation), both clamped to 0-1."""
    f = min(1.0, max(0.0, free_ratio))
    u = min(1.0, max(0.0, util))
    return 0.6 * f + 0.4 * (1.0 - u)


def health_factor(st: GpuStats) -> float:
    """What the availability score keeps of a GPU's free capacity, 0-1: 0 after an XID or an
    uncorrectable ECC error in the window (its jobs crash or its memory fails: never the best
    GPU to place work on), else 1 - the share of the window it spent in a thermal, power or
    hardware slowdown (a throttled GPU delivers that much less). Readings that are absent
    (another exporter, no such event) cost nothing."""
    if (finite(st.xid_rise) or 0.0) > 0 or (finite(st.ecc_rise) or 0.0) > 0:
        return 0.0
    throttled = min(1.0, max(0.0, finite(st.throttle_ratio) or 0.0))
    return 1.0 - throttled


def _memory_ratios(st: GpuStats) -> tuple[float | None, float | None]:
    """(used ratio, free ratio) over the window; free from gpu_memory_free_bytes if present."""
    total = finite(st.mem_total)
    used = finite(st.mem_used_mean)
    if total is None or total <= 0:
        return None, None
    used_ratio = None if used is None else min(1.0, max(0.0, used / total))
    free = finite(st.mem_free_mean)
    free_ratio = min(1.0, max(0.0, free / total)) if free is not None else (
        None if used_ratio is None else 1.0 - used_ratio)
    return used_ratio, free_ratio


def _enough(count: float | None, early: float | None, th: Thresholds) -> bool:
    c, e = finite(count), finite(early)
    return c is not None and c >= th.min_samples and e is not None and e > 0


def classify_gpu(st: GpuStats, th: Thresholds | None = None) -> GpuProfile:
    """Classify one GPU (see the module docstring for the order of the tests)."""
    th = th or Thresholds()
    mean, std, p95 = finite(st.util_mean), finite(st.util_std), finite(st.util_p95)
    util = None if mean is None else min(1.0, max(0.0, mean))
    used_ratio, free_ratio = _memory_ratios(st)
    score = None if util is None or free_ratio is None else round(
        availability_score(free_ratio, util) * health_factor(st), 4)
    common: dict[str, Any] = {"util_mean": util, "mem_used_ratio": used_ratio, "score": score}

    if st.up is not None and st.up == 0:
        return GpuProfile(UNKNOWN, reason="the exporter reports the GPU down (gpu_up 0)", **common)
    total = finite(st.mem_total)
    mem_now = st.mem_fresh is None or (finite(st.mem_fresh) or 0) > 0
    if st.mem_range is not None and total and mem_now and _enough(st.mem_count, st.mem_early, th):
        ys = fill_gaps(st.mem_range, th.max_missing_fraction)
        if ys is not None:
            tr = detect_growth(ys, st.mem_step, total, st.window_s, th)
            if tr is not None:
                return GpuProfile(GROWING, growth_bytes_per_second=tr.slope,
                                  reason=f"memory +{tr.slope:.0f} B/s, Mann-Kendall z={tr.z:.1f}", **common)

    if not _enough(st.util_count, st.util_early, th) or mean is None or std is None:
        return GpuProfile(UNKNOWN, reason="not enough utilisation samples in the window", **common)
    if st.util_fresh is not None and not (finite(st.util_fresh) or 0) > 0:
        # the history is there but the GPU stopped reporting utilisation: old data is not its state now
        return GpuProfile(UNKNOWN, reason="no recent utilisation sample", **common)
    if mean < th.idle_util_mean and (p95 is None or p95 < th.idle_util_p95):
        holder = holder_all_window(st, th)
        if holder:
            return GpuProfile(ALLOCATED_IDLE, reason=f"mean utilisation {mean:.3f}, held by {holder}",
                              holder=holder, **common)
        return GpuProfile(IDLE, reason=f"mean utilisation {mean:.3f}", **common)
    sm, sm_count = finite(st.sm_mean), finite(st.sm_count)
    if sm is not None and sm_count is not None and sm_count >= th.min_samples and mean >= th.underused_util \
            and sm < th.underused_sm:
        return GpuProfile(UNDERUSED, reason=f"mean utilisation {mean:.3f}, mean SM activity {sm:.3f}", **common)
    cv = std / mean if mean > 0 else math.inf
    if cv < th.steady_cv:
        return GpuProfile(STEADY, reason=f"coefficient of variation {cv:.2f}", **common)
    if st.util_range is None:
        # the range query should have selected this GPU; without its points we do not guess
        return GpuProfile(UNKNOWN, reason="utilisation range missing", **common)
    xs = fill_gaps(st.util_range, th.max_missing_fraction)
    if xs is None or len(xs) < th.min_samples:
        return GpuProfile(UNKNOWN, reason="too many gaps in the utilisation range", **common)
    pr = detect_period(xs, th.acf_z, th.min_cycles, th.min_period_steps)
    if pr is not None:
        return GpuProfile(PERIODIC, period_seconds=pr.period_steps * st.util_step,
                          reason=f"autocorrelation {pr.peak:.2f} > bound {pr.bound:.2f}", **common)
    return GpuProfile(BURSTY, reason=f"coefficient of variation {cv:.2f}, no period", **common)


def holder_all_window(st: GpuStats, th: Thresholds) -> str | None:
    """The pods (``namespace/pod``, sorted, comma separated) that held the GPU for at least
    ``held_fraction`` of the window's scrapes, or None."""
    if not st.holders or st.util_step <= 0:
        return None
    expected = st.window_s / st.util_step
    held = sorted(h for h, n in st.holders.items() if math.isfinite(n) and n >= th.held_fraction * expected)
    return ",".join(held) or None


def dominant_pattern(patterns: Iterable[str]) -> str:
    """Most frequent known pattern; ties go to the more actionable one; ``unknown`` if none.

    Total: anything that is not a known pattern (``unknown``, ``''``, ``'STEADY'``, a value
    read back from a tampered annotation) is not counted, and an empty input gives ``unknown``.
    """
    counts = Counter(p for p in patterns if p in _DOMINANCE_ORDER)
    if not counts:
        return UNKNOWN
    top = max(counts.values())
    return next((p for p in _DOMINANCE_ORDER if counts[p] == top), UNKNOWN)


def is_idle_for_node(profile: GpuProfile, th: Thresholds) -> bool:
    """The seed's idle-GPU rule: window-mean utilisation < 30% and memory used < 50%."""
    return (profile.util_mean is not None and profile.mem_used_ratio is not None
            and profile.util_mean < th.node_idle_util and profile.mem_used_ratio < th.node_idle_mem)
