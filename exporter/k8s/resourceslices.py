"""DRA devices of this node, from its ResourceSlices (``resource.k8s.io``), mapped to GPU lookup keys.

The kubelet's pod-resources API names a device allocated through Dynamic Resource Allocation
only by ``(driver, pool, device name)``. What that device *is* lives in the ResourceSlice the
driver published: its attributes. A background thread lists this node's slices and then
watches them (field selector ``spec.nodeName=<node>``), so a scrape never waits for the API
server; :meth:`ResourceSliceWatch.resolve` is one dict lookup.

A device is identified by the attributes its driver really publishes, never by its name (NVIDIA
names a GPU ``gpu-<minor>``, and the minor number is not the NVML index; neither driver publishes
an index). Which attributes those are is the vendor's declaration, beside its DRA driver's name
(``KubernetesNames.dra_attributes``, exporter/core/k8s_names.py, in its backend's file; the drivers'
own attribute names are cited there: nvml.py for NVIDIA/k8s-dra-driver-gpu, amdsmi.py for
ROCm/k8s-gpu-dra-driver); this module names none. A driver no backend declares is read by the
default names (``DraAttributes()``: a ``uuid``, Kubernetes' standard ``resource.kubernetes.io/pciBusID``).

Order: the device's ``uuid`` attribute, or for a slice (MIG) its own UUID and then its parent's UUID
+ ``profile``, then the PCI bus id; a partition's parent PCI bus id makes it a slice of that GPU.
``resource.k8s.io/v1beta1`` wraps a device's fields in ``basic``; ``v1beta2`` and ``v1`` do not. The
newest version the API server serves is used: v1 (Kubernetes 1.34+), v1beta2 (1.33), v1beta1 (1.32).

RBAC: ``get``, ``list`` and ``watch`` on ``resourceslices`` (cluster scope), nothing else.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.core.k8s_names import DraAttributes
from exporter.core.pci import canonical_bus_id

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
# Which DRA drivers' devices are GPUs, and which of their attributes say which GPU, is what the backends
# declare (``KubernetesNames.dra_drivers`` and ``dra_attributes``, exporter/core/k8s_names.py); the pod
# attribution counts the devices of other drivers (NICs, compute domains) as ignored, like non-GPU device
# plugin resources.
Identities = Mapping[str, DraAttributes]  # DRA driver -> its vendor's attributes (GpuResources.dra_attributes)
_DEFAULT = DraAttributes()  # a driver no backend declares

Key = tuple[str, ...]
DeviceId = tuple[str, str, str]  # (driver, pool, device name)


@dataclass(frozen=True)
class DraDevice:
    """What one published device is, as GPU lookup keys in order of preference."""

    keys: tuple[Key, ...]
    slice: bool  # a MIG instance or partition: a fraction of a GPU


def _attr_value(v: Any) -> str | None:
    if not isinstance(v, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in v and v[kind] is not None:
            return str(v[kind])
    return None


def device_attributes(device: Mapping[str, Any], driver: str) -> dict[str, str]:
    """A slice device's attributes as ``name -> value`` (any API version).

    Names qualified with the driver's own domain (``gpu.nvidia.com/uuid``) are the same
    attribute as the bare name and are stored bare.
    """
    fields = device.get("basic") if isinstance(device.get("basic"), Mapping) else device  # v1beta1
    attrs = fields.get("attributes") if isinstance(fields, Mapping) else None
    out: dict[str, str] = {}
    if not isinstance(attrs, Mapping):
        return out
    own = driver + "/"
    for name, v in attrs.items():
        value = _attr_value(v)
        if value is None or not isinstance(name, str):
            continue
        out[name[len(own):] if name.startswith(own) else name] = value
    return out


def _first(attrs: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The first of ``names`` the device carries (stripped), or ""."""
    return next((value for value in (attrs.get(n, "").strip() for n in names) if value), "")


def _first_bus_id(attrs: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that holds a PCI bus id (canonical), or None."""
    return next((pci for pci in (canonical_bus_id(attrs.get(n, "").strip()) for n in names) if pci), None)


def identify(attrs: Mapping[str, str], names: DraAttributes) -> DraDevice | None:
    """Lookup keys for a device from its attributes, read by its vendor's ``names``; None when nothing
    identifies a GPU."""
    keys: list[Key] = []
    uuid = _first(attrs, names.uuid).lower()
    parent = _first(attrs, names.parent_uuid).lower()
    if parent:  # a slice of a GPU known by its UUID (NVIDIA MIG device)
        if uuid:
            keys.append(("mig", uuid))
        profile = _first(attrs, names.profile)
        if profile:
            keys.append(("migp", parent, profile))
        return DraDevice(tuple(keys), True) if keys else None
    parent_pci = _first_bus_id(attrs, names.parent_pci)
    if parent_pci is not None:  # a partition (AMD compute partition): the parent GPU, as a slice
        return DraDevice((("pci", parent_pci),), True)
    if uuid:
        keys.append(("uuid", uuid))
    pci = _first_bus_id(attrs, names.pci)
    if pci is not None:
        keys.append(("pci", pci))
    return DraDevice(tuple(keys), False) if keys else None


def index_slice(obj: Mapping[str, Any], identities: Identities) -> dict[DeviceId, DraDevice | None]:
    """The devices of one ResourceSlice object (any version), read by the attributes ``identities`` (driver ->
    its vendor's) gives its driver, the default ones for a driver it does not name; None for an unidentifiable
    device."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    driver = spec.get("driver")
    pool = spec.get("pool")
    pool_name = pool.get("name") if isinstance(pool, Mapping) else None
    devices = spec.get("devices")
    if not isinstance(driver, str) or not isinstance(pool_name, str) or not isinstance(devices, list):
        return {}
    names = identities.get(driver, _DEFAULT)
    out: dict[DeviceId, DraDevice | None] = {}
    for dev in devices:
        if isinstance(dev, Mapping) and isinstance(dev.get("name"), str):
            out[(driver, pool_name, dev["name"])] = identify(device_attributes(dev, driver), names)
    return out


class DraUnavailable(Exception):
    """The API server does not serve ResourceSlices to us (no config, no group, forbidden).

    ``final``: asking again will not help (no version served, or RBAC forbids it).
    """

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


class ResourceSliceWatch:
    """This node's ResourceSlice devices, kept current in the background.

    A thread finds the newest served version (:meth:`probe`, one list each), then hands over to
    :class:`exporter.k8s.watch.Watcher` (list, then watch from its resourceVersion, relist after
    410). ``api_client``: a ``kubernetes.client.ApiClient``; ``timeout``: seconds per request;
    ``watch_seconds``: server-side length of one watch request; ``auto``: give up quietly when
    the API server serves no ResourceSlices or forbids them (``--dra-attribution auto``); ``identities``:
    DRA driver -> which attributes of its devices say which GPU (``GpuResources.dra_attributes``: the backends').
    """

    def __init__(self, api_client: Any, node: str, identities: Identities, timeout: float = 10.0,
                 watch_seconds: int = 300, max_backoff: float = 30.0, auto: bool = False, clock: Any = None) -> None:
        if not node:
            raise ValueError("DRA attribution: the node name is empty (set NODE_NAME)")
        self.node = node
        self.identities = identities
        self.timeout = float(timeout)
        self.watch_seconds = int(watch_seconds)
        self.max_backoff = float(max_backoff)
        self.auto = auto
        from exporter.k8s.watch import Clock

        self.clock = clock or Clock()  # tests give a fake one (exporter.k8s.watch.Clock)
        self.version: str | None = None
        self.synced = threading.Event()  # set after the first complete list
        from exporter.k8s.watch import no_retries

        self._client = no_retries(api_client) if api_client is not None else None  # our backoff, not urllib3's
        self._devices: dict[DeviceId, DraDevice | None] = {}
        self._probe_errors = 0
        self._watcher: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.off = False  # auto gave up: the API server serves or allows no ResourceSlices

    @property
    def errors(self) -> int:
        """Failed requests: version probes, then the watcher's lists and watches (410 Expired not counted)."""
        return self._probe_errors + (self._watcher.errors if self._watcher is not None else 0)

    # --- scrape side -----------------------------------------------------------------------

    def resolve(self, driver: str, pool: str, device: str) -> DraDevice | None:
        """The device's lookup keys, or None when no slice of this node publishes it (yet). Lock-free."""
        return self._devices.get((driver, pool, device))

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="resourceslices-probe", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1.0)
            self._thread = None
        if self._watcher is not None:
            self._watcher.stop()

    def probe(self) -> str:
        """The newest served version, found by one list each (the list fills the index); raises DraUnavailable."""
        from kubernetes.client.exceptions import ApiException

        reasons = []
        for version in VERSIONS:
            try:
                resp = self._list_call(version)(field_selector=self._selector(), _preload_content=False,
                                                _request_timeout=(self.timeout, self.timeout))
                try:
                    items = _summaries(resp)  # item by item, as the watch decodes: memory bounded per slice
                finally:
                    resp.release_conn()
            except ApiException as exc:
                status = int(exc.status or 0)
                if status == 404:
                    reasons.append(f"{GROUP}/{version}: not served")
                    continue
                if status in (401, 403):
                    raise DraUnavailable(
                        f"{GROUP}/{version} resourceslices: HTTP {status}; the exporter's service account needs "
                        "get, list and watch on resourceslices (deploy with DRA attribution on)", final=True) from None
                raise DraUnavailable(f"{GROUP}/{version} resourceslices: HTTP {status}") from None
            except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS, not JSON
                raise DraUnavailable(f"the API server does not answer: {type(exc).__name__}: {exc}") from None
            if items is None:
                raise DraUnavailable(f"{GROUP}/{version} resourceslices: the answer has no items")
            self._changed({str(i): obj for i, obj in enumerate(items)})
            self.version = version
            return version
        raise DraUnavailable("; ".join(reasons) or "no ResourceSlice version served", final=True)

    # --- background ------------------------------------------------------------------------

    def _selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def _list_call(self, version: str) -> Any:
        # The generic list call: /apis/resource.k8s.io/<version>/resourceslices with any client
        # release (typed Resource*Api classes exist only in clients as new as the API version).
        client = importlib.import_module("kubernetes.client")
        return functools.partial(client.CustomObjectsApi(self._client).list_cluster_custom_object,
                                 GROUP, version, "resourceslices")

    def _run(self) -> None:
        from exporter.k8s.watch import Backoff, Watcher

        backoff = Backoff(initial=min(0.8, self.max_backoff), cap=self.max_backoff, clock=self.clock)
        failures = 0
        while not self._stop.is_set():
            try:
                version = self.probe()
                break
            except DraUnavailable as exc:
                if exc.final and self.auto:
                    log.info("DRA attribution off (auto): %s", exc)
                    self.off = True
                    return
                failures += 1
                self._probe_errors += 1
                delay = backoff.next()  # the watch's policy: exponential, jittered, capped
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "DRA attribution: %s; retrying with backoff (%.1f s)", exc, delay)
                if self.clock.wait(self._stop, delay):
                    return
        else:
            return

        log.info("DRA attribution: watching this node's ResourceSlices (%s/%s, node %s)", GROUP, version, self.node)
        self._watcher = Watcher("resourceslices", self._list_call(version), self._changed,
                                field_selector=self._selector(), timeout_seconds=self.watch_seconds,
                                request_timeout=self.timeout, max_backoff=self.max_backoff, keep=slice_summary,
                                clock=self.clock)
        if not self._stop.is_set():
            self._watcher.start()

    def families(self) -> list[Metric]:
        """``gpu_exporter_dra_attribution_up`` and ``..._resourceslices_errors_total``; nothing once auto gave up."""
        from exporter.core import schema

        if self.off:
            return []
        up = self.version is not None and self.synced.is_set()
        watch = self._watcher.families() if self._watcher is not None else []
        return [schema.metric("gpu_exporter_dra_attribution_up", 1.0 if up else 0.0),
                schema.metric("gpu_exporter_dra_resourceslices_errors_total", float(self.errors)), *watch]

    def _changed(self, objects: Mapping[str, Any]) -> None:
        """The whole set of this node's slices changed: rebuild the index (replaced whole)."""
        mine = [obj for obj in objects.values() if isinstance(obj, Mapping) and isinstance(obj.get("spec"), Mapping)
                and obj["spec"].get("nodeName") == self.node]  # the selector, checked again
        # While a driver republishes a pool, slices of its previous generation linger: only the
        # highest generation of each pool counts (as for the scheduler).
        newest: dict[tuple[Any, Any], int] = {}
        for obj in mine:
            key, gen = _pool(obj)
            newest[key] = max(newest.get(key, gen), gen)
        merged: dict[DeviceId, DraDevice | None] = {}
        for obj in mine:
            key, gen = _pool(obj)
            if gen == newest[key]:
                merged.update(index_slice(obj, self.identities))
        self._devices = merged
        self.synced.set()


def _summaries(resp: Any) -> list[dict[str, Any]] | None:
    """The :func:`slice_summary` of each item of a list answer, decoded one item at a time (an
    item over the watch's object limit raises); None when the answer has no ``items`` array."""
    from exporter.k8s.watch import MAX_OBJECT_BYTES, _JsonStream, _reader

    stream = _JsonStream(_reader(resp), MAX_OBJECT_BYTES)
    items: list[dict[str, Any]] | None = None
    for key in stream.members():
        if key == "items" and stream.peek() == "[":
            items = [slice_summary(obj) for obj in stream.elements() if isinstance(obj, Mapping)]
        else:
            stream.value()
    return items


def slice_summary(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What :meth:`ResourceSliceWatch._changed` reads of a slice (its watch keeps only this): the
    spec, and the uid and name; managed fields, labels and annotations are dropped as decoded."""
    meta: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
    return {"metadata": {k: meta[k] for k in ("uid", "name") if k in meta}, "spec": obj.get("spec")}


def _pool(obj: Mapping[str, Any]) -> tuple[tuple[Any, Any], int]:
    """((driver, pool name), pool generation) of a slice."""
    spec = obj["spec"]
    pool = spec.get("pool") if isinstance(spec.get("pool"), Mapping) else {}
    gen = pool.get("generation")
    return (spec.get("driver"), pool.get("name")), gen if isinstance(gen, int) else 0
