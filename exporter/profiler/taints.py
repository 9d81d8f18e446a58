"""Per-GPU action on DRA clusters (``--device-taints on``): a ``DeviceTaintRule`` for each failed GPU.

``GPUHealthy`` is one condition per Node: a taint keyed on it blocks all of a node's GPUs for
one bad GPU. Dynamic Resource Allocation has the per-device lever: a ``DeviceTaintRule``
(KEP-5055, feature gate ``DRADeviceTaintRules``; ``resource.k8s.io/v1alpha3`` since 1.33,
``v1beta2`` since 1.36, ``v1`` in kubernetes/api at 10b39a39) taints every device its
``deviceSelector`` matches, as if the driver had put the taint in its ResourceSlice. Shapes
(kubernetes/api resource/v1beta2/types.go and v1alpha3/types.go, the same in both):
``spec.deviceSelector`` {``driver``, ``pool``, ``device``} (the slice's ``spec.driver``,
``spec.pool.name`` and ``spec.devices[].name``) and ``spec.taint`` {``key``, ``value``,
``effect``: ``None`` | ``NoSchedule`` | ``NoExecute``, ``timeAdded``}.

What the leader does each cycle:

* For a GPU that failed (lost or hung, a critical XID, uncorrectable ECC errors, a failed row
  remap: health.py's causes but a narrowed PCIe link), it finds the GPU's devices in its node's
  ResourceSlices by the attributes its vendor declares (``KubernetesNames.dra_attributes`` in the
  backends, as serve's pod attribution reads them: NVIDIA's ``uuid``, a MIG device's ``parentUUID``;
  AMD's, whose driver publishes no UUID amd-smi knows, by the GPU's PCI bus id: its ``pciAddr``, a
  partition's ``parentPciAddr``, read from our ``gpu_info``; only the highest pool generation
  counts) and writes one rule per device selecting exactly that (driver, pool, device), effect
  ``NoSchedule``, taint ``gpu-exporter.io/unhealthy=<reason>``.
* A rule whose GPU has been seen healthy for ``hysteresis`` consecutive cycles is deleted; the
  count lives on the rule (annotation ``gpu-exporter.io/healthy-cycles``), so ``--once`` runs
  and a new leader keep it. A GPU with no fresh data keeps its rule and its count.
* Every rule it writes carries the label ``app.kubernetes.io/managed-by=gpu-exporter-profiler``;
  it lists only rules with that label, and its admission policy lets it create, patch and
  delete nothing else (deploy/base/profiler-device-taints*, the Helm chart's copy).

The API version comes from discovery: the newest of v1, v1beta2, v1alpha3 whose resource list
names ``devicetaintrules``. Without one (an older server, or the gate off) it logs once, does
nothing, and asks discovery again every :data:`REPROBE_CYCLES` cycles. A 403 is logged once per
outage. Cost: one discovery call at start, one list of our rules per cycle, one ResourceSlice
list per node with a failed GPU, one write per change.

RBAC (only with the feature on): ``list``, ``create``, ``patch``, ``delete`` on
``devicetaintrules`` and ``list`` on ``resourceslices`` (group ``resource.k8s.io``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from exporter.core.pci import canonical_bus_id
from exporter.k8s.resourceslices import VERSIONS as SLICE_VERSIONS
from exporter.k8s.resourceslices import Identities, _pool, index_slice
from exporter.profiler import health
from exporter.profiler.prom import printable

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")  # newest first; v1alpha3 needs the alpha API enabled
PLURAL = "devicetaintrules"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-exporter-profiler")
TAINT_KEY = "gpu-exporter.io/unhealthy"
EFFECT = "NoSchedule"
A_NODE, A_GPU, A_UUID, A_HEALTHY = ("gpu-exporter.io/node", "gpu-exporter.io/gpu", "gpu-exporter.io/uuid",
                                    "gpu-exporter.io/healthy-cycles")
TAINTED = frozenset((health.LOST, health.HUNG, health.XID, health.ECC, health.REMAP, health.FAILED))  # not PCIE
REPROBE_CYCLES = 30

DeviceId = tuple[str, str, str]  # (driver, pool, device)


@dataclass
class Failed:
    """This cycle's view: the failed GPUs (node -> uuid -> (gpu index, reason, PCI bus id or "")) and which
    GPUs are seen healthy (every GPU of ``healthy_nodes``; ``healthy`` per node for the others)."""

    failed: dict[str, dict[str, tuple[str, str, str]]] = field(default_factory=dict)
    healthy_nodes: set[str] = field(default_factory=set)
    healthy: dict[str, set[str]] = field(default_factory=dict)

    def add_node(self, node: str, gpus: Mapping[str, Any], critical: health.XidRules | Iterable[int] | None,
                 all_healthy: bool) -> None:
        """One node's GPUs (classify.GpuStats by index); ``all_healthy``: its condition is True."""
        if all_healthy:
            self.healthy_nodes.add(node)
            return
        any_fresh = any(st.fresh for st in gpus.values())
        for g, st in gpus.items():
            uuid = (st.uuid or "").lower()
            if not uuid:
                continue  # a device is found by its uuid: without one there is nothing to select
            found = health.gpu_findings(st, critical) if st.fresh else (
                [health.Finding(g, st.uuid, health.LOST, "", "", "")] if any_fresh else [])
            causes = [f.cause for f in found if f.cause in TAINTED]
            if causes:
                # the PCI bus id (health field pci_<bus id>, read with --device-taints): AMD's devices are found by it
                pci = next((canonical_bus_id(k[4:]) or "" for k in st.health or () if k.startswith("pci_")), "")
                self.failed.setdefault(node, {})[uuid] = (g, causes[0], pci)
            elif st.fresh:
                self.healthy.setdefault(node, set()).add(uuid)

    def is_healthy(self, node: str, uuid: str) -> bool:
        return node in self.healthy_nodes or uuid in self.healthy.get(node, ())


def rule_name(dev: DeviceId) -> str:
    """A DNS subdomain name fixed by the device: the same rule is found again by every leader."""
    return "gpu-exporter-" + hashlib.sha256("/".join(dev).encode()).hexdigest()[:24]


class DeviceTaints:
    """Writes and removes our DeviceTaintRules through a ``kubernetes.client.ApiClient``; never raises."""

    def __init__(self, api_client: Any, hysteresis: int = 2, dry_run: bool = False, out: IO[str] | None = None,
                 timeout: float = 10.0, is_leader: Callable[[], bool] | None = None,
                 identities: Identities | None = None) -> None:
        from kubernetes import client

        if identities is None:  # the vendors' declarations: which DRA drivers' devices are GPUs, and by what
            from exporter.backends import gpu_resources

            identities = gpu_resources().dra_attributes
        self.identities = identities
        self.api: Any = client.CustomObjectsApi(api_client)
        self.hysteresis = max(1, hysteresis)
        self.dry_run = dry_run
        self.out = out
        self.timeout = timeout
        self.is_leader = is_leader or (lambda: True)
        self.version: str | None = None
        self.slice_version: str | None = None
        self._probed = False
        self._absent_logged = False
        self._since_probe = 0
        self._forbidden = False
        self.counts = {"created": 0, "deleted": 0, "failed": 0}

    # ---- API calls ----

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        resp = call(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def probe(self) -> str | None:
        """The newest version serving devicetaintrules (discovery), None when none does."""
        from kubernetes.client.exceptions import ApiException

        for version in VERSIONS:
            try:
                doc = self._json(self.api.get_api_resources, GROUP, version)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            names = {r.get("name") for r in doc.get("resources") or () if isinstance(r, dict)}
            if PLURAL in names:
                return version
        return None

    def _devices(self, node: str) -> dict[DeviceId, Any]:
        """The node's DRA devices (highest generation of each pool), ``index_slice`` values."""
        from kubernetes.client.exceptions import ApiException

        for version in ([self.slice_version] if self.slice_version else SLICE_VERSIONS):
            try:
                doc = self._json(self.api.list_cluster_custom_object, GROUP, version, "resourceslices",
                                 field_selector=f"spec.nodeName={node}")
            except ApiException as exc:
                if exc.status == 404 and self.slice_version is None:
                    continue
                raise
            self.slice_version = version
            mine = [o for o in doc.get("items") or () if isinstance(o, dict) and isinstance(o.get("spec"), dict)
                    and o["spec"].get("nodeName") == node]
            newest: dict[Any, int] = {}
            for obj in mine:
                key, gen = _pool(obj)
                newest[key] = max(newest.get(key, gen), gen)
            out: dict[DeviceId, Any] = {}
            for obj in mine:
                key, gen = _pool(obj)
                if gen == newest[key]:
                    out.update(index_slice(obj, self.identities))
            return out
        return {}

    # ---- one cycle ----

    def sync(self, view: Failed) -> None:
        """Bring our rules in line with this cycle's view (leader only; dry run: print them)."""
        from kubernetes.client.exceptions import ApiException

        if not self.is_leader():
            return
        try:
            if not self._ready():
                return
            self._sync(view)
            if self._forbidden:
                log.info("device taints: writing DeviceTaintRules works again")
                self._forbidden = False
        except ApiException as exc:
            self.counts["failed"] += 1
            if exc.status == 403:
                if not self._forbidden:
                    log.warning("device taints: forbidden (%s); the profiler's service account needs list, create, "
                                "patch and delete on devicetaintrules and list on resourceslices (resource.k8s.io), "
                                "granted with --device-taints on", printable(str(exc.reason), 100))
                self._forbidden = True
            else:
                log.warning("device taints: HTTP %s %s; retried next cycle", exc.status,
                            printable(str(exc.reason), 100))
        except Exception as exc:  # noqa: BLE001 - never the cycle's end
            self.counts["failed"] += 1
            log.warning("device taints: %s; retried next cycle", printable(f"{type(exc).__name__}: {exc}", 300))

    def _ready(self) -> bool:
        if self.version is not None:
            return True
        if self._probed:
            self._since_probe += 1
            if self._since_probe < REPROBE_CYCLES:
                return False
        self._probed, self._since_probe = True, 0
        self.version = self.probe()
        if self.version is None:
            if not self._absent_logged:
                log.warning("device taints: the API server serves no DeviceTaintRule (%s %s devicetaintrules; "
                            "Kubernetes 1.33+ with the DRADeviceTaintRules feature gate): --device-taints does "
                            "nothing until it does (asked again every %d cycles)", GROUP, "/".join(VERSIONS),
                            REPROBE_CYCLES)
                self._absent_logged = True
            return False
        log.info("device taints: DeviceTaintRules through %s/%s", GROUP, self.version)
        return True

    def _sync(self, view: Failed) -> None:
        assert self.version is not None
        doc = self._json(self.api.list_cluster_custom_object, GROUP, self.version, PLURAL,
                         label_selector="=".join(MANAGED_BY))
        ours = {o["metadata"]["name"]: o for o in doc.get("items") or ()
                if isinstance(o, dict) and (o.get("metadata") or {}).get("labels", {}).get(MANAGED_BY[0])
                == MANAGED_BY[1]}
        wanted: dict[str, tuple[DeviceId, str, str, str, str]] = {}  # name -> (device, node, gpu, uuid, reason)
        for node in sorted(view.failed):
            devices = self._devices(node)
            for uuid, (gpu, reason, pci) in sorted(view.failed[node].items()):
                for dev, dd in devices.items():
                    if dd is not None and any(k[:2] in (("uuid", uuid), ("migp", uuid)) or (pci and k == ("pci", pci))
                                              for k in dd.keys):
                        wanted[rule_name(dev)] = (dev, node, gpu, uuid, reason)
        for name, (dev, node, gpu, uuid, reason) in sorted(wanted.items()):
            have = ours.get(name)
            if have is None:
                self._create(name, dev, node, gpu, uuid, reason)
            elif (have["metadata"].get("annotations") or {}).get(A_HEALTHY, "0") != "0":
                self._patch(name, "0")  # failed again: the count starts over
        for name, have in sorted(ours.items()):
            if name in wanted:
                continue
            ann = have["metadata"].get("annotations") or {}
            node, uuid = ann.get(A_NODE, ""), ann.get(A_UUID, "")
            if not view.is_healthy(node, uuid):
                continue  # no fresh data, or failed but not found in the slices now: keep it
            try:
                count = int(ann.get(A_HEALTHY, "0")) + 1
            except ValueError:
                count = 1
            if count >= self.hysteresis:
                self._delete(name, node, ann.get(A_GPU, ""))
            else:
                self._patch(name, str(count))

    def _emit(self, doc: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(json.dumps(doc, sort_keys=True) + "\n")
            self.out.flush()

    def _create(self, name: str, dev: DeviceId, node: str, gpu: str, uuid: str, reason: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{self.version}", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
                         "annotations": {A_NODE: node, A_GPU: gpu, A_UUID: uuid, A_HEALTHY: "0"}},
            "spec": {"deviceSelector": {"driver": dev[0], "pool": dev[1], "device": dev[2]},
                     "taint": {"key": TAINT_KEY, "value": reason, "effect": EFFECT}},
        }
        if self.dry_run:
            self._emit({"create": body})
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self._json(self.api.create_cluster_custom_object, GROUP, self.version, PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:  # 409: another leader wrote it meanwhile, the same rule
                raise
        self.counts["created"] += 1
        log.info("device taints: GPU %s (%s) of node %s is %s: DeviceTaintRule %s taints %s/%s/%s %s",
                 gpu, uuid, node, reason, name, *dev, EFFECT)

    def _patch(self, name: str, healthy_cycles: str) -> None:
        body = {"metadata": {"annotations": {A_HEALTHY: healthy_cycles}}}
        if self.dry_run:
            self._emit({"patch": {"name": name, **body}})
            return
        self._json(self.api.patch_cluster_custom_object, GROUP, self.version, PLURAL, name, body,
                   _content_type="application/merge-patch+json")

    def _delete(self, name: str, node: str, gpu: str) -> None:
        if self.dry_run:
            self._emit({"delete": name})
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self._json(self.api.delete_cluster_custom_object, GROUP, self.version, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.counts["deleted"] += 1
        log.info("device taints: GPU %s of node %s healthy for %d cycles: DeviceTaintRule %s removed", gpu, node,
                 self.hysteresis, name)
