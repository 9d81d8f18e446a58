"""GPU-to-pod attribution against a real gRPC kubelet on a unix socket (tests/kubelet_fake.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.samples import Sample

from exporter.core.readings import GpuReading, MigReading
from exporter.k8s.podresources import PodAttribution
from exporter.k8s.proto import podresources_pb2 as pb
from tests.fakes.kubelet import FakeKubelet, pod, raw_field, response
from tests.harness.poll import wait_until

LOGGER = "exporter.k8s.podresources"
U0 = "GPU-1f2e3d4c-0000-4a5b-8c9d-00000000000a"
U1 = "GPU-1f2e3d4c-0000-4a5b-8c9d-00000000000b"
U2 = "GPU-1f2e3d4c-0000-4a5b-8c9d-00000000000c"
MIG_A = "MIG-7c1d2e3f-1111-5a6b-9c8d-0000000000a1"
MIG_B = "MIG-7c1d2e3f-1111-5a6b-9c8d-0000000000b2"

GRPC_DEFAULT_MAX_RECEIVE_BYTES = 4 * 2**20  # grpc's default for a channel's received message


def nvidia(*uuids: str) -> list[GpuReading]:
    return [GpuReading(index=i, uuid=u, vendor="nvidia", pci_bus_id=f"0000:{0x3b + i:02x}:00.0")
            for i, u in enumerate(uuids)]


Make = Callable[..., PodAttribution]


def samples(a: PodAttribution, name: str) -> list[Sample]:
    return [s for fam in a.families() for s in fam.samples if s.name == name]


def value(a: PodAttribution, name: str, **labels: str) -> float | None:
    for s in samples(a, name):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def allocations(a: PodAttribution) -> set[tuple[str, ...]]:
    """gpu_allocation_info as (gpu, uuid, namespace, pod, container, resource, device, shared) tuples."""
    keys = ("gpu", "uuid", "namespace", "pod", "container", "resource", "device", "shared")
    return {tuple(s.labels[k] for k in keys) for s in samples(a, "gpu_allocation_info") if s.value == 1.0}


def errors(a: PodAttribution, kind: str) -> float:
    return value(a, "gpu_exporter_pod_resources_errors_total", kind=kind) or 0.0


def who(namespace: str, pod: str, container: str) -> dict[str, str]:
    return {"pod": pod, "namespace": namespace, "container": container}


# --- mapping ------------------------------------------------------------------------------------


def test_exclusive_nvidia_gpus_by_uuid(kubelet: FakeKubelet, attribution: Make) -> None:
    gpus = nvidia(U0, U1, U2)
    kubelet.set_response(response([
        pod("ml", "train-0", {"trainer": [("nvidia.com/gpu", [U0])], "sidecar": []}),
        pod("web", "infer-7", {"server": [("nvidia.com/gpu", [U1.lower()])]}),  # case must not matter
        pod("kube-system", "coredns", {"coredns": []}),
    ]))
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[0]), what="GPU 0") == who("ml", "train-0", "trainer")
    assert a.labels_for(gpus[1]) == who("web", "infer-7", "server")
    assert a.labels_for(gpus[2]) == {}, "an unallocated GPU must get no pod labels"

    a.update_gpus(gpus)
    assert allocations(a) == {
        ("0", U0, "ml", "train-0", "trainer", "nvidia.com/gpu", U0, "1"),
        ("1", U1, "web", "infer-7", "server", "nvidia.com/gpu", U1.lower(), "1"),
    }
    assert value(a, "gpu_exporter_pod_attribution_up") == 1.0
    assert value(a, "gpu_exporter_pod_resources_devices", status="allocated") == 2
    assert value(a, "gpu_exporter_pod_resources_devices", status="unmapped") == 0
    last = value(a, "gpu_exporter_pod_resources_last_success_timestamp_seconds")
    assert last is not None and abs(time.time() - last) < 30
    # The families are valid exposition (names, types, label sets).
    reg = CollectorRegistry(auto_describe=False)

    class Source:
        def collect(self) -> Any:
            return a.families()

    reg.register(Source())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert 'gpu_exporter_pod_resources_errors_total{kind="timeout"} 0.0' in text
    assert 'pod="train-0"' in text


def test_amd_gpus_by_pci_bus_id_in_any_spelling(kubelet: FakeKubelet,
                                                 attribution: Make) -> None:
    gpus = [GpuReading(index=i, uuid=f"amd-{i}", vendor="amd", pci_bus_id=pci)
            for i, pci in enumerate(["0000:c1:00.0", "0000:c2:00.0", "0001:03:00.0", "0000:c4:00.0"])]
    kubelet.set_response(response([
        pod("hpc", "a", {"main": [("amd.com/gpu", ["0000:C1:00.0"])]}),  # upper case
        pod("hpc", "b", {"main": [("amd.com/gpu", ["c2:00.0"])]}),  # no domain
        pod("hpc", "c", {"main": [("amd.com/gpu", ["00000001:03:00.0"])]}),  # nvidia-smi's 8-digit domain
    ]))
    a = attribution(kubelet.path)
    wait_until(lambda: a.labels_for(gpus[0]), what="labels for the AMD GPU at 0000:c1:00.0")
    assert [a.labels_for(g).get("pod") for g in gpus] == ["a", "b", "c", None]


def test_gke_nvidia_n_ids_and_time_sharing(kubelet: FakeKubelet, attribution: Make) -> None:
    gpus = nvidia(U0, U1, U2)
    kubelet.set_response(response([
        pod("team", "solo", {"c": [("nvidia.com/gpu", ["nvidia1"])]}),
        pod("team", "s1", {"c": [("nvidia.com/gpu", ["nvidia0/vgpu0"])]}),
        pod("team", "s2", {"c": [("nvidia.com/gpu", ["nvidia0/vgpu3"])]}),
    ]))
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[1]), what="GPU 1 via nvidia1") == who("team", "solo", "c")
    assert a.labels_for(gpus[0]) == {}, "a time-shared GPU must not carry one pod's labels"
    assert a.labels_for(gpus[2]) == {}
    a.update_gpus(gpus)
    assert allocations(a) == {
        ("1", U1, "team", "solo", "c", "nvidia.com/gpu", "nvidia1", "1"),
        ("0", U0, "team", "s1", "c", "nvidia.com/gpu", "nvidia0/vgpu0", "2"),
        ("0", U0, "team", "s2", "c", "nvidia.com/gpu", "nvidia0/vgpu3", "2"),
    }


def test_gke_time_sharing_replica_is_the_whole_gpu_and_a_partition_is_a_slice(
        kubelet: FakeKubelet, attribution: Make) -> None:
    """``nvidiaN/vgpuK`` is a time-sharing replica of all of GPU N: alone on it (or with another
    replica of the same container), a pod owns the GPU's series; next to another pod it shares
    them. ``nvidiaN/<partition>`` is a fraction of GPU N: never the pod's labels, even alone."""
    gpus = nvidia(U0, U1, U2, "GPU-1f2e3d4c-0000-4a5b-8c9d-00000000000d")
    kubelet.set_response(response([
        pod("team", "alone", {"c": [("nvidia.com/gpu", ["nvidia2/vgpu1"])]}),
        pod("team", "twice", {"c": [("nvidia.com/gpu", ["nvidia3/vgpu0", "nvidia3/vgpu7"])]}),
        pod("team", "s1", {"c": [("nvidia.com/gpu", ["nvidia0/vgpu0"])]}),
        pod("team", "s2", {"d": [("nvidia.com/gpu", ["nvidia0/vgpu1"])]}),
        pod("team", "part", {"c": [("nvidia.com/gpu", ["nvidia1/1g.5gb"])]}),
    ]))
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[2]), what="GPU 2 via nvidia2/vgpu1") == who("team", "alone", "c")
    assert a.labels_for(gpus[3]) == who("team", "twice", "c")
    assert a.labels_for(gpus[0]) == {}, "two pods time-share GPU 0"
    assert a.labels_for(gpus[1]) == {}, "a GKE partition is a slice of GPU 1, not the whole GPU"
    a.update_gpus(gpus)
    shared = {(t[0], t[3], t[6]): t[7] for t in allocations(a)}
    assert shared == {("2", "alone", "nvidia2/vgpu1"): "1", ("3", "twice", "nvidia3/vgpu0"): "2",
                      ("3", "twice", "nvidia3/vgpu7"): "2", ("0", "s1", "nvidia0/vgpu0"): "2",
                      ("0", "s2", "nvidia0/vgpu1"): "2", ("1", "part", "nvidia1/1g.5gb"): "1"}


def test_mig_slices_map_to_parent_and_never_label_the_gpu(
        kubelet: FakeKubelet, attribution: Make, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = nvidia(U0, U1, U2)
    gpus[0].mig_mode_enabled = 1.0
    gpus[0].mig = [MigReading(gpu_instance_id=1, compute_instance_id=0, uuid=MIG_A, profile="1g.10gb"),
                   MigReading(gpu_instance_id=2, compute_instance_id=0, uuid=MIG_B, profile="3g.40gb")]
    legacy = f"MIG-{U1}/7/0"  # pre-R470 MIG device ID naming its parent
    unknown = "MIG-00000000-dead-beef-0000-000000000000"
    kubelet.set_response(response([
        pod("a", "p1", {"c": [("nvidia.com/mig-1g.10gb", [MIG_A])]}),
        pod("b", "p2", {"c": [("nvidia.com/mig-3g.40gb", [MIG_B])]}),
        pod("c", "p3", {"c": [("nvidia.com/mig-1g.10gb", [legacy])]}),
        pod("d", "p4", {"c": [("nvidia.com/mig-1g.10gb", [unknown])]}),
        pod("e", "p5", {"c": [("nvidia.com/gpu", [U2])]}),
    ]))
    a = attribution(kubelet.path)
    wait_until(lambda: a.labels_for(gpus[2]), what="labels for the non-MIG GPU")
    assert a.labels_for(gpus[0]) == {}, "a MIG GPU shared by two pods must not carry either pod's labels"
    assert a.labels_for(gpus[1]) == {}, "one MIG slice is not the whole GPU"
    a.update_gpus(gpus)
    assert allocations(a) == {
        ("0", U0, "a", "p1", "c", "nvidia.com/mig-1g.10gb", MIG_A, "2"),
        ("0", U0, "b", "p2", "c", "nvidia.com/mig-3g.40gb", MIG_B, "2"),
        ("1", U1, "c", "p3", "c", "nvidia.com/mig-1g.10gb", legacy, "1"),
        ("2", U2, "e", "p5", "c", "nvidia.com/gpu", U2, "1"),
    }
    assert value(a, "gpu_exporter_pod_resources_devices", status="unmapped") == 1
    assert value(a, "gpu_exporter_pod_resources_devices", status="allocated") == 4
    assert any(unknown in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_time_sliced_replicas(kubelet: FakeKubelet, attribution: Make) -> None:
    gpus = nvidia(U0, U1)
    kubelet.set_response(response([
        pod("x", "a", {"c": [("nvidia.com/gpu.shared", [f"{U0}::0"])]}),
        pod("y", "b", {"c": [("nvidia.com/gpu.shared", [f"{U0}::3"])]}),
        # two replicas of one GPU in one container: that container is still its only user
        pod("z", "c", {"w": [("nvidia.com/gpu.shared", [f"{U1}::0", f"{U1}::1"])]}),
    ]))
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[1]), what="labels for GPU 1") == who("z", "c", "w")
    assert a.labels_for(gpus[0]) == {}
    a.update_gpus(gpus)
    rows = allocations(a)
    assert {(r[0], r[3], r[7]) for r in rows} == {("0", "a", "2"), ("0", "b", "2"), ("1", "c", "2")}
    assert len(rows) == 4


def test_index_ids_follow_the_resource_vendor(kubelet: FakeKubelet,
                                              attribution: Make) -> None:
    nv = GpuReading(index=0, uuid=U0, vendor="nvidia")
    amd = GpuReading(index=0, uuid="amd-0", vendor="amd")
    kubelet.set_response(response([pod("n", "p", {"c": [("nvidia.com/gpu", ["0"])]}),
                                   pod("m", "q", {"c": [("nvidia.com/mig-2g.20gb", ["0:1"])]})]))
    a = attribution(kubelet.path)
    a.update_gpus([nv, amd])
    wait_until(lambda: allocations(a), what="allocations")
    assert a.labels_for(amd) == {}, "nvidia.com/gpu index 0 is not the AMD GPU 0"
    assert a.labels_for(nv) == {}, "index-strategy MIG slice 0:1 shares GPU 0"
    assert {r[3] for r in allocations(a) if r[1] == U0} == {"p", "q"}


def test_unknown_resources_are_ignored_and_logged_once(
        kubelet: FakeKubelet, attribution: Make, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = nvidia(U0)
    kubelet.set_response(response([
        pod("net", "router", {"c": [("example.com/sriov-vf", ["0000:5e:00.1", "0000:5e:00.2"]),
                                    ("nvidia.com/gpu", [U0]),
                                    ("nvidia.com/gpu-metrics", ["x"])]}),
    ]))
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[0])) == who("net", "router", "c")
    wait_until(lambda: kubelet.calls >= 3, what="three List calls")
    a.update_gpus(gpus)
    assert value(a, "gpu_exporter_pod_resources_devices", status="ignored") == 3
    assert allocations(a) == {("0", U0, "net", "router", "c", "nvidia.com/gpu", U0, "1")}
    logged = [r for r in caplog.records if "example.com/sriov-vf" in r.getMessage()]
    assert len(logged) == 1


def test_an_empty_device_id_is_skipped_not_the_ids_after_it(kubelet: FakeKubelet, attribution: Make) -> None:
    gpus = nvidia(U0, U1)
    kubelet.set_response(response([pod("ml", "p", {"c": [("nvidia.com/gpu", ["", " ", U0, "::1"])]})]))
    a = attribution(kubelet.path, gpus)
    assert wait_until(lambda: a.labels_for(gpus[0]), what="GPU 0 after two empty IDs") == who("ml", "p", "c")
    assert allocations(a) == {("0", U0, "ml", "p", "c", "nvidia.com/gpu", U0, "1")}


def test_fields_of_a_newer_kubelet_are_skipped(kubelet: FakeKubelet,
                                               attribution: Make) -> None:
    gpus = nvidia(U0)
    numa = raw_field(1, b"\x08\x01")  # TopologyInfo.nodes = [NUMANode{ID: 1}]
    devices = pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[U0]).SerializeToString()
    devices += raw_field(3, numa)  # ContainerDevices.topology
    ctr = pb.ContainerResources(name="c").SerializeToString() + raw_field(2, devices)
    ctr += raw_field(3, b"\x00\x01\x02")  # ContainerResources.cpu_ids (packed int64)
    ctr += raw_field(4, b"\x0a\x06memory\x10\x80\x08")  # ContainerResources.memory
    body = raw_field(1, pb.PodResources(name="p", namespace="n").SerializeToString() + raw_field(3, ctr))
    kubelet.set_response(body)
    a = attribution(kubelet.path)
    assert wait_until(lambda: a.labels_for(gpus[0])) == who("n", "p", "c")


def test_answer_larger_than_grpc_default_limit(kubelet: FakeKubelet,
                                               attribution: Make) -> None:
    gpus = nvidia(U0)
    busy = [pod(f"ns-{i % 50}", f"worker-{i:05d}", {"app": [("example.com/sriov-vf", [
        f"0000:{i % 256:02x}:{j:02x}.{k}" for j in range(4) for k in range(2)])]}) for i in range(30000)]
    resp = response([*busy, pod("ml", "big-model", {"main": [("nvidia.com/gpu", [U0])]})])
    assert resp.ByteSize() > GRPC_DEFAULT_MAX_RECEIVE_BYTES, "the answer must exceed gRPC's 4 MiB default"
    kubelet.set_response(resp)
    a = attribution(kubelet.path, timeout=5.0)
    assert wait_until(lambda: a.labels_for(gpus[0])) == who("ml", "big-model", "main")
    # Control: gRPC's default limit rejects the same answer, and that is reported, not fatal.
    small = attribution(kubelet.path, timeout=5.0, max_message_bytes=GRPC_DEFAULT_MAX_RECEIVE_BYTES)
    wait_until(lambda: errors(small, "too_large") >= 1,
               what="a too_large error")
    assert small.labels_for(gpus[0]) == {}
    assert value(small, "gpu_exporter_pod_attribution_up") == 0


# --- outages ------------------------------------------------------------------------------------


def test_hang_die_and_come_back(kubelet: FakeKubelet, attribution: Make,
                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = nvidia(U0)
    kubelet.set_response(response([pod("ml", "before", {"c": [("nvidia.com/gpu", [U0])]})]))
    a = attribution(kubelet.path, interval=0.1, timeout=1.0)
    a.update_gpus(gpus)
    assert wait_until(lambda: a.labels_for(gpus[0])).get("pod") == "before"

    kubelet.hang()
    wait_until(lambda: kubelet.hung >= 1, what="a List call held by the hung kubelet")
    began = time.monotonic()
    for _ in range(1000):
        a.labels_for(gpus[0])
        a.families()
    elapsed = time.monotonic() - began
    assert kubelet.hung >= 1, "the measurement must overlap a hung call"
    assert elapsed < 0.9, f"1000 scrapes took {elapsed:.2f}s while the kubelet hung: the scrape path waited"

    wait_until(lambda: a.labels_for(gpus[0]) == {}, timeout=8, what="stale pod labels dropped")
    assert value(a, "gpu_exporter_pod_attribution_up") == 0
    assert errors(a, "timeout") >= 1
    assert allocations(a) == set(), "no stale gpu_allocation_info either"

    kubelet.die()
    assert not os.path.exists(kubelet.path)
    wait_until(lambda: errors(a, "socket_missing") >= 1,
               what="socket_missing errors")

    kubelet.set_response(response([pod("ml", "after", {"c": [("nvidia.com/gpu", [U0])]})]))
    kubelet.start()
    assert wait_until(lambda: a.labels_for(gpus[0]), what="attribution back").get("pod") == "after"
    assert value(a, "gpu_exporter_pod_attribution_up") == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "off:" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "timeout" in warnings[0].getMessage()
    assert any("pod attribution back" in r.getMessage() for r in caplog.records)


def test_missing_then_stale_socket_then_kubelet_starts(attribution: Make,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = nvidia(U0)
    kubelet = FakeKubelet()  # not started: no socket yet
    try:
        a = attribution(kubelet.path)
        wait_until(lambda: errors(a, "socket_missing") >= 2,
                   what="socket_missing errors")
        assert value(a, "gpu_exporter_pod_attribution_up") == 0
        assert a.labels_for(gpus[0]) == {}

        kubelet.die(stale_socket=True)  # a socket file nobody accepts on (kubelet crashed)
        wait_until(lambda: errors(a, "unavailable") >= 1,
                   what="unavailable errors")

        kubelet.set_response(response([pod("ns", "p", {"c": [("nvidia.com/gpu", [U0])]})]))
        kubelet.start()
        assert wait_until(lambda: a.labels_for(gpus[0])) == who("ns", "p", "c")
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "socket_missing" in warnings[0].getMessage()
    finally:
        kubelet.stop()


def test_stop_cancels_a_hung_call(kubelet: FakeKubelet) -> None:
    kubelet.hang()
    a = PodAttribution(kubelet.path, interval=0.1, timeout=20.0)
    a.start()
    wait_until(lambda: kubelet.hung >= 1, what="a hung call")
    began = time.monotonic()
    a.stop()
    assert time.monotonic() - began < 5, "stop() must not wait for the 20 s call timeout"


# --- packaging and arguments ---------------------------------------------------------------------


def test_grpc_is_imported_only_when_attribution_starts() -> None:
    code = (
        "import sys\n"
        "from exporter.k8s.podresources import PodAttribution\n"
        "from exporter.core.readings import GpuReading\n"
        "a = PodAttribution('/nonexistent/kubelet.sock')\n"
        "assert a.labels_for(GpuReading(index=0, uuid='GPU-x')) == {}\n"
        "a.families()\n"
        "print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_generated_code_imports_cleanly_with_installed_runtime() -> None:
    # The committed stubs come from grpcio-tools 1.62 (generate.sh): no runtime-version pin.
    code = "import exporter.k8s.proto.podresources_pb2_grpc"
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("kwargs", "culprit"), [
    ({"interval": 0}, "interval"),
    ({"timeout": -1}, "timeout"),
    ({"max_message_bytes": 10}, "max_message_bytes"),
    ({"socket_path": ""}, "socket_path"),
])
def test_bad_arguments_name_the_culprit(kwargs: dict[str, Any], culprit: str) -> None:
    args: dict[str, Any] = {"socket_path": "/run/kubelet.sock", **kwargs}
    with pytest.raises(ValueError, match=culprit):
        PodAttribution(**args)


@pytest.mark.parametrize(("device_id", "key", "is_slice"), [
    (f"MIG-{U1}/7/0", ("uuid", U1.lower()), True),  # pre-R470 MIG ID: its parent GPU, as a slice of it
    ("MIG-5c3ef2a1-0000-4a5b-8c9d-0000000000ff", ("mig", "mig-5c3ef2a1-0000-4a5b-8c9d-0000000000ff"), True),
    ("0:3", ("index", "nvidia", "0"), True),  # index strategy, MIG instance 3 of GPU 0
    ("0", ("index", "nvidia", "0"), False),
    (U0, ("uuid", U0.lower()), False),
])
def test_device_ids_that_name_a_mig_instance_are_slices(device_id: str, key: tuple[str, ...], is_slice: bool) -> None:
    """A slice never labels its whole GPU: whether an ID names a MIG instance decides that."""
    from exporter.backends import gpu_resources
    from exporter.k8s.podresources import parse_device_id

    assert parse_device_id(device_id, "nvidia", gpu_resources()) == (key, is_slice)


def test_index_keys_are_the_gpus_own_vendor_and_both_for_a_simulated_one() -> None:
    from exporter.backends import gpu_resources
    from exporter.k8s.podresources import reading_keys

    vendors = gpu_resources().vendors
    assert {"nvidia", "amd"} <= set(vendors)
    real = reading_keys(GpuReading(index=2, uuid=U0, vendor="nvidia"), vendors)
    assert ("index", "nvidia", "2") in real and ("index", "amd", "2") not in real
    sim = reading_keys(GpuReading(index=2, uuid=U0, vendor="simulated"), vendors)
    assert ("index", "nvidia", "2") in sim and ("index", "amd", "2") in sim


# --- the vendors' names (GpuResources, exporter/core/k8s_names.py) ------------------------------
# Resource names as the vendors' device plugins publish them: NVIDIA k8s-device-plugin (nvidia.com/gpu;
# time-slicing with renameByDefault: nvidia.com/gpu.shared; MIG strategy mixed: nvidia.com/mig-<profile>,
# .shared when time-sliced too), AMD k8s-device-plugin (amd.com/gpu), Intel device plugins
# (gpu.intel.com/i915, gpu.intel.com/xe), Intel Gaudi (habana.ai/gaudi), AWS Neuron (aws.amazon.com/neuron,
# aws.amazon.com/neuroncore), GKE TPUs (google.com/tpu).


# (resource, the vendor whose device plugin publishes it, whether its devices are slices); None: no vendor's GPU
PUBLISHED: list[tuple[str, str | None, bool]] = [
    ("nvidia.com/gpu", "nvidia", False),
    ("nvidia.com/gpu.shared", "nvidia", False),  # a time-sliced replica is all of the GPU, shared
    ("nvidia.com/mig-1g.10gb", "nvidia", True),
    ("nvidia.com/mig-3g.40gb.shared", "nvidia", True),
    ("amd.com/gpu", "amd", False),
    ("gpu.intel.com/i915", "intel", False), ("gpu.intel.com/xe", "intel", False),
    ("habana.ai/gaudi", "habana", False), ("aws.amazon.com/neuron", "aws", False),
    ("aws.amazon.com/neuroncore", "aws", True), ("google.com/tpu", "google", False),
    ("example.com/nvidia.com/gpu", None, False), ("nvidia.com/gpu-metrics", None, False),
    ("nvidia.com/gpux", None, False), ("nvidia.com/mig-", None, False), ("amd.com/gpu/x", None, False),
    ("NVIDIA.COM/GPU", None, False),
]


@pytest.mark.parametrize(("resource", "vendor", "slices"), PUBLISHED)
def test_resource_names_are_the_declaring_vendors_and_no_one_elses(resource: str, vendor: str | None,
                                                                   slices: bool) -> None:
    """Whose GPU a resource name is and whether its devices are slices: the publishing vendor's when a backend of
    the registry is that vendor's, else no one's (another vendor's name is not taken)."""
    from exporter.backends import gpu_resources
    from exporter.k8s.podresources import classify_resource

    resources = gpu_resources()
    kind = (vendor, slices) if vendor in resources.vendors else None
    assert classify_resource(resource, resources) == kind


def test_index_prefixes_of_several_vendors_and_of_none() -> None:
    """GKE's ``nvidiaN`` is NVIDIA's GPU N; a second vendor's prefix is its own; without a prefix a bare or
    prefixed number is no vendor's index form (a plain ``N`` is the resource's vendor's, parse_device_id)."""
    from exporter.core.k8s_names import DevicePluginResource, GpuResources, KubernetesNames

    both = GpuResources({"nvidia": KubernetesNames(index_prefix="nvidia", dra_drivers=("gpu.nvidia.com",)),
                         "acme": KubernetesNames(resources=(DevicePluginResource(r"acme\.example/gpu"),),
                                                 index_prefix="acme-gpu", dra_drivers=("gpu.acme.example",))})
    assert both.prefixed_index("nvidia3") == ("nvidia", 3, None)
    assert both.prefixed_index("nvidia12/vgpu0") == ("nvidia", 12, "vgpu0")
    assert both.prefixed_index("acme-gpu2/1g.5gb") == ("acme", 2, "1g.5gb")
    assert [both.prefixed_index(i) for i in ("3", "nvidia", "nvidiax3", "acme3", "gpu2")] == [None] * 5
    assert both.vendors == ("nvidia", "acme")
    assert both.dra_drivers == {"gpu.nvidia.com", "gpu.acme.example"}
    assert both.classify("acme.example/gpu") == ("acme", False) and both.classify("nvidia.com/gpu") is None
    for none in (GpuResources(), GpuResources({"acme": KubernetesNames(dra_drivers=("gpu.acme.example",))})):
        assert [none.prefixed_index(i) for i in ("0", "nvidia0", "acme-gpu0/vgpu1")] == [None] * 3
        assert none.classify("nvidia.com/gpu") is None
