"""ResourceSlice objects as NVIDIA's and AMD's DRA drivers publish them (test data).

Every attribute name and value type below is taken from the drivers' published source; values
are made up. Objects are built in the ``resource.k8s.io/v1`` shape; :func:`as_version` gives the
v1beta1 shape (a device's fields wrapped in ``basic``) or v1beta2 (same as v1).

Sources:

- NVIDIA, ``gpu.nvidia.com`` (driver name: cmd/gpu-kubelet-plugin/main.go ``DriverName``):
  https://github.com/NVIDIA/k8s-dra-driver-gpu
  - current (v25.12 and later), commit 22407113785e78c7763b4637689a201eb39c6199:
    cmd/gpu-kubelet-plugin/deviceinfo.go ``GpuInfo.Attributes()`` (full GPU, name ``gpu-<minor>``,
    ``resource.kubernetes.io/pciBusID``, the standard attribute since commit dcdeb68b "use standard
    device attribute for PCIBusID") and cmd/gpu-kubelet-plugin/mig.go ``CommonAttributesMig()`` plus
    ``uuid`` (MIG device, name ``gpu-<minor>-mig-<profile without dots>-<profile id>-<placement start>``
    from ``MigSpecTuple.ToCanonicalName``);
  - v25.8.0, commit 2ef1f2ad8ad2e65756d19f454f55e5b021d0bf3b: cmd/gpu-kubelet-plugin/deviceinfo.go
    ``GetDevice()``: the same attributes with the unqualified ``pcieBusID``; MIG names
    ``gpu-<minor>-mig-<gi profile id>-<placement start>-<placement size>``.
- AMD, ``gpu.amd.com`` (pkg/consts/consts.go ``DriverName``): https://github.com/ROCm/k8s-gpu-dra-driver
  commit 2622427226d5ac361c3588284f4815e0dae11eaa, cmd/gpu-kubeletplugin/deviceinfo.go
  ``AmdGpuInfo.GetDevice()`` (type ``amdgpu``, ``pciAddr``, no ``uuid``; name ``gpu-<card>-<render>``)
  and ``AmdPartitionInfo.GetDevice()`` (type ``amdgpu-partition``, ``parentPciAddr``,
  ``partitionProfile``); device types from cmd/gpu-kubeletplugin/types.go. Its first version
  (commit 4482249) also published a ``uuid`` that the driver derived itself (SHA-1 of device id,
  card and render index), which no amd-smi UUID equals: :func:`amd_gpu` ``driver_uuid=``.
"""

from __future__ import annotations

import copy
from typing import Any

JsonObj = dict[str, Any]
NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"


def _s(v: str) -> JsonObj:
    return {"string": v}


def _v(v: str) -> JsonObj:
    return {"version": v}


def _i(v: int) -> JsonObj:
    return {"int": v}


def _nvidia_common(product: str = "NVIDIA A100-SXM4-40GB") -> JsonObj:
    return {
        "productName": _s(product),
        "brand": _s("Nvidia"),
        "architecture": _s("Ampere"),
        "cudaComputeCapability": _v("8.0.0"),
        "driverVersion": _v("570.124.6"),
        "cudaDriverVersion": _v("12.8.0"),
    }


def nvidia_gpu(minor: int, uuid: str, pci_bus_id: str, legacy_pci: bool = False) -> JsonObj:
    """A full GPU: current driver (``resource.kubernetes.io/pciBusID``) or v25.8 (``pcieBusID``)."""
    attrs: JsonObj = {"type": _s("gpu"), "uuid": _s(uuid), **_nvidia_common(),
                      "resource.kubernetes.io/pcieRoot": _s("pci0000:00")}
    attrs["pcieBusID" if legacy_pci else "resource.kubernetes.io/pciBusID"] = _s(pci_bus_id)
    return {"name": f"gpu-{minor}", "attributes": attrs,
            "capacity": {"memory": {"value": "40Gi"}}}


def nvidia_mig(parent_minor: int, parent_uuid: str, uuid: str | None, profile: str, profile_id: int,
               start: int, pci_bus_id: str, legacy_pci: bool = False) -> JsonObj:
    """A MIG device; ``uuid`` None for a MIG device not created yet (dynamic MIG announces those too)."""
    attrs: JsonObj = {"type": _s("mig"), "parentUUID": _s(parent_uuid), "profile": _s(profile),
                      **_nvidia_common(), "resource.kubernetes.io/pcieRoot": _s("pci0000:00")}
    if uuid is not None:
        attrs["uuid"] = _s(uuid)
    attrs["pcieBusID" if legacy_pci else "resource.kubernetes.io/pciBusID"] = _s(pci_bus_id)
    if legacy_pci:
        name = f"gpu-{parent_minor}-mig-{profile_id}-{start}-1"
    else:
        name = f"gpu-{parent_minor}-mig-{profile.replace('.', '')}-{profile_id}-{start}"
    return {"name": name, "attributes": attrs,
            "capacity": {"multiprocessors": {"value": "14"}, "memory": {"value": "4864Mi"}}}


def amd_gpu(card: int, render: int, pci_addr: str, driver_uuid: str | None = None) -> JsonObj:
    attrs: JsonObj = {
        "type": _s("amdgpu"), "pciAddr": _s(pci_addr), "cardIndex": _i(card), "renderIndex": _i(render),
        "deviceID": _s("0x74a1"), "family": _s("AI"), "productName": _s("AMD_Instinct_MI300X_OAM"),
        "driverVersion": _v("6.10.5"), "driverSrcVersion": _s("9C3D9E46D0B0FA1EDC6ED5D"),
        "partitionProfile": _s("spx_nps1"), "resource.kubernetes.io/pcieRoot": _s("pci0000:00"),
    }
    if driver_uuid is not None:
        attrs["uuid"] = _s(driver_uuid)
    return {"name": f"gpu-{card}-{render}", "attributes": attrs,
            "capacity": {"memory": {"value": "192Gi"}, "computeUnits": {"value": "304"},
                         "simdUnits": {"value": "1216"}}}


def amd_partition(card: int, render: int, parent_pci_addr: str, profile: str = "cpx_nps1") -> JsonObj:
    attrs: JsonObj = {
        "type": _s("amdgpu-partition"), "parentPciAddr": _s(parent_pci_addr), "cardIndex": _i(card),
        "renderIndex": _i(render), "parentDeviceID": _s("0x74a1"), "family": _s("AI"),
        "productName": _s("AMD_Instinct_MI300X_OAM"), "driverVersion": _v("6.10.5"),
        "driverSrcVersion": _s("9C3D9E46D0B0FA1EDC6ED5D"), "partitionProfile": _s(profile),
    }
    return {"name": f"gpu-{card}-{render}", "attributes": attrs,
            "capacity": {"memory": {"value": "24Gi"}, "computeUnits": {"value": "38"}}}


def resource_slice(name: str, node: str, driver: str, devices: list[JsonObj], pool: str | None = None,
                   generation: int = 1) -> JsonObj:
    """One ResourceSlice (v1 shape) of ``node``; the pool is named after the node, as both drivers do."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def as_version(obj: JsonObj, version: str) -> JsonObj:
    """The same slice as ``resource.k8s.io/<version>`` serves it (v1beta1: fields under ``basic``)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                  for d in out["spec"]["devices"]]
    return out
