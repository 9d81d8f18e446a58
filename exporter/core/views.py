"""Views of a snapshot shared by the JSON API, the Python API and the single-machine tools: the
GPU field table that ``/stats``, gpu-metrics and ``GpuStatus`` are generated from, the average
power from the energy counter, GPU numbering, sizes and times.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime
from typing import Any

from exporter.core.readings import GpuReading
from exporter.core.snapshot import Snapshot

MIB = 2**20
GIB = 2**30


def iso_time(t: float) -> str:
    """Unix time -> ISO 8601 in UTC with milliseconds, e.g. ``2025-03-01T12:00:00.123Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- sizes (parsing: exporter.platform.units.parse_size) -------------------------------------


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 2**40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


# --- average power from the energy counter ----------------------------------------------------

GpuKey = tuple[str, str]  # (backend, uuid)


class PowerTracker:
    """Average power of each GPU between the last two collections it saw.

    ``nvidia-smi power.draw`` is one sample (and on many boards itself a 1 s average); the
    energy counter integrates every joule, so (E2 - E1) / (t2 - t1) is the true average over
    the interval. ``None`` until two readings exist, when the counter is unsupported, or after
    it went backwards (driver reload).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[GpuKey, tuple[float, float]] = {}
        self._avg: dict[GpuKey, tuple[float, float]] = {}
        self._seen: float | None = None

    def observe(self, snap: Snapshot) -> dict[GpuKey, tuple[float, float]]:
        """Feed a snapshot (repeats and older ones are ignored); return {key: (watts, seconds)}."""
        with self._lock:
            if self._seen is None or snap.created > self._seen:
                self._seen = snap.created
                for coll in snap.collections:
                    for g in coll.gpus:
                        self._update((coll.backend, g.uuid), g, snap.created)
            return dict(self._avg)

    def _update(self, key: GpuKey, g: GpuReading, now: float) -> None:
        energy = g.energy_joules if g.up else None
        if energy is None:
            self._last.pop(key, None)
            self._avg.pop(key, None)
            return
        prev = self._last.get(key)
        self._last[key] = (now, energy)
        if prev is None or now <= prev[0]:
            return
        if energy < prev[1]:
            self._avg.pop(key, None)  # counter restarted: no honest average for this interval
            return
        self._avg[key] = ((energy - prev[1]) / (now - prev[0]), now - prev[0])


# --- the field table: one GPU as the JSON views and the Python API show it ------------------------
#
# ``/stats`` (SI), ``/api/v1/monitoring/gpu-metrics`` (legacy units) and ``GpuStatus`` (Python API)
# are views of this one table: each row reads its value from a GPU's reading once, in SI units,
# and says under which key (and in which unit) each view shows it. The views, their JSON schemas
# (exporter.serve.api_schema) and the field list of docs/api.md are generated from the rows.


@dataclass(frozen=True)
class GpuSource:
    """What a field is read from: one GPU of a snapshot, and the values derived from it here, once."""

    backend: str
    number: int  # its index across backends: gpu-N in gpu-metrics, GpuStatus.index
    reading: GpuReading
    power: tuple[float, float] | None = None  # (average watts, over seconds) from PowerTracker

    @property
    def gpu_id(self) -> str:
        """``gpu-N``, N the index across backends (unique when two vendors share a machine)."""
        return f"gpu-{self.number}"

    @property
    def memory_used_ratio(self) -> float | None:
        """Memory used / total, 0-1 (clamped; 6 decimals); None without both or with no total."""
        return _ratio(self.reading.memory_used_bytes, self.reading.memory_total_bytes)

    @property
    def power_average_watts(self) -> float | None:
        return self.power[0] if self.power else None

    @property
    def power_average_seconds(self) -> float | None:
        return self.power[1] if self.power else None


# One step of a field's source path: ``name``, ``name()`` (a method) or ``name[key]`` (a dict's entry).
_STEP = re.compile(r"([A-Za-z_]\w*)(?:(\(\))|\[(\w+)\])?\Z")


def getter(path: str) -> Callable[[GpuSource], Any]:
    """``reading.temperature_celsius[gpu]`` -> a function of a :class:`GpuSource` returning that value
    (None as soon as a step is None or a key is missing). A path that is not one raises ValueError."""
    steps: list[tuple[str, bool, str | None]] = []
    for part in path.split("."):
        m = _STEP.match(part)
        if m is None:
            raise ValueError(f"field source {path!r}: {part!r} is not name, name() or name[key]")
        steps.append((m[1], bool(m[2]), m[3]))

    def get(src: GpuSource) -> Any:
        v: Any = src
        for name, call, key in steps:
            v = getattr(v, name)
            if call:
                v = v()
            elif key is not None:
                v = v.get(key)
            if v is None:
                return None
        return v

    return get


@dataclass(frozen=True)
class Legacy:
    """How gpu-metrics shows a field: ``key`` (``memory.total``: nested), value x ``times`` / ``per``,
    rounded to ``digits`` (None: a whole number)."""

    key: str
    doc: str = ""
    unit: str = ""  # the legacy unit, when not the field's: MiB, percent, MHz
    times: float = 1.0
    per: float = 1.0
    digits: int | None = 3
    minimum: float | None = 0
    maximum: float | None = None
    while_down: bool = False  # shown while the GPU is down, as identity is; else null then


@dataclass(frozen=True)
class Field:
    """One GPU field. ``name`` is its ``/stats`` key (unless ``stats`` says otherwise) and, with
    ``status``, its ``GpuStatus`` attribute; ``unit`` is the SI unit of ``source``'s value."""

    name: str
    unit: str  # bytes, ratio (0-1), celsius, watts, joules, seconds, hertz; "" for text, flags and numbers
    source: str  # where the value is, on a GpuSource: ``reading.power_watts``, ``reading.clock_hertz[memory]``
    kind: str = "number"  # JSON type: number (rounded to ``digits``), integer, string, boolean
    digits: int = 3
    doc: str = ""  # the /stats schema's description: unit and nvidia-smi equivalent
    minimum: float | None = 0
    maximum: float | None = None
    nullable: bool = True  # False: always known
    identity: bool = False  # who the GPU is: shown while it is down, when its readings are null
    stats: str | None = ""  # /stats key ("pcie.width": nested); "": ``name``; None: not in /stats
    legacy: Legacy | None = None  # None: not in gpu-metrics
    status: bool = False  # a GpuStatus attribute (None while the GPU is down)
    pattern: str | None = None  # a JSON-schema pattern of a string
    read: Callable[[GpuSource], Any] = dataclass_field(init=False, repr=False, compare=False)  # ``source``, compiled

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", getter(self.source))

    @property
    def stats_key(self) -> str | None:
        return self.name if self.stats == "" else self.stats

    def si(self, src: GpuSource) -> Any:
        """The value in the field's SI unit, as ``/stats`` shows it (numbers rounded; absent: None)."""
        v = self.read(src)
        if self.kind == "integer":
            return _int(v)
        if self.kind == "number":
            return _r(v, self.digits)
        return v

    def in_legacy(self, src: GpuSource) -> Any:
        """The value as gpu-metrics shows it: in its legacy unit, null while the GPU is down."""
        leg = self.legacy
        if leg is None or not (src.reading.up or leg.while_down or self.identity):
            return None
        v = self.read(src)
        if self.kind in ("string", "boolean") or v is None or not math.isfinite(v):
            return v if self.kind in ("string", "boolean") else None
        v = v * leg.times / leg.per
        return round(v) if leg.digits is None else round(v, leg.digits)

    def in_status(self, src: GpuSource) -> Any:
        """The value as ``GpuStatus`` holds it: SI, unrounded (whole bytes for integers), None while down."""
        if not (src.reading.up or self.identity):
            return None
        v = self.read(src)
        return _int(v) if self.kind == "integer" else v


def _r(v: float | None, digits: int = 3) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return round(float(v), digits)


def _int(v: float | None) -> int | None:
    """A count or a whole number of bytes as a JSON integer (85899345920, not 85899345920.0):
    typed decoders reject a float where the schema says integer."""
    if v is None or not math.isfinite(v):
        return None
    return round(v)


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return round(min(1.0, max(0.0, part / whole)), 6)


def _id(name: str, source: str, nullable: bool = True, kind: str = "string", **kw: Any) -> Field:
    """An identity field: known while the GPU is down."""
    return Field(name, "", source, kind=kind, nullable=nullable, identity=True, **kw)


_MIB_DOC = "MB = MiB (nvidia-smi memory.{} [MiB])"

FIELDS: tuple[Field, ...] = (
    _id("backend", "backend", nullable=False),
    _id("index", "reading.index", nullable=False, kind="integer"),
    _id("id", "gpu_id", nullable=False, stats=None, pattern="^gpu-[0-9]+$", legacy=Legacy("id")),
    _id("name", "reading.name", legacy=Legacy("name"), status=True),
    _id("uuid", "reading.uuid", nullable=False, legacy=Legacy("uuid"), status=True),
    _id("vendor", "reading.vendor", nullable=False),
    _id("up", "reading.up", nullable=False, kind="boolean", status=True),
    _id("pci_bus_id", "reading.pci_bus_id"),
    _id("serial", "reading.serial"),
    _id("driver_version", "reading.driver_version"),
    _id("cuda_version", "reading.cuda_driver_version"),
    Field("utilization_ratio", "ratio", "reading.utilization_ratio", digits=6, maximum=1,
          doc="GPU utilisation, 0-1 (nvidia-smi utilization.gpu / 100)", status=True,
          legacy=Legacy("utilization", "GPU utilisation, percent 0-100 (nvidia-smi utilization.gpu)", "percent", 100,
                        digits=2, maximum=100)),
    Field("memory_total_bytes", "bytes", "reading.memory_total_bytes", kind="integer",
          doc="bytes (nvidia-smi memory.total)", status=True,
          legacy=Legacy("memory.total", "framebuffer memory, " + _MIB_DOC.format("total"), "MiB", per=MIB, digits=None,
                        while_down=True)),
    Field("memory_used_bytes", "bytes", "reading.memory_used_bytes", kind="integer",
          doc="bytes (nvidia-smi memory.used)", status=True,
          legacy=Legacy("memory.used", _MIB_DOC.format("used"), "MiB", per=MIB, digits=None)),
    Field("memory_free_bytes", "bytes", "reading.free_memory_bytes()", kind="integer",
          doc="bytes (nvidia-smi memory.free)", status=True,
          legacy=Legacy("memory.free", _MIB_DOC.format("free"), "MiB", per=MIB, digits=None)),
    Field("memory_used_ratio", "ratio", "memory_used_ratio",
          digits=6, maximum=1, doc="memory used / total, 0-1"),
    Field("temperature_celsius", "celsius", "reading.temperature_celsius[gpu]", digits=2,
          minimum=None, doc="GPU die sensor, celsius", status=True,
          legacy=Legacy("temperature", "GPU die sensor, celsius (nvidia-smi temperature.gpu; amd-smi edge)", digits=2,
                        minimum=None)),
    Field("power_watts", "watts", "reading.power_watts",
          doc="instantaneous power draw, W (nvidia-smi power.draw)", status=True,
          legacy=Legacy("power_usage", "board power draw, W (nvidia-smi power.draw)")),
    Field("power_average_watts", "watts", "power_average_watts",
          doc="average power over the last interval, W: energy counter difference / time"),
    Field("power_average_seconds", "seconds", "power_average_seconds", digits=6, doc="length of that interval, s"),
    Field("power_limit_watts", "watts", "reading.power_limit_watts", doc="W (nvidia-smi power.limit)"),
    Field("energy_joules", "joules", "reading.energy_joules", doc="energy counter since driver load, J"),
    Field("clock_graphics_hertz", "hertz", "reading.clock_hertz[graphics]", stats=None,
          legacy=Legacy("clock_speeds.graphics", "MHz (nvidia-smi clocks.gr)", "MHz", per=1e6, digits=1)),
    Field("clock_memory_hertz", "hertz", "reading.clock_hertz[memory]", stats=None,
          legacy=Legacy("clock_speeds.memory", "MHz (nvidia-smi clocks.mem)", "MHz", per=1e6, digits=1)),
    Field("pcie_link_generation", "", "reading.pcie_link_generation", kind="integer",
          stats="pcie.generation", doc="current link generation (nvidia-smi pcie.link.gen.current)"),
    Field("pcie_link_generation_max", "", "reading.pcie_link_generation_max", kind="integer",
          stats="pcie.generation_max", doc="max link generation (nvidia-smi pcie.link.gen.max)"),
    Field("pcie_link_width", "", "reading.pcie_link_width", kind="integer", stats="pcie.width",
          doc="current link width, lanes (nvidia-smi pcie.link.width.current)"),
    Field("pcie_link_width_max", "", "reading.pcie_link_width_max", kind="integer",
          stats="pcie.width_max", doc="max link width, lanes (nvidia-smi pcie.link.width.max)"),
)

FIELD: dict[str, Field] = {f.name: f for f in FIELDS}


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """``out[key] = value``, a dotted key into nested objects (created in row order)."""
    *parents, last = key.split(".")
    for p in parents:
        out = out.setdefault(p, {})
    out[last] = value


def gpu_stats(src: GpuSource, fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """One GPU of the ``/stats`` view (SI units, like ``/metrics``)."""
    out: dict[str, Any] = {}
    for f in fields:
        key = f.stats_key
        if key is not None:
            _put(out, key, f.si(src))
    return out


def gpu_legacy(src: GpuSource, fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """One GPU of the gpu-metrics view (legacy units; a reading the GPU lacks is null, never 0)."""
    out: dict[str, Any] = {}
    for f in fields:
        if f.legacy is not None:
            _put(out, f.legacy.key, f.in_legacy(src))
    return out


def status_values(src: GpuSource, fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """The ``GpuStatus`` attributes the table holds, by name."""
    return {f.name: f.in_status(src) for f in fields if f.status}


def stats_view(snap: Snapshot, power: Mapping[GpuKey, tuple[float, float]],
               fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """The audit view served at ``/stats`` and written by ``snapshot --json`` (schema: STATS)."""
    gpus: list[dict[str, Any]] = []
    p2p: list[dict[str, Any]] = []
    for number, backend, g in numbered(snap):
        gpus.append(gpu_stats(GpuSource(backend, number, g, power.get((backend, g.uuid))), fields))
    for coll in snap.collections:
        for p in coll.peers:
            p2p.append({"backend": coll.backend, "gpu": p.gpu, "peer": p.peer,
                        "topology_level": p.topology_level,
                        "p2p": {k: v >= 0.5 for k, v in sorted(p.p2p.items())}})
    host = snap.host
    return {
        "timestamp": iso_time(snap.created),
        "host": {
            "node_name": host.node,
            "processor": host.cpu_model,
            "kernel": host.kernel,
            "os": host.os,
            # NVML/amdsmi report these per system; the first GPU that has them speaks for the host
            "driver_version": next((g["driver_version"] for g in gpus if g["driver_version"]), None),
            "cuda_version": next((g["cuda_version"] for g in gpus if g["cuda_version"]), None),
        },
        "gpus": gpus,
        "p2p": p2p,
    }


def numbered(snap: Snapshot) -> list[tuple[int, str, GpuReading]]:
    """(number, backend, reading) for every GPU: the backend's index, offset by the GPUs of the
    backends before it (so ``gpu-N`` stays unique when two vendors share a machine)."""
    out: list[tuple[int, str, GpuReading]] = []
    offset = 0
    for coll in snap.collections:
        out.extend((offset + g.index, coll.backend, g) for g in coll.gpus)
        offset += max((g.index + 1 for g in coll.gpus), default=0)
    return out


