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

import threading
from collections.abc import Callable
from typing import Any, ClassVar

from exporter.backends.base import Backend, BackendError, BackendUnavailable
from exporter.readings import Collection, GpuReading
from exporter.sysfs import NVIDIA_VENDOR, count_pci_gpus

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

_ABSENT_CODES = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION}
_DRIVER_CODES = {UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH}
# Anything else raised by a device call marks that GPU down for this cycle.

CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
NVML_FI_DEV_MEMORY_TEMP = 82
PSTATE_UNKNOWN = 32

_MISSING = object()  # sentinel: the call failed with an "absent" code


class _GpuDown(Exception):
    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


def canonical_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` -> ``0000:18:00.0`` (lower case, 4-digit domain as in sysfs)."""
    s = bus_id.strip().lower()
    domain, _, rest = s.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else s


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

    # --- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise BackendUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
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

    def reset(self) -> None:
        self._shutdown_nvml()

    def shutdown(self) -> None:
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        if self._initialised and self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass  # shutting down a broken driver is allowed to fail
        self._initialised = False
        self._gpus = []

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
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
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
            raise _GpuDown(f"{name}: {self._err(exc)}", "gpu_error") from None

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
                    reading = GpuReading(index=gpu.index, uuid=gpu.uuid, vendor="nvidia", up=False,
                                         up_reason=str(down), name=gpu.static.get("name"),
                                         pci_bus_id=gpu.static.get("pci_bus_id"),
                                         driver_version=self._driver_version)
                    out.count_error(down.kind)
                    self.log_once(f"down:{gpu.index}:{down}", "nvml: GPU %d unreadable: %s", gpu.index, down)
                out.gpus.append(reading)
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

        if en("gpu_power_watts"):
            p = call(gpu, r, "gpu_power_watts", nv.nvmlDeviceGetPowerUsage, h)
            if p is not _MISSING:
                r.power_watts = p / 1000.0
        if en("gpu_power_limit_watts"):
            p = call(gpu, r, "gpu_power_limit_watts", nv.nvmlDeviceGetEnforcedPowerLimit, h)
            if p is not _MISSING:
                r.power_limit_watts = p / 1000.0
        if en("gpu_energy_joules_total"):
            e = call(gpu, r, "gpu_energy_joules_total", nv.nvmlDeviceGetTotalEnergyConsumption, h)
            if e is not _MISSING:
                r.energy_joules = e / 1000.0

        if en("gpu_clock_hertz"):
            for cname, ctype in CLOCKS:
                c = call(gpu, r, f"gpu_clock_hertz:{cname}", nv.nvmlDeviceGetClockInfo, h, ctype)
                if c is not _MISSING:
                    r.clock_hertz[cname] = c * 1e6
        r.clock_max_hertz = dict(st.get("clock_max_hertz", {}))

        if en("gpu_pcie_link_generation"):
            g = call(gpu, r, "gpu_pcie_link_generation", nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
            if g is not _MISSING:
                r.pcie_link_generation = float(g)
        if en("gpu_pcie_link_width"):
            w = call(gpu, r, "gpu_pcie_link_width", nv.nvmlDeviceGetCurrPcieLinkWidth, h)
            if w is not _MISSING:
                r.pcie_link_width = float(w)
        r.pcie_link_generation_max = st.get("pcie_link_generation_max")
        r.pcie_link_width_max = st.get("pcie_link_width_max")

        if en("gpu_fan_speed_ratio"):
            f = call(gpu, r, "gpu_fan_speed_ratio", nv.nvmlDeviceGetFanSpeed, h)
            if f is not _MISSING:
                r.fan_speed_ratio = f / 100.0
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
                    self._call(gpu, r, "gpu_memory_total_bytes", _raiser(exc))
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
            self._call(gpu, r, field, _raiser(nv.NVMLError(v.nvmlReturn)))
            return None
        return _field_number(v)

    def _read_depth(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Readings beyond the core set (ECC, throttling, topology...): see the depth issue."""


def _raiser(exc: Exception) -> Callable[[], Any]:
    def fn() -> Any:
        raise exc

    fn.__name__ = "nvmlDeviceGetFieldValues"
    return fn


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
