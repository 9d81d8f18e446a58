"""One collection's result as the serving side sees it: readings, host, self-metrics state.

The renderer, the JSON API and the audit tools all read a :class:`Snapshot`; nothing here
knows how it is collected or served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.core.readings import Collection, GpuReading, HostInfo, MigReading

if TYPE_CHECKING:  # plugins hand us prometheus_client Metrics; serving alone never imports it
    from prometheus_client.metrics_core import Metric

# Extra labels for a GPU (pod attribution): reading -> {label: value}
LabelHook = Callable[[GpuReading], dict[str, str]]
# Extra labels for one MIG instance of a GPU (the pod holding it): (gpu, instance) -> {label: value}
MigLabelHook = Callable[[GpuReading, MigReading], dict[str, str]]


@dataclass
class BackendStats:
    """Self-metrics state of one backend (node_exporter's scrape_collector_*)."""

    success: bool = False
    duration_seconds: float = 0.0
    errors_total: dict[str, int] = field(default_factory=dict)
    last_success_seconds: float | None = None
    gpus: int = 0
    collections_total: int = 0
    interval_seconds: float | None = None  # minimum seconds between real reads (set in each snapshot's copy)


@dataclass
class Snapshot:
    collections: list[Collection]
    host: HostInfo
    stats: dict[str, BackendStats]
    created: float
    gpu_labels: LabelHook | None = None
    extra_families: list[Metric] = field(default_factory=list)
    mig_labels: MigLabelHook | None = None


