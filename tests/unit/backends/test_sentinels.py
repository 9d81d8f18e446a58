"""NVML "no value" sentinels through the real stack: the exporter over the real pynvml and the fake NVML.

Every numeric per-GPU key of the fake (tests/fakes/fakenvml.py ``_default_gpu``) either feeds a
reading, listed in READINGS with the series it feeds, or is listed in NOT_READINGS with the reason;
a new key fails test_every_numeric_key_of_the_fake_has_a_row until it has a row. Each reading, fed
0xFFFFFFFF (NVML_VALUE_NOT_AVAILABLE as unsigned) and 0xFFFFFFFFFFFFFFFF, must be absent from
/metrics, counted as ``no_value`` and logged once, however often it is scraped. The AMD side is in
test_amdsmi_fidelity.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fakes.fakenvml import FakeNvml, _default_gpu
from tests.harness.exporter import ExporterProcess, sample

SENTINELS = (0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF)
# The factors our conversions apply (1, mW, MHz, %, KB/s, ns): a scaled sentinel is as wrong as a raw one.
FACTORS = (1.0, 1e-3, 1e6, 0.01, 1024.0, 1e-9)

# fake key -> (family, labels that pick its series, reading name in the logs)
READINGS: dict[str, tuple[str, dict[str, str], str]] = {
    "util_gpu": ("gpu_utilization_ratio", {}, "gpu_utilization_ratio"),
    "util_mem": ("gpu_memory_utilization_ratio", {}, "gpu_utilization_ratio"),  # one call for both
    "mem_total": ("gpu_memory_total_bytes", {}, "gpu_memory_used_bytes"),  # one versioned call for all four
    "mem_reserved": ("gpu_memory_reserved_bytes", {}, "gpu_memory_used_bytes"),
    "mem_used": ("gpu_memory_used_bytes", {}, "gpu_memory_used_bytes"),
    "temp_gpu": ("gpu_temperature_celsius", {"sensor": "gpu"}, "gpu_temperature_celsius:gpu"),
    "temp_mem": ("gpu_temperature_celsius", {"sensor": "memory"}, "gpu_temperature_celsius:memory"),
    "power_mw": ("gpu_power_watts", {}, "gpu_power_watts"),
    "enforced_limit_mw": ("gpu_power_limit_watts", {}, "gpu_power_limit_watts"),
    "energy_mj": ("gpu_energy_joules_total", {}, "gpu_energy_joules_total"),
    "clock_graphics": ("gpu_clock_hertz", {"clock": "graphics"}, "gpu_clock_hertz:graphics"),
    "clock_sm": ("gpu_clock_hertz", {"clock": "sm"}, "gpu_clock_hertz:sm"),
    "clock_mem": ("gpu_clock_hertz", {"clock": "memory"}, "gpu_clock_hertz:memory"),
    "clock_video": ("gpu_clock_hertz", {"clock": "video"}, "gpu_clock_hertz:video"),
    "max_clock_graphics": ("gpu_clock_max_hertz", {"clock": "graphics"}, "gpu_clock_max_hertz:graphics"),
    "max_clock_sm": ("gpu_clock_max_hertz", {"clock": "sm"}, "gpu_clock_max_hertz:sm"),
    "max_clock_mem": ("gpu_clock_max_hertz", {"clock": "memory"}, "gpu_clock_max_hertz:memory"),
    "max_clock_video": ("gpu_clock_max_hertz", {"clock": "video"}, "gpu_clock_max_hertz:video"),
    "pcie_gen": ("gpu_pcie_link_generation", {}, "gpu_pcie_link_generation"),
    "pcie_max_gen": ("gpu_pcie_link_generation_max", {}, "gpu_pcie_link_generation_max"),
    "pcie_width": ("gpu_pcie_link_width", {}, "gpu_pcie_link_width"),
    "pcie_max_width": ("gpu_pcie_link_width_max", {}, "gpu_pcie_link_width_max"),
    "pcie_replay": ("gpu_pcie_replays_total", {}, "gpu_pcie_replays_total"),
    "pcie_tx_kbps": ("gpu_pcie_throughput_bytes_per_second", {"direction": "tx"},
                     "gpu_pcie_throughput_bytes_per_second:tx"),
    "pcie_rx_kbps": ("gpu_pcie_throughput_bytes_per_second", {"direction": "rx"},
                     "gpu_pcie_throughput_bytes_per_second:rx"),
    "fan_speed": ("gpu_fan_speed_ratio", {}, "gpu_fan_speed_ratio"),
    "pstate": ("gpu_performance_state", {}, "gpu_performance_state"),
    "ecc_mode": ("gpu_ecc_mode_enabled", {}, "gpu_ecc_mode_enabled"),
    "ecc_corrected_volatile": ("gpu_ecc_errors_total", {"error_type": "corrected", "counter": "volatile"},
                               "gpu_ecc_errors_total:corrected_volatile"),
    "ecc_corrected_aggregate": ("gpu_ecc_errors_total", {"error_type": "corrected", "counter": "aggregate"},
                                "gpu_ecc_errors_total:corrected_aggregate"),
    "ecc_uncorrected_volatile": ("gpu_ecc_errors_total", {"error_type": "uncorrected", "counter": "volatile"},
                                 "gpu_ecc_errors_total:uncorrected_volatile"),
    "ecc_uncorrected_aggregate": ("gpu_ecc_errors_total", {"error_type": "uncorrected", "counter": "aggregate"},
                                  "gpu_ecc_errors_total:uncorrected_aggregate"),
    "retired_pending": ("gpu_retired_pages_pending", {}, "gpu_retired_pages_pending"),
    "remap_corr": ("gpu_remapped_rows", {"error_type": "corrected"}, "gpu_remapped_rows"),
    "remap_unc": ("gpu_remapped_rows", {"error_type": "uncorrected"}, "gpu_remapped_rows"),
    "remap_pending": ("gpu_remapped_rows_pending", {}, "gpu_remapped_rows"),
    "remap_failure": ("gpu_remapped_rows_failed", {}, "gpu_remapped_rows"),
    "clocks_event_reasons": ("gpu_throttle_reason_active", {}, "gpu_throttle_reason_active"),
    "enc_util": ("gpu_encoder_utilization_ratio", {}, "gpu_encoder_utilization_ratio"),
    "dec_util": ("gpu_decoder_utilization_ratio", {}, "gpu_decoder_utilization_ratio"),
    "mig_mode": ("gpu_mig_mode_enabled", {}, "gpu_mig_mode_enabled"),
    "nvlinks": ("gpu_link_up", {}, "gpu_link_up:count"),
    "default_limit_mw": ("gpu_power_default_limit_watts", {}, "gpu_power_default_limit_watts"),
    "compute_mode": ("gpu_compute_mode", {}, "gpu_compute_mode"),
    "fabric_state": ("gpu_fabric_state", {}, "gpu_fabric_state"),
    "recovery_action": ("gpu_recovery_action", {}, "gpu_recovery_action"),
}
NOT_READINGS = {
    "minor": "identity (device node), not published",
    "pci_device_id": "identity, not published",
    "pci_subsystem_id": "identity, not published",
    "pci_class": "identity, not published",
    "brand": "identity, not published",
    "arch": "identity, not published",
    "numa": "the fake's topology input",
    "power_limit_mw": "nvmlDeviceGetPowerManagementLimit: not read (the enforced limit is)",
    "pcie_gpu_max_gen": "nvmlDeviceGetGpuMaxPcieLinkGeneration: not read",
    "fans": "the fake's fan count (fan calls answer when > 0)",
    "ecc_pending": "pending ECC mode: not read",
    "supported_clocks_event_reasons": "a support mask: unknown support reports every reason from the current mask",
    "violation_ref": "reference time of the violation counters, not published",
    "enc_period_us": "sampling period, not published",
    "dec_period_us": "sampling period, not published",
    "jpg_util": "nvmlDeviceGetJpgUtilization: no family (test_nvml_simple_row.py adds one in a copy)",
    "jpg_period_us": "sampling period, not published",
    "ofa_util": "nvmlDeviceGetOfaUtilization: no family",
    "ofa_period_us": "sampling period, not published",
    "mig_pending": "pending MIG mode: not read",
    "mig_max": "MIG slot count, read only with MIG on (bounded to 64)",
    "supported_events": "event mask of the XID watcher",
    "lost": "the fake's fault injection",
    "delay_ms": "the fake's fault injection",
    "gpm_supported": "GPM support flag (GPM values: test_nvml_gpm.py)",
    "fabric_status": "the fabric registration's nvmlReturn_t, not a value",
}


def test_every_numeric_key_of_the_fake_has_a_row() -> None:
    numeric = {k for k, v in _default_gpu(0, 1).items() if isinstance(v, int | float) and not isinstance(v, bool)}
    assert numeric - set(READINGS) - set(NOT_READINGS) == set(), "add a row to READINGS or NOT_READINGS"
    assert set(READINGS) & set(NOT_READINGS) == set()


def series(s: dict[tuple[str, frozenset], float], gpu: int, family: str, labels: dict[str, str]) -> list[float]:
    want = {("gpu", str(gpu)), *labels.items()}
    return [v for (n, ls), v in s.items() if n == family and want <= ls]


@pytest.mark.parametrize("sentinel", SENTINELS, ids=hex)
def test_every_reading_fed_a_sentinel_is_absent_and_logged_once(sentinel: int, tmp_path: Path) -> None:
    # GPU 0 is the control; GPU i + 1 carries the sentinel in the i-th key, nothing else changed.
    keys = list(READINGS)
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=len(keys) + 1, fans=1, gpm_supported=0, nvlinks=2,
                     nvlink_active=[1, 1])
    for i, key in enumerate(keys, start=1):
        fleet.gpus[i][key] = sentinel
    fleet.write()
    args = ["--backend", "nvml", "--cache-ttl", "0", "--collection-timeout", "30", "--pcie-throughput",
            "--fields-exclude", "gpu_p2p_supported,gpu_topology_level"]
    with ExporterProcess(args, env=fleet.env()) as ex:
        scrapes = [ex.scrape(), ex.scrape()]
        log = ex.log()
    wrong = []
    bad_values = {sentinel * f for f in FACTORS}
    for s in scrapes:
        for i, key in enumerate(keys, start=1):
            family, labels, _ = READINGS[key]
            if not series(s, 0, family, labels):
                wrong.append(f"{key}: {family}{labels} missing on the control GPU")
            if got := series(s, i, family, labels):
                wrong.append(f"{key}={sentinel:#x}: {family}{labels} published as {got}")
            leaked = [(n, v) for (n, ls), v in s.items() if ("gpu", str(i)) in ls and v in bad_values]
            if leaked:
                wrong.append(f"{key}={sentinel:#x}: sentinel published in {leaked}")
            if sample(s, "gpu_up", gpu=str(i)) != 1.0:
                wrong.append(f"{key}={sentinel:#x}: GPU {i} not up")
        if (n := sample(s, "gpu_exporter_collection_errors_total", backend="nvml", kind="no_value") or 0) < len(keys):
            wrong.append(f"no_value errors counted: {n}, want at least {len(keys)}")
    for i, key in enumerate(keys, start=1):
        reading = READINGS[key][2]
        lines = re.findall(rf"GPU {i}: {re.escape(reading)} failed \(.*no value.*\n", log)
        if len(lines) != 1:
            wrong.append(f"{key}={sentinel:#x}: {len(lines)} 'no value' log lines for {reading} on GPU {i}")
    assert wrong == []
