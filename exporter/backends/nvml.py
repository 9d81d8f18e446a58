"""NVIDIA backend over NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call goes through :meth:`NvmlBackend._call` (nvitop's libnvml style):

- ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` / ``NO_PERMISSION``: the field is absent,
  logged once per field, and not asked again for that GPU until NVML is re-initialised
  (a missing symbol is not asked again for any GPU);
- ``GPU_IS_LOST`` / ``UNKNOWN`` and other device faults: that GPU is ``gpu_up 0`` with
  no other reading this cycle; it is retried on the next collection;
- ``UNINITIALIZED`` / ``DRIVER_NOT_LOADED`` / ``LIBRARY_NOT_FOUND`` / version mismatch:
  the whole collection fails (:class:`BackendError`), NVML is shut down and initialised
  again on the next collection. The process never crashes.

Versioned calls (memory info ``_v2`` then v1) are probed once per initialisation.
Static values (identity, max clocks, max PCIe link) are read once per initialisation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from exporter.backends.base import Backend, BackendError, BackendUnavailable
from exporter.core.pci import NVIDIA_VENDOR, canonical_bus_id, count_pci_gpus
from exporter.core.readings import Collection, GpuReading, MigReading, PeerReading

log = logging.getLogger(__name__)

# NVML return codes (nvml.h)
NOT_SUPPORTED = 3
NO_PERMISSION = 4
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

# "this GPU/driver cannot": absent, remembered until re-init (NOT_SUPPORTED, NO_PERMISSION,
# FUNCTION_NOT_FOUND, VGPU_ECC_NOT_SUPPORTED, FREQ_NOT_SUPPORTED, DEPRECATED)
_ABSENT_CODES = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, 22, 24, 26}
# the driver itself is gone: the whole collection fails and NVML is initialised again
_DRIVER_CODES = {UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH}
# the device is unusable: gpu_up 0 with no other reading (IRQ_ISSUE, CORRUPTED_INFOROM, RESET_REQUIRED,
# GPU_NOT_FOUND, UNKNOWN)
_DOWN_CODES = {GPU_IS_LOST, 11, 14, 16, 28, UNKNOWN}
# Anything else (INVALID_ARGUMENT, TIMEOUT, NOT_READY, NO_DATA...) loses that one reading this cycle,
# is counted as an nvml_error and logged once per field and code; it is asked again next time.

CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
# Plain scalar readings: (family, GpuReading attribute, pynvml function, divisor to SI)
SCALARS = (
    ("gpu_power_watts", "power_watts", "nvmlDeviceGetPowerUsage", 1000.0),  # mW -> W
    ("gpu_power_limit_watts", "power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", 1000.0),  # mW -> W
    ("gpu_energy_joules_total", "energy_joules", "nvmlDeviceGetTotalEnergyConsumption", 1000.0),  # mJ -> J
    ("gpu_pcie_link_generation", "pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", 1.0),
    ("gpu_pcie_link_width", "pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", 1.0),
    ("gpu_pcie_replays_total", "pcie_replay_total", "nvmlDeviceGetPcieReplayCounter", 1.0),
    ("gpu_fan_speed_ratio", "fan_speed_ratio", "nvmlDeviceGetFanSpeed", 100.0),  # percent -> ratio
)
# nvmlClocksEventReason* bits (nvidia-smi -q -d PERFORMANCE), named as nvidia-smi's clocks_event_reasons.*
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
# NVML_PERF_POLICY_* for nvmlDeviceGetViolationStatus
VIOLATION_POLICIES = ((0, "power"), (1, "thermal"), (2, "sync_boost"), (3, "board_limit"),
                      (4, "low_utilization"), (5, "reliability"))
NVLINK_ERROR_FIELDS = (("crc_flit", 38), ("crc_data", 45), ("replay", 52), ("recovery", 59))
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
P2P_CAPS = ((0, "read"), (1, "write"), (2, "nvlink"), (3, "atomics"))  # NVML_P2P_CAPS_INDEX_* (integers)
TOPOLOGY_NAMES = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
NVML_FI_DEV_MEMORY_TEMP = 82
PSTATE_UNKNOWN = 32

_MISSING = object()  # sentinel: the call failed with an "absent" code


class _GpuDown(Exception):
    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


class _Gpu:
    """Per-GPU state kept across collections (handle and static readings)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.uuid = ""
        self.static: dict[str, Any] = {}
        self.skip: set[str] = set()  # fields this GPU does not support


class NvmlBackend(Backend):
    """NVIDIA GPUs through NVML. ``nvidia-smi --query-gpu`` reads the same library."""

    name: ClassVar[str] = "nvml"
    vendor: ClassVar[str] = "nvidia"
    auto_priority: ClassVar[int | None] = 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._nv: Any = None
        self._gpus: list[_Gpu] = []
        self._missing_symbols: set[str] = set()
        self._mem_v2: bool | None = None
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._lock = threading.Lock()  # NVML handles are shared with the event watcher
        self._initialised = False
        self._peers: list[PeerReading] | None = None
        self._xid = _XidWatcher(self)
        self._field_errors = 0  # transient per-field NVML errors in the current collection
        self._down: dict[int, str] = {}  # GPU index -> reason, while it is unreadable (one log line per outage)

    # --- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise BackendUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
        self._nv = pynvml
        try:
            self._nvml_init(pynvml)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == LIBRARY_NOT_FOUND:
                raise BackendUnavailable(
                    "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine, or the container runs "
                    "without the NVIDIA runtime (runtimeClassName: nvidia)"
                ) from None
            if code == DRIVER_NOT_LOADED:
                raise BackendError("nvmlInit: NVIDIA driver not loaded", kind="driver") from None
            raise BackendError(f"nvmlInit failed: {self._err(exc)}", kind="driver") from None
        self._initialised = True
        self._missing_symbols.clear()
        self._mem_v2 = None
        self._gpus = []
        self._driver_version = self._sys(pynvml.nvmlSystemGetDriverVersion, "driver_version")
        cuda = self._sys(pynvml.nvmlSystemGetCudaDriverVersion_v2, "cuda_driver_version")
        if cuda is None:
            cuda = self._sys(pynvml.nvmlSystemGetCudaDriverVersion, "cuda_driver_version")
        self._cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
        self._enumerate()
        if self.enabled("gpu_xid_*") and self._gpus:
            self._xid.start(self._gpus)

    @staticmethod
    def _nvml_init(pynvml: Any) -> None:
        """``nvmlInit()`` (nvmlInitWithFlags), or ``nvmlInit_v2`` on drivers older than flags (probed once)."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) != FUNCTION_NOT_FOUND:
                raise
            fn = pynvml._nvmlGetFunctionPointer("nvmlInit_v2")
            pynvml._nvmlCheckReturn(fn())
            with pynvml.libLoadLock:  # keep pynvml's refcount right for nvmlShutdown()
                pynvml._nvmlLib_refcount += 1

    def reset(self) -> None:
        self._shutdown_nvml()

    def shutdown(self) -> None:
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        self._xid.stop()  # before nvmlShutdown: the watcher holds an event set
        if self._initialised and self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass  # shutting down a broken driver is allowed to fail
        self._initialised = False
        self._gpus = []
        self._peers = None

    def _enumerate(self) -> None:
        nv = self._nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            raise self._driver_error("nvmlDeviceGetCount", exc) from None
        if len(self._gpus) != count:
            self._gpus = [_Gpu(i) for i in range(count)]

    # --- the one wrapper -----------------------------------------------------------------------

    def _err(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - nvmlErrorString itself may be missing
            text = "NVML error"
        return f"{text} (code {code})"

    def _driver_error(self, what: str, exc: Exception) -> BackendError:
        code = getattr(exc, "value", None)
        if code in _DRIVER_CODES:
            return BackendError(f"{what}: {self._err(exc)}", kind="driver")
        return BackendError(f"{what}: {self._err(exc)}", kind="nvml_error")

    def _sys(self, fn: Callable[..., Any], field: str) -> Any:
        """A system-level call: absent on unsupported, collection failure on driver errors."""
        nv = self._nv
        try:
            return fn()
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in _ABSENT_CODES:
                self.log_once(f"sys:{field}", "nvml: %s not available: %s", field, self._err(exc))
                return None
            raise self._driver_error(fn.__name__, exc) from None

    def _call(self, gpu: _Gpu, reading: GpuReading, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML device function for ``field``; return its value or ``_MISSING``."""
        if field in gpu.skip:
            return _MISSING
        name = getattr(fn, "__name__", field)
        if name in self._missing_symbols:
            gpu.skip.add(field)
            return _MISSING
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            return self._on_error(gpu, field, name, exc)

    def _on_error(self, gpu: _Gpu, field: str, name: str, exc: Exception) -> Any:
        """Apply the error policy (module docstring) to an NVML error from ``name`` reading ``field``.

        Returns ``_MISSING`` (the reading is absent) or raises ``_GpuDown`` / ``BackendError``.
        """
        code = getattr(exc, "value", None)
        if code in _ABSENT_CODES:
            if code == FUNCTION_NOT_FOUND:
                self._missing_symbols.add(name)
            gpu.skip.add(field)
            self.log_once(f"{field}:{code}", "nvml: %s not available (%s): %s; the series is omitted",
                          field, name, self._err(exc))
            return _MISSING
        if code in _DRIVER_CODES:
            raise self._driver_error(name, exc) from None
        if code == GPU_IS_LOST:
            raise _GpuDown(f"{name}: GPU is lost", "gpu_lost") from None
        if code in _DOWN_CODES or field == "handle":
            raise _GpuDown(f"{name}: {self._err(exc)}", "gpu_error") from None
        self._field_errors += 1
        self.log_once(f"{field}:{code}", "nvml: GPU %d: %s failed (%s): %s; the series is omitted this time",
                      gpu.index, field, name, self._err(exc))
        return _MISSING

    # --- collection ----------------------------------------------------------------------------

    def collect(self, out: Collection) -> None:
        if not self._initialised:
            self.init()
        with self._lock:
            self._enumerate()
            for gpu in self._gpus:
                reading = GpuReading(index=gpu.index, uuid=gpu.uuid, vendor="nvidia",
                                     driver_version=self._driver_version,
                                     cuda_driver_version=self._cuda_version)
                try:
                    self._read_gpu(gpu, reading)
                except _GpuDown as down:
                    gpu.handle = None  # fetch the handle again next time: the GPU may come back
                    # identity as last seen, so gpu_info keeps one series for the GPU while it is down
                    reading = GpuReading(index=gpu.index, uuid=gpu.uuid, vendor="nvidia", up=False,
                                         up_reason=str(down), name=gpu.static.get("name"),
                                         pci_bus_id=gpu.static.get("pci_bus_id"), serial=gpu.static.get("serial"),
                                         driver_version=self._driver_version,
                                         cuda_driver_version=self._cuda_version)
                    out.count_error(down.kind)
                    if gpu.index not in self._down:
                        log.warning("nvml: GPU %d unreadable: %s", gpu.index, down)
                    self._down[gpu.index] = str(down)
                else:
                    if self._down.pop(gpu.index, None) is not None:
                        log.info("nvml: GPU %d readable again", gpu.index)
                out.gpus.append(reading)
            if len(self._gpus) > 1 and (self.enabled("gpu_p2p_supported") or self.enabled("gpu_topology_level")):
                self._read_topology(out)
        out.xid_counts, out.xid_last_seconds = self._xid.snapshot()
        if self._field_errors:
            out.count_error("nvml_error", self._field_errors)
            self._field_errors = 0
        if self.enabled("gpu_pci_devices"):
            out.pci_devices = count_pci_gpus(self.options.sysfs_root, NVIDIA_VENDOR)

    def _read_gpu(self, gpu: _Gpu, r: GpuReading) -> None:
        nv = self._nv
        if gpu.handle is None:
            h = self._call(gpu, r, "handle", nv.nvmlDeviceGetHandleByIndex, gpu.index)
            if h is _MISSING:
                raise _GpuDown("no handle", "gpu_error")
            gpu.handle = h
            gpu.static = {}
        h = gpu.handle
        if not gpu.static:
            self._read_static(gpu, r, h)
        st = gpu.static
        r.uuid = gpu.uuid
        r.name, r.pci_bus_id, r.serial = st.get("name"), st.get("pci_bus_id"), st.get("serial")
        call = self._call
        en = self.enabled

        if en("gpu_utilization_ratio") or en("gpu_memory_utilization_ratio"):
            u = call(gpu, r, "gpu_utilization_ratio", nv.nvmlDeviceGetUtilizationRates, h)
            if u is not _MISSING:
                r.utilization_ratio = u.gpu / 100.0
                r.memory_utilization_ratio = u.memory / 100.0

        if en("gpu_memory_*"):
            self._read_memory(gpu, r, h)

        if en("gpu_temperature_celsius"):
            t = call(gpu, r, "gpu_temperature_celsius", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            if t is not _MISSING:
                r.temperature_celsius["gpu"] = float(t)
            mt = self._field_value(gpu, r, h, "memory_temperature", NVML_FI_DEV_MEMORY_TEMP)
            if mt is not None and mt > 0:  # 0 means "no HBM sensor" on boards without one
                r.temperature_celsius["memory"] = mt

        for family, attr, fn_name, divisor in SCALARS:
            if en(family):
                v = call(gpu, r, family, getattr(nv, fn_name), h)
                if v is not _MISSING:
                    setattr(r, attr, v / divisor)

        if en("gpu_clock_hertz"):
            for cname, ctype in CLOCKS:
                c = call(gpu, r, f"gpu_clock_hertz:{cname}", nv.nvmlDeviceGetClockInfo, h, ctype)
                if c is not _MISSING:
                    r.clock_hertz[cname] = c * 1e6
        r.clock_max_hertz = dict(st.get("clock_max_hertz", {}))

        r.pcie_link_generation_max = st.get("pcie_link_generation_max")
        r.pcie_link_width_max = st.get("pcie_link_width_max")

        if en("gpu_performance_state"):
            ps = call(gpu, r, "gpu_performance_state", nv.nvmlDeviceGetPerformanceState, h)
            if ps is not _MISSING and 0 <= int(ps) < PSTATE_UNKNOWN:
                r.performance_state = float(ps)

        self._read_depth(gpu, r, h)
        r.unsupported = {f for f in gpu.skip if f not in ("handle",)}

    def _read_static(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Identity and limits that do not change while the driver is loaded."""
        nv = self._nv
        call = self._call
        st: dict[str, Any] = {}
        uuid = call(gpu, r, "uuid", nv.nvmlDeviceGetUUID, h)
        gpu.uuid = uuid if uuid is not _MISSING else gpu.uuid
        name = call(gpu, r, "name", nv.nvmlDeviceGetName, h)
        st["name"] = name if name is not _MISSING else None
        pci = call(gpu, r, "pci_bus_id", nv.nvmlDeviceGetPciInfo, h)
        if pci is not _MISSING:
            bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
            st["pci_bus_id"] = canonical_bus_id(bus)
        serial = call(gpu, r, "serial", nv.nvmlDeviceGetSerial, h)
        st["serial"] = serial if serial is not _MISSING else None
        maxc: dict[str, float] = {}
        if self.enabled("gpu_clock_max_hertz"):
            for cname, ctype in CLOCKS:
                c = call(gpu, r, f"gpu_clock_max_hertz:{cname}", nv.nvmlDeviceGetMaxClockInfo, h, ctype)
                if c is not _MISSING and c > 0:
                    maxc[cname] = c * 1e6
        st["clock_max_hertz"] = maxc
        if self.enabled("gpu_pcie_link_generation_max"):
            g = call(gpu, r, "gpu_pcie_link_generation_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
            st["pcie_link_generation_max"] = float(g) if g is not _MISSING else None
        if self.enabled("gpu_pcie_link_width_max"):
            w = call(gpu, r, "gpu_pcie_link_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
            st["pcie_link_width_max"] = float(w) if w is not _MISSING else None
        if self.enabled("gpu_link_*"):
            n = self._field_value(gpu, r, h, "nvlink_count", NVML_FI_DEV_NVLINK_LINK_COUNT)
            st["nvlinks"] = tuple(range(int(n))) if n else ()
        gpu.static = st

    def _read_memory(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Memory info v2 (has ``reserved``), falling back to v1 once if the driver lacks it."""
        nv = self._nv
        if self._mem_v2 is not False:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                self._mem_v2 = True
                r.memory_total_bytes = float(m.total)
                r.memory_used_bytes = float(m.used)
                r.memory_free_bytes = float(m.free)
                r.memory_reserved_bytes = float(m.reserved)
                return
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code not in (FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH, NOT_SUPPORTED) or self._mem_v2:
                    self._on_error(gpu, "gpu_memory_total_bytes", "nvmlDeviceGetMemoryInfo_v2", exc)
                    return
                self._mem_v2 = False
                self.log_once("mem_v2", "nvml: memory info v2 unavailable (%s); using v1 (no reserved bytes)",
                              self._err(exc))
        m = self._call(gpu, r, "gpu_memory_total_bytes", nv.nvmlDeviceGetMemoryInfo, h)
        if m is not _MISSING:
            r.memory_total_bytes = float(m.total)
            r.memory_used_bytes = float(m.used)
            r.memory_free_bytes = float(m.free)

    def _field_value(self, gpu: _Gpu, r: GpuReading, h: Any, field: str, field_id: int) -> float | None:
        """One ``nvmlDeviceGetFieldValues`` entry; each entry carries its own return code."""
        nv = self._nv
        vals = self._call(gpu, r, field, nv.nvmlDeviceGetFieldValues, h, [field_id])
        if vals is _MISSING:
            return None
        v = vals[0]
        if v.nvmlReturn != 0:
            if v.nvmlReturn in _ABSENT_CODES:
                gpu.skip.add(field)
                self.log_once(f"{field}:fv", "nvml: %s not available (field %d, code %d)", field, field_id,
                              v.nvmlReturn)
                return None
            self._on_error(gpu, field, "nvmlDeviceGetFieldValues", nv.NVMLError(v.nvmlReturn))
            return None
        return _field_number(v)

    def _read_depth(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Health readings: ECC, row remapping, throttling, NVLink, codecs, processes, MIG."""
        nv = self._nv
        call = self._call
        en = self.enabled
        if en("gpu_ecc_mode_enabled") or en("gpu_ecc_errors_total"):
            mode = call(gpu, r, "gpu_ecc_mode_enabled", nv.nvmlDeviceGetEccMode, h)
            if mode is not _MISSING:
                r.ecc_mode_enabled = 1.0 if mode[0] else 0.0
            if en("gpu_ecc_errors_total") and (mode is _MISSING or mode[0]):
                for etype, ename in ((1, "uncorrected"), (0, "corrected")):
                    for ctype, cname in ((0, "volatile"), (1, "aggregate")):
                        v = call(gpu, r, f"gpu_ecc_errors_total:{ename}_{cname}", nv.nvmlDeviceGetTotalEccErrors,
                                 h, etype, ctype)
                        if v is not _MISSING:
                            r.ecc_errors[(ename, cname)] = float(v)
        if en("gpu_retired_pages"):
            for cause, cname in ((0, "single_bit"), (1, "double_bit")):
                pages = call(gpu, r, f"gpu_retired_pages:{cname}", nv.nvmlDeviceGetRetiredPages, h, cause)
                if pages is not _MISSING:
                    r.retired_pages[cname] = float(len(pages))
        if en("gpu_retired_pages_pending"):
            pend = call(gpu, r, "gpu_retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
            if pend is not _MISSING:
                r.retired_pages_pending = 1.0 if pend else 0.0
        if en("gpu_remapped_rows*"):
            rows = call(gpu, r, "gpu_remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
            if rows is not _MISSING:
                corr, unc, pending, failed = rows
                r.remapped_rows = {"corrected": float(corr), "uncorrected": float(unc)}
                r.remapped_rows_pending = 1.0 if pending else 0.0
                r.remapped_rows_failed = 1.0 if failed else 0.0
        if en("gpu_throttle_reason_active"):
            self._read_throttle(gpu, r, h)
        if en("gpu_violation_seconds_total"):
            for policy, pname in VIOLATION_POLICIES:
                v = call(gpu, r, f"gpu_violation_seconds_total:{pname}", nv.nvmlDeviceGetViolationStatus, h, policy)
                if v is not _MISSING:
                    r.violation_seconds[pname] = v.violationTime / 1e9
        if self.options.pcie_throughput and en("gpu_pcie_throughput_bytes_per_second"):
            for counter, dname in ((0, "tx"), (1, "rx")):
                v = call(gpu, r, f"gpu_pcie_throughput_bytes_per_second:{dname}", nv.nvmlDeviceGetPcieThroughput,
                         h, counter)
                if v is not _MISSING:
                    r.pcie_throughput[dname] = float(v) * 1024.0  # NVML reports KB/s
        if en("gpu_link_up"):
            for link in gpu.static.get("nvlinks", ()):
                v = call(gpu, r, f"gpu_link_up:{link}", nv.nvmlDeviceGetNvLinkState, h, link)
                if v is not _MISSING:
                    r.link_up[link] = 1.0 if v else 0.0
        if en("gpu_link_errors_total") and gpu.static.get("nvlinks"):
            for name, fid in NVLINK_ERROR_FIELDS:
                v = self._field_value(gpu, r, h, f"gpu_link_errors_total:{name}", fid)
                if v is not None:
                    r.link_errors[name] = v
        if en("gpu_encoder_utilization_ratio"):
            v = call(gpu, r, "gpu_encoder_utilization_ratio", nv.nvmlDeviceGetEncoderUtilization, h)
            if v is not _MISSING:
                r.encoder_utilization_ratio = v[0] / 100.0
        if en("gpu_decoder_utilization_ratio"):
            v = call(gpu, r, "gpu_decoder_utilization_ratio", nv.nvmlDeviceGetDecoderUtilization, h)
            if v is not _MISSING:
                r.decoder_utilization_ratio = v[0] / 100.0
        if en("gpu_processes*") or (self.options.per_process and en("gpu_process_memory_used_bytes")):
            procs = call(gpu, r, "gpu_processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
            if procs is not _MISSING:
                r.process_count = float(len(procs))
                used = [p.usedGpuMemory for p in procs if isinstance(p.usedGpuMemory, int)]
                # usedGpuMemory is None where the driver cannot attribute memory (e.g. MIG without privileges)
                r.process_memory_used_bytes = float(sum(used)) if len(used) == len(procs) else None
                if self.options.per_process:
                    r.process_memory_by_pid = {int(p.pid): float(p.usedGpuMemory) for p in procs
                                               if isinstance(p.usedGpuMemory, int)}
        if en("gpu_mig_*"):
            self._read_mig(gpu, r, h)

    def _read_throttle(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Clock event (throttle) reasons, decoded into one 0/1 value per supported reason.

        ``ClocksEventReasons`` replaced ``ClocksThrottleReasons`` in newer drivers: probed once.
        """
        nv = self._nv
        current = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if current is None or "nvmlDeviceGetCurrentClocksEventReasons" in self._missing_symbols:
            current = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = self._call(gpu, r, "gpu_throttle_reason_active", current, h)
        if mask is _MISSING and current.__name__.endswith("EventReasons") and \
                current.__name__ in self._missing_symbols:
            gpu.skip.discard("gpu_throttle_reason_active")
            mask = self._call(gpu, r, "gpu_throttle_reason_active", nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if mask is _MISSING:
            return
        supported = gpu.static.get("throttle_supported")
        if supported is None:
            sup_fn = getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None)
            try:
                supported = int(sup_fn(h)) if sup_fn is not None else int(
                    nv.nvmlDeviceGetSupportedClocksThrottleReasons(h))
            except nv.NVMLError:
                try:
                    supported = int(nv.nvmlDeviceGetSupportedClocksThrottleReasons(h))
                except nv.NVMLError:
                    supported = ~0  # unknown: report every named reason
            gpu.static["throttle_supported"] = supported
        for bit, name in THROTTLE_REASONS:
            if supported & bit:
                r.throttle_reasons[name] = 1.0 if int(mask) & bit else 0.0

    def _read_mig(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """MIG mode and, per MIG instance, its memory (utilisation is not reported by NVML)."""
        nv = self._nv
        mode = self._call(gpu, r, "gpu_mig_mode_enabled", nv.nvmlDeviceGetMigMode, h)
        if mode is _MISSING:
            return
        r.mig_mode_enabled = 1.0 if mode[0] == 1 else 0.0
        if mode[0] != 1:
            return
        try:
            slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(h))
        except nv.NVMLError as exc:
            self.log_once(f"mig:{gpu.index}", "nvml: GPU %d: cannot list MIG devices: %s", gpu.index, self._err(exc))
            return
        for slot in range(slots):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) in (NOT_FOUND, INVALID_ARGUMENT):
                    continue  # an empty slot
                self.log_once(f"mig:{gpu.index}:{slot}", "nvml: GPU %d MIG slot %d: %s", gpu.index, slot,
                              self._err(exc))
                continue
            r.mig.append(self._read_mig_device(mh))

    def _read_mig_device(self, mh: Any) -> MigReading:
        nv = self._nv

        def get(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(mh, *args)
            except nv.NVMLError:
                return None

        gi = get(nv.nvmlDeviceGetGpuInstanceId)
        name = get(nv.nvmlDeviceGetName) or ""
        m = MigReading(gpu_instance_id=int(gi) if gi is not None else -1,
                       compute_instance_id=get(nv.nvmlDeviceGetComputeInstanceId),
                       uuid=get(nv.nvmlDeviceGetUUID),
                       profile=name.rsplit("MIG ", 1)[1].strip() if "MIG " in name else None)
        mem = get(nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            m.memory_total_bytes = float(mem.total)
            m.memory_used_bytes = float(mem.used)
        util = get(nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            m.utilization_ratio = util.gpu / 100.0
        return m

    def _read_topology(self, out: Collection) -> None:
        """P2P capabilities and topology level between every pair of GPUs (static: read once)."""
        nv = self._nv
        if self._peers is None:
            peers: list[PeerReading] = []
            handles = [(g.index, g.handle) for g in self._gpus if g.handle is not None]
            want_p2p = self.enabled("gpu_p2p_supported")
            want_topo = self.enabled("gpu_topology_level")
            for a, ha in handles:
                for b, hb in handles:
                    if a == b:
                        continue
                    p = PeerReading(gpu=a, peer=b)
                    for idx, cap in P2P_CAPS if want_p2p else ():
                        try:
                            status = nv.nvmlDeviceGetP2PStatus(ha, hb, idx)
                        except nv.NVMLError as exc:
                            self.log_once(f"p2p:{cap}", "nvml: P2P status %s unavailable: %s", cap, self._err(exc))
                            continue
                        p.p2p[cap] = 1.0 if status == 0 else 0.0
                    if want_topo:
                        try:
                            level = int(nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
                            p.topology_level = TOPOLOGY_NAMES.get(level, str(level))
                            p.topology_level_value = float(level)
                        except nv.NVMLError as exc:
                            self.log_once("topology", "nvml: topology unavailable: %s", self._err(exc))
                    if p.p2p or p.topology_level is not None:
                        peers.append(p)
            complete = len(handles) == len(self._gpus)
            if not complete:
                return  # a GPU is down: try again next time rather than cache a partial matrix
            self._peers = peers
        out.peers = self._peers  # the same static list object: the renderer caches its text


XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError


class _XidWatcher:
    """Background thread that waits on an NVML event set for XID errors.

    It never blocks a scrape: collections read its counters under a short lock. It
    survives a lost GPU (that GPU just stops reporting) and a driver reload (the backend
    stops it before nvmlShutdown and starts a new one after the next nvmlInit). Counts
    are kept for the life of the process, so ``gpu_xid_errors_total`` is a true counter.
    """

    WAIT_MS = 500  # bounds how long stop() waits for the thread

    def __init__(self, backend: NvmlBackend) -> None:
        self.b = backend
        self.counts: dict[tuple[int, str, str], float] = {}
        self.last: dict[tuple[int, str], float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, gpus: list[_Gpu]) -> None:
        self.stop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(list(gpus), self._stop), name="nvml-xid",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.WAIT_MS / 1000 * 4)
            self._thread = None

    def snapshot(self) -> tuple[dict[tuple[int, str, str], float], dict[tuple[int, str], float]]:
        with self.lock:
            return dict(self.counts), dict(self.last)

    def _run(self, gpus: list[_Gpu], stop: threading.Event) -> None:
        """Register every reachable GPU and wait; rebuild the event set after any error.

        A lost GPU makes the wait fail (or its registration fail): the set is rebuilt with
        the GPUs that still answer, and rebuilt again periodically while one is missing, so
        it rejoins when it comes back.
        """
        while not stop.is_set():
            missing = self._watch(gpus, stop)
            if stop.wait(1.0 if missing is None else 0.0):
                return

    def _watch(self, gpus: list[_Gpu], stop: threading.Event) -> int | None:
        """One event set's life. Returns None after an error (caller backs off)."""
        nv = self.b._nv
        try:
            evset = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self.b.log_once("xid:create", "nvml: XID events unavailable: %s", self.b._err(exc))
            return None
        uuids: dict[int, str] = {}
        try:
            for g in gpus:
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(g.index)
                    nv.nvmlDeviceRegisterEvents(h, XID_EVENT, evset)
                    uuids[g.index] = g.uuid or nv.nvmlDeviceGetUUID(h)
                except nv.NVMLError as exc:
                    self.b.log_once(f"xid:register:{g.index}", "nvml: GPU %d: XID events unavailable: %s",
                                    g.index, self.b._err(exc))
            if not uuids:
                return None
            rebuild_at = time.monotonic() + (30.0 if len(uuids) < len(gpus) else float("inf"))
            while not stop.is_set() and time.monotonic() < rebuild_at:
                try:
                    data = nv.nvmlEventSetWait_v2(evset, self.WAIT_MS)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == TIMEOUT:
                        continue
                    self.b.log_once(f"xid:wait:{getattr(exc, 'value', None)}",
                                    "nvml: XID wait failed (%s); re-registering the GPUs that answer",
                                    self.b._err(exc))
                    return None
                if not (data.eventType & XID_EVENT):
                    continue
                try:
                    idx = int(nv.nvmlDeviceGetIndex(data.device))
                except nv.NVMLError:
                    continue
                key = (idx, uuids.get(idx, ""), str(int(data.eventData)))
                with self.lock:
                    self.counts[key] = self.counts.get(key, 0.0) + 1.0
                    self.last[(idx, key[1])] = time.time()
            return len(gpus) - len(uuids)
        finally:
            try:
                nv.nvmlEventSetFree(evset)
            except nv.NVMLError:
                pass

def _field_number(v: Any) -> float | None:
    """Decode an ``nvmlFieldValue_t`` union by its ``valueType``."""
    t = v.valueType
    u = v.value
    if t == 0:
        return float(u.dVal)
    if t == 1:
        return float(u.uiVal)
    if t == 2:
        return float(u.ulVal)
    if t == 3:
        return float(u.ullVal)
    if t == 4:
        return float(u.sllVal)
    if t == 5:
        return float(u.siVal)
    if t == 6 and hasattr(u, "usVal"):
        return float(u.usVal)
    return None


BACKEND = NvmlBackend
