"""Per-pod GPU utilisation and memory on shared GPUs, from per-process readings (``--per-process``).

Time-slicing, MPS and GKE time-sharing give one GPU to several pods; a GPU-level reading cannot
be split between them, but the driver reports each process (NVIDIA: process utilisation samples
and the running processes' memory; AMD: amdsmi's process list). This module maps each process
to its pod and sums per pod:

1. the backend fills :attr:`GpuReading.process_pids`, ``process_memory_by_pid`` and
   ``process_utilization_by_pid`` during its collection (vendor calls only);
2. the engine hands every finished collection to :meth:`ProcessAttribution.observe`, which
   only keeps a reference and wakes the background thread;
3. the thread reads each PID's cgroup from the host's ``/proc`` (``--proc-root``, mounted
   read-only; :mod:`exporter.k8s.cgroup`), maps the pod UID or container ID to pod and container
   through a watch on this node's Pods (:mod:`exporter.k8s.watch`, field selector
   ``spec.nodeName``), sums per pod and publishes an immutable view;
4. a scrape renders that view (:meth:`families`): dict reads, no file or API access.

So the per-pod series lag the GPU series by one collection. Rules:

- one series per (GPU, pod), never per PID; ``container`` is set when all of the pod's
  processes on that GPU are in one known container, else empty;
- a process outside any pod (its cgroup names none) counts under ``pod=""``, ``namespace=""``;
  a process in a pod this node's watch does not know (yet), or whose ``/proc`` entry is gone,
  is left out (counted in ``gpu_exporter_pod_processes``), never given a made-up pod;
- utilisation = the sum over the pod's processes, capped at 1; memory = the sum. Either is
  published only when every one of the pod's processes on that GPU has that reading: a
  reading the driver cannot give is absent, never 0.

Cost per build: one ``open``+``read`` of ``/proc/<pid>/cgroup`` per process and dict work,
O(processes); ``make bench`` measures 8 GPUs x 16 processes (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric

from exporter.core import schema
from exporter.core.readings import GpuReading
from exporter.k8s import cgroup

log = logging.getLogger(__name__)

DEFAULT_PROC_ROOT = "/proc"
STATUSES = ("in_pod", "outside_pod", "unknown_pod", "gone")
Holder = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class PodIndex:
    """This node's pods: by UID (and static pods' config hash) and by container ID."""

    by_uid: Mapping[str, tuple[str, str]]
    by_container: Mapping[str, Holder]

    def holder(self, ref: cgroup.CgroupRef) -> Holder | None:
        """The cgroup's pod, by its UID; the container only when the API lists that container ID
        in that very pod (a container ID another pod owns never moves a process to it)."""
        pod = self.by_uid.get(ref.pod_uid)
        if pod is None:
            return None
        if ref.container_id:
            hit = self.by_container.get(ref.container_id)
            if hit is not None and hit[:2] == pod:
                return hit
        return pod[0], pod[1], ""


EMPTY_INDEX = PodIndex({}, {})


_STATUS_KEYS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
_MIRROR = "kubernetes.io/config.mirror"
MAX_CONTAINERS = 256  # per pod, every kind together: far above any real pod
_MAX_TEXT = 512  # characters of a kept string: names are at most 253, container IDs about 80


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _text(v: Any) -> str:
    return v if isinstance(v, str) and len(v) <= _MAX_TEXT else ""


def pod_summary(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`index_pods` reads of a Pod, and nothing else: name, namespace, UID, the static
    pod's mirror hash, and each container's name and ID (at most :data:`MAX_CONTAINERS`). The pod
    watch keeps only this (``Watcher(keep=...)``), so a pod of a megabyte of spec, environment or
    annotations costs a few hundred bytes here. Same shape as the API's, so either indexes alike."""
    meta = _mapping(obj.get("metadata"))
    ann = _mapping(meta.get("annotations"))
    kept_meta: dict[str, Any] = {k: _text(meta.get(k)) for k in ("name", "namespace", "uid")}
    if _text(ann.get(_MIRROR)):
        kept_meta["annotations"] = {_MIRROR: ann[_MIRROR]}
    status = _mapping(obj.get("status"))
    kept_status: dict[str, list[dict[str, str]]] = {}
    room = MAX_CONTAINERS
    for key in _STATUS_KEYS:
        entries = status.get(key)
        if not isinstance(entries, list):
            continue
        for cs in entries[:room]:
            if isinstance(cs, Mapping) and _text(cs.get("containerID")):
                kept_status.setdefault(key, []).append({"name": _text(cs.get("name")),
                                                        "containerID": cs["containerID"]})
        room -= min(room, len(entries))
    return {"metadata": kept_meta, "status": kept_status}


def index_pods(objects: Mapping[str, Any]) -> PodIndex:
    """The :class:`PodIndex` of Pod objects (API JSON) keyed by UID."""
    by_uid: dict[str, tuple[str, str]] = {}
    by_container: dict[str, Holder] = {}
    for obj in objects.values():
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if not name:
            continue
        uid = str(meta.get("uid") or "").lower()
        if uid:
            by_uid[uid] = (ns, name)
        mirror = (meta.get("annotations") or {}).get("kubernetes.io/config.mirror")
        if isinstance(mirror, str) and mirror:
            by_uid[mirror.lower()] = (ns, name)  # a static pod's cgroup carries its config hash
        status = obj.get("status") or {}
        for key in _STATUS_KEYS:
            for cs in status.get(key) or ():
                cid = str(cs.get("containerID") or "")
                if "://" in cid:  # containerd://<id>, cri-o://<id>, docker://<id>
                    by_container[cid.split("://", 1)[1].lower()] = (ns, name, str(cs.get("name") or ""))
    return PodIndex(by_uid, by_container)


@dataclass(frozen=True)
class PodReading:
    utilization: float | None
    memory: float | None


@dataclass(frozen=True)
class View:
    """One build: per GPU (index, uuid), per holder, the pod's readings; process counts by status."""

    gpus: tuple[tuple[str, str, tuple[tuple[Holder, PodReading], ...]], ...]
    processes: Mapping[str, int]


EMPTY_VIEW = View((), dict.fromkeys(STATUSES, 0))


def build(readings: Iterable[GpuReading], index: PodIndex, proc_root: str = DEFAULT_PROC_ROOT) -> View:
    """The per-pod view of one collection (reads ``<proc_root>/<pid>/cgroup`` once per PID)."""
    counts = dict.fromkeys(STATUSES, 0)
    where: dict[int, Holder | None] = {}  # pid -> holder; None: left out
    out = []
    for r in readings:
        if r.process_pids is None or not r.up:
            continue
        pods: dict[tuple[str, str], list[Any]] = {}  # (ns, pod) -> [containers, util, util_ok, mem, mem_ok]
        utils, mems = r.process_utilization_by_pid, r.process_memory_by_pid
        for pid in r.process_pids:
            if pid not in where:
                ref = cgroup.read(proc_root, pid)
                if ref is False:
                    holder, status = None, "gone"
                elif ref is None:
                    holder, status = ("", "", ""), "outside_pod"
                else:
                    holder = index.holder(ref)
                    status = "in_pod" if holder is not None else "unknown_pod"
                where[pid] = holder
                counts[status] += 1
            holder = where[pid]
            if holder is None:
                continue
            acc = pods.setdefault(holder[:2], [set(), 0.0, True, 0.0, True])
            acc[0].add(holder[2])
            u = None if utils is None else utils.get(pid)
            if u is None:
                acc[2] = False
            else:
                acc[1] += u
            m = mems.get(pid)
            if m is None:
                acc[4] = False
            else:
                acc[3] += m
        rows = []
        for (ns, pod), (ctrs, util, util_ok, mem, mem_ok) in sorted(pods.items()):
            container = next(iter(ctrs)) if len(ctrs) == 1 else ""
            rows.append(((ns, pod, container), PodReading(min(util, 1.0) if util_ok else None,
                                                          mem if mem_ok else None)))
        out.append((str(r.index), r.uuid, tuple(rows)))
    return View(tuple(out), counts)


def render(view: View) -> list[Metric]:
    util = schema.metric("gpu_pod_utilization_ratio")  # name, help and labels: the schema rows'
    mem = schema.metric("gpu_pod_memory_used_bytes")
    for gpu, uuid, rows in view.gpus:
        for (ns, pod, container), reading in rows:
            labels = [gpu, uuid, pod, ns, container]
            if reading.utilization is not None:
                util.add_metric(labels, reading.utilization)
            if reading.memory is not None:
                mem.add_metric(labels, reading.memory)
    procs = schema.metric("gpu_exporter_pod_processes")
    for status in STATUSES:
        procs.add_metric([status], float(view.processes.get(status, 0)))
    return [util, mem, procs]


class ProcessAttribution:
    """Background per-pod builds; ``pods`` is a started :class:`~exporter.k8s.watch.Watcher` source
    of this node's Pods, or None where no API is configured (then only processes outside any pod
    are attributed)."""

    def __init__(self, proc_root: str = DEFAULT_PROC_ROOT) -> None:
        self.proc_root = proc_root
        self._index = EMPTY_INDEX
        self._view = EMPTY_VIEW
        self._pending: list[GpuReading] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- inputs -------------------------------------------------------------------------------

    def pods_changed(self, objects: Mapping[str, Any]) -> None:
        """The pod watch's callback: a new index (the next build uses it)."""
        self._index = index_pods(objects)
        self._wake.set()

    def observe(self, readings: list[GpuReading]) -> None:
        """The engine's observer: keep the collection, wake the thread; O(1), no I/O."""
        self._pending = readings
        self._wake.set()

    # --- output (scrape path) -------------------------------------------------------------------

    def families(self) -> list[Metric]:
        return render(self._view)

    # --- thread -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pod-processes", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._thread = None

    def _loop(self) -> None:
        last: list[GpuReading] | None = None
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            readings = self._pending if self._pending is not None else last
            if readings is None:
                continue
            self._pending, last = None, readings
            try:
                self._view = build(readings, self._index, self.proc_root)
            except Exception:  # a bad process table must not stop later builds
                log.exception("per-pod GPU attribution failed")
