"""The nvml backend end to end: the real exporter process, the real pynvml, a fake libnvidia-ml.so.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fakenvml import DRIVER_NOT_LOADED, NOT_SUPPORTED, UNINITIALIZED, FakeNvml
from tests.harness.exporter import ExporterProcess, parse_samples, sample
from tests.harness.poll import wait_until
from tests.harness.prom import Prometheus, check_metrics

MiB = 2**20


pytestmark = pytest.mark.fleet(gpus=2)  # the `fleet` fixture (tests/conftest.py)


def start(fleet: FakeNvml, tmp_path: Path, *args: str, wait: bool = True) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys"), "--collection-timeout", "30",
                            "--cache-ttl", "0", *args], env=fleet.env(),
                           wait=wait)


@pytest.fixture
def exporter(fleet: FakeNvml, tmp_path: Path) -> Iterator[ExporterProcess]:
    with start(fleet, tmp_path) as ex:
        yield ex


def gpu_series(samples: dict, gpu: str) -> set[str]:
    return {n for n, ls in samples if ("gpu", gpu) in ls}


def test_exact_values_and_units(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    text = exporter.scrape_text()
    assert check_metrics(text) == []
    s = parse_samples(text)
    for i in (0, 1):
        g = fleet.gpus[i]
        lab = {"gpu": str(i), "uuid": g["uuid"]}
        assert sample(s, "gpu_up", **lab) == 1.0
        assert sample(s, "gpu_utilization_ratio", **lab) == pytest.approx(g["util_gpu"] / 100)
        assert sample(s, "gpu_memory_utilization_ratio", **lab) == pytest.approx(g["util_mem"] / 100)
        assert sample(s, "gpu_memory_total_bytes", **lab) == g["mem_total"]
        assert sample(s, "gpu_memory_used_bytes", **lab) == g["mem_used"]
        assert sample(s, "gpu_memory_reserved_bytes", **lab) == g["mem_reserved"]
        assert sample(s, "gpu_memory_free_bytes", **lab) == g["mem_total"] - g["mem_reserved"] - g["mem_used"]
        assert sample(s, "gpu_temperature_celsius", sensor="gpu", **lab) == g["temp_gpu"]
        assert sample(s, "gpu_temperature_celsius", sensor="memory", **lab) == g["temp_mem"]
        assert sample(s, "gpu_power_watts", **lab) == pytest.approx(g["power_mw"] / 1000)  # mW -> W
        assert sample(s, "gpu_power_limit_watts", **lab) == pytest.approx(g["enforced_limit_mw"] / 1000)
        assert sample(s, "gpu_energy_joules_total", **lab) == pytest.approx(g["energy_mj"] / 1000)  # mJ -> J
        for clock, key in (("graphics", "clock_graphics"), ("sm", "clock_sm"), ("memory", "clock_mem"),
                           ("video", "clock_video")):
            assert sample(s, "gpu_clock_hertz", clock=clock, **lab) == g[key] * 1e6  # MHz -> Hz
            assert sample(s, "gpu_clock_max_hertz", clock=clock, **lab) == g["max_" + key] * 1e6
        assert sample(s, "gpu_pcie_link_generation", **lab) == g["pcie_gen"]
        assert sample(s, "gpu_pcie_link_width", **lab) == g["pcie_width"]
        assert sample(s, "gpu_pcie_link_generation_max", **lab) == g["pcie_max_gen"]
        assert sample(s, "gpu_pcie_link_width_max", **lab) == g["pcie_max_width"]
        assert sample(s, "gpu_performance_state", **lab) == g["pstate"]
        bus = g["bus_id"].lower()[4:]  # NVML 00000000:18:00.0 -> sysfs-style 0000:18:00.0
        assert sample(s, "gpu_info", gpu=str(i), uuid=g["uuid"], name=g["name"], vendor="nvidia", backend="nvml",
                      pci_bus_id=bus, serial=g["serial"], driver_version=fleet.globals["driver_version"]) == 1.0
    cuda = int(fleet.globals["cuda_version"])
    assert sample(s, "gpu_info", gpu="0", cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}") == 1.0
    # passively cooled GPUs: no fan series at all, and the reason is visible
    assert "gpu_fan_speed_ratio" not in {n for n, _ in s}
    assert sample(s, "gpu_field_unsupported", gpu="0", field="gpu_fan_speed_ratio") == 1.0
    assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 1.0
    assert sample(s, "gpu_exporter_gpus", backend="nvml") == 2.0


def test_values_follow_the_driver(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    assert sample(exporter.scrape(), "gpu_fan_speed_ratio", gpu="1") is None
    fleet.set(1, power_mw=123_456, util_gpu=97, fans=1, fan_speed=55)
    s = exporter.scrape()
    assert sample(s, "gpu_power_watts", gpu="1") == pytest.approx(123.456)
    assert sample(s, "gpu_utilization_ratio", gpu="1") == pytest.approx(0.97)
    assert sample(s, "gpu_fan_speed_ratio", gpu="1") is None  # unsupported is remembered until re-init


def test_fan_reading_when_supported(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1)
    fleet.set(1, fan_speed=63)
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_fan_speed_ratio", gpu="1") == pytest.approx(0.63)


def test_unsupported_field_is_absent_for_that_gpu_only(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.unsupported(0, "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption")
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_power_watts", gpu="0") is None
        assert sample(s, "gpu_energy_joules_total", gpu="0") is None
        assert sample(s, "gpu_power_watts", gpu="1") == pytest.approx(fleet.gpus[1]["power_mw"] / 1000)
        assert sample(s, "gpu_field_unsupported", gpu="0", field="gpu_power_watts") == 1.0
        assert sample(s, "gpu_up", gpu="0") == 1.0
        ex.scrape()
        ex.scrape()
        assert ex.log().count("gpu_power_watts not available") == 1  # logged once, not per scrape


def test_missing_symbols_fall_back_or_are_absent(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2,
                     omit=["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTotalEnergyConsumption"])
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        g = fleet.gpus[0]
        # memory info v1 fallback: total/used/free present, reserved absent (v1 counts it as used)
        assert sample(s, "gpu_memory_total_bytes", gpu="0") == g["mem_total"]
        assert sample(s, "gpu_memory_used_bytes", gpu="0") == g["mem_used"] + g["mem_reserved"]
        assert sample(s, "gpu_memory_reserved_bytes", gpu="0") is None
        assert sample(s, "gpu_energy_joules_total", gpu="0") is None
        assert sample(s, "gpu_up", gpu="0") == 1.0
        assert check_metrics(ex.scrape_text()) == []


def test_gpu_lost_mid_run_then_back(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    assert sample(exporter.scrape(), "gpu_up", gpu="1") == 1.0
    fleet.lose(1)
    s = exporter.scrape()
    assert sample(s, "gpu_up", gpu="1", uuid=fleet.gpus[1]["uuid"]) == 0.0
    readings = gpu_series(s, "1") - {"gpu_up", "gpu_info", "gpu_health_state"}
    assert readings == set(), f"a lost GPU must publish no readings, got {readings}"
    assert sample(s, "gpu_health_state", gpu="1", state="lost") == 1.0  # its identity and its one state
    # its identity stays one gpu_info series (same labels as before it was lost)
    g = fleet.gpus[1]
    assert sample(s, "gpu_info", gpu="1", uuid=g["uuid"], serial=g["serial"], cuda_version="12.4") == 1.0
    assert sample(s, "gpu_up", gpu="0") == 1.0 and sample(s, "gpu_power_watts", gpu="0") is not None
    assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="gpu_lost") or 0) >= 1
    fleet.restore(1)
    fleet.set(1, power_mw=200_000)
    s = wait_until(lambda: (x := exporter.scrape()) and sample(x, "gpu_up", gpu="1") == 1.0 and x, 10,
                   what="GPU 1 back")
    assert sample(s, "gpu_power_watts", gpu="1") == pytest.approx(200.0)


def test_driver_not_loaded_fails_visibly_then_recovers(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.fail("nvmlInitWithFlags", DRIVER_NOT_LOADED)
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="driver") or 0) >= 1
        assert "gpu_up" not in {n for n, _ in s}
        assert ex.get("/readyz")[0] == 503
        fleet.clear_fail("nvmlInitWithFlags")
        s = wait_until(lambda: (x := ex.scrape()) and sample(x, "gpu_up", gpu="0") == 1.0 and x, 10,
                       what="recovery after driver load")
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 1.0
        assert ex.get("/readyz")[0] == 200
        assert ex.log().count("collection failed (driver)") == 1
        assert "recovered" in ex.log()
        # the driver goes away mid-run: collection fails, no stale readings, then comes back
        fleet.fail("nvmlDeviceGetCount_v2", UNINITIALIZED)
        s = ex.scrape()
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
        assert "gpu_power_watts" not in {n for n, _ in s}
        fleet.clear_fail("nvmlDeviceGetCount_v2")
        wait_until(lambda: sample(ex.scrape(), "gpu_exporter_collector_success", backend="nvml") == 1.0, 10,
                   what="recovery after re-init")
        assert ex.proc.poll() is None


def test_library_missing_is_clear(tmp_path: Path) -> None:
    env = {"LD_LIBRARY_PATH": str(tmp_path), "FAKE_NVML_CONFIG": ""}
    with ExporterProcess(["--backend", "nvml"], env=env) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="unavailable") or 0) >= 1
        wait_until(lambda: "libnvidia-ml.so.1 not found" in ex.log(), 5, what="clear log line")


def test_auto_without_gpus_does_not_fall_back_silently(tmp_path: Path) -> None:
    env = {"LD_LIBRARY_PATH": str(tmp_path), "PATH": str(tmp_path), "ROCM_PATH": str(tmp_path)}
    with ExporterProcess(["--backend", "auto"], env=env) as ex:
        s = ex.scrape()
        assert "gpu_info" not in {n for n, _ in s}
        assert ex.get("/readyz")[0] == 503
        assert "no GPU backend available" in ex.log()
        assert "simulated" not in ex.scrape_text()
    with ExporterProcess(["--backend", "auto", "--allow-simulated"], env=env) as ex:
        assert sample(ex.scrape(), "gpu_info", gpu="0", backend="simulated") == 1.0
        assert "SIMULATED" in ex.log()


def test_field_exclude_skips_reads(fleet: FakeNvml, tmp_path: Path) -> None:
    with start(fleet, tmp_path, "--fields-exclude", "gpu_clock_*,gpu_power_watts") as ex:
        names = {n for n, _ in ex.scrape()}
        assert not {"gpu_clock_hertz", "gpu_clock_max_hertz", "gpu_power_watts"} & names
        assert "gpu_power_limit_watts" in names


def test_real_prometheus_scrapes_the_fake_fleet(fleet: FakeNvml, exporter: ExporterProcess,
                                                tmp_path: Path) -> None:
    with Prometheus(tmp_path / "prom", scrape_targets=[f"127.0.0.1:{exporter.port}"]) as prom:
        prom.wait_for_up(f"127.0.0.1:{exporter.port}")
        res = prom.wait_for('gpu_power_watts{gpu="1"}', timeout=30)
        assert float(res[0]["value"][1]) == pytest.approx(fleet.gpus[1]["power_mw"] / 1000)
        assert prom.value('up{job="targets"}') == 1.0
        total = prom.value("sum(gpu_memory_total_bytes)")
        assert total == pytest.approx(2 * fleet.gpus[0]["mem_total"])
        joined = prom.query('gpu_power_watts * on(gpu, uuid) group_left(name) gpu_info{backend="nvml"}')
        assert {r["metric"]["name"] for r in joined} == {fleet.gpus[0]["name"]}


def test_not_supported_everywhere_still_serves(fleet: FakeNvml, tmp_path: Path) -> None:
    for fn in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo"):
        fleet.fail(fn, NOT_SUPPORTED)
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        names = {n for n, _ in s}
        assert not {"gpu_utilization_ratio", "gpu_clock_hertz"} & names
        assert sample(s, "gpu_up", gpu="0") == 1.0
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 1.0




def test_slow_driver_answers_with_what_it_has_within_the_timeout(fleet: FakeNvml, tmp_path: Path) -> None:
    import time

    # --call-deadline 0.5: each of GPU 1's calls answers within it, but its ~40 calls overrun the collection
    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path), "--collection-timeout", "1",
                          "--call-deadline", "0.5", "--cache-ttl", "0"], env=fleet.env()) as ex:
        assert sample(ex.scrape(), "gpu_up", gpu="1") == 1.0
        fleet.set(1, delay_ms=100)  # ~40 calls per GPU: GPU 1 takes far longer than the 1 s budget
        t0 = time.monotonic()
        s = ex.scrape()
        elapsed = time.monotonic() - t0
        assert elapsed < 3.0, f"scrape took {elapsed:.1f}s with a 1s collection timeout"
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="timeout") or 0) >= 1
        assert sample(s, "gpu_power_watts", gpu="0") is not None  # GPU 0 was read before the stall
        assert sample(s, "gpu_power_watts", gpu="1") is None  # nothing half-read or stale for GPU 1
        fleet.set(1, delay_ms=0)
        wait_until(lambda: sample(ex.scrape(), "gpu_exporter_collector_success", backend="nvml") == 1.0, 60,
                   what="recovery once the driver answers again")
        assert ex.log().count("collection failed (timeout)") == 1


def test_a_call_slower_than_the_deadline_makes_its_gpu_hung_not_the_scrape(fleet: FakeNvml, tmp_path: Path) -> None:
    import time

    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path), "--collection-timeout", "1",
                          "--cache-ttl", "0"], env=fleet.env()) as ex:  # the call deadline: 0.2 s (a fifth)
        assert sample(ex.scrape(), "gpu_up", gpu="1") == 1.0
        fleet.set(1, delay_ms=400)  # every call on GPU 1 overruns the deadline
        t0 = time.monotonic()
        s = ex.scrape()
        assert time.monotonic() - t0 < 1.0, "the scrape waited for more than the hung GPU's one deadline"
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 1.0  # one GPU: not the collection
        assert sample(s, "gpu_up", gpu="1") == 0.0
        assert sample(s, "gpu_power_watts", gpu="1") is None
        assert sample(s, "gpu_power_watts", gpu="0") is not None
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="gpu_hung") or 0) >= 1
        fleet.set(1, delay_ms=0)
        wait_until(lambda: sample(ex.scrape(), "gpu_up", gpu="1") == 1.0, 30, what="GPU 1 back once it answers")


def test_driver_without_init_with_flags_uses_init_v2(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=["nvmlInitWithFlags"])
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 1.0
        assert sample(s, "gpu_power_watts", gpu="1") == pytest.approx(fleet.gpus[1]["power_mw"] / 1000)


def test_transient_field_error_loses_one_reading_not_the_gpu(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.fail("nvmlDeviceGetClockInfo", 10, gpu=1)  # NVML_ERROR_TIMEOUT on one GPU's clocks
    with start(fleet, tmp_path) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="1") == 1.0
        assert not any(n == "gpu_clock_hertz" and ("gpu", "1") in ls for n, ls in s)
        assert sample(s, "gpu_power_watts", gpu="1") is not None
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="reading_error") or 0) >= 4
        fleet.clear_fail("nvmlDeviceGetClockInfo")
        s = ex.scrape()  # asked again next time: a transient error is not "unsupported"
        assert sample(s, "gpu_clock_hertz", gpu="1", clock="sm") == fleet.gpus[1]["clock_sm"] * 1e6
        for code, kind in ((14, "gpu_error"),):  # IRQ_ISSUE: a device fault whatever else answers
            fleet.fail("nvmlDeviceGetPowerUsage", code, gpu=0)
            s = ex.scrape()
            assert sample(s, "gpu_up", gpu="0") == 0.0
            assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind=kind) or 0) >= 1
            fleet.clear_fail("nvmlDeviceGetPowerUsage")
            wait_until(lambda: sample(ex.scrape(), "gpu_up", gpu="0") == 1.0, 10, what="GPU 0 back")


# Every NVML function the backend calls directly with a reused C value (exporter/backends/nvml.py:
# NvmlBackend._build_direct, _PerLink) and a series it alone feeds: (function, family, labels of that series).
DIRECT_CALLS = (
    ("nvmlDeviceGetUtilizationRates", "gpu_utilization_ratio", {}),
    ("nvmlDeviceGetMemoryInfo_v2", "gpu_memory_used_bytes", {}),
    ("nvmlDeviceGetTemperature", "gpu_temperature_celsius", {"sensor": "gpu"}),
    ("nvmlDeviceGetPowerUsage", "gpu_power_watts", {}),
    ("nvmlDeviceGetEnforcedPowerLimit", "gpu_power_limit_watts", {}),
    ("nvmlDeviceGetTotalEnergyConsumption", "gpu_energy_joules_total", {}),
    ("nvmlDeviceGetCurrPcieLinkGeneration", "gpu_pcie_link_generation", {}),
    ("nvmlDeviceGetCurrPcieLinkWidth", "gpu_pcie_link_width", {}),
    ("nvmlDeviceGetPcieReplayCounter", "gpu_pcie_replays_total", {}),
    ("nvmlDeviceGetFanSpeed", "gpu_fan_speed_ratio", {}),
    ("nvmlDeviceGetClockInfo", "gpu_clock_hertz", {"clock": "sm"}),
    ("nvmlDeviceGetPerformanceState", "gpu_performance_state", {}),
    ("nvmlDeviceGetTotalEccErrors", "gpu_ecc_errors_total", {"error_type": "corrected", "counter": "volatile"}),
    ("nvmlDeviceGetViolationStatus", "gpu_violation_seconds_total", {"reason": "thermal"}),
    ("nvmlDeviceGetRemappedRows", "gpu_remapped_rows", {"error_type": "corrected"}),
    ("nvmlDeviceGetEncoderUtilization", "gpu_encoder_utilization_ratio", {}),
    ("nvmlDeviceGetDecoderUtilization", "gpu_decoder_utilization_ratio", {}),
    ("nvmlDeviceGetRetiredPages", "gpu_retired_pages", {"cause": "single_bit"}),
    ("nvmlDeviceGetNvLinkState", "gpu_link_up", {"link": "17"}),
    ("nvmlDeviceGetNvLinkErrorCounter", "gpu_link_errors_total", {"link": "17", "counter": "crc_flit"}),
)


@pytest.mark.parametrize("identity", ["nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3"])
def test_unknown_error_from_one_call_loses_that_reading_only(tmp_path: Path, identity: str) -> None:
    """Issue 26: NVML_ERROR_UNKNOWN (999) from one function is a reading error while the GPU's
    identity call answers (seen on virtualised and containerised setups); the GPU is down only when
    the identity call fails too. Every direct call and a wrapped one (processes), in turn."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1, gpm_supported=0)
    fleet.set(1, retired_sbe=[(0x1000, 1)])
    calls = (*DIRECT_CALLS, ("nvmlDeviceGetComputeRunningProcesses_v3", "gpu_processes", {}))
    with start(fleet, tmp_path, "--fields-exclude", "gpu_p2p_supported,gpu_topology_level") as ex:
        before = ex.scrape()
        for function, family, labels in calls:
            fleet.fail(function, 999, gpu=1)
            s = ex.scrape()
            assert sample(s, "gpu_up", gpu="1") == 1.0, function
            assert sample(s, family, gpu="1", **labels) is None, (function, family)
            other = "gpu_power_watts" if family != "gpu_power_watts" else "gpu_utilization_ratio"
            assert sample(s, other, gpu="1") is not None, function
            assert sample(s, family, gpu="0", **labels) is not None, (function, family)
            fleet.clear_fail(function)
        errors = sample(ex.scrape(), "gpu_exporter_collection_errors_total", backend="nvml", kind="reading_error")
        assert errors is not None and errors >= len(calls)
        assert sample(before, "gpu_exporter_collection_errors_total", backend="nvml", kind="gpu_error") in (None, 0.0)
        # the identity call fails as well: now it is the GPU
        fleet.fail("nvmlDeviceGetPowerUsage", 999, gpu=1)
        fleet.fail(identity, 999, gpu=1)
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="1") == 0.0 and sample(s, "gpu_up", gpu="0") == 1.0
        assert sample(s, "gpu_power_watts", gpu="1") is None and sample(s, "gpu_utilization_ratio", gpu="1") is None
        assert (sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="gpu_error") or 0) >= 1
        fleet.clear_fail()
        wait_until(lambda: sample(ex.scrape(), "gpu_power_watts", gpu="1") is not None, 10, what="GPU 1 back")
        assert "Traceback" not in ex.log()


def test_a_failing_direct_call_never_serves_a_reused_value(tmp_path: Path) -> None:
    # The direct calls reuse one C value per function for every GPU. GPU 0 is read first, so when
    # GPU 1's call fails the buffer still holds GPU 0's answer (or GPU 1's from the last scrape):
    # the reading must be absent, never that value.
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1, gpm_supported=0)
    fleet.set(1, retired_sbe=[(0x1000, 1)])
    with start(fleet, tmp_path, "--fields-exclude", "gpu_p2p_supported,gpu_topology_level") as ex:
        before = ex.scrape()
        for function, family, labels in DIRECT_CALLS:
            assert sample(before, family, gpu="1", **labels) is not None, (function, family)
            fleet.fail(function, 10, gpu=1)  # NVML_ERROR_TIMEOUT: that reading is lost, not the GPU
            s = ex.scrape()
            assert sample(s, family, gpu="1", **labels) is None, (function, family)
            assert sample(s, family, gpu="0", **labels) is not None, (function, family)
            assert sample(s, "gpu_up", gpu="1") == 1.0, function
            fleet.clear_fail(function)
            assert sample(ex.scrape(), family, gpu="1", **labels) == sample(before, family, gpu="1", **labels), \
                (function, family)
