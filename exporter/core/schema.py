"""The metric schema: every family the exporter and the profiler can publish, declared once, one row each.

The renderer (names, types, help), the field filter (``--fields-include/--fields-exclude``),
``--check-config``, the contract test and ``docs/metrics.md`` all read this table; nothing else
declares a family. A row's ``views`` are its GPU fields outside ``/metrics`` (exporter/core/fields.py):
``/stats``, gpu-metrics, the Python API's ``GpuStatus`` and ``Recording``, ``snapshot`` and ``diff``
read them (exporter/core/views.py's ``FIELDS``). To add one: a row here, the :class:`~exporter.core.readings.GpuReading`
field that carries its value (per-GPU families), and the family's name in the ``families`` of
each backend that fills it (:class:`~exporter.backends.base.Backend`; docs/extending.md).
Which backend fills what is the backends' declaration, never a column here: a row says only
``every_backend`` when the exporter itself fills it whatever the backend (identity, self-metrics).

A row's ``scope`` says which labels come first and where the value comes from; the renderer
(exporter/serve/render.py) writes every family from its row alone, and its ``attr`` names the value:

- ``gpu``: one sample per GPU (``gpu``, ``uuid``, then ``labels``) from the reading's ``attr``;
  a scalar attribute gives one sample, a dict one sample per key (tuple keys: one label each), a
  set one sample of 1 per member. Rows the exporter fills for ``every_backend`` are published for
  a GPU that is down too (its identity); the others only for a GPU that answered;
- ``mig``: per MIG instance / compute partition of a GPU, from the ``MigReading``'s ``attr``;
- ``peer``: per ordered GPU pair (topology), from the ``PeerReading``'s ``attr`` (a dict);
- ``event``: from the ``Collection``'s ``attr``, a dict keyed by (gpu, uuid, the row's labels);
- ``node``: per backend's collection (``vendor``), from the ``Collection``'s ``attr``;
- ``host``: the host (``HostInfo``);
- ``pod``: per pod allocation, from the pod attribution plugin (exporter/k8s);
- ``self``: the exporter's own health, always published (not filterable): per backend (first
  label) from its ``BackendStats``'s ``attr``; the process (``process_*``, read from /proc by
  core/host.py as prometheus_client's ProcessCollector reads them); or from a plugin.
- ``profiler``: the profiler's own families (``PROFILER_FAMILIES``, a table of their own: ``serve``
  never publishes them), written by the same writer (exporter/platform/exposition.py).

A row whose name ends in ``_info`` is an info family: one sample of 1 per GPU, host or build, its
labels the attributes of that name (of the reading, ``HostInfo`` or the build).

``default=False`` families are collected (the JSON API and ``snapshot`` show them) but are
left off ``/metrics`` unless ``--fields-include`` selects them: the GPU-pair topology is
N x (N-1) series and would make the default scrape quadratic in the GPU count.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from exporter.core.fields import Field, Legacy, Record, Rise, identity

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

GAUGE, COUNTER = "gauge", "counter"

SCOPE_LABELS = {"gpu": ("gpu", "uuid"), "mig": ("gpu", "uuid"), "peer": ("gpu", "uuid", "peer"),
                "event": ("gpu", "uuid"), "node": (), "host": (), "pod": (), "self": (), "profiler": ()}


@dataclass(frozen=True)
class Family:
    """One metric family. ``unit`` is the SI unit of the value ("1": a count, level or flag)."""

    name: str  # full name; counters end in _total
    kind: str
    unit: str
    help: str
    group: str  # field group (docs/metrics.md sections)
    scope: str = "gpu"
    labels: tuple[str, ...] = ()  # labels after the scope's (per-GPU: after gpu, uuid)
    attr: str = ""  # where the value is read, per scope (see above): GpuReading, MigReading, PeerReading ...
    when: str = ""  # a condition for the series to exist (MIG on, an opt-in flag, an event seen ...)
    default: bool = True  # on /metrics without field selection
    filterable: bool = True
    nvml: str = ""  # NVML source
    # what each vendor tool shows of it, by tool: {"nvidia-smi": "power.draw", "amd-smi": "amd-smi metric --power"};
    # any tool, none required (a tool left out has none); a backend adds its own tool's (Backend.equivalents);
    # docs/metrics.md has a column per tool and /api/v1/families an entry per tool
    tools: Mapping[str, str] = field(default_factory=dict, hash=False)
    every_backend: bool = False  # filled by the exporter whatever the backend; else as backends declare it
    # NVIDIA GPM: the NVML_GPM_METRIC_* ids read into ``attr``, each with its label value ("" for none
    # besides gpu_instance); in % (unit "ratio") or MiB/s ("bytes per second"). nvml_gpm.py reads these.
    gpm: tuple[tuple[int, str], ...] = ()
    # How the family shows outside /metrics (core/fields.py): its fields in /stats, gpu-metrics, GpuStatus,
    # Recording, the snapshot table and diff's rule; a field left incomplete is completed from this row.
    views: tuple[Field, ...] = ()

    def __post_init__(self) -> None:
        if self.views and self.scope != "gpu":
            raise ValueError(f"{self.name}: views are per-GPU fields; scope {self.scope!r} has none")
        object.__setattr__(self, "tools", MappingProxyType(dict(self.tools)))  # read-only, as the row is
        object.__setattr__(self, "views", tuple(v.of(self.attr, self.unit, self.help, self.equivalent("nvidia-smi"))
                                                for v in self.views))

    def equivalent(self, tool: str) -> str:
        """What ``tool`` (``nvidia-smi``, ``amd-smi`` ...) shows of this family; "" when the row does not say."""
        return self.tools.get(tool, "")

    @property
    def base(self) -> str:
        """Name without the ``_total`` suffix (OpenMetrics and prometheus_client family name)."""
        return self.name[: -len("_total")] if self.kind == COUNTER else self.name

    @property
    def all_labels(self) -> tuple[str, ...]:
        return SCOPE_LABELS[self.scope] + self.labels


# GPM families: computed from two samples, so absent on a GPU's first collection.
_GPM = "GPM (Hopper or later, R520+ driver), from the second collection"
# Families AMD fills from its gpu_metrics table too, from the first collection.
_GPM_OR_AMD = _GPM + "; AMD: where gpu_metrics carries the field"
_AMD_MM = ("gpu_metrics average_mm_activity, else the mean of vcn_activity (amd-smi metric --usage: mm_activity). "
           "AMD differs: one multimedia engine (VCN) both encodes and decodes, so the encoder and decoder series "
           "carry the same value")


def _g(name: str, kind: str, unit: str, help_: str, group: str, attr: str, nvml: str, tools: Mapping[str, str],
       *, labels: tuple[str, ...] = (), when: str = "", gpm: tuple[tuple[int, str], ...] = (),
       views: tuple[Field, ...] = ()) -> Family:
    """A per-GPU row; ``tools`` says what each vendor tool shows of it, by tool (``{"nvidia-smi": "power.draw",
    "amd-smi": "amd-smi metric --power: socket_power"}``): any tools, a tool with no equivalent left out."""
    if not isinstance(tools, Mapping):  # the old (nvml, smi, amd) positional form
        raise TypeError(f"{name}: the row's equivalents are a mapping of vendor tool -> what it shows")
    return Family(name, kind, unit, help_, group, "gpu", labels, attr, when=when, nvml=nvml, tools=tools, gpm=gpm,
                  views=views)


MIB = 2**20
_MIB_DOC = "MB = MiB (nvidia-smi memory.{} [MiB])"


FAMILIES: tuple[Family, ...] = (
    # --- identity and state --------------------------------------------------------------------
    Family("gpu_info", GAUGE, "1", "GPU identity; value is always 1. Join on (gpu, uuid) for names.", "identity",
           labels=("name", "vendor", "pci_bus_id", "serial", "driver_version", "cuda_version", "backend",
                   "vbios_version"),
           nvml="nvmlDeviceGetName, GetUUID, GetPciInfo, GetSerial, GetVbiosVersion",
           tools={"nvidia-smi": "name, uuid, pci.bus_id, serial, driver_version, vbios_version",
                  "amd-smi": "amd-smi static --asic --board --driver --vbios"}, every_backend=True,
           # who the GPU is, in every view (``up``, gpu_up's value, is identity there too)
           views=(identity("backend", "backend", nullable=False),
                  identity("index", "reading.index", nullable=False, kind="integer"),
                  identity("id", "gpu_id", nullable=False, stats=None, pattern="^gpu-[0-9]+$", legacy=Legacy("id")),
                  identity("name", "reading.name", legacy=Legacy("name"), status=True, diff="fixed"),
                  identity("uuid", "reading.uuid", nullable=False, legacy=Legacy("uuid"), status=True, diff="fixed"),
                  identity("vendor", "reading.vendor", nullable=False),
                  identity("up", "reading.up", nullable=False, kind="boolean", status=True, diff="fixed"),
                  identity("pci_bus_id", "reading.pci_bus_id", diff="fixed"),
                  identity("serial", "reading.serial"),
                  identity("driver_version", "reading.driver_version", diff="fixed"),
                  identity("cuda_version", "reading.cuda_driver_version", diff="fixed"))),
    Family("gpu_up", GAUGE, "1", "1 when the GPU answered this collection, 0 when it is lost or unreadable.",
           "identity", attr="up", nvml="NVML_ERROR_GPU_IS_LOST and device faults -> 0",
           tools={"nvidia-smi": "(nvidia-smi: 'GPU is lost')",
                  "amd-smi": "(amd-smi: device errors)"}, every_backend=True),
    Family("gpu_health_state", GAUGE, "1",
           "1 for the GPU's health state and 0 for the others: ok, degraded, failed, hung or lost "
           "(OpenTelemetry hw.status); cause says why (exporter/core/gpu_health.py).", "identity",
           labels=("state", "cause"), attr="health",
           nvml="gpu_up, --call-deadline, XIDs and ECC by severity (exporter/core/xid.py), recovery action",
           tools={"nvidia-smi": "(none: nvidia-smi -q's 'GPU Recovery Action', Xid lines in dmesg)",
                  "amd-smi": "(none: amd-smi metric --ecc, RAS events)"}, every_backend=True,
           views=(identity("health", "reading.health_state", nullable=False, status=True, column="health",
                           pattern="^(ok|degraded|failed|hung|lost)$"),
                  identity("health_cause", "reading.health_cause", nullable=False, status=True, minimum=None))),
    Family("gpu_field_unsupported", GAUGE, "1",
           "1 for each metric family this GPU or driver does not support (so absence is explained).", "identity",
           labels=("field",), attr="unsupported", when="a reading is unsupported",
           nvml="NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION",
           tools={"nvidia-smi": "[N/A], [Not Supported]", "amd-smi": "N/A, AMDSMI_STATUS_NOT_SUPPORTED"}),
    Family("gpu_host_info", GAUGE, "1", "Host identity; value is always 1.", "identity", scope="host",
           labels=("node", "cpu_model", "kernel", "os"), filterable=False,
           tools={"nvidia-smi": "(hostname, lscpu, uname -r)",
                  "amd-smi": "(hostname, lscpu, uname -r)"}, every_backend=True),
    # --- utilisation ------------------------------------------------------------------------------
    _g("gpu_utilization_ratio", GAUGE, "ratio",
       "Fraction of time a kernel ran on the GPU over the last sample period (0-1).", "utilization",
       "utilization_ratio", "nvmlDeviceGetUtilizationRates.gpu (%)",
       {"nvidia-smi": "utilization.gpu", "amd-smi": "amd-smi metric --usage: gfx_activity"},
       views=(Field("utilization_ratio", "ratio", "reading.utilization_ratio", digits=6, maximum=1,
                    doc="GPU utilisation, 0-1 (nvidia-smi utilization.gpu / 100)", status=True,
                    legacy=Legacy("utilization", "GPU utilisation, percent 0-100 (nvidia-smi utilization.gpu)",
                                  "percent", 100, digits=2, maximum=100),
                    record=Record("utilization", 100, samples=True, doc="percent", minimum=0, maximum=100)),)),
    _g("gpu_memory_utilization_ratio", GAUGE, "ratio",
       "Fraction of time device memory was read or written over the last sample period (0-1).", "utilization",
       "memory_utilization_ratio", "nvmlDeviceGetUtilizationRates.memory (%)",
       {"nvidia-smi": "utilization.memory", "amd-smi": "amd-smi metric --usage: umc_activity"}),
    _g("gpu_encoder_utilization_ratio", GAUGE, "ratio", "Video encoder utilisation (0-1).", "utilization",
       "encoder_utilization_ratio", "nvmlDeviceGetEncoderUtilization (%)",
       {"nvidia-smi": "utilization.encoder", "amd-smi": _AMD_MM}),
    _g("gpu_decoder_utilization_ratio", GAUGE, "ratio", "Video decoder utilisation (0-1).", "utilization",
       "decoder_utilization_ratio", "nvmlDeviceGetDecoderUtilization (%)",
       {"nvidia-smi": "utilization.decoder", "amd-smi": _AMD_MM}),
    # --- memory --------------------------------------------------------------------------------
    _g("gpu_memory_total_bytes", GAUGE, "bytes", "Total device memory in bytes.", "memory", "memory_total_bytes",
       "nvmlDeviceGetMemoryInfo_v2.total",
       {"nvidia-smi": "memory.total", "amd-smi": "amd-smi metric --mem-usage: total_vram"},
       views=(Field("memory_total_bytes", "bytes", "reading.memory_total_bytes", kind="integer",
                    doc="bytes (nvidia-smi memory.total)", status=True, diff="fixed",
                    legacy=Legacy("memory.total", "framebuffer memory, " + _MIB_DOC.format("total"), "MiB", per=MIB,
                                  digits=None, while_down=True)),)),
    _g("gpu_memory_used_bytes", GAUGE, "bytes", "Device memory allocated by processes, in bytes.", "memory",
       "memory_used_bytes", "nvmlDeviceGetMemoryInfo_v2.used",
       {"nvidia-smi": "memory.used", "amd-smi": "amd-smi metric --mem-usage: used_vram"},
       views=(Field("memory_used_bytes", "bytes", "reading.memory_used_bytes", kind="integer",
                    doc="bytes (nvidia-smi memory.used)", status=True,
                    diff="rise", rise=Rise("memory", 256 * MIB, "memory in use"),
                    legacy=Legacy("memory.used", _MIB_DOC.format("used"), "MiB", per=MIB, digits=None),
                    record=Record("memory_used_mb", 1 / MIB)),)),
    _g("gpu_memory_free_bytes", GAUGE, "bytes", "Device memory free for allocation, in bytes.", "memory",
       "memory_free_bytes", "nvmlDeviceGetMemoryInfo_v2.free",
       {"nvidia-smi": "memory.free", "amd-smi": "amd-smi metric --mem-usage: free_vram"},
       # free: total - used where the driver gives no free; and the share used, derived from the two
       views=(Field("memory_free_bytes", "bytes", "reading.free_memory_bytes()", kind="integer",
                    doc="bytes (nvidia-smi memory.free)", status=True,
                    legacy=Legacy("memory.free", _MIB_DOC.format("free"), "MiB", per=MIB, digits=None)),
              Field("memory_used_ratio", "ratio", "memory_used_ratio", digits=6, maximum=1,
                    doc="memory used / total, 0-1", record=Record("memory_usage_percent", 100)))),
    _g("gpu_memory_reserved_bytes", GAUGE, "bytes", "Device memory reserved by the driver and firmware, in bytes.",
       "memory", "memory_reserved_bytes", "nvmlDeviceGetMemoryInfo_v2.reserved",
       {"nvidia-smi": "memory.reserved", "amd-smi": "(none)"}),
    # --- thermal and power -----------------------------------------------------------------------
    _g("gpu_temperature_celsius", GAUGE, "celsius",
       "Temperature in degrees Celsius by sensor: gpu (die/edge; absent on AMD boards without an edge sensor, "
       "MI300 class), memory (HBM), junction (hotspot, AMD).",
       "thermal", "temperature_celsius", "nvmlDeviceGetTemperature; NVML_FI_DEV_MEMORY_TEMP",
       {"nvidia-smi": "temperature.gpu, temperature.memory",
        "amd-smi": "amd-smi metric --temperature: edge, hotspot, mem"},
       labels=("sensor",),
       views=(Field("temperature_celsius", "celsius", "reading.temperature_celsius[gpu]", digits=2, minimum=None,
                    doc="GPU die sensor, celsius", status=True,
                    legacy=Legacy("temperature", "GPU die sensor, celsius (nvidia-smi temperature.gpu; amd-smi edge)",
                                  digits=2, minimum=None),
                    record=Record("temperature_c")),)),
    _g("gpu_fan_speed_ratio", GAUGE, "ratio",
       "Fan speed as a fraction of its maximum, as the driver reports it (can exceed 1 on some boards). "
       "Absent on passive GPUs.", "thermal", "fan_speed_ratio", "nvmlDeviceGetFanSpeed (%)",
       {"nvidia-smi": "fan.speed", "amd-smi": "amd-smi metric --fan: usage"}),
    _g("gpu_power_watts", GAUGE, "watts", "Power draw in watts.", "power", "power_watts",
       "nvmlDeviceGetPowerUsage (mW)",
       {"nvidia-smi": "power.draw", "amd-smi": "amd-smi metric --power: socket_power"},
       # and the average power from the energy counter (core/views.py's PowerTracker)
       views=(Field("power_watts", "watts", "reading.power_watts",
                    doc="instantaneous power draw, W (nvidia-smi power.draw)", status=True,
                    legacy=Legacy("power_usage", "board power draw, W (nvidia-smi power.draw)"),
                    record=Record("power_draw_w")),
              Field("power_average_watts", "watts", "power_average_watts",
                    doc="average power over the last interval, W: energy counter difference / time",
                    diff="rise", rise=Rise("power", 30.0, "average power",
                                           "; the average from the energy counter when both snapshots have "
                                           "it, else the instantaneous reading", "power_watts", "power")),
              Field("power_average_seconds", "seconds", "power_average_seconds", digits=6,
                    doc="length of that interval, s"))),
    _g("gpu_power_limit_watts", GAUGE, "watts", "Enforced power limit in watts.", "power", "power_limit_watts",
       "nvmlDeviceGetEnforcedPowerLimit (mW)",
       {"nvidia-smi": "enforced.power.limit", "amd-smi": "amd-smi static --limit: power_cap"},
       views=(Field("power_limit_watts", "watts", "reading.power_limit_watts", doc="W (nvidia-smi power.limit)"),)),
    _g("gpu_energy_joules_total", COUNTER, "joules", "Energy consumed since the driver was loaded, in joules.",
       "power", "energy_joules", "nvmlDeviceGetTotalEnergyConsumption (mJ)",
       {"nvidia-smi": "(nvidia-smi -q: n/a)", "amd-smi": "amd-smi metric --energy: total_energy_consumption"},
       views=(Field("energy_joules", "joules", "reading.energy_joules", doc="energy counter since driver load, J"),)),
    _g("gpu_performance_state", GAUGE, "1", "Performance state: 0 (P0, maximum) to 15 (P15, minimum).", "power",
       "performance_state", "nvmlDeviceGetPerformanceState", {"nvidia-smi": "pstate", "amd-smi": "(none)"}),
    # --- clocks ----------------------------------------------------------------------------------
    _g("gpu_clock_hertz", GAUGE, "hertz",
       "Current clock frequency in hertz by clock: graphics, sm, memory, video, soc.", "clocks", "clock_hertz",
       "nvmlDeviceGetClockInfo (MHz)",
       {"nvidia-smi": "clocks.gr, clocks.sm, clocks.mem, clocks.video",
        "amd-smi": "amd-smi metric --clock: gfx, mem, soc"}, labels=("clock",),
       views=(Field("clock_graphics_hertz", "hertz", "reading.clock_hertz[graphics]", stats=None,
                    legacy=Legacy("clock_speeds.graphics", "MHz (nvidia-smi clocks.gr)", "MHz", per=1e6, digits=1)),
              Field("clock_memory_hertz", "hertz", "reading.clock_hertz[memory]", stats=None,
                    legacy=Legacy("clock_speeds.memory", "MHz (nvidia-smi clocks.mem)", "MHz", per=1e6, digits=1)))),
    _g("gpu_clock_max_hertz", GAUGE, "hertz", "Maximum clock frequency in hertz by clock.", "clocks",
       "clock_max_hertz", "nvmlDeviceGetMaxClockInfo (MHz)",
       {"nvidia-smi": "clocks.max.gr, clocks.max.sm, clocks.max.mem",
        "amd-smi": "amd-smi metric --clock: max_clk"}, labels=("clock",)),
    # --- PCIe ------------------------------------------------------------------------------------
    _g("gpu_pcie_link_generation", GAUGE, "1", "Current PCIe link generation (1-6).", "pcie",
       "pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration",
       {"nvidia-smi": "pcie.link.gen.current",
        "amd-smi": "amd-smi metric --pcie: speed (MT/s, mapped to a generation)"},
       views=(Field("pcie_link_generation", "", "reading.pcie_link_generation", kind="integer", diff="fixed",
                    stats="pcie.generation", doc="current link generation (nvidia-smi pcie.link.gen.current)"),)),
    _g("gpu_pcie_link_generation_max", GAUGE, "1",
       "Maximum PCIe link generation. NVIDIA: the lower of what the GPU and the system support; AMD: what the "
       "GPU supports.", "pcie", "pcie_link_generation_max",
       "nvmlDeviceGetMaxPcieLinkGeneration",
       {"nvidia-smi": "pcie.link.gen.max", "amd-smi": "amd-smi static --bus: max_pcie_speed"},
       views=(Field("pcie_link_generation_max", "", "reading.pcie_link_generation_max", kind="integer", diff="fixed",
                    stats="pcie.generation_max", doc="max link generation (nvidia-smi pcie.link.gen.max)"),)),
    _g("gpu_pcie_link_width", GAUGE, "1", "Current PCIe link width in lanes.", "pcie", "pcie_link_width",
       "nvmlDeviceGetCurrPcieLinkWidth",
       {"nvidia-smi": "pcie.link.width.current", "amd-smi": "amd-smi metric --pcie: width"},
       views=(Field("pcie_link_width", "", "reading.pcie_link_width", kind="integer", stats="pcie.width",
                    diff="fixed", doc="current link width, lanes (nvidia-smi pcie.link.width.current)"),)),
    _g("gpu_pcie_link_width_max", GAUGE, "1", "Maximum PCIe link width in lanes.", "pcie", "pcie_link_width_max",
       "nvmlDeviceGetMaxPcieLinkWidth",
       {"nvidia-smi": "pcie.link.width.max", "amd-smi": "amd-smi static --bus: max_pcie_width"},
       views=(Field("pcie_link_width_max", "", "reading.pcie_link_width_max", kind="integer", diff="fixed",
                    stats="pcie.width_max", doc="max link width, lanes (nvidia-smi pcie.link.width.max)"),)),
    _g("gpu_pcie_replays_total", COUNTER, "1", "PCIe replay events since the driver was loaded.", "pcie",
       "pcie_replay_total", "nvmlDeviceGetPcieReplayCounter",
       {"nvidia-smi": "nvidia-smi -q: Replays Since Reset", "amd-smi": "amd-smi metric --pcie: replay_count"}),
    _g("gpu_pcie_throughput_bytes_per_second", GAUGE, "bytes per second",
       "PCIe throughput by direction (tx, rx), bytes per second: from GPM where the GPU has it, else opt-in "
       "(--pcie-throughput, about 40 ms per GPU: 20 ms for each direction).",
       "pcie", "pcie_throughput", "nvmlGpmMetricsGet PCIE_TX/RX_PER_SEC (MiB/s); else "
       "nvmlDeviceGetPcieThroughput (KB/s)",
       {"nvidia-smi": "nvidia-smi dmon -s t",
        "amd-smi": "(none as a rate: rate(gpu_link_transferred_bytes_total{link_type=\"pcie\"}[5m]))"},
       labels=("direction",),
       when="GPM (from the second collection), or --pcie-throughput", gpm=((20, "tx"), (21, "rx"))),
    # --- activity: what share of the GPU works (DCGM_FI_PROF_*; NVIDIA GPM, AMD gpu_metrics) ------
    _g("gpu_sm_active_ratio", GAUGE, "ratio",
       "Fraction of SMs busy over the last collection interval (0-1), by gpu_instance (MIG; empty: whole GPU).",
       "activity", "sm_active_ratio", "nvmlGpmMetricsGet SM_UTIL (%)",
       {"nvidia-smi": "(DCGM_FI_PROF_SM_ACTIVE; dcgmi dmon -e 1002)",
        "amd-smi": "(none: gpu_metrics has no per-CU activity)"},
       labels=("gpu_instance",), when=_GPM, gpm=((2, ""),)),
    _g("gpu_sm_occupancy_ratio", GAUGE, "ratio",
       "Resident warps as a fraction of the SMs' maximum over the last collection interval (0-1), by gpu_instance.",
       "activity", "sm_occupancy_ratio", "nvmlGpmMetricsGet SM_OCCUPANCY (%)",
       {"nvidia-smi": "(DCGM_FI_PROF_SM_OCCUPANCY; dcgmi dmon -e 1003)",
        "amd-smi": "(none: gpu_metrics has no occupancy)"},
       labels=("gpu_instance",), when=_GPM, gpm=((3, ""),)),
    _g("gpu_graphics_engine_active_ratio", GAUGE, "ratio",
       "Fraction of time the graphics/compute engine was active over the last collection interval (0-1), by "
       "gpu_instance.", "activity", "graphics_engine_active_ratio",
       "nvmlGpmMetricsGet GRAPHICS_UTIL (%)",
       {"nvidia-smi": "(DCGM_FI_PROF_GR_ENGINE_ACTIVE; dcgmi dmon -e 1001)",
        "amd-smi": "gpu_metrics average_gfx_activity (amd-smi metric --usage: gfx_activity; rocm-smi: GPU use "
                   "(%)). AMD differs: averaged over the firmware's own window, not the collection interval; the "
                   "same value as gpu_utilization_ratio; gpu_instance is empty (partitions are GPUs)"},
       labels=("gpu_instance",),
       when=_GPM_OR_AMD, gpm=((1, ""),)),
    _g("gpu_pipe_active_ratio", GAUGE, "ratio",
       "Fraction of time the SMs' pipe was active over the last collection interval (0-1), by pipe (tensor, "
       "tensor_hmma, tensor_imma, tensor_dfma, fp64, fp32, fp16, integer) and gpu_instance.", "activity",
       "pipe_active_ratio", "nvmlGpmMetricsGet *_TENSOR_UTIL, FP64/FP32/FP16/INTEGER_UTIL (%)",
       {"nvidia-smi": "(DCGM_FI_PROF_PIPE_*_ACTIVE; dcgmi dmon -e 1004)",
        "amd-smi": "(none: gpu_metrics has no pipe activity)"},
       labels=("pipe", "gpu_instance"), when=_GPM,
       gpm=((5, "tensor"), (7, "tensor_hmma"), (9, "tensor_imma"), (6, "tensor_dfma"), (11, "fp64"), (12, "fp32"),
            (13, "fp16"), (4, "integer"))),
    _g("gpu_dram_active_ratio", GAUGE, "ratio",
       "Device memory bandwidth used as a fraction of the maximum over the last collection interval (0-1), by "
       "gpu_instance.", "activity", "dram_active_ratio",
       "nvmlGpmMetricsGet DRAM_BW_UTIL (%)",
       {"nvidia-smi": "(DCGM_FI_PROF_DRAM_ACTIVE; dcgmi dmon -e 1005)",
        "amd-smi": "gpu_metrics average_umc_activity (amd-smi metric --usage: umc_activity; rocm-smi: GPU Memory "
                   "Read/Write Activity (%)). AMD differs: the share of time the memory controller (UMC) was busy, "
                   "not bandwidth over peak bandwidth; averaged over the firmware's window; the same value as "
                   "gpu_memory_utilization_ratio"},
       labels=("gpu_instance",), when=_GPM_OR_AMD, gpm=((10, ""),)),
    _g("gpu_nvlink_throughput_bytes_per_second", GAUGE, "bytes per second",
       "NVLink traffic over all links by direction (tx, rx), bytes per second, over the last collection interval.",
       "activity", "nvlink_throughput", "nvmlGpmMetricsGet NVLINK_TOTAL_TX/RX_PER_SEC (MiB/s)",
       {"nvidia-smi": "(DCGM_FI_PROF_NVLINK_TX/RX_BYTES; nvidia-smi nvlink -gt d)",
        "amd-smi": "(none as a rate: rate(gpu_link_transferred_bytes_total{link_type=\"xgmi\"}[5m]))"},
       labels=("direction",),
       when=_GPM, gpm=((61, "tx"), (60, "rx"))),
    # --- health ----------------------------------------------------------------------------------
    _g("gpu_ecc_mode_enabled", GAUGE, "1", "1 when ECC is enabled.", "health", "ecc_mode_enabled",
       "nvmlDeviceGetEccMode", {"nvidia-smi": "ecc.mode.current", "amd-smi": "amd-smi static --ras"}),
    _g("gpu_ecc_errors_total", COUNTER, "1",
       "ECC errors by error_type (corrected, uncorrected) and counter (volatile: since the driver loaded; "
       "aggregate: lifetime, NVIDIA only; AMD's totals are volatile).",
       "health", "ecc_errors", "nvmlDeviceGetTotalEccErrors",
       {"nvidia-smi": "ecc.errors.corrected.volatile.total, ecc.errors.uncorrected.volatile.total, "
                      "ecc.errors.corrected.aggregate.total, ecc.errors.uncorrected.aggregate.total",
        "amd-smi": "amd-smi metric --ecc: total_correctable_count ..."},
       labels=("error_type", "counter")),
    _g("gpu_retired_pages", GAUGE, "1", "Retired framebuffer pages by cause (single_bit, double_bit).", "health",
       "retired_pages", "nvmlDeviceGetRetiredPages",
       {"nvidia-smi": "retired_pages.single_bit_ecc.count, retired_pages.double_bit.count",
        "amd-smi": "amd-smi bad-pages"},
       labels=("cause",)),
    _g("gpu_retired_pages_pending", GAUGE, "1", "1 when a page retirement waits for a reboot.", "health",
       "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus",
       {"nvidia-smi": "retired_pages.pending", "amd-smi": "(none)"}),
    _g("gpu_remapped_rows", GAUGE, "1", "Remapped memory rows by error_type (corrected, uncorrected).", "health",
       "remapped_rows", "nvmlDeviceGetRemappedRows",
       {"nvidia-smi": "remapped_rows.correctable, remapped_rows.uncorrectable", "amd-smi": "(none)"},
       labels=("error_type",)),
    _g("gpu_remapped_rows_pending", GAUGE, "1", "1 when a row remap waits for a GPU reset.", "health",
       "remapped_rows_pending", "nvmlDeviceGetRemappedRows.isPending",
       {"nvidia-smi": "remapped_rows.pending", "amd-smi": "(none)"}),
    _g("gpu_remapped_rows_failed", GAUGE, "1", "1 when a row remap failed (the GPU needs service).", "health",
       "remapped_rows_failed", "nvmlDeviceGetRemappedRows.failureOccurred",
       {"nvidia-smi": "remapped_rows.failure", "amd-smi": "(none)"}),
    _g("gpu_throttle_reason_active", GAUGE, "1", "1 while a clock event (throttle) reason is active, by reason.",
       "health", "throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons",
       {"nvidia-smi": "clocks_event_reasons.*", "amd-smi": "amd-smi metric --throttle"}, labels=("reason",)),
    _g("gpu_violation_seconds_total", COUNTER, "seconds",
       "Time clocks were held below target, by reason, in seconds.", "health", "violation_seconds",
       "nvmlDeviceGetViolationStatus (ns)",
       {"nvidia-smi": "nvidia-smi -q -d PERFORMANCE", "amd-smi": "amd-smi metric --throttle"},
       labels=("reason",)),
    # --- interconnect ----------------------------------------------------------------------------
    _g("gpu_link_up", GAUGE, "1", "1 when a GPU interconnect link (NVLink, XGMI) is active, by link.",
       "interconnect", "link_up", "nvmlDeviceGetNvLinkState",
       {"nvidia-smi": "nvidia-smi nvlink -s", "amd-smi": "amd-smi xgmi --link-status"}, labels=("link",)),
    _g("gpu_link_errors_total", COUNTER, "1",
       "NVLink errors since the driver loaded, by counter (replay, recovery, crc_flit, crc_data) and link; "
       "sum without (link) for the GPU's total.", "interconnect", "link_errors",
       "nvmlDeviceGetNvLinkErrorCounter (per link)",
       {"nvidia-smi": "nvidia-smi nvlink -e", "amd-smi": "(none)"}, labels=("counter", "link")),
    _g("gpu_link_transferred_bytes_total", COUNTER, "bytes",
       "Bytes moved over the GPU's links, by link_type (xgmi: summed over the XGMI links since the driver "
       "loaded; pcie: since the exporter's second collection) and direction (tx, rx; pcie: bidirectional).",
       "interconnect", "link_transferred_bytes",
       "(none: NVIDIA gives rates, gpu_nvlink_throughput_bytes_per_second and gpu_pcie_throughput_bytes_per_second)",
       {"nvidia-smi": "(none)",
        "amd-smi": "gpu_metrics xgmi_read_data_acc -> rx, xgmi_write_data_acc -> tx (KB, taken as 1000 bytes; "
                   "amd-smi xgmi --metric); pcie_bandwidth_acc (GB/s summed once per firmware iteration) averaged "
                   "over the iterations between two collections and multiplied by their time: an estimate of both "
                   "directions together"},
       labels=("link_type", "direction"), when="AMD gpu_metrics with data accumulators (MI300 class); pcie from "
       "the second collection"),
    # --- processes -------------------------------------------------------------------------------
    _g("gpu_processes", GAUGE, "1", "Compute processes running on the GPU.", "processes", "process_count",
       "nvmlDeviceGetComputeRunningProcesses_v3/_v2/v1",
       {"nvidia-smi": "--query-compute-apps=pid (count)", "amd-smi": "amd-smi process (count)"}),
    _g("gpu_processes_memory_used_bytes", GAUGE, "bytes", "Device memory used by all compute processes, in bytes.",
       "processes", "process_memory_used_bytes",
       "nvmlDeviceGetComputeRunningProcesses.usedGpuMemory",
       {"nvidia-smi": "--query-compute-apps=used_memory (sum)", "amd-smi": "amd-smi process: mem_usage (sum)"}),
    _g("gpu_process_memory_used_bytes", GAUGE, "bytes", "Device memory used per process, by pid "
       "(opt-in: --per-process).", "processes", "process_memory_by_pid",
       "nvmlDeviceGetComputeRunningProcesses",
       {"nvidia-smi": "--query-compute-apps=pid,used_memory", "amd-smi": "amd-smi process"},
       labels=("pid",), when="--per-process"),
    # --- state nvidia_gpu_exporter's dashboards read (issue 28) ----------------------------------
    _g("gpu_power_default_limit_watts", GAUGE, "watts",
       "Default power limit in watts: the board's limit before an administrator changes it.", "power",
       "power_default_limit_watts", "nvmlDeviceGetPowerManagementDefaultLimit (mW)",
       {"nvidia-smi": "power.default_limit", "amd-smi": "(none)"}),
    _g("gpu_compute_mode", GAUGE, "1",
       "Compute mode (nvmlComputeMode_t): 0 default (shared), 1 exclusive thread, 2 prohibited, 3 exclusive "
       "process.", "identity", "compute_mode", "nvmlDeviceGetComputeMode",
       {"nvidia-smi": "compute_mode", "amd-smi": "(none)"}),
    _g("gpu_fabric_state", GAUGE, "1",
       "NVLink fabric (NVSwitch) registration of the GPU (nvmlGpuFabricState_t): 1 not started, 2 in progress, "
       "3 completed.", "interconnect", "fabric_state", "nvmlDeviceGetGpuFabricInfo.state (R525+)",
       {"nvidia-smi": "fabric.state",
        "amd-smi": "(none)"}, when="a GPU on an NVLink fabric (absent when NVML says not supported)"),
    _g("gpu_recovery_action", GAUGE, "1",
       "The recovery the driver asks for (nvmlDeviceGpuRecoveryAction_t): 0 none, 1 GPU reset, 2 node reboot, "
       "3 drain peer-to-peer, 4 drain and reset.", "health", "recovery_action",
       "nvmlDeviceGetFieldValues NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230)",
       {"nvidia-smi": "gpu_recovery_action", "amd-smi": "(none)"},
       when="a driver that reports the field"),
    # --- MIG / partitions ------------------------------------------------------------------------
    _g("gpu_mig_mode_enabled", GAUGE, "1", "1 when MIG (NVIDIA) or a compute partition mode (AMD) is enabled.",
       "mig", "mig_mode_enabled", "nvmlDeviceGetMigMode",
       {"nvidia-smi": "mig.mode.current", "amd-smi": "amd-smi static --partition"}),
    Family("gpu_mig_memory_total_bytes", GAUGE, "bytes", "MIG instance memory total in bytes.", "mig", "mig",
           ("gpu_instance", "compute_instance", "mig_profile", "mig_uuid"), "memory_total_bytes",
           when="MIG on", nvml="nvmlDeviceGetMemoryInfo (MIG device)",
           tools={"nvidia-smi": "nvidia-smi -q -d MEMORY (MIG)",
                  "amd-smi": "(partitions are GPUs)"}),
    Family("gpu_mig_memory_used_bytes", GAUGE, "bytes", "MIG instance memory used in bytes.", "mig", "mig",
           ("gpu_instance", "compute_instance", "mig_profile", "mig_uuid"), "memory_used_bytes",
           when="MIG on", nvml="nvmlDeviceGetMemoryInfo (MIG device)",
           tools={"nvidia-smi": "nvidia-smi -q -d MEMORY (MIG)",
                  "amd-smi": "(partitions are GPUs)"}),
    Family("gpu_mig_utilization_ratio", GAUGE, "ratio", "MIG instance utilisation (0-1), where the driver reports it.",
           "mig", "mig", ("gpu_instance", "compute_instance", "mig_profile", "mig_uuid"), "utilization_ratio",
           when="MIG on, where the driver reports it", nvml="nvmlDeviceGetUtilizationRates (MIG device)",
           tools={"nvidia-smi": "(none)", "amd-smi": "(partitions are GPUs)"}),
    # --- topology (off /metrics by default: N x (N-1) series) -----------------------------------------
    Family("gpu_p2p_supported", GAUGE, "1", "1 when peer-to-peer access from gpu to peer is supported, by capability.",
           "topology", "peer", ("capability",), "p2p", default=False,
           nvml="nvmlDeviceGetP2PStatus", tools={"nvidia-smi": "nvidia-smi topo -p2p rwna",
                                                 "amd-smi": "amd-smi topology -a"}),
    Family("gpu_topology_level", GAUGE, "1",
           "PCIe/NVLink topology level between gpu and peer (NVML levels: 0 internal, 10 single switch, "
           "20 multiple switches, 30 host bridge, 40 NUMA node, 50 system); label level names it.",
           "topology", "peer", ("level",), "levels", default=False,
           nvml="nvmlDeviceGetTopologyCommonAncestor", tools={"nvidia-smi": "nvidia-smi topo -m",
                                                              "amd-smi": "amd-smi topology -t"}),
    # --- events and the bus ----------------------------------------------------------------------
    Family("gpu_xid_errors_total", COUNTER, "1",
           "XID errors reported by the driver since the exporter started, by xid code.", "events", "event",
           ("xid",), "xid_counts", when="after an XID event", nvml="nvmlEventSetWait_v2 (XID events)",
           tools={"nvidia-smi": "(dmesg: NVRM: Xid)", "amd-smi": "(none)"}),
    Family("gpu_xid_last_timestamp_seconds", GAUGE, "seconds", "Unix time of the last XID error on this GPU.",
           "events", "event", attr="xid_last_seconds", when="after an XID event", nvml="nvmlEventSetWait_v2",
           tools={"nvidia-smi": "(dmesg)", "amd-smi": "(none)"}),
    Family("gpu_pci_devices", GAUGE, "1", "GPUs of this vendor present on the PCI bus (sysfs).", "bus", "node",
           ("vendor",), "pci_devices", when="sysfs readable",
           tools={"nvidia-smi": "lspci -d 10de::0300, 10de::0302", "amd-smi": "lspci -d 1002::0300, 1002::0380"}),
    Family("gpu_visible_devices", GAUGE, "1", "GPUs of this vendor visible to the vendor library.", "bus", "node",
           ("vendor",), "visible_devices", when="sysfs readable", nvml="nvmlDeviceGetCount",
           tools={"nvidia-smi": "nvidia-smi -L (count)", "amd-smi": "amd-smi list (count)"}),
    # --- pod attribution (exporter/k8s) -------------------------------------------------------------
    Family("gpu_allocation_info", GAUGE, "1",
           "One series per device the kubelet allocated to a container on this GPU; value is always 1. "
           "shared = number of allocations on the GPU (1: exclusive); claim, claim_namespace: the DRA "
           "ResourceClaim (empty for device plugins).", "attribution", "pod",
           ("gpu", "uuid", "pod", "namespace", "container", "resource", "device", "shared", "claim",
            "claim_namespace"),
           when="pod attribution on", tools={"nvidia-smi": "(kubelet pod-resources API)",
                                             "amd-smi": "(kubelet pod-resources API)"}),
    Family("gpu_pod_utilization_ratio", GAUGE, "ratio",
           "Share of time the pod's processes ran kernels on this GPU (0-1): the sum over its compute processes, "
           "capped at 1; pod empty: processes outside any pod. container is set when one container holds them.",
           "attribution", "pod", ("gpu", "uuid", "pod", "namespace", "container"),
           when="--per-process, where the driver gives per-process utilisation (AMD: from the second collection)",
           nvml="nvmlDeviceGetProcessesUtilizationInfo (R550+) or nvmlDeviceGetProcessUtilization: smUtil (%)",
           tools={"nvidia-smi": "nvidia-smi pmon -s u: sm",
                  "amd-smi": "amd-smi process: engine_usage gfx (ns, as a rate)"}),
    Family("gpu_pod_memory_used_bytes", GAUGE, "bytes",
           "Device memory used by the pod's compute processes on this GPU, in bytes (pod empty: processes outside "
           "any pod).", "attribution", "pod", ("gpu", "uuid", "pod", "namespace", "container"),
           when="--per-process, where the driver gives every process's memory",
           nvml="nvmlDeviceGetComputeRunningProcesses.usedGpuMemory",
           tools={"nvidia-smi": "--query-compute-apps=pid,used_memory",
                  "amd-smi": "amd-smi process: memory_usage vram_mem"}),
    Family("gpu_exporter_pod_attribution_up", GAUGE, "1",
           "1 when pod labels come from a kubelet pod-resources List younger than the staleness limit.",
           "self", "self",
           when="pod attribution on", filterable=False),
    Family("gpu_exporter_pod_resources_errors_total", COUNTER, "1",
           "Failed pod-resources List attempts by kind (socket_missing, timeout, unavailable, ...).", "self", "self",
           ("kind",), when="pod attribution on", filterable=False),
    Family("gpu_exporter_pod_resources_devices", GAUGE, "1",
           "Devices in the last pod-resources List: allocated (matched to a GPU), unmapped (a GPU resource "
           "matching no GPU read here), ignored (not a GPU resource).", "self", "self", ("status",),
           when="pod attribution on", filterable=False),
    Family("gpu_exporter_pod_resources_last_success_timestamp_seconds", GAUGE, "seconds",
           "Unix time of the last successful pod-resources List.", "self", "self",
           when="pod attribution on", filterable=False),
    Family("gpu_exporter_pod_resources_list_duration_seconds", GAUGE, "seconds",
           "Duration of the last successful pod-resources List call in seconds.", "self", "self",
           when="pod attribution on", filterable=False),
    Family("gpu_exporter_pod_processes", GAUGE, "1",
           "GPU processes at the last per-pod build by status: in_pod (mapped), outside_pod (no pod cgroup), "
           "unknown_pod (a pod cgroup this node's pod watch does not know), gone (no /proc entry).", "self", "self",
           ("status",), when="--per-process", filterable=False),
    Family("gpu_exporter_dra_attribution_up", GAUGE, "1",
           "1 once this node's ResourceSlices were listed (DRA-claimed GPUs can be mapped); 0 while the API server "
           "does not answer or, with --dra-attribution on, serves or allows no ResourceSlices.", "self", "self",
           when="--dra-attribution on, or auto while it is on", filterable=False),
    Family("gpu_exporter_dra_resourceslices_errors_total", COUNTER, "1",
           "Failed ResourceSlice requests (version probes, lists and watches; an expired watch is not a failure).",
           "self", "self", when="--dra-attribution on, or auto while it is on", filterable=False),
    Family("gpu_exporter_watch_relists_total", COUNTER, "1",
           "Lists of a Kubernetes watch after its first one (each after a 410 Expired or a failure, and its "
           "backoff).", "self", "self", ("resource",), when="--per-process (pods) or DRA attribution "
           "(resourceslices)", filterable=False),
    Family("gpu_exporter_watch_errors_total", COUNTER, "1",
           "Failed requests of a Kubernetes watch: 410 Expired, HTTP errors (429, 5xx, 403), refused "
           "connections, streams that closed at once, undecodable or oversized answers.", "self", "self",
           ("resource",), when="--per-process (pods) or DRA attribution (resourceslices)", filterable=False),
    # --- the exporter itself (node_exporter's scrape_collector_*) --------------------------------------
    Family("gpu_exporter_build_info", GAUGE, "1", "gpu-exporter build; value is always 1.", "self", "self",
           ("version", "python_version"), filterable=False, every_backend=True),
    Family("gpu_exporter_collector_success", GAUGE, "1", "1 when the backend's last collection succeeded.", "self",
           "self", ("backend",), attr="success", filterable=False, every_backend=True),
    Family("gpu_exporter_collector_duration_seconds", GAUGE, "seconds", "Duration of the backend's last collection.",
           "self", "self", ("backend",), attr="duration_seconds", filterable=False, every_backend=True),
    Family("gpu_exporter_collection_errors_total", COUNTER, "1",
           "Collection errors by backend and kind (docs/metrics.md lists the kinds).", "self", "self",
           ("backend", "kind"), when="after an error", attr="errors_total", filterable=False, every_backend=True),
    Family("gpu_exporter_gpus", GAUGE, "1", "GPUs the backend returned in its last collection.", "self", "self",
           ("backend",), attr="gpus", filterable=False, every_backend=True),
    Family("gpu_exporter_last_success_timestamp_seconds", GAUGE, "seconds",
           "Unix time of the backend's last successful collection.", "self", "self", ("backend",),
           attr="last_success_seconds", filterable=False, every_backend=True),
    Family("gpu_exporter_collections_total", COUNTER, "1", "Collections run by the backend.", "self", "self",
           ("backend",), attr="collections_total", filterable=False, every_backend=True),
    Family("gpu_exporter_collection_interval_seconds", GAUGE, "seconds",
           "Minimum seconds between real reads of the backend: 0 reads on scrape, at most once per "
           "--cache-ttl (default 1 s); CLI backends "
           "(rocm-smi, a subprocess) are read at most every COLLECTION_INTERVAL, default 10 s.", "self", "self",
           ("backend",), attr="interval_seconds", filterable=False, every_backend=True),
    # The exporter process itself, as every Prometheus client library publishes it (issue 28), read
    # from /proc/self by core/host.py (the files prometheus_client's ProcessCollector reads); absent
    # where there is no /proc.
    Family("process_cpu_seconds_total", COUNTER, "seconds", "User and system CPU time of the exporter process.",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
    Family("process_resident_memory_bytes", GAUGE, "bytes", "Resident memory (RSS) of the exporter process.",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
    Family("process_virtual_memory_bytes", GAUGE, "bytes", "Virtual memory size of the exporter process.",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
    Family("process_start_time_seconds", GAUGE, "seconds", "Unix time the exporter process started.",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
    Family("process_open_fds", GAUGE, "1", "File descriptors the exporter process holds open.",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
    Family("process_max_fds", GAUGE, "1", "The exporter process's limit on open file descriptors (ulimit -n).",
           "self", "self", every_backend=True, when="Linux (/proc)", filterable=False),
)

FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
# Per-GPU families read from one GpuReading attribute each (the generic part of the renderer).
GPU_FAMILIES: tuple[Family, ...] = tuple(f for f in FAMILIES if f.scope == "gpu" and f.attr)
# GpuReading attribute -> the name of the family it carries (a backend's bookkeeping, by attribute)
FAMILY_OF_ATTR: dict[str, str] = {f.attr: f.name for f in GPU_FAMILIES}
FILTERABLE: tuple[str, ...] = tuple(f.name for f in FAMILIES if f.filterable)

HISTOGRAM = "histogram"


def _p(name: str, kind: str, unit: str, help_: str, labels: tuple[str, ...] = (), when: str = "") -> Family:
    return Family(name, kind, unit, help_, "profiler", "profiler", labels, when=when, filterable=False,
                  every_backend=True)


# The profiler's own families (``gpu-exporter profile``'s /metrics, exporter/profiler/loop.py), written by
# the same writer as the exporter's (exporter/platform/exposition.py) from these rows.
PROFILER_FAMILIES: tuple[Family, ...] = (
    _p("gpu_profiler_cycles_total", COUNTER, "1", "Profiler cycles by result (ok, failed).", ("result",)),
    _p("gpu_profiler_cycle_duration_seconds", HISTOGRAM, "seconds", "Duration of one profiler cycle."),
    _p("gpu_profiler_prometheus_queries_total", COUNTER, "1",
       "Queries sent to Prometheus (logical queries; HTTP retries not included)."),
    _p("gpu_profiler_prometheus_requests_total", COUNTER, "1", "HTTP requests sent to Prometheus, retries included."),
    _p("gpu_profiler_nodes_patched_total", COUNTER, "1", "Node merge patches accepted by the API server."),
    _p("gpu_profiler_errors_total", COUNTER, "1", "Profiler errors by kind.", ("kind",)),
    _p("gpu_profiler_last_success_timestamp_seconds", GAUGE, "seconds",
       "Unix time the last cycle completed without error."),
    _p("gpu_profiler_gpus", GAUGE, "1", "GPUs classified in the last cycle, by pattern.", ("pattern",)),
    _p("gpu_profiler_label_values_rejected_total", COUNTER, "1",
       "Label values from Prometheus that do not match their grammar and were not written to a Node "
       "(uuid, holder entry).", ("label",)),
    _p("gpu_profile_pattern", GAUGE, "1",
       "GPU usage pattern last published on the node (1 per GPU; value of the pattern label).",
       ("node", "gpu", "pattern")),
    _p("gpu_profiler_leader", GAUGE, "1", "1 while this replica holds the lease and writes.", when="--leader-elect"),
    _p("gpu_profiler_events_total", COUNTER, "1",
       "Kubernetes Events on Nodes, by result (created, updated, dropped by the rate limit, failed).", ("result",),
       when="--events on, not a dry run"),
    _p("gpu_profiler_prometheus_largest_response_bytes", GAUGE, "bytes", "Largest Prometheus answer read since start."),
    _p("gpu_profiler_prometheus_refusals_total", COUNTER, "1",
       "Answers over the size cap and queries the store refused as over one of its limits (too long, too many "
       "series or samples), by kind; each was asked again in halves.", ("kind",)),
)
PROFILER_FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in PROFILER_FAMILIES}

# NVML topology levels (nvmlGpuTopologyLevel_t); AMD maps onto the same names.
TOPOLOGY_LEVELS = {"internal": 0, "single": 10, "multiple": 20, "hostbridge": 30, "node": 40, "system": 50}


def family(name: str) -> Family:
    """The row of ``name``; KeyError names the nearest known family (a typo in code fails loudly)."""
    try:
        return FAMILY_BY_NAME[name]
    except KeyError:
        raise KeyError(unknown_family_message(name)) from None


def metric(name: str, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty ``prometheus_client`` family for a plugin (pod attribution), with the row's name, help
    and labels, so that no plugin writes them again; ``value``: the one sample of a label-less family."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    f = family(name)
    labels = None if value is not None else list(f.all_labels)
    if f.kind == COUNTER:
        return CounterMetricFamily(f.base, f.help, value=value, labels=labels)
    return GaugeMetricFamily(f.base, f.help, value=value, labels=labels)


def unknown_family_message(name: str) -> str:
    near = difflib.get_close_matches(name, FILTERABLE, n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]}?" if near else "; see docs/metrics.md for the families"
    return f"unknown metric family {name!r}{hint}"


def match(pattern: str) -> list[str]:
    """Filterable families matching a family name or a shell glob over family names."""
    return [n for n in FILTERABLE if fnmatch.fnmatchcase(n, pattern)]


# --- docs/metrics.md ---------------------------------------------------------------------------

GROUP_TITLES = (
    ("identity", "Identity and state"), ("utilization", "Utilisation"),
    ("activity", "Activity (NVIDIA GPM: SM, pipes, DRAM, NVLink; AMD gpu_metrics)"), ("memory", "Memory"),
    ("thermal", "Thermal"), ("power", "Power and energy"), ("clocks", "Clocks"), ("pcie", "PCIe"),
    ("health", "Health: ECC, pages, rows, throttling"), ("interconnect", "Interconnect (NVLink, XGMI)"),
    ("processes", "Processes"), ("mig", "MIG and partitions"), ("topology", "Topology (off /metrics by default)"),
    ("events", "Events"), ("bus", "PCI bus"), ("attribution", "Pod attribution"), ("self", "Exporter self-metrics"),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "-"


def tool_names(extra: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """The vendor tools whose equivalents the rows (and ``extra``) give, in the order first given."""
    names = {t: None for f in FAMILIES for t in f.tools}
    names.update(dict.fromkeys(extra or {}))
    return list(names)


def equivalents(f: Family, extra: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """What each vendor tool of :func:`tool_names` shows of ``f`` ("": nothing said): the row's, else the backend's
    own (``extra``: tool -> family -> equivalent, ``Backend.equivalents``). docs/metrics.md's columns and
    /api/v1/families' ``equivalents`` are these."""
    return {t: f.equivalent(t) or (extra or {}).get(t, {}).get(f.name, "") for t in tool_names(extra)}


def markdown_table(extra: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """Every family, grouped (``python -m exporter.core.schema`` prints it; docs/metrics.md embeds it): a column
    per vendor tool. ``extra``: tool -> family -> equivalent, the backends' own (``Backend.equivalents``)."""
    tools = tool_names(extra)
    out: list[str] = []
    for group, title in GROUP_TITLES:
        rows = [f for f in FAMILIES if f.group == group]
        if not rows:
            continue
        out.append(f"### {title}\n\n| name | type | unit | labels | NVML source | {' | '.join(tools)} | help |\n"
                   f"|---|---|---|---|---|{'---|' * len(tools)}---|\n")
        for f in rows:
            labels = ", ".join(f"`{label}`" for label in f.all_labels) or "-"
            extra_text = ""
            if not f.default:
                extra_text = " Off /metrics by default: select it with `--fields-include`."
            if f.when:
                extra_text += f" Present: {f.when}."
            if not f.filterable:
                extra_text += " Field selection (--fields-include/--fields-exclude) never removes it."
            cells = " | ".join(_cell(text) for text in equivalents(f, extra).values())
            out.append(f"| `{f.name}` | {f.kind} | {f.unit} | {labels} | {_cell(f.nvml)} | {cells} | "
                       f"{_cell(f.help)}{extra_text} |\n")
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def render_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each ``<!-- name:begin -->`` ... ``<!-- name:end -->`` block replaced by ``blocks[name]``."""
    for marker, body in blocks.items():
        begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        if not rest:
            raise ValueError(f"the document lacks the {begin} marker")
        text = f"{head}{begin}\n{body}{end}{tail}"
    return text


if __name__ == "__main__":
    print(markdown_table(), end="")  # docs/metrics.md: python -m exporter.backends --write-docs
