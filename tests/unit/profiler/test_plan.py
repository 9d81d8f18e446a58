"""Annotation planning (pure): hysteresis, dead bands, owned keys, foreign keys, sizes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.profiler.classify import BURSTY, GROWING, IDLE, PERIODIC, STEADY, UNKNOWN, GpuProfile
from exporter.profiler.plan import (
    GpuInput,
    PlanConfig,
    annotation_bytes,
    diff,
    format_pending,
    parse_pending,
    plan_node,
    valid_prefix,
)

P = "gpu-exporter.io/"
CFG = PlanConfig()


def gpu(pattern: str, util: float = 0.5, mem: float = 0.5, score: float | None = None,
        period: float | None = None, growth: float | None = None, uuid: str = "") -> GpuInput:
    sc = score if score is not None else round(0.6 * (1 - mem) + 0.4 * (1 - util), 4)
    return GpuInput(uuid, GpuProfile(pattern, period_seconds=period, growth_bytes_per_second=growth,
                                     util_mean=util, mem_used_ratio=mem, score=sc))


def apply(current: dict[str, str], gpus: dict[str, GpuInput], cfg: PlanConfig = CFG) -> tuple[dict, dict]:
    """One evaluation: (merge patch annotations, node annotations afterwards)."""
    desired = plan_node(current, gpus, cfg)
    patch = diff(current, desired, cfg.prefix)
    after = {k: v for k, v in {**current, **patch}.items() if v is not None}
    return patch, after


def test_first_evaluation_writes_everything_at_once() -> None:
    patch, after = apply({}, {"0": gpu(STEADY, uuid="GPU-a"), "1": gpu(IDLE, util=0.01, mem=0.0)})
    assert patch == {
        P + "gpu-0.pattern": "steady",
        P + "gpu-0.uuid": "GPU-a",
        P + "gpu-1.pattern": "idle",
        P + "pattern": "steady",  # tie: the more actionable wins
        P + "idle-gpus": "1",
        P + "best-gpu": "1",
        P + "best-gpu-score": "1.00",
        P + "owned-keys": "best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern,gpu-0.uuid,gpu-1.pattern",
    }
    # the same data again: nothing to write
    assert apply(after, {"0": gpu(STEADY, uuid="GPU-a"), "1": gpu(IDLE, util=0.01, mem=0.0)})[0] == {}


def test_hysteresis_needs_k_consecutive_evaluations() -> None:
    _, a = apply({}, {"0": gpu(STEADY)})
    p1, a = apply(a, {"0": gpu(BURSTY)})
    assert p1 == {P + "pending": "gpu-0.pattern=bursty:1",
                  P + "owned-keys": "best-gpu,best-gpu-score,idle-gpus,pattern,pending,gpu-0.pattern"}
    assert a[P + "gpu-0.pattern"] == "steady"
    p2, a = apply(a, {"0": gpu(BURSTY)})
    assert p2 == {P + "gpu-0.pattern": "bursty", P + "pattern": "bursty", P + "pending": None,
                  P + "owned-keys": "best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern"}


def test_hysteresis_resets_when_the_candidate_flaps() -> None:
    _, a = apply({}, {"0": gpu(STEADY)})
    _, a = apply(a, {"0": gpu(BURSTY)})
    _, a = apply(a, {"0": gpu(PERIODIC, period=60)})  # a different candidate restarts the count
    assert a[P + "pending"] == "gpu-0.pattern=periodic:1" and a[P + "gpu-0.pattern"] == "steady"
    p, a = apply(a, {"0": gpu(STEADY)})  # back to the published value: pending dropped
    assert p == {P + "pending": None, P + "owned-keys": "best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern"}


@pytest.mark.parametrize("k", [1, 3])
def test_hysteresis_k_is_configurable(k: int) -> None:
    cfg = PlanConfig(hysteresis=k)
    _, a = apply({}, {"0": gpu(STEADY)}, cfg)
    for _ in range(k - 1):
        _, a = apply(a, {"0": gpu(BURSTY)}, cfg)
        assert a[P + "gpu-0.pattern"] == "steady"
    _, a = apply(a, {"0": gpu(BURSTY)}, cfg)
    assert a[P + "gpu-0.pattern"] == "bursty"


def test_unknown_is_replaced_at_once_but_reached_only_through_hysteresis() -> None:
    _, a = apply({}, {"0": gpu(UNKNOWN)})
    _, a = apply(a, {"0": gpu(STEADY)})
    assert a[P + "gpu-0.pattern"] == "steady"  # filling a gap is not a flap
    _, a = apply(a, {"0": gpu(UNKNOWN)})
    assert a[P + "gpu-0.pattern"] == "steady"  # one bad evaluation changes nothing published


def test_period_and_growth_numbers_and_their_dead_bands() -> None:
    _, a = apply({}, {"0": gpu(PERIODIC, period=61.7), "1": gpu(GROWING, growth=1_000_000.4)})
    assert a[P + "gpu-0.period-seconds"] == "62"
    assert a[P + "gpu-1.memory-growth-bytes-per-second"] == "1000000"
    # inside the dead bands (10% period, 25% growth): no write
    assert apply(a, {"0": gpu(PERIODIC, period=66.0), "1": gpu(GROWING, growth=1_200_000)})[0] == {}
    p, a = apply(a, {"0": gpu(PERIODIC, period=90.0), "1": gpu(GROWING, growth=2_000_000)})
    assert p == {P + "gpu-0.period-seconds": "90", P + "gpu-1.memory-growth-bytes-per-second": "2000000"}
    # the pattern changes: its number goes with it (after the hysteresis)
    _, a = apply(a, {"0": gpu(STEADY), "1": gpu(GROWING, growth=2_000_000)})
    assert a[P + "gpu-0.period-seconds"] == "90"  # held with its pattern
    p, a = apply(a, {"0": gpu(STEADY), "1": gpu(GROWING, growth=2_000_000)})
    assert p[P + "gpu-0.period-seconds"] is None and a[P + "gpu-0.pattern"] == "steady"


@pytest.mark.parametrize(("cfg", "period_band", "growth_band"), [
    (CFG, 0.10, 0.25), (PlanConfig(period_deadband=0.02, growth_deadband=0.5), 0.02, 0.5)])
def test_relative_dead_bands_hold_inside_and_write_outside(cfg: PlanConfig, period_band: float,
                                                           growth_band: float) -> None:
    """A published number is kept while the new one is within the relative dead band of it, in
    either direction, and replaced as soon as it is outside (bands: the config's, 10% and 25% by
    default); the band scales with the published value, it is not an absolute distance."""
    for period0, growth0 in ((100.0, 1_000_000.0), (5000.0, 40_000_000.0)):
        _, a = apply({}, {"0": gpu(PERIODIC, period=period0), "1": gpu(GROWING, growth=growth0)}, cfg)
        for side in (1, -1):
            inside = {"0": gpu(PERIODIC, period=period0 * (1 + side * period_band * 0.9)),
                      "1": gpu(GROWING, growth=growth0 * (1 + side * growth_band * 0.9))}
            assert apply(a, inside, cfg)[0] == {}, f"rewrote inside the band ({side=}, {period0=})"
            period, growth = period0 * (1 + side * period_band * 1.1), growth0 * (1 + side * growth_band * 1.1)
            p, _ = apply(a, {"0": gpu(PERIODIC, period=period), "1": gpu(GROWING, growth=growth)}, cfg)
            assert p == {P + "gpu-0.period-seconds": f"{period:.0f}",
                         P + "gpu-1.memory-growth-bytes-per-second": f"{growth:.0f}"}, f"{side=}, {period0=}"


def test_a_number_moved_by_exactly_its_dead_band() -> None:
    """At exactly the band (docs/profiler.md, dead bands): a period or growth rate is kept (it is
    rewritten once it moves by more than 10% or 25%), the score is rewritten (it moves by 0.05 or more)."""
    _, a = apply({}, {"0": gpu(PERIODIC, period=100.0), "1": gpu(GROWING, growth=1_000_000.0)})
    assert apply(a, {"0": gpu(PERIODIC, period=110.0), "1": gpu(GROWING, growth=1_250_000.0)})[0] == {}
    p, _ = apply(a, {"0": gpu(PERIODIC, period=110.001), "1": gpu(GROWING, growth=1_250_001.0)})
    assert p == {P + "gpu-0.period-seconds": "110", P + "gpu-1.memory-growth-bytes-per-second": "1250001"}
    cfg = PlanConfig(score_deadband=0.25)  # a band that is exact in binary: 0.75 - 0.5 == 0.25
    _, a = apply({}, {"0": gpu(STEADY, score=0.5)}, cfg)
    assert apply(a, {"0": gpu(STEADY, score=0.74)}, cfg)[0] == {}
    assert apply(a, {"0": gpu(STEADY, score=0.75)}, cfg)[0] == {P + "best-gpu-score": "0.75"}


def test_a_held_allocated_idle_pattern_keeps_its_holder() -> None:
    """While the hysteresis holds allocated-idle (the pod just went), the holder stays with it."""
    held_by = GpuInput("GPU-a", GpuProfile("allocated-idle", util_mean=0.0, mem_used_ratio=0.0, score=1.0,
                                           holder="ml/notebook"))
    _, a = apply({}, {"0": held_by})
    assert a[P + "gpu-0.holder"] == "ml/notebook"
    p, a = apply(a, {"0": gpu(IDLE, util=0.0, mem=0.0)})
    assert a[P + "gpu-0.pattern"] == "allocated-idle" and a[P + "gpu-0.holder"] == "ml/notebook", p
    _, a = apply(a, {"0": gpu(IDLE, util=0.0, mem=0.0)})
    assert a[P + "gpu-0.pattern"] == "idle" and P + "gpu-0.holder" not in a


def test_a_pending_record_we_do_not_own_never_counts() -> None:
    """Our prefix's ``pending`` only counts when owned-keys lists it: a hand-written one cannot
    cut the hysteresis short."""
    _, a = apply({}, {"0": gpu(STEADY)})
    assert P + "pending" not in a[P + "owned-keys"].split(",")
    forged = {**a, P + "pending": "gpu-0.pattern=bursty:1"}
    _, after = apply(forged, {"0": gpu(BURSTY)})
    assert after[P + "gpu-0.pattern"] == "steady", "one evaluation changed the pattern"


def test_a_pattern_the_profiler_does_not_know_is_written_unknown() -> None:
    _, a = apply({}, {"0": GpuInput("", GpuProfile("STEADY", util_mean=0.5, mem_used_ratio=0.5, score=0.5))})
    assert a[P + "gpu-0.pattern"] == "unknown" and a[P + "pattern"] == "unknown"


def test_best_gpu_and_score_dead_band() -> None:
    _, a = apply({}, {"0": gpu(STEADY, score=0.50), "1": gpu(STEADY, score=0.52)})
    assert (a[P + "best-gpu"], a[P + "best-gpu-score"]) == ("1", "0.52")
    # GPU 0 overtakes by less than the dead band: keep GPU 1 and its published score
    assert apply(a, {"0": gpu(STEADY, score=0.55), "1": gpu(STEADY, score=0.51)})[0] == {}
    p, a = apply(a, {"0": gpu(STEADY, score=0.70), "1": gpu(STEADY, score=0.51)})
    assert p == {P + "best-gpu": "0", P + "best-gpu-score": "0.70"}
    p, _ = apply(a, {"0": gpu(STEADY, score=0.60), "1": gpu(STEADY, score=0.51)})
    assert p == {P + "best-gpu-score": "0.60"}


def test_idle_count_uses_the_node_rule_and_hysteresis() -> None:
    gpus = {"0": gpu(STEADY, util=0.2, mem=0.4), "1": gpu(STEADY, util=0.2, mem=0.6), "2": gpu(BURSTY, util=0.9)}
    _, a = apply({}, gpus)
    assert a[P + "idle-gpus"] == "1"  # only GPU 0: util < 30% and memory < 50%
    gpus["2"] = gpu(BURSTY, util=0.1, mem=0.1)
    _, a = apply(a, gpus)
    assert a[P + "idle-gpus"] == "1" and a[P + "pending"] == "idle-gpus=2:1"
    _, a = apply(a, gpus)
    assert a[P + "idle-gpus"] == "2" and P + "pending" not in a


def test_foreign_keys_are_never_touched() -> None:
    foreign = {
        "example.com/team": "ml",
        "gpu-exporter.io/note": "set by a person",  # our prefix but not in our record
        "profile.gpu-exporter.io/pattern": "x",
        "gpu-exporter.io.old/pattern": "y",
        "gpu-exporter.iox/pattern": "z",
        "nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX",
    }
    _, a = apply(dict(foreign), {"0": gpu(STEADY), "1": gpu(IDLE)})
    for _ in range(3):
        patch, a = apply(a, {"0": gpu(BURSTY)})  # GPU 1 vanished, GPU 0 changes
        assert not set(patch) & set(foreign)
    assert {k: a[k] for k in foreign} == foreign


def test_keys_of_a_vanished_gpu_are_removed_at_once() -> None:
    _, a = apply({}, {"0": gpu(STEADY, uuid="GPU-a"), "1": gpu(PERIODIC, period=60, uuid="GPU-b")})
    patch, a = apply(a, {"0": gpu(STEADY, uuid="GPU-a")})
    assert {k for k, v in patch.items() if v is None} == {
        P + "gpu-1.pattern", P + "gpu-1.uuid", P + "gpu-1.period-seconds"}
    assert not any(k.startswith(P + "gpu-1") for k in a)
    assert a[P + "owned-keys"] == "best-gpu,best-gpu-score,idle-gpus,pattern,gpu-0.pattern,gpu-0.uuid"


def test_node_without_data_turns_unknown_and_drops_its_statistics() -> None:
    _, a = apply({"other/x": "1"}, {"0": gpu(STEADY, uuid="GPU-a"), "1": gpu(PERIODIC, period=60)})
    _, a = apply(a, {})
    assert a[P + "gpu-0.pattern"] == "steady"  # first evaluation without data: held
    _, a = apply(a, {})
    assert a == {
        "other/x": "1",
        P + "gpu-0.pattern": "unknown",
        P + "gpu-0.uuid": "GPU-a",
        P + "gpu-1.pattern": "unknown",
        P + "pattern": "unknown",
        P + "owned-keys": "pattern,gpu-0.pattern,gpu-0.uuid,gpu-1.pattern",
    }
    assert apply(a, {})[0] == {}  # and stays quiet


def test_lost_record_means_nothing_is_removed() -> None:
    _, a = apply({}, {"0": gpu(STEADY), "1": gpu(STEADY)})
    del a[P + "owned-keys"]
    patch, _ = apply(a, {"0": gpu(STEADY)})
    assert all(v is not None for v in patch.values())  # without the record we delete nothing


def test_eight_gpus_fit_in_4_kib_and_values_are_plain() -> None:
    gpus = {str(i): gpu(GROWING, growth=123_456_789.0, uuid=f"GPU-{i:08x}-1234-5678-9abc-def012345678")
            for i in range(8)}
    _, a = apply({}, gpus)
    _, a = apply(a, {str(i): gpu(PERIODIC, period=300, uuid=f"GPU-{i:08x}-1234-5678-9abc-def012345678")
                     for i in range(8)})  # worst case: everything pending too
    assert P + "pending" in a
    assert annotation_bytes(a, "gpu-exporter.io") < 4096
    for k, v in a.items():
        name = k.split("/", 1)[1]
        assert len(name) <= 63 and all(c.isalnum() or c in "-_." for c in name)
        assert "{" not in v and "'" not in v and "(" not in v  # no repr, no JSON


def test_pending_round_trip_and_junk() -> None:
    pend = {"gpu-0.pattern": ("bursty", 1), "idle-gpus": ("3", 2)}
    assert parse_pending(format_pending(pend)) == pend
    assert parse_pending("garbage,,x=1,y=:2,gpu-1.pattern=idle:1") == {"gpu-1.pattern": ("idle", 1)}
    assert parse_pending(None) == {}


def test_pending_counts_are_ascii_and_bounded() -> None:
    # '²'.isdigit() is true but int('²') fails; int() refuses 4,300+ digits
    assert parse_pending("gpu-0.pattern=idle:²,idle-gpus=3:" + "9" * 5000 + ",gpu-1.pattern=steady:٣") == {}
    assert parse_pending("gpu-0.pattern=idle:007") == {}  # not as we write it


@pytest.mark.parametrize(("name", "garbage"), [
    ("gpu-0.pattern", "STEADY"), ("gpu-0.pattern", ""), ("gpu-0.pattern", "unknown "),
    ("pattern", "x"), ("idle-gpus", "007"), ("idle-gpus", "-1"), ("idle-gpus", "²"),
    ("best-gpu-score", "nan"), ("best-gpu-score", "1e999"), ("best-gpu-score", "1.5"), ("best-gpu-score", "0x1"),
    ("best-gpu", "../x"),
])
def test_garbage_published_values_are_replaced_at_once(name: str, garbage: str) -> None:
    gpus = {"0": gpu(STEADY, util=0.1, mem=0.1)}
    _, good = apply({}, gpus)
    tampered = {**good, P + name: garbage}
    patch, after = apply(tampered, gpus)  # one evaluation, not held by the hysteresis
    assert after == good and P + "pending" not in patch


@pytest.mark.parametrize("garbage", ["nan", "inf", "1_000", "٣", "1e3", "", "9" * 400])  # 400 digits: float() says inf
def test_garbage_pattern_numbers_are_not_kept(garbage: str) -> None:
    _, good = apply({}, {"0": gpu(PERIODIC, period=60.0)})
    tampered = {**good, P + "gpu-0.period-seconds": garbage}
    # replaced by the measured value (a published 60 would have stayed: 61 is inside its dead band)
    assert apply(tampered, {"0": gpu(PERIODIC, period=61.0)})[1] == {**good, P + "gpu-0.period-seconds": "61"}
    # held (no data for the node): a number is only ever carried over when it is one
    _, after = apply(tampered, {})
    assert after[P + "gpu-0.pattern"] == PERIODIC and P + "gpu-0.period-seconds" not in after


def test_node_without_data_turns_a_garbage_pattern_unknown() -> None:
    _, good = apply({}, {"0": gpu(STEADY)})
    _, after = apply({**good, P + "gpu-0.pattern": "x"}, {})
    assert after[P + "gpu-0.pattern"] == UNKNOWN and after[P + "pattern"] == UNKNOWN


def test_prefix_validation() -> None:
    assert valid_prefix("gpu-exporter.io") and valid_prefix("profiler.example.com")
    for bad in ("", "Upper.io", "with/slash", "-lead.io", "a" * 254):
        assert not valid_prefix(bad)
        with pytest.raises(ValueError):
            PlanConfig(prefix=bad)
    with pytest.raises(ValueError):
        PlanConfig(hysteresis=0)


# ---- issue 26: label text from Prometheus is checked before it reaches a Node ------------------

HOSTILE_UUIDS = ["GPU-1\nforged: yes", "GPU-\x1b[31mred", "x" * 65536, "GPU-a b", "", "GPU-é", "-GPU", "GPU-a\x00",
                 "GPU-" + "a" * 200, "GPU-a,b", "GPU-a\u2028b"]


@pytest.mark.parametrize("bad", HOSTILE_UUIDS)
def test_a_uuid_outside_its_grammar_is_not_written(bad: str) -> None:
    good = "GPU-5140a7ed-0000-4000-8000-000000000001"
    _, after = apply({}, {"0": gpu(STEADY, uuid=bad), "1": gpu(STEADY, uuid=good)})
    assert P + "gpu-0.uuid" not in after and after[P + "gpu-0.pattern"] == "steady"
    assert after[P + "gpu-1.uuid"] == good


@pytest.mark.parametrize("good", ["GPU-5140a7ed-0000-4000-8000-000000000001",
                                  "MIG-5140a7ed-0003-4000-8000-000000000002",
                                  "MIG-GPU-5140a7ed-0000-4000-8000-000000000001/1/0",
                                  "79ff738c-0000-1000-80cc-d55167a2124a", "GPU-8f6c"])
def test_real_uuids_are_written(good: str) -> None:
    _, after = apply({}, {"0": gpu(STEADY, uuid=good)})
    assert after[P + "gpu-0.uuid"] == good


def held(holder: str) -> GpuInput:
    return GpuInput("GPU-a", GpuProfile("allocated-idle", util_mean=0.0, mem_used_ratio=0.0, score=1.0, holder=holder))


@pytest.mark.parametrize(("holder", "written"), [
    ("ml/notebook-7f9c", "ml/notebook-7f9c"),
    ("ml/notebook\n-forged", None),
    ("ml/a,te\x1bam/b,team/c", "ml/a,team/c"),
    ("ML/Upper", None),  # namespaces and pod names are lower-case DNS names
    ("ml/" + "p" * 254, None),  # a pod name is at most 253 characters
    ("n" * 64 + "/pod", None),  # a namespace at most 63
    ("ml/pod/extra", None),
    ("/pod,ml/", None),
    ("ml/a.b-c,ml/-bad,ml/ok", "ml/a.b-c,ml/ok"),
])
def test_holders_outside_their_grammar_are_not_written(holder: str, written: str | None) -> None:
    _, after = apply({}, {"0": held(holder)})
    assert after[P + "gpu-0.pattern"] == "allocated-idle"
    assert after.get(P + "gpu-0.holder") == written


def test_gpus_per_node_are_capped_with_one_count_annotation() -> None:
    """3,000 fake GPU ids on one node gave one 321 KB patch of 6,005 keys (issue 26)."""
    gpus = {str(i): gpu(STEADY, uuid=f"GPU-5140a7ed-0000-4000-8000-{i:012d}") for i in range(3000)}
    patch, after = apply({}, gpus)
    patterns = sorted((k for k in after if k.endswith(".pattern")), key=lambda k: int(k.split("-")[-1].split(".")[0]))
    assert len(patterns) == 64 and patterns[-1] == P + "gpu-63.pattern"  # the lowest ids, deterministically
    assert after[P + "omitted-gpus"] == "2936"
    assert annotation_bytes(after, "gpu-exporter.io") <= CFG.max_annotation_bytes
    assert len(patch) <= 64 * 2 + 10
    _, after8 = apply({}, gpus, PlanConfig(max_gpus_per_node=8))
    assert sum(k.endswith(".pattern") for k in after8) == 8 and after8[P + "omitted-gpus"] == "2992"
    # back under the cap: the count goes, and so do the keys of GPUs no longer reported
    patch, again = apply(after, {str(i): gpus[str(i)] for i in range(4)})
    assert P + "omitted-gpus" not in again and sum(k.endswith(".pattern") for k in again) == 4


def test_worst_case_node_stays_under_the_documented_bound() -> None:
    """Every GPU allocated-idle with a full holder list, a long MIG uuid and a pending change,
    under a 253-character prefix: the node's keys and values stay within the byte bound."""
    prefix = ("a" * 62 + ".") * 4
    prefix = prefix[:253].rstrip(".")
    cfg = PlanConfig(prefix=prefix)
    holders = ",".join(f"{'n' * 60}{i}/{'p' * 250}{i:03d}" for i in range(3))
    gpus = {f"{i:020d}"[-20:].lstrip("0") or "0": GpuInput(
        f"MIG-GPU-5140a7ed-0000-4000-8000-{i:012d}/13/7",
        GpuProfile("allocated-idle", util_mean=0.0, mem_used_ratio=0.0, score=1.0, holder=holders))
        for i in range(200)}
    _, after = apply({}, gpus, cfg)
    _, after = apply(after, {g: GpuInput(x.uuid, GpuProfile("bursty", util_mean=0.5, mem_used_ratio=0.5, score=0.5))
                             for g, x in gpus.items()}, cfg)
    assert annotation_bytes(after, prefix) <= cfg.max_annotation_bytes
    assert int(after[prefix + "/omitted-gpus"]) > 0
    assert all(v.isprintable() for v in after.values())


def _annotated(after: dict[str, str]) -> list[int]:
    gpu_pattern = re.compile(re.escape(P) + r"gpu-(\d+)\.pattern")
    return sorted(int(m.group(1)) for k in after if (m := gpu_pattern.fullmatch(k)))


def test_the_byte_bound_leaves_out_the_highest_gpus_whole_and_counts_them() -> None:
    holders = ",".join(f"team-{i}/{'p' * 90}" for i in range(3))

    def gpus(pattern: str, n: int = 12) -> dict[str, GpuInput]:
        return {str(i): GpuInput(f"GPU-{i:04d}", GpuProfile(pattern, util_mean=0.0, mem_used_ratio=0.0, score=1.0,
                                                           holder=holders if pattern == "allocated-idle" else None))
                for i in range(n)}

    cfg = PlanConfig(max_annotation_bytes=2048)
    _, a = apply({}, gpus("allocated-idle"), cfg)
    kept = _annotated(a)
    n = len(kept)
    assert kept == list(range(n)) and 1 <= n <= 10, kept  # the lowest ids, at least two left out
    assert a[P + "omitted-gpus"] == str(12 - n)
    assert all(not k.startswith(f"{P}gpu-{i}.") for k in a for i in range(n, 12))
    assert annotation_bytes(a, cfg.prefix) <= 2048
    bigger = plan_node({}, gpus("allocated-idle", n + 1), PlanConfig(max_annotation_bytes=131072))
    assert annotation_bytes(bigger, cfg.prefix) > 2048, "one more GPU would have fitted"
    # a change pending for every GPU: recorded for the GPUs still annotated, and only for them
    _, b = apply(a, gpus("bursty"), cfg)
    shown = _annotated(b)
    assert shown and annotation_bytes(b, cfg.prefix) <= 2048
    assert set(parse_pending(b[P + "pending"])) == {f"gpu-{i}.pattern" for i in shown}
    assert b[P + "omitted-gpus"] == str(12 - len(shown))


def test_a_node_exactly_at_the_byte_bound_keeps_every_gpu() -> None:
    gpus = {str(i): gpu(STEADY, uuid=f"GPU-5140a7ed-0000-4000-8000-{i:012d}") for i in range(40)}
    size = annotation_bytes(plan_node({}, gpus, CFG), CFG.prefix)
    assert 2048 <= size < CFG.max_annotation_bytes
    _, after = apply({}, gpus, PlanConfig(max_annotation_bytes=size))
    assert len(_annotated(after)) == 40 and P + "omitted-gpus" not in after
    _, after = apply({}, gpus, PlanConfig(max_annotation_bytes=size - 1))
    assert after[P + "omitted-gpus"] == "1" and _annotated(after) == list(range(39))


def test_allocated_idle_count_and_best_gpu_among_the_annotated() -> None:
    ai = GpuInput("", GpuProfile("allocated-idle", util_mean=0.0, mem_used_ratio=0.0, score=0.3, holder="ml/a"))
    _, a = apply({}, {"0": ai, "1": ai, "2": gpu(STEADY, score=0.2)})
    assert a[P + "allocated-idle-gpus"] == "2"
    _, a = apply({}, {"0": gpu(STEADY, score=0.2)})
    assert P + "allocated-idle-gpus" not in a  # absent means none
    # the best GPU is one the node shows: GPU 1 (better) is beyond --max-gpus-per-node
    _, a = apply({}, {"0": gpu(STEADY, score=0.2), "1": gpu(STEADY, score=0.9)}, PlanConfig(max_gpus_per_node=1))
    assert a[P + "best-gpu"] == "0" and a[P + "best-gpu-score"] == "0.20"
    # a tie goes to the lowest GPU id, as numbers ("9" before "10")
    _, a = apply({}, {str(i): gpu(STEADY, score=0.5) for i in (10, 9, 11)})
    assert a[P + "best-gpu"] == "9"
    # a GPU without a score is never the best one
    unscored = GpuInput("", GpuProfile(STEADY, util_mean=0.5, mem_used_ratio=0.5, score=None))
    _, a = apply({}, {"0": unscored, "1": gpu(STEADY, score=0.1)})
    assert a[P + "best-gpu"] == "1"


def test_idle_count_needs_both_utilisation_and_memory() -> None:
    half = GpuInput("", GpuProfile(IDLE, util_mean=0.0, mem_used_ratio=None, score=None))
    _, a = apply({}, {"0": half})
    assert P + "idle-gpus" not in a  # nothing measured: no count, rather than a 0 that means "none idle"
    _, a = apply({}, {"0": half, "1": gpu(IDLE, util=0.0, mem=0.0)})
    assert a[P + "idle-gpus"] == "1"


def test_the_best_gpu_moves_only_when_another_is_better_by_more_than_the_band() -> None:
    cfg = PlanConfig(score_deadband=0.25)  # exact in binary
    _, a = apply({}, {"0": gpu(STEADY, score=0.5), "1": gpu(STEADY, score=0.25)}, cfg)
    assert a[P + "best-gpu"] == "0"
    assert apply(a, {"0": gpu(STEADY, score=0.5), "1": gpu(STEADY, score=0.75)}, cfg)[0] == {}
    p, _ = apply(a, {"0": gpu(STEADY, score=0.5), "1": gpu(STEADY, score=0.76)}, cfg)
    assert p == {P + "best-gpu": "1", P + "best-gpu-score": "0.76"}


def test_other_pending_candidates_are_kept_in_the_record() -> None:
    """The GPUHealthy condition's candidate (health.py) rides in the same pending record."""
    desired = plan_node({}, {"0": gpu(STEADY)}, CFG, extra_pending={"condition": ("False", 1)})
    assert parse_pending(desired[P + "pending"]) == {"condition": ("False", 1)}
    assert "pending" in desired[P + "owned-keys"].split(",")


# --- the small rules, one by one (what make mutation judges plan.py by) ------------------------


def test_bounded_holder_keeps_whole_entries_and_counts_the_rest() -> None:
    from exporter.profiler.plan import MAX_HOLDER_CHARS, bounded_holder

    assert bounded_holder(None) is None and bounded_holder("") is None
    assert bounded_holder("ns/a") == "ns/a"
    assert bounded_holder("ns/a,,ns/b,") == "ns/a,ns/b"  # empty entries dropped
    pods = [f"team/pod-{i:03d}" for i in range(40)]  # 12 characters each
    got = bounded_holder(",".join(pods))
    assert got is not None and len(got) <= MAX_HOLDER_CHARS
    kept, _, more = got.rpartition(",+")
    n = len(kept.split(","))
    assert kept.split(",") == pods[:n] and int(more) == 40 - n
    assert len(",".join(pods[: n + 1])) + len(f",+{40 - n - 1}") > MAX_HOLDER_CHARS, "one more would have fitted"
    # exactly at the bound: all kept, no counter
    fit = ",".join(["a/" + "p" * 78] * 4)[:MAX_HOLDER_CHARS]
    assert len(fit) <= MAX_HOLDER_CHARS and bounded_holder(fit) == fit
    # a first entry longer than the bound is cut (a hostile name), never dropped to nothing
    long = "ns/" + "x" * 400
    assert bounded_holder(long) == long[:MAX_HOLDER_CHARS]
    assert bounded_holder(long + ",ns/b") == long[:MAX_HOLDER_CHARS]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=150), min_size=1, max_size=12))
def test_bounded_holder_never_exceeds_the_bound_and_keeps_as_many_whole_entries_as_fit(sizes: list[int]) -> None:
    """Any list of holders: the result fits MAX_HOLDER_CHARS with its ``,+N``; it is the leading
    entries, whole, and N counts exactly the others; one more entry (and its counter) would not fit."""
    from exporter.profiler.plan import MAX_HOLDER_CHARS, bounded_holder

    entries = [f"ns/{'p' * n}{i}" for i, n in enumerate(sizes)]
    got = bounded_holder(",".join(entries))
    assert got is not None and len(got) <= MAX_HOLDER_CHARS
    if len(",".join(entries)) <= MAX_HOLDER_CHARS:
        assert got == ",".join(entries)
        return
    if len(entries[0]) > MAX_HOLDER_CHARS or "+" not in got:
        assert got == entries[0][:MAX_HOLDER_CHARS]
        assert len(entries[0]) + len(f",+{len(entries) - 1}") > MAX_HOLDER_CHARS
        return
    kept, _, more = got.rpartition(",+")
    n = len(kept.split(","))
    assert kept.split(",") == entries[:n] and int(more) == len(entries) - n
    tail = f",+{len(entries) - n - 1}" if len(entries) - n - 1 else ""
    assert len(",".join(entries[: n + 1])) + len(tail) > MAX_HOLDER_CHARS, "one more would have fitted"


def test_a_new_periodic_phase_writes_its_own_period_not_a_leftover_inside_the_dead_band() -> None:
    """A period (growth rate) published under an earlier pattern is no measurement of this one: once the
    pattern changes to periodic (growing), its number is written even within the dead band of what is there."""
    left = {P + "gpu-0.pattern": "bursty", P + "gpu-0.period-seconds": "60",
            P + "owned-keys": "gpu-0.pattern,gpu-0.period-seconds"}
    grew = {P + "gpu-1.pattern": "bursty", P + "gpu-1.memory-growth-bytes-per-second": "1000",
            P + "owned-keys": "gpu-1.pattern,gpu-1.memory-growth-bytes-per-second"}
    for cfg in (PlanConfig(hysteresis=1), CFG):
        a, b = left, grew
        for _ in range(cfg.hysteresis):
            _, a = apply(a, {"0": gpu(PERIODIC, period=62.0)}, cfg)
            _, b = apply(b, {"1": gpu(GROWING, growth=1100.0)}, cfg)
        assert a[P + "gpu-0.pattern"] == "periodic" and a[P + "gpu-0.period-seconds"] == "62", cfg
        assert b[P + "gpu-1.pattern"] == "growing" and b[P + "gpu-1.memory-growth-bytes-per-second"] == "1100", cfg


def test_holder_entries_are_kubernetes_names() -> None:
    from exporter.profiler.plan import clean_holders, valid_holder

    assert valid_holder("team-a/train-0") and valid_holder("a/" + "p" * 253)
    assert not valid_holder("a/" + "p" * 254) and not valid_holder("Team/x") and not valid_holder("nopod")
    assert clean_holders(None) == (None, 0) and clean_holders("") == (None, 0)
    assert clean_holders("a/b,BAD,c/d") == ("a/b,c/d", 1)
    assert clean_holders("BAD,Worse") == (None, 2)


@pytest.mark.parametrize(("name", "value", "ours"), [
    ("pattern", "steady", True), ("pattern", "STEADY", False), ("gpu-0.pattern", "idle", True),
    ("gpu-0.pattern", "", False), ("gpu-0.period-seconds", "62", True), ("gpu-0.period-seconds", "nan", False),
    ("gpu-1.memory-growth-bytes-per-second", "-12.5", True), ("gpu-1.memory-growth-bytes-per-second", "1e3", False),
    ("idle-gpus", "3", True), ("idle-gpus", "03", False), ("idle-gpus", "-1", False),
    ("allocated-idle-gpus", "0", True), ("allocated-idle-gpus", "x", False),
    ("gpu-0.holder", "ns/pod", True), ("gpu-0.holder", "ns/a,ns/b,+3", True), ("gpu-0.holder", "+3", False),
    ("gpu-0.holder", "", False), ("gpu-0.holder", "ns/a,BAD", False), ("gpu-0.holder", "a/" + "p" * 400, False),
    ("gpu-0.holder", ",".join(["ns/" + "p" * 60] * 5), True), ("gpu-0.holder", ",".join(["ns/" + "p" * 60] * 6), False),
    ("best-gpu-score", "0.00", True), ("best-gpu-score", "1.00", True), ("best-gpu-score", "1.01", False),
    ("best-gpu-score", "-0.01", False), ("best-gpu-score", "x", False),
    ("best-gpu", "3", True), ("best-gpu", "-", False), ("owned-keys", "anything", True),
])
def test_what_counts_as_a_value_we_wrote(name: str, value: str, ours: bool) -> None:
    from exporter.profiler.plan import _well_formed

    assert _well_formed(name, value) is ours


@pytest.mark.parametrize(("kw", "error"), [
    ({"prefix": "Gpu.io"}, "annotation prefix 'Gpu.io' is not a lowercase DNS subdomain"),
    ({"prefix": "a" * 254}, "is not a lowercase DNS subdomain"),
    ({"hysteresis": 0}, "hysteresis 0 must be at least 1"),
    ({"max_gpus_per_node": 0}, "max GPUs per node 0 must be 1 to 4096"),
    ({"max_gpus_per_node": 4097}, "max GPUs per node 4097 must be 1 to 4096"),
    ({"max_annotation_bytes": 2047}, "max annotation bytes 2047 must be 2048 to 131072"),
    ({"max_annotation_bytes": 131073}, "max annotation bytes 131073 must be 2048 to 131072"),
])
def test_plan_config_refuses_what_it_cannot_keep(kw: dict, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        PlanConfig(**kw)


def test_plan_config_bounds_are_inclusive() -> None:
    for kw in ({"prefix": "a"}, {"prefix": "a" * 253}, {"hysteresis": 1}, {"max_gpus_per_node": 1},
               {"max_gpus_per_node": 4096}, {"max_annotation_bytes": 2048}, {"max_annotation_bytes": 131072}):
        PlanConfig(**kw)  # type: ignore[arg-type]


def test_our_keys_are_listed_node_first_then_gpus_in_numeric_then_name_order() -> None:
    _, a = apply({}, {g: gpu(STEADY) for g in ["10", "2", "b", "a"]})
    assert a[P + "owned-keys"] == ("best-gpu,best-gpu-score,idle-gpus,pattern,"
                                   "gpu-2.pattern,gpu-10.pattern,gpu-a.pattern,gpu-b.pattern")


def test_record_helpers() -> None:
    from exporter.profiler.plan import annotation_bytes, has_our_keys, owned_names

    ann = {P + "owned-keys": "a, ,b,,x/y,pattern", P + "a": "bc", "other.io/x": "yyyy"}
    assert owned_names(ann, "gpu-exporter.io") == {"a", "b", "pattern"}
    assert owned_names({}, "gpu-exporter.io") == set()
    assert has_our_keys(ann, "gpu-exporter.io") and not has_our_keys({"other.io/owned-keys": "a"}, "gpu-exporter.io")
    want = len(P + "owned-keys") + len("a, ,b,,x/y,pattern") + len(P + "a") + 2
    assert annotation_bytes(ann, "gpu-exporter.io") == want
    assert annotation_bytes({"gpu-exporter.iox/a": "b"}, "gpu-exporter.io") == 0


def test_pending_values_may_hold_colons_and_equals_signs() -> None:
    assert parse_pending("gpu-0.holder=ns/a:b:2") == {"gpu-0.holder": ("ns/a:b", 2)}
    assert parse_pending("a=b=c:1") == {"a": ("b=c", 1)}
    assert parse_pending(None) == {} and parse_pending("") == {}


@pytest.mark.parametrize(("name", "value", "ours"), [
    ("gpu-0.uuid", "GPU-1f2e3d4c-0000-4a5b-8c9d-00000000000a", True), ("gpu-0.uuid", "not a uuid!", False),
    ("gpu-0.holder", ",".join(["ns/" + "p" * 60] * 4 + ["ns/" + "p" * 61]), True),  # exactly 320 characters
])
def test_what_counts_as_a_value_we_wrote_at_the_edges(name: str, value: str, ours: bool) -> None:
    from exporter.profiler.plan import MAX_HOLDER_CHARS, _well_formed

    assert name != "gpu-0.holder" or len(value) == MAX_HOLDER_CHARS
    assert _well_formed(name, value) is ours


def test_the_longest_holder_name_kubernetes_allows() -> None:
    from exporter.profiler.plan import valid_holder

    longest = "n" * 63 + "/" + "p" * 253
    assert len(longest) == 317 and valid_holder(longest)
