"""Pod attribution through the real exporter process and a real gRPC kubelet on a unix socket."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.kubelet import FakeKubelet, pod, response
from tests.harness.exporter import ExporterProcess, parse_samples
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics

GPU0 = "GPU-5140a7ed-0000-4000-8000-000000000000"
GPU1 = "GPU-5140a7ed-0000-4000-8000-000000000001"


def pods_on(text: str, metric: str) -> dict[str, str]:
    """gpu index -> pod label of ``metric`` samples."""
    out = {}
    for (name, labels), _ in parse_samples(text).items():
        lab = dict(labels)
        if name == metric and "pod" in lab:
            out[lab["gpu"]] = lab["pod"]
    return out


def test_pod_labels_follow_the_kubelet(tmp_path: Path) -> None:
    with FakeKubelet() as kubelet:
        kubelet.set_response(response([
            pod("ml", "train-0", {"c": [("nvidia.com/gpu", [GPU0])]}),
            pod("ml", "share-a", {"c": [("nvidia.com/gpu", [GPU1 + "::0"])]}),
            pod("dev", "share-b", {"c": [("nvidia.com/gpu", [GPU1 + "::1"])]}),
        ]))
        with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2", "--cache-ttl", "0",
                              "--pod-attribution", "on", "--pod-resources-socket", str(kubelet.path),
                              "--pod-resources-interval", "1"]) as ex:
            text = wait_until(lambda: (t := ex.scrape_text()) and pods_on(t, "gpu_power_watts") and t, 20,
                              what="pod labels on GPU 0")
            assert check_metrics(text) == []
            # exclusive GPU 0 carries the pod; time-sliced GPU 1 carries none (its value is the whole device)
            assert pods_on(text, "gpu_power_watts") == {"0": "train-0"}
            alloc = [dict(ls) for (n, ls), _ in parse_samples(text).items() if n == "gpu_allocation_info"]
            shared = {a["pod"]: a["shared"] for a in alloc if a["gpu"] == "1"}
            assert shared == {"share-a": "2", "share-b": "2"}

            kubelet.die()
            wait_until(lambda: "pod=" not in ex.scrape_text(), 30, what="stale pod labels dropped")
            samples = parse_samples(ex.scrape_text())
            assert any(n == "gpu_power_watts" for n, _ in samples)
            assert any(n == "gpu_exporter_pod_attribution_up" and v == 0 for (n, _), v in samples.items())

            kubelet.set_response(response([pod("ml", "train-1", {"c": [("nvidia.com/gpu", [GPU0])]})]))
            kubelet.start()
            wait_until(lambda: pods_on(ex.scrape_text(), "gpu_power_watts") == {"0": "train-1"}, 30,
                       what="attribution resumes")
            assert ex.log().count("pod-resources") < 10  # one warning per outage, not per scrape
