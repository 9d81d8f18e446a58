"""Host identity for ``gpu_host_info`` (node name, CPU model, kernel), and the exporter process's own
``process_*`` readings from /proc."""

from __future__ import annotations

import os
import platform
import socket

from exporter.core.readings import HostInfo


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU model name as ``lscpu`` shows it (``platform.processor()`` is empty on Linux).

    x86 has ``model name``; arm64 kernels often only have ``CPU implementer``/``Hardware``.
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return platform.machine() or "unknown"
    fallback = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "model name" and value:
            return value
        if key in ("hardware", "cpu model", "processor") and value and not value.isdigit() and not fallback:
            fallback = value
    return fallback or platform.machine() or "unknown"


def node_name(environ: dict[str, str] | None = None) -> str:
    """``NODE_NAME`` (downward API ``spec.nodeName``), else the host name."""
    env = os.environ if environ is None else environ
    return env.get("NODE_NAME", "").strip() or socket.gethostname()


def host_info() -> HostInfo:
    os_name = ""
    try:
        os_name = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        pass
    return HostInfo(node=node_name(), cpu_model=cpu_model(), kernel=platform.release(), os=os_name)


def _clock_ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return 100.0


_TICKS = _clock_ticks()
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_readings(proc: str = "/proc", pid: str = "self") -> dict[str, float]:
    """The ``process_*`` families of one process, by family name, as every Prometheus client library
    publishes them (prometheus_client's ProcessCollector reads the same files): CPU seconds
    (utime + stime), RSS and virtual size in bytes, start time (Unix seconds), open and maximum fds.

    Read here rather than through prometheus_client: importing that package loads http.server, ssl
    and hashlib, i.e. OpenSSL, about 6 MiB of RSS that plain serving never needs. A file that cannot
    be read leaves its readings out (no /proc: none at all)."""
    out: dict[str, float] = {}
    base = os.path.join(proc, pid)
    try:
        with open(os.path.join(proc, "stat"), "rb") as fh:
            btime = next((float(line.split()[1]) for line in fh if line.startswith(b"btime ")), 0.0)
        with open(os.path.join(base, "stat"), "rb") as fh:
            parts = fh.read().rsplit(b")", 1)[-1].split()  # the command name may hold spaces and ')'
        out["process_virtual_memory_bytes"] = float(parts[20])
        out["process_resident_memory_bytes"] = float(parts[21]) * _PAGE
        if btime:
            out["process_start_time_seconds"] = float(parts[19]) / _TICKS + btime
        out["process_cpu_seconds_total"] = (float(parts[11]) + float(parts[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        pass
    try:
        out["process_open_fds"] = float(len(os.listdir(os.path.join(base, "fd"))))
        with open(os.path.join(base, "limits"), "rb") as fh:
            for line in fh:
                if line.startswith(b"Max open files"):
                    soft = line.split()[3]
                    if soft.isdigit():  # "unlimited" has no number to publish
                        out["process_max_fds"] = float(soft)
                    break
    except (OSError, IndexError):
        pass
    return out
