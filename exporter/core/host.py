"""Host identity for ``gpu_host_info``: node name, CPU model, kernel."""

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
