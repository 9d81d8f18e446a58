"""``--device-taints``: a DeviceTaintRule per failed GPU (issue 35, "Per-GPU action on DRA clusters").

Against the fake API server (tests/harness/kubeapi.py), which serves discovery and checks the
rules' shapes as kubernetes/api resource/v1beta2 and v1alpha3 types.go define them, with
ResourceSlices as NVIDIA's DRA driver publishes them (tests/fakes/dra_slices.py).
"""

from __future__ import annotations

import io
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler import health
from exporter.profiler.classify import GpuStats
from exporter.profiler.taints import MANAGED_BY, REPROBE_CYCLES, TAINT_KEY, DeviceTaints, Failed, rule_name
from tests.fakes.dra_slices import AMD, NVIDIA, amd_gpu, amd_partition, nvidia_gpu, nvidia_mig, resource_slice
from tests.harness.kubeapi import FakeKubeAPI

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

U0, U1, U2 = (f"GPU-{i}1111111-2222-3333-4444-555555555555" for i in range(3))
MIG1 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
OTHER = "GPU-99999999-2222-3333-4444-555555555555"


def _slices(api: FakeKubeAPI, node: str = "n1", generation: int = 2) -> None:
    api.put_resource_slice(resource_slice(f"{node}-gpus", node, NVIDIA, [
        nvidia_gpu(0, U0, "0000:07:00.0"),
        nvidia_gpu(1, U1, "0000:0f:00.0"),
        nvidia_mig(1, U1, MIG1, "1g.10gb", 19, 0, "0000:0f:00.0"),
        nvidia_gpu(2, U2, "0000:47:00.0"),
    ], generation=generation))
    # an older generation of the same pool, still listed while the driver republishes: ignored
    api.put_resource_slice(resource_slice(f"{node}-old", node, NVIDIA, [nvidia_gpu(7, U0, "0000:07:00.0")],
                                          generation=generation - 1))
    # another node's GPU with the same index: never selected for n1
    api.put_resource_slice(resource_slice("n2-gpus", "n2", NVIDIA, [nvidia_gpu(1, OTHER, "0000:0f:00.0")]))


def _gpu(g: int, uuid: str, **kw: Any) -> GpuStats:
    return GpuStats(node="n1", gpu=str(g), uuid=uuid, up=1.0, **kw)


def _view(*failed: tuple[int, str, dict[str, float] | None], node: str = "n1") -> Failed:
    """n1 with GPUs 0-2; ``failed``: (index, uuid, health fields or None for lost)."""
    gpus = {"0": _gpu(0, U0), "1": _gpu(1, U1), "2": _gpu(2, U2)}
    for g, uuid, fields in failed:
        gpus[str(g)] = GpuStats(node=node, gpu=str(g), uuid=uuid, up=0.0) if fields is None else \
            _gpu(g, uuid, health=fields)
    view = Failed()
    obs = health.observe(gpus)
    view.add_node(node, gpus, health.CRITICAL_XIDS, obs.status == health.TRUE)
    return view


def _ours(api: FakeKubeAPI) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in api.taint_rules()}


def test_a_failed_gpu_gets_rules_selecting_exactly_its_devices(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _slices(kubeapi)
    taints = DeviceTaints(kube_client, hysteresis=2)
    taints.sync(_view((1, U1, {"xid_79": 1.0})))
    assert taints.version == "v1beta2"  # the beta version where it is served
    rules = _ours(kubeapi)
    selectors = sorted(tuple(r["spec"]["deviceSelector"].values()) for r in rules.values())
    assert selectors == [(NVIDIA, "n1", "gpu-1"), (NVIDIA, "n1", "gpu-1-mig-1g10gb-19-0")]  # the GPU and its MIG
    for name, r in rules.items():
        assert name == rule_name(tuple(r["spec"]["deviceSelector"].values()))  # type: ignore[arg-type]
        assert r["metadata"]["labels"] == {MANAGED_BY[0]: MANAGED_BY[1]}
        assert r["spec"]["taint"]["key"] == TAINT_KEY and r["spec"]["taint"]["effect"] == "NoSchedule"
        assert r["spec"]["taint"]["value"] == health.XID
        assert r["metadata"]["annotations"]["gpu-exporter.io/node"] == "n1"
        assert r["metadata"]["annotations"]["gpu-exporter.io/uuid"] == U1.lower()
    posts = [r for r in kubeapi.requests if r.resource == "devicetaintrules" and r.method == "POST"]
    assert len(posts) == 2 and all(r.status == 201 or r.status == 200 for r in posts)
    kubeapi.clear_requests()
    taints.sync(_view((1, U1, {"xid_79": 1.0})))  # unchanged: one list, no write
    assert [(r.method, r.verb) for r in kubeapi.requests if r.resource == "devicetaintrules"] == [("GET", "list")]


@pytest.mark.parametrize(("fields", "tainted"), [
    (None, True),  # lost
    ({"ecc": 2.0}, True),
    ({"remap": 1.0}, True),
    ({"state_hung": 1.0}, True),  # the exporter's gpu_health_state: a driver call that did not return
    ({"state_failed": 1.0}, True),
    ({"state_degraded": 1.0}, False),
    ({"xid_13": 4.0}, False),  # not a critical XID
    ({"width": 8.0, "width_max": 16.0}, False),  # a narrowed link is degraded, not failed
])
def test_which_causes_taint(kubeapi: FakeKubeAPI, kube_client: ApiClient, fields: dict[str, float] | None,
                            tainted: bool) -> None:
    _slices(kubeapi)
    DeviceTaints(kube_client).sync(_view((0, U0, fields)))
    want = [(NVIDIA, "n1", "gpu-0")] if tainted else []
    assert [tuple(r["spec"]["deviceSelector"].values()) for r in kubeapi.taint_rules()] == want


def test_removed_after_the_hysteresis_and_kept_without_data(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _slices(kubeapi)
    taints = DeviceTaints(kube_client, hysteresis=3)
    taints.sync(_view((2, U2, None)))
    (name,) = _ours(kubeapi)
    healthy = _view()
    taints.sync(healthy)
    taints.sync(healthy)
    assert _ours(kubeapi)[name]["metadata"]["annotations"]["gpu-exporter.io/healthy-cycles"] == "2"
    taints.sync(Failed())  # no data for n1 this cycle: neither healthy nor failed, the count stays
    assert _ours(kubeapi)[name]["metadata"]["annotations"]["gpu-exporter.io/healthy-cycles"] == "2"
    taints.sync(_view((2, U2, None)))  # failed again: the count starts over
    assert _ours(kubeapi)[name]["metadata"]["annotations"]["gpu-exporter.io/healthy-cycles"] == "0"
    for _ in range(2):
        DeviceTaints(kube_client, hysteresis=3).sync(healthy)  # new processes (--once, a new leader)
    assert name in _ours(kubeapi)
    DeviceTaints(kube_client, hysteresis=3).sync(healthy)
    assert _ours(kubeapi) == {}
    assert [r.verb for r in kubeapi.requests if r.method == "DELETE"] == ["delete"]


def test_foreign_rules_are_never_touched(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _slices(kubeapi)
    from kubernetes import client

    foreign = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
               "metadata": {"name": "maintenance", "labels": {"team": "infra"}},
               "spec": {"deviceSelector": {"driver": NVIDIA, "pool": "n1", "device": "gpu-0"},
                        "taint": {"key": "example.com/maintenance", "effect": "NoExecute"}}}
    client.CustomObjectsApi(kube_client).create_cluster_custom_object("resource.k8s.io", "v1beta2",
                                                                      "devicetaintrules", foreign)
    taints = DeviceTaints(kube_client, hysteresis=1)
    for _ in range(3):
        taints.sync(_view())
    assert list(_ours(kubeapi)) == ["maintenance"]
    lists = [r for r in kubeapi.requests if r.resource == "devicetaintrules" and r.verb == "list"]
    assert lists and all(r.query.get("labelSelector") == "=".join(MANAGED_BY) for r in lists)


@pytest.mark.parametrize(("served", "want"), [(("v1beta2", "v1alpha3"), "v1beta2"), (("v1alpha3",), "v1alpha3"),
                                              (("v1", "v1beta2"), "v1")])
def test_version_from_discovery(kubeapi: FakeKubeAPI, kube_client: ApiClient, served: tuple[str, ...],
                                want: str) -> None:
    kubeapi.taint_rule_versions = served
    _slices(kubeapi)
    taints = DeviceTaints(kube_client)
    taints.sync(_view((0, U0, None)))
    assert taints.version == want
    assert {r.path.split("/")[3] for r in kubeapi.requests if r.resource == "devicetaintrules"} == {want}
    assert len(kubeapi.taint_rules()) == 1


def test_api_absent_says_so_once_and_carries_on(kubeapi: FakeKubeAPI, kube_client: ApiClient,
                                                caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.taint_rule_versions = ()  # the DRADeviceTaintRules gate off (or a server before 1.33)
    _slices(kubeapi)
    taints = DeviceTaints(kube_client)
    with caplog.at_level(logging.INFO, logger="exporter.profiler.taints"):
        for _ in range(REPROBE_CYCLES):
            taints.sync(_view((0, U0, None)))
    said = [r for r in caplog.records if "serves no DeviceTaintRule" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    discovery = [r for r in kubeapi.requests if r.path.startswith("/apis/resource.k8s.io/v") and
                 r.path.count("/") == 3]
    assert len(discovery) == 3  # v1, v1beta2, v1alpha3 asked once, not every cycle
    kubeapi.taint_rule_versions = ("v1beta2",)  # the gate turned on: found at the next probe
    taints.sync(_view((0, U0, None)))
    assert taints.version == "v1beta2" and len(kubeapi.taint_rules()) == 1


def test_forbidden_is_one_warning(kubeapi: FakeKubeAPI, kube_client: ApiClient,
                                  caplog: pytest.LogCaptureFixture) -> None:
    _slices(kubeapi)
    kubeapi.inject("POST", "devicetaintrules", 403, times=3)
    taints = DeviceTaints(kube_client)
    with caplog.at_level(logging.WARNING, logger="exporter.profiler.taints"):
        for _ in range(3):
            taints.sync(_view((0, U0, None)))
    assert len([r for r in caplog.records if "forbidden" in r.getMessage()]) == 1
    assert taints.counts["failed"] == 3
    taints.sync(_view((0, U0, None)))
    assert len(kubeapi.taint_rules()) == 1


def test_dry_run_prints_and_writes_nothing(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _slices(kubeapi)
    out = io.StringIO()
    DeviceTaints(kube_client, dry_run=True, out=out).sync(_view((0, U0, None)))
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)["create"]["spec"]["deviceSelector"] == {"driver": NVIDIA, "pool": "n1", "device": "gpu-0"}
    assert kubeapi.taint_rules() == [] and not [r for r in kubeapi.requests if r.method != "GET"]


def test_not_leader_writes_nothing(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _slices(kubeapi)
    DeviceTaints(kube_client, is_leader=lambda: False).sync(_view((0, U0, None)))
    assert kubeapi.requests == []


def test_the_fake_checks_the_upstream_shape(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """What the fake refuses, so a rule the real server would refuse fails here too."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(kube_client)

    def rule(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "r"},
                "spec": {"deviceSelector": {"driver": NVIDIA}, "taint": {"key": "a.io/b", "effect": "NoSchedule"},
                         **spec}}

    for bad in (rule(taint={"key": "a.io/b", "effect": "PreferNoSchedule"}),  # not a device taint effect
                rule(taint={"key": "a.io/b"}),  # effect required
                rule(taint={"key": "not a key", "effect": "None"}),
                rule(taint={"key": "a.io/b", "value": "x" * 64, "effect": "None"}),
                rule(deviceSelector={"deviceClassName": "gpu"}),  # tombstoned since 1.35
                rule(deviceSelector={"device": "GPU_1"})):  # a device name is a DNS label
        with pytest.raises(ApiException) as err:
            api.create_cluster_custom_object("resource.k8s.io", "v1beta2", "devicetaintrules", bad)
        assert err.value.status == 422
    api.create_cluster_custom_object("resource.k8s.io", "v1beta2", "devicetaintrules", rule())
    (made,) = kubeapi.taint_rules()
    assert made["spec"]["taint"]["timeAdded"]  # set by the server when absent


# AMD: the exporter's UUID (amd-smi's) is not one AMD's DRA driver publishes; the PCI bus id decides
A0, A1 = "9dff74a1-0000-1000-8020-5b1f1f2b6ac6", "55ff74a1-0000-1000-8031-7e2a3c4d5e6f"  # amd-smi's UUIDs


def _amd_slices(api: FakeKubeAPI) -> None:
    """ROCm/k8s-gpu-dra-driver's devices (tests/fakes/dra_slices.py cites deviceinfo.go): two GPUs by
    ``pciAddr`` (the first version's own ``uuid`` on one: never amd-smi's), GPU 1 split in partitions
    (``parentPciAddr``)."""
    api.put_resource_slice(resource_slice("n1-amd", "n1", AMD, [
        amd_gpu(1, 128, "0000:0c:00.0", driver_uuid="0b5a1c3e-cc7f-5f0a-8f1c-7d1b5e9a2c44"),
        amd_gpu(2, 129, "0000:8a:00.0"),
        amd_partition(3, 130, "0000:8a:00.0"),
        amd_partition(4, 131, "0000:8a:00.0"),
    ]))


def _amd_view(failed: str, fields: dict[str, float]) -> Failed:
    gpus = {"0": _gpu(0, A0, health={"pci_0000:0C:00.0": 1.0}), "1": _gpu(1, A1, health={"pci_0000:8a:00.0": 1.0})}
    g = "0" if failed == A0 else "1"
    gpus[g] = _gpu(int(g), failed, health={**(gpus[g].health or {}), **fields})
    view = Failed()
    view.add_node("n1", gpus, health.CRITICAL_XIDS, health.observe(gpus).status == health.TRUE)
    return view


def test_an_amd_gpu_is_found_by_its_pci_bus_id(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    _amd_slices(kubeapi)
    taints = DeviceTaints(kube_client, hysteresis=2)
    taints.sync(_amd_view(A1, {"state_hung": 1.0}))  # the GPU split in partitions: it and each partition
    assert sorted(tuple(r["spec"]["deviceSelector"].values()) for r in _ours(kubeapi).values()) == [
        (AMD, "n1", "gpu-2-129"), (AMD, "n1", "gpu-3-130"), (AMD, "n1", "gpu-4-131")]
    assert {r["metadata"]["annotations"]["gpu-exporter.io/uuid"] for r in _ours(kubeapi).values()} == {A1}
    taints.sync(_amd_view(A0, {"state_hung": 1.0}))  # a bus id in capitals is the same bus id
    assert (AMD, "n1", "gpu-1-128") in {tuple(r["spec"]["deviceSelector"].values()) for r in _ours(kubeapi).values()}


def test_without_its_pci_bus_id_an_amd_gpu_is_not_found(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """What --device-taints reads the bus id for: by UUID alone, no AMD device matches (nothing written)."""
    _amd_slices(kubeapi)
    gpus = {"0": _gpu(0, A0), "1": _gpu(1, A1, health={"state_hung": 1.0})}
    view = Failed()
    view.add_node("n1", gpus, health.CRITICAL_XIDS, False)
    DeviceTaints(kube_client).sync(view)
    assert _ours(kubeapi) == {}


def test_the_pci_bus_id_is_read_with_device_taints_only() -> None:
    from exporter.profiler import sources
    from exporter.profiler.fold import fold_shard
    from exporter.profiler.prom import Sample
    from exporter.profiler.promql import QueryBuilder, QueryConfig

    def mem(pci: bool) -> str:
        cfg = QueryConfig(source="gpu-exporter", health=True, pci=pci)
        return " ".join(p.tagged for p in QueryBuilder(cfg, sources.make(cfg.source, "node")).mem_parts(None))

    assert "gpu_info" not in mem(False)
    q = mem(True)
    assert 'label_replace(' in q and '"stat", "pci_$1", "pci_bus_id"' in q and "gpu_info{" in q
    # its answer, one series per GPU, folds into the GPU's health fields, which taints.py reads
    cfg = QueryConfig(source="gpu-exporter", health=True, pci=True)
    labels = {"node": "n1", "gpu": "0", "uuid": A0}
    fold = fold_shard(cfg, sources.make(cfg.source, "node"), ["n1"], [],
                      [("used", [Sample(labels, 1.0)]), (None, [Sample({**labels, "stat": "pci_0000:0c:00.0"}, 1.0)])],
                      [], mem_step=60)
    assert fold.gpus[("n1", "0")].health == {"pci_0000:0c:00.0": 1.0}


def test_flag() -> None:
    from exporter.platform.errors import ConfigError
    from exporter.profiler.main import parse_args

    base = ["--prometheus-url", "http://127.0.0.1:9"]
    assert parse_args(base).device_taints is False  # off by default
    assert parse_args([*base, "--device-taints", "on"]).device_taints is True
    with pytest.raises(ConfigError, match="--device-taints on: needs --health-condition on"):
        parse_args([*base, "--device-taints", "on", "--health-condition", "off"])
    with pytest.raises(ConfigError, match=r"\(--device-taints\) = 'maybe': expected true or false \(on or off"):
        parse_args([*base, "--device-taints", "maybe"])
