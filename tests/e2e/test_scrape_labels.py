"""Our shipped scrape configurations against an exporter that names another node (issue 26).

The profiler writes each GPU's pattern onto the Node its series' ``node`` label names. With
``honor_labels: true`` a series' own ``node`` label (an exporter that was misconfigured, or
one that lies) won over the ``node`` the scrape sets from the pod's node, so an exporter
could have its GPUs written onto another node. Each shipped configuration (the plain
``scrape_configs`` job, the kustomize ServiceMonitor, the Helm chart's ServiceMonitor) runs in
a real Prometheus against a target serving such series: the target's ``node``, ``job`` and
``instance`` must win, and the exporter's workload labels (``pod``, ``namespace``,
``container``) must still arrive under their own names.

A ServiceMonitor is run as prometheus-operator generates it: the target carries the
operator's own ``namespace``, ``pod``, ``container``, ``service`` and ``endpoint`` labels and
the ServiceMonitor's ``relabelings`` follow (``honorLabels`` becomes ``honor_labels``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.prom import ExpositionServer, Prometheus
from tests.harness.tools import manifests, tool

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NODE = "gpu-node-1"

# What an exporter claiming another node serves: its own node/job/instance labels, and the
# workload labels pod attribution puts on a GPU's series.
HOSTILE = """# TYPE gpu_utilization_ratio gauge
gpu_utilization_ratio{gpu="0",uuid="GPU-a",node="victim-node",job="other",instance="elsewhere:1",\
pod="trainer-0",namespace="ml",container="main"} 0.5
"""

# prometheus-operator's camelCase relabel keys -> Prometheus' snake_case ones
_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "action": "action", "regex": "regex",
         "replacement": "replacement", "separator": "separator", "modulus": "modulus"}


def _relabel(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{_KEYS[k]: v for k, v in r.items()} for r in rules]


def _scrape_config_job(target: str) -> dict[str, Any]:
    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"]
    job = dict(job)
    job.pop("kubernetes_sd_configs")
    # the pod role's meta labels of an exporter pod, as its relabel rules expect them
    meta = {"__meta_kubernetes_pod_label_app_kubernetes_io_name": "gpu-exporter",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": "exporter",
            "__meta_kubernetes_pod_container_port_name": "metrics",
            "__meta_kubernetes_pod_node_name": NODE}
    job["static_configs"] = [{"targets": [target], "labels": meta}]
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    return job


def _service_monitor_job(sm: dict[str, Any], target: str) -> dict[str, Any]:
    (ep,) = sm["spec"]["endpoints"]
    operator = {"namespace": "gpu-exporter", "pod": "gpu-exporter-x7k2p", "container": "exporter",
                "service": "gpu-exporter", "endpoint": str(ep["port"]), "__meta_kubernetes_pod_node_name": NODE}
    return {"job_name": "gpu-exporter", "honor_labels": bool(ep.get("honorLabels", False)),
            "metrics_path": ep.get("path", "/metrics"), "scrape_interval": "1s", "scrape_timeout": "1s",
            "static_configs": [{"targets": [target], "labels": operator}],
            "relabel_configs": _relabel(ep.get("relabelings", []))}


def _kustomize_service_monitor() -> dict[str, Any]:
    text = (DEPLOY / "base" / "exporter-servicemonitor.yaml").read_text()
    return dict(yaml.safe_load(re.sub(r"\$\(\w+\)", "gpu-exporter", text)))


def _helm_service_monitor() -> dict[str, Any]:
    proc = subprocess.run([tool("helm"), "template", "gpu-exporter", str(DEPLOY / "helm" / "gpu-exporter")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (sm,) = [d for d in manifests(proc.stdout) if d["kind"] == "ServiceMonitor"
             and d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "exporter"]
    return dict(sm)


@pytest.mark.parametrize("shipped", ["scrape-config.yaml", "kustomize ServiceMonitor", "Helm ServiceMonitor"])
def test_the_scrape_sets_node_whatever_the_exporter_says(shipped: str, tmp_path: Path) -> None:
    with ExpositionServer(HOSTILE) as target:
        if shipped == "scrape-config.yaml":
            job = _scrape_config_job(target.target)
        elif shipped == "kustomize ServiceMonitor":
            job = _service_monitor_job(_kustomize_service_monitor(), target.target)
        else:
            job = _service_monitor_job(_helm_service_monitor(), target.target)
        with Prometheus(tmp_path / "p", extra_scrape_configs=[job]) as prom:
            (s,) = prom.wait_for("gpu_utilization_ratio", timeout=60)
    labels = s["metric"]
    assert labels["node"] == NODE, f"{shipped}: the exporter's own node label won: {labels}"
    assert labels.get("exported_node") == "victim-node"
    assert labels["job"] == "gpu-exporter" and labels["instance"] == target.target
    # the workload using the GPU keeps its label names (the profiler and the dashboards read them)
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("trainer-0", "ml", "main"), labels
    assert not {"exported_pod", "exported_namespace", "exported_container"} & set(labels), labels
