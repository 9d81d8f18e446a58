"""DRA attribution: a real gRPC kubelet serving dynamic_resources, the real kubernetes client
watching ResourceSlices on the HTTP fake API server (tests/harness/kubeapi.py).

Slices carry the attribute sets NVIDIA's and AMD's DRA drivers publish (tests/fakes/dra_slices.py
cites the sources).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exporter import backends
from exporter.core.readings import GpuReading, MigReading
from exporter.k8s.podresources import PodAttribution
from exporter.k8s.resourceslices import ResourceSliceWatch, identify, index_slice
from tests.fakes import dra_slices as ds
from tests.fakes.kubelet import FakeKubelet, pod, response
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until

# the DRA attributes the backends declare (KubernetesNames.dra_attributes), by driver, as serve hands them over
DRA = backends.gpu_resources().dra_attributes
NV = DRA[ds.NVIDIA]
NODE = "gpu-node-7"
U0 = "GPU-8d1e5a4c-7f3b-4b2a-9c1d-3e5f7a9b0c10"
U1 = "GPU-8d1e5a4c-7f3b-4b2a-9c1d-3e5f7a9b0c11"
MIG_A = "MIG-0c8e2f1a-5b6d-5e7f-8a9b-1c2d3e4f5a60"  # 3g.20gb
MIG_B = "MIG-0c8e2f1a-5b6d-5e7f-8a9b-1c2d3e4f5a61"  # 1g.5gb
MIG_C = "MIG-0c8e2f1a-5b6d-5e7f-8a9b-1c2d3e4f5a62"  # 1g.5gb
PCI0, PCI1 = "0000:07:00.0", "0000:0f:00.0"
AMD_PCI = "0000:c1:00.0"
AMD_UUID = "5f0074a1-0000-1000-80c1-c1c1c1c1c1c1"


def nvidia_gpus(mig: bool = False) -> list[GpuReading]:
    g0 = GpuReading(index=0, uuid=U0, vendor="nvidia", pci_bus_id="00000000:07:00.0")
    g1 = GpuReading(index=1, uuid=U1, vendor="nvidia", pci_bus_id="00000000:0F:00.0")
    if mig:
        g1.mig = [MigReading(1, 0, MIG_A, "3g.20gb"), MigReading(5, 0, MIG_B, "1g.5gb"),
                  MigReading(6, 0, MIG_C, "1g.5gb")]
    return [g0, g1]


def amd_gpu() -> GpuReading:
    return GpuReading(index=0, uuid=AMD_UUID, vendor="amd", pci_bus_id=AMD_PCI)


# --- the attributes of each driver, in each API version ------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_each_driver_generation_is_identified_by_what_it_publishes(version: str) -> None:
    nv_now = ds.resource_slice("a", NODE, ds.NVIDIA, [
        ds.nvidia_gpu(3, U0, PCI0), ds.nvidia_mig(4, U1, MIG_B, "1g.5gb", 19, 2, PCI1)])
    nv_old = ds.resource_slice("b", NODE, ds.NVIDIA, [
        ds.nvidia_gpu(3, U0, PCI0, legacy_pci=True), ds.nvidia_mig(4, U1, None, "1g.5gb", 19, 2, PCI1, True)])
    amd = ds.resource_slice("c", NODE, ds.AMD, [ds.amd_gpu(1, 128, AMD_PCI, driver_uuid="x-made-up"),
                                                 ds.amd_partition(2, 129, AMD_PCI)])
    got = {**index_slice(ds.as_version(nv_now, version), DRA), **index_slice(ds.as_version(nv_old, version), DRA),
           **index_slice(ds.as_version(amd, version), DRA)}
    pool = NODE
    # full GPU: uuid first, then the PCI bus id in either spelling
    assert got[(ds.NVIDIA, pool, "gpu-3")] is not None
    assert got[(ds.NVIDIA, pool, "gpu-3")].keys == (("uuid", U0.lower()), ("pci", PCI0))  # type: ignore[union-attr]
    mig_now = got[(ds.NVIDIA, pool, "gpu-4-mig-1g5gb-19-2")]
    assert mig_now is not None and mig_now.slice
    assert mig_now.keys == (("mig", MIG_B.lower()), ("migp", U1.lower(), "1g.5gb"))
    mig_old = got[(ds.NVIDIA, pool, "gpu-4-mig-19-2-1")]
    assert mig_old is not None and mig_old.keys == (("migp", U1.lower(), "1g.5gb"),)  # no uuid yet
    amd_full = got[(ds.AMD, pool, "gpu-1-128")]
    assert amd_full is not None and ("pci", AMD_PCI) in amd_full.keys and not amd_full.slice
    part = got[(ds.AMD, pool, "gpu-2-129")]
    assert part is not None and part.keys == (("pci", AMD_PCI),) and part.slice


def test_a_device_without_identifying_attributes_is_not_guessed_from_its_name() -> None:
    # a device named like GPU 0 with nothing but a type and an index-like name
    assert identify({"type": "gpu", "productName": "NVIDIA H100"}, NV) is None
    assert identify({"type": "gpu", "pcieBusID": "not-a-bus-id"}, NV) is None
    # qualified with the driver's own domain is the same attribute
    dev = {"name": "gpu-0", "attributes": {"gpu.nvidia.com/uuid": {"string": U0}}}
    assert index_slice(ds.resource_slice("q", NODE, ds.NVIDIA, [dev]), DRA)[(ds.NVIDIA, NODE, "gpu-0")] is not None


def test_a_vendor_declares_the_attributes_its_driver_publishes() -> None:
    """Which attributes say which GPU is each vendor's declaration (KubernetesNames.dra_attributes), read per
    driver: a new vendor's own names identify its devices; the same names on another driver's devices do not,
    nor do NVIDIA's on the new vendor's; a driver no vendor declares is read by the default names (uuid, the
    standard resource.kubernetes.io/pciBusID)."""
    from exporter.core.k8s_names import DraAttributes, GpuResources, KubernetesNames

    acme = KubernetesNames(dra_drivers=("gpu.acme.example",), dra_attributes=DraAttributes(
        uuid=("serialNumber",), pci=("busAddress",), parent_pci=("boardBusAddress",)))
    dra = GpuResources({"nvidia": KubernetesNames(dra_drivers=(ds.NVIDIA,), dra_attributes=NV),
                        "acme": acme}).dra_attributes

    def dev(name: str, **attrs: str) -> dict[str, Any]:
        return {"name": name, "attributes": {k.replace("__", "/"): {"string": v} for k, v in attrs.items()}}

    ours = [dev("a0", serialNumber="ACME-0", **{"gpu.acme.example__busAddress": "0000:41:00.0"}),
            dev("a1", busAddress="41:00.1"), dev("a2", boardBusAddress="0000:41:00.0"),
            dev("a3", uuid=U0, pcieBusID=PCI0)]
    got = index_slice(ds.resource_slice("s", NODE, "gpu.acme.example", ours), dra)
    a0, a1, a2 = (got[("gpu.acme.example", NODE, n)] for n in ("a0", "a1", "a2"))
    assert a0 is not None and a0.keys == (("uuid", "acme-0"), ("pci", "0000:41:00.0")) and not a0.slice
    assert a1 is not None and a1.keys == (("pci", "0000:41:00.1"),)
    assert a2 is not None and a2.keys == (("pci", "0000:41:00.0"),) and a2.slice  # a partition of that GPU
    assert got[("gpu.acme.example", NODE, "a3")] is None  # NVIDIA's names are not acme's
    theirs = index_slice(ds.resource_slice("n", NODE, ds.NVIDIA, [dev("n0", serialNumber="ACME-0")]), dra)
    assert theirs == {(ds.NVIDIA, NODE, "n0"): None}
    other = index_slice(ds.resource_slice("o", NODE, "vgpu.example.com", [
        dev("o0", uuid=U0, pcieBusID=PCI1), dev("o1", serialNumber="ACME-0"),
        dev("o2", **{"resource.kubernetes.io__pciBusID": PCI1})]), dra)
    o0, o2 = other[("vgpu.example.com", NODE, "o0")], other[("vgpu.example.com", NODE, "o2")]
    assert o0 is not None and o0.keys == (("uuid", U0.lower()),)
    assert other[("vgpu.example.com", NODE, "o1")] is None and o2 is not None and o2.keys == (("pci", PCI1),)


@pytest.mark.parametrize(("names", "message"), [
    ({"uuid": ("serial number",)}, "declares DRA attribute 'serial number' (uuid): expected an attribute name"),
    ({"pci": ("",)}, "declares DRA attribute '' (pci)"),
    ({"profile": ("profile",)}, "declares a DRA profile attribute without parent_uuid"),
])
def test_a_bad_dra_attribute_declaration_names_the_backend(names: dict[str, tuple[str, ...]], message: str) -> None:
    from exporter.core.k8s_names import DraAttributes, KubernetesNames

    with pytest.raises(ValueError, match=f"backend 'acme' {message}".replace("(", r"\(").replace(")", r"\)")):
        KubernetesNames(dra_drivers=("gpu.acme.example",), dra_attributes=DraAttributes(**names)).check("acme")


# --- the watch -------------------------------------------------------------------------------------


@pytest.fixture
def watch(kube_client: Any) -> Iterator[Callable[..., ResourceSliceWatch]]:
    made: list[ResourceSliceWatch] = []

    def make(node: str = NODE, **kw: Any) -> ResourceSliceWatch:
        w = ResourceSliceWatch(kube_client, node, DRA, **{"timeout": 5.0, "max_backoff": 0.2, **kw})
        made.append(w)
        w.start()
        return w

    yield make
    for w in made:
        w.stop()


def self_metrics(w: ResourceSliceWatch) -> dict[str, float]:
    return {s.name: s.value for f in w.families() for s in f.samples}


def slice_requests(api: FakeKubeAPI) -> list[Any]:
    return [r for r in api.requests if r.resource == "resourceslices"]


@pytest.mark.parametrize(("served", "used"), [(("v1", "v1beta1"), "v1"), (("v1beta2", "v1beta1"), "v1beta2"),
                                               (("v1beta1",), "v1beta1")])
def test_newest_served_version_is_watched_for_this_node_only(kubeapi: FakeKubeAPI, watch: Callable[...,
                                                             ResourceSliceWatch], served: tuple[str, ...],
                                                             used: str) -> None:
    kubeapi.slice_versions = served
    kubeapi.put_resource_slice(ds.resource_slice("mine", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)]))
    kubeapi.put_resource_slice(ds.resource_slice("other", "gpu-node-8", ds.NVIDIA, [ds.nvidia_gpu(0, U1, PCI1)],
                                                 pool="gpu-node-8"))
    w = watch()
    assert wait_until(lambda: w.resolve(ds.NVIDIA, NODE, "gpu-0"), 10).keys[0] == ("uuid", U0.lower())
    assert w.version == used
    assert w.resolve(ds.NVIDIA, "gpu-node-8", "gpu-0") is None
    # a slice published later arrives through the watch, and a deleted one goes
    kubeapi.put_resource_slice(ds.resource_slice("mine-2", NODE, ds.AMD, [ds.amd_gpu(1, 128, AMD_PCI)]))
    wait_until(lambda: w.resolve(ds.AMD, NODE, "gpu-1-128") is not None, 10, what="the added slice")
    kubeapi.delete_resource_slice("mine")
    wait_until(lambda: w.resolve(ds.NVIDIA, NODE, "gpu-0") is None, 10, what="the deleted slice gone")
    reqs = slice_requests(kubeapi)
    assert {r.verb for r in reqs} <= {"get", "list", "watch"}
    assert "watch" in {r.verb for r in reqs}
    for r in reqs:
        assert r.query.get("fieldSelector") == f"spec.nodeName={NODE}", r.query
        if r.status == 200:
            assert r.path == f"/apis/resource.k8s.io/{used}/resourceslices"


def test_watch_recovers_from_expired_resource_version_and_closed_streams(
        kubeapi: FakeKubeAPI, watch: Callable[..., ResourceSliceWatch]) -> None:
    kubeapi.put_resource_slice(ds.resource_slice("s", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)]))
    w = watch()
    wait_until(lambda: w.resolve(ds.NVIDIA, NODE, "gpu-0") is not None, 10, what="first list")
    lists = sum(1 for r in slice_requests(kubeapi) if r.verb == "list")
    kubeapi.expire_watches()  # open watches end; the next, from the old resourceVersion, gets 410: relist
    wait_until(lambda: sum(1 for r in slice_requests(kubeapi) if r.verb == "list") > lists, 15, what="a relist")
    kubeapi.put_resource_slice(ds.resource_slice("s", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U1, PCI1)]))
    wait_until(lambda: (d := w.resolve(ds.NVIDIA, NODE, "gpu-0")) is not None and d.keys[0] == ("uuid", U1.lower()),
               15, what="the slice after a relist")


def test_only_the_newest_generation_of_a_pool_counts(kubeapi: FakeKubeAPI,
                                                     watch: Callable[..., ResourceSliceWatch]) -> None:
    # the driver republished its pool (generation 2) and the old slice is still there
    kubeapi.put_resource_slice(ds.resource_slice("old", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U1, PCI1)], generation=1))
    kubeapi.put_resource_slice(ds.resource_slice("new", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)], generation=2))
    kubeapi.put_resource_slice(ds.resource_slice("amd", NODE, ds.AMD, [ds.amd_gpu(1, 128, AMD_PCI)], generation=1))
    w = watch()
    assert w.synced.wait(10)
    dev = wait_until(lambda: w.resolve(ds.NVIDIA, NODE, "gpu-0"), 10)
    assert dev.keys[0] == ("uuid", U0.lower())
    assert w.resolve(ds.AMD, NODE, "gpu-1-128") is not None  # another driver's pool has its own generation
    kubeapi.delete_resource_slice("new")  # back to the only generation left
    wait_until(lambda: (d := w.resolve(ds.NVIDIA, NODE, "gpu-0")) is not None and d.keys[0] == ("uuid", U1.lower()),
               10, what="the remaining generation")


def test_auto_gives_up_when_forbidden_and_on_keeps_asking(kubeapi: FakeKubeAPI,
                                                          watch: Callable[..., ResourceSliceWatch],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.inject("GET", r"/resourceslices", status=403, times=1000)
    caplog.set_level(logging.INFO, "exporter.k8s.resourceslices")
    auto = watch(auto=True)
    wait_until(lambda: auto._thread is not None and not auto._thread.is_alive(), 10, what="auto gives up")
    assert any("DRA attribution off (auto)" in r.getMessage() and "resourceslices" in r.getMessage()
               for r in caplog.records)
    assert auto.families() == []  # off: no self-metrics either
    on = watch(auto=False)
    wait_until(lambda: on.errors >= 2, 10, what="on retries")
    assert on._thread is not None and on._thread.is_alive()
    assert self_metrics(on)["gpu_exporter_dra_attribution_up"] == 0
    assert self_metrics(on)["gpu_exporter_dra_resourceslices_errors_total"] >= 2
    kubeapi.clear_injections()
    kubeapi.put_resource_slice(ds.resource_slice("s", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)]))
    wait_until(lambda: on.resolve(ds.NVIDIA, NODE, "gpu-0") is not None, 10, what="on recovers")
    assert self_metrics(on)["gpu_exporter_dra_attribution_up"] == 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "403" in r.getMessage()]
    assert len(warnings) == 1  # logged once per outage


# --- kubelet + slices -> labels --------------------------------------------------------------------


def who(ns: str, p: str, c: str) -> dict[str, str]:
    return {"pod": p, "namespace": ns, "container": c}


def info(a: PodAttribution) -> list[dict[str, str]]:
    return [s.labels for f in a.families() for s in f.samples if s.name == "gpu_allocation_info"]


def devices(a: PodAttribution, status: str) -> float | None:
    for f in a.families():
        for s in f.samples:
            if s.name == "gpu_exporter_pod_resources_devices" and s.labels["status"] == status:
                return s.value
    return None


def start(api: FakeKubeAPI, client: Any, slices: list[dict[str, Any]]) -> ResourceSliceWatch:
    for s in slices:
        api.put_resource_slice(s)
    w = ResourceSliceWatch(client, NODE, DRA, timeout=5.0, max_backoff=0.2)
    w.start()
    assert w.synced.wait(10)
    return w


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
@pytest.mark.parametrize("legacy_pci", [False, True])
def test_dra_full_gpus_get_pod_labels_by_uuid_not_by_name(kubeapi: FakeKubeAPI, kube_client: Any, kubelet: FakeKubelet,
                                                          attribution: Callable[..., PodAttribution],
                                                          version: str, legacy_pci: bool) -> None:
    kubeapi.slice_versions = (version,)
    # minor numbers are not NVML indexes: gpu-1 is GPU 0 (uuid U0), gpu-0 is GPU 1
    w = start(kubeapi, kube_client, [ds.resource_slice("nv", NODE, ds.NVIDIA, [
        ds.nvidia_gpu(1, U0, PCI0, legacy_pci), ds.nvidia_gpu(0, U1, PCI1, legacy_pci)])])
    try:
        kubelet.set_response(response([
            pod("ml", "train-0", {}, claims={"main": [("gpu-claim", "ml", [(ds.NVIDIA, NODE, "gpu-1")])]}),
        ]))
        gpus = nvidia_gpus()
        a = attribution(kubelet.path, gpus, dra=w.resolve, timeout=2.0)
        assert wait_until(lambda: a.labels_for(gpus[0]), 10) == who("ml", "train-0", "main")
        assert a.labels_for(gpus[1]) == {}
        (row,) = info(a)
        assert row["gpu"] == "0" and row["uuid"] == U0
        assert (row["resource"], row["device"]) == (ds.NVIDIA, f"{NODE}/gpu-1")
        assert (row["claim"], row["claim_namespace"], row["shared"]) == ("gpu-claim", "ml", "1")
        assert len(row) <= 12
    finally:
        w.stop()


def test_dra_gpu_matched_by_pci_bus_id_when_its_uuid_is_unknown(kubeapi: FakeKubeAPI, kube_client: Any,
                                                                kubelet: FakeKubelet,
                                                                attribution: Callable[..., PodAttribution]) -> None:
    # AMD: the driver's own made-up uuid matches nothing; pciAddr decides
    w = start(kubeapi, kube_client,
              [ds.resource_slice("amd", NODE, ds.AMD, [ds.amd_gpu(1, 128, AMD_PCI, "x-made-up")])])
    try:
        kubelet.set_response(response([pod("hpc", "sim", {}, claims={"c": [("cl", "hpc", [(ds.AMD, NODE,
                                                                                            "gpu-1-128")])]})]))
        g = amd_gpu()
        a = attribution(kubelet.path, [g], dra=w.resolve, timeout=2.0)
        assert wait_until(lambda: a.labels_for(g), 10) == who("hpc", "sim", "c")
        assert devices(a, "allocated") == 1 and devices(a, "unmapped") == 0
    finally:
        w.stop()


def test_dra_mig_devices_label_their_own_instance(kubeapi: FakeKubeAPI, kube_client: Any, kubelet: FakeKubelet,
                                                  attribution: Callable[..., PodAttribution]) -> None:
    w = start(kubeapi, kube_client, [ds.resource_slice("nv", NODE, ds.NVIDIA, [
        ds.nvidia_gpu(0, U0, PCI0),
        ds.nvidia_mig(1, U1, MIG_B, "1g.5gb", 19, 4, PCI1),  # by its uuid
        ds.nvidia_mig(1, U1, None, "3g.20gb", 9, 0, PCI1),  # no uuid: parentUUID + profile (unique)
        ds.nvidia_mig(1, U1, None, "1g.5gb", 19, 6, PCI1),  # no uuid, profile not unique: unmappable
    ])])
    try:
        kubelet.set_response(response([
            pod("a", "small", {}, claims={"c": [("mig-small", "a", [(ds.NVIDIA, NODE, "gpu-1-mig-1g5gb-19-4")])]}),
            pod("b", "big", {}, claims={"c": [("mig-big", "b", [(ds.NVIDIA, NODE, "gpu-1-mig-3g20gb-9-0")])]}),
            pod("c", "lost", {}, claims={"c": [("mig-x", "c", [(ds.NVIDIA, NODE, "gpu-1-mig-1g5gb-19-6")])]}),
        ]))
        gpus = nvidia_gpus(mig=True)
        g1 = gpus[1]
        a = attribution(kubelet.path, gpus, dra=w.resolve, timeout=2.0)
        assert wait_until(lambda: a.mig_labels_for(g1, g1.mig[1]), 10) == who("a", "small", "c")
        assert a.mig_labels_for(g1, g1.mig[0]) == who("b", "big", "c")
        assert a.mig_labels_for(g1, g1.mig[2]) == {}
        assert a.labels_for(g1) == {}  # a partitioned GPU has no one holder
        assert {(r["pod"], r["shared"]) for r in info(a)} == {("small", "2"), ("big", "2")}
        assert devices(a, "unmapped") == 1
    finally:
        w.stop()


def test_device_plugin_mig_instances_get_pod_labels(kubelet: FakeKubelet,
                                                    attribution: Callable[..., PodAttribution]) -> None:
    kubelet.set_response(response([
        pod("a", "p1", {"c": [("nvidia.com/mig-1g.5gb", [MIG_B])]}),
        pod("b", "p2", {"c": [("nvidia.com/mig-1g.5gb", [MIG_C])]}),
        pod("b", "p3", {"x": [("nvidia.com/mig-3g.20gb", [MIG_A])], "y": [("nvidia.com/mig-3g.20gb", [MIG_A])]}),
    ]))
    gpus = nvidia_gpus(mig=True)
    g1 = gpus[1]
    a = attribution(kubelet.path, gpus, timeout=2.0)
    assert wait_until(lambda: a.mig_labels_for(g1, g1.mig[1]), 10) == who("a", "p1", "c")
    assert a.mig_labels_for(g1, g1.mig[2]) == who("b", "p2", "c")
    assert a.mig_labels_for(g1, g1.mig[0]) == {}  # two containers on one instance: no one holder
    assert a.labels_for(g1) == {}


def test_dra_shared_and_unmapped_devices(kubeapi: FakeKubeAPI, kube_client: Any, kubelet: FakeKubelet,
                                         attribution: Callable[..., PodAttribution],
                                         caplog: pytest.LogCaptureFixture) -> None:
    w = start(kubeapi, kube_client, [ds.resource_slice("nv", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)])])
    try:
        shared = [(ds.NVIDIA, NODE, "gpu-0", "share-1")]
        kubelet.set_response(response([
            pod("t1", "a", {}, claims={"c": [("shared-gpu", "t1", shared)]}),
            pod("t2", "b", {}, claims={"c": [("shared-gpu-2", "t2", [(ds.NVIDIA, NODE, "gpu-0", "share-2")])]}),
            pod("t3", "ghost", {}, claims={"c": [("gone", "t3", [(ds.NVIDIA, NODE, "gpu-9")])]}),  # no slice
            pod("net", "nic", {}, claims={"c": [("nic", "net", [("sriov.example.com", NODE, "vf-0")])]}),
        ]))
        gpus = nvidia_gpus()
        caplog.set_level(logging.INFO, "exporter.k8s.podresources")
        a = attribution(kubelet.path, gpus, dra=w.resolve, timeout=2.0)
        wait_until(lambda: len(info(a)) == 2, 10, what="two claims on GPU 0")
        assert a.labels_for(gpus[0]) == {}
        assert {(r["pod"], r["claim"], r["shared"]) for r in info(a)} == {("a", "shared-gpu", "2"),
                                                                          ("b", "shared-gpu-2", "2")}
        assert devices(a, "unmapped") == 1
        assert devices(a, "ignored") == 1
        for _ in range(3):
            a.families()
        logged = [r for r in caplog.records if f"{NODE}/gpu-9" in r.getMessage()]
        assert len(logged) == 1
    finally:
        w.stop()


def test_without_dra_claimed_gpus_are_ignored_not_unmapped(kubelet: FakeKubelet,
                                                           attribution: Callable[..., PodAttribution]) -> None:
    kubelet.set_response(response([pod("ml", "x", {"c": [("nvidia.com/gpu", [U1])]},
                                       claims={"c": [("cl", "ml", [(ds.NVIDIA, NODE, "gpu-0")])]})]))
    gpus = nvidia_gpus()
    a = attribution(kubelet.path, gpus, timeout=2.0)
    assert wait_until(lambda: a.labels_for(gpus[1]), 10) == who("ml", "x", "c")
    assert devices(a, "ignored") == 1 and devices(a, "unmapped") == 0


def test_a_dra_gpu_indexed_before_its_gpu_was_read_is_one_allocation(
        kubeapi: FakeKubeAPI, kube_client: Any, kubelet: FakeKubelet,
        attribution: Callable[..., PodAttribution]) -> None:
    """A DRA GPU listed before the exporter had read its GPU sits under both its uuid and its PCI bus id;
    the GPU then answers to both keys, and must still count it once: one gpu_allocation_info row, not
    shared, and allocated once (a duplicate row would be two identical series)."""
    w = start(kubeapi, kube_client, [ds.resource_slice("nv", NODE, ds.NVIDIA, [ds.nvidia_gpu(0, U0, PCI0)])])
    try:
        kubelet.set_response(response([pod("ml", "x", {}, claims={"c": [("cl", "ml", [(ds.NVIDIA, NODE, "gpu-0")])]})]))
        gpus = nvidia_gpus()
        a = attribution(kubelet.path, dra=w.resolve, timeout=2.0)  # no GPUs read yet: every key of the device
        assert wait_until(lambda: a.labels_for(gpus[0]), 10) == who("ml", "x", "c")
        kubelet.hang()  # keep that view: the next List would index the device under the GPU's first key only
        wait_until(lambda: kubelet.hung >= 1, what="a List held, after the view indexed without GPUs")
        a.update_gpus(gpus)
        assert [(r["gpu"], r["pod"], r["shared"]) for r in info(a)] == [("0", "x", "1")]
        assert devices(a, "allocated") == 1 and devices(a, "unmapped") == 0
        assert a.labels_for(gpus[0]) == who("ml", "x", "c")
    finally:
        kubelet.unhang()
        w.stop()


def test_dra_mig_alone_on_its_gpu_never_labels_the_gpu_and_uuid_decides_before_pci(
        kubeapi: FakeKubeAPI, kube_client: Any, kubelet: FakeKubelet,
        attribution: Callable[..., PodAttribution]) -> None:
    """A MIG device is a slice of its parent even when it is the GPU's only allocation; a device whose uuid
    and PCI bus id name two GPUs is the uuid's; a GPU claimed after another driver's device in one claim
    still counts."""
    w = start(kubeapi, kube_client, [ds.resource_slice("nv", NODE, ds.NVIDIA, [
        ds.nvidia_gpu(0, U0, PCI1),  # uuid GPU 0's, PCI bus id GPU 1's
        ds.nvidia_mig(1, U1, MIG_A, "3g.20gb", 9, 0, PCI1)])])
    try:
        kubelet.set_response(response([
            pod("ml", "full", {}, claims={"c": [("cl", "ml", [("sriov.example.com", NODE, "vf-0"),
                                                              (ds.NVIDIA, NODE, "gpu-0")])]}),
            pod("ml", "mig", {}, claims={"c": [("m", "ml", [(ds.NVIDIA, NODE, "gpu-1-mig-3g20gb-9-0")])]}),
        ]))
        gpus = nvidia_gpus(mig=True)
        g0, g1 = gpus
        a = attribution(kubelet.path, gpus, dra=w.resolve, timeout=2.0)
        assert wait_until(lambda: a.mig_labels_for(g1, g1.mig[0]), 10) == who("ml", "mig", "c")
        assert a.labels_for(g1) == {}, "one MIG slice is not the whole GPU"
        assert a.labels_for(g0) == who("ml", "full", "c")
        assert {(r["gpu"], r["pod"], r["shared"]) for r in info(a)} == {("0", "full", "1"), ("1", "mig", "1")}
        assert devices(a, "ignored") == 1 and devices(a, "allocated") == 2
    finally:
        w.stop()


def test_without_dra_every_claimed_device_is_counted_and_the_reason_logged_once(
        kubelet: FakeKubelet, attribution: Callable[..., PodAttribution], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "exporter.k8s.podresources")
    kubelet.set_response(response([pod("ml", "x", {"c": [("nvidia.com/gpu", [U1])]}, claims={"c": [
        ("two", "ml", [(ds.NVIDIA, NODE, "gpu-0"), (ds.NVIDIA, NODE, "gpu-2")]),
        ("nic", "ml", [("sriov.example.com", NODE, "vf-0"), ("sriov.example.com", NODE, "vf-1")])]})]))
    gpus = nvidia_gpus()
    a = attribution(kubelet.path, gpus, timeout=2.0)
    assert wait_until(lambda: a.labels_for(gpus[1]), 10) == who("ml", "x", "c")
    wait_until(lambda: kubelet.calls >= 2, what="a second List")
    assert devices(a, "ignored") == 4 and devices(a, "allocated") == 1
    ignoring = sorted(r.getMessage() for r in caplog.records if "ignoring" in r.getMessage())
    assert ignoring == ["pod attribution: ignoring resource 'gpu.nvidia.com' (DRA attribution is off)",
                        "pod attribution: ignoring resource 'sriov.example.com (DRA driver)' "
                        "(not a GPU resource name we know)"]


def _slice(name: str, pool: str, gen: Any, devices: list[dict[str, Any]], node: str = NODE,
           driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": "u-" + name, "managedFields": [{"x": "y" * 100}], "labels": {"a": "b"}},
            "spec": {"nodeName": node, "driver": driver, "pool": {"name": pool, "generation": gen},
                     "devices": devices}}


def _dev(name: str, uuid: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"uuid": {"string": uuid}}}


def test_slice_summary_and_pool_generation_without_a_server() -> None:
    """The watch keeps only what _changed reads (issue 36); the highest generation of each pool counts,
    another node's slice or a slice without a spec never does."""
    from exporter.k8s.resourceslices import slice_summary

    old = _slice("s-old", "p", 1, [_dev("gpu-0", "GPU-OLD"), _dev("gpu-gone", "GPU-GONE")])
    new = _slice("s-new", "p", 2, [_dev("gpu-0", "GPU-NEW"), _dev("gpu-1", "GPU-ONE")])
    other_pool = _slice("s-q", "q", 0, [_dev("gpu-9", "GPU-Q")])
    bad_gen = _slice("s-r", "r", "7", [_dev("gpu-8", "GPU-R")])
    elsewhere = _slice("s-x", "p", 9, [_dev("gpu-0", "GPU-ELSEWHERE")], node="other-node")
    # the newer generation first: the older one must lose by its generation, not by coming later
    summaries = {s["metadata"]["uid"]: slice_summary(s) for s in (new, old, other_pool, bad_gen, elsewhere)}
    assert summaries["u-s-new"] == {"metadata": {"uid": "u-s-new", "name": "s-new"}, "spec": new["spec"]}
    assert slice_summary({"metadata": "x"}) == {"metadata": {}, "spec": None}
    w = ResourceSliceWatch(None, NODE, DRA)
    w._changed({**summaries, "junk": {"spec": None}, "junk2": "x"})
    d = "gpu.nvidia.com"
    assert w.resolve(d, "p", "gpu-0").keys == (("uuid", "gpu-new"),)  # type: ignore[union-attr]
    assert w.resolve(d, "p", "gpu-1") is not None and w.resolve(d, "q", "gpu-9") is not None
    assert w.resolve(d, "r", "gpu-8") is not None  # a generation that is not an int counts as 0
    assert w.resolve(d, "p", "gpu-2") is None and w.synced.is_set()
    assert w.resolve(d, "p", "gpu-gone") is None  # only in the older generation
    w._changed({"a": slice_summary(old)})
    assert w.resolve(d, "p", "gpu-0").keys == (("uuid", "gpu-old"),)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="NODE_NAME"):
        ResourceSliceWatch(None, "", DRA)


def test_attributes_identification_and_slices_of_every_shape() -> None:
    from exporter.k8s.resourceslices import device_attributes

    attrs = device_attributes({"name": "d", "attributes": {
        "gpu.nvidia.com/uuid": {"string": "GPU-A"}, "driverVersion": {"version": "1.2.3"}, "index": {"int": 3},
        "mig": {"bool": False}, "odd": {"unknown": 1}, "none": {"string": None}, "bad": "x",
        "late": {"string": "kept"}}}, "gpu.nvidia.com")
    assert attrs == {"uuid": "GPU-A", "driverVersion": "1.2.3", "index": "3", "mig": "False", "late": "kept"}
    assert device_attributes({"name": "d", "attributes": 5}, "x") == {}
    assert device_attributes({"name": "d", "basic": {"attributes": {"a": {"int": 1}}}}, "x") == {"a": "1"}
    # MIG: the uuid alone, the profile alone, neither
    mig = identify({"parentUUID": "GPU-P", "uuid": "MIG-1"}, NV)
    assert mig is not None and mig.keys == (("mig", "mig-1"),) and mig.slice is True
    prof = identify({"parentUUID": "GPU-P", "profile": " 1g.10gb "}, NV)
    assert prof is not None and prof.keys == (("migp", "gpu-p", "1g.10gb"),)
    assert identify({"parentUUID": "GPU-P"}, NV) is None
    full = identify({"uuid": "GPU-X"}, NV)
    assert full is not None and full.slice is False and full.keys == (("uuid", "gpu-x"),)
    assert identify({}, NV) is None
    # slices of the wrong shape index nothing, and raise nothing
    dev = {"name": "ok", "attributes": {"uuid": {"string": "GPU-OK"}}}
    good = {"spec": {"driver": "d", "pool": {"name": "p"}, "devices": ["x", {"name": 5}, dev]}}
    assert list(index_slice(good, DRA)) == [("d", "p", "ok")]
    for spec in ({"driver": 1, "pool": {"name": "p"}, "devices": [dev]}, {"driver": "d", "pool": "p", "devices": [dev]},
                 {"driver": "d", "pool": {"name": 2}, "devices": [dev]}, {"driver": "d", "pool": {"name": "p"},
                                                                        "devices": {"x": dev}}):
        assert index_slice({"spec": spec}, DRA) == {}, spec
    assert index_slice({"spec": "x"}, DRA) == {}


def test_the_version_probe_decodes_its_list_item_by_item() -> None:
    """Issue 36: the probe's list is decoded as the watch's is (bounded per slice), not read whole."""
    import io
    import json

    from exporter.k8s import resourceslices, watch

    class Resp:
        def __init__(self, data: bytes) -> None:
            self.read = io.BytesIO(data).read

    one = _slice("s", "p", 1, [_dev("gpu-0", "GPU-A")])
    got = resourceslices._summaries(Resp(json.dumps({"kind": "ResourceSliceList", "items": [one, "x"],
                                                     "metadata": {"resourceVersion": "3"}}).encode()))
    assert got == [resourceslices.slice_summary(one)]
    assert resourceslices._summaries(Resp(b'{"kind": "ResourceSliceList", "items": null}')) is None
    assert resourceslices._summaries(Resp(b'{"kind": "Status"}')) is None
    big = _slice("b", "p", 1, [_dev(f"gpu-{i}", "GPU-" + "x" * 1000) for i in range(watch.MAX_OBJECT_BYTES // 1000)])
    with pytest.raises(watch.TooLarge):
        resourceslices._summaries(Resp(json.dumps({"items": [big]}).encode()))


def test_pool_generations_per_driver_and_of_every_shape_for_slice_summary() -> None:
    """A pool is (driver, pool name); a generation that is missing or not an integer counts as 0."""
    from exporter.k8s.resourceslices import slice_summary

    a_new = _slice("a5", "p", 5, [_dev("gpu-0", "GPU-A")], driver="a.example.com")
    b_old = _slice("b1", "p", 1, [_dev("gpu-0", "GPU-B")], driver="b.example.com")
    no_gen = _slice("n", "q", 0, [_dev("gpu-1", "GPU-N")])
    del no_gen["spec"]["pool"]["generation"]
    zero = _slice("z", "q", 0, [_dev("gpu-2", "GPU-Z")])
    text_gen = _slice("t", "r", "7", [_dev("gpu-3", "GPU-T")])
    one = _slice("o", "r", 1, [_dev("gpu-4", "GPU-O")])
    odd_pool = _slice("x", "s", 0, [])
    odd_pool["spec"]["pool"] = "s"
    w = ResourceSliceWatch(None, NODE, DRA)
    w._changed({str(i): slice_summary(s) for i, s in enumerate((a_new, b_old, no_gen, zero, text_gen, one, odd_pool))})
    assert w.resolve("a.example.com", "p", "gpu-0") is not None
    assert w.resolve("b.example.com", "p", "gpu-0") is not None  # another driver's pool of the same name
    assert w.resolve("gpu.nvidia.com", "q", "gpu-1") is not None and w.resolve("gpu.nvidia.com", "q", "gpu-2")
    assert w.resolve("gpu.nvidia.com", "r", "gpu-3") is None and w.resolve("gpu.nvidia.com", "r", "gpu-4")
