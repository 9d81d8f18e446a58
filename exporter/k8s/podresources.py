"""GPU-to-pod attribution from the kubelet pod-resources API (``v1.PodResourcesLister/List``).

A daemon thread lists the kubelet's device allocations every ``interval`` seconds over one
long-lived gRPC channel on the kubelet's unix socket and publishes an immutable snapshot.
Scrapes only read that snapshot: :meth:`PodAttribution.labels_for` is a handful of dict
lookups and never waits for the kubelet. (No CLI shows this per device: ``kubectl describe
node`` gives only counts; nvidia-smi/amd-smi know processes, not pods.)

Which resource names and DRA drivers are GPUs, and of which vendor, is what the backends
declare (``Backend.kubernetes``, :mod:`exporter.core.k8s_names`), given as ``resources``: this
module names no vendor. Device IDs understood (after stripping a time-slicing replica suffix ``::N``):

- a GPU UUID (``GPU-...``, NVIDIA device plugin default) or any other opaque ID, compared
  case-insensitively with :attr:`GpuReading.uuid`;
- a PCI bus ID (``0000:3b:00.0``, ``0000:3B:00.0``, ``3b:00.0``, ``00000000:3B:00.0``;
  AMD device plugin), compared in canonical form with :attr:`GpuReading.pci_bus_id`;
- an index (``0``; NVIDIA ``deviceIDStrategy: index``), or a vendor's declared index prefix
  (GKE's ``nvidiaN``) -> index N;
- MIG: ``MIG-<uuid>`` -> the GPU whose :attr:`GpuReading.mig` lists that UUID;
  ``MIG-GPU-<uuid>/<gi>/<ci>`` -> GPU ``GPU-<uuid>``; index strategy ``<gpu>:<mig>`` and GKE
  ``nvidiaN/<partition>`` -> GPU index N; GKE time-sharing ``nvidiaN/vgpuK`` -> GPU N.

Dynamic Resource Allocation (``ContainerResources.dynamic_resources``): each claimed device
``(driver, pool, device name)`` of a declared GPU DRA driver is looked up in this node's
ResourceSlices (:mod:`exporter.k8s.resourceslices`, given as ``dra``) and keyed like a device
plugin ID: by ``uuid``, by MIG ``parentUUID`` + ``profile``, or by PCI bus id. Without ``dra``
those devices are counted as ignored.

A GPU gets ``pod``/``namespace``/``container`` labels only when every allocation on it
belongs to one container and none of them is a MIG slice; otherwise the sharing is
described by ``gpu_allocation_info`` only (see docs/attribution.md). A MIG instance's own
series get the labels of the one container holding that instance (:meth:`PodAttribution.mig_labels_for`).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from exporter.core import schema
from exporter.core.k8s_names import GpuResources
from exporter.core.pci import canonical_bus_id
from exporter.core.readings import GpuReading, MigReading

if TYPE_CHECKING:
    from exporter.k8s.resourceslices import DraDevice

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

# Error kinds (label ``kind`` of gpu_exporter_pod_resources_errors_total), all pre-set to 0.
ERROR_KINDS = (
    "socket_missing",  # the socket file does not exist (directory not mounted, kubelet down)
    "not_a_socket",  # the path exists but is not a unix socket
    "permission_denied",  # connect(2) needs write permission on the socket
    "timeout",  # List did not answer within ``timeout`` (hung kubelet)
    "unavailable",  # nothing listens on the socket, or the connection broke
    "too_large",  # the response exceeded ``max_message_bytes``
    "unimplemented",  # kubelet without pod-resources v1
    "error",  # anything else
)
_KIND_BY_CODE = {
    "DEADLINE_EXCEEDED": "timeout",
    "UNAVAILABLE": "unavailable",
    "RESOURCE_EXHAUSTED": "too_large",
    "UNIMPLEMENTED": "unimplemented",
    "PERMISSION_DENIED": "permission_denied",
    "CANCELLED": "unavailable",
}
_LOCAL_KINDS = frozenset({"socket_missing", "not_a_socket", "permission_denied"})
_HINTS = {
    "socket_missing": "mount the kubelet's pod-resources directory into the exporter pod (read-only)",
    "permission_denied": "connecting to a unix socket needs write permission on it; the kubelet's "
                         "socket belongs to root",
    "too_large": "raise max_message_bytes",
    "unimplemented": "the kubelet does not serve pod-resources v1 (Kubernetes 1.20+)",
}

_REMEMBER = 256  # resource names / device IDs logged once; bounded so churn cannot grow memory

_REPLICA = re.compile(r"::\d+$")  # NVIDIA device plugin time-slicing / MPS replica: "GPU-...::3"
_INDEX = re.compile(r"(\d+)(?::(\d+))?")  # "0", or index-strategy MIG "<gpu>:<mig>"

Key = tuple[str, ...]
DraResolver = Callable[[str, str, str], "DraDevice | None"]  # (driver, pool, device) -> keys


def classify_resource(name: str, resources: GpuResources) -> tuple[str, bool] | None:
    """(vendor, is MIG resource) for a GPU resource name, or None for anything else."""
    return resources.classify(name)


def parse_device_id(device_id: str, vendor: str, resources: GpuResources) -> tuple[Key, bool] | None:
    """The GPU lookup key for a device plugin ID, and whether the ID is a slice (MIG partition).

    ``vendor`` qualifies index keys, which are only unique per vendor; ``resources`` holds the
    vendors' index prefixes (GKE's ``nvidiaN``). None: empty ID.
    """
    s = _REPLICA.sub("", device_id.strip())
    low = s.lower()
    if not low:
        return None
    if low.startswith("mig-gpu-"):  # pre-R470 MIG ID: MIG-GPU-<parent uuid>/<gi>/<ci>
        return ("uuid", low[len("mig-"):].split("/", 1)[0]), True
    if low.startswith("mig-"):
        return ("mig", low), True
    prefixed = resources.prefixed_index(low)
    if prefixed is not None:
        owner, index, part = prefixed
        return ("index", owner, str(index)), part is not None and not part.startswith("vgpu")
    m = _INDEX.fullmatch(low)
    if m is not None:
        return ("index", vendor, str(int(m.group(1)))), m.group(2) is not None
    pci = canonical_bus_id(low)
    if pci is not None:
        return ("pci", pci), False
    return ("uuid", low), False


def reading_keys(r: GpuReading, vendors: tuple[str, ...]) -> list[Key]:
    """Every key a device ID for this GPU (or one of its MIG instances) can parse to.

    ``vendors``: those that declare Kubernetes names (:attr:`GpuResources.vendors`)."""
    keys: list[Key] = [("uuid", r.uuid.lower())]
    if r.pci_bus_id:
        pci = canonical_bus_id(r.pci_bus_id)
        if pci is not None:
            keys.append(("pci", pci))
    # A simulated GPU stands in for any vendor (end-to-end tests without hardware).
    keys.extend(("index", v, str(r.index)) for v in ((r.vendor,) if r.vendor in vendors else vendors))
    keys.extend(("mig", m.uuid.lower()) for m in r.mig if m.uuid)
    keys.extend(_mig_profile_keys(r).values())
    return keys


def _mig_profile_keys(r: GpuReading) -> dict[int, Key]:
    """``id(mig) -> ("migp", parent uuid, profile)`` for MIG instances whose profile is unique on the GPU.

    A DRA MIG device names its parent GPU and profile; two instances of one profile on one GPU
    cannot be told apart that way, so neither gets this key (the device's own uuid still maps).
    """
    seen: dict[str, list[MigReading]] = {}
    for m in r.mig:
        if m.profile:
            seen.setdefault(m.profile.strip().lower(), []).append(m)
    parent = r.uuid.lower()
    return {id(ms[0]): ("migp", parent, p) for p, ms in seen.items() if len(ms) == 1}


def mig_keys(r: GpuReading, m: MigReading) -> list[Key]:
    """The keys of one MIG instance ``m`` of GPU ``r``."""
    keys: list[Key] = [("mig", m.uuid.lower())] if m.uuid else []
    migp = _mig_profile_keys(r).get(id(m))
    if migp is not None:
        keys.append(migp)
    return keys


@dataclass(frozen=True)
class Allocation:
    """One device ID allocated to one container, as the kubelet reported it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: str
    slice: bool  # a MIG partition: a fraction of the GPU, never the whole of it
    claim: str = ""  # DRA: the ResourceClaim's name and namespace; "" for device plugins
    claim_namespace: str = ""

    @property
    def holder(self) -> tuple[str, str, str]:
        return self.namespace, self.pod, self.container


@dataclass(frozen=True)
class _View:
    """One successful List, indexed for lookups; replaced whole, never mutated."""

    taken: float  # time.monotonic() of the answer
    by_key: dict[Key, tuple[Allocation, ...]]
    allocations: tuple[Allocation, ...]
    ignored_devices: int  # devices of resources that are not GPUs


_EMPTY = _View(taken=float("-inf"), by_key={}, allocations=(), ignored_devices=0)


def _lookup(view: _View, keys: Iterable[Key]) -> list[Allocation]:
    out: list[Allocation] = []
    seen: set[int] = set()
    for key in keys:
        for a in view.by_key.get(key, ()):
            if id(a) not in seen:  # a DRA device may sit under two keys of one GPU
                seen.add(id(a))
                out.append(a)
    return out


def _match(view: _View, r: GpuReading, vendors: tuple[str, ...]) -> list[Allocation]:
    return _lookup(view, reading_keys(r, vendors))


def _holder_labels(allocs: list[Allocation], slices_ok: bool) -> dict[str, str]:
    if not allocs:
        return {}
    first = allocs[0]
    for a in allocs:
        if (a.slice and not slices_ok) or a.holder != first.holder:
            return {}
    return {"pod": first.pod, "namespace": first.namespace, "container": first.container}


class PodAttribution:
    """Which pod, namespace and container hold each GPU, from the kubelet (refreshed in the background).

    ``interval`` seconds between List calls; ``timeout`` seconds per call;
    ``max_message_bytes`` the largest List answer accepted (gRPC's default is 4 MiB, which
    a busy node exceeds); ``max_backoff`` the longest wait between retries after failures;
    ``resources`` the backends' Kubernetes names (``exporter.backends.gpu_resources()``; without
    them no resource is a GPU).
    The snapshot is served for at most ``max(3 * interval, interval + 2 * timeout)`` seconds
    after the last successful List; after that no pod label is served.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        interval: float = 10.0,
        timeout: float = 5.0,
        max_message_bytes: int = 64 * 2**20,
        max_backoff: float = 60.0,
        dra: DraResolver | None = None,
        resources: GpuResources | None = None,
    ) -> None:
        if not socket_path:
            raise ValueError("pod attribution: socket_path is empty")
        for name, value in (("interval", interval), ("timeout", timeout), ("max_backoff", max_backoff)):
            if not value > 0:
                raise ValueError(f"pod attribution: {name} must be > 0 seconds, got {value!r}")
        if max_message_bytes < 1024:
            raise ValueError(f"pod attribution: max_message_bytes must be >= 1024, got {max_message_bytes!r}")
        self.socket_path = os.path.abspath(socket_path)
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.max_backoff = max(float(max_backoff), self.interval)
        self.max_age = max(3 * self.interval, self.interval + 2 * self.timeout)

        self._view = _EMPTY
        self._gpus: list[GpuReading] | None = None  # None: update_gpus() never called
        self._lock = threading.Lock()  # guards the stats and the channel, never held during a call
        self._errors: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
        self._last_success: float | None = None  # unix time
        self._last_duration: float | None = None
        self._failing: str | None = None  # error kind of the current outage, None when healthy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grpc: Any = None
        self._pb2: Any = None
        self._stub_class: Any = None
        self._channel: Any = None
        self._list: Any = None
        self._socket_ino: int | None = None
        self._unknown_resources: set[str] = set()
        self._unmapped_logged: set[str] = set()
        self._dra = dra
        self._resources = resources if resources is not None else GpuResources()
        self._vendors = self._resources.vendors
        self._known: frozenset[Key] = frozenset()  # keys of the GPUs last given to update_gpus()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Import grpc and start the background thread; returns at once, never raises for the kubelet."""
        if self._thread is not None:
            return
        try:
            # Lazy: `gpu-exporter serve` without attribution never loads grpc/protobuf.
            self._grpc = importlib.import_module("grpc")
            self._pb2 = importlib.import_module("exporter.k8s.proto.podresources_pb2")
            grpc_stubs = importlib.import_module("exporter.k8s.proto.podresources_pb2_grpc")
        except ImportError as exc:
            with self._lock:
                self._errors["error"] += 1
            log.error("pod attribution disabled: %s (install the k8s extra: .venv/bin/pip install -e '.[k8s]' "
                      "in a checkout)", exc)
            return
        self._stub_class = grpc_stubs.PodResourcesListerStub
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pod-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a call in flight is cancelled by closing the channel."""
        self._stop.set()
        self._close()
        thread = self._thread
        if thread is not None:
            thread.join(self.timeout + 1.0)
        self._thread = None

    # --- scrape path -------------------------------------------------------------------------

    def labels_for(self, reading: GpuReading) -> dict[str, str]:
        """``{"pod", "namespace", "container"}`` for a GPU held by exactly one container, else ``{}``.

        Shared GPUs (time-slicing, MPS, MIG slices) get no pod labels: their allocations are
        in ``gpu_allocation_info``. Lock-free; never waits for the kubelet.
        """
        view = self._view
        if time.monotonic() - view.taken > self.max_age:
            return {}
        return _holder_labels(_match(view, reading, self._vendors), slices_ok=False)

    def mig_labels_for(self, reading: GpuReading, mig: MigReading) -> dict[str, str]:
        """``{"pod", "namespace", "container"}`` of the one container holding MIG instance ``mig``, else ``{}``.

        The instance is found by its MIG UUID (device plugin ``MIG-<uuid>``, DRA ``uuid``) or by its
        parent GPU and profile (DRA ``parentUUID`` + ``profile``). Lock-free.
        """
        view = self._view
        if time.monotonic() - view.taken > self.max_age:
            return {}
        return _holder_labels(_lookup(view, mig_keys(reading, mig)), slices_ok=True)

    def update_gpus(self, readings: Iterable[GpuReading]) -> None:
        """The GPUs of the latest collection (for gpu_allocation_info); call before :meth:`families`."""
        self._gpus = list(readings)
        self._known = frozenset(k for r in self._gpus for k in reading_keys(r, self._vendors))

    def families(self) -> list[Metric]:
        """``gpu_allocation_info`` for the GPUs last given to :meth:`update_gpus`, plus self-metrics."""
        with self._lock:
            view = self._view
            errors = dict(self._errors)
            last_success = self._last_success
            duration = self._last_duration
        fresh = time.monotonic() - view.taken <= self.max_age

        # name, help and labels are the schema rows' (the labels in the row's order)
        info = schema.metric("gpu_allocation_info")
        devices = schema.metric("gpu_exporter_pod_resources_devices")
        gpus = self._gpus
        if fresh:
            devices.add_metric(["ignored"], float(view.ignored_devices))
            if gpus is not None:
                matched: set[int] = set()
                for r in gpus:
                    allocs = _match(view, r, self._vendors)
                    shared = str(len(allocs))
                    for a in allocs:
                        matched.add(id(a))
                        info.add_metric([str(r.index), r.uuid, a.pod, a.namespace, a.container, a.resource,
                                         a.device, shared, a.claim, a.claim_namespace], 1.0)
                unmapped = [a for a in view.allocations if id(a) not in matched]
                devices.add_metric(["allocated"], float(len(view.allocations) - len(unmapped)))
                devices.add_metric(["unmapped"], float(len(unmapped)))
                self._log_unmapped(unmapped)

        up = schema.metric("gpu_exporter_pod_attribution_up", 1.0 if fresh else 0.0)
        errs = schema.metric("gpu_exporter_pod_resources_errors_total")
        for kind, n in errors.items():
            errs.add_metric([kind], float(n))
        out: list[Metric] = [info, up, errs, devices]
        if last_success is not None:
            out.append(schema.metric("gpu_exporter_pod_resources_last_success_timestamp_seconds", last_success))
        if duration is not None:
            out.append(schema.metric("gpu_exporter_pod_resources_list_duration_seconds", duration))
        return out

    # --- background thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            began = time.monotonic()
            kind = self._poll()
            if kind is None:
                failures = 0
                delay = self.interval
            elif kind in _LOCAL_KINDS:
                delay = self.interval  # a stat() is cheap: notice the socket coming back soon
            else:
                failures += 1
                delay = min(self.interval * 2 ** min(failures - 1, 16), self.max_backoff)
            self._stop.wait(max(0.0, delay - (time.monotonic() - began)))
        self._close()

    def _poll(self) -> str | None:
        """One List; publishes a new view. Returns the error kind, or None on success."""
        problem = self._check_socket()
        if problem is not None:
            self._close()
            return self._failed(*problem)
        grpc = self._grpc
        try:
            call = self._connect()
            began = time.monotonic()
            resp = call(self._pb2.ListPodResourcesRequest(), timeout=self.timeout)
            duration = time.monotonic() - began
            view = self._index(resp)
        except grpc.RpcError as exc:
            self._close()
            if self._stop.is_set():
                return "unavailable"  # stop() cancelled the call: not an outage
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            name = getattr(code, "name", "UNKNOWN")
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            return self._failed(_KIND_BY_CODE.get(name, "error"), f"{name}: {details}")
        except Exception as exc:  # noqa: BLE001 - nothing may kill the thread; the outage is reported
            self._close()
            return self._failed("error", f"{type(exc).__name__}: {exc}")
        with self._lock:  # the view and its figures change together (families() reads them under the lock)
            self._view = view
            self._last_success = time.time()
            self._last_duration = duration
            recovered = self._failing
            self._failing = None
        if recovered is not None:
            log.info("pod attribution back: kubelet pod-resources at %s answers again", self.socket_path)
        return None

    def _check_socket(self) -> tuple[str, str] | None:
        path = self.socket_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "socket_missing", f"{path} does not exist"
        except PermissionError:
            return "permission_denied", f"{path}: cannot stat (permission denied on a parent directory)"
        except OSError as exc:
            return "socket_missing", f"{path}: {exc.strerror}"
        if not stat.S_ISSOCK(st.st_mode):
            return "not_a_socket", f"{path} is not a unix socket"
        if not os.access(path, os.W_OK):
            return "permission_denied", f"{path} is not writable by uid {os.getuid()}"
        if self._socket_ino is not None and st.st_ino != self._socket_ino:
            self._close()  # the kubelet restarted and made a new socket: start a fresh connection
        self._socket_ino = st.st_ino
        return None

    def _connect(self) -> Any:
        with self._lock:
            if self._list is None:
                self._channel = self._grpc.insecure_channel(
                    "unix://" + self.socket_path,
                    options=[
                        ("grpc.max_receive_message_length", self.max_message_bytes),
                        ("grpc.enable_http_proxy", 0),  # never route the unix socket through $http_proxy
                    ],
                )
                self._list = self._stub_class(self._channel).List
            return self._list

    def _close(self) -> None:
        with self._lock:
            channel, self._channel, self._list = self._channel, None, None
            self._socket_ino = None
        if channel is not None:
            try:
                channel.close()
            except Exception:  # closing a broken channel may fail; it is gone either way
                log.debug("closing the pod-resources channel failed", exc_info=True)

    def _failed(self, kind: str, message: str) -> str:
        with self._lock:
            self._errors[kind] = self._errors.get(kind, 0) + 1
            first = self._failing is None
            self._failing = kind
        if first:
            hint = _HINTS.get(kind)
            log.warning(
                "pod attribution off: kubelet pod-resources %s (%s)%s; GPU metrics are still served, "
                "pod labels are dropped after %.0fs and come back when the kubelet answers",
                kind, message, f"; {hint}" if hint else "", self.max_age)
        else:
            log.debug("pod attribution still off: %s (%s)", kind, message)
        return kind

    def _index(self, resp: Any) -> _View:
        by_key: dict[Key, list[Allocation]] = {}
        allocations: list[Allocation] = []
        ignored = 0
        kinds: dict[str, tuple[str, bool] | None] = {}  # a busy node repeats a few names thousands of times
        for pod in resp.pod_resources:
            for ctr in pod.containers:
                for dev in ctr.devices:
                    resource = dev.resource_name
                    try:
                        kind = kinds[resource]
                    except KeyError:
                        kind = kinds[resource] = classify_resource(resource, self._resources)
                    if kind is None:
                        ignored += len(dev.device_ids)
                        self._note_unknown(resource)
                        continue
                    vendor, mig = kind
                    for device in dev.device_ids:
                        parsed = parse_device_id(device, vendor, self._resources)
                        if parsed is None:
                            continue
                        key, is_slice = parsed
                        a = Allocation(pod.namespace, pod.name, ctr.name, resource, device, is_slice or mig)
                        by_key.setdefault(key, []).append(a)
                        allocations.append(a)
                ignored += self._index_dra(pod, ctr, by_key, allocations)
        return _View(taken=time.monotonic(), by_key={k: tuple(v) for k, v in by_key.items()},
                     allocations=tuple(allocations), ignored_devices=ignored)

    def _index_dra(self, pod: Any, ctr: Any, by_key: dict[Key, list[Allocation]],
                   allocations: list[Allocation]) -> int:
        """Index one container's DRA devices; returns how many were ignored (not GPUs, or DRA off)."""
        ignored = 0
        gpu_drivers = self._resources.dra_drivers
        for claim in ctr.dynamic_resources:
            for cr in claim.claim_resources:
                driver = cr.driver_name
                if driver not in gpu_drivers or self._dra is None:
                    ignored += 1
                    self._note_unknown(driver if driver in gpu_drivers else f"{driver} (DRA driver)",
                                       "DRA attribution is off" if driver in gpu_drivers else None)
                    continue
                dev = self._dra(driver, cr.pool_name, cr.device_name)
                keys: tuple[Key, ...] = (("dra", driver, cr.pool_name, cr.device_name),)
                if dev is not None and dev.keys:
                    # the first key a GPU read here answers to (uuid before PCI bus id), else all of them
                    known = [k for k in dev.keys if k in self._known]
                    keys = tuple(known[:1]) or dev.keys
                a = Allocation(pod.namespace, pod.name, ctr.name, driver, f"{cr.pool_name}/{cr.device_name}",
                               dev is not None and dev.slice, claim.claim_name, claim.claim_namespace)
                for key in keys:
                    by_key.setdefault(key, []).append(a)
                allocations.append(a)
        return ignored

    def _note_unknown(self, resource: str, why: str | None = None) -> None:
        if resource in self._unknown_resources or len(self._unknown_resources) >= _REMEMBER:
            return
        self._unknown_resources.add(resource)
        log.info("pod attribution: ignoring resource %r (%s)", resource, why or "not a GPU resource name we know")

    def _log_unmapped(self, unmapped: list[Allocation]) -> None:
        for a in unmapped:
            if a.device in self._unmapped_logged or len(self._unmapped_logged) >= _REMEMBER:
                continue
            self._unmapped_logged.add(a.device)
            log.warning("pod attribution: device %r (%s) of %s/%s container %s matches no GPU this exporter "
                        "reads; it gets no pod labels", a.device, a.resource, a.namespace, a.pod, a.container)
