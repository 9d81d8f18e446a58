"""The metric schema: one row per per-GPU family, shared by every backend.

To add a reading: add a field to :class:`~exporter.core.readings.GpuReading`, a row here,
a line in ``docs/metrics.md``, and fill it in the backends that can read it.

Each row names the reading attribute; scalar attributes give one sample per GPU, dict
attributes one sample per key, with the key in ``label`` (tuple keys: one label each).
"""

from __future__ import annotations

from dataclasses import dataclass

GAUGE, COUNTER = "gauge", "counter"


@dataclass(frozen=True)
class Family:
    name: str  # full name; counters end in _total
    kind: str
    help: str
    attr: str  # GpuReading attribute
    labels: tuple[str, ...] = ()  # extra labels for dict attributes
    nvml: str = ""  # NVML source (docs)
    smi: str = ""  # nvidia-smi / amd-smi equivalent (docs)

    @property
    def base(self) -> str:
        """Name without the ``_total`` suffix (prometheus_client's family name for counters)."""
        return self.name[: -len("_total")] if self.kind == COUNTER else self.name


F = Family
GPU_FAMILIES: tuple[Family, ...] = (
    F("gpu_utilization_ratio", GAUGE, "Fraction of time a kernel ran on the GPU over the last sample period (0-1).",
      "utilization_ratio", nvml="nvmlDeviceGetUtilizationRates.gpu", smi="utilization.gpu"),
    F("gpu_memory_utilization_ratio", GAUGE,
      "Fraction of time device memory was read or written over the last sample period (0-1).",
      "memory_utilization_ratio", nvml="nvmlDeviceGetUtilizationRates.memory", smi="utilization.memory"),
    F("gpu_encoder_utilization_ratio", GAUGE, "Video encoder utilisation (0-1).", "encoder_utilization_ratio",
      nvml="nvmlDeviceGetEncoderUtilization", smi="utilization.encoder"),
    F("gpu_decoder_utilization_ratio", GAUGE, "Video decoder utilisation (0-1).", "decoder_utilization_ratio",
      nvml="nvmlDeviceGetDecoderUtilization", smi="utilization.decoder"),
    F("gpu_memory_total_bytes", GAUGE, "Total device memory in bytes.", "memory_total_bytes",
      nvml="nvmlDeviceGetMemoryInfo_v2.total", smi="memory.total"),
    F("gpu_memory_used_bytes", GAUGE, "Device memory allocated by processes, in bytes.", "memory_used_bytes",
      nvml="nvmlDeviceGetMemoryInfo_v2.used", smi="memory.used"),
    F("gpu_memory_free_bytes", GAUGE, "Device memory free for allocation, in bytes.", "memory_free_bytes",
      nvml="nvmlDeviceGetMemoryInfo_v2.free", smi="memory.free"),
    F("gpu_memory_reserved_bytes", GAUGE, "Device memory reserved by the driver and firmware, in bytes.",
      "memory_reserved_bytes", nvml="nvmlDeviceGetMemoryInfo_v2.reserved", smi="memory.reserved"),
    F("gpu_temperature_celsius", GAUGE,
      "Temperature in degrees Celsius by sensor: gpu (die/edge), memory (HBM), junction (hotspot, AMD).",
      "temperature_celsius", ("sensor",), nvml="nvmlDeviceGetTemperature / NVML_FI_DEV_MEMORY_TEMP",
      smi="temperature.gpu, temperature.memory"),
    F("gpu_power_watts", GAUGE, "Power draw in watts.", "power_watts",
      nvml="nvmlDeviceGetPowerUsage (mW)", smi="power.draw"),
    F("gpu_power_limit_watts", GAUGE, "Enforced power limit in watts.", "power_limit_watts",
      nvml="nvmlDeviceGetEnforcedPowerLimit (mW)", smi="enforced.power.limit"),
    F("gpu_energy_joules_total", COUNTER, "Energy consumed since the driver was loaded, in joules.",
      "energy_joules", nvml="nvmlDeviceGetTotalEnergyConsumption (mJ)", smi="(nvidia-smi -q: n/a)"),
    F("gpu_clock_hertz", GAUGE, "Current clock frequency in hertz by clock: graphics, sm, memory, video, soc.",
      "clock_hertz", ("clock",), nvml="nvmlDeviceGetClockInfo (MHz)",
      smi="clocks.gr, clocks.sm, clocks.mem, clocks.video"),
    F("gpu_clock_max_hertz", GAUGE, "Maximum clock frequency in hertz by clock.", "clock_max_hertz", ("clock",),
      nvml="nvmlDeviceGetMaxClockInfo (MHz)", smi="clocks.max.gr, clocks.max.sm, clocks.max.mem"),
    F("gpu_pcie_link_generation", GAUGE, "Current PCIe link generation.", "pcie_link_generation",
      nvml="nvmlDeviceGetCurrPcieLinkGeneration", smi="pcie.link.gen.current"),
    F("gpu_pcie_link_generation_max", GAUGE, "Maximum PCIe link generation of the GPU and system.",
      "pcie_link_generation_max", nvml="nvmlDeviceGetMaxPcieLinkGeneration", smi="pcie.link.gen.max"),
    F("gpu_pcie_link_width", GAUGE, "Current PCIe link width in lanes.", "pcie_link_width",
      nvml="nvmlDeviceGetCurrPcieLinkWidth", smi="pcie.link.width.current"),
    F("gpu_pcie_link_width_max", GAUGE, "Maximum PCIe link width in lanes.", "pcie_link_width_max",
      nvml="nvmlDeviceGetMaxPcieLinkWidth", smi="pcie.link.width.max"),
    F("gpu_pcie_replays_total", COUNTER, "PCIe replay events since the driver was loaded.", "pcie_replay_total",
      nvml="nvmlDeviceGetPcieReplayCounter", smi="nvidia-smi -q: Replays Since Reset"),
    F("gpu_fan_speed_ratio", GAUGE, "Fan speed as a fraction of its maximum (0-1). Absent on passive GPUs.",
      "fan_speed_ratio", nvml="nvmlDeviceGetFanSpeed (%)", smi="fan.speed"),
    F("gpu_performance_state", GAUGE, "Performance state: 0 (P0, maximum) to 15 (P15, minimum).",
      "performance_state", nvml="nvmlDeviceGetPerformanceState", smi="pstate"),
    F("gpu_ecc_mode_enabled", GAUGE, "1 when ECC is enabled.", "ecc_mode_enabled",
      nvml="nvmlDeviceGetEccMode", smi="ecc.mode.current"),
    F("gpu_ecc_errors_total", COUNTER,
      "ECC errors by error_type (corrected, uncorrected) and counter (volatile: since boot; aggregate: lifetime).",
      "ecc_errors", ("error_type", "counter"), nvml="nvmlDeviceGetTotalEccErrors",
      smi="ecc.errors.corrected.volatile.total ..."),
    F("gpu_retired_pages", GAUGE, "Retired framebuffer pages by cause (single_bit, double_bit).",
      "retired_pages", ("cause",), nvml="nvmlDeviceGetRetiredPages",
      smi="retired_pages.single_bit_ecc.count, retired_pages.double_bit.count"),
    F("gpu_retired_pages_pending", GAUGE, "1 when a page retirement waits for a reboot.", "retired_pages_pending",
      nvml="nvmlDeviceGetRetiredPagesPendingStatus", smi="retired_pages.pending"),
    F("gpu_remapped_rows", GAUGE, "Remapped memory rows by error_type (corrected, uncorrected).",
      "remapped_rows", ("error_type",), nvml="nvmlDeviceGetRemappedRows",
      smi="remapped_rows.correctable, remapped_rows.uncorrectable"),
    F("gpu_remapped_rows_pending", GAUGE, "1 when a row remap waits for a GPU reset.", "remapped_rows_pending",
      nvml="nvmlDeviceGetRemappedRows.isPending", smi="remapped_rows.pending"),
    F("gpu_remapped_rows_failed", GAUGE, "1 when a row remap failed (the GPU needs service).",
      "remapped_rows_failed", nvml="nvmlDeviceGetRemappedRows.failureOccurred", smi="remapped_rows.failure"),
    F("gpu_throttle_reason_active", GAUGE, "1 while a clock event (throttle) reason is active, by reason.",
      "throttle_reasons", ("reason",), nvml="nvmlDeviceGetCurrentClocksEventReasons",
      smi="clocks_event_reasons.*"),
    F("gpu_violation_seconds_total", COUNTER, "Time clocks were held below target, by reason, in seconds.",
      "violation_seconds", ("reason",), nvml="nvmlDeviceGetViolationStatus (ns)",
      smi="nvidia-smi -q -d PERFORMANCE"),
    F("gpu_link_up", GAUGE, "1 when a GPU interconnect link (NVLink, XGMI) is active, by link.", "link_up",
      ("link",), nvml="nvmlDeviceGetNvLinkState", smi="nvidia-smi nvlink -s"),
    F("gpu_link_errors_total", COUNTER, "GPU interconnect link errors summed over all links, by counter.",
      "link_errors", ("counter",), nvml="NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL", smi="nvidia-smi nvlink -e"),
    F("gpu_pcie_throughput_bytes_per_second", GAUGE,
      "PCIe throughput by direction (tx, rx), bytes per second (opt-in: --pcie-throughput, ~20 ms per GPU).",
      "pcie_throughput", ("direction",), nvml="nvmlDeviceGetPcieThroughput (KB/s)", smi="nvidia-smi dmon -s t"),
    F("gpu_processes", GAUGE, "Compute processes running on the GPU.", "process_count",
      nvml="nvmlDeviceGetComputeRunningProcesses", smi="--query-compute-apps=pid (count)"),
    F("gpu_processes_memory_used_bytes", GAUGE, "Device memory used by all compute processes, in bytes.",
      "process_memory_used_bytes", nvml="nvmlDeviceGetComputeRunningProcesses.usedGpuMemory",
      smi="--query-compute-apps=used_memory (sum)"),
    F("gpu_process_memory_used_bytes", GAUGE, "Device memory used per process, by pid (opt-in: --per-process).",
      "process_memory_by_pid", ("pid",), nvml="nvmlDeviceGetComputeRunningProcesses",
      smi="--query-compute-apps=pid,used_memory"),
    F("gpu_mig_mode_enabled", GAUGE, "1 when MIG (NVIDIA) or a compute partition mode (AMD) is enabled.",
      "mig_mode_enabled", nvml="nvmlDeviceGetMigMode", smi="mig.mode.current"),
)

FAMILY_BY_NAME = {f.name: f for f in GPU_FAMILIES}

# Families emitted outside the per-GPU table (documented in docs/metrics.md too).
SPECIAL_FAMILIES = (
    "gpu_info",
    "gpu_up",
    "gpu_host_info",
    "gpu_mig_memory_total_bytes",
    "gpu_mig_memory_used_bytes",
    "gpu_mig_utilization_ratio",
    "gpu_p2p_supported",
    "gpu_topology_level",
    "gpu_xid_errors_total",
    "gpu_xid_last_timestamp_seconds",
    "gpu_pci_devices",
    "gpu_visible_devices",
    "gpu_field_unsupported",
    "gpu_allocation_info",
)

# NVML topology levels (nvmlGpuTopologyLevel_t); AMD maps onto the same names.
TOPOLOGY_LEVELS = {"internal": 0, "single": 10, "multiple": 20, "hostbridge": 30, "node": 40, "system": 50}


def all_family_names() -> list[str]:
    return [f.name for f in GPU_FAMILIES] + list(SPECIAL_FAMILIES)


def _unit(name: str) -> str:
    for unit in ("bytes_per_second", "bytes", "celsius", "watts", "joules", "hertz", "ratio", "seconds"):
        if unit in name:
            return unit.replace("_", " ")
    return "1"


def markdown_table() -> str:
    """The per-GPU family table of docs/metrics.md (``python -m exporter.core.schema`` prints it)."""
    rows = ["| name | type | unit | extra labels | NVML source | nvidia-smi | help |", "|---|---|---|---|---|---|---|"]
    for f in GPU_FAMILIES:
        labels = ", ".join(f"`{label}`" for label in f.labels) or "-"
        rows.append(f"| `{f.name}` | {f.kind} | {_unit(f.name)} | {labels} | `{f.nvml}` | `{f.smi}` | {f.help} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
