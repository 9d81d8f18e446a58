"""Exposition escaping of hostile label values, end to end.

The fake NVML library reports a GPU name with quotes and backslashes (its fleet file cannot
carry a newline, and NVML's 96-byte name buffer holds no line break either), and the fake
kubelet allocates that GPU to a pod, namespace and container whose names carry quotes,
backslashes, newlines, a carriage return and non-ASCII text (the kubelet validates none of
it on this path). The exposition must pass ``promtool check metrics`` and parse back, in
both formats, to exactly the strings we started from.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.fakes.fakenvml import FakeNvml
from tests.fakes.kubelet import FakeKubelet, pod, response
from tests.harness.exporter import ExporterProcess, http_get
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics
from tests.reliability.support import Result

GPU_NAME = 'NVIDIA "H100" \\ 80GB {x="y"} # not a comment'
POD = 'train-"0"\\\nevil{pod="x"} 1\n# HELP fake'
NAMESPACE = "ns\\\"\n\r☃"
CONTAINER = "c\\n\"\\"


def labels_of(families: object, metric: str, **match: str) -> list[dict[str, str]]:
    return [dict(s.labels) for fam in families for s in fam.samples  # type: ignore[attr-defined]
            if s.name == metric and all(s.labels.get(k) == v for k, v in match.items())]


@pytest.mark.prometheus  # promtool
def test_hostile_gpu_and_pod_names_round_trip(tmp_path: Path, result: Result) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.set(0, name=GPU_NAME)
    uuid = fleet.gpus[0]["uuid"]
    with FakeKubelet() as kubelet:
        kubelet.set_response(response([pod(NAMESPACE, POD, {CONTAINER: [("nvidia.com/gpu", [uuid])]})]))
        with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys"), "--cache-ttl", "0",
                              "--pod-attribution", "on", "--pod-resources-socket", kubelet.path,
                              "--pod-resources-interval", "1"], env=fleet.env()) as ex:
            text = wait_until(lambda: (t := ex.scrape_text()) and "gpu_allocation_info{" in t and t, 20,
                              what="pod attribution")
            status, om_body, _ = http_get(ex.url + "/metrics",
                                          {"Accept": "application/openmetrics-text; version=1.0.0"})
            assert status == 200
            om = om_body.decode()
    lint = check_metrics(text)
    plain, openm = list(parse_text(text)), list(parse_openmetrics(om))
    who = {"pod": POD, "namespace": NAMESPACE, "container": CONTAINER}
    checks = {
        "gpu_info name (text)": labels_of(plain, "gpu_info", gpu="0", name=GPU_NAME),
        "gpu_info name (OpenMetrics)": labels_of(openm, "gpu_info", gpu="0", name=GPU_NAME),
        "pod labels on gpu_power_watts (text)": labels_of(plain, "gpu_power_watts", gpu="0", **who),
        "pod labels on gpu_power_watts (OpenMetrics)": labels_of(openm, "gpu_power_watts", gpu="0", **who),
        "gpu_allocation_info (text)": labels_of(plain, "gpu_allocation_info", gpu="0", device=uuid, **who),
        "gpu_allocation_info (OpenMetrics)": labels_of(openm, "gpu_allocation_info", gpu="0", device=uuid, **who),
    }
    result.scenario = "hostile label values in the exposition"
    result.done = ("GPU name with quotes, backslashes, braces and '#' from the fake NVML; pod, namespace and "
                   "container names with quotes, backslashes, newlines, CR and non-ASCII from the fake kubelet")
    result.happened = "`promtool check metrics` clean; both formats parse back to exactly the original strings"
    result.figures = {"promtool_findings": len(lint), "round_trips": sum(1 for v in checks.values() if len(v) == 1),
                      "of": len(checks)}
    assert lint == [], lint
    assert {k: len(v) for k, v in checks.items()} == dict.fromkeys(checks, 1)
