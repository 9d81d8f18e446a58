"""What a vendor's GPUs are called in Kubernetes: device-plugin resource names, device ID forms, DRA drivers.

Each backend declares its :class:`KubernetesNames` (``Backend.kubernetes``, beside ``families``);
the registry gathers them into one :class:`GpuResources` (``exporter.backends.gpu_resources()``)
and ``serve`` hands that to the pod attribution (``exporter/k8s/``), which names no vendor. A
new vendor's pods are then attributed to its GPUs without any change outside its backend file.

The device ID forms every vendor gets (exporter/k8s/podresources.py): the GPU's UUID or any other
opaque ID (compared with ``GpuReading.uuid``), a PCI bus id in any spelling, an index ``N`` and an
index-strategy slice ``N:M``, and the MIG forms ``MIG-<uuid>`` and ``MIG-GPU-<uuid>/<gi>/<ci>``.
A vendor adds its own index prefix (GKE's ``nvidiaN``, ``nvidiaN/<partition>``, ``nvidiaN/vgpuK``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevicePluginResource:
    """A device-plugin resource name (a regular expression matched against the whole name)."""

    pattern: str
    #: every device ID of this resource is a fraction of a GPU (a MIG instance): never the whole GPU
    slices: bool = False


@dataclass(frozen=True)
class DraAttributes:
    """Which attributes of a vendor's DRA devices (its drivers' ResourceSlices) say which GPU a device is.

    Each is a tuple of attribute names, the first one a device carries wins; a name qualified with the
    driver's own domain (``gpu.nvidia.com/uuid``) is the bare one, other domains are written out
    (``resource.kubernetes.io/pciBusID``, Kubernetes' standard PCI attribute). A device is never identified by
    its name (exporter/k8s/resourceslices.py). The default: a ``uuid`` and the standard PCI bus id.
    """

    #: the GPU's UUID as the backend reads it (``GpuReading.uuid``); on a slice, the slice's own (``MIG-...``)
    uuid: tuple[str, ...] = ("uuid",)
    #: the GPU's PCI bus id, any spelling
    pci: tuple[str, ...] = ("resource.kubernetes.io/pciBusID",)
    #: a slice of a GPU (MIG): its parent GPU's UUID; the device is then a fraction of that GPU
    parent_uuid: tuple[str, ...] = ()
    #: with ``parent_uuid``: the slice's profile (``1g.10gb``), which finds it among the GPU's MIG devices
    profile: tuple[str, ...] = ()
    #: a partition of a GPU: its parent GPU's PCI bus id; the device is then a fraction of that GPU
    parent_pci: tuple[str, ...] = ()

    def check(self, owner: str) -> None:
        """ValueError naming ``owner`` (the backend) when a name cannot be an attribute's."""
        for kind in ("uuid", "pci", "parent_uuid", "profile", "parent_pci"):
            for name in getattr(self, kind):
                if not isinstance(name, str) or not re.fullmatch(r"(?:[a-z0-9.-]+/)?[A-Za-z][A-Za-z0-9_-]*", name):
                    raise ValueError(f"backend {owner!r} declares DRA attribute {name!r} ({kind}): expected an "
                                     "attribute name, bare or qualified (resource.kubernetes.io/pciBusID)")
        if self.profile and not self.parent_uuid:
            raise ValueError(f"backend {owner!r} declares a DRA profile attribute without parent_uuid: a profile "
                             "finds a slice among its parent GPU's")


@dataclass(frozen=True)
class KubernetesNames:
    """One vendor's names in Kubernetes, declared by its backend."""

    #: device-plugin resource names whose device IDs are this vendor's GPUs (nvidia.com/gpu, amd.com/gpu)
    resources: tuple[DevicePluginResource, ...] = ()
    #: device IDs ``<prefix>N`` (optionally ``/<partition>``) are this vendor's GPU index N (GKE: ``nvidia``)
    index_prefix: str = ""
    #: DRA drivers whose devices are this vendor's GPUs (their ResourceSlices say which GPU: k8s/resourceslices.py)
    dra_drivers: tuple[str, ...] = ()
    #: which attributes of those drivers' devices say which GPU a device is (their names as the drivers publish them)
    dra_attributes: DraAttributes = DraAttributes()

    @property
    def declared(self) -> bool:
        """Whether any name is declared: the pod attribution can then find this vendor's GPUs."""
        return bool(self.resources or self.index_prefix or self.dra_drivers)

    def check(self, owner: str) -> None:
        """ValueError naming ``owner`` (the backend) and the culprit when a declaration cannot work."""
        for r in self.resources:
            try:
                re.compile(r.pattern)
            except re.error as exc:
                raise ValueError(f"backend {owner!r} declares a device-plugin resource pattern {r.pattern!r} that "
                                 f"is not a regular expression ({exc})") from None
        self.dra_attributes.check(owner)
        if self.index_prefix and not re.fullmatch(r"[a-z][a-z-]*", self.index_prefix):
            raise ValueError(f"backend {owner!r} declares index_prefix {self.index_prefix!r}: expected lower-case "
                             "letters (the device IDs are compared in lower case)")


@dataclass(frozen=True)
class GpuResources:
    """Every vendor's :class:`KubernetesNames`, compiled for the pod attribution's lookups."""

    by_vendor: Mapping[str, KubernetesNames] = field(default_factory=dict)
    vendors: tuple[str, ...] = field(init=False)  # in declaration order
    dra_drivers: frozenset[str] = field(init=False)
    #: DRA driver -> which attributes of its devices say which GPU a device is (its vendor's declaration)
    dra_attributes: Mapping[str, DraAttributes] = field(init=False)
    _table: tuple[tuple[re.Pattern[str], str, bool], ...] = field(init=False, repr=False)
    _prefixes: dict[str, str] = field(init=False, repr=False)  # index prefix -> vendor
    _index_id: re.Pattern[str] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        prefixes = {n.index_prefix: v for v, n in self.by_vendor.items() if n.index_prefix}
        alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
        for name, value in (
            ("vendors", tuple(self.by_vendor)),
            ("dra_drivers", frozenset(d for n in self.by_vendor.values() for d in n.dra_drivers)),
            ("dra_attributes", {d: n.dra_attributes for n in self.by_vendor.values() for d in n.dra_drivers}),
            ("_table", tuple((re.compile(r.pattern), vendor, r.slices)
                             for vendor, names in self.by_vendor.items() for r in names.resources)),
            ("_prefixes", prefixes),
            ("_index_id", re.compile(rf"({alternatives})(\d+)(?:/(.+))?") if prefixes else None),
        ):
            object.__setattr__(self, name, value)

    def classify(self, resource: str) -> tuple[str, bool] | None:
        """(vendor, slices) for a GPU resource name, or None for a resource that is not a GPU we know."""
        for pattern, vendor, slices in self._table:
            if pattern.fullmatch(resource):
                return vendor, slices
        return None

    def prefixed_index(self, device_id: str) -> tuple[str, int, str | None] | None:
        """(vendor, index, partition or None) for an ID in a vendor's index form (``nvidia3/vgpu1``), else None."""
        m = self._index_id.fullmatch(device_id) if self._index_id is not None else None
        if m is None:
            return None
        return self._prefixes[m.group(1)], int(m.group(2)), m.group(3)
