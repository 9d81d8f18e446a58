"""Pods whose processes share GPUs: a fake ``/proc`` (each pid's cgroup file) and the matching pods for the
fake API server, for the per-pod tests of every backend (tests/unit/k8s/test_shared_gpus.py for NVML,
tests/unit/backends/test_amdsmi_processes.py for AMD)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.kubeapi import FakeKubeAPI

U = {k: f"{k:08x}-1a4d-4b7e-9c0f-2d5e8a1b3c4d" for k in range(1, 8)}  # pod UIDs
C = {k: f"{k:02x}" * 32 for k in range(1, 12)}  # container IDs


def _systemd_v2(uid: str, cid: str, runtime: str = "cri-containerd") -> str:
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/{runtime}-{cid}.scope\n"


def _cgroupfs_v1(uid: str, cid: str) -> str:
    return "".join(f"{i}:{c}:/kubepods/besteffort/pod{uid}/crio-{cid}\n"
                   for i, c in ((4, "memory"), (3, "cpu,cpuacct"), (2, "devices"), (1, "name=systemd")))


# pid -> /proc/<pid>/cgroup
CGROUPS = {
    1001: _systemd_v2(U[1], C[1]), 1002: _systemd_v2(U[1], C[1]),          # train-a/trainer (containerd, v2)
    2001: _cgroupfs_v1(U[2], C[2]), 2002: _cgroupfs_v1(U[2], C[3]),        # train-b: two containers (CRI-O, v1)
    3001: "0::/system.slice/jupyter.service\n",                             # a host process
    4001: _systemd_v2(U[4], C[4]),                                          # a pod the API does not know
    5001: _systemd_v2(U[5], C[5], "crio"), 5002: _systemd_v2(U[5], C[5], "crio"),  # hog (CRI-O, v2)
    6000: "0::/system.slice/nvidia-mps.service\n",                          # the MPS server, on the host
    6001: _systemd_v2(U[6], C[6]), 6002: _systemd_v2(U[7], C[7]),           # MPS clients
}


def make_proc(root: Path) -> Path:
    """A fake ``/proc`` under ``root``: ``self`` and each pid of :data:`CGROUPS` with its cgroup file."""
    (root / "self").mkdir(parents=True)
    for pid, text in CGROUPS.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(text)
    return root


def add_pods(api: FakeKubeAPI) -> None:
    """The pods of :data:`CGROUPS` on node-1 (4001's pod left out: one the API does not know), and one elsewhere."""
    api.add_pod("train-a", "ml", uid=U[1], containers={"trainer": f"containerd://{C[1]}"})
    api.add_pod("train-b", "ml", uid=U[2], containers={"worker": f"cri-o://{C[2]}", "sidecar": f"cri-o://{C[3]}"})
    api.add_pod("hog", "batch", uid=U[5], containers={"main": f"cri-o://{C[5]}"})
    api.add_pod("mps-a", "ml", uid=U[6], containers={"infer": f"containerd://{C[6]}"})
    api.add_pod("mps-b", "ml", uid=U[7], containers={"infer": f"containerd://{C[7]}"})
    api.add_pod("elsewhere", "ml", node="node-2", containers={"x": f"containerd://{C[9]}"})


def pod_series(samples: dict, name: str) -> dict[tuple[str, str, str, str], float]:
    """(gpu, namespace, pod, container) -> value of the ``name`` samples of a scrape (``ExporterProcess.scrape()``)."""
    out = {}
    for (metric, labels), v in samples.items():
        if metric == name:
            d = dict(labels)
            out[(d["gpu"], d["namespace"], d["pod"], d["container"])] = v
    return out
