"""Pure statistics of the profiler (no Prometheus): exporter/profiler/classify.py."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.profiler.classify import (
    ALLOCATED_IDLE,
    BURSTY,
    GROWING,
    IDLE,
    PERIODIC,
    STEADY,
    UNDERUSED,
    UNKNOWN,
    GpuProfile,
    GpuStats,
    Thresholds,
    autocorrelation,
    availability_score,
    classify_gpu,
    detect_growth,
    detect_period,
    detrend,
    dominant_pattern,
    fill_gaps,
    health_factor,
    holder_all_window,
    is_idle_for_node,
    theil_sen_mann_kendall,
)
from tests.fakes.profiler_history import GIB, labelled_set, stats_from_history

END = 1_700_000_000.0
TH = Thresholds()


def _score(seed: int) -> tuple[int, int, list[str]]:
    hist = labelled_set(seed, END)
    ok, wrong = 0, []
    for h in hist:
        p = classify_gpu(stats_from_history(h, END))
        good = p.pattern == h.label
        if good and h.period_s is not None:
            assert p.period_seconds is not None
            good = abs(p.period_seconds - h.period_s) <= 0.1 * h.period_s
        ok += good
        if not good:
            wrong.append(f"{h.name} -> {p.pattern} {p.period_seconds} ({p.reason})")
    return ok, len(hist), wrong


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_labelled_set_is_classified_at_least_95_percent(seed: int) -> None:
    ok, total, wrong = _score(seed)
    assert total >= 100
    assert ok >= 0.95 * total, f"{ok}/{total} correct; wrong: {wrong}"


def test_labelled_set_is_deterministic_and_varied() -> None:
    a, b = labelled_set(5, END), labelled_set(5, END)
    assert [(h.name, h.util[:20]) for h in a] == [(h.name, h.util[:20]) for h in b]
    labels = Counter(h.label for h in a)
    assert set(labels) == {IDLE, STEADY, PERIODIC, BURSTY, GROWING}
    assert min(labels.values()) >= 10
    assert len({h.name.split(" ")[1] for h in a if h.label == PERIODIC}) == 4  # four periodic shapes
    assert labelled_set(6, END)[50].util != a[50].util


def _sine(n: int, period: float, noise: float = 0.0, seed: int = 0, phase: float = 0.3) -> list[float]:
    rng = random.Random(seed)
    return [0.5 + 0.4 * math.sin(2 * math.pi * i / period + phase) + rng.gauss(0, noise) for i in range(n)]


@pytest.mark.parametrize("period", [3.5, 4.57, 7.0, 12.3, 20.0, 29.0])
def test_detect_period_finds_known_periods(period: float) -> None:
    r = detect_period(_sine(121, period, noise=0.05, seed=int(period * 10)))
    assert r is not None
    assert abs(r.period_steps - period) <= 0.1 * period, r


def test_detect_period_rejects_harmonics() -> None:
    # a cycle of 20 steps with two bursts of different height: strong lag-10 correlation
    # (the half period) and a stronger one at 20, the fundamental
    xs = []
    for i in range(121):
        ph = i % 20
        xs.append(1.0 if ph < 4 else 0.55 if 10 <= ph < 14 else 0.05)
    r = detect_period(xs)
    assert r is not None
    assert abs(r.period_steps - 20) <= 1.0


def test_detect_period_needs_four_cycles() -> None:
    assert detect_period(_sine(121, 25.0)) is not None  # 4.8 cycles
    assert detect_period(_sine(121, 45.0)) is None  # 2.7 cycles: not enough evidence


def test_detect_period_none_for_constant_and_white_noise() -> None:
    assert detect_period([0.7] * 121) is None
    hits = sum(detect_period([random.Random(s).random() for _ in range(121)]) is not None for s in range(200))
    # the bound is z=3 over ~60 lags and the repeat test: false positives must be rare
    assert hits <= 4, hits


def test_detect_period_uses_a_bound_from_n_not_from_the_data() -> None:
    xs = _sine(121, 10.0, noise=0.05)
    r1, r2 = detect_period(xs), detect_period([3 * x + 7 for x in xs])
    assert r1 is not None and r2 is not None
    assert r1.bound == pytest.approx(3.0 / math.sqrt(121))
    assert r1.bound == r2.bound and r1.period_steps == pytest.approx(r2.period_steps)


@settings(max_examples=40, deadline=None)
@given(period=st.floats(4.0, 28.0), scale=st.floats(0.1, 10.0), offset=st.floats(-5.0, 5.0))
def test_detect_period_is_invariant_to_scale_and_offset(period: float, scale: float, offset: float) -> None:
    xs = _sine(121, period, noise=0.02, seed=1)
    a = detect_period(xs)
    b = detect_period([scale * x + offset for x in xs])
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert a.period_steps == pytest.approx(b.period_steps, rel=1e-6)


def test_autocorrelation_and_detrend_basics() -> None:
    r = autocorrelation(detrend(_sine(200, 10.0, phase=0.0)), 20)
    assert r[0] == pytest.approx(1.0)
    assert r[5] < -0.8 and r[10] > 0.8
    assert autocorrelation([0.0] * 10, 3) == [0.0] * 4
    d = detrend([2.0 * i + 5 for i in range(50)])
    assert max(abs(v) for v in d) < 1e-9


def test_fill_gaps() -> None:
    assert fill_gaps([1.0, None, 3.0, None, None, 6.0], 0.5) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert fill_gaps([None, 1.0, 2.0, None], 0.5) == [1.0, 2.0]  # ends are cut, not invented
    assert fill_gaps([1.0, None, None, None, 2.0], 0.2) is None  # too many gaps
    assert fill_gaps([None, None], 1.0) is None
    assert fill_gaps([1.0, math.nan, 3.0], 0.5) == [1.0, 2.0, 3.0]
    # no gap (the one-pass path), and values whose sum overflows or is infinite (the long path)
    assert fill_gaps([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]
    assert fill_gaps([1e308, 1e308, 1e308], 0.0) == [1e308, 1e308, 1e308]
    assert fill_gaps([1.0, math.inf, 3.0], 0.5) == [1.0, 2.0, 3.0]
    assert fill_gaps([], 0.5) is None


def test_theil_sen_is_robust_to_outliers_and_mann_kendall_signs() -> None:
    rng = random.Random(3)
    ys = [100.0 + 2.0 * i + rng.gauss(0, 1) for i in range(40)]
    for i in range(0, 40, 5):
        ys[i] += rng.choice([-500.0, 800.0])  # 20% wild outliers
    slope, z = theil_sen_mann_kendall(ys, step=2.0)
    assert slope == pytest.approx(1.0, rel=0.05)  # 2 per point / 2 s per point
    assert z > 3
    slope_down, z_down = theil_sen_mann_kendall(list(reversed(ys)), step=2.0)
    assert slope_down == pytest.approx(-slope, rel=1e-9) and z_down < -3
    assert theil_sen_mann_kendall([5.0] * 30) == (0.0, 0.0)  # all ties: no trend


def _mem(values: list[float]) -> list[float | None]:
    return list(values)


def test_detect_growth_leak_versus_allocation_step() -> None:
    total, window, step, n = 80 * GIB, 1800.0, 60.0, 31
    leak = [10 * GIB + 0.002 * total * i + (i % 3) * 1e6 for i in range(n)]  # 6% of memory per window
    tr = detect_growth(leak, step, total, window, TH)
    assert tr is not None and tr.slope == pytest.approx(0.002 * total / step, rel=0.02)
    jump = [2 * GIB if i < n // 2 else 40 * GIB for i in range(n)]  # a job allocating once
    assert detect_growth(jump, step, total, window, TH) is None
    tiny = [10 * GIB + 1e5 * i for i in range(n)]  # 3 MB per window: too small to matter
    assert detect_growth(tiny, step, total, window, TH) is None
    flat = [10 * GIB + random.Random(i).gauss(0, 1e7) for i in range(n)]
    assert detect_growth(flat, step, total, window, TH) is None


def _stats(**kw: object) -> GpuStats:
    base: dict[str, object] = dict(node="n", gpu="0", util_mean=0.5, util_std=0.01, util_p95=0.52,
                                   util_count=120.0, util_early=60.0, mem_used_mean=40 * GIB,
                                   mem_total=80 * GIB, mem_count=120.0, mem_early=60.0)
    base.update(kw)
    return GpuStats(**base)  # type: ignore[arg-type]


def test_classify_gpu_decisions_and_unknowns() -> None:
    assert classify_gpu(_stats()).pattern == STEADY
    assert classify_gpu(_stats(util_mean=0.01, util_std=0.01, util_p95=0.03)).pattern == IDLE
    # mostly idle with recurring spikes is not idle
    spiky = classify_gpu(_stats(util_mean=0.04, util_std=0.1, util_p95=0.6, util_range=None))
    assert spiky.pattern == UNKNOWN and "range" in spiky.reason
    assert classify_gpu(_stats(util_count=10.0)).pattern == UNKNOWN  # too few samples
    assert classify_gpu(_stats(util_early=0.0)).pattern == UNKNOWN  # started within the window
    assert classify_gpu(_stats(util_mean=math.nan)).pattern == UNKNOWN
    assert classify_gpu(_stats(util_std=math.inf)).pattern == UNKNOWN
    assert classify_gpu(_stats(util_mean=None, util_std=None, util_count=None)).pattern == UNKNOWN
    assert classify_gpu(_stats(up=0.0)).pattern == UNKNOWN  # the exporter says the GPU is lost
    assert classify_gpu(_stats(util_fresh=0.0)).pattern == UNKNOWN  # history, but nothing recent
    assert classify_gpu(_stats(up=1.0, util_fresh=20.0)).pattern == STEADY
    rng = random.Random(1)
    bursty = [rng.choice([0.05, 0.95]) for _ in range(121)]
    p = classify_gpu(_stats(util_mean=0.5, util_std=0.45, util_range=bursty))
    assert p.pattern == BURSTY
    per = classify_gpu(_stats(util_mean=0.5, util_std=0.28, util_range=_sine(121, 8.0), util_step=15.0))
    assert per.pattern == PERIODIC and per.period_seconds == pytest.approx(120.0, rel=0.05)


def test_classify_gpu_growth_wins_and_works_without_utilisation() -> None:
    leak = [10 * GIB + 0.003 * 80 * GIB * i for i in range(31)]
    p = classify_gpu(_stats(util_mean=None, util_std=None, util_count=None, mem_range=_mem(leak)))
    assert p.pattern == GROWING and p.growth_bytes_per_second == pytest.approx(0.003 * 80 * GIB / 60.0, rel=0.02)
    # memory present but too few memory samples: no guess about growth
    assert classify_gpu(_stats(mem_range=_mem(leak), mem_count=5.0)).pattern == STEADY


def test_scores_and_node_rules() -> None:
    assert availability_score(1.0, 0.0) == 1.0
    assert availability_score(0.5, 0.5) == pytest.approx(0.6 * 0.5 + 0.4 * 0.5)
    assert availability_score(2.0, -1.0) == 1.0  # clamped
    p = classify_gpu(_stats(util_mean=0.2, mem_used_mean=20 * GIB, mem_free_mean=50 * GIB))
    assert p.mem_used_ratio == pytest.approx(0.25)
    assert p.score == pytest.approx(0.6 * (50 / 80) + 0.4 * 0.8, abs=1e-4)  # free bytes preferred
    assert is_idle_for_node(p, TH)
    assert not is_idle_for_node(p, Thresholds(node_idle_util=0.1))
    assert not is_idle_for_node(GpuProfile(UNKNOWN), TH)
    assert dominant_pattern([IDLE, IDLE, STEADY, UNKNOWN, UNKNOWN, UNKNOWN]) == IDLE
    assert dominant_pattern([IDLE, STEADY]) == STEADY  # tie: the more actionable
    assert dominant_pattern([GROWING, PERIODIC, PERIODIC]) == PERIODIC
    assert dominant_pattern([UNKNOWN]) == UNKNOWN and dominant_pattern([]) == UNKNOWN
    # total: values that are not patterns (read back from a tampered annotation) are not counted
    assert dominant_pattern(["", "x", "STEADY", "unknown "]) == UNKNOWN
    assert dominant_pattern(["x", "x", IDLE]) == IDLE


def test_availability_score_clamps_both_inputs() -> None:
    assert availability_score(0.5, 1.5) == pytest.approx(0.3)  # utilisation over 1 counts as 1
    assert availability_score(1.5, 0.5) == pytest.approx(0.8)  # free memory over 1 counts as 1
    assert availability_score(-0.5, -0.5) == pytest.approx(0.4)


@pytest.mark.parametrize(("kw", "factor"), [
    ({}, 1.0),  # nothing published: costs nothing
    ({"xid_rise": 0.5}, 0.0),  # any rise, even a fraction (increase() extrapolates)
    ({"ecc_rise": 0.5}, 0.0),
    ({"xid_rise": 3.0, "throttle_ratio": 0.1}, 0.0),
    ({"xid_rise": 0.0, "ecc_rise": 0.0, "throttle_ratio": 0.25}, 0.75),
    ({"throttle_ratio": 1.5}, 0.0),  # a ratio over 1 counts as the whole window
    ({"throttle_ratio": -0.5}, 1.0),
    ({"throttle_ratio": math.nan, "xid_rise": math.nan, "ecc_rise": math.inf}, 1.0),  # not a reading
])
def test_health_factor(kw: dict[str, float], factor: float) -> None:
    assert health_factor(_stats(**kw)) == pytest.approx(factor)
    score = classify_gpu(_stats(util_mean=0.0, util_std=0.0, util_p95=0.0, mem_used_mean=0.0, **kw)).score
    assert score == pytest.approx(factor)


@pytest.mark.parametrize(("kw", "used", "score"), [
    ({"mem_used_mean": 20 * GIB, "mem_total": 80 * GIB}, 0.25, 0.6 * 0.75 + 0.2),
    ({"mem_used_mean": 100 * GIB, "mem_total": 80 * GIB}, 1.0, 0.2),  # ratios clamp to 0-1
    ({"mem_used_mean": 20 * GIB, "mem_free_mean": 100 * GIB, "mem_total": 80 * GIB}, 0.25, 0.6 + 0.2),
    ({"mem_used_mean": None, "mem_free_mean": 20 * GIB, "mem_total": 80 * GIB}, None, 0.6 * 0.25 + 0.2),
    ({"mem_used_mean": None, "mem_total": 80 * GIB}, None, None),  # no memory reading: no score
    ({"mem_used_mean": 0.5, "mem_total": 1.0}, 0.5, 0.6 * 0.5 + 0.2),  # any positive total divides
    ({"mem_used_mean": 0.0, "mem_total": 0.0}, None, None),  # no total: no ratios
    ({"mem_used_mean": 1.0, "mem_total": -1.0}, None, None),
])
def test_memory_ratios_and_score(kw: dict[str, float | None], used: float | None, score: float | None) -> None:
    p = classify_gpu(_stats(util_mean=0.5, util_std=0.01, util_p95=0.52, **kw))
    assert p.mem_used_ratio == (None if used is None else pytest.approx(used))
    assert p.score == (None if score is None else pytest.approx(score, abs=1e-4))


@pytest.mark.parametrize(("step", "window", "holders", "held"), [
    (15.0, 1800.0, {"ml/a": 120.0, "ml/b": 108.0, "ml/c": 107.9}, "ml/a,ml/b"),  # 90% of 120 scrapes
    (1.0, 600.0, {"ml/b": 540.0, "ml/a": 600.0}, "ml/a,ml/b"),  # sorted; any positive step
    (30.0, 1800.0, {"ml/a": 54.0, "ml/b": 53.9}, "ml/a"),
    (15.0, 1800.0, {"ml/a": math.nan, "ml/b": math.inf}, None),  # counts that are not numbers
    (15.0, 1800.0, {"ml/a": 10.0}, None),
    (15.0, 1800.0, {}, None),
    (0.0, 1800.0, {"ml/a": 120.0}, None),  # no step: no count to compare with
])
def test_holder_for_the_whole_window(step: float, window: float, holders: dict[str, float], held: str | None) -> None:
    st = _stats(util_step=step, window_s=window, holders=holders)
    assert holder_all_window(st, TH) == held


def test_enough_samples_is_at_least_the_minimum_and_any_in_the_older_half() -> None:
    assert classify_gpu(_stats(util_count=20.0)).pattern == STEADY  # min_samples 20: at least
    assert classify_gpu(_stats(util_count=19.0)).pattern == UNKNOWN
    assert classify_gpu(_stats(util_early=1.0)).pattern == STEADY  # one sample in the older half will do
    assert classify_gpu(_stats(util_early=0.0)).pattern == UNKNOWN


def test_utilisation_is_reported_as_a_ratio_clamped_to_one() -> None:
    p = classify_gpu(_stats(util_mean=1.04, util_std=0.01, util_p95=1.05))  # rate() over a counter can overshoot
    assert p.util_mean == 1.0 and p.score == pytest.approx(0.6 * 0.5)


def test_node_idle_rule_is_strictly_below_both_thresholds() -> None:
    def prof(util: float, mem: float) -> GpuProfile:
        return GpuProfile(IDLE, util_mean=util, mem_used_ratio=mem)

    assert is_idle_for_node(prof(0.29, 0.49), TH)
    assert not is_idle_for_node(prof(0.30, 0.2), TH) and not is_idle_for_node(prof(0.1, 0.50), TH)


_RNG = random.Random(1)
BURSTY_RANGE = [_RNG.choice([0.05, 0.95]) for _ in range(121)]  # as in test_classify_gpu_decisions_and_unknowns
LEAK = [10 * GIB + 0.003 * 80 * GIB * i for i in range(31)]
IDLE_NOW = {"util_mean": 0.01, "util_std": 0.01, "util_p95": 0.03}


@pytest.mark.parametrize(("kw", "pattern", "reason"), [
    ({"up": 0.0}, UNKNOWN, "the exporter reports the GPU down (gpu_up 0)"),
    ({"util_count": 10.0}, UNKNOWN, "not enough utilisation samples in the window"),
    ({"util_fresh": 0.0}, UNKNOWN, "no recent utilisation sample"),
    (IDLE_NOW, IDLE, "mean utilisation 0.010"),
    ({**IDLE_NOW, "holders": {"ml/b": 120.0, "ml/a": 119.0}}, ALLOCATED_IDLE,
     "mean utilisation 0.010, held by ml/a,ml/b"),
    ({"util_std": 0.05}, STEADY, "coefficient of variation 0.10"),
    ({"util_mean": 0.9, "util_std": 0.05, "util_p95": 0.95, "sm_mean": 0.1, "sm_count": 120.0}, UNDERUSED,
     "mean utilisation 0.900, mean SM activity 0.100"),
    ({"util_std": 0.45, "util_range": None}, UNKNOWN, "utilisation range missing"),
    ({"util_std": 0.45, "util_range": [0.5, None, None, None, None] * 24}, UNKNOWN,
     "too many gaps in the utilisation range"),
    ({"util_std": 0.45, "util_range": BURSTY_RANGE}, BURSTY,
     "coefficient of variation 0.90, no period"),
    # 31 rising points: S = 465 pairs, var = 31 x 30 x 67 / 18, z = (S - 1) / sd
    ({"mem_range": LEAK}, GROWING,
     f"memory +{0.003 * 80 * GIB / 60:.0f} B/s, Mann-Kendall z={464 / math.sqrt(31 * 30 * 67 / 18):.1f}"),
])
def test_every_decision_says_why_and_carries_the_measurements(kw: dict[str, object], pattern: str, reason: str) -> None:
    """Whatever the pattern (unknown included), the profile explains itself and keeps the
    window's utilisation, memory ratio and score for the node's statistics."""
    p = classify_gpu(_stats(mem_free_mean=40 * GIB, **kw))
    assert (p.pattern, p.reason) == (pattern, reason)
    assert p.util_mean == pytest.approx(kw.get("util_mean", 0.5)) and p.mem_used_ratio == pytest.approx(0.5)
    assert p.score == pytest.approx(round(availability_score(0.5, float(kw.get("util_mean", 0.5))), 4))
    assert p.holder == ("ml/a,ml/b" if pattern == ALLOCATED_IDLE else None)


@pytest.mark.parametrize(("fresh", "growing"), [(None, True), (1.0, True), (0.0, False), (math.nan, False)])
def test_growth_needs_a_recent_memory_sample(fresh: float | None, growing: bool) -> None:
    """Memory history without a recent sample (None: not asked) is not the GPU's state now."""
    p = classify_gpu(_stats(mem_range=LEAK, mem_fresh=fresh))
    assert (p.pattern == GROWING) == growing


def test_growth_is_found_across_a_gap_in_the_memory_range() -> None:
    gappy: list[float | None] = list(LEAK)
    gappy[10] = gappy[11] = None
    assert classify_gpu(_stats(mem_range=gappy)).pattern == GROWING


def test_one_recent_utilisation_sample_is_enough() -> None:
    assert classify_gpu(_stats(util_fresh=1.0)).pattern == STEADY


def test_idle_is_strictly_below_both_idle_thresholds() -> None:
    """idle: mean < 0.05 and p95 < 0.10 (Thresholds); exactly at either is not idle."""
    assert classify_gpu(_stats(util_mean=0.049, util_std=0.001, util_p95=0.099)).pattern == IDLE
    assert classify_gpu(_stats(util_mean=0.05, util_std=0.001, util_p95=0.06)).pattern == STEADY
    assert classify_gpu(_stats(util_mean=0.04, util_std=0.001, util_p95=0.10)).pattern == STEADY


def test_a_periodic_decision_names_its_autocorrelation_and_bound() -> None:
    series = _sine(121, 8.0)
    p = classify_gpu(_stats(util_std=0.28, util_range=series, mem_free_mean=40 * GIB))
    pr = detect_period(series)
    assert pr is not None and p.pattern == PERIODIC
    assert p.reason == f"autocorrelation {pr.peak:.2f} > bound {pr.bound:.2f}"
    assert (p.util_mean, p.mem_used_ratio) == (0.5, 0.5) and p.score == pytest.approx(0.5)


@pytest.mark.parametrize(("th", "period"), [
    (Thresholds(), 120.0),  # 8 steps of 15 s
    (Thresholds(acf_z=50.0), None),  # the significance the thresholds ask for is the one used
    (Thresholds(min_cycles=16), None),  # 8 steps do not fit 16 times into 121
    (Thresholds(min_period_steps=9), 240.0),  # 8 steps is shorter than asked for: its double is the period
])
def test_period_detection_takes_the_thresholds(th: Thresholds, period: float | None) -> None:
    p = classify_gpu(_stats(util_std=0.28, util_range=_sine(121, 8.0)), th)
    assert p.period_seconds == (None if period is None else pytest.approx(period, rel=0.05)), p


@pytest.mark.parametrize(("kw", "underused"), [
    ({"sm_mean": 0.1, "sm_count": 20.0}, True),  # min_samples: at least
    ({"sm_mean": 0.1, "sm_count": 19.0}, False),
    ({"sm_mean": 0.1, "sm_count": None}, False),  # SM activity without its count: not trusted
    ({"sm_mean": None, "sm_count": 120.0}, False),
    ({"sm_mean": 0.2, "sm_count": 120.0}, False),  # below 0.2, strictly
    ({"sm_mean": 0.1, "sm_count": 120.0, "util_mean": 0.8}, True),  # utilisation at least 0.8
    ({"sm_mean": 0.1, "sm_count": 120.0, "util_mean": 0.79}, False),
])
def test_underused_thresholds(kw: dict[str, float | None], underused: bool) -> None:
    p = classify_gpu(_stats(**{"util_mean": 0.9, "util_std": 0.05, "util_p95": 0.95, **kw}))
    assert (p.pattern == UNDERUSED) == underused, p


def test_steady_is_strictly_below_its_coefficient_of_variation() -> None:
    assert classify_gpu(_stats(util_mean=0.5, util_std=0.124)).pattern == STEADY
    assert classify_gpu(_stats(util_mean=0.5, util_std=0.125, util_range=None)).pattern == UNKNOWN  # cv 0.25


def test_a_zero_mean_that_is_not_idle_is_not_steady() -> None:
    """With the idle test switched off, a mean of 0 has no coefficient of variation: never steady."""
    th = Thresholds(idle_util_mean=0.0, idle_util_p95=0.0)
    flat = [0.0] * 121
    assert classify_gpu(_stats(util_mean=0.0, util_std=0.0, util_p95=0.0, util_range=flat), th).pattern == BURSTY


def test_the_utilisation_range_may_have_gaps_and_needs_the_minimum_points() -> None:
    series: list[float | None] = list(_sine(121, 8.0))
    series[30] = series[31] = None
    assert classify_gpu(_stats(util_std=0.28, util_range=series)).pattern == PERIODIC
    bursty = [0.05, 0.95, 0.95, 0.05, 0.95] * 4  # exactly min_samples (20) points
    assert classify_gpu(_stats(util_std=0.45, util_range=bursty)).pattern == BURSTY
    assert classify_gpu(_stats(util_std=0.45, util_range=bursty[:19])).pattern == UNKNOWN


def test_theil_sen_mann_kendall_small_series_and_units() -> None:
    assert theil_sen_mann_kendall([0.0, 1.0, 2.0]) == (1.0, pytest.approx(2 / math.sqrt(3 * 2 * 11 / 18)))  # per step
    assert theil_sen_mann_kendall([0.0, 1.0, 2.0], step=60.0)[0] == pytest.approx(1 / 60)  # per second
    assert theil_sen_mann_kendall([5.0, 6.0]) == (0.0, 0.0)  # fewer than 3 points: no trend
    assert theil_sen_mann_kendall([]) == (0.0, 0.0)


def test_detect_growth_needs_ten_points_and_a_memory_total() -> None:
    rise = [float(i) for i in range(10)]
    assert detect_growth(rise, 60.0, 100.0, 600.0, TH) is not None  # 10 points will do
    assert detect_growth(rise[:9], 60.0, 100.0, 600.0, TH) is None
    assert detect_growth(rise, 60.0, 0.0, 600.0, TH) is None  # no total: no fraction of it
    assert detect_growth(rise, 1.0, 1.0, 600.0, TH) is not None  # any positive total


def test_detect_growth_rise_of_exactly_the_minimum_fraction_counts() -> None:
    """slope x window >= growth_min_fraction x total: 1 B/s over 30 s is exactly 1% of 3000 B."""
    rise = [float(i) for i in range(31)]
    assert detect_growth(rise, 1.0, 3000.0, 30.0, TH) is not None
    assert detect_growth(rise, 1.0, 3000.01, 30.0, TH) is None


@pytest.mark.parametrize("slow_half", ["first", "second"])
def test_detect_growth_compares_each_half_in_the_same_units(slow_half: str) -> None:
    """Each half's slope (per second, like the whole window's) must be at least 0.3 x the whole
    slope: 10 per step in one half and 1 per step in the other is one allocation, not a leak."""
    steep, slow = [10.0 * i for i in range(16)], [150.0 + (i + 1) for i in range(15)]
    ys = steep + slow if slow_half == "second" else [float(i) for i in range(16)] + [15.0 + 10.0 * (i + 1)
                                                                                       for i in range(15)]
    assert detect_growth(ys, 60.0, 1000.0, 1800.0, TH) is None


def _mann_kendall_reference(ys: list[float]) -> tuple[float, float]:
    """Theil-Sen slope and Mann-Kendall z straight from their definitions (Sen 1968; Kendall 1975,
    variance with the tie correction, continuity-corrected z)."""
    n = len(ys)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    slopes = sorted((ys[j] - ys[i]) / (j - i) for i, j in pairs)
    m = len(slopes)
    med = slopes[m // 2] if m % 2 else (slopes[m // 2 - 1] + slopes[m // 2]) / 2
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i, j in pairs)
    ties = [ys.count(v) for v in set(ys)]
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18
    if var <= 0:
        return med, 0.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    return med, z


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-4, max_value=4), min_size=3, max_size=25))
def test_theil_sen_mann_kendall_matches_the_definitions(ys: list[int]) -> None:
    """Small integers: many ties, flat stretches and falls, where the tie correction matters."""
    slope, z = _mann_kendall_reference([float(y) for y in ys])
    got = theil_sen_mann_kendall([float(y) for y in ys], step=2.0)
    assert got == (pytest.approx(slope / 2.0), pytest.approx(z))


def test_theil_sen_mann_kendall_of_a_constant_series_is_no_trend() -> None:
    assert theil_sen_mann_kendall([3.0] * 10) == (0.0, 0.0)  # every value tied: no variance at all


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.6, max_value=9.4), st.floats(min_value=0.01, max_value=10.0),
       st.floats(min_value=-5.0, max_value=5.0))
def test_interpolate_peak_finds_the_vertex_of_a_parabola(vertex: float, curvature: float, top: float) -> None:
    """Through a peak and its two neighbours, the parabola's vertex (within one step of the peak)."""
    from exporter.profiler.classify import _interpolate_peak, _peak_height

    r = [top - curvature * (x - vertex) ** 2 for x in range(11)]
    k = round(vertex)
    assert _interpolate_peak(r, k) == pytest.approx(vertex, abs=1e-6)
    assert _peak_height(r, k) == pytest.approx(top, abs=1e-6)  # the vertex's height, not r(k)
    assert _peak_height(r, 0) == r[0] and _peak_height(r, 10) == r[10]  # no neighbours: r(k) itself
    assert _peak_height([1.0, 0.0, 1.0], 1) == 0.0  # a valley: no parabola peak to take
    assert _peak_height([0.0, 1.0, 2.0], 1) == 1.0 and _peak_height([0.0, 0.0, 0.5], 1) == 0.0  # a line, a bend up


def test_interpolate_peak_keeps_the_lag_when_there_is_no_peak_to_fit() -> None:
    from exporter.profiler.classify import _interpolate_peak

    line = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _interpolate_peak(line, 2) == 2.0  # no curvature
    assert _interpolate_peak([1.0, 0.0, 1.0], 1) == 1.0  # a valley
    assert _interpolate_peak([0.0, 1.0, 0.5], 0) == 0.0 and _interpolate_peak([0.0, 1.0, 0.5], 2) == 2.0  # ends
    assert _interpolate_peak([1.0, 0.5, 0.0, 0.9], 0) == 0.0  # lag 0 has no left neighbour (not the last lag)
    at = [-(x - 2.0) ** 2 for x in range(7)]  # vertex exactly one step away: not this peak's
    assert _interpolate_peak(at, 3) == 3.0 and _interpolate_peak(at, 1) == 1.0
    far = [-(x - 1.5) ** 2 for x in range(7)]
    assert _interpolate_peak(far, 4) == 4.0  # 2.5 steps away


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-100.0, max_value=100.0), min_size=2, max_size=40),
       st.floats(min_value=-10.0, max_value=10.0), st.floats(min_value=-10.0, max_value=10.0))
def test_detrend_removes_exactly_the_least_squares_line(noise: list[float], a: float, b: float) -> None:
    """What is left has zero mean and zero slope, and adding a line to the input changes nothing."""
    n = len(noise)
    d = detrend(noise)
    tm = (n - 1) / 2
    assert sum(d) == pytest.approx(0.0, abs=1e-6)
    assert sum((i - tm) * v for i, v in enumerate(d)) == pytest.approx(0.0, abs=1e-5)
    assert detrend([v + a + b * i for i, v in enumerate(noise)]) == pytest.approx(d, abs=1e-6)
    assert detrend([5.0]) == [0.0] and detrend([]) == []


def test_autocorrelation_is_the_biased_estimate_normalised_at_lag_zero() -> None:
    x = [1.0, -2.0, 3.0, -1.0, -1.0]
    c0 = sum(v * v for v in x)
    want = [sum(x[i] * x[i + k] for i in range(len(x) - k)) / c0 for k in range(4)]
    assert autocorrelation(x, 3) == pytest.approx(want)
    assert autocorrelation([0.0] * 5, 2) == [0.0, 0.0, 0.0]  # constant (zero-mean) series


def _partial_leak(n: int, first: int, last: int) -> list[float]:
    """n memory points (60 s apart), flat but for a rise of 1 GiB a step from point ``first`` to ``last``."""
    return [10 * GIB + GIB * (min(max(i, first), last) - first) for i in range(n)]


@pytest.mark.parametrize(("n", "first", "last", "growing"), [
    # 31 points (a 30 min window at 60 s): the rise must be in both halves, which share the middle point
    (31, 9, 30, True),  # started 30% into the window: the first half still rises enough
    (31, 10, 30, False),  # started a third of the way in: most of the first half is flat
    (31, 0, 21, True),  # the mirror image: stopped 70% of the way through
    (31, 0, 20, False),
    # 30 points (an end point missing): the first half is points 0-15, the second 15-29
    (30, 9, 29, True),
    (30, 10, 29, False),
    (30, 0, 21, True),
    (30, 0, 20, False),
])
def test_detect_growth_wants_the_rise_in_both_halves_of_the_window(n: int, first: int, last: int,
                                                                   growing: bool) -> None:
    """A leak that ran for only part of the window: growing while each half's Theil-Sen slope is at
    least 0.3 x the whole window's (docs/profiler.md), whichever end of the window it is missing."""
    tr = detect_growth(_partial_leak(n, first, last), 60.0, 80 * GIB, 1800.0, TH)
    assert (tr is not None) == growing


def test_detect_growth_thresholds_are_inclusive() -> None:
    """Mann-Kendall z >= growth_z and each half's slope >= growth_half_ratio x the slope: a value exactly
    at its threshold counts, the next float above it does not."""
    ys = [0.0, 2.0, 1.0, 3.0, 5.0, 4.0, 6.0, 8.0, 7.0, 9.0, 11.0, 10.0]
    _, z = theil_sen_mann_kendall(ys)
    assert detect_growth(ys, 1.0, 1.0, 100.0, Thresholds(growth_z=z)) is not None
    assert detect_growth(ys, 1.0, 1.0, 100.0, Thresholds(growth_z=math.nextafter(z, math.inf))) is None
    line = [float(i) for i in range(31)]  # each half's slope is exactly the whole one's
    assert detect_growth(line, 1.0, 1.0, 100.0, Thresholds(growth_half_ratio=1.0)) is not None
    assert detect_growth(line, 1.0, 1.0, 100.0, Thresholds(growth_half_ratio=math.nextafter(1.0, 2.0))) is None


def _cycle(kind: str, n: int, period: float, phase: float, noise: float, seed: int,
           drift: float = 0.0) -> list[float]:
    """n samples of a workload repeating every ``period`` steps, plus Gaussian noise and a linear drift
    per step: a sine, a square wave (busy half the cycle) or two unequal bursts per cycle (0.95 for a
    fifth of it, 0.5 for another)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        f = (i / period + phase) % 1.0
        if kind == "sine":
            v = 0.5 + 0.4 * math.sin(2 * math.pi * f)
        elif kind == "square":
            v = 0.9 if f < 0.5 else 0.1
        else:
            v = 0.95 if f < 0.2 else 0.5 if 0.5 <= f < 0.7 else 0.05
        out.append(v + rng.gauss(0, noise) + drift * i)
    return out


@pytest.mark.parametrize(("kind", "n", "period", "phase", "noise", "seed", "drift"), [
    ("square", 24, 3.0, 0.868, 0.2, 107570, 0.0),  # the shortest period, 8 cycles, heavy noise
    ("sine", 45, 4.689, 0.190, 0.1, 710687, 0.0),  # a fractional period in a short window
    ("two", 45, 4.0, 0.659, 0.3, 327125, 0.0),  # two unequal bursts per short cycle, heavy noise
    ("two", 91, 4.0, 0.045, 0.3, 277511, 0.0),
    ("two", 91, 6.0, 0.323, 0.02, 362831, 0.0),  # ... the lag-3 half period is the weaker: not the period
    ("sine", 91, 8.862, 0.634, 0.3, 27299, -0.00255),  # drifting down
    ("sine", 121, 17.780, 0.023, 0.3, 270619, 0.0),
    ("sine", 181, 30.090, 0.429, 0.3, 802693, 0.0),
    ("sine", 241, 35.206, 0.546, 0.3, 28223, 0.0),  # long periods near the 4-cycle limit, heavy noise
    ("sine", 241, 54.598, 0.332, 0.3, 398343, 0.0),
])
def test_detect_period_finds_noisy_and_short_cycles_within_10_percent(kind: str, n: int, period: float, phase: float,
                                                                     noise: float, seed: int, drift: float) -> None:
    """The period an operator reads is within the 10% the profiler holds it to (its dead band), also
    where noise puts wiggles and false maxima on the autocorrelation peaks."""
    r = detect_period(_cycle(kind, n, period, phase, noise, seed, drift))
    assert r is not None and abs(r.period_steps - period) <= 0.1 * period, r


@pytest.mark.parametrize(("shortest", "longest", "mean_error"), [
    (4.0, 12.0, 0.002),  # 5 to 15 repeats inside the autocorrelation (lags up to N/2 = 60)
    (20.0, 29.0, 0.008),  # 2 repeats: refined from the second
])
def test_detect_period_is_refined_from_the_farthest_repeat(shortest: float, longest: float, mean_error: float) -> None:
    """A period is rarely a whole number of steps: its peak's position is interpolated, and taken from the
    farthest repeat and divided by the repeat number, which divides the error too (docs/profiler.md).
    Over clean sines with periods every 0.2 step, the mean error stays well below what the peak nearest
    lag 0 alone gives (0.30% and 0.98% here; 0.07% and 0.66% refined)."""
    periods = [shortest + 0.2 * i for i in range(round((longest - shortest) / 0.2) + 1)]
    errors = []
    for period in periods:
        r = detect_period(_cycle("sine", 121, period, 0.3, 0.0, 0))
        assert r is not None
        errors.append(abs(r.period_steps - period) / period)
    assert max(errors) < 0.02 and sum(errors) / len(errors) < mean_error


def _on_off(n: int, stay: float, seed: int) -> list[float]:
    """A bursty GPU: busy or idle for random stretches (each step keeps its state with probability ``stay``)."""
    rng = random.Random(seed)
    on, out = False, []
    for _ in range(n):
        if rng.random() > stay:
            on = not on
        out.append((0.9 if on else 0.05) + rng.gauss(0, 0.03))
    return out


def test_detect_period_does_not_call_random_bursts_periodic() -> None:
    """A long busy stretch correlates with itself at the lag of the next one by chance; only a peak that
    repeats at twice its lag, and stays correlated at every further multiple, is a period. 900 random
    on/off series with dwell times of 5 to 20 steps: at most two called periodic (docs/profiler.md: about
    0.3% of bursty series)."""
    hits = [(stay, seed) for stay in (0.8, 0.9, 0.95) for seed in range(300)
            if detect_period(_on_off(121, stay, seed)) is not None]
    assert len(hits) <= 2, hits


def test_detect_period_searches_series_of_min_cycles_times_min_period_steps_points() -> None:
    """A period must fit min_cycles (4) times into the series and last min_period_steps (3): 12 points are
    the fewest searched. At z = 1 (at 12 points z = 3 puts the bound above any correlation) a cycle just
    under 3 steps is found in 12 points, and nothing in 11."""
    xs = [0.5 + 0.4 * math.cos(2 * math.pi * i / 2.95) for i in range(12)]
    r = detect_period(xs, z=1.0)
    assert r is not None and r.period_steps == pytest.approx(2.95, rel=0.1)
    assert detect_period(xs[:11], z=1.0) is None


def _z_for_bound(bound: float, n: int) -> float:
    """The z whose white-noise bound z/sqrt(n) is exactly ``bound`` (to the last bit)."""
    z = bound * math.sqrt(n)
    for _ in range(64):
        if z / math.sqrt(n) == bound:
            return z
        z = math.nextafter(z, math.inf if z / math.sqrt(n) < bound else -math.inf)
    raise AssertionError(f"no z gives the bound {bound!r} at n={n}")


def test_the_repeat_at_twice_the_period_must_be_above_the_bound() -> None:
    """docs/profiler.md: the peak must repeat near twice the period above the bound z/sqrt(N), strictly:
    a sine of 10 steps whose lag-20 correlation is exactly the bound has no period; just above, it has."""
    xs = _sine(121, 10.0, phase=0.0)
    r = autocorrelation(detrend(xs), 60)
    assert max(range(18, 23), key=r.__getitem__) == 20 and r[20] < r[10]  # the repeat, lower than the peak
    z = _z_for_bound(r[20], 121)
    assert detect_period(xs, z=z) is None
    found = detect_period(xs, z=math.nextafter(z, 0.0))
    assert found is not None and found.period_steps == pytest.approx(10.0, rel=0.01)
