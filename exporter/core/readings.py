"""Vendor-neutral readings: what every backend returns, in SI base units.

A backend fills one :class:`GpuReading` per GPU. Every field is optional: ``None``
(or an empty dict) means "we could not take this reading", and the exporter then
emits no series for it. Nothing here is ever a placeholder 0.

Units are fixed by the field name: ``*_bytes``, ``*_watts``, ``*_joules``,
``*_hertz``, ``*_celsius``, ``*_ratio`` (0-1), ``*_seconds``.

A family is one row: the value attribute (``attr``) of every per-GPU and MIG row of
:mod:`exporter.core.schema` is an attribute here, whether or not it is declared below
(:func:`_from_rows` adds the undeclared ones: ``None``, or an empty dict for a per-GPU row with
labels). Declaring one here only gives it a precise type for mypy and a comment; an undeclared one
is ``Any`` to mypy, and a name that is neither declared nor a row's ``attr`` fails on use
(``AttributeError``: the classes have slots), so a typo is not a silent new attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from exporter.core.schema import FAMILIES, TOPOLOGY_LEVELS

_C = TypeVar("_C", bound=type)


def _from_rows(scope: str) -> Callable[[_C], _C]:
    """Adds to the class (before ``@dataclass`` makes its fields) every ``attr`` of the schema rows of
    ``scope`` that it does not declare: default ``None`` for a scalar, an empty dict for a per-GPU row
    with labels (one sample per key; a tuple key for several labels). A declared attribute of a
    labelled per-GPU row that is neither a dict nor a set raises TypeError: the renderer would read it
    as one."""

    def add(cls: _C) -> _C:
        notes: dict[str, Any] = cls.__dict__["__annotations__"]  # noqa: RUF063 - this class's own, not its bases'
        for row in FAMILIES:
            if row.scope != scope or not row.attr:
                continue
            keyed = scope == "gpu" and bool(row.labels)  # a MIG row's labels are the instance's identity
            if row.attr in notes:
                if keyed and not str(notes[row.attr]).startswith(("dict[", "set[")):
                    raise TypeError(f"{cls.__name__}.{row.attr}: {row.name} has labels, so its value is a "
                                    f"dict (one sample per key) or a set, not {notes[row.attr]}")
                continue
            if hasattr(cls, row.attr):  # a property computed from declared fields (health)
                continue
            notes[row.attr] = "dict[Any, float]" if keyed else "float | None"
            setattr(cls, row.attr, field(default_factory=dict) if keyed else None)
        return cls

    return add


#: a GPU's health states (exporter/core/gpu_health.py), OpenTelemetry hw.state's where they fit
HEALTH_STATES = ("ok", "degraded", "failed", "hung", "lost")


@dataclass(slots=True)
@_from_rows("mig")
class MigReading:
    """One MIG instance (NVIDIA) or compute partition (AMD) of a physical GPU; the ``mig`` rows'
    values besides the fields declared here (see the module's docstring)."""

    gpu_instance_id: int
    compute_instance_id: int | None = None
    uuid: str | None = None
    profile: str | None = None  # e.g. "1g.10gb" (nvidia-smi -L)
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    utilization_ratio: float | None = None

    if TYPE_CHECKING:  # as GpuReading's
        def __init__(self, gpu_instance_id: int, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...


@dataclass(slots=True)
@_from_rows("gpu")
class GpuReading:
    """One GPU at one moment. ``index`` and ``uuid`` identify it on every series; every per-GPU row's
    value is an attribute, declared here or added from its row (see the module's docstring)."""

    index: int
    uuid: str
    vendor: str = "unknown"  # "nvidia" | "amd" | "simulated-vendor" ...
    # ``up`` False: the device exists but cannot be read (lost, unknown error).
    # The exporter then emits gpu_up 0 and no other reading for it.
    up: bool = True
    up_reason: str | None = None
    down_kind: str | None = None  # why it is down: gpu_lost, gpu_hung, stalled, gpu_error, driver ...
    # one health state and its cause (exporter/core/gpu_health.py sets them): ok, degraded, failed, hung, lost
    health_state: str = "ok"
    health_cause: str = ""

    # identity (gpu_info labels)
    name: str | None = None
    pci_bus_id: str | None = None  # canonical "0000:3b:00.0", lower case
    serial: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # "12.4"; ROCm version on AMD
    firmware_version: str | None = None

    # utilisation, ratio 0-1 (nvidia-smi utilization.gpu / utilization.memory)
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None

    # framebuffer memory, bytes (nvidia-smi memory.total/used/free/reserved)
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None

    # sensor name -> celsius ("gpu"/"edge", "memory", "junction")
    temperature_celsius: dict[str, float] = field(default_factory=dict)

    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # monotonic since driver load

    # clock name -> hertz ("graphics", "sm", "memory", "video", "soc")
    clock_hertz: dict[str, float] = field(default_factory=dict)
    clock_max_hertz: dict[str, float] = field(default_factory=dict)

    pcie_link_generation: float | None = None
    pcie_link_generation_max: float | None = None
    pcie_link_width: float | None = None
    pcie_link_width_max: float | None = None
    pcie_replay_total: float | None = None
    pcie_throughput: dict[str, float] = field(default_factory=dict)  # "tx"/"rx" -> bytes per second

    # activity (NVIDIA GPM; AMD gpu_metrics), ratio 0-1, keyed by gpu_instance ("" = the whole GPU)
    graphics_engine_active_ratio: dict[str, float] = field(default_factory=dict)
    sm_active_ratio: dict[str, float] = field(default_factory=dict)
    sm_occupancy_ratio: dict[str, float] = field(default_factory=dict)
    dram_active_ratio: dict[str, float] = field(default_factory=dict)
    pipe_active_ratio: dict[tuple[str, str], float] = field(default_factory=dict)  # (pipe, gpu_instance)
    nvlink_throughput: dict[str, float] = field(default_factory=dict)  # "tx"/"rx" -> bytes per second
    # bytes moved since the driver loaded: (link_type "xgmi"|"pcie", direction "tx"|"rx"|"bidirectional")
    link_transferred_bytes: dict[tuple[str, str], float] = field(default_factory=dict)

    fan_speed_ratio: float | None = None
    performance_state: float | None = None  # P0 = 0 ... P15 = 15

    # ECC counters: (error_type "corrected"|"uncorrected", counter "volatile"|"aggregate") -> count
    ecc_errors: dict[tuple[str, str], float] = field(default_factory=dict)
    ecc_mode_enabled: float | None = None
    retired_pages: dict[str, float] = field(default_factory=dict)  # cause -> pages
    retired_pages_pending: float | None = None
    remapped_rows: dict[str, float] = field(default_factory=dict)  # "corrected"/"uncorrected" -> rows
    remapped_rows_pending: float | None = None
    remapped_rows_failed: float | None = None
    # RAS/ECC events the GPU shows now that no counter above carries (exporter/core/ras_events.tsv names them:
    # AMD's deferred errors, its per-block RAS states) -> where ("umc, gfx": the blocks; "" for the GPU):
    # an input of the health state, not a family of its own
    ras_events: dict[str, str] = field(default_factory=dict)

    # throttle / clock-event reasons: reason -> 0|1 ; violation seconds: reason -> seconds
    throttle_reasons: dict[str, float] = field(default_factory=dict)
    violation_seconds: dict[str, float] = field(default_factory=dict)

    # NVLink / XGMI: link -> 0|1 ; counter ("crc_flit", "crc_data", "replay", "recovery") -> count, all links
    link_up: dict[int, float] = field(default_factory=dict)
    link_errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (counter, link)

    # processes
    process_count: float | None = None
    process_memory_used_bytes: float | None = None
    # opt-in per-PID: pid -> bytes used
    process_memory_by_pid: dict[int, float] = field(default_factory=dict)
    # opt-in (--per-process), for the per-pod families: the compute processes' PIDs (None: not read)
    # and pid -> share of time the process ran kernels, 0-1 (None: the driver cannot say)
    process_pids: tuple[int, ...] | None = None
    process_utilization_by_pid: dict[int, float] | None = None

    # state nvidia_gpu_exporter's dashboards read (issue 28); NVML enums as numbers
    power_default_limit_watts: float | None = None  # nvidia-smi power.default_limit
    compute_mode: float | None = None  # nvmlComputeMode_t (nvidia-smi compute_mode)
    fabric_state: float | None = None  # nvmlGpuFabricState_t 1-3 (nvidia-smi fabric.state); absent: no fabric
    recovery_action: float | None = None  # nvmlDeviceGpuRecoveryAction_t (nvidia-smi gpu_recovery_action)

    # MIG / partitions
    mig_mode_enabled: float | None = None
    mig: list[MigReading] = field(default_factory=list)

    # fields this GPU reported as unsupported (names of metric families)
    unsupported: set[str] = field(default_factory=set)

    if TYPE_CHECKING:  # the rows' attributes _from_rows adds: Any to mypy (at run time, slots refuse others)
        # and as constructor arguments: mypy cannot see the fields added from the rows, so it checks only that
        # index and uuid are given (at run time the dataclass's own __init__ refuses an unknown name)
        def __init__(self, index: int, uuid: str, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

    def free_memory_bytes(self) -> float | None:
        """Free device memory in bytes: the driver's figure, else total - used (never below 0), else None.
        The one derivation, for every view (gpu-metrics JSON, /stats, the Python API)."""
        if self.memory_free_bytes is not None:
            return self.memory_free_bytes
        if self.memory_total_bytes is not None and self.memory_used_bytes is not None:
            return max(0.0, self.memory_total_bytes - self.memory_used_bytes)
        return None

    @property
    def health(self) -> dict[tuple[str, str], float]:
        """``gpu_health_state``'s samples: (state, cause) -> 1 for the GPU's state, 0 for the others."""
        return {(s, self.health_cause): 1.0 if s == self.health_state else 0.0 for s in HEALTH_STATES}

    def down(self, reason: str, kind: str | None = None) -> GpuReading:
        """This GPU's identity with ``up=False``, ``reason`` (``kind``: gpu_lost, gpu_hung, stalled ...) and no
        readings: what is published for a GPU that exists but cannot be read (gpu_up 0, gpu_info's one
        series, gpu_health_state)."""
        return GpuReading(index=self.index, uuid=self.uuid, vendor=self.vendor, up=False, up_reason=reason,
                          down_kind=kind,
                          name=self.name, pci_bus_id=self.pci_bus_id, serial=self.serial,
                          driver_version=self.driver_version, cuda_driver_version=self.cuda_driver_version,
                          firmware_version=self.firmware_version)


@dataclass
class PeerReading:
    """Topology between two GPUs of the same backend (nvidia-smi topo -m)."""

    gpu: int
    peer: int
    # "read" | "write" | "atomics" | "nvlink" | "xgmi" -> 0|1
    p2p: dict[str, float] = field(default_factory=dict)
    # NVML topology level name: "internal", "single", "multiple", "hostbridge", "node", "system"
    topology_level: str | None = None
    topology_level_value: float | None = None

    @property
    def levels(self) -> dict[str, float]:
        """The topology level as ``{name: value}``, empty when not read: the backend's value, else
        NVML's number for the name (-1 for a name it does not know)."""
        if self.topology_level is None:
            return {}
        value = self.topology_level_value
        if value is None:
            value = float(TOPOLOGY_LEVELS.get(self.topology_level, -1))
        return {self.topology_level: value}


@dataclass
class Collection:
    """What one backend returned in one collection cycle."""

    backend: str
    gpus: list[GpuReading] = field(default_factory=list)
    peers: list[PeerReading] = field(default_factory=list)
    # XID (NVIDIA) or RAS event counters: (gpu index, uuid, code) -> count; last event time per GPU
    xid_counts: dict[tuple[int, str, str], float] = field(default_factory=dict)
    xid_last_seconds: dict[tuple[int, str], float] = field(default_factory=dict)
    # PCI devices of this vendor seen on the bus (sysfs), for "fell off the bus"
    pci_devices: int | None = None
    # non-fatal errors by kind during this collection, e.g. {"gpu_lost": 1}
    errors: dict[str, int] = field(default_factory=dict)

    def count_error(self, kind: str, n: int = 1) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + n

    @property
    def visible_devices(self) -> int | None:
        """GPUs the vendor library sees, published beside ``pci_devices`` (None when the bus was not read)."""
        return None if self.pci_devices is None else len(self.gpus)


@dataclass
class HostInfo:
    """Host identity (gpu_host_info labels)."""

    node: str
    cpu_model: str
    kernel: str
    os: str = ""
