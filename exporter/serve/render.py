"""Turn one collection snapshot into exposition bytes (Prometheus text and OpenMetrics).

Every render builds its families afresh from the snapshot (as a client_python custom
collector would), so no label set can go stale. We write the exposition ourselves rather
than through ``prometheus_client.generate_latest``: that costs ~4 us per sample, which at
8 GPUs (~900 samples) alone is four times our 1 ms scrape budget. Here each GPU's label
string is escaped once per collection, and the static topology block (quadratic in the
GPU count) is rendered once per driver initialisation and reused. The label part of each keyed
sample and the text of repeating values are cached across renders (``python -m bench.render``).

Rendering happens once per collection and format: the ``/metrics`` route caches the bytes of
the engine's last snapshot (exporter/serve/http.py), and all scrapers of that collection share
them. Extra families from plugins (pod attribution) are ``prometheus_client`` Metric objects
and go through the same writer.
"""

from __future__ import annotations

import math
import platform
import re
import threading
from typing import TYPE_CHECKING, Any

from exporter.core.options import FieldFilter
from exporter.core.readings import Collection, GpuReading, PeerReading
from exporter.core.schema import COUNTER, FAMILY_BY_NAME, GAUGE, GPU_FAMILIES, MIG_FAMILIES, TOPOLOGY_LEVELS
from exporter.core.snapshot import Snapshot
from exporter.core.version import VERSION as __version__

if TYPE_CHECKING:  # plugins hand us prometheus_client Metrics; serving alone never imports it
    from prometheus_client.metrics_core import Metric

# --- exposition primitives ----------------------------------------------------------------


def esc(v: str) -> str:
    """Escape a label value (both formats): backslash, double quote, newline."""
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def _esc_help(v: str, om: bool) -> str:
    v = v.replace("\\", "\\\\").replace("\n", "\\n")
    return v.replace('"', '\\"') if om else v


def num(v: float) -> str:
    """Go-compatible float text; integral values without a fraction (``85520809984``)."""
    v = float(v)
    if v.is_integer():  # the common case first (counts, flags, bytes); NaN and the infinities are not
        return str(int(v)) if -1e15 < v < 1e15 else repr(v)
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


# value -> its text, for the values that repeat from one sample and one render to the next (0, 1,
# a clock, an error count): the formatting is the larger part of writing a sample. Bounded.
_NUMS: dict[float, str] = {}
_NUMS_MAX = 8192


def _num_cached(v: float) -> str:
    s = num(v)
    if len(_NUMS) < _NUMS_MAX:
        _NUMS[v] = s
    return s


# (family, GPU label string, reading key) -> 'family{gpu=...,uuid=...,label="key"} ': the label part of a
# keyed sample is the same from one render to the next (links, clocks, reasons), so it is escaped and
# joined once, not on every scrape. Bounded: a churn of keys cannot grow it without limit.
_PREFIXES: dict[tuple[str, str, Any], str] = {}
_PREFIXES_MAX = 32_768  # about 8 MiB at most; a 64-GPU NVLink node needs about 12,000


def _keyed_prefix(name: str, labels: tuple[str, ...], base: str, key: Any) -> str:
    if len(labels) == 1:
        pairs = f'{labels[0]}="{esc(str(key))}"'
    else:
        pairs = ",".join(f'{ln}="{esc(str(k))}"' for ln, k in zip(labels, key, strict=True))
    if len(_PREFIXES) >= _PREFIXES_MAX:
        _PREFIXES.clear()
    p = _PREFIXES[(name, base, key)] = f"{name}{{{base},{pairs}}} "
    return p


def labelstr(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{esc(str(v))}"' for k, v in labels.items())


class _Out:
    """Accumulates families in one format (text 0.0.4 or OpenMetrics 1.0)."""

    def __init__(self, openmetrics: bool) -> None:
        self.om = openmetrics
        self.parts: list[str] = []

    def family(self, name: str, kind: str, help_: str, body: str, unit: str = "1") -> None:
        if not body:
            return
        if self.om and kind == COUNTER and name.endswith("_total"):
            name = name[: -len("_total")]  # OpenMetrics names the counter family without _total
        self.parts.append(f"# HELP {name} {_esc_help(help_, self.om)}\n# TYPE {name} {kind}\n")
        om_unit = unit.replace(" ", "_")
        if self.om and unit != "1" and name.endswith("_" + om_unit):  # OpenMetrics: the unit is the name's suffix
            self.parts.append(f"# UNIT {name} {om_unit}\n")
        self.parts.append(body)


def _render_metric(out: _Out, m: Metric) -> None:
    """A prometheus_client Metric (from a plugin) through our writer."""
    # info becomes a gauge of 1s; anything else we do not type (unknown, stateset...) is untyped
    kind = m.type if m.type in (GAUGE, COUNTER) else GAUGE if m.type == "info" else "untyped"
    name = m.name + "_total" if kind == COUNTER and not m.name.endswith("_total") else m.name
    body = "".join(f"{s.name}{{{labelstr(s.labels)}}} {num(float(s.value))}\n" if s.labels
                   else f"{s.name} {num(float(s.value))}\n" for s in m.samples)
    fam = FAMILY_BY_NAME.get(name)
    out.family(name, kind, m.documentation, body, fam.unit if fam is not None else "1")


# --- topology cache -------------------------------------------------------------------------

_topo_lock = threading.Lock()
_topo_cache: dict[int, tuple[list[PeerReading], frozenset[int], str, str]] = {}


def _topology_bodies(peers: list[PeerReading], up: frozenset[int], uuids: dict[int, str]) -> tuple[str, str]:
    """Bodies of gpu_p2p_supported and gpu_topology_level; cached while the list is the same.

    Backends hand out the same static list object until the driver is re-initialised.
    """
    key = id(peers)
    with _topo_lock:
        hit = _topo_cache.get(key)
        if hit is not None and hit[0] is peers and hit[1] == up:
            return hit[2], hit[3]
    p2p: list[str] = []
    topo: list[str] = []
    for p in peers:
        if p.gpu not in up or p.peer not in up:
            continue  # a lost GPU publishes nothing, topology included
        base = f'gpu="{p.gpu}",uuid="{esc(uuids.get(p.gpu, ""))}",peer="{p.peer}"'
        for cap, v in p.p2p.items():
            p2p.append(f'gpu_p2p_supported{{{base},capability="{esc(cap)}"}} {num(v)}\n')
        if p.topology_level is not None:
            value = p.topology_level_value
            if value is None:
                value = float(TOPOLOGY_LEVELS.get(p.topology_level, -1))
            topo.append(f'gpu_topology_level{{{base},level="{esc(p.topology_level)}"}} {num(value)}\n')
    bodies = ("".join(p2p), "".join(topo))
    with _topo_lock:
        if len(_topo_cache) > 16:
            _topo_cache.clear()
        _topo_cache[key] = (peers, up, bodies[0], bodies[1])
    return bodies


# --- families -------------------------------------------------------------------------------
# Every family's name, type and help come from its schema row (exporter/core/schema.py).


def _emit(out: _Out, name: str, body: str) -> None:
    f = FAMILY_BY_NAME[name]
    out.family(f.name, f.kind, f.help, body, f.unit)


_process: list[Any] = []  # prometheus_client's ProcessCollector, made on first use


def _process_families(out: _Out) -> None:
    """process_* of the exporter itself (CPU, memory, start time, file descriptors) from /proc/self,
    with the schema's names and help; nothing where /proc is missing."""
    if not _process:
        from prometheus_client import ProcessCollector

        _process.append(ProcessCollector(registry=None))
    for m in _process[0].collect():
        for s in m.samples:
            if s.name in FAMILY_BY_NAME:
                _emit(out, s.name, f"{s.name} {num(float(s.value))}\n")


def _gpu_families(out: _Out, snap: Snapshot, fields: FieldFilter) -> None:
    hook = snap.gpu_labels
    rows: list[tuple[Collection, GpuReading, str]] = []
    for coll in snap.collections:
        for r in coll.gpus:
            base = f'gpu="{r.index}",uuid="{esc(r.uuid)}"'
            if hook is not None:
                extra_labels = hook(r)
                if extra_labels:
                    base += "," + labelstr(extra_labels)
            rows.append((coll, r, base))

    if fields.exposed("gpu_info"):  # labels in the row's order, each the reading's attribute of that name
        info = FAMILY_BY_NAME["gpu_info"].labels
        _emit(out, "gpu_info", "".join(
            f'gpu_info{{gpu="{r.index}",uuid="{esc(r.uuid)}",'
            + ",".join(f'{label}="{esc(_info_value(c, r, label))}"' for label in info) + "} 1\n"
            for c, r, _ in rows))
    if fields.exposed("gpu_up"):
        _emit(out, "gpu_up", "".join(f"gpu_up{{{b}}} {1 if r.up else 0}\n" for _, r, b in rows))

    live = [(r, b) for _, r, b in rows if r.up]
    nums = _NUMS
    for fam in GPU_FAMILIES:
        if not fields.exposed(fam.name):
            continue
        name, attr = fam.name, fam.attr
        lines: list[str] = []
        if not fam.labels:
            for r, b in live:
                v = getattr(r, attr)
                if v is not None:
                    lines.append(f"{name}{{{b}}} {nums.get(v) or _num_cached(v)}\n")
        else:
            labels, prefixes = fam.labels, _PREFIXES
            for r, b in live:
                for key, v in getattr(r, attr).items():
                    p = prefixes.get((name, b, key)) or _keyed_prefix(name, labels, b, key)
                    lines.append(f"{p}{nums.get(v) or _num_cached(v)}\n")
        out.family(name, fam.kind, fam.help, "".join(lines), fam.unit)

    mig_hook = snap.mig_labels
    for fam in MIG_FAMILIES:
        if not fields.exposed(fam.name):
            continue
        lines = []
        for r, b in live:
            for mig in r.mig:
                v = getattr(mig, fam.attr)
                if v is None:
                    continue
                ci = "" if mig.compute_instance_id is None else str(mig.compute_instance_id)
                mb = b
                if mig_hook is not None and not (hook is not None and hook(r)):
                    held = mig_hook(r, mig)  # the container holding this instance (the GPU has no one holder)
                    if held:
                        mb = f"{b},{labelstr(held)}"
                lines.append(f'{fam.name}{{{mb},gpu_instance="{mig.gpu_instance_id}",compute_instance="{ci}",'
                             f'mig_profile="{esc(mig.profile or "")}",mig_uuid="{esc(mig.uuid or "")}"}} {num(v)}\n')
        out.family(fam.name, fam.kind, fam.help, "".join(lines), fam.unit)

    want_p2p, want_topo = fields.exposed("gpu_p2p_supported"), fields.exposed("gpu_topology_level")
    p2p_body, topo_body = [], []
    for coll in snap.collections:
        if coll.peers and (want_p2p or want_topo):
            up = frozenset(r.index for r in coll.gpus if r.up)
            a, b2 = _topology_bodies(coll.peers, up, {r.index: r.uuid for r in coll.gpus})
            p2p_body.append(a)
            topo_body.append(b2)
    if want_p2p:
        _emit(out, "gpu_p2p_supported", "".join(p2p_body))
    if want_topo:
        _emit(out, "gpu_topology_level", "".join(topo_body))

    _event_families(out, snap, fields)

    if fields.exposed("gpu_field_unsupported"):
        _emit(out, "gpu_field_unsupported", "".join(
            f'gpu_field_unsupported{{{b},field="{esc(f)}"}} 1\n' for r, b in live for f in sorted(r.unsupported)))


# gpu_info labels whose GpuReading attribute has another name; "backend" is the collection's
_INFO_ATTR = {"cuda_version": "cuda_driver_version", "vbios_version": "firmware_version"}


def _info_value(c: Collection, r: GpuReading, label: str) -> str:
    if label == "backend":
        return c.backend
    v = getattr(r, _INFO_ATTR.get(label, label))
    return "" if v is None else str(v)


def _event_families(out: _Out, snap: Snapshot, fields: FieldFilter) -> None:
    xid: list[str] = []
    last: list[str] = []
    pci: list[str] = []
    vis: list[str] = []
    for coll in snap.collections:
        for (idx, uuid, code), n in sorted(coll.xid_counts.items()):
            xid.append(f'gpu_xid_errors_total{{gpu="{idx}",uuid="{esc(uuid)}",xid="{esc(code)}"}} {num(n)}\n')
        for (idx, uuid), ts in sorted(coll.xid_last_seconds.items()):
            last.append(f'gpu_xid_last_timestamp_seconds{{gpu="{idx}",uuid="{esc(uuid)}"}} {num(ts)}\n')
        if coll.pci_devices is not None:
            vendor = esc(_vendor_of(coll))
            pci.append(f'gpu_pci_devices{{vendor="{vendor}"}} {coll.pci_devices}\n')
            vis.append(f'gpu_visible_devices{{vendor="{vendor}"}} {len(coll.gpus)}\n')
    for name, body in (("gpu_xid_errors_total", xid), ("gpu_xid_last_timestamp_seconds", last),
                       ("gpu_pci_devices", pci), ("gpu_visible_devices", vis)):
        if fields.exposed(name):
            _emit(out, name, "".join(body))


def _vendor_of(coll: Collection) -> str:
    if coll.gpus:
        return coll.gpus[0].vendor
    from exporter import backends

    cls = backends.registry().get(coll.backend)
    return cls.vendor if cls is not None else "unknown"


def _self_families(out: _Out, snap: Snapshot, fields: FieldFilter) -> None:
    h = snap.host
    _emit(out, "gpu_host_info",
          f'gpu_host_info{{node="{esc(h.node)}",cpu_model="{esc(h.cpu_model)}",kernel="{esc(h.kernel)}",'
          f'os="{esc(h.os)}"}} 1\n')
    _emit(out, "gpu_exporter_build_info",
          f'gpu_exporter_build_info{{version="{__version__}",python_version="{platform.python_version()}"}} 1\n')
    lines: dict[str, list[str]] = {n: [] for n in (
        "gpu_exporter_collector_success", "gpu_exporter_collector_duration_seconds",
        "gpu_exporter_collection_errors_total", "gpu_exporter_gpus", "gpu_exporter_last_success_timestamp_seconds",
        "gpu_exporter_collections_total", "gpu_exporter_collection_interval_seconds")}
    for name, st in sorted(snap.stats.items()):
        lab = f'backend="{esc(name)}"'
        lines["gpu_exporter_collector_success"].append(
            f"gpu_exporter_collector_success{{{lab}}} {1 if st.success else 0}\n")
        lines["gpu_exporter_collector_duration_seconds"].append(
            f"gpu_exporter_collector_duration_seconds{{{lab}}} {num(st.duration_seconds)}\n")
        lines["gpu_exporter_gpus"].append(f"gpu_exporter_gpus{{{lab}}} {st.gpus}\n")
        lines["gpu_exporter_collections_total"].append(
            f"gpu_exporter_collections_total{{{lab}}} {st.collections_total}\n")
        if st.last_success_seconds is not None:
            lines["gpu_exporter_last_success_timestamp_seconds"].append(
                f"gpu_exporter_last_success_timestamp_seconds{{{lab}}} {num(st.last_success_seconds)}\n")
        for kind, n in sorted(st.errors_total.items()):
            lines["gpu_exporter_collection_errors_total"].append(
                f'gpu_exporter_collection_errors_total{{{lab},kind="{esc(kind)}"}} {n}\n')
    for backend, every in sorted(snap.intervals.items()):
        lines["gpu_exporter_collection_interval_seconds"].append(
            f'gpu_exporter_collection_interval_seconds{{backend="{esc(backend)}"}} {num(every)}\n')
    for family_name, body in lines.items():
        _emit(out, family_name, "".join(body))
    _process_families(out)
    for m in snap.extra_families:
        fam = FAMILY_BY_NAME.get(m.name + "_total" if m.type == COUNTER and not m.name.endswith("_total")
                                 else m.name)
        if fam is None or fields.exposed(fam.name):  # plugin families are schema rows too (a test checks)
            _render_metric(out, m)


def render(snap: Snapshot, fields: FieldFilter, openmetrics: bool = False) -> bytes:
    """The Prometheus text 0.0.4 (or OpenMetrics 1.0) exposition of one snapshot."""
    out = _Out(openmetrics)
    _gpu_families(out, snap, fields)
    _self_families(out, snap, fields)
    if openmetrics:
        out.parts.append("# EOF\n")
    return utf8("".join(out.parts))


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """``text`` as valid UTF-8, whatever a vendor library or CLI handed us: a lone surrogate (an
    undecodable byte passed on as a surrogate escape, ``\\udcff`` in rocm-smi's JSON) becomes
    U+FFFD, so one bad string never fails a scrape. Every exposition goes through here, so no
    backend needs to clean its strings; the check costs nothing unless one is there."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode()
