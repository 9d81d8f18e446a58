"""Shared by the JSON API and the single-machine tools: one-shot readings, the ``/stats`` view,
the average power from the energy counter, and the audit rule that ``diff`` applies.

Every reading goes through the exporter's own :class:`~exporter.engine.Engine` and backends,
so ``/metrics``, ``/stats``, ``snapshot``, ``record`` and ``pick`` always agree.
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import re
import secrets
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.engine import Engine
from exporter.readings import GpuReading
from exporter.render import Snapshot

log = logging.getLogger(__name__)

MIB = 2**20
GIB = 2**30


class ToolError(Exception):
    """A failure to report to the user as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def fail(prog: str, exc: ToolError) -> int:
    sys.stderr.write(f"{prog}: error: {exc}\n")
    return exc.code


def write_file(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all; raises ToolError naming the file.

    A regular file (or a new one) is written as a temporary file in the same directory and
    renamed over ``path`` (``os.replace``), so a full disk or a crash never leaves a truncated
    file; the temporary file is removed on error. A symbolic link is followed (its target is
    replaced, the link kept). Anything else that exists (``/dev/stdout``, ``/dev/full``, a
    FIFO, a directory) is opened and written directly: renaming over it would replace it.
    """
    target = os.path.realpath(path)
    tmp: str | None = None
    try:
        try:
            st: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            return
        fd, tmp = _create_temp(os.path.dirname(target), os.path.basename(target))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if st is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))  # replacing a file keeps its permissions
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise ToolError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # the write error raised above is what the user needs


def _create_temp(directory: str, base: str) -> tuple[int, str]:
    """A new file ``.<base>.<random>.tmp`` in ``directory``: (descriptor, path).

    Created with mode 0666 so the umask applies as it would to the file itself
    (tempfile.mkstemp would make it 0600).
    """
    for _ in range(100):
        name = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", directory)


def iso_time(t: float) -> str:
    """Unix time -> ISO 8601 in UTC with milliseconds, e.g. ``2025-03-01T12:00:00.123Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- sizes -----------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> float:
    """``8GiB``, ``512MiB``, ``8GB`` (10^9), ``8G`` (10^9) or plain bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; expected e.g. 8GiB, 512MiB, 10GB or a number of bytes")
    return float(m.group(1)) * _UNITS[unit]


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


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return round(min(1.0, max(0.0, part / whole)), 6)


def _free_bytes(g: GpuReading) -> float | None:
    if g.memory_free_bytes is not None:
        return g.memory_free_bytes
    if g.memory_total_bytes is not None and g.memory_used_bytes is not None:
        return max(0.0, g.memory_total_bytes - g.memory_used_bytes)
    return None


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
        "memory_total_bytes": _r(g.memory_total_bytes, 0),
        "memory_used_bytes": _r(g.memory_used_bytes, 0),
        "memory_free_bytes": _r(_free_bytes(g), 0),
        "memory_used_ratio": _ratio(g.memory_used_bytes, g.memory_total_bytes),
        "utilization_ratio": _r(g.utilization_ratio, 6),
        "temperature_celsius": _r(g.temperature_celsius.get("gpu"), 2),
        "power_watts": _r(g.power_watts),
        "power_average_watts": _r(power[0]) if power else None,
        "power_average_seconds": _r(power[1], 6) if power else None,
        "power_limit_watts": _r(g.power_limit_watts),
        "energy_joules": _r(g.energy_joules),
        "pcie": {
            "generation": _r(g.pcie_link_generation, 0),
            "generation_max": _r(g.pcie_link_generation_max, 0),
            "width": _r(g.pcie_link_width, 0),
            "width_max": _r(g.pcie_link_width_max, 0),
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


# --- the CLI side: pick backends, read once -----------------------------------------------------


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every tool shares with ``serve`` (environment and ``--config`` work the same)."""
    g = p.add_argument_group("backend (as for gpu-exporter serve)")
    g.add_argument("--backend", default=None,
                   help="auto | nvml | amdsmi | rocm-smi | simulated, or a comma list (default auto; "
                        "env EXPORTER_BACKEND). auto never falls back to simulated")
    g.add_argument("--simulated-gpus", default=None, help="GPU count of --backend simulated (default 4)")
    g.add_argument("--config", dest="config_file", default=None, help="the exporter's YAML config file")


def setup_logging() -> None:
    """Warnings from the backends go to stderr; stdout stays clean for JSON and indices."""
    from exporter import logs

    logs.setup("warning", "text")


def open_engine(args: argparse.Namespace) -> Engine:
    """Initialise the chosen backends now and wrap them in an :class:`Engine`.

    Unlike ``serve`` (which keeps a failing explicit backend and retries it on every scrape),
    a one-shot tool must fail at once, and ``auto`` never falls back to simulated GPUs.
    """
    from exporter import backends, config
    from exporter.backends.base import Backend
    from exporter.host import host_info
    from exporter.serve import options_from

    argv: list[str] = []
    for flag, value in (("--backend", args.backend), ("--simulated-gpus", args.simulated_gpus),
                        ("--config", args.config_file)):
        if value is not None:
            argv += [flag, str(value)]
    try:
        settings = config.load(argv)
    except config.ConfigError as exc:
        raise ToolError(str(exc), code=2) from None
    options = options_from(settings)
    chosen: list[Backend] = []
    if settings.backend == "auto":
        found, reasons = backends.detect(options)
        if found is not None:
            chosen = [found]
        if not chosen:
            raise ToolError("no GPU found (" + "; ".join(reasons) + "); pass --backend simulated to try "
                            "the tool on simulated GPUs")
    else:
        for name in settings.backend.split(","):
            b = backends.create(name, options)
            try:
                b.init()
            except Exception as exc:  # noqa: BLE001 - reported as one line
                for c in chosen:
                    c.shutdown()
                raise ToolError(f"backend {name}: {exc}") from None
            chosen.append(b)
            if name == "simulated":
                sys.stderr.write("warning: --backend simulated: these readings are SIMULATED, "
                                 "not real GPUs\n")
    engine = Engine(chosen, host_info(), options.fields, 0.0, settings.collection_timeout, cache_ttl=0.0)
    for b in chosen:
        engine.mark_initialised(b.name)
    return engine


def read(engine: Engine) -> Snapshot:
    """One fresh collection from every backend; a failed backend is an error, not missing GPUs."""
    snap = engine.scrape().snap
    failed = [name for name, st in snap.stats.items() if not st.success]
    if failed:
        raise ToolError(f"collection failed for backend {', '.join(failed)} (see the warning above)")
    return snap


def take_audit(engine: Engine, window: float, tracker: PowerTracker | None = None) -> dict[str, Any]:
    """The ``/stats`` view from two readings ``window`` seconds apart (for the average power)."""
    tracker = tracker or PowerTracker()
    snap = read(engine)
    power = tracker.observe(snap)
    if window > 0:
        time.sleep(window)  # the average power needs an interval; this is its length
        snap = read(engine)
        power = tracker.observe(snap)
    return stats_view(snap, power)


# --- the audit rule ---------------------------------------------------------------------------------

HOST_FIXED = ("node_name", "processor", "kernel", "driver_version", "cuda_version")
GPU_FIXED = ("uuid", "name", "pci_bus_id", "up", "driver_version", "cuda_version", "memory_total_bytes",
             "pcie.generation", "pcie.generation_max", "pcie.width", "pcie.width_max")
RISES = ("memory", "power")
IGNORABLE = (*(f"host.{f}" for f in HOST_FIXED), *GPU_FIXED, "p2p", *RISES)


@dataclass
class Limits:
    """How much memory in use and power may rise between two audits before it counts as a foreign load."""

    memory_rise_bytes: float = 256 * MIB
    power_rise_watts: float = 30.0


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


def _show(v: Any) -> str:
    if v is None:
        return "null (not reported)"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _power(g: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[float | None, str]:
    """Average power when both audits have it (energy counter), else the instantaneous sample."""
    if g.get("power_average_watts") is not None and other.get("power_average_watts") is not None:
        return g["power_average_watts"], "average power"
    return g.get("power_watts"), "power"


def check_audit(doc: Any, name: str) -> dict[str, Any]:
    """A loaded snapshot file, or ToolError naming the file."""
    if (not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list)
            or not isinstance(doc.get("host"), dict) or not isinstance(doc.get("p2p", []), list)
            or not all(isinstance(g, dict) and "index" in g for g in doc["gpus"])):
        raise ToolError(f"{name}: not a gpu-exporter snapshot "
                        "(write one with: gpu-exporter snapshot --json -o FILE)", code=2)
    return doc


def diff_audits(before: Mapping[str, Any], after: Mapping[str, Any], limits: Limits,
                ignore: Sequence[str] = ()) -> list[str]:
    """What changed between two audits, one line each; empty when the system is the same.

    Fields that must not change during a run (GPU models, PCIe links, P2P, processor, driver)
    must be identical; memory in use and power must not have risen beyond ``limits``.
    """
    skip = set(ignore)
    out: list[str] = []
    for f in HOST_FIXED:
        a, b = before["host"].get(f), after["host"].get(f)
        if f"host.{f}" not in skip and a != b:
            out.append(f"host: {f} changed: {_show(a)} -> {_show(b)}")

    def key(g: Mapping[str, Any]) -> tuple[str, int]:
        return (str(g.get("backend", "")), int(g["index"]))

    old = {key(g): g for g in before["gpus"]}
    new = {key(g): g for g in after["gpus"]}
    several = len({k[0] for k in (*old, *new)}) > 1

    def label(k: tuple[str, int]) -> str:
        return f"{k[0]} gpu {k[1]}" if several else f"gpu {k[1]}"

    for k in sorted(old.keys() - new.keys()):
        out.append(f"{label(k)}: missing after the run (was {old[k].get('name')} {old[k].get('uuid')})")
    for k in sorted(new.keys() - old.keys()):
        out.append(f"{label(k)}: new after the run ({new[k].get('name')} {new[k].get('uuid')})")
    for k in sorted(old.keys() & new.keys()):
        a, b = old[k], new[k]
        for f in GPU_FIXED:
            va, vb = _get(a, f), _get(b, f)
            if f not in skip and va != vb:
                out.append(f"{label(k)}: {f} changed: {_show(va)} -> {_show(vb)} (must not change)")
        ma, mb = a.get("memory_used_bytes"), b.get("memory_used_bytes")
        if "memory" not in skip and ma is not None and mb is not None and mb - ma > limits.memory_rise_bytes:
            out.append(f"{label(k)}: memory in use rose by {format_bytes(mb - ma)} ({format_bytes(ma)} -> "
                       f"{format_bytes(mb)}; limit {format_bytes(limits.memory_rise_bytes)}): "
                       "a foreign load?")
        (pa, what), (pb, _) = _power(a, b), _power(b, a)
        if "power" not in skip and pa is not None and pb is not None and pb - pa > limits.power_rise_watts:
            out.append(f"{label(k)}: {what} rose by {pb - pa:.1f} W ({pa:.1f} -> {pb:.1f} W; "
                       f"limit {limits.power_rise_watts:g} W): a foreign load?")
    if "p2p" not in skip:
        out.extend(_diff_p2p(before.get("p2p", []), after.get("p2p", []), several))
    return list(dict.fromkeys(out))  # a symmetric P2P change is reported once


def _diff_p2p(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
              several: bool) -> list[str]:
    def key(p: Mapping[str, Any]) -> tuple[str, int, int]:
        return (str(p.get("backend", "")), int(p["gpu"]), int(p["peer"]))

    old = {key(p): p for p in before}
    new = {key(p): p for p in after}
    out: list[str] = []
    for k in sorted(old.keys() | new.keys()):
        lo, hi = sorted(k[1:])
        where = f"p2p {k[0] + ' ' if several else ''}gpu {lo} <-> {hi}"
        a, b = old.get(k), new.get(k)
        if a is None or b is None:
            out.append(f"{where}: {'appeared' if a is None else 'disappeared'}")
            continue
        if a.get("topology_level") != b.get("topology_level"):
            out.append(f"{where}: topology_level changed: {_show(a.get('topology_level'))} -> "
                       f"{_show(b.get('topology_level'))}")
        pa, pb = a.get("p2p") or {}, b.get("p2p") or {}
        for cap in sorted(set(pa) | set(pb)):
            if pa.get(cap) != pb.get(cap):
                out.append(f"{where}: {cap} changed: {_show(pa.get(cap))} -> {_show(pb.get(cap))}")
    return out
