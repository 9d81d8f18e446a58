"""docs/health.md's consumer examples, run as written (issue 35, "Conditions others can read").

Each fenced block after a ``<!-- tested: NAME -->`` marker is taken from the page itself: the
NVSentinel object-monitor policy and the CEL selections are evaluated with cel-python on Nodes
carrying conditions the profiler's own code made (health.observe), and the alert rules go
through ``promtool check rules`` and ``promtool test rules``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from exporter.profiler import health
from exporter.profiler.classify import GpuStats
from tests.harness.prom import promtool

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "health.md"


def block(name: str) -> str:
    m = re.search(rf"<!-- tested: {re.escape(name)} -->\n```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"docs/health.md has no tested block {name!r}"
    return m.group(1)


def _gpu(g: str, **kw: Any) -> GpuStats:
    return GpuStats(node="n", gpu=g, uuid=f"GPU-{int(g):08d}-1111-2222-3333-444444444444", up=1.0, **kw)


def _node(obs: health.Observed | None) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready"}
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
                            "status": {"conditions": [ready]}}
    if obs is not None:
        node["status"]["conditions"].append(health.condition(obs, None, "2026-11-28T00:00:00Z"))
    return node


LOST = health.observe({"0": _gpu("0"), "3": GpuStats(node="n", gpu="3", up=0.0, uuid="GPU-3")})
XID_ONLY = health.observe({"0": _gpu("0", health={"xid_48": 1.0}), "1": _gpu("1")})  # COMPONENT_RESET
OK = health.observe({"0": _gpu("0"), "1": _gpu("1")})
UNKNOWN = health.observe({"0": GpuStats(node="n", gpu="0", fresh=False)})


def _eval(expression: str, var: str, node: dict[str, Any]) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate({var: celpy.json_to_cel(node)}))


def test_the_examples_read_what_the_profiler_writes() -> None:
    assert LOST.status == "False" and "RecommendedAction: RESTART_BM" in LOST.message
    assert XID_ONLY.message.startswith("[XID48] GPU 0 ") and "RESTART_BM" not in XID_ONLY.message
    assert (OK.status, UNKNOWN.status) == ("True", "Unknown")


def test_nvsentinel_policy() -> None:
    (policy,) = yaml.safe_load(block("nvsentinel-policy"))["kubernetes-object-monitor"]["policies"]
    assert policy["resource"] == {"group": "", "version": "v1", "kind": "Node"}
    # NVSentinel's RecommendedAction enum (data-models/protobufs/health_event.proto)
    assert policy["healthEvent"]["recommendedAction"] in ("COMPONENT_RESET", "CONTACT_SUPPORT", "RESTART_BM")
    pred = policy["predicate"]["expression"]
    assert _eval(pred, "resource", _node(LOST)) and _eval(pred, "resource", _node(XID_ONLY))
    assert not _eval(pred, "resource", _node(OK))
    assert not _eval(pred, "resource", _node(UNKNOWN))
    assert not _eval(pred, "resource", _node(None))
    no_conditions = _node(None)
    del no_conditions["status"]["conditions"]
    assert not _eval(pred, "resource", no_conditions)
    assert _eval(policy["nodeAssociation"]["expression"], "resource", _node(LOST)) is True  # a name: truthy


def test_nvsentinel_restart_only_policy() -> None:
    expr = block("nvsentinel-restart")
    assert _eval(expr, "resource", _node(LOST))
    assert not _eval(expr, "resource", _node(XID_ONLY))  # a GPU reset, not a node restart
    assert not _eval(expr, "resource", _node(OK))


def test_taint_selection() -> None:
    expr = block("taint-select")
    assert _eval(expr, "object", _node(LOST))
    assert not _eval(expr, "object", _node(OK)) and not _eval(expr, "object", _node(UNKNOWN))


def test_alert_rules_with_promtool(tmp_path: Path) -> None:
    rules = tmp_path / "health-rules.yaml"
    rules.write_text(block("alert-rule"))
    check = promtool("check", "rules", str(rules))
    assert check.returncode == 0, check.stdout + check.stderr
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            # kube-state-metrics: one series per status, 1 on the current one
            "input_series": [
                {"series": 'kube_node_status_condition{condition="GPUHealthy",node="bad",status="false"}',
                 "values": "0 0 1x10"},
                {"series": 'kube_node_status_condition{condition="GPUHealthy",node="bad",status="true"}',
                 "values": "1 1 0x10"},
                {"series": 'kube_node_status_condition{condition="GPUHealthy",node="good",status="false"}',
                 "values": "0x12"},
                {"series": 'kube_node_status_condition{condition="GPUHealthy",node="gone",status="unknown"}',
                 "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GPUNodeUnhealthy", "exp_alerts": []},  # 3 min False: not yet
                {"eval_time": "8m", "alertname": "GPUNodeUnhealthy", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "condition": "GPUHealthy", "node": "bad",
                                   "status": "false"},
                    "exp_annotations": {
                        "summary": "GPUs of node bad are unhealthy",
                        "description": "GPUHealthy is False on bad: kubectl describe node bad shows each failing GPU "
                                       "with its code and recommended action."}}]},
                {"eval_time": "16m", "alertname": "GPUNodeHealthUnknown", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "condition": "GPUHealthy", "node": "gone",
                                   "status": "unknown"},
                    "exp_annotations": {
                        "summary": "GPU health of node gone is unknown",
                        "description": "The profiler has no recent sample from the GPU exporter of gone."}}]},
            ],
        }],
    }
    test_file = tmp_path / "health-rules-test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    run = promtool("test", "rules", str(test_file))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("name", ["nvsentinel-policy", "nvsentinel-restart", "alert-rule", "taint-select"])
def test_every_tested_block_is_on_the_page(name: str) -> None:
    assert block(name).strip()
