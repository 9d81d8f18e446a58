"""Settings: the one settings object, with the one set of defaults.

``exporter.serve.config`` fills :class:`Settings` from flags, environment and a YAML file;
everything else (backends, engine, tools) reads its defaults from here.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Settings:
    backend: str = "auto"
    allow_simulated: bool = False
    address: str = "0.0.0.0"
    port: int = 9400
    metrics_path: str = "/metrics"
    collection_interval: float = 0.0
    collection_timeout: float = 5.0
    cache_ttl: float = 1.0
    ready_max_age: float = 60.0
    log_level: str = "info"
    log_format: str = "text"
    fields_include: list[str] = field(default_factory=list)
    fields_exclude: list[str] = field(default_factory=list)
    sysfs_root: str = "/sys"
    simulated_gpus: int = 4
    simulated_scenario: str = "healthy"
    per_process: bool = False
    pcie_throughput: bool = False
    rocm_smi_path: str | None = None
    command_timeout: float = 5.0
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pod_resources_interval: float = 10.0
    pod_attribution: str = "auto"
    web_config_file: str | None = None
    max_connections: int = 64
    read_timeout: float = 10.0
    config_file: str | None = None
    check_config: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}



@dataclass
class FieldFilter:
    """Include/exclude lists of metric family names (shell globs, e.g. ``gpu_clock_*``)."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    _cache: dict[str, bool] = field(default_factory=dict, repr=False)

    def enabled(self, family: str) -> bool:
        hit = self._cache.get(family)
        if hit is None:
            inc = not self.include or any(fnmatch.fnmatchcase(family, p) for p in self.include)
            exc = any(fnmatch.fnmatchcase(family, p) for p in self.exclude)
            hit = self._cache[family] = inc and not exc
        return hit


_D = Settings()  # the one set of defaults


@dataclass
class BackendOptions:
    """What a backend needs from :class:`Settings` (its defaults are the settings' defaults)."""

    fields: FieldFilter = field(default_factory=FieldFilter)
    sysfs_root: str = _D.sysfs_root
    simulated_gpus: int = _D.simulated_gpus
    simulated_scenario: str = _D.simulated_scenario  # exporter.backends.simulated.SCENARIOS
    simulated_leak: bool = True
    per_process: bool = _D.per_process  # per-PID series are unbounded cardinality: opt-in
    pcie_throughput: bool = _D.pcie_throughput  # about 40 ms per GPU per read on NVIDIA: opt-in
    command_timeout: float = _D.command_timeout  # CLI backends (rocm-smi)
    rocm_smi_path: str | None = _D.rocm_smi_path  # explicit rocm-smi binary; default: PATH, then /opt/rocm/bin

    @classmethod
    def from_settings(cls, s: Settings) -> BackendOptions:
        return cls(fields=FieldFilter(include=s.fields_include, exclude=s.fields_exclude),
                   sysfs_root=s.sysfs_root, simulated_gpus=s.simulated_gpus,
                   simulated_scenario=s.simulated_scenario, per_process=s.per_process,
                   pcie_throughput=s.pcie_throughput, rocm_smi_path=s.rocm_smi_path,
                   command_timeout=s.command_timeout)


