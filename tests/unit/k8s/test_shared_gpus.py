"""Per-pod utilisation and memory on shared GPUs (--per-process): the real exporter over the fake
NVML (time-slicing and MPS fleets), a fake host /proc with real cgroup path formats, and the real
kubernetes client watching this node's Pods on the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.readings import GpuReading
from exporter.k8s import cgroup
from exporter.k8s.processes import EMPTY_INDEX, build, index_pods, render
from tests.fakes.fakenvml import FakeNvml, mps, time_slicing
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.pods import C, U, add_pods, make_proc, pod_series
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics

GIB = 1 << 30


def shared_fleet(fleet: FakeNvml) -> None:
    time_slicing(fleet, 0, [(1001, 2 * GIB, 40), (1002, GIB, 30), (2001, 4 * GIB, 50), (2002, GIB, 45),
                            (3001, GIB // 2, 5), (4001, GIB, 10)])
    mps(fleet, 1, server=6000, clients=[(6001, 3 * GIB, 20), (6002, 2 * GIB, None)])
    time_slicing(fleet, 2, [(5001, GIB, 80), (5002, GIB, 70)])


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    return make_proc(tmp_path / "proc")


def start(fleet: FakeNvml, proc_root: Path, kubeconfig: Path | None, *args: str) -> ExporterProcess:
    env = {**fleet.env(), "PROC_ROOT": str(proc_root), "NODE_NAME": "node-1",
           "KUBECONFIG": str(kubeconfig) if kubeconfig else "/nonexistent"}
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--per-process", "--pod-attribution", "off",
                            *args], env=env)


@pytest.fixture
def exporter(tmp_path: Path, kubeapi: FakeKubeAPI, proc_root: Path) -> Iterator[tuple[FakeNvml, ExporterProcess]]:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=4)
    shared_fleet(fleet)
    add_pods(kubeapi)
    with start(fleet, proc_root, kubeapi.kubeconfig(tmp_path / "kubeconfig")) as ex:
        yield fleet, ex


def wait_pods(ex: ExporterProcess, n: int) -> dict:
    return wait_until(lambda: (s := ex.scrape()) and len(pod_series(s, "gpu_pod_memory_used_bytes")) >= n and s,
                      timeout=20, what=f"{n} per-pod memory series")


def test_time_slicing_and_mps_pods_get_their_own_readings(exporter: tuple[FakeNvml, ExporterProcess]) -> None:
    _, ex = exporter
    s = wait_pods(ex, 7)
    util = pod_series(s, "gpu_pod_utilization_ratio")
    mem = pod_series(s, "gpu_pod_memory_used_bytes")
    assert util == pytest.approx({
        ("0", "ml", "train-a", "trainer"): 0.70,   # two processes of one container: summed
        ("0", "ml", "train-b", ""): 0.95,          # two containers: one series, no container label
        ("0", "", "", ""): 0.05,                   # outside any pod: empty labels, not made up
        ("1", "", "", ""): 0.0,                    # the MPS server (no sample: it ran nothing)
        ("1", "ml", "mps-a", "infer"): 0.20,
        ("2", "batch", "hog", "main"): 1.0,        # 0.8 + 0.7, capped at 1
    })
    assert ("1", "ml", "mps-b", "infer") not in util  # an MPS client without a sample: absent, never 0
    assert mem == {
        ("0", "ml", "train-a", "trainer"): 3.0 * GIB, ("0", "ml", "train-b", ""): 5.0 * GIB,
        ("0", "", "", ""): 0.5 * GIB, ("1", "", "", ""): 0.0, ("1", "ml", "mps-a", "infer"): 3.0 * GIB,
        ("1", "ml", "mps-b", "infer"): 2.0 * GIB, ("2", "batch", "hog", "main"): 2.0 * GIB,
    }
    assert not any(p == "unknown" or "4001" in p for _, _, p, _ in mem)  # the unknown pod's process: left out
    assert sample(s, "gpu_exporter_pod_processes", status="unknown_pod") == 1
    assert sample(s, "gpu_exporter_pod_processes", status="in_pod") == 8
    assert not [k for k in s if k[0] == "gpu_pod_memory_used_bytes" and dict(k[1])["gpu"] == "3"]
    check_metrics(ex.scrape_text())


def test_pods_come_and_go_through_the_watch(exporter: tuple[FakeNvml, ExporterProcess],
                                            kubeapi: FakeKubeAPI) -> None:
    fleet, ex = exporter
    wait_pods(ex, 7)
    kubeapi.add_pod("late", "ml", uid=U[4], containers={"main": f"containerd://{C[4]}"})
    fleet.write()  # a new collection (the fleet is unchanged)
    s = wait_until(lambda: (s := ex.scrape()) and ("0", "ml", "late", "main") in
                   pod_series(s, "gpu_pod_memory_used_bytes") and s, timeout=20, what="the new pod")
    assert pod_series(s, "gpu_pod_utilization_ratio")[("0", "ml", "late", "main")] == pytest.approx(0.10)
    reqs = [r for r in kubeapi.requests if r.resource == "pods"]
    assert reqs and all(r.query.get("fieldSelector") == "spec.nodeName=node-1" for r in reqs)
    assert {r.verb for r in reqs} <= {"list", "watch"}


@pytest.mark.parametrize("omit", [("nvmlDeviceGetProcessesUtilizationInfo",), ()],
                         ids=["R535-set", "R550-set"])
def test_process_utilisation_probes_the_newest_function(tmp_path: Path, proc_root: Path, kubeapi: FakeKubeAPI,
                                                        omit: tuple[str, ...]) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1, omit=omit)
    time_slicing(fleet, 0, [(1001, GIB, 40)])
    if not omit:  # the R550+ call is used: the old one failing changes nothing
        fleet.fail("nvmlDeviceGetProcessUtilization", FakeNvml.UNKNOWN)
    add_pods(kubeapi)
    with start(fleet, proc_root, kubeapi.kubeconfig(tmp_path / "kc")) as ex:
        s = wait_pods(ex, 1)
        assert pod_series(s, "gpu_pod_utilization_ratio") == pytest.approx({("0", "ml", "train-a", "trainer"): 0.4})


def test_no_utilisation_function_leaves_utilisation_absent(tmp_path: Path, proc_root: Path,
                                                           kubeapi: FakeKubeAPI) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1,
                     omit=("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"))
    time_slicing(fleet, 0, [(1001, GIB, 40)])
    add_pods(kubeapi)
    with start(fleet, proc_root, kubeapi.kubeconfig(tmp_path / "kc")) as ex:
        s = wait_pods(ex, 1)
        assert pod_series(s, "gpu_pod_memory_used_bytes") == {("0", "ml", "train-a", "trainer"): GIB}
        assert pod_series(s, "gpu_pod_utilization_ratio") == {}


def test_without_an_api_processes_in_pods_are_left_out(tmp_path: Path, proc_root: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    time_slicing(fleet, 0, [(1001, GIB, 40), (3001, GIB, 5)])
    with start(fleet, proc_root, None) as ex:
        s = wait_pods(ex, 1)
        assert pod_series(s, "gpu_pod_memory_used_bytes") == {("0", "", "", ""): GIB}
        assert sample(s, "gpu_exporter_pod_processes", status="unknown_pod") == 1
        assert "without pod names" in ex.log()


def test_bad_proc_root_exits_2(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    bad = ExporterProcess(["--backend", "nvml", "--per-process", "--proc-root", str(tmp_path / "nope")],
                          env=fleet.env(), wait=False)
    assert bad.proc.wait(20) == 2
    log = bad.log().strip().splitlines()
    assert len(log) == 1 and "proc_root" in log[0] and "--proc-root" in log[0] and "Traceback" not in bad.log()
    check = ExporterProcess(["--per-process", "--proc-root", str(tmp_path / "nope"), "--check-config"],
                            env=fleet.env(), wait=False)
    assert check.proc.wait(20) == 2  # --check-config refuses it too


# --- the per-pod build itself ------------------------------------------------------------------------


def _reading(pids: dict[int, tuple[float | None, float | None]], index: int = 0) -> GpuReading:
    r = GpuReading(index=index, uuid=f"GPU-{index}", vendor="nvidia")
    r.process_pids = tuple(pids)
    r.process_memory_by_pid = {p: m for p, (m, _) in pids.items() if m is not None}
    r.process_utilization_by_pid = {p: u for p, (_, u) in pids.items() if u is not None}
    return r


def test_build_rules(proc_root: Path) -> None:
    objects = {U[1]: {"metadata": {"name": "a", "namespace": "n", "uid": U[1]},
                      "status": {"containerStatuses": [{"name": "c", "containerID": f"containerd://{C[1]}"}]}}}
    index = index_pods(objects)
    r = _reading({1001: (1.0, 0.5), 1002: (None, 0.2), 3001: (2.0, None), 999999: (5.0, 0.9)})
    view = build([r], index, str(proc_root))
    (_, _, rows), = view.gpus
    got = dict(rows)
    assert got[("n", "a", "c")].utilization == pytest.approx(0.7)
    assert got[("n", "a", "c")].memory is None  # one process without memory: the pod's memory is absent
    assert got[("", "", "")].utilization is None and got[("", "", "")].memory == 2.0
    assert view.processes == {"in_pod": 2, "outside_pod": 1, "unknown_pod": 0, "gone": 1}
    assert build([r], EMPTY_INDEX, str(proc_root)).processes["unknown_pod"] == 2
    names = {m.name for m in render(view)}
    assert names == {"gpu_pod_utilization_ratio", "gpu_pod_memory_used_bytes", "gpu_exporter_pod_processes"}


def test_static_pod_found_by_its_mirror_annotation() -> None:
    h = "6d5e0f3c9a8b7c6d5e4f3a2b1c0d9e8f"
    index = index_pods({"m": {"metadata": {"name": "etcd-node-1", "namespace": "kube-system", "uid": "m",
                                           "annotations": {"kubernetes.io/config.mirror": h}}}})
    ref = cgroup.parse(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{h}.slice/"
                       f"cri-containerd-{C[1]}.scope\n")
    assert ref is not None and index.holder(ref) == ("kube-system", "etcd-node-1", "")


def test_without_the_kubernetes_package_exits_2_naming_the_extra(tmp_path: Path, proc_root: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "kubernetes.py").write_text("raise ImportError('No module named kubernetes')\n")
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    bad = ExporterProcess(["--backend", "nvml", "--per-process", "--proc-root", str(proc_root)],
                          env={**fleet.env(), "PYTHONPATH": str(shim)}, wait=False)
    assert bad.proc.wait(20) == 2
    lines = bad.log().strip().splitlines()
    assert len(lines) == 1 and "[k8s]" in lines[0] and "not on PyPI" in lines[0]


def test_a_container_id_of_another_pod_is_not_taken() -> None:
    """Issue 36 item 6: a privileged pod names a child cgroup of its own pod after the victim's container:
    the process stays in its own pod (the kubelet's pod component), never charged to the victim."""
    objects = {U[1]: {"metadata": {"name": "attacker", "namespace": "t", "uid": U[1]},
                      "status": {"containerStatuses": [{"name": "c", "containerID": f"containerd://{C[1]}"}]}},
               U[2]: {"metadata": {"name": "victim", "namespace": "v", "uid": U[2]},
                      "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{C[2]}"}]}}}
    index = index_pods(objects)
    assert index.holder(cgroup.CgroupRef(U[1], C[2])) == ("t", "attacker", "")
    assert index.holder(cgroup.CgroupRef(U[2], C[2])) == ("v", "victim", "main")
    assert index.holder(cgroup.CgroupRef(U[1], C[1])) == ("t", "attacker", "c")
    assert index.holder(cgroup.CgroupRef(U[3], C[2])) is None  # a pod this node does not know: left out
    ref = cgroup.parse_path(f"/kubepods/pod{U[1]}/{C[1]}/pod{U[2]}/{C[2]}")
    assert ref is not None and index.holder(ref) == ("t", "attacker", "c")


def _big_pod(i: int) -> dict:
    """A pod of about 1 MiB of JSON, as big pods are: a kubectl last-applied annotation and a container
    with thousands of environment variables (many small objects: what costs Python the most memory)."""
    env = [{"name": f"VAR_{i}_{k:05d}", "value": f"value-{k:08d}-{'x' * 40}"} for k in range(7000)]
    return {"metadata": {"name": f"big-{i:03d}", "namespace": "bulk", "uid": f"{i:08x}-0000-4000-8000-000000000000",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "y" * (400 << 10)},
                         "labels": {f"l{k}": "v" for k in range(200)}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "x", "env": env}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{i:064x}", "ready": True, "restartCount": 0,
                 "image": "x", "imageID": ""}]}}


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_hundred_pods_of_a_megabyte_stay_under_the_daemonsets_limit(tmp_path: Path, kubeapi: FakeKubeAPI,
                                                                        proc_root: Path) -> None:
    """Issue 36 item 2: the pod watch kept whole Pod objects (+8.3 MiB RSS per pod of 1.2 MiB JSON): 7 such
    pods passed the DaemonSet's 128 MiB limit. Now each pod is reduced to its name, namespace, UID and
    container IDs as it is decoded, a list item by item: 100 pods of 1 MiB, listed, then 10 more through the
    watch and a relist, keep the exporter's peak RSS under 128 MiB, and the mapping still works."""
    import json

    assert len(json.dumps(_big_pod(0))) > 1 << 20
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=4)
    shared_fleet(fleet)
    add_pods(kubeapi)
    for i in range(100):
        kubeapi.put_object("/api/v1/pods", _big_pod(i))
    def mapped(ex: ExporterProcess) -> dict:  # a 100 MiB list takes a while on a loaded machine
        return wait_until(lambda: (s := ex.scrape()) and len(pod_series(s, "gpu_pod_memory_used_bytes")) >= 5 and s,
                          timeout=120, what="5 per-pod memory series")

    with start(fleet, proc_root, kubeapi.kubeconfig(tmp_path / "kubeconfig")) as ex:
        mapped(ex)
        for i in range(100, 110):  # through the watch
            kubeapi.put_object("/api/v1/pods", _big_pod(i))
        wait_until(lambda: kubeapi.requests and sum(1 for r in kubeapi.requests if r.verb == "watch") >= 1,
                   what="the watch")
        lists = sum(1 for r in kubeapi.requests if r.verb == "list")
        kubeapi.expire_watches()
        wait_until(lambda: sum(1 for r in kubeapi.requests if r.verb == "list") > lists, timeout=60,
                   what="a list again")
        s = mapped(ex)
        assert pod_series(s, "gpu_pod_memory_used_bytes")[("0", "ml", "train-a", "trainer")] == 3 * GIB
        peak = _peak_rss_mib(ex.proc.pid)
    assert peak < 128, f"peak RSS {peak:.1f} MiB"


def test_pod_summary_keeps_only_what_the_mapping_reads_and_bounds_it() -> None:
    from exporter.k8s.processes import MAX_CONTAINERS, pod_summary

    h = "6d5e0f3c9a8b7c6d5e4f3a2b1c0d9e8f"
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": U[1], "labels": {"a": "b"},
                        "annotations": {"kubernetes.io/config.mirror": h, "other": "x" * 1000},
                        "managedFields": [{"big": "y" * 1000}]},
           "spec": {"containers": [{"name": "c", "env": [{"name": "E", "value": "v"}] * 100}]},
           "status": {"phase": "Running",
                      "containerStatuses": [{"name": "c", "containerID": f"containerd://{C[1]}", "image": "i"},
                                            {"name": "waiting"}],
                      "initContainerStatuses": [{"name": "i", "containerID": f"containerd://{C[2]}"}],
                      "ephemeralContainerStatuses": [{"name": "e", "containerID": f"containerd://{C[3]}"}]}}
    s = pod_summary(pod)
    assert s == {"metadata": {"name": "p", "namespace": "n", "uid": U[1],
                              "annotations": {"kubernetes.io/config.mirror": h}},
                 "status": {"containerStatuses": [{"name": "c", "containerID": f"containerd://{C[1]}"}],
                            "initContainerStatuses": [{"name": "i", "containerID": f"containerd://{C[2]}"}],
                            "ephemeralContainerStatuses": [{"name": "e", "containerID": f"containerd://{C[3]}"}]}}
    assert index_pods({"x": s}) == index_pods({"x": pod})
    # hostile shapes and sizes: nothing raises, nothing unbounded is kept
    many = {"metadata": {"name": "m" * 600, "namespace": 5, "uid": U[2]},
            "status": {"containerStatuses": [{"name": f"c{i}", "containerID": f"containerd://{i:064x}"}
                                             for i in range(MAX_CONTAINERS + 50)],
                       "initContainerStatuses": [{"name": "late", "containerID": f"containerd://{C[4]}"}]}}
    s = pod_summary(many)
    assert s["metadata"] == {"name": "", "namespace": "", "uid": U[2]}
    assert len(s["status"]["containerStatuses"]) == MAX_CONTAINERS and "initContainerStatuses" not in s["status"]
    assert pod_summary({"metadata": [], "status": "x"}) == {"metadata": {"name": "", "namespace": "", "uid": ""},
                                                             "status": {}}
    odd = pod_summary({"metadata": {"annotations": {"kubernetes.io/config.mirror": "z" * 600}},
                       "status": {"containerStatuses": ["x", {"containerID": "c" * 600}, {"containerID": 7}],
                                  "initContainerStatuses": "nope"}})
    assert "annotations" not in odd["metadata"] and odd["status"] == {}
    edge = pod_summary({"metadata": {"name": "n" * 512, "uid": "u"}})
    assert edge["metadata"]["name"] == "n" * 512


def test_build_and_render_edge_cases(proc_root: Path) -> None:
    """From the processes mutation run: sums, caps, skipped readings, containers, and what is rendered."""
    from exporter.k8s.processes import PodReading, View

    objects = {U[1]: {"metadata": {"name": "a", "namespace": "n", "uid": U[1]},
                      "status": {"containerStatuses": [{"name": "c", "containerID": f"containerd://{C[1]}"}]}},
               U[2]: {"metadata": {"name": "b", "namespace": "m", "uid": U[2]},
                      "status": {"containerStatuses": [{"name": "w", "containerID": f"cri-o://{C[2]}"},
                                                       {"name": "s", "containerID": f"cri-o://{C[3]}"}]}}}
    index = index_pods(objects)
    skipped = _reading({1001: (1.0, 0.5)}, index=7)
    skipped.process_pids = None
    down = _reading({1001: (1.0, 0.5)}, index=8)
    down.up = False
    both = _reading({1001: (1.0, 0.7), 1002: (2.0, 0.6), 2001: (3.0, 0.1), 2002: (4.0, 0.2)}, index=2)
    no_util = _reading({1001: (1.0, None)}, index=3)
    no_util.process_utilization_by_pid = None  # the driver has no per-process utilisation
    view = build([skipped, down, both, no_util], index, str(proc_root))
    assert [g[0] for g in view.gpus] == ["2", "3"]
    rows = dict(view.gpus[0][2])
    assert rows[("n", "a", "c")] == PodReading(1.0, 3.0)  # 0.7 + 0.6 capped at 1; memory summed
    assert rows[("m", "b", "")] == PodReading(pytest.approx(0.3), 7.0)  # two containers: none named
    assert dict(view.gpus[1][2]) == {("n", "a", "c"): PodReading(None, 1.0)}
    metrics = {m.name: {tuple(s.labels.values()): s.value for s in m.samples} for m in render(
        View((("0", "GPU-0", ((("n", "a", "c"), PodReading(0.5, None)), (("n", "b", ""), PodReading(None, 9.0)))),),
             {"in_pod": 3}))}
    assert metrics["gpu_pod_utilization_ratio"] == {("0", "GPU-0", "a", "n", "c"): 0.5}
    assert metrics["gpu_pod_memory_used_bytes"] == {("0", "GPU-0", "b", "n", ""): 9.0}
    assert metrics["gpu_exporter_pod_processes"] == {("in_pod",): 3.0, ("outside_pod",): 0.0, ("unknown_pod",): 0.0,
                                                     ("gone",): 0.0}


def test_index_pods_edge_cases() -> None:
    from exporter.k8s.processes import pod_summary

    index = index_pods({
        "x": {"metadata": {"uid": "nameless"}},  # no name: never a holder, and the next pod still indexed
        "y": {"metadata": {"name": "p", "uid": U[1].upper(), "annotations": {"kubernetes.io/config.mirror": 5}},
              "status": {"containerStatuses": [{"containerID": "containerd://ABC://def"}, {"name": "q"}]}},
        "z": {"metadata": {"name": "r", "namespace": "ns"}}})
    assert index.by_uid == {U[1]: ("", "p")}
    assert index.by_container == {"abc://def": ("", "p", "")}
    assert index.holder(cgroup.CgroupRef(U[1], "abc://def")) == ("", "p", "")
    kept = pod_summary({"metadata": {"name": "p", "uid": "u"},
                        "status": {"containerStatuses": "x",
                                   "initContainerStatuses": [{"name": "i", "containerID": f"containerd://{C[2]}"}]}})
    assert kept["status"] == {"initContainerStatuses": [{"name": "i", "containerID": f"containerd://{C[2]}"}]}
