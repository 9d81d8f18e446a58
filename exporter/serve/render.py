"""Turn one collection snapshot into exposition bytes (Prometheus text and OpenMetrics).

Every family is written from its schema row (exporter/core/schema.py): name, type, help, unit,
labels, and the ``attr`` its value is read from, in the scope's object (a GPU's reading, a MIG
instance, a GPU pair, a collection, the host, a backend's self-metrics). Nothing here names a
family, so a new row is rendered with no change here (tests/unit/serve/test_render_rows.py).

Every render builds its families afresh from the snapshot (as a client_python custom
collector would), so no label set can go stale. We write the exposition ourselves rather
than through ``prometheus_client.generate_latest``: that costs ~4 us per sample, which at
8 GPUs (~1,400 samples) alone is several times our scrape budget. What repeats from one render
to the next is made once and kept, bounded: each row's ``# HELP``/``# TYPE`` header, each GPU's
label part of each sample (``family{gpu,uuid,link,...} ``, per GPU label string and key), and the
text of repeating values; the static topology block (quadratic in the GPU count) is rendered once
per driver initialisation. A sample then costs two dict lookups and one concatenation
(``python -m bench.render``).

Rendering happens once per collection and format: the ``/metrics`` route caches the bytes of
the engine's last snapshot (exporter/serve/http.py), and all scrapers of that collection share
them. Extra families from plugins (pod attribution) are ``prometheus_client`` Metric objects
and go through the same writer.
"""

from __future__ import annotations

import dataclasses
import platform
import threading
from collections.abc import Callable
from typing import Any

from exporter.core.host import process_readings
from exporter.core.options import FieldFilter
from exporter.core.readings import Collection, GpuReading, MigReading, PeerReading
from exporter.core.schema import FAMILIES, FAMILY_BY_NAME, Family
from exporter.core.snapshot import Snapshot
from exporter.core.version import VERSION
from exporter.platform.exposition import esc, header, labelstr, metric_text, num, row_name, utf8

# --- exposition primitives (the shared writer's, exporter/platform/exposition.py) -------------


def _pairs(labels: tuple[str, ...], key: Any) -> str:
    """``label="value",...`` for a keyed reading's key (a tuple key: one label each)."""
    if len(labels) == 1:
        return f'{labels[0]}="{esc(str(key))}"'
    return ",".join(f'{ln}="{esc(str(k))}"' for ln, k in zip(labels, key, strict=True))


class _Values(dict[float, str]):
    """value -> its text and the line's end (``"1\\n"``), for the values that repeat from one sample
    and one render to the next (0, 1, a clock, an error count): the formatting is the larger part of
    writing a sample. Bounded; NaN (never equal to itself) is not kept."""

    def __missing__(self, v: float) -> str:
        s = num(v) + "\n"
        if len(self) < _VALUES_MAX and v == v:
            self[v] = s
        return s


_VALUES_MAX = 8192
_VALUES = _Values()


class _Keyed(dict[Any, str]):
    """Reading key -> ``family{<GPU labels>,label="key"} `` for one family and one GPU label string:
    the label part of a keyed sample is the same from one render to the next (links, clocks,
    reasons), so it is escaped and joined once. Bounded: a churn of keys cannot grow it.

    ``last`` is the GPU's last (values, keys in order, text) of the family: most keyed readings (link
    error counters, link states, throttle reasons, ECC counts) do not change between collections,
    and equal values under the same keys in the same order give the same text, so the text is
    reused after one comparison."""

    __slots__ = ("head", "labels", "last")

    def __init__(self, head: str, labels: tuple[str, ...]) -> None:
        super().__init__()
        self.head = head
        self.labels = labels
        self.last: tuple[dict[Any, float], list[Any], str] | None = None  # replaced whole: renders may overlap

    def __missing__(self, key: Any) -> str:
        if len(self) >= _KEYS_MAX:
            self.clear()
        p = self[key] = f"{self.head}{_pairs(self.labels, key)}}} "
        return p


_KEYS_MAX = 4096  # keys of one family on one GPU (a 64-GPU NVLink node has about 200)


class _GpuText:
    """The cached sample prefixes of one GPU label string (``gpu="0",uuid="..."`` and any pod labels)."""

    __slots__ = ("base", "keyed", "scalar")

    def __init__(self, base: str) -> None:
        self.base = base
        self.scalar: dict[str, str] = {}  # family -> 'family{base} '
        self.keyed: dict[str, _Keyed] = {}  # family -> its _Keyed for this GPU

    def one(self, name: str) -> str:
        p = self.scalar.get(name)
        if p is None:
            p = self.scalar[name] = f"{name}{{{self.base}}} "
        return p

    def per_key(self, row: Family) -> _Keyed:
        k = self.keyed.get(row.name)
        if k is None:
            k = self.keyed[row.name] = _Keyed(f"{row.name}{{{self.base},", row.labels)
        return k


# GPU label string -> its texts (about 20 kB per NVLink GPU). Pod labels churn the strings: what
# the last render did not use is dropped once there are more than twice as many as it used (+16).
_GPU_TEXT: dict[str, _GpuText] = {}
_gpu_text_lock = threading.Lock()


def _gpu_text(base: str) -> _GpuText:
    t = _GPU_TEXT.get(base)
    if t is None:
        with _gpu_text_lock:
            t = _GPU_TEXT.setdefault(base, _GpuText(base))
    return t


def _gpu_text_prune(used: list[_GpuText]) -> None:
    if len(_GPU_TEXT) > 2 * len(used) + 16:
        keep = {t.base for t in used}
        with _gpu_text_lock:
            for base in [b for b in _GPU_TEXT if b not in keep]:
                del _GPU_TEXT[base]


# --- family headers -------------------------------------------------------------------------


# row name -> (text header, OpenMetrics header), made once per process
_HEADERS: dict[str, tuple[str, str]] = {
    f.name: (header(f.name, f.kind, f.help, f.unit, False), header(f.name, f.kind, f.help, f.unit, True))
    for f in FAMILIES}


class _Out:
    """Accumulates families in one format (text 0.0.4 or OpenMetrics 1.0)."""

    def __init__(self, openmetrics: bool, fields: FieldFilter) -> None:
        self.om = openmetrics
        self.fields = fields
        self.parts: list[str] = []

    def row(self, f: Family, body: str) -> None:
        if body:
            self.parts.append(_HEADERS[f.name][self.om])
            self.parts.append(body)

    def family(self, name: str, kind: str, help_: str, body: str, unit: str = "1") -> None:
        if body:
            self.parts.append(header(name, kind, help_, unit, self.om))
            self.parts.append(body)


# --- the rows, by where their values come from ------------------------------------------------


def _is_info(f: Family) -> bool:
    return f.name.endswith("_info")


_SET_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuReading) if f.default_factory is set)


def _rows(scope: str, *, every_backend: bool | None = None, sets: bool = False) -> tuple[Family, ...]:
    return tuple(f for f in FAMILIES if f.scope == scope and (f.attr or _is_info(f))
                 and (every_backend is None or f.every_backend == every_backend)
                 and (f.attr in _SET_FIELDS) == sets)


# The exposition order: a GPU's identity, its readings, its MIG instances, GPU pairs, events,
# the bus, what a GPU could not read, the host, the exporter itself, plugins.
_GPU_ALL = _rows("gpu", every_backend=True)  # published for a GPU that is down too
_GPU_READ = _rows("gpu", every_backend=False)  # for a GPU that answered
_GPU_SETS = _rows("gpu", every_backend=False, sets=True)  # explanations: after the readings they explain
_MIG = _rows("mig")
_PEER = _rows("peer")
_EVENT = _rows("event")
_NODE = _rows("node")
_HOST = _rows("host")
_SELF = _rows("self")

# Labels whose value is an attribute of another name (any other label: the attribute of its name).
# A GPU info row's labels: "backend" is the collection's.
_INFO_ATTR: dict[str, Callable[[Any], object]] = {
    "cuda_version": lambda r: r.cuda_driver_version, "vbios_version": lambda r: r.firmware_version}
# A MIG row's labels, from its MigReading
_MIG_ATTR: dict[str, Callable[[Any], object]] = {
    "gpu_instance": lambda m: m.gpu_instance_id, "compute_instance": lambda m: m.compute_instance_id,
    "mig_profile": lambda m: m.profile, "mig_uuid": lambda m: m.uuid}


@dataclasses.dataclass(frozen=True)
class _Build:
    """The exporter's build, the object of the self scope's info rows."""

    version: str = VERSION
    python_version: str = platform.python_version()


_BUILD = _Build()


def _attr_text(obj: object, label: str, aliases: dict[str, Callable[[Any], object]]) -> str:
    alias = aliases.get(label)
    v = getattr(obj, label) if alias is None else alias(obj)
    return "" if v is None else str(v)


def _info_line(name: str, head: str, obj: object, labels: tuple[str, ...], coll: Collection | None = None) -> str:
    """An info family's one sample: its labels the attributes of ``obj`` (a GPU's "backend": its collection's)."""
    values = (coll.backend if coll is not None and ln == "backend" else _attr_text(obj, ln, _INFO_ATTR)
              for ln in labels)
    pairs = ",".join(f'{ln}="{esc(v)}"' for ln, v in zip(labels, values, strict=True))
    return f"{name}{{{head}{pairs}}} 1\n"


# --- GPUs, MIG, pairs ----------------------------------------------------------------------------


def _gpu_families(out: _Out, snap: Snapshot) -> None:
    exposed, values = out.fields.exposed, _VALUES
    hook = snap.gpu_labels
    gpus: list[tuple[Collection, GpuReading, _GpuText]] = []
    for coll in snap.collections:
        for r in coll.gpus:
            base = f'gpu="{r.index}",uuid="{esc(r.uuid)}"'
            if hook is not None:
                extra_labels = hook(r)
                if extra_labels:
                    base += "," + labelstr(extra_labels)
            gpus.append((coll, r, _gpu_text(base)))
    _gpu_text_prune([t for _, _, t in gpus])

    for f in _GPU_ALL:
        if exposed(f.name):
            if _is_info(f):  # the GPU's identity alone: pod labels are on its other series
                out.row(f, "".join(_info_line(f.name, f'gpu="{r.index}",uuid="{esc(r.uuid)}",', r, f.labels, c)
                                   for c, r, _ in gpus))
            else:
                out.row(f, _gpu_body(f, [(r, t) for _, r, t in gpus], values))

    live = [(r, t) for _, r, t in gpus if r.up]
    for f in _GPU_READ:
        if exposed(f.name):
            out.row(f, _gpu_body(f, live, values))

    _mig_families(out, snap, [(r, t) for r, t in live if r.mig])
    _peer_families(out, snap)
    _collection_families(out, snap)

    for f in _GPU_SETS:
        if exposed(f.name):
            one = values[1]
            out.row(f, "".join(t.per_key(f)[k] + one for r, t in live for k in sorted(getattr(r, f.attr))))


def _gpu_body(f: Family, gpus: list[tuple[GpuReading, _GpuText]], values: _Values) -> str:
    """One family's samples over ``gpus``: the hot loop of a render (two lookups and a join per sample)."""
    attr, name = f.attr, f.name
    if not f.labels:
        return "".join([t.one(name) + values[v] for r, t in gpus if (v := getattr(r, attr)) is not None])
    lines: list[str] = []
    for r, t in gpus:
        d = getattr(r, attr)
        if d:
            p = t.per_key(f)
            last = p.last
            # equal values have equal text (1 == 1.0: "1"); the keys' order too. No per-item objects:
            # they would cost more than the text, and wake the garbage collector.
            if last is not None and d == last[0] and list(d) == last[1]:
                lines.append(last[2])
            else:
                text = "".join([p[k] + values[v] for k, v in d.items()])
                p.last = (dict(d), list(d), text)  # a copy: a backend may hand out the same dict, changed
                lines.append(text)
    return "".join(lines)


def _mig_families(out: _Out, snap: Snapshot, gpus: list[tuple[GpuReading, _GpuText]]) -> None:
    hook, mig_hook = snap.gpu_labels, snap.mig_labels
    for f in _MIG:
        if not out.fields.exposed(f.name):
            continue
        lines = []
        for r, t in gpus:
            for mig in r.mig:
                v = getattr(mig, f.attr)
                if v is None:
                    continue
                mb = t.base
                if mig_hook is not None and not (hook is not None and hook(r)):
                    held = mig_hook(r, mig)  # the container holding this instance (the GPU has no one holder)
                    if held:
                        mb = f"{mb},{labelstr(held)}"
                lines.append(f"{f.name}{{{mb},{_mig_pairs(f.labels, mig)}}} {num(v)}\n")
        out.row(f, "".join(lines))


def _mig_pairs(labels: tuple[str, ...], mig: MigReading) -> str:
    return ",".join(f'{ln}="{esc(_attr_text(mig, ln, _MIG_ATTR))}"' for ln in labels)


_topo_lock = threading.Lock()
_topo_cache: dict[int, tuple[list[PeerReading], frozenset[int], tuple[str, ...]]] = {}


def _peer_bodies(peers: list[PeerReading], up: frozenset[int], uuids: dict[int, str]) -> tuple[str, ...]:
    """The body of each peer row; cached while the list is the same.

    Backends hand out the same static list object until the driver is re-initialised.
    """
    key = id(peers)
    with _topo_lock:
        hit = _topo_cache.get(key)
        if hit is not None and hit[0] is peers and hit[1] == up:
            return hit[2]
    bodies: list[list[str]] = [[] for _ in _PEER]
    for p in peers:
        if p.gpu not in up or p.peer not in up:
            continue  # a lost GPU publishes nothing, topology included
        base = f'gpu="{p.gpu}",uuid="{esc(uuids.get(p.gpu, ""))}",peer="{p.peer}"'
        for f, lines in zip(_PEER, bodies, strict=True):
            for k, v in getattr(p, f.attr).items():
                lines.append(f"{f.name}{{{base},{_pairs(f.labels, k)}}} {num(v)}\n")
    out = tuple("".join(lines) for lines in bodies)
    with _topo_lock:
        if len(_topo_cache) > 16:
            _topo_cache.clear()
        _topo_cache[key] = (peers, up, out)
    return out


def _peer_families(out: _Out, snap: Snapshot) -> None:
    wanted = [out.fields.exposed(f.name) for f in _PEER]
    if not any(wanted):
        return
    bodies: list[list[str]] = [[] for _ in _PEER]
    for coll in snap.collections:
        if coll.peers:
            up = frozenset(r.index for r in coll.gpus if r.up)
            for lines, body in zip(bodies, _peer_bodies(coll.peers, up, {r.index: r.uuid for r in coll.gpus}),
                                   strict=True):
                lines.append(body)
    for f, want, lines in zip(_PEER, wanted, bodies, strict=True):
        if want:
            out.row(f, "".join(lines))


# --- per collection: events, the bus -----------------------------------------------------------


def _collection_families(out: _Out, snap: Snapshot) -> None:
    for f in _EVENT:  # a dict keyed by (gpu, uuid, the row's labels)
        if out.fields.exposed(f.name):
            names = f.all_labels
            out.row(f, "".join(f"{f.name}{{{_pairs(names, k)}}} {num(n)}\n"
                               for coll in snap.collections for k, n in sorted(getattr(coll, f.attr).items())))
    scoped: dict[int, dict[str, str]] = {}  # a collection's node labels, made when first needed
    for f in _NODE:  # one value per backend's collection
        if out.fields.exposed(f.name):
            lines = []
            for i, coll in enumerate(snap.collections):
                v = getattr(coll, f.attr)
                if v is not None:
                    labels = scoped.get(i)
                    if labels is None:
                        labels = scoped[i] = {"vendor": _vendor_of(coll), "backend": coll.backend}
                    pairs = ",".join(f'{ln}="{esc(labels[ln])}"' for ln in f.all_labels)
                    lines.append(f"{f.name}{{{pairs}}} {num(v)}\n")
            out.row(f, "".join(lines))


def _vendor_of(coll: Collection) -> str:
    if coll.gpus:
        return coll.gpus[0].vendor
    from exporter import backends

    cls = backends.registry().get(coll.backend)
    return cls.vendor if cls is not None else "unknown"


# --- the host and the exporter itself -------------------------------------------------------------



def _self_families(out: _Out, snap: Snapshot) -> None:
    for f in _HOST:
        if out.fields.exposed(f.name):
            out.row(f, _info_line(f.name, "", snap.host, f.labels) if _is_info(f) else
                    "" if (v := getattr(snap.host, f.attr)) is None else f"{f.name} {num(v)}\n")
    backends = sorted(snap.stats.items())
    for f in _SELF:
        if not out.fields.exposed(f.name):
            continue
        if _is_info(f):
            out.row(f, _info_line(f.name, "", _BUILD, f.labels))
            continue
        lines = []
        for backend, st in backends:  # the first label names the backend, any further ones a dict's key
            v = getattr(st, f.attr)
            head = f'{f.name}{{{f.labels[0]}="{esc(backend)}"'
            if isinstance(v, dict):
                lines += [f"{head},{_pairs(f.labels[1:], k)}}} {num(n)}\n" for k, n in sorted(v.items())]
            elif v is not None:
                lines.append(f"{head}}} {num(v)}\n")
        out.row(f, "".join(lines))
    _process_families(out)
    for m in snap.extra_families:
        fam = FAMILY_BY_NAME.get(row_name(m))
        if fam is None or out.fields.exposed(fam.name):  # plugin families are schema rows too (a test checks)
            out.parts.append(metric_text(m, fam, out.om))


def _process_families(out: _Out) -> None:
    """process_* of the exporter itself (CPU, memory, start time, file descriptors) from /proc/self
    (core/host.py); nothing where /proc is missing."""
    for name, value in process_readings().items():
        f = FAMILY_BY_NAME.get(name)
        if f is not None:
            out.row(f, f"{name} {num(value)}\n")


def render(snap: Snapshot, fields: FieldFilter, openmetrics: bool = False) -> bytes:
    """The Prometheus text 0.0.4 (or OpenMetrics 1.0) exposition of one snapshot."""
    out = _Out(openmetrics, fields)
    _gpu_families(out, snap)
    _self_families(out, snap)
    if openmetrics:
        out.parts.append("# EOF\n")
    return utf8("".join(out.parts))
