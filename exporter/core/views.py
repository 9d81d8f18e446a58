"""Views of a snapshot shared by the JSON API and the single-machine tools: the ``/stats``
document, the average power from the energy counter, GPU numbering, sizes and times.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
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


# --- the /stats view ---------------------------------------------------------------------------


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


def gpu_stats(backend: str, g: GpuReading, power: tuple[float, float] | None) -> dict[str, Any]:
    """One GPU of the ``/stats`` view (SI units, like ``/metrics``)."""
    return {
        "backend": backend,
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "vendor": g.vendor,
        "up": g.up,
        "pci_bus_id": g.pci_bus_id,
        "serial": g.serial,
        "driver_version": g.driver_version,
        "cuda_version": g.cuda_driver_version,
        "memory_total_bytes": _int(g.memory_total_bytes),
        "memory_used_bytes": _int(g.memory_used_bytes),
        "memory_free_bytes": _int(g.free_memory_bytes()),
        "memory_used_ratio": _ratio(g.memory_used_bytes, g.memory_total_bytes),
        "utilization_ratio": _r(g.utilization_ratio, 6),
        "temperature_celsius": _r(g.temperature_celsius.get("gpu"), 2),
        "power_watts": _r(g.power_watts),
        "power_average_watts": _r(power[0]) if power else None,
        "power_average_seconds": _r(power[1], 6) if power else None,
        "power_limit_watts": _r(g.power_limit_watts),
        "energy_joules": _r(g.energy_joules),
        "pcie": {
            "generation": _int(g.pcie_link_generation),
            "generation_max": _int(g.pcie_link_generation_max),
            "width": _int(g.pcie_link_width),
            "width_max": _int(g.pcie_link_width_max),
        },
    }


def stats_view(snap: Snapshot, power: Mapping[GpuKey, tuple[float, float]]) -> dict[str, Any]:
    """The audit view served at ``/stats`` and written by ``snapshot --json`` (schema: STATS)."""
    gpus: list[dict[str, Any]] = []
    p2p: list[dict[str, Any]] = []
    for coll in snap.collections:
        for g in coll.gpus:
            gpus.append(gpu_stats(coll.backend, g, power.get((coll.backend, g.uuid))))
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


