"""NVIDIA backend over NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call goes through the backend base's funnel (:meth:`Backend.call`), with this
backend's meaning of NVML's statuses (:meth:`NvmlBackend.classify`):

- ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` / ``NO_PERMISSION`` / ``ARGUMENT_VERSION_MISMATCH``,
  and a function the ``pynvml`` binding lacks or cannot version (``NVMLLibraryMismatchError``):
  unsupported, absent, logged once, not asked again until NVML is initialised again;
- ``GPU_IS_LOST`` (``gpu_lost``) and the device faults ``IRQ_ISSUE``, ``CORRUPTED_INFOROM``,
  ``RESET_REQUIRED``, ``GPU_NOT_FOUND`` (``gpu_error``): that GPU is ``gpu_up 0`` with no other
  reading this cycle, and is retried on the next;
- ``UNKNOWN`` (999), which single functions return in the field (virtualised and containerised
  setups) as well as sick GPUs: suspect. The GPU's identity calls (``nvmlDeviceGetUUID``,
  ``nvmlDeviceGetPciInfo``, once per collection; a MIG instance asks its GPU's) decide: they
  answer, so only that reading is absent (``reading_error``); they fail too, so the GPU is
  down (``gpu_error``);
- ``UNINITIALIZED`` / ``DRIVER_NOT_LOADED`` / ``LIBRARY_NOT_FOUND`` / ``LIB_RM_VERSION_MISMATCH``:
  the whole collection fails (kind ``driver``) and NVML is initialised again next time;
- anything else (``TIMEOUT``, ``INVALID_ARGUMENT``, a ctypes error, a malformed value, a
  sentinel): that one reading is absent this time, counted, and asked again next time.

Versioned functions are called by their versioned names and probed once per GPU, newest
first (processes ``_v3``, ``_v2``, v1; memory ``_v2``, v1; clock event reasons, then the
older throttle reasons); the version that worked is remembered per GPU. Static values
(identity, max clocks, max PCIe link, NVLink count) are read once per initialisation.

pynvml's public API is called from here; anything below it (direct C calls with reused out
values, functions pynvml no longer wraps, NVML's C structures) lives in ``nvml_private.py``,
guarded: an internal the installed nvidia-ml-py lacks costs only the readings that need it.
XID events: ``nvml_events.py``; GPM activity: ``nvml_gpm.py``; compute processes: ``nvml_processes.py``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from exporter.backends.base import (
    DRIVER,
    GPU_ERROR,
    GPU_LOST,
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
from exporter.backends.nvml_events import XidWatcher
from exporter.backends.nvml_gpm import GpmReader
from exporter.backends.nvml_private import (
    NVML_MEMORY_V2,
    U32,
    U64,
    Binding,
    MemoryV1,
    MemoryV2,
    PerLink,
    Utilization,
    ViolationTime,
)
from exporter.backends.nvml_processes import ProcessReader
from exporter.core import schema
from exporter.core.k8s_names import DevicePluginResource, DraAttributes, KubernetesNames
from exporter.core.pci import canonical_bus_id, pci_gpus
from exporter.core.readings import Collection, GpuReading, MigReading, PeerReading

log = logging.getLogger(__name__)
PCI_VENDOR = 0x10DE  # NVIDIA: the sysfs ``vendor`` of its GPUs (gpu_pci_devices)
_K = TypeVar("_K", bound=Hashable)  # the key a per-link value is filed under

# NVML return codes (nvml.h)
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

# "this GPU/driver cannot" (NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, VGPU_ECC_NOT_SUPPORTED,
# FREQ_NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH, DEPRECATED)
_ABSENT_CODES = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, 22, 24, ARGUMENT_VERSION_MISMATCH, 26}
# the driver itself is gone: the whole collection fails and NVML is initialised again
_DRIVER_CODES = {UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH}
# the device is unusable (IRQ_ISSUE, CORRUPTED_INFOROM, RESET_REQUIRED, GPU_NOT_FOUND); UNKNOWN only when
# the GPU's identity call fails too (Outcome.SUSPECT)
_DOWN_CODES = {11, 14, 16, 28}

CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
_U32, _U64 = U32, U64


def proc_uuid(sysfs_root: str, bus_id: str) -> str | None:
    """The GPU UUID the NVIDIA kernel driver shows in ``/proc/driver/nvidia/gpus/<bus>/information``
    (``proc`` next to ``sysfs_root``), without NVML: known even for a GPU NVML cannot read."""
    proc = os.path.join(os.path.dirname(os.path.normpath(sysfs_root)) or "/", "proc")
    try:
        with open(os.path.join(proc, "driver", "nvidia", "gpus", bus_id, "information"), encoding="utf-8",
                  errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() == "gpu uuid" and value.strip().startswith("GPU-"):
                    return value.strip()
    except OSError:
        return None
    return None


def _memory(o: Sequence[Any]) -> tuple[float, float, float, float | None]:
    m = o[0]
    return si(m.total), si(m.used), si(m.free), si(m.reserved) if isinstance(m, MemoryV2) else None


def _utilization(o: Sequence[Any]) -> tuple[float, float]:
    return si(o[0].gpu, 0.01), si(o[0].memory, 0.01)


def _remapped(o: Sequence[Any]) -> tuple[float, float, float, float]:
    return si(o[0].value), si(o[1].value), _flag(o[2].value), _flag(o[3].value)


@dataclass(frozen=True)
class Simple:
    """A one-value reading ``symbol(device, *args, &out)``: ``out.member`` x ``factor`` (to SI) goes into its
    family's ``attr`` (exporter/core/schema.py), at ``key`` when that attribute is a dict; ``trailing``: that
    many ``unsigned int`` outs after ``out`` that the call writes and nobody reads (a sampling period, as
    ``nvmlDeviceGetEncoderUtilization(device, &percent, &period)``). Called directly with a reused out value
    (see _direct)."""

    symbol: str
    factor: float = 1.0
    args: tuple[int, ...] = ()
    key: str | None = None
    out: Any = _U32
    member: str = "value"
    trailing: int = 0

    def reading(self, family: str) -> str:
        """Its name in the funnel (``family:key``)."""
        return f"{family}:{self.key}" if self.key else family


# The one-value readings of each family, by family name, in reading order.
SIMPLE: dict[str, tuple[Simple, ...]] = {
    # nvidia-smi temperature.gpu (NVML_TEMPERATURE_GPU = 0), degrees C
    "gpu_temperature_celsius": (Simple("nvmlDeviceGetTemperature", args=(0,), key="gpu"),),
    "gpu_power_watts": (Simple("nvmlDeviceGetPowerUsage", 1e-3),),  # mW -> W
    "gpu_power_limit_watts": (Simple("nvmlDeviceGetEnforcedPowerLimit", 1e-3),),  # mW -> W
    "gpu_energy_joules_total": (Simple("nvmlDeviceGetTotalEnergyConsumption", 1e-3, out=_U64),),  # mJ -> J
    "gpu_pcie_link_generation": (Simple("nvmlDeviceGetCurrPcieLinkGeneration"),),
    "gpu_pcie_link_width": (Simple("nvmlDeviceGetCurrPcieLinkWidth"),),
    "gpu_pcie_replays_total": (Simple("nvmlDeviceGetPcieReplayCounter"),),
    # percent -> ratio; published as the driver says, above 1 included (some boards report > 100 %)
    "gpu_fan_speed_ratio": (Simple("nvmlDeviceGetFanSpeed", 0.01),),
    "gpu_clock_hertz": tuple(Simple("nvmlDeviceGetClockInfo", 1e6, (ctype,), cname) for cname, ctype in CLOCKS),  # MHz
    # issue 28: nvidia-smi power.default_limit (mW -> W) and compute_mode (nvmlComputeMode_t, 0-3)
    "gpu_power_default_limit_watts": (Simple("nvmlDeviceGetPowerManagementDefaultLimit", 1e-3),),
    "gpu_compute_mode": (Simple("nvmlDeviceGetComputeMode"),),
    # nvidia-smi utilization.encoder / .decoder: (percent, sampling period in us) -> ratio
    "gpu_encoder_utilization_ratio": (Simple("nvmlDeviceGetEncoderUtilization", 0.01, trailing=1),),
    "gpu_decoder_utilization_ratio": (Simple("nvmlDeviceGetDecoderUtilization", 0.01, trailing=1),),
}
# nvmlClocksEventReason* bits (nvidia-smi -q -d PERFORMANCE), named as nvidia-smi's clocks_event_reasons.*
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
# NVML_PERF_POLICY_* for nvmlDeviceGetViolationStatus
VIOLATION_POLICIES = ((0, "power"), (1, "thermal"), (2, "sync_boost"), (3, "board_limit"),
                      (4, "low_utilization"), (5, "reliability"))
# nvmlNvLinkErrorCounter_t counters read per link (nvidia-smi nvlink -e); the ECC data counter (4) is
# Volta-only and has no family
NVLINK_ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
P2P_CAPS = ((0, "read"), (1, "write"), (2, "nvlink"), (3, "atomics"))  # NVML_P2P_CAPS_INDEX_* (integers)
TOPOLOGY_NAMES = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
NVML_FI_DEV_MEMORY_TEMP = 82
PSTATE_UNKNOWN = 32
MEMORY_FAMILIES = ("gpu_memory_total_bytes", "gpu_memory_used_bytes", "gpu_memory_free_bytes",
                   "gpu_memory_reserved_bytes")


@dataclass(frozen=True)
class _Direct:
    """Every NVML call the backend makes directly with a reused C value (NvmlBackend._build_direct), built
    for each GPU at its first read after an initialisation (its own out values: GPUs are read at once): the
    enabled SIMPLE readings, ECC counts and violation times as (funnel reading, call, where it goes), and
    the calls with more than one out value."""

    simple: list[tuple[str, Callable[[Any], float], str, str | None]]
    ecc: list[tuple[str, Callable[[Any], float], tuple[str, str]]]
    violation: list[tuple[str, Callable[[Any], float], str]]
    utilization: Callable[[Any], Sequence[Any]]
    memory_v2: Callable[[Any], Sequence[Any]]
    memory_v1: Callable[[Any], Sequence[Any]]
    remapped: Callable[[Any], Sequence[Any]]
    retired: tuple[tuple[Callable[[Any], float], str, str], ...]
    pstate: Callable[[Any], float]


class _Gpu(Device):
    """Per-GPU state kept across collections (handle and static readings)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.handle: Any = None
        self.static: dict[str, Any] = {}
        self.mig_devs: dict[int, Device] = {}  # MIG slot -> its own probe state

    def begin(self) -> None:
        super().begin()
        for d in self.mig_devs.values():  # its instances ask the GPU's identity afresh too
            d.identity_checked, d.identity_fault = False, None


def _number(factor: float = 1.0) -> Callable[[Any], float]:
    return lambda v: si(v, factor)


def _flag(v: Any) -> float:
    """An NVML enable/pending state: 1.0 or 0.0; a sentinel is "no value", anything else not 0/1 malformed."""
    x = si(v)
    if x not in (0.0, 1.0):
        raise ValueError(f"state {v!r} is neither 0 nor 1")
    return x


def _mask(v: Any) -> int:
    """A bit mask (clock event reasons): all ones is "no value", not every bit set."""
    return int(si(v))


class NvmlBackend(Backend):
    """NVIDIA GPUs through NVML. ``nvidia-smi --query-gpu`` reads the same library."""

    name: ClassVar[str] = "nvml"
    vendor: ClassVar[str] = "nvidia"
    #: the families this backend fills (docs/metrics.md's support table; the contract test checks it)
    families: ClassVar[frozenset[str]] = frozenset({
        "gpu_field_unsupported", "gpu_utilization_ratio", "gpu_memory_utilization_ratio",
        "gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio", "gpu_memory_total_bytes",
        "gpu_memory_used_bytes", "gpu_memory_free_bytes", "gpu_memory_reserved_bytes", "gpu_temperature_celsius",
        "gpu_fan_speed_ratio", "gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules_total",
        "gpu_performance_state", "gpu_clock_hertz", "gpu_clock_max_hertz", "gpu_pcie_link_generation",
        "gpu_pcie_link_generation_max", "gpu_pcie_link_width", "gpu_pcie_link_width_max", "gpu_pcie_replays_total",
        "gpu_pcie_throughput_bytes_per_second", "gpu_sm_active_ratio", "gpu_sm_occupancy_ratio",
        "gpu_graphics_engine_active_ratio", "gpu_pipe_active_ratio", "gpu_dram_active_ratio",
        "gpu_nvlink_throughput_bytes_per_second", "gpu_ecc_mode_enabled", "gpu_ecc_errors_total", "gpu_retired_pages",
        "gpu_retired_pages_pending", "gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed",
        "gpu_throttle_reason_active", "gpu_violation_seconds_total", "gpu_link_up", "gpu_link_errors_total",
        "gpu_processes", "gpu_processes_memory_used_bytes", "gpu_process_memory_used_bytes",
        "gpu_power_default_limit_watts", "gpu_compute_mode", "gpu_fabric_state", "gpu_recovery_action",
        "gpu_mig_mode_enabled", "gpu_mig_memory_total_bytes", "gpu_mig_memory_used_bytes", "gpu_mig_utilization_ratio",
        "gpu_p2p_supported", "gpu_topology_level", "gpu_xid_errors_total", "gpu_xid_last_timestamp_seconds",
        "gpu_pod_utilization_ratio", "gpu_pod_memory_used_bytes",
        "gpu_exporter_pod_processes",
    })
    auto_priority: ClassVar[int | None] = 10
    runtime: ClassVar[str] = "CUDA"
    floor: ClassVar[str] = (
        "driver branch R470. The suite builds the fake library with the exported symbols of R470, R525, R535, "
        "R550, R610 and R615 (`tests/fakes/nvml_symbols/`) and checks every family on each.")
    below_floor: ClassVar[str] = (
        "Older drivers still work through the unversioned entry points (`nvmlDeviceGetCount`, "
        "`nvmlDeviceGetHandleByIndex`, processes v1); any function a driver lacks makes only its readings absent, "
        "logged once.")
    #: NVIDIA's names in Kubernetes: the device plugin's resources (sharing variants add a suffix:
    #: nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb.shared; a MIG resource is a slice), GKE's
    #: nvidiaN device IDs, and the DRA driver (NVIDIA/k8s-dra-driver-gpu) with the attributes its devices carry
    #: (cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go): a full GPU's ``uuid`` (GPU-...), a MIG device's own
    #: ``uuid`` (MIG-..., once created), ``parentUUID`` and ``profile`` (1g.10gb); the PCI bus id is Kubernetes'
    #: standard ``resource.kubernetes.io/pciBusID`` since v25.12 (commit dcdeb68), an unqualified ``pcieBusID``
    #: before
    pci_vendor: ClassVar[int | None] = PCI_VENDOR
    kubernetes: ClassVar[KubernetesNames] = KubernetesNames(
        resources=(DevicePluginResource(r"nvidia\.com/gpu(?:\.[A-Za-z0-9][-A-Za-z0-9_]*)*"),
                   DevicePluginResource(r"nvidia\.com/mig-[A-Za-z0-9][-A-Za-z0-9_.]*", slices=True)),
        index_prefix="nvidia", dra_drivers=("gpu.nvidia.com",),
        dra_attributes=DraAttributes(uuid=("uuid",), pci=("resource.kubernetes.io/pciBusID", "pcieBusID"),
                                     parent_uuid=("parentUUID",), profile=("profile",)))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._nv: Any = None  # the pynvml module (its public API; internals: self.binding)
        #: pynvml and its internals, guarded (nvml_private.py); made by the first init()
        self.binding: Binding
        self._gpus: list[_Gpu] = []
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._initialised = False
        self._peers: list[PeerReading] | None = None
        self._xid = XidWatcher(self)
        self._gpm = GpmReader(self)  # SM/tensor/DRAM/NVLink/PCIe activity (nvml_gpm.py)
        self._processes = ProcessReader(self)  # compute processes, MPS clients, per-process use (nvml_processes.py)
        self._down: dict[int, str] = {}  # GPU index -> reason, while it is unreadable (one log line per outage)
        self._system_dev = Device(-1)  # probe state of system-level calls
        #: .direct: the calling thread's direct calls and their C out values (NvmlBackend._direct)
        self._threads = threading.local()

    # --- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        if self._nv is None:
            try:
                self.binding = Binding.load()
            except ImportError as exc:  # pragma: no cover - a declared dependency
                raise BackendUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
            self._nv = self.binding.nv
        binding, pynvml = self.binding, self._nv
        try:
            self._init_nvml(binding)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == LIBRARY_NOT_FOUND:
                raise BackendUnavailable(
                    "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine, or the container runs "
                    "without the NVIDIA runtime (runtimeClassName: nvidia)"
                ) from None
            if code == DRIVER_NOT_LOADED:
                raise BackendError("nvmlInit: NVIDIA driver not loaded", kind=DRIVER) from None
            raise BackendError(f"nvmlInit failed: {self._err(exc)}", kind=DRIVER) from None
        except Exception as exc:  # noqa: BLE001 - a broken library must not crash the exporter
            raise BackendError(f"nvmlInit failed: {type(exc).__name__}: {exc}", kind=DRIVER) from None
        self._initialised = True
        self._gpus = []
        self._system_dev = Device(-1)
        self._driver_version = self._system("driver_version", ((
            "nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion),), convert=str)
        cuda = self._system("cuda_driver_version", (
            ("nvmlSystemGetCudaDriverVersion_v2", lambda: pynvml.nvmlSystemGetCudaDriverVersion_v2()),
            ("nvmlSystemGetCudaDriverVersion", lambda: pynvml.nvmlSystemGetCudaDriverVersion()),
        ), convert=int)
        self._cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
        self._enumerate()
        if self._gpus and self.any_enabled("gpu_xid_errors_total", "gpu_xid_last_timestamp_seconds"):
            self._xid.start(self._gpus)

    @staticmethod
    def _init_nvml(binding: Binding) -> None:
        """``nvmlInit()`` (nvmlInitWithFlags), or ``nvmlInit_v2`` on drivers older than flags (probed once)."""
        try:
            binding.nv.nvmlInit()
        except binding.error as exc:
            if getattr(exc, "value", None) != FUNCTION_NOT_FOUND:
                raise
            binding.init_v2()

    def reset(self) -> None:
        self._shutdown_nvml()

    def abandoned(self, dev: Device) -> None:
        """A call was left running on ``dev``'s lane: GPM forgets the GPU's samples (the late call may still
        fill one). The direct calls' out values the late call may still write are the stuck thread's own
        (:meth:`_direct`), and no call goes to the GPU before the late one returns, so nothing else needs
        renewing."""
        self._gpm.abandon(dev.index)

    def shutdown(self) -> None:
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        self._xid.stop()  # before nvmlShutdown: the watcher holds an event set
        self._gpm.close()  # GPM samples belong to this initialisation
        if self._initialised and self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a broken driver is allowed to fail
                pass
        self._initialised = False
        self._gpus = []
        self._peers = None

    def _enumerate(self) -> None:
        nv = self._nv
        count = self._system("device_count", (("nvmlDeviceGetCount_v2", nv.nvmlDeviceGetCount),
                                               ("nvmlDeviceGetCount", self.binding.count_v1)), convert=int)
        if count is None or not 0 <= count <= 4096:
            raise BackendError("nvmlDeviceGetCount failed", kind=DRIVER)
        if len(self._gpus) != count:
            self._gpus = [_Gpu(i) for i in range(count)]

    # --- what NVML's statuses mean ---------------------------------------------------------------

    def _err(self, exc: BaseException) -> str:
        code = getattr(exc, "value", None)
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - nvmlErrorString itself may be missing
            text = "NVML error"
        return f"{text} (code {code})"

    def classify(self, exc: BaseException) -> Verdict:
        nv = self._nv
        if nv is not None and isinstance(exc, nv.NVMLError):
            code = getattr(exc, "value", None)
            if code in _ABSENT_CODES:
                return Verdict(Outcome.UNSUPPORTED, UNSUPPORTED, self._err(exc))
            if code in _DRIVER_CODES:
                return Verdict(Outcome.DRIVER, DRIVER, self._err(exc))
            if code == GPU_IS_LOST:
                return Verdict(Outcome.DOWN, GPU_LOST, "GPU is lost")
            if code == UNKNOWN:
                return Verdict(Outcome.SUSPECT, GPU_ERROR, self._err(exc))
            if code in _DOWN_CODES:
                return Verdict(Outcome.DOWN, GPU_ERROR, self._err(exc))
            return Verdict(Outcome.ERROR, READING_ERROR, self._err(exc))
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        if mismatch is not None and isinstance(exc, mismatch):  # an unversioned call the library cannot serve
            return Verdict(Outcome.UNSUPPORTED, UNSUPPORTED, f"{type(exc).__name__}: {exc}"[:200])
        return super().classify(exc)

    def identity_fault(self, dev: Device, where: str) -> Verdict | None:
        """The GPU's UUID and PCI info, read again (cheap: no hardware query), except the one that
        just failed: None when both answer (or cannot be asked), else what the failure means."""
        nv = self._nv
        h = getattr(dev, "handle", None)
        if h is None and not isinstance(dev, _Gpu) and 0 <= dev.index < len(self._gpus):
            h = self._gpus[dev.index].handle  # a MIG instance: its GPU's identity decides
        if h is None or nv is None:  # no handle yet (or a system call): nothing of the GPU to ask
            return Verdict(Outcome.DOWN, GPU_ERROR, "no GPU handle to check the identity with")
        for name in ("nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"):
            if name == where:
                continue
            try:
                getattr(nv, name)(h)
            except Exception as exc:  # noqa: BLE001 - classified: unsupported is no verdict on the GPU
                v = self.classify(exc)
                if v.outcome is not Outcome.UNSUPPORTED:
                    return Verdict(v.outcome, v.kind, f"{name}: {v.detail}")
        return None

    def _system(self, reading: str, candidates: tuple[tuple[str, Callable[..., Any]], ...],
                convert: Callable[[Any], Any]) -> Any:
        """A system-level call (versions newest first, probed once): None when unsupported or failing.
        A driver error, or a device fault from a call that concerns no device, fails the collection."""
        try:
            v = self.probe(self._system_dev, reading, candidates, convert=convert)
        except GpuDown as exc:
            raise BackendError(f"nvml: {candidates[0][0]} failed: {exc}", kind=DRIVER) from None
        return None if v is MISSING else v

    # --- collection ----------------------------------------------------------------------------

    def collect(self, out: Collection) -> None:
        if not self._initialised:
            self.init()
        # no lock: the engine runs one collection of a backend at a time; an attempt it left to a GPU that
        # stopped answering (Backend.on_gpus) ends that GPU's read and stops, touching nothing shared
        self._enumerate()
        # each GPU inside its lane's job, on this thread; a GPU that stops answering costs itself only
        for gpu, reading, down in self.on_gpus(self._gpus, self._read_one):
            if down is not None:
                gpu.handle = None  # fetch the handle again next time: the GPU may come back
                # identity as last seen, so gpu_info keeps one series for the GPU while it is down
                reading = GpuReading(index=gpu.index, uuid=gpu.uuid, vendor="nvidia", name=gpu.static.get("name"),
                                     pci_bus_id=gpu.static.get("pci_bus_id"), serial=gpu.static.get("serial"),
                                     firmware_version=gpu.static.get("vbios_version"),
                                     driver_version=self._driver_version,
                                     cuda_driver_version=self._cuda_version).down(str(down), down.kind)
                if not reading.uuid or not reading.pci_bus_id:
                    self._identity_from_sysfs(reading)
                out.count_error(down.kind)  # this collection's: an attempt started again counts its GPUs once
                if gpu.index not in self._down:
                    log.warning("nvml: GPU %d unreadable: %s", gpu.index, down)
                self._down[gpu.index] = str(down)
            elif self._down.pop(gpu.index, None) is not None:
                log.info("nvml: GPU %d readable again", gpu.index)
            out.gpus.append(reading)
        self._gpm.end()  # a GPU not sampled now starts over: no rate across an outage
        if len(self._gpus) > 1 and self.any_enabled("gpu_p2p_supported", "gpu_topology_level"):
            self._read_topology(out)
        unwatched = self._xid.trouble()
        if unwatched is None:
            out.xid_counts, out.xid_last_seconds = self._xid.snapshot()
        else:  # the counts could be missing events: absent, as any reading that fails (one failure, one reading)
            self.count_error(READING_ERROR)
            self.log_once(f"xid:unwatched:{unwatched}", "nvml: XID events not watched (%s): gpu_xid_errors_total "
                          "and gpu_xid_last_timestamp_seconds are absent until they are", unwatched,
                          level=logging.WARNING)

    def _identity_from_sysfs(self, r: GpuReading) -> None:
        """A GPU lost before its first read: its bus ID from sysfs (NVML numbers GPUs in PCI bus
        order, so index i is the i-th NVIDIA GPU on the bus when the counts agree) and its UUID
        from the driver's procfs, so that its series carry real labels."""
        buses = pci_gpus(self.options.sysfs_root, PCI_VENDOR)
        if buses is None or len(buses) != len(self._gpus) or not 0 <= r.index < len(buses):
            return
        r.pci_bus_id = r.pci_bus_id or buses[r.index]
        r.uuid = r.uuid or proc_uuid(self.options.sysfs_root, buses[r.index]) or ""

    def _read_one(self, gpu: _Gpu) -> GpuReading:
        """One GPU's readings, on its lane."""
        gpu.begin()  # here, inside its lane's job: never while a forsaken attempt still reads it
        reading = GpuReading(index=gpu.index, uuid=gpu.uuid, vendor="nvidia", driver_version=self._driver_version,
                             cuda_driver_version=self._cuda_version)
        self._read_gpu(gpu, reading)
        return reading

    def _read_gpu(self, gpu: _Gpu, r: GpuReading) -> None:
        nv = self._nv
        if gpu.handle is None:
            h = self.probe(gpu, "handle", (("nvmlDeviceGetHandleByIndex_v2", nv.nvmlDeviceGetHandleByIndex),
                                           ("nvmlDeviceGetHandleByIndex", self.binding.handle_v1)), gpu.index)
            if h is MISSING:
                raise GpuDown("nvmlDeviceGetHandleByIndex failed", GPU_ERROR)
            gpu.handle = h
            gpu.static = {}
        h = gpu.handle
        d = self._direct()
        if not gpu.static:
            self._read_static(gpu, h)
        st = gpu.static
        r.uuid = gpu.uuid
        r.name, r.pci_bus_id, r.serial = st.get("name"), st.get("pci_bus_id"), st.get("serial")
        r.firmware_version = st.get("vbios_version")
        call = self.call
        en = self.enabled

        if self.any_enabled("gpu_utilization_ratio", "gpu_memory_utilization_ratio"):
            u = call(gpu, "gpu_utilization_ratio", d.utilization, h, convert=_utilization)
            if u is not MISSING:
                r.utilization_ratio, r.memory_utilization_ratio = u

        if self.any_enabled(*MEMORY_FAMILIES):
            self._read_memory(gpu, r, h)

        for reading, get, attr, key in d.simple:
            v = call(gpu, reading, get, h)
            if v is not MISSING:
                if key is None:
                    setattr(r, attr, v)
                else:
                    getattr(r, attr)[key] = v
        if en("gpu_temperature_celsius"):
            mt = self._field_value(gpu, h, "gpu_temperature_celsius:memory", NVML_FI_DEV_MEMORY_TEMP)
            if mt is not None and mt > 0:  # 0 means "no HBM sensor" on boards without one
                r.temperature_celsius["memory"] = mt
        r.clock_max_hertz = dict(st.get("clock_max_hertz", {}))

        r.pcie_link_generation_max = st.get("pcie_link_generation_max")
        r.pcie_link_width_max = st.get("pcie_link_width_max")

        if en("gpu_performance_state"):
            ps = call(gpu, "gpu_performance_state", d.pstate, h)
            if ps is not MISSING and 0 <= ps < PSTATE_UNKNOWN:
                r.performance_state = float(ps)

        self._read_depth(gpu, r, h)
        self._read_fabric_and_recovery(gpu, r, h)
        r.unsupported = {f.partition(":")[0] for f in gpu.unsupported if f != "handle" and f.startswith("gpu_")}

    def _direct(self) -> _Direct:
        """The direct calls of the calling thread, made at its first read with this binding: a thread reads
        one GPU at a time (a GPU's read is one job of its lane, run by one thread), so out values per thread
        never mix two GPUs' values, even when GPUs are read side by side, and a thread stuck in a hung call
        keeps its own. Per thread, not per GPU: a relay worker reads every GPU with one set (per GPU they
        were about 1.5 MiB at 64 GPUs)."""
        t = self._threads
        d: _Direct | None = getattr(t, "direct", None)
        if d is None or t.binding is not self.binding:
            d = t.direct = self._build_direct(self.binding)
            t.binding = self.binding
        return d

    def _build_direct(self, b: Binding) -> _Direct:
        """The direct calls (nvml_private.py), for the enabled families (the field selection is fixed
        at start). Nothing is looked up here: a function or internal that is missing fails its reading
        when asked, never the initialisation."""
        d, u32 = b.direct, U32
        return _Direct(
            simple=[(r.reading(family), d(r.symbol, r.out, r.args, r.member, r.factor, r.trailing),
                     schema.family(family).attr, r.key)
                    for family, reads in SIMPLE.items() if self.enabled(family) for r in reads],
            # nvmlDeviceGetTotalEccErrors(device, errorType, counterType): 1 uncorrected / 0 corrected,
            # 0 volatile / 1 aggregate (nvidia-smi ecc.errors.*), a count
            ecc=[(f"gpu_ecc_errors_total:{ename}_{cname}", d("nvmlDeviceGetTotalEccErrors", _U64, (etype, ctype)),
                  (ename, cname))
                 for etype, ename in ((1, "uncorrected"), (0, "corrected"))
                 for ctype, cname in ((0, "volatile"), (1, "aggregate"))],
            # nvmlDeviceGetViolationStatus(device, policy): time throttled by each policy, ns -> s
            violation=[(f"gpu_violation_seconds_total:{pname}",
                        d("nvmlDeviceGetViolationStatus", ViolationTime, (policy,), "violationTime", 1e-9), pname)
                       for policy, pname in VIOLATION_POLICIES],
            utilization=b.direct_outs("nvmlDeviceGetUtilizationRates", [Utilization()]),
            memory_v2=b.direct_outs("nvmlDeviceGetMemoryInfo_v2", [MemoryV2()], version=NVML_MEMORY_V2),
            memory_v1=b.direct_outs("nvmlDeviceGetMemoryInfo", [MemoryV1()]),
            remapped=b.direct_outs("nvmlDeviceGetRemappedRows", [u32(), u32(), u32(), u32()]),
            retired=((b.retired_count(0), "gpu_retired_pages:single_bit", "single_bit"),
                     (b.retired_count(1), "gpu_retired_pages:double_bit", "double_bit")),
            pstate=d("nvmlDeviceGetPerformanceState", _U32),  # P0-P15; 32 is "unknown"
        )

    def _read_static(self, gpu: _Gpu, h: Any) -> None:
        """Identity and limits that do not change while the driver is loaded."""
        nv = self._nv
        call = self.call
        st: dict[str, Any] = {}
        uuid = call(gpu, "uuid", nv.nvmlDeviceGetUUID, h, convert=str)
        gpu.uuid = uuid if uuid is not MISSING else gpu.uuid
        name = call(gpu, "name", nv.nvmlDeviceGetName, h, convert=str)
        st["name"] = name if name is not MISSING else None
        pci = call(gpu, "pci_bus_id", nv.nvmlDeviceGetPciInfo, h,
                   convert=lambda p: canonical_bus_id(p.busId.decode() if isinstance(p.busId, bytes) else str(p.busId)))
        st["pci_bus_id"] = pci if pci is not MISSING else None
        serial = call(gpu, "serial", nv.nvmlDeviceGetSerial, h, convert=str)
        st["serial"] = serial if serial is not MISSING else None
        if self.enabled("gpu_info"):
            vbios = call(gpu, "vbios_version", nv.nvmlDeviceGetVbiosVersion, h, convert=str)
            st["vbios_version"] = vbios if vbios is not MISSING and vbios else None
        maxc: dict[str, float] = {}
        if self.enabled("gpu_clock_max_hertz"):
            for cname, ctype in CLOCKS:
                c = call(gpu, f"gpu_clock_max_hertz:{cname}", nv.nvmlDeviceGetMaxClockInfo, h, ctype,
                         convert=_number(1e6))
                if c is not MISSING and c > 0:
                    maxc[cname] = c
        st["clock_max_hertz"] = maxc
        if self.enabled("gpu_pcie_link_generation_max"):
            g = call(gpu, "gpu_pcie_link_generation_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h, convert=si)
            st["pcie_link_generation_max"] = g if g is not MISSING else None
        if self.enabled("gpu_pcie_link_width_max"):
            w = call(gpu, "gpu_pcie_link_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h, convert=si)
            st["pcie_link_width_max"] = w if w is not MISSING else None
        if self.any_enabled("gpu_link_up", "gpu_link_errors_total"):
            n = self._field_value(gpu, h, "gpu_link_up:count", NVML_FI_DEV_NVLINK_LINK_COUNT)
            links = st["nvlinks"] = tuple(range(int(n))) if n and 0 < n <= 64 else ()
            if links:  # each per-link call's arguments, slot and label pair are the same every collection
                st["link_state_plan"] = self.binding.per_link("nvmlDeviceGetNvLinkState", U32,
                                                              [(link,) for link in links], links)
                pairs = [(link, c, n) for link in links for n, c in NVLINK_ERROR_COUNTERS]
                st["link_error_plan"] = self.binding.per_link("nvmlDeviceGetNvLinkErrorCounter", U64,
                                                              [(link, c) for link, c, _ in pairs],
                                                              [(n, str(link)) for link, _, n in pairs])
        gpu.static = st

    def _read_memory(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Memory info ``_v2`` (has ``reserved``; ``used`` excludes it), else v1: probed once per GPU."""
        d = self._direct()
        m = self.probe(gpu, "gpu_memory_used_bytes", (("nvmlDeviceGetMemoryInfo_v2", d.memory_v2),
                                                      ("nvmlDeviceGetMemoryInfo", d.memory_v1)),
                       h, convert=_memory)
        if m is not MISSING:
            r.memory_total_bytes, r.memory_used_bytes, r.memory_free_bytes, r.memory_reserved_bytes = m

    def _field_value(self, gpu: _Gpu, h: Any, reading: str, field_id: int) -> float | None:
        """One ``nvmlDeviceGetFieldValues`` entry; each entry carries its own return code."""
        nv = self._nv

        def convert(vals: Any) -> float:
            v = vals[0]
            if v.nvmlReturn != 0:
                raise nv.NVMLError(v.nvmlReturn)
            return _field_number(v)

        v = self.call(gpu, reading, nv.nvmlDeviceGetFieldValues, h, [field_id], convert=convert)
        return None if v is MISSING else v

    def _read_depth(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Health readings: ECC, row remapping, throttling, NVLink, codecs, processes, MIG."""
        nv = self._nv
        d = self._direct()
        call = self.call
        en = self.enabled
        if self.any_enabled("gpu_ecc_mode_enabled", "gpu_ecc_errors_total"):
            mode = call(gpu, "gpu_ecc_mode_enabled", nv.nvmlDeviceGetEccMode, h, convert=lambda m: _flag(m[0]))
            if mode is not MISSING:
                r.ecc_mode_enabled = mode
            if en("gpu_ecc_errors_total") and (mode is MISSING or mode):
                for reading, get, key in d.ecc:
                    v = call(gpu, reading, get, h)
                    if v is not MISSING:
                        r.ecc_errors[key] = v
        if en("gpu_retired_pages"):
            for get, reading, cname in d.retired:
                pages = call(gpu, reading, get, h)
                if pages is not MISSING:
                    r.retired_pages[cname] = pages
        if en("gpu_retired_pages_pending"):
            pend = call(gpu, "gpu_retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h,
                        convert=_flag)
            if pend is not MISSING:
                r.retired_pages_pending = pend
        if self.any_enabled("gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed"):
            rows = call(gpu, "gpu_remapped_rows", d.remapped, h, convert=_remapped)
            if rows is not MISSING:
                corr, unc, pending, failed = rows
                r.remapped_rows = {"corrected": corr, "uncorrected": unc}
                r.remapped_rows_pending = pending
                r.remapped_rows_failed = failed
        if en("gpu_throttle_reason_active"):
            self._read_throttle(gpu, r, h)
        if en("gpu_violation_seconds_total"):
            for reading, get, pname in d.violation:
                v = call(gpu, reading, get, h)
                if v is not MISSING:
                    r.violation_seconds[pname] = v
        gpm = self._gpm.wanted() and self._gpm.supported(gpu, h, gpu.static)
        if self.options.pcie_throughput and en("gpu_pcie_throughput_bytes_per_second") and not gpm:
            for counter, dname in ((0, "tx"), (1, "rx")):
                v = call(gpu, f"gpu_pcie_throughput_bytes_per_second:{dname}", nv.nvmlDeviceGetPcieThroughput,
                         h, counter, convert=_number(1024.0))  # NVML reports KB/s
                if v is not MISSING:
                    r.pcie_throughput[dname] = v
        links = gpu.static.get("nvlinks", ())
        if en("gpu_link_up") and links:
            state = call(gpu, "gpu_link_up", self._per_link, gpu.static["link_state_plan"], h)
            if state is not MISSING:
                r.link_up = {link: 1.0 if v else 0.0 for link, v in state.items()}
        if en("gpu_link_errors_total") and links:
            # per link (a device-wide total may cover link 0 only on some drivers): 4 counters x 18 links
            errs = call(gpu, "gpu_link_errors_total", self._per_link, gpu.static["link_error_plan"], h)
            if errs is not MISSING:
                r.link_errors = errs
        self._processes.read(gpu, gpu.static, r, h)
        if self.any_enabled("gpu_mig_mode_enabled", "gpu_mig_memory_total_bytes", "gpu_mig_memory_used_bytes",
                            "gpu_mig_utilization_ratio"):
            self._read_mig(gpu, r, h)
        if gpm:  # PCIe throughput from GPM too: cheap, so not behind --pcie-throughput
            mig = r.mig_mode_enabled == 1.0
            self._gpm.read(gpu, h, r, [m.gpu_instance_id for m in r.mig if m.gpu_instance_id >= 0] if mig else [])

    def _per_link(self, plan: PerLink[_K], h: Any) -> dict[_K, float]:
        """``plan``'s NVML function for each of its argument tuples, as one reading of the funnel:
        the value of each call that answered, under its key.

        The C function is called directly: pynvml's wrapper costs a few microseconds a call and an
        18-link GPU needs 72 error counters. A link that answers an error or a sentinel is absent;
        a driver or device fault, or no link answering at all, is raised for the funnel to judge.
        """
        nv = self._nv
        rets, values = plan.call(h, self.each_call)  # each link's call its own deadline
        # unsigned C integers: si()'s checks reduce to the sentinels
        out = {key: float(v) for key, v, ret in zip(plan.keys, values, rets, strict=True)
               if ret == 0 and v not in SENTINELS}
        if len(out) < len(rets):
            failed = [ret for ret in rets if ret != 0]
            # UNKNOWN on one link is that link's: only all links failing goes to the funnel (suspect)
            fatal = next((ret for ret in failed if ret in _DRIVER_CODES or ret in _DOWN_CODES or ret == GPU_IS_LOST),
                         None)
            if fatal is not None:
                raise nv.NVMLError(fatal)
            if not out and failed:
                raise nv.NVMLError(failed[0])
        return out

    def _read_throttle(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """Clock event (throttle) reasons, decoded into one 0/1 value per supported reason.

        ``ClocksEventReasons`` (R535+) replaced ``ClocksThrottleReasons``: probed once per GPU.
        """
        nv = self._nv
        mask = self.probe(gpu, "gpu_throttle_reason_active", (
            ("nvmlDeviceGetCurrentClocksEventReasons", lambda x: nv.nvmlDeviceGetCurrentClocksEventReasons(x)),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", lambda x: nv.nvmlDeviceGetCurrentClocksThrottleReasons(x)),
        ), h, convert=_mask)
        if mask is MISSING:
            return
        supported = gpu.static.get("throttle_supported")
        if supported is None:
            supported = self.probe(gpu, "gpu_throttle_reason_active:supported", (
                ("nvmlDeviceGetSupportedClocksEventReasons",
                 lambda x: nv.nvmlDeviceGetSupportedClocksEventReasons(x)),
                ("nvmlDeviceGetSupportedClocksThrottleReasons",
                 lambda x: nv.nvmlDeviceGetSupportedClocksThrottleReasons(x)),
            ), h, convert=_mask)
            if supported is MISSING:
                supported = ~0  # unknown: report every named reason
            gpu.static["throttle_supported"] = supported
        for bit, name in THROTTLE_REASONS:
            if supported & bit:
                r.throttle_reasons[name] = 1.0 if mask & bit else 0.0

    def _read_mig(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """MIG mode and, per MIG instance, its memory (utilisation is not reported by NVML)."""
        nv = self._nv
        mode = self.call(gpu, "gpu_mig_mode_enabled", nv.nvmlDeviceGetMigMode, h, convert=lambda m: _flag(m[0]))
        if mode is MISSING:
            return
        r.mig_mode_enabled = mode
        if mode != 1.0 or not self.any_enabled("gpu_mig_memory_total_bytes", "gpu_mig_memory_used_bytes",
                                             "gpu_mig_utilization_ratio"):
            return
        slots = self.call(gpu, "gpu_mig_memory_total_bytes:slots", nv.nvmlDeviceGetMaxMigDeviceCount, h, convert=int)
        if slots is MISSING:
            return

        def slot_handle(parent: Any, slot: int) -> Any:
            try:
                return nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) in (NOT_FOUND, INVALID_ARGUMENT):
                    return None  # an empty slot
                raise

        for slot in range(min(slots, 64)):
            mh = self.call(gpu, f"gpu_mig_memory_total_bytes:slot{slot}", slot_handle, h, slot)
            if mh is MISSING or mh is None:
                continue
            dev = gpu.mig_devs.setdefault(slot, Device(gpu.index))
            r.mig.append(self._read_mig_device(dev, mh))

    def _read_mig_device(self, dev: Device, mh: Any) -> MigReading:
        """One MIG instance. Memory ``_v2`` where the driver has it (``used`` without the reserved
        part, as for whole GPUs), probed per instance; v1 otherwise."""
        nv = self._nv

        def get(reading: str, fn: Callable[..., Any], convert: Callable[[Any], Any] | None = None) -> Any:
            v = self.call(dev, f"mig:{reading}", fn, mh, convert=convert)
            return None if v is MISSING else v

        gi = get("gpu_instance", nv.nvmlDeviceGetGpuInstanceId, int)
        ci = get("compute_instance", nv.nvmlDeviceGetComputeInstanceId, int)
        name = get("name", nv.nvmlDeviceGetName, str) or ""
        m = MigReading(gpu_instance_id=gi if gi is not None else -1, compute_instance_id=ci,
                       uuid=get("uuid", nv.nvmlDeviceGetUUID, str),
                       profile=name.rsplit("MIG ", 1)[1].strip() if "MIG " in name else None)
        mem = self.probe(dev, "mig:memory", (
            ("nvmlDeviceGetMemoryInfo_v2", lambda x: nv.nvmlDeviceGetMemoryInfo(x, version=nv.nvmlMemory_v2)),
            ("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo),
        ), mh, convert=lambda v: (si(v.total), si(v.used)))
        if mem is not MISSING:
            m.memory_total_bytes, m.memory_used_bytes = mem
        util = get("utilization", nv.nvmlDeviceGetUtilizationRates, lambda u: si(u.gpu, 0.01))
        if util is not None:
            m.utilization_ratio = util
        return m

    def _read_topology(self, out: Collection) -> None:
        """P2P capabilities and topology level between every pair of GPUs (static: read once)."""
        nv = self._nv
        if self._peers is None:
            peers: list[PeerReading] = []
            gpus = [g for g in self._gpus if g.handle is not None]
            if len(gpus) != len(self._gpus):
                return  # a GPU is down: try again next time rather than publish or cache a partial matrix
            want_p2p = self.enabled("gpu_p2p_supported")
            want_topo = self.enabled("gpu_topology_level")

            def row(ga: _Gpu) -> list[PeerReading]:  # one GPU's pairs, on its lane
                pairs: list[PeerReading] = []
                for gb in gpus:
                    if ga is gb:
                        continue
                    p = PeerReading(gpu=ga.index, peer=gb.index)
                    for idx, cap in P2P_CAPS if want_p2p else ():
                        status = self.call(ga, f"gpu_p2p_supported:{cap}", nv.nvmlDeviceGetP2PStatus,
                                           ga.handle, gb.handle, idx, convert=int)
                        if status is not MISSING:
                            p.p2p[cap] = 1.0 if status == 0 else 0.0
                    if want_topo:
                        level = self.call(ga, "gpu_topology_level", nv.nvmlDeviceGetTopologyCommonAncestor,
                                          ga.handle, gb.handle, convert=int)
                        if level is not MISSING:
                            p.topology_level = TOPOLOGY_NAMES.get(level, str(level))
                            p.topology_level_value = float(level)
                    if p.p2p or p.topology_level is not None:
                        pairs.append(p)
                return pairs

            for _, pairs, down in self.on_gpus(gpus, row):  # read as the GPUs are (a relay, not a thread each)
                if down is not None:
                    log.info("nvml: topology not read this time: %s", down)
                    return
                peers.extend(pairs)
            self._peers = peers
        out.peers = self._peers  # the same static list object: the renderer caches its text

    # --- issue 28: the NVLink fabric state and the driver's recovery action -------------------------

    def _read_fabric_and_recovery(self, gpu: _Gpu, r: GpuReading, h: Any) -> None:
        """``nvmlDeviceGetGpuFabricInfo`` (R525+; older drivers lack the symbol: absent) and field
        ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (drivers that do not know it answer the field with
        an error of its own: absent)."""
        if self.enabled("gpu_fabric_state"):
            v = self.call(gpu, "gpu_fabric_state", self._fabric_state, h)
            if v is not MISSING:
                r.fabric_state = v
        if self.enabled("gpu_recovery_action"):
            v = self._field_value(gpu, h, "gpu_recovery_action", NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
            if v is not None:
                r.recovery_action = v

    def _fabric_state(self, h: Any) -> float:
        """The fabric state 1-3; state 0 (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no fabric) is
        NOT_SUPPORTED, so the funnel leaves the family absent and stops asking."""
        state = self.binding.fabric_state(h)
        if state == 0:
            raise self._nv.NVMLError(NOT_SUPPORTED)
        if state == 0xFF:  # the one-byte field's "no value" (0xFFFFFFFF truncated): absent, counted
            raise NoValue("no value (sentinel 0xff)")
        if state > 3:  # a state this enum does not have: a value we cannot use
            raise ValueError(f"fabric state {state} outside 0-3")
        return float(state)


NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230


def _field_number(v: Any) -> float:
    """Decode an ``nvmlFieldValue_t`` union by its ``valueType`` (sentinels are "no value")."""
    u = v.value
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(v.valueType)
    if member is None or not hasattr(u, member):
        raise ValueError(f"unknown NVML field value type {v.valueType}")
    return si(getattr(u, member))


BACKEND = NvmlBackend
