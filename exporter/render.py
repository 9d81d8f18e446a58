"""Turn one collection snapshot into fresh Prometheus metric families.

A client_python custom collector (``collect()`` builds new families every time, in a
private registry), so no label set can go stale. Rendering happens once per
collection and the bytes are shared by every scraper of that collection.
"""

from __future__ import annotations

import gzip
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_latest_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from exporter import __version__
from exporter.backends.base import FieldFilter
from exporter.readings import Collection, GpuReading, HostInfo
from exporter.schema import COUNTER, GAUGE, GPU_FAMILIES, TOPOLOGY_LEVELS

# Extra labels for a GPU (pod attribution): reading -> {label: value}
LabelHook = Callable[[GpuReading], dict[str, str]]


@dataclass
class BackendStats:
    """Self-metrics state of one backend (node_exporter's scrape_collector_*)."""

    success: bool = False
    duration_seconds: float = 0.0
    errors_total: dict[str, int] = field(default_factory=dict)
    last_success_seconds: float | None = None
    gpus: int = 0
    collections_total: int = 0


@dataclass
class Snapshot:
    collections: list[Collection]
    host: HostInfo
    stats: dict[str, BackendStats]
    created: float
    gpu_labels: LabelHook | None = None
    extra_families: list[Metric] = field(default_factory=list)


def _fmt(x: float) -> float:
    return float(x)


def _gpu_families(snap: Snapshot, fields: FieldFilter) -> Iterator[Metric]:
    readings: list[tuple[Collection, GpuReading, dict[str, str]]] = []
    hook = snap.gpu_labels
    for coll in snap.collections:
        for r in coll.gpus:
            labels = {"gpu": str(r.index), "uuid": r.uuid}
            if hook is not None:
                labels.update(hook(r))
            readings.append((coll, r, labels))

    info = Metric("gpu_info", "GPU identity; value is always 1. Join on (gpu, uuid) for names.", GAUGE)
    up = Metric("gpu_up", "1 when the GPU answered this collection, 0 when it is lost or unreadable.", GAUGE)
    for coll, r, labels in readings:
        up.samples.append(Sample("gpu_up", labels, 1.0 if r.up else 0.0))
        info.samples.append(
            Sample(
                "gpu_info",
                {
                    "gpu": str(r.index),
                    "uuid": r.uuid,
                    "name": r.name or "",
                    "vendor": r.vendor,
                    "pci_bus_id": r.pci_bus_id or "",
                    "serial": r.serial or "",
                    "driver_version": r.driver_version or "",
                    "cuda_version": r.cuda_driver_version or "",
                    "backend": coll.backend,
                },
                1.0,
            )
        )
    if fields.enabled("gpu_info"):
        yield info
    if fields.enabled("gpu_up"):
        yield up

    live = [(r, labels) for _, r, labels in readings if r.up]
    for fam in GPU_FAMILIES:
        if not fields.enabled(fam.name):
            continue
        m = Metric(fam.base, fam.help, fam.kind)
        sname = fam.name
        out = m.samples
        if not fam.labels:
            for r, labels in live:
                v = getattr(r, fam.attr)
                if v is not None:
                    out.append(Sample(sname, labels, _fmt(v)))
        elif len(fam.labels) == 1:
            lname = fam.labels[0]
            for r, labels in live:
                for key, v in getattr(r, fam.attr).items():
                    out.append(Sample(sname, {**labels, lname: str(key)}, _fmt(v)))
        else:
            for r, labels in live:
                for key, v in getattr(r, fam.attr).items():
                    extra = dict(zip(fam.labels, (str(k) for k in key), strict=True))
                    out.append(Sample(sname, {**labels, **extra}, _fmt(v)))
        if out:
            yield m

    yield from _mig_families(live, fields)
    yield from _peer_families(snap, fields)
    yield from _event_families(snap, fields)

    if fields.enabled("gpu_field_unsupported"):
        m = Metric("gpu_field_unsupported",
                   "1 for each metric family this GPU or driver does not support (so absence is explained).",
                   GAUGE)
        for r, labels in live:
            for fname in sorted(r.unsupported):
                m.samples.append(Sample("gpu_field_unsupported", {**labels, "field": fname}, 1.0))
        if m.samples:
            yield m


def _mig_families(live: list[tuple[GpuReading, dict[str, str]]], fields: FieldFilter) -> Iterator[Metric]:
    specs = (
        ("gpu_mig_memory_total_bytes", "MIG instance memory total in bytes.", "memory_total_bytes"),
        ("gpu_mig_memory_used_bytes", "MIG instance memory used in bytes.", "memory_used_bytes"),
        ("gpu_mig_utilization_ratio", "MIG instance utilisation (0-1), where the driver reports it.",
         "utilization_ratio"),
    )
    for name, doc, attr in specs:
        if not fields.enabled(name):
            continue
        m = Metric(name, doc, GAUGE)
        for r, labels in live:
            for mig in r.mig:
                v = getattr(mig, attr)
                if v is None:
                    continue
                lab = {
                    **labels,
                    "gpu_instance": str(mig.gpu_instance_id),
                    "compute_instance": "" if mig.compute_instance_id is None else str(mig.compute_instance_id),
                    "mig_profile": mig.profile or "",
                    "mig_uuid": mig.uuid or "",
                }
                m.samples.append(Sample(name, lab, float(v)))
        if m.samples:
            yield m


def _peer_families(snap: Snapshot, fields: FieldFilter) -> Iterator[Metric]:
    p2p = Metric("gpu_p2p_supported",
                 "1 when peer-to-peer access from gpu to peer is supported, by capability.", GAUGE)
    topo = Metric(
        "gpu_topology_level",
        "PCIe/NVLink topology level between gpu and peer (NVML levels: 0 internal, 10 single switch, "
        "20 multiple switches, 30 host bridge, 40 NUMA node, 50 system); label level names it.",
        GAUGE,
    )
    for coll in snap.collections:
        uuids = {r.index: r.uuid for r in coll.gpus if r.up}
        for p in coll.peers:
            if p.gpu not in uuids or p.peer not in uuids:
                continue  # a lost GPU publishes nothing, topology included
            base = {"gpu": str(p.gpu), "uuid": uuids.get(p.gpu, ""), "peer": str(p.peer)}
            for cap, v in p.p2p.items():
                p2p.samples.append(Sample("gpu_p2p_supported", {**base, "capability": cap}, float(v)))
            if p.topology_level is not None:
                value = p.topology_level_value
                if value is None:
                    value = float(TOPOLOGY_LEVELS.get(p.topology_level, -1))
                topo.samples.append(Sample("gpu_topology_level", {**base, "level": p.topology_level}, value))
    if p2p.samples and fields.enabled("gpu_p2p_supported"):
        yield p2p
    if topo.samples and fields.enabled("gpu_topology_level"):
        yield topo


def _event_families(snap: Snapshot, fields: FieldFilter) -> Iterator[Metric]:
    xid = Metric("gpu_xid_errors", "XID errors reported by the driver since the exporter started, by xid code.",
                 COUNTER)
    last = Metric("gpu_xid_last_timestamp_seconds", "Unix time of the last XID error on this GPU.", GAUGE)
    pci = Metric("gpu_pci_devices", "GPUs of this vendor present on the PCI bus (sysfs).", GAUGE)
    vis = Metric("gpu_visible_devices", "GPUs of this vendor visible to the vendor library.", GAUGE)
    for coll in snap.collections:
        for (idx, uuid, code), n in coll.xid_counts.items():
            xid.samples.append(Sample("gpu_xid_errors_total", {"gpu": str(idx), "uuid": uuid, "xid": code}, n))
        for (idx, uuid), ts in coll.xid_last_seconds.items():
            last.samples.append(Sample("gpu_xid_last_timestamp_seconds", {"gpu": str(idx), "uuid": uuid}, ts))
        if coll.pci_devices is not None:
            vendor = coll.gpus[0].vendor if coll.gpus else _vendor_of(coll.backend)
            pci.samples.append(Sample("gpu_pci_devices", {"vendor": vendor}, float(coll.pci_devices)))
            vis.samples.append(Sample("gpu_visible_devices", {"vendor": vendor}, float(len(coll.gpus))))
    for name, m in (("gpu_xid_errors_total", xid), ("gpu_xid_last_timestamp_seconds", last),
                    ("gpu_pci_devices", pci), ("gpu_visible_devices", vis)):
        if m.samples and fields.enabled(name):
            yield m


def _vendor_of(backend: str) -> str:
    from exporter import backends

    cls = backends.registry().get(backend)
    return cls.vendor if cls is not None else "unknown"


def _self_families(snap: Snapshot) -> Iterator[Metric]:
    host = Metric("gpu_host_info", "Host identity; value is always 1.", GAUGE)
    h = snap.host
    host.samples.append(Sample("gpu_host_info", {"node": h.node, "cpu_model": h.cpu_model, "kernel": h.kernel,
                                                 "os": h.os}, 1.0))
    yield host
    build = Metric("gpu_exporter_build_info", "gpu-exporter build; value is always 1.", GAUGE)
    build.samples.append(Sample("gpu_exporter_build_info",
                                {"version": __version__, "python_version": platform.python_version()}, 1.0))
    yield build
    ok = Metric("gpu_exporter_collector_success", "1 when the backend's last collection succeeded.", GAUGE)
    dur = Metric("gpu_exporter_collector_duration_seconds", "Duration of the backend's last collection.", GAUGE)
    err = Metric("gpu_exporter_collection_errors",
                 "Collection errors by backend and kind (gpu_lost, driver, timeout, ...).", COUNTER)
    gpus = Metric("gpu_exporter_gpus", "GPUs the backend returned in its last collection.", GAUGE)
    last = Metric("gpu_exporter_last_success_timestamp_seconds",
                  "Unix time of the backend's last successful collection.", GAUGE)
    total = Metric("gpu_exporter_collections", "Collections run by the backend.", COUNTER)
    for name, st in sorted(snap.stats.items()):
        lab = {"backend": name}
        ok.samples.append(Sample("gpu_exporter_collector_success", lab, 1.0 if st.success else 0.0))
        dur.samples.append(Sample("gpu_exporter_collector_duration_seconds", lab, st.duration_seconds))
        gpus.samples.append(Sample("gpu_exporter_gpus", lab, float(st.gpus)))
        total.samples.append(Sample("gpu_exporter_collections_total", lab, float(st.collections_total)))
        if st.last_success_seconds is not None:
            last.samples.append(Sample("gpu_exporter_last_success_timestamp_seconds", lab, st.last_success_seconds))
        for kind, n in sorted(st.errors_total.items()):
            err.samples.append(Sample("gpu_exporter_collection_errors_total", {**lab, "kind": kind}, float(n)))
    yield from (ok, dur, err, gpus, last, total)
    yield from snap.extra_families


class SnapshotCollector(Collector):
    def __init__(self, snap: Snapshot, fields: FieldFilter) -> None:
        self.snap = snap
        self.fields = fields

    def collect(self) -> Iterator[Metric]:
        yield from _gpu_families(self.snap, self.fields)
        yield from _self_families(self.snap)


class Rendered:
    """The exposition of one snapshot, rendered lazily once per format and encoding."""

    def __init__(self, snap: Snapshot, fields: FieldFilter) -> None:
        self.snap = snap
        self._fields = fields
        self._cache: dict[tuple[bool, bool], bytes] = {}

    def body(self, openmetrics: bool = False, gz: bool = False) -> bytes:
        key = (openmetrics, gz)
        hit = self._cache.get(key)
        if hit is None:
            if gz:
                hit = gzip.compress(self.body(openmetrics, False), compresslevel=5)
            else:
                reg = CollectorRegistry(auto_describe=False)
                reg.register(SnapshotCollector(self.snap, self._fields))
                hit = generate_latest_openmetrics(reg) if openmetrics else generate_latest(reg)
            self._cache[key] = hit  # benign race: two threads may render the same bytes once each
        return hit
