"""Views of a snapshot shared by the JSON API, the Python API and the single-machine tools: the
GPU field table that ``/stats``, gpu-metrics and ``GpuStatus`` are generated from, the average
power from the energy counter, GPU numbering, sizes and times.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.core.fields import Field, Legacy, Record, getter
from exporter.core.readings import GpuReading
from exporter.core.schema import FAMILIES, MIB
from exporter.core.snapshot import Snapshot

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
# ``/stats`` (SI), ``/api/v1/monitoring/gpu-metrics`` (legacy units), ``GpuStatus`` and ``Recording``
# (Python API), the snapshot table and diff's rule are views of this one table, the fields of the
# schema's rows (core/fields.py): each field reads its value from a GPU's reading once, in SI units,
# and says under which key (and in which unit) each view shows it. The views, their JSON schemas
# (exporter.serve.api_schema) and the field list of docs/api.md are generated from the rows.

__all__ = ["FIELD", "FIELDS", "MIB", "Field", "GpuSource", "Legacy", "PowerTracker", "Record", "format_bytes",
           "getter", "gpu_legacy", "gpu_stats", "iso_time", "numbered", "stats_view", "status_values"]


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


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return round(min(1.0, max(0.0, part / whole)), 6)


# The table: every schema row's fields, in row order (identity first: gpu_info's row).
FIELDS: tuple[Field, ...] = tuple(v for family in FAMILIES for v in family.views)
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


