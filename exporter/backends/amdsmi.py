"""AMD GPUs through ROCm's ``libamd_smi.so`` and the ``amdsmi`` Python package (amd-smi's library).

The package is imported lazily in :meth:`AmdSmiBackend.init`. Without ROCm its wrapper
``print()``s two lines (Python-level prints, so ``sys.stdout`` is redirected while importing)
and raises ``KeyError``; that becomes ``BackendUnavailable("amdsmi not available: <reason>")``.

Every library call goes through :meth:`AmdSmiBackend._call` into the vendor-call funnel
(:meth:`~exporter.backends.base.Backend.call`), whose policy (``classify``) sorts amdsmi status codes:

- not supported / no data / no permission: the reading is absent (logged once per field) and
  its family is listed in ``GpuReading.unsupported``;
- device-level (DRM, I/O, busy, timeout ...): the reading is absent and counted in
  ``Collection.errors["device_error"]``; a GPU that answers nothing but such errors is
  reported ``up=False`` with the status as reason;
- library-level (not initialised, driver not loaded, init error): :class:`BackendError`
  with kind ``not_initialized`` / ``driver_not_loaded`` / ``library_error``; :meth:`reset`
  shuts the library down and the next collection initialises again.

Identity (name, UUID, PCI bus ID, serial, driver, VBIOS, partition mode) and topology are read
once per initialisation; everything else on every collection.

UUID rule (``uuid`` label): amdsmi's device UUID (``amdsmi_get_gpu_device_uuid``, amd-smi's
"GPU UUID"); else the same UUID computed from the ASIC serial (unique ID) and PCI device ID
(:func:`amd_uuid`, so that the rocm-smi backend labels the same GPU the same way); else
``amd-serial-<board serial>``; else ``amd-pci-<bus id>``; else ``amd-index-<index>``. A UUID
whose serial part is zero (consumer boards) does not identify a GPU and is skipped. If two
GPUs still share an ID (e.g. partitions of one GPU), ``-p<partition id>`` (or ``-i<index>``)
is appended.

Units: amdsmi reports temperatures in C, power in W, power caps in uW, clocks in MHz, PCIe
speed in MT/s, activities in percent and energy as a count times a resolution in uJ; the
readings are SI (see ``exporter/core/readings.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from exporter.backends.base import (
    BAD_VALUE,
    DRIVER,
    MISSING,
    READING_ERROR,
    SENTINELS,
    UNSUPPORTED,
    Backend,
    BackendError,
    BackendUnavailable,
    Device,
    GpuDown,
    NoValue,
    Outcome,
    Verdict,
    si,
)
from exporter.core import xid
from exporter.core.k8s_names import DevicePluginResource, DraAttributes, KubernetesNames
from exporter.core.options import BackendOptions
from exporter.core.pci import canonical_bus_id
from exporter.core.readings import Collection, GpuReading, MigReading, PeerReading
from exporter.core.schema import FAMILY_OF_ATTR, GPU_FAMILIES, TOPOLOGY_LEVELS

log = logging.getLogger(__name__)
PCI_VENDOR = 0x1002  # AMD: the sysfs ``vendor`` of its GPUs (gpu_pci_devices)
#: AMD's names in Kubernetes (both AMD backends): the device plugin's resource (ROCm/k8s-device-plugin,
#: device IDs are PCI bus ids; a sharing suffix as for NVIDIA) and the DRA driver (ROCm/k8s-gpu-dra-driver) with
#: the attributes its devices carry (cmd/gpu-kubeletplugin/deviceinfo.go): a full GPU's ``pciAddr``, a compute
#: partition's ``parentPciAddr`` (and ``partitionProfile``). No UUID: its first release (commit 4482249) published
#: a ``uuid`` the driver derived itself, which no amd-smi UUID equals, so the PCI bus id decides for AMD
KUBERNETES = KubernetesNames(resources=(DevicePluginResource(r"amd\.com/gpu(?:\.[A-Za-z0-9][-A-Za-z0-9_]*)*"),),
                             dra_drivers=("gpu.amd.com",),
                             dra_attributes=DraAttributes(uuid=(), pci=("pciAddr",), parent_pci=("parentPciAddr",)))

_ATTR_OF_FAMILY = {f.name: f.attr for f in GPU_FAMILIES}

# amdsmi_status_t codes (amdsmi_wrapper.py), grouped by what they mean for one reading.
_ABSENT_CODES = frozenset({
    1,   # INVAL: returned for sensors an ASIC does not have
    2,   # NOT_SUPPORTED
    3,   # NOT_YET_IMPLEMENTED
    10,  # NO_PERM
    14,  # FILE_ERROR: sysfs file missing on this ASIC
    17,  # INPUT_OUT_OF_BOUNDS
    20,  # DIRECTORY_NOT_FOUND
    40,  # NO_DATA
    43,  # UNEXPECTED_DATA
    52,  # FILE_NOT_FOUND
    55,  # SETTING_UNAVAILABLE
})
_LIBRARY_CODES = {
    4: "library_error",       # FAIL_LOAD_MODULE
    5: "library_error",       # FAIL_LOAD_SYMBOL
    18: "library_error",      # INIT_ERROR
    19: "library_error",      # REFCOUNT_OVERFLOW
    32: "not_initialized",    # NOT_INIT
    34: "driver_not_loaded",  # DRIVER_NOT_LOADED
    51: "driver_not_loaded",  # NO_DRV
}

# Activity and data accumulators from gpu_metrics (amd-smi metric --usage, xgmi --metric, --pcie).
_ACTIVITY_ATTRS = ("graphics_engine_active_ratio", "dram_active_ratio", "encoder_utilization_ratio",
                   "decoder_utilization_ratio", "link_transferred_bytes")

# a call that is unsupported leaves these readings absent too
_ALSO_ABSENT: dict[str, tuple[str, ...]] = {
    "utilization_ratio": ("memory_utilization_ratio",),
    "pcie_link_width": ("pcie_link_width_max", "pcie_link_generation", "pcie_link_generation_max"),
    "process_count": ("process_memory_used_bytes",),
    "clock_hertz": ("clock_max_hertz",),
    # no gpu_metrics table: no activity, no link data
    "graphics_engine_active_ratio": _ACTIVITY_ATTRS[1:],
}

_U64_MAX = 2**64 - 1
# "No value" in amdsmi answers: the 32/64-bit all-ones, and the 16-bit one, which the library copies
# from gpu_metrics into wider fields (power, temperatures, clocks, activities). Not for byte counts and
# counters, where 65535 is a true value.
GAUGE_SENTINELS = SENTINELS | {0xFFFF}
_PCIE_GEN_BY_MTS = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}

# indep_throttle_status bits (Linux amdgpu_smu.h SMU_THROTTLER_*_BIT) -> NVIDIA reason names.
_THROTTLE_BITS: dict[str, tuple[int, ...]] = {
    "sw_power_cap": (0, 1, 2, 3, 4, 5, 6, 7),         # PPT0-3, SPL, FPPT, SPPT, SPPT_APU
    "sw_thermal_slowdown": (32, 33, 35, 36, 37),      # TEMP_GPU (socket), CORE, EDGE, HOTSPOT, SOC
    "hw_slowdown": (46, 47),                          # PROCHOT_CPU, PROCHOT_GFX
    "hw_thermal_slowdown": (34, 38, 39, 40, 41, 44, 45),  # TEMP_MEM (HBM), VR temps, VRHOT
}
# gpu_metrics residency accumulators (MI300) -> the same reason names.
_RESIDENCY_FIELDS: dict[str, tuple[str, ...]] = {
    "sw_power_cap": ("ppt_residency_acc",),
    "sw_thermal_slowdown": ("socket_thm_residency_acc",),
    "hw_slowdown": ("prochot_residency_acc",),
    "hw_thermal_slowdown": ("vr_thm_residency_acc", "hbm_thm_residency_acc"),
}

_NA_STRINGS = ("n/a", "(secondary die)", "n/a (secondary die)", "")

_KB = 1000.0  # xgmi_*_data_acc are kilobytes (kernel gpu_metrics v1.4+), decimal like the firmware's GB/s
_GB = 1e9  # pcie_bandwidth_acc sums GB/s (UQ10, rounded) once per firmware iteration


class _NotInTable(NotImplementedError):
    """A gpu_metrics field left all ones: this ASIC's table version lacks it (amd-smi prints N/A).

    The kernel fills every field its table version does not carry with ones, so the field will not
    appear later: the funnel treats it as unsupported (logged once, in gpu_field_unsupported, not
    asked again until re-initialisation) rather than as a failing reading.
    """


def _in_table(value: int, factor: float, sentinels: frozenset[int]) -> float:
    try:
        return si(value, factor, sentinels)
    except NoValue as exc:
        raise _NotInTable(str(exc)) from None


def _activity(value: int) -> float:
    """A gpu_metrics activity (uint16, %) as a ratio 0-1; over 100 % is a value we cannot trust."""
    ratio = _in_table(value, 0.01, GAUGE_SENTINELS)
    if ratio > 1.0:
        raise ValueError(f"activity {value} % is over 100 %")
    return ratio


def _video_activity(mm: int, vcn: Sequence[int]) -> float:
    """average_mm_activity, else the mean of the VCN instances' activity (MI300 reports only those)."""
    if mm not in GAUGE_SENTINELS:
        return _activity(mm)
    used = [_activity(v) for v in vcn if v not in GAUGE_SENTINELS]  # unused VCN slots are all ones
    if not used:
        raise _NotInTable("average_mm_activity and every vcn_activity slot are all ones")
    return sum(used) / len(used)


def _link_bytes(kilobytes: Sequence[int]) -> float:
    """An XGMI data accumulator summed over the links, in bytes; unused link slots are all ones."""
    used = [si(v, _KB, SENTINELS) for v in kilobytes if v not in SENTINELS]
    if not used:
        raise _NotInTable("every xgmi data slot is all ones")
    return sum(used)


def _pcie_sample(iterations: int, bandwidth_acc: int, firmware_ts: int, clock_ns: int) -> tuple[int, int, str, int]:
    """(firmware iterations, summed GB/s, time source, time in ns) of one gpu_metrics table.

    Time: the firmware's timestamp (10 ns resolution) where the table has it, else the kernel's
    boottime at the read (system_clock_counter, ns).
    """
    for v in (iterations, bandwidth_acc):
        _in_table(v, 1.0, SENTINELS)
    if firmware_ts not in SENTINELS:
        return iterations, bandwidth_acc, "firmware", firmware_ts * 10
    _in_table(clock_ns, 1.0, SENTINELS)
    return iterations, bandwidth_acc, "kernel", clock_ns


# ---- helpers shared with the rocm-smi backend ---------------------------------------------------


def is_na(value: object) -> bool:
    """True for the values AMD tools print for "no reading": "N/A", "(Secondary die)", ""."""
    return value is None or (isinstance(value, str) and value.strip().lower() in _NA_STRINGS)


def amd_uuid(serial: int, device_id: int, fcn: int = 0xFF) -> str | None:
    """The UUID amdsmi derives from the ASIC serial (unique ID) and PCI device ID.

    Layout (amd-smi's ``amdsmi_uuid_gen``, a version-1 UUID): time_low = serial byte 7,
    ``fcn``, device ID; time_mid/high 0 with version 1; clock sequence = variant 2 and
    serial byte 6; node = serial bytes 5-0. None when the serial is 0 (not unique).
    """
    if serial <= 0 or serial >= 2**64:
        return None
    b7 = (serial >> 56) & 0xFF
    b6 = (serial >> 48) & 0xFF
    return (f"{b7:02x}{fcn & 0xFF:02x}{device_id & 0xFFFF:04x}-0000-1000-80{b6:02x}-"
            f"{(serial >> 32) & 0xFFFF:04x}{serial & 0xFFFFFFFF:08x}")


def _uuid_is_unique(uuid: str) -> bool:
    """amdsmi UUIDs of boards without a serial end in zeros only: they identify nothing."""
    tail = uuid.replace("-", "")[-14:]
    return bool(uuid) and not is_na(uuid) and set(tail) != {"0"}


def dedupe_uuids(readings: list[tuple[str, int | None, int]]) -> list[str]:
    """Make (uuid, partition id, index) triples unique: ``-p<partition>`` or ``-i<index>`` suffix."""
    counts: dict[str, int] = {}
    for uuid, _, _ in readings:
        counts[uuid] = counts.get(uuid, 0) + 1
    out = []
    for uuid, part, index in readings:
        if counts[uuid] == 1:
            out.append(uuid)
            continue
        parts = [p for u, p, _ in readings if u == uuid]
        distinct = None not in parts and len(set(parts)) == len(parts)
        out.append(f"{uuid}-p{part}" if distinct else f"{uuid}-i{index}")
    return out


def _num(value: object) -> float | None:
    """A numeric amdsmi value, or None for "N/A" strings and bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _first_choice(value: object, sentinels: frozenset[int] = GAUGE_SENTINELS) -> float | None:
    """A number from the preferred source of a reading that has a fallback, or None (no log: the
    fallback source answers, and goes through the funnel)."""
    v = _num(value)
    return None if v is None or v in sentinels else v


def _text(value: object) -> str | None:
    if not isinstance(value, str) or is_na(value):
        return None
    return value.strip()


# ---- import -------------------------------------------------------------------------------------


def import_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package with stdout kept clean; BackendUnavailable if it cannot load."""
    printed = io.StringIO()
    try:
        # The wrapper reports a missing library with print() (Python-level), then raises KeyError.
        with contextlib.redirect_stdout(printed):
            import amdsmi  # lazy by design: discovery stays cheap without ROCm
    except ModuleNotFoundError as exc:
        if exc.name == "amdsmi":
            raise BackendUnavailable("amdsmi not available: the amdsmi Python package is not installed") from None
        raise BackendUnavailable(f"amdsmi not available: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - KeyError (no library), AttributeError (missing symbol) ...
        lines = [ln.strip() for ln in printed.getvalue().splitlines() if ln.strip()]
        reason = lines[0] if lines else f"{type(exc).__name__}: {exc}"
        if lines:
            reason = f"libamd_smi.so could not be loaded ({reason})"
        elif isinstance(exc, AttributeError) and "undefined symbol" in str(exc):
            # The wrapper binds every function at import: a library older than the wrapper's release
            # cannot be used at all (the floor is the release of the amdsmi package; README).
            symbol = str(exc).rsplit(":", 1)[-1].strip()
            reason = (f"libamd_smi.so lacks {symbol}: it is older than the amdsmi Python package "
                      f"{_package_version()}; install the libamd_smi.so of that ROCm release")
        raise BackendUnavailable(f"amdsmi not available: {' '.join(reason.split())[:300]}") from None
    return amdsmi


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("amdsmi")
    except metadata.PackageNotFoundError:
        return "(unknown version)"


# ---- backend ------------------------------------------------------------------------------------


@dataclass
class _Gpu(Device):
    """Per-GPU state kept across collections (as nvml's ``_Gpu``): the funnel's call state
    (:class:`~exporter.backends.base.Device`) and the static facts about one processor handle,
    read at initialisation."""

    handle: Any = None
    name: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    driver_version: str | None = None
    firmware_version: str | None = None
    compute_partition: str | None = None
    memory_partition: str | None = None
    partition_id: int | None = None
    numa_node: int | None = None
    edge_sensor: bool = True  # False: no edge sensor (MI300 class); read once per init
    ras_blocks: tuple[Any, ...] | None = None  # AmdSmiGpuBlock members with RAS on; None: not read yet


class AmdSmiBackend(Backend):
    """AMD GPUs via ``libamd_smi.so`` (amd-smi's library). Preferred over rocm-smi."""

    name: ClassVar[str] = "amdsmi"
    auto_priority: ClassVar[int | None] = 20
    runtime: ClassVar[str] = "ROCm"
    floor: ClassVar[str] = (
        "ROCm 7.0: `libamd_smi.so` of the same release as the `amdsmi` package (7.0.x). The package binds every "
        "library function when it is imported.")
    below_floor: ClassVar[str] = (
        "The backend is unavailable, with one line naming the missing function; use the `rocm-smi` backend or the "
        "ROCm 7.0 library (the AMD image ships it: `docs/deploy.md`).")
    vendor: ClassVar[str] = "amd"
    #: the families this backend fills (docs/metrics.md's support table; the contract test checks it)
    families: ClassVar[frozenset[str]] = frozenset({
        "gpu_field_unsupported", "gpu_utilization_ratio", "gpu_memory_utilization_ratio",
        "gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio", "gpu_memory_total_bytes",
        "gpu_memory_used_bytes", "gpu_memory_free_bytes", "gpu_temperature_celsius", "gpu_fan_speed_ratio",
        "gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules_total", "gpu_clock_hertz", "gpu_clock_max_hertz",
        "gpu_pcie_link_generation", "gpu_pcie_link_generation_max", "gpu_pcie_link_width", "gpu_pcie_link_width_max",
        "gpu_pcie_replays_total", "gpu_graphics_engine_active_ratio", "gpu_dram_active_ratio", "gpu_ecc_errors_total",
        "gpu_throttle_reason_active", "gpu_link_up", "gpu_link_transferred_bytes_total", "gpu_processes",
        "gpu_processes_memory_used_bytes", "gpu_process_memory_used_bytes", "gpu_mig_mode_enabled", "gpu_p2p_supported",
        "gpu_topology_level", "gpu_pod_utilization_ratio",
        "gpu_pod_memory_used_bytes", "gpu_exporter_pod_processes",
    })
    pci_vendor: ClassVar[int | None] = PCI_VENDOR
    kubernetes: ClassVar[KubernetesNames] = KUBERNETES

    def __init__(self, options: BackendOptions | None = None) -> None:
        super().__init__(options)
        self._smi: ModuleType | None = None
        self._ready = False
        self._gfx_prev: dict[int, tuple[int, dict[int, float]]] = {}  # GPU -> (monotonic ns, pid -> gfx ns)
        self._devices: list[_Gpu] = []
        self._peers: list[PeerReading] = []
        self._rocm_version: str | None = None
        # uuid -> (accumulation counter, residency per reason) from the previous collection
        self._residency: dict[str, tuple[int, dict[str, int]]] = {}
        # uuid -> (previous PCIe sample, bytes counted so far or None before the second sample)
        self._pcie_bytes: dict[str, tuple[tuple[int, int, str, int], float | None]] = {}
        # processor index -> gpu_metrics table of this collection (throttle reasons and activity share it)
        self._metrics_now: dict[int, Any] = {}

    # --- lifecycle -----------------------------------------------------------------------------

    def init(self) -> None:
        try:
            self._start()
        except BackendError as exc:
            raise BackendUnavailable(f"amdsmi not available: {exc}") from None

    def reset(self) -> None:
        self._stop()

    def shutdown(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._smi is not None and self._ready:
            with contextlib.suppress(Exception):
                self._smi.amdsmi_shut_down()
        self._ready = False
        self._devices = []
        self._peers = []

    def _start(self) -> None:
        smi = self._smi or import_amdsmi()
        self._smi = smi
        self._ready = False
        self._call(None, "init", smi.amdsmi_init, smi.AmdSmiInitFlags.INIT_AMD_GPUS, library=True)
        self._ready = True
        handles = self._call(None, "processor handles", smi.amdsmi_get_processor_handles, library=True)
        if not handles:
            self._stop()
            raise BackendUnavailable("amdsmi not available: no AMD GPU found")
        devices = [self._identify(i, h) for i, h in enumerate(handles)]
        unique = dedupe_uuids([(d.uuid, d.partition_id, d.index) for d in devices])
        for d, uuid in zip(devices, unique, strict=True):
            d.uuid = uuid
        self._devices = devices
        rocm = self._call(None, "rocm_version", "amdsmi_get_rocm_version")  # a Python-only call since 6.4
        ok, version = rocm if isinstance(rocm, tuple) and len(rocm) == 2 else (False, "not reported")
        self._rocm_version = _text(version) if ok else None
        if not ok:
            self.log_once("rocm_version", "amdsmi: ROCm version unknown: %s", version)
        self._peers = self._topology() if self._want_peers() else []

    # --- what amdsmi's statuses mean (the funnel itself is Backend.call) -------------------------

    def classify(self, exc: BaseException) -> Verdict:
        smi = self._smi
        if smi is not None and isinstance(exc, smi.AmdSmiLibraryException):
            code = int(exc.get_error_code())
            status = self._status_name(code)
            if code in _LIBRARY_CODES:
                return Verdict(Outcome.DRIVER, DRIVER, status)
            if code in _ABSENT_CODES:
                return Verdict(Outcome.UNSUPPORTED, UNSUPPORTED, status)
            return Verdict(Outcome.ERROR, READING_ERROR, status)  # device-level: DRM, I/O, busy, timeout
        if smi is not None and isinstance(exc, smi.AmdSmiException):  # a parameter error: a bug, never fatal
            return Verdict(Outcome.ERROR, BAD_VALUE, f"{type(exc).__name__}: {exc}"[:200])
        return super().classify(exc)

    def _call(self, gpu: Device | None, attr: str, fn: Callable[..., Any] | str, *args: Any,
              library: bool = False) -> Any:
        """One amdsmi call through the funnel; None when the reading is absent.

        ``attr`` names the reading: a GpuReading attribute, optionally ``:detail`` (one sensor,
        one clock). ``fn`` may be the name of a package function, looked up inside the funnel so
        that an older package without it makes the reading absent. ``library=True``: any failure
        is a library-level :class:`BackendError` (init, discovery).
        """
        smi = self._smi
        assert smi is not None
        call: Callable[..., Any] = (lambda *a: getattr(smi, fn)(*a)) if isinstance(fn, str) else fn
        if library:
            try:
                return self.node_wide(getattr(fn, "__name__", str(fn)), lambda: call(*args))
            except Exception as exc:  # noqa: BLE001 - init and discovery failures are one-line errors
                v = self.classify(exc)
                raise BackendError(f"amdsmi: {getattr(fn, '__name__', fn)} failed: {v.detail}", kind=DRIVER) from None
        base, _, detail = attr.partition(":")
        reading = FAMILY_OF_ATTR.get(base, base) + (f":{detail}" if detail else "")
        value = self.call(gpu, reading, call, *args)
        return None if value is MISSING else value

    def _status_name(self, code: int) -> str:
        names = getattr(getattr(self._smi, "amdsmi_wrapper", None), "amdsmi_status_t__enumvalues", {})
        return str(names.get(code, f"amdsmi status {code}"))

    def _want(self, attr: str) -> bool:
        return self.enabled(FAMILY_OF_ATTR.get(attr, attr))

    def _want_peers(self) -> bool:
        return self.any_enabled("gpu_p2p_supported", "gpu_topology_level")

    def _si(self, gpu: Device, attr: str, value: Any, factor: float = 1.0,
            sentinels: frozenset[int] = GAUGE_SENTINELS) -> float | None:
        """``value`` (a number from an amdsmi answer) times ``factor``, or None.

        A sentinel or "N/A" goes through the funnel: absent, counted as ``no_value``, logged once
        per GPU and reading. None (a key the answer lacks, or a call already absent) stays None.
        """
        if value is None:
            return None
        base, _, detail = attr.partition(":")
        reading = FAMILY_OF_ATTR.get(base, base) + (f":{detail}" if detail else "")
        v = self.call(gpu, reading, si, value, factor, sentinels)
        return None if v is MISSING else float(v)

    # --- identity and topology (once per init) -------------------------------------------------

    def _identify(self, index: int, handle: Any) -> _Gpu:
        smi = self._smi
        assert smi is not None
        d = _Gpu(index=index, handle=handle)
        asic = self._call(None, "name", smi.amdsmi_get_gpu_asic_info, handle) or {}
        board = self._call(None, "serial", smi.amdsmi_get_gpu_board_info, handle) or {}
        d.name = _text(asic.get("market_name")) or _text(board.get("product_name"))
        d.serial = _text(board.get("product_serial"))
        if d.serial is not None and not d.serial.strip("0"):
            d.serial = None  # "0": a board without a FRU serial
        d.pci_bus_id = canonical_bus_id(self._call(None, "pci_bus_id", smi.amdsmi_get_gpu_device_bdf, handle))
        driver = self._call(None, "driver_version", smi.amdsmi_get_gpu_driver_info, handle) or {}
        d.driver_version = _text(driver.get("driver_version"))
        vbios = self._call(None, "firmware_version", smi.amdsmi_get_gpu_vbios_info, handle) or {}
        d.firmware_version = _text(vbios.get("version"))
        d.compute_partition = _text(self._call(None, "mig_mode_enabled", smi.amdsmi_get_gpu_compute_partition,
                                               handle))
        d.memory_partition = _text(self._call(None, "memory_partition", smi.amdsmi_get_gpu_memory_partition,
                                              handle))
        kfd = self._call(None, "partition_id", "amdsmi_get_gpu_kfd_info", handle) or {}
        part = kfd.get("current_partition_id")
        d.partition_id = part if isinstance(part, int) and not isinstance(part, bool) else None
        numa = self._call(None, "numa_node", smi.amdsmi_topo_get_numa_node_number, handle)
        d.numa_node = numa if isinstance(numa, int) else None
        if self._want("temperature_celsius"):
            # amd-smi's rule: a board whose edge CRITICAL limit reads 0 has no edge sensor (MI300 class)
            # and its "current" edge value means nothing. An unknown limit: trust the sensor.
            crit = self._call(None, "temperature_celsius:edge_limit", smi.amdsmi_get_temp_metric, handle,
                              smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CRITICAL)
            d.edge_sensor = crit != 0
            if not d.edge_sensor:
                log.info("amdsmi: GPU %d has no edge temperature sensor (MI300 class): sensor=\"gpu\" is absent; "
                         "junction and memory are shown", index)

        uuid = _text(self._call(None, "uuid", smi.amdsmi_get_gpu_device_uuid, handle))
        if uuid is None or not _uuid_is_unique(uuid):
            uuid = None
            serial_hex, device_id = _text(asic.get("asic_serial")), _text(asic.get("device_id"))
            if serial_hex and device_id:
                with contextlib.suppress(ValueError):
                    uuid = amd_uuid(int(serial_hex, 16), int(device_id, 16))
        if uuid is None and d.serial:
            uuid = f"amd-serial-{d.serial}"
        if uuid is None and d.pci_bus_id:
            uuid = f"amd-pci-{d.pci_bus_id}"
        d.uuid = uuid or f"amd-index-{index}"
        return d

    def _topology(self) -> list[PeerReading]:
        """P2P access and link type for every ordered pair (amd-smi topology)."""
        smi = self._smi
        assert smi is not None
        xgmi = smi.amdsmi_wrapper.AMDSMI_LINK_TYPE_XGMI
        peers = []
        for a in self._devices:
            for b in self._devices:
                if a.index == b.index:
                    continue
                p2p: dict[str, float] = {}
                ok = self._call(None, "p2p", smi.amdsmi_is_P2P_accessible, a.handle, b.handle)
                if ok is not None:
                    # amdsmi has one bit for peer access: it covers both reads and writes
                    p2p["read"] = p2p["write"] = 1.0 if ok else 0.0
                link = self._call(None, "p2p", smi.amdsmi_topo_get_link_type, a.handle, b.handle)
                if isinstance(link, dict) and isinstance(link.get("type"), int):
                    p2p["xgmi"] = 1.0 if link["type"] == xgmi else 0.0
                level = None
                if a.numa_node is not None and b.numa_node is not None:
                    # amdsmi does not expose PCIe switches, only NUMA affinity: "node" or "system"
                    level = "node" if a.numa_node == b.numa_node else "system"
                peers.append(PeerReading(gpu=a.index, peer=b.index, p2p=p2p, topology_level=level,
                                         topology_level_value=TOPOLOGY_LEVELS[level] if level else None))
        return peers

    # --- collection ----------------------------------------------------------------------------

    def collect(self, out: Collection) -> None:
        if not self._ready:
            self._start()
        self._metrics_now = {}
        # each GPU inside its lane's job, on this thread; a GPU that stops answering costs itself only
        for d, r, down in self.on_gpus(self._devices, self._read_gpu):
            out.gpus.append(self._down(d, down, out) if down is not None else r)
        out.peers = self._peers  # static until re-init: the renderer caches its text

    def _identity(self, d: _Gpu) -> GpuReading:
        return GpuReading(
            index=d.index, uuid=d.uuid, vendor=self.vendor, name=d.name, pci_bus_id=d.pci_bus_id,
            serial=d.serial, driver_version=d.driver_version, cuda_driver_version=self._rocm_version,
            firmware_version=d.firmware_version,
        )

    def _down(self, d: _Gpu, down: GpuDown, out: Collection) -> GpuReading:
        out.count_error(down.kind)  # this collection's: an attempt started again counts its own GPUs once
        self.log_once(f"down:{d.index}:{down}", "amdsmi: GPU %d unreadable: %s", d.index, down,
                      level=logging.WARNING)
        return self._identity(d).down(str(down), down.kind)  # its identity, VBIOS included, and no readings

    def _read_gpu(self, d: _Gpu) -> GpuReading:
        """One GPU's readings, on its lane."""
        d.begin()  # here, inside its lane's job: never while a forsaken attempt still reads it
        r = self._identity(d)
        self._read_values(d, r, d)
        attrs = {_ATTR_OF_FAMILY.get(x.partition(":")[0], "") for x in d.unsupported}
        for attr in list(attrs):
            attrs.update(_ALSO_ABSENT.get(attr, ()))
        for attr in sorted(attrs - {""}):
            value = getattr(r, attr, None)
            if value is None or value == {} or value == []:
                r.unsupported.add(FAMILY_OF_ATTR.get(attr, attr))
        return r

    def _read_values(self, d: _Gpu, r: GpuReading, gpu: Device) -> None:
        smi = self._smi
        assert smi is not None
        h = d.handle
        call = self._call

        if self._want("utilization_ratio") or self._want("memory_utilization_ratio"):
            act = call(gpu, "utilization_ratio", smi.amdsmi_get_gpu_activity, h) or {}
            r.utilization_ratio = self._si(gpu, "utilization_ratio", act.get("gfx_activity"), 0.01)
            r.memory_utilization_ratio = self._si(gpu, "memory_utilization_ratio", act.get("umc_activity"), 0.01)

        if self._want("memory_total_bytes") or self._want("memory_used_bytes") or self._want("memory_free_bytes"):
            vram = smi.AmdSmiMemoryType.VRAM
            r.memory_total_bytes = self._si(gpu, "memory_total_bytes", call(
                gpu, "memory_total_bytes", smi.amdsmi_get_gpu_memory_total, h, vram), sentinels=SENTINELS)
            r.memory_used_bytes = self._si(gpu, "memory_used_bytes", call(
                gpu, "memory_used_bytes", smi.amdsmi_get_gpu_memory_usage, h, vram), sentinels=SENTINELS)
            if r.memory_total_bytes is not None and r.memory_used_bytes is not None:
                r.memory_free_bytes = max(0.0, r.memory_total_bytes - r.memory_used_bytes)

        if self._want("temperature_celsius"):
            t, cur = smi.AmdSmiTemperatureType, smi.AmdSmiTemperatureMetric.CURRENT
            for sensor, kind in (("gpu", t.EDGE), ("junction", t.HOTSPOT), ("memory", t.VRAM)):
                if sensor == "gpu" and not d.edge_sensor:
                    continue
                v = self._si(gpu, f"temperature_celsius:{sensor}",
                             call(gpu, f"temperature_celsius:{sensor}", smi.amdsmi_get_temp_metric, h, kind, cur))
                if v is not None:
                    r.temperature_celsius[sensor] = v

        if self._want("power_watts"):
            power = call(gpu, "power_watts", smi.amdsmi_get_power_info, h) or {}
            # MI300 reports current_socket_power; older GPUs only the average (amd-smi does the same)
            r.power_watts = _first_choice(power.get("current_socket_power"))
            if r.power_watts is None:
                r.power_watts = self._si(gpu, "power_watts", power.get("average_socket_power"))

        if self._want("power_limit_watts"):
            cap = call(gpu, "power_limit_watts", smi.amdsmi_get_power_cap_info, h) or {}
            if (v := self._si(gpu, "power_limit_watts", cap.get("power_cap"), 1e-6,
                                SENTINELS)) is not None and v > 0:
                r.power_limit_watts = v  # uW -> W

        if self._want("energy_joules"):
            energy = call(gpu, "energy_joules", smi.amdsmi_get_energy_count, h) or {}
            acc = self._si(gpu, "energy_joules", energy.get("energy_accumulator"), sentinels=SENTINELS)
            res = _num(energy.get("counter_resolution"))
            if acc is not None and res is not None:
                r.energy_joules = acc * res / 1e6  # count x uJ per count

        if self._want("clock_hertz") or self._want("clock_max_hertz"):
            c = smi.AmdSmiClkType
            for key, kind in (("graphics", c.GFX), ("memory", c.MEM), ("soc", c.SOC), ("video", c.VCLK0)):
                clk = call(gpu, f"clock_hertz:{key}", smi.amdsmi_get_clock_info, h, kind) or {}
                if (v := self._si(gpu, f"clock_hertz:{key}", clk.get("clk"), 1e6)) is not None:
                    r.clock_hertz[key] = v
                if (v := self._si(gpu, f"clock_max_hertz:{key}", clk.get("max_clk"), 1e6)) is not None and v > 0:
                    r.clock_max_hertz[key] = v

        if any(self._want(a) for a in ("pcie_link_generation", "pcie_link_width", "pcie_replay_total")):
            self._read_pcie(h, r, gpu)

        if self._want("fan_speed_ratio"):
            speed = self._si(gpu, "fan_speed_ratio", call(gpu, "fan_speed_ratio", smi.amdsmi_get_gpu_fan_speed, h, 0))
            top = self._si(gpu, "fan_speed_ratio:max", call(
                gpu, "fan_speed_ratio:max", smi.amdsmi_get_gpu_fan_speed_max, h, 0)) if speed is not None else None
            if speed is not None and top:
                # as the driver says (pwm1 / pwm1_max), above 1 included: no silent clamp (docs/metrics.md)
                r.fan_speed_ratio = speed / top

        if self._want("ecc_errors"):
            ecc = call(gpu, "ecc_errors", smi.amdsmi_get_gpu_total_ecc_count, h) or {}
            # The sum of the RAS blocks' sysfs err_count (ue/ce), which the driver keeps in memory since
            # it was loaded: NVIDIA's "volatile" counter. Only bad pages persist (RAS EEPROM).
            for error_type, key in (("corrected", "correctable_count"), ("uncorrected", "uncorrectable_count")):
                if (v := self._si(gpu, f"ecc_errors:{error_type}", ecc.get(key), sentinels=SENTINELS)) is not None:
                    r.ecc_errors[(error_type, "volatile")] = v
            # deferred (poisoned) errors: no family of their own, an event of the health state (ras_events.tsv)
            if self._si(gpu, "ecc_errors:deferred", ecc.get("deferred_count"), sentinels=SENTINELS):
                r.ras_events["ecc_deferred"] = ""

        if self.enabled("gpu_health_state"):
            self._read_ras(d, r, gpu)

        if self._want("link_up"):
            links = call(gpu, "link_up", "amdsmi_get_gpu_xgmi_link_status", h) or {}
            for i, state in enumerate(links.get("status") or []):
                if state in ("U", "D"):  # "X": link disabled, not a link of this GPU
                    r.link_up[i] = 1.0 if state == "U" else 0.0

        if self._want("throttle_reasons"):
            self._read_throttle(d, r, gpu)

        if any(self._want(a) for a in _ACTIVITY_ATTRS):
            self._read_activity(d, r, gpu)

        per_pod = self.options.per_process and self.any_enabled("gpu_pod_utilization_ratio",
                                                                "gpu_pod_memory_used_bytes")
        if self._want("process_count") or self._want("process_memory_used_bytes") or per_pod or \
                (self.options.per_process and self._want("process_memory_by_pid")):
            procs = call(gpu, "process_count", smi.amdsmi_get_gpu_process_list, h)
            if isinstance(procs, list):
                by_pid: dict[int, float] = {}
                gfx_ns: dict[int, float] = {}
                for p in procs:
                    used = _num((p.get("memory_usage") or {}).get("vram_mem"))
                    by_pid[int(p["pid"])] = by_pid.get(int(p["pid"]), 0.0) + (used or 0.0)
                    busy = _num((p.get("engine_usage") or {}).get("gfx"))
                    if busy is not None:
                        gfx_ns[int(p["pid"])] = gfx_ns.get(int(p["pid"]), 0.0) + busy
                r.process_count = float(len(by_pid))
                r.process_memory_used_bytes = sum(by_pid.values())
                if self.options.per_process:
                    r.process_memory_by_pid = by_pid
                if per_pod:
                    r.process_pids = tuple(by_pid)
                    r.process_utilization_by_pid = self._process_rates(d, gfx_ns)

        if d.compute_partition is not None:
            # AMD partitions in the style of MIG: SPX is "off"; in DPX/QPX/CPX each partition is
            # its own amdsmi processor (its own reading), described by one MigReading.
            spx = d.compute_partition.upper() == "SPX"
            r.mig_mode_enabled = 0.0 if spx else 1.0
            if not spx and d.partition_id is not None:
                profile = d.compute_partition + (f"/{d.memory_partition}" if d.memory_partition else "")
                r.mig.append(MigReading(gpu_instance_id=d.partition_id, uuid=d.uuid, profile=profile,
                                        memory_total_bytes=r.memory_total_bytes,
                                        memory_used_bytes=r.memory_used_bytes,
                                        utilization_ratio=r.utilization_ratio))

    def _read_ras(self, d: _Gpu, r: GpuReading, gpu: Device) -> None:
        """The RAS state of each block with RAS on (``amdsmi_get_gpu_ecc_enabled``'s mask, read once per
        init; ``amdsmi_get_gpu_ecc_status`` per block and collection; amd-smi metric --ecc-blocks), as
        the ``ras_<state>`` events of exporter/core/ras_events.tsv with the blocks showing them: an
        input of the health state (severities and overrides: exporter/core/xid.py). NONE, DISABLED and
        ENABLED are no event."""
        smi = self._smi
        assert smi is not None
        blocks = getattr(smi, "AmdSmiGpuBlock", None)
        if d.ras_blocks is None:
            mask = self._call(gpu, "ras_events", "amdsmi_get_gpu_ecc_enabled", d.handle)
            if type(mask) is int and blocks is not None:
                d.ras_blocks = tuple(b for b in blocks if b.name not in ("INVALID", "RESERVED") and mask & b.value)
            elif "ras_events" in gpu.unsupported or blocks is None:
                d.ras_blocks = ()  # no RAS on this GPU (or an amdsmi without it): not asked again until re-init
            else:
                return  # a failed read: asked again next time
        found: dict[str, list[str]] = {}
        for block in d.ras_blocks:
            where = block.name.lower()
            state = self._call(gpu, f"ras_events:{where}", "amdsmi_get_gpu_ecc_status", d.handle, block)
            name = getattr(state, "name", None)
            event = f"ras_{name.lower()}" if isinstance(name, str) else ""
            if event in xid.EVENTS:
                found.setdefault(event, []).append(where)
        for event, where_all in found.items():
            r.ras_events[event] = ", ".join(where_all)

    def _process_rates(self, d: _Gpu, gfx_ns: dict[int, float]) -> dict[int, float] | None:
        """Per-process GFX engine share since the last collection: the growth of each process's
        cumulative engine time (``engine_usage.gfx``, ns, from the kernel's fdinfo) over the
        wall time between the two reads. A process seen for the first time has no rate yet
        (absent); the GPU's first collection gives None. O(processes)."""
        now = time.monotonic_ns()
        prev = self._gfx_prev.get(d.index)
        self._gfx_prev[d.index] = (now, gfx_ns)
        if prev is None or now <= prev[0]:
            return None
        span = float(now - prev[0])
        out: dict[int, float] = {}
        for pid, ns in gfx_ns.items():
            before = prev[1].get(pid)
            if before is not None and ns >= before:
                out[pid] = min((ns - before) / span, 1.0)
        return out

    def _read_pcie(self, h: Any, r: GpuReading, gpu: Device) -> None:
        smi = self._smi
        assert smi is not None
        pcie = self._call(gpu, "pcie_link_width", smi.amdsmi_get_pcie_info, h) or {}
        static, metric = pcie.get("pcie_static") or {}, pcie.get("pcie_metric") or {}
        r.pcie_link_width = self._si(gpu, "pcie_link_width", metric.get("pcie_width")) or None
        r.pcie_link_width_max = self._si(gpu, "pcie_link_width_max", static.get("max_pcie_width")) or None
        speed = self._si(gpu, "pcie_link_generation", metric.get("pcie_speed"))
        if speed is not None:
            r.pcie_link_generation = _PCIE_GEN_BY_MTS.get(int(speed))
        # The GPU's own maximum: the library derives it from sysfs max_link_speed (the device's link
        # capability), whatever the slot or host bridge supports. NVIDIA's is the lower of the two.
        gen_max = _first_choice(static.get("pcie_interface_version"))
        if not gen_max and (top := self._si(gpu, "pcie_link_generation_max", static.get("max_pcie_speed"))):
            gen_max = _PCIE_GEN_BY_MTS.get(int(top))
        r.pcie_link_generation_max = float(gen_max) if gen_max else None
        if r.pcie_link_generation is not None:
            r.pcie_link_generation = float(r.pcie_link_generation)
        replay = _first_choice(metric.get("pcie_replay_count"), SENTINELS)
        if replay is None:  # gpu_metrics has no replay count before MI300: the sysfs counter does
            replay = self._si(gpu, "pcie_replay_total", self._call(
                gpu, "pcie_replay_total", smi.amdsmi_get_gpu_pci_replay_counter, h), sentinels=SENTINELS)
        r.pcie_replay_total = replay

    def _read_throttle(self, d: _Gpu, r: GpuReading, gpu: Device) -> None:
        """Throttle reasons from gpu_metrics: the status bits, or residency counters (MI300)."""
        smi = self._smi
        assert smi is not None
        metrics = self._gpu_metrics(d, gpu, "throttle_reasons")
        if metrics is None:
            return
        status = int(metrics.indep_throttle_status)
        if status not in SENTINELS:  # all ones (64 or 32 bits): not in this ASIC's format
            for reason, bits in _THROTTLE_BITS.items():
                r.throttle_reasons[reason] = 1.0 if any(status >> b & 1 for b in bits) else 0.0
            return
        acc = int(metrics.accumulation_counter)
        if acc == _U64_MAX:
            gpu.unsupported.add("gpu_throttle_reason_active")
            return
        now: dict[str, int] = {}
        for reason, names in _RESIDENCY_FIELDS.items():
            values = [int(getattr(metrics, n)) for n in names]
            if all(v != _U64_MAX for v in values):
                now[reason] = sum(values)
        prev = self._residency.get(d.uuid)
        self._residency[d.uuid] = (acc, now)
        if prev is None or acc <= prev[0]:
            return  # first sample (or counters restarted): no interval to judge yet
        for reason, value in now.items():
            if reason in prev[1]:
                # active if the residency grew during the last collection interval
                r.throttle_reasons[reason] = 1.0 if value > prev[1][reason] else 0.0

    def _read_activity(self, d: _Gpu, r: GpuReading, gpu: Device) -> None:
        """Engine activity and link data from gpu_metrics (amd-smi metric --usage; xgmi --metric).

        Activities are the firmware's averages in percent (``gpu_instance`` "": partitions are GPUs
        of their own); XGMI data are kilobyte counters per link; PCIe is a sum of GB/s samples, one
        per firmware iteration, turned into bytes between two collections (:meth:`_pcie_transferred`).
        """
        wanted = [a for a in _ACTIVITY_ATTRS if self._want(a)]
        m = self._gpu_metrics(d, gpu, wanted[0])
        if m is None:
            return
        call = self._call
        for attr, pct in (("graphics_engine_active_ratio", m.average_gfx_activity),
                          ("dram_active_ratio", m.average_umc_activity)):
            if self._want(attr) and (v := call(gpu, attr, _activity, pct)) is not None:
                getattr(r, attr)[""] = v
        video = [a for a in ("encoder_utilization_ratio", "decoder_utilization_ratio") if self._want(a)]
        if video:
            # one multimedia engine (VCN) encodes and decodes: both families carry its activity
            v = call(gpu, video[0], _video_activity, m.average_mm_activity, list(m.vcn_activity))
            for attr in video:
                setattr(r, attr, v)
        if self._want("link_transferred_bytes"):
            for direction, acc in (("rx", m.xgmi_read_data_acc), ("tx", m.xgmi_write_data_acc)):
                if (v := call(gpu, f"link_transferred_bytes:xgmi_{direction}", _link_bytes, list(acc))) is not None:
                    r.link_transferred_bytes[("xgmi", direction)] = v
            sample = call(gpu, "link_transferred_bytes:pcie", _pcie_sample, m.accumulation_counter,
                          m.pcie_bandwidth_acc, m.firmware_timestamp, m.system_clock_counter)
            if sample is not None and (total := self._pcie_transferred(d.uuid, sample)) is not None:
                r.link_transferred_bytes[("pcie", "bidirectional")] = total

    def _pcie_transferred(self, uuid: str, now: tuple[int, int, str, int]) -> float | None:
        """PCIe bytes since the second collection: each interval adds its mean bandwidth times its length.

        The mean is the growth of the GB/s sum over the growth of the iteration count. The first
        sample has no interval (absent); counters that went back (a firmware or driver restart) or
        a new time source start a new interval and keep the total.
        """
        prev, total = self._pcie_bytes.get(uuid, (None, None))
        if prev is not None and now[2] == prev[2] and now[0] > prev[0] and now[1] >= prev[1] and now[3] > prev[3]:
            gb_per_second = (now[1] - prev[1]) / (now[0] - prev[0])
            total = (total or 0.0) + gb_per_second * _GB * (now[3] - prev[3]) / 1e9
        self._pcie_bytes[uuid] = (now, total)
        return total

    def _gpu_metrics(self, d: _Gpu, gpu: Device, attr: str) -> Any:
        """The raw gpu_metrics table, read once per collection through the funnel as reading ``attr``."""
        metrics = self._metrics_now.get(d.index)
        if metrics is None:
            metrics = self._call(gpu, attr, self._raw_gpu_metrics, d.handle)
            if metrics is not None:
                self._metrics_now[d.index] = metrics
        return metrics

    def _raw_gpu_metrics(self, handle: Any) -> Any:
        """``amdsmi_get_gpu_metrics_info`` as the raw ctypes struct.

        The Python-level function turns the throttle bit masks into booleans, so the struct is
        read through the package's own ctypes binding instead.
        """
        smi = self._smi
        assert smi is not None
        w = smi.amdsmi_wrapper
        metrics = w.amdsmi_gpu_metrics_t()
        status = w.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(metrics))
        if status != w.AMDSMI_STATUS_SUCCESS:
            raise smi.AmdSmiLibraryException(status)
        return metrics


BACKEND = AmdSmiBackend
