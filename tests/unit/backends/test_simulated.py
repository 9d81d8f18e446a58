"""The simulated backend's scenarios (``--simulated-scenario``), through the real serving path.

The backend runs inside a real :class:`~exporter.core.engine.Engine` and is rendered by the
real renderer; only its clock is stepped by the test (the seam the backend offers), so a
scenario's minutes pass in milliseconds. Each scenario must drive the families a real GPU in
that state drives on the NVML backend.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from exporter.backends import simulated
from exporter.backends.simulated import SCENARIOS, STATES, SimulatedBackend
from exporter.core.engine import Engine
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import HostInfo
from exporter.serve import config
from exporter.serve.render import render
from tests.harness.clock import FakeClock
from tests.harness.exporter import REPO, parse_samples
from tests.harness.prom import check_metrics

Samples = dict[tuple[str, frozenset], float]


def expositions(scenario: str, gpus: int, times: list[float], start: float = 1_000_000.0,
                wire: Callable[[Engine], object] | None = None) -> Iterator[str]:
    """The /metrics text of a simulated fleet at each of ``times`` (seconds after ``start``);
    ``wire`` attaches more to the engine first, as ``serve`` does (pod attribution)."""
    clock = FakeClock(start)
    backend = SimulatedBackend(BackendOptions(simulated_gpus=gpus, simulated_scenario=scenario), clock=clock)
    engine = Engine([backend], HostInfo(node="sim-node", cpu_model="test", kernel="test"), FieldFilter(),
                    collection_interval=0, collection_timeout=30, cache_ttl=0)
    if wire is not None:
        wire(engine)
    try:
        engine.scrape()  # the backend starts (its faults develop from here) at the first collection, at ``start``
        for t in times:
            clock.now = start + t
            yield render(engine.scrape(), engine.fields).decode()
    finally:
        engine.stop()


def at(scenario: str, times: list[float], gpus: int = 4) -> list[Samples]:
    out = []
    for text in expositions(scenario, gpus, times):
        assert check_metrics(text) == [], scenario
        out.append(parse_samples(text))
    return out


def get(s: Samples, metric: str, **labels: str) -> float | None:
    hits = [v for (n, ls), v in s.items() if n == metric and set(labels.items()) <= set(ls)]
    assert len(hits) <= 1, (metric, labels, hits)
    return hits[0] if hits else None


def gpu_families(s: Samples, gpu: str) -> set[str]:
    return {n for (n, ls), _ in s.items() if ("gpu", gpu) in ls}


# ---- settings ------------------------------------------------------------------------------------


def test_every_scenario_is_a_setting() -> None:
    assert SCENARIOS == ("healthy", "lost", "mig", "ecc", "xid", "throttle", "leak", "mixed", "driver")
    for name in SCENARIOS:
        s = config.load(["--backend", "simulated", "--simulated-scenario", name])
        assert s.simulated_scenario == name
        assert BackendOptions.from_settings(s).simulated_scenario == name
    assert config.load([]).simulated_scenario == "healthy"
    env = config.load(["--backend", "simulated"], environ={"SIMULATED_SCENARIO": "Mixed"})
    assert env.simulated_scenario == "mixed"


def test_a_bad_scenario_or_one_without_the_simulated_backend_is_rejected() -> None:
    with pytest.raises(config.ConfigError, match=r"simulated_scenario .*'broken'.*expected one of: healthy, lost"):
        config.load(["--backend", "simulated", "--simulated-scenario", "broken"])
    with pytest.raises(config.ConfigError, match="only the simulated backend has scenarios"):
        config.load(["--backend", "nvml", "--simulated-scenario", "lost"])
    # auto may fall back to simulated GPUs only with --allow-simulated: then the scenario applies
    assert config.load(["--allow-simulated", "--simulated-scenario", "ecc"]).simulated_scenario == "ecc"
    proc = subprocess.run([sys.executable, "-m", "exporter", "serve", "--backend", "nvml", "--simulated-scenario",
                           "lost"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "simulated_scenario" in proc.stderr, proc.stderr


# ---- what each scenario drives ---------------------------------------------------------------------


def test_healthy_is_the_unchanged_default() -> None:
    (s,) = at("healthy", [0.0])
    assert {get(s, "gpu_up", gpu=str(i)) for i in range(4)} == {1.0}
    for fam in ("gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_mig_mode_enabled", "gpu_xid_errors_total",
                "gpu_violation_seconds_total"):
        assert not any(n == fam for n, _ in s), f"{fam}: the default output has no health families"
    # the full NVML reason set, all off for a healthy GPU but the idle flag
    reasons = {dict(ls)["reason"]: v for (n, ls), v in s.items() if n == "gpu_throttle_reason_active"
               and ("gpu", "1") in ls}
    assert set(reasons) == set(simulated.THROTTLE_REASONS) and sum(reasons.values()) == 0.0
    assert get(s, "gpu_pci_devices", vendor="simulated") == get(s, "gpu_visible_devices") == 4.0


def test_lost_keeps_identity_and_publishes_nothing_else() -> None:
    before, after, later = at("lost", [0.0, 5.0, 60.0])
    assert get(before, "gpu_up", gpu="0") == 1.0 and get(before, "gpu_utilization_ratio", gpu="0") is not None
    for s in (after, later):
        assert get(s, "gpu_up", gpu="0") == 0.0
        assert gpu_families(s, "0") == {"gpu_info", "gpu_up", "gpu_health_state", "gpu_xid_errors_total",
                                        "gpu_xid_last_timestamp_seconds"}
        assert get(s, "gpu_health_state", gpu="0", state="lost") == 1.0  # issue 35: the one state, with the cause
        info = next(dict(ls) for (n, ls), _ in s.items() if n == "gpu_info" and ("gpu", "0") in ls)
        assert info["pci_bus_id"] == "0000:10:00.0" and info["serial"] == "SIM00000000"
        assert info["name"] == "Simulated GPU" and info["uuid"].startswith("GPU-")
        assert get(s, "gpu_xid_errors_total", gpu="0", xid="79") == 1.0
        assert get(s, "gpu_up", gpu="1") == 1.0
        # one GPU more on the bus than the library enumerates
        assert get(s, "gpu_pci_devices") == 5.0 and get(s, "gpu_visible_devices") == 4.0
    assert get(after, "gpu_exporter_collection_errors_total", kind="gpu_lost") == 1.0
    assert get(later, "gpu_exporter_collection_errors_total", kind="gpu_lost") == 2.0


def test_driver_gone_fails_the_collection_and_keeps_the_known_gpus_down() -> None:
    before, after, later = at("driver", [0.0, 5.0, 60.0])
    assert get(before, "gpu_exporter_collector_success", backend="simulated") == 1.0
    assert [get(before, "gpu_up", gpu=str(g)) for g in range(4)] == [1.0] * 4
    for s in (after, later):
        assert get(s, "gpu_exporter_collector_success", backend="simulated") == 0.0
        assert [get(s, "gpu_up", gpu=str(g)) for g in range(4)] == [0.0] * 4  # known, unreadable
        assert get(s, "gpu_utilization_ratio", gpu="0") is None  # nothing read is made up
        info = next(dict(ls) for (n, ls), _ in s.items() if n == "gpu_info" and ("gpu", "0") in ls)
        assert info["uuid"].startswith("GPU-") and info["pci_bus_id"] == "0000:10:00.0"
    assert get(after, "gpu_exporter_collection_errors_total", kind="driver") == 1.0
    assert get(later, "gpu_exporter_collection_errors_total", kind="driver") == 2.0


def test_mig_instances_under_their_gpu() -> None:
    (s,) = at("mig", [30.0])
    assert get(s, "gpu_mig_mode_enabled", gpu="0") == 1.0 and get(s, "gpu_mig_mode_enabled", gpu="1") == 0.0
    totals = {dict(ls)["mig_profile"] + "/" + dict(ls)["gpu_instance"]: v for (n, ls), v in s.items()
              if n == "gpu_mig_memory_total_bytes"}
    assert sorted(totals) == ["1g.10gb/10", "1g.10gb/9", "2g.20gb/3", "3g.40gb/2"]
    assert sum(totals.values()) <= get(s, "gpu_memory_total_bytes", gpu="0")  # type: ignore[operator]
    used = [v for (n, ls), v in s.items() if n == "gpu_mig_memory_used_bytes"]
    assert sum(used) == get(s, "gpu_memory_used_bytes", gpu="0")
    utils = [v for (n, ls), v in s.items() if n == "gpu_mig_utilization_ratio"]
    assert len(utils) == 4 and all(0.0 <= u <= 1.0 for u in utils) and max(utils) > 0.3
    # NVML has no whole-GPU utilisation in MIG mode: absent, and said so
    assert get(s, "gpu_utilization_ratio", gpu="0") is None
    assert get(s, "gpu_field_unsupported", gpu="0", field="gpu_utilization_ratio") == 1.0
    assert not any(n.startswith("gpu_mig_memory") and ("gpu", "1") in ls for n, ls in s)


def test_ecc_errors_grow_and_need_a_remap() -> None:
    start, first, second = at("ecc", [0.0, 5.0, 130.0])
    unc = {"error_type": "uncorrected", "counter": "volatile"}
    assert [get(s, "gpu_ecc_errors_total", gpu="0", **unc) for s in (start, first, second)] == [0.0, 1.0, 2.0]
    assert get(second, "gpu_ecc_errors_total", gpu="0", error_type="corrected", counter="volatile") == 26.0
    assert get(second, "gpu_ecc_errors_total", gpu="0", error_type="uncorrected", counter="aggregate") == 5.0
    assert get(start, "gpu_remapped_rows_pending", gpu="0") == 0.0
    assert get(first, "gpu_remapped_rows_pending", gpu="0") == 1.0 and get(first, "gpu_remapped_rows_failed",
                                                                           gpu="0") == 0.0
    assert get(second, "gpu_remapped_rows_failed", gpu="0") == 1.0
    assert get(second, "gpu_xid_errors_total", gpu="0", xid="94") == 2.0
    assert get(second, "gpu_xid_errors_total", gpu="0", xid="64") == 1.0
    # the neighbours report the same families, clean
    assert get(second, "gpu_ecc_errors_total", gpu="1", **unc) == 0.0
    assert get(second, "gpu_remapped_rows_failed", gpu="1") == 0.0
    assert get(second, "gpu_ecc_mode_enabled", gpu="1") == 1.0


def test_xids_are_counted_with_their_time() -> None:
    start, s = at("xid", [0.0, 700.0])
    assert not any(n == "gpu_xid_errors_total" for n, _ in start)
    assert get(s, "gpu_xid_errors_total", gpu="0", xid="13") == 18.0  # at 1 s, then every 40 s
    assert get(s, "gpu_xid_errors_total", gpu="0", xid="119") == 2.0  # at 3 s and 603 s
    assert get(s, "gpu_xid_last_timestamp_seconds", gpu="0") == 1_000_000.0 + 681.0  # the last XID 13
    assert not any(n == "gpu_xid_errors_total" and ("gpu", "1") in ls for n, ls in s)


def test_throttle_heat_and_power_cap() -> None:
    (s,) = at("throttle", [60.0])
    assert get(s, "gpu_temperature_celsius", gpu="0", sensor="gpu") > 85  # type: ignore[operator]
    for reason in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"):
        assert get(s, "gpu_throttle_reason_active", gpu="0", reason=reason) == 1.0
    assert get(s, "gpu_clock_hertz", gpu="0", clock="sm") < get(s, "gpu_clock_max_hertz", gpu="0", clock="sm")  # type: ignore[operator]
    assert get(s, "gpu_violation_seconds_total", gpu="0", reason="thermal") == 60.0
    assert get(s, "gpu_throttle_reason_active", gpu="1", reason="sw_power_cap") == 1.0
    assert get(s, "gpu_power_watts", gpu="1") == get(s, "gpu_power_limit_watts", gpu="1")
    assert get(s, "gpu_violation_seconds_total", gpu="1", reason="power") == 60.0
    assert get(s, "gpu_temperature_celsius", gpu="1", sensor="gpu") < 85  # type: ignore[operator]
    assert get(s, "gpu_throttle_reason_active", gpu="2", reason="sw_power_cap") == 0.0


def test_leak_fills_memory_and_stays_full() -> None:
    """Under 5 % free within 5 minutes, still growing (slowly) over the next half hour, so that the
    profiler sees a leak in its window (issue 28), and then full for good."""
    series = at("leak", [0.0, 60.0, 120.0, 360.0, 1200.0, 2100.0, 3600.0, 4000.0])
    used = [get(s, "gpu_memory_used_bytes", gpu="0") for s in series]
    assert used[0] < used[1] < used[2] < used[3] < used[4] < used[5] < used[6] == used[7], used  # type: ignore[operator]
    for s in series[3:]:
        free, total = get(s, "gpu_memory_free_bytes", gpu="0"), get(s, "gpu_memory_total_bytes", gpu="0")
        assert free / total < 0.05  # type: ignore[operator]
    assert used[5] - used[3] > 0.01 * 80 * 2**30  # type: ignore[operator]  # the profiler's growth floor


def test_mixed_puts_each_state_on_its_own_gpu() -> None:
    (s,) = at("mixed", [200.0], gpus=9)
    assert STATES["mixed"] == ("mig", "ecc", "thermal", "lost", "xid", "leak", "power_cap", "starved", "healthy")
    assert get(s, "gpu_mig_mode_enabled", gpu="0") == 1.0
    assert get(s, "gpu_ecc_errors_total", gpu="1", error_type="uncorrected", counter="volatile") == 2.0
    assert get(s, "gpu_throttle_reason_active", gpu="2", reason="hw_thermal_slowdown") == 1.0
    assert get(s, "gpu_up", gpu="3") == 0.0
    assert get(s, "gpu_xid_errors_total", gpu="4", xid="119") == 1.0
    assert get(s, "gpu_memory_used_bytes", gpu="5") > 60 * 2**30  # type: ignore[operator]
    assert get(s, "gpu_throttle_reason_active", gpu="6", reason="sw_power_cap") == 1.0
    assert get(s, "gpu_utilization_ratio", gpu="7") > 0.9 and get(s, "gpu_sm_active_ratio", gpu="7") < 0.2  # type: ignore[operator]
    healthy = {n: v for (n, ls), v in s.items() if ("gpu", "8") in ls and n in (
        "gpu_ecc_errors_total", "gpu_remapped_rows_pending", "gpu_xid_errors_total")}
    assert healthy and set(healthy.values()) == {0.0}
    # fewer GPUs than states: the first states
    (four,) = at("mixed", [200.0], gpus=4)
    assert get(four, "gpu_up", gpu="3") == 0.0 and get(four, "gpu_pci_devices") == 5.0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_byte_values_are_whole_numbers(scenario: str) -> None:
    for s in at(scenario, [0.0, 7.3, 61.7, 333.3]):
        fractional = {n: v for (n, _), v in s.items() if n.endswith("_bytes") and v != int(v)}
        assert not fractional, fractional
