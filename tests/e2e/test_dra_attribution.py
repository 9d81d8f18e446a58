"""DRA and MIG pod labels through the real exporter process: a real gRPC kubelet serving
dynamic_resources, the real kubernetes client (found through KUBECONFIG, as outside a cluster)
watching ResourceSlices on the fake API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import dra_slices as ds
from tests.fakes.kubelet import FakeKubelet, pod, response
from tests.harness.exporter import REPO, ExporterProcess, free_port, parse_samples
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics

NODE = "sim-node"
GPU = "GPU-5140a7ed-0000-4000-8000-{:012d}"  # the simulated backend's UUIDs
MIG = "MIG-5140a7ed-{:04d}-4000-8000-{:012d}"  # GPU index, instance number (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb)


def labelled(text: str, metric: str) -> dict[tuple[str, str], str]:
    """(gpu, mig_uuid or "") -> pod of ``metric`` samples that carry a pod."""
    out = {}
    for (name, labels), _ in parse_samples(text).items():
        lab = dict(labels)
        if name == metric and lab.get("pod"):
            out[(lab["gpu"], lab.get("mig_uuid", ""))] = lab["pod"]
    return out


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_dra_and_mig_pod_labels_end_to_end(tmp_path: Path, mode: str) -> None:
    with FakeKubeAPI() as api, FakeKubelet() as kubelet:
        api.slice_versions = ("v1beta1",)  # a 1.32 API server
        api.put_resource_slice(ds.resource_slice("sim-node-gpu", NODE, ds.NVIDIA, [
            ds.nvidia_gpu(7, GPU.format(1), "0000:11:00.0"),
            ds.nvidia_mig(3, GPU.format(0), None, "2g.20gb", 14, 4, "0000:10:00.0"),  # parent + profile
            ds.nvidia_mig(3, GPU.format(0), MIG.format(0, 2), "1g.10gb", 19, 6, "0000:10:00.0"),  # by uuid
        ]))
        kubelet.set_response(response([
            pod("ml", "dra-full", {}, claims={"main": [("whole", "ml", [(ds.NVIDIA, NODE, "gpu-7")])]}),
            pod("ml", "dra-mig", {}, claims={"main": [("slice", "ml", [(ds.NVIDIA, NODE, "gpu-3-mig-2g20gb-14-4")])]}),
            pod("dev", "dra-mig-2", {}, claims={"w": [("s2", "dev", [(ds.NVIDIA, NODE, "gpu-3-mig-1g10gb-19-6")])]}),
            pod("dev", "plugin-mig", {"c": [("nvidia.com/mig-3g.40gb", [MIG.format(0, 0)])]}),
        ]))
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")), "NODE_NAME": NODE}
        with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2", "--simulated-scenario", "mig",
                              "--cache-ttl", "0", "--pod-attribution", "on", "--pod-resources-socket", kubelet.path,
                              "--pod-resources-interval", "1", "--dra-attribution", mode], env=env) as ex:
            want = {("1", ""): "dra-full", ("0", MIG.format(0, 1)): "dra-mig", ("0", MIG.format(0, 2)): "dra-mig-2",
                    ("0", MIG.format(0, 0)): "plugin-mig"}

            def seen() -> dict[tuple[str, str], str]:
                t = ex.scrape_text()
                return {**labelled(t, "gpu_power_watts"), **labelled(t, "gpu_mig_memory_used_bytes")}

            wait_until(lambda: seen() == want, 30, what=f"pod labels {want}")
            text = ex.scrape_text()
            assert check_metrics(text) == []
            assert parse_samples(text)[("gpu_exporter_dra_attribution_up", frozenset())] == 1
            # the partitioned GPU 0 itself has no one holder; the 4th instance (a second 1g.10gb) none
            assert ("0", "") not in labelled(text, "gpu_power_watts")
            for (name, labels), _ in parse_samples(text).items():
                assert len(labels) <= 12, (name, labels)
            claims = {dict(ls)["pod"]: dict(ls)["claim"] for (n, ls), _ in parse_samples(text).items()
                      if n == "gpu_allocation_info"}
            assert claims == {"dra-full": "whole", "dra-mig": "slice", "dra-mig-2": "s2", "plugin-mig": ""}
        reqs = [r for r in api.requests if r.resource == "resourceslices"]
        assert reqs and {r.verb for r in reqs} <= {"get", "list", "watch"}
        assert {r.path for r in reqs if r.status == 200} == {"/apis/resource.k8s.io/v1beta1/resourceslices"}


def run_serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--port", str(free_port()),
           "--address", "127.0.0.1", *args]
    return subprocess.run(cmd, env={**base, **env}, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_dra_on_without_what_it_needs_exits_2_with_one_line(tmp_path: Path) -> None:
    sock = str(tmp_path / "kubelet.sock")
    common = ["--pod-attribution", "on", "--pod-resources-socket", sock, "--dra-attribution", "on"]
    no_node = run_serve(common, {"KUBECONFIG": str(tmp_path / "missing")})
    assert no_node.returncode == 2
    assert no_node.stderr.strip().count("\n") == 0 and "NODE_NAME" in no_node.stderr, no_node.stderr

    shim = tmp_path / "shim" / "kubernetes"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'kubernetes\'")\n')
    missing = run_serve(common, {"NODE_NAME": NODE, "PYTHONPATH": f"{shim.parent}:{REPO}"})
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "[k8s]" in missing.stderr, missing.stderr

    no_config = run_serve(common, {"NODE_NAME": NODE, "KUBECONFIG": str(tmp_path / "missing")})
    assert no_config.returncode == 2
    assert no_config.stderr.strip().count("\n") == 0 and "Kubernetes" in no_config.stderr, no_config.stderr

    conflict = run_serve(["--pod-attribution", "off", "--dra-attribution", "on"], {"NODE_NAME": NODE})
    assert conflict.returncode == 2 and "pod_attribution" in conflict.stderr

    bad = run_serve(["--dra-attribution", "sometimes"], {})
    assert bad.returncode == 2 and "dra" in bad.stderr.lower()
    bad_env = run_serve([], {"DRA_ATTRIBUTION": "yes"})
    assert bad_env.returncode == 2 and "DRA_ATTRIBUTION" in bad_env.stderr


def test_dra_on_is_never_ignored_when_pod_attribution_would_not_start(tmp_path: Path) -> None:
    """Issue 38, item 6: with the default --pod-attribution auto and no kubelet socket directory (a
    plain host), --dra-attribution on served normally with no log line. A setting we accept is a
    promise: it exits 2 with one line naming what is missing, whichever it is."""
    sock = str(tmp_path / "no-kubelet" / "kubelet.sock")
    common = ["--pod-resources-socket", sock, "--dra-attribution", "on"]
    no_node = run_serve(common, {"KUBECONFIG": str(tmp_path / "missing")})
    assert no_node.returncode == 2, no_node.stderr
    assert no_node.stderr.strip().count("\n") == 0 and "NODE_NAME" in no_node.stderr, no_node.stderr

    shim = tmp_path / "shim" / "kubernetes"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'kubernetes\'")\n')
    missing = run_serve(common, {"NODE_NAME": NODE, "PYTHONPATH": f"{shim.parent}:{REPO}"})
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "[k8s]" in missing.stderr, missing.stderr

    no_config = run_serve(common, {"NODE_NAME": NODE, "KUBECONFIG": str(tmp_path / "missing")})
    assert no_config.returncode == 2, no_config.stderr
    assert no_config.stderr.strip().count("\n") == 0 and "Kubernetes" in no_config.stderr, no_config.stderr

    with FakeKubeAPI() as api:  # everything DRA needs, but no pod-resources socket directory to read claims from
        env = {"NODE_NAME": NODE, "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
        no_socket = run_serve(common, env)
    assert no_socket.returncode == 2, no_socket.stderr
    line = no_socket.stderr.strip()
    assert line.count("\n") == 0 and "--dra-attribution on" in line and sock in line, line
