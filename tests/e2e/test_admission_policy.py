"""The profiler's ValidatingAdmissionPolicy (issue 19, "Least privilege for the profiler").

RBAC lets the profiler patch Nodes; the policy in deploy/base/profiler-admission-policy.yaml (and
the Helm chart's copy) narrows that to annotations under ``gpu-exporter.io/``. Its CEL is evaluated
here with cel-python, as the API server would evaluate it, on sample admission requests: the
profiler writing its own annotations is allowed; a foreign annotation key, a label change, a spec
change (a taint) or a finalizer is denied; other users are not matched at all. The policy is taken
from the rendered install, with the parameter its binding names (the profiler's ServiceAccount) looked
up in that install as the API server looks it up: the user name it matches is the one the profiler
runs as, in whatever namespace an overlay or a Helm release puts it.
"""

from __future__ import annotations

import copy
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tests.harness.tools import manifests, tool

ROOT = Path(__file__).resolve().parents[2]
PROFILER = "system:serviceaccount:gpu-exporter:gpu-exporter-profiler"

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-node-1",
        "labels": {"kubernetes.io/hostname": "gpu-node-1", "nvidia.com/gpu.present": "true"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0", "gpu-exporter.io/pattern": "idle"},
    },
    "spec": {"podCIDR": "10.0.1.0/24", "providerID": "kind://gpu-node-1"},
    "status": {
        "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "63", "memory": "500Gi", "nvidia.com/gpu": "8"},
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready"},
        ],
        "addresses": [{"type": "InternalIP", "address": "10.0.1.5"}, {"type": "Hostname", "address": "gpu-node-1"}],
        "nodeInfo": {"kubeletVersion": "v1.31.0", "machineID": "abc"},
    },
}


Install = tuple[dict[str, Any], dict[str, Any] | None]  # the policy, and the parameter its binding names


def _kustomize(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([tool("kubectl"), "kustomize", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return manifests(proc.stdout)


def _install(docs: list[dict[str, Any]]) -> Install:
    """The policy of a rendered install and the object its binding passes as ``params``, looked up in that
    install as the API server looks it up in the cluster (None: not found)."""
    (found,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == found["metadata"]["name"]
    kind, ref = found["spec"].get("paramKind"), binding["spec"].get("paramRef")
    if kind is None:
        return found, None
    params = [d for d in docs if d["apiVersion"] == kind["apiVersion"] and d["kind"] == kind["kind"]
              and d["metadata"]["name"] == ref["name"] and d["metadata"].get("namespace") == ref.get("namespace")]
    return found, (params[0] if params else None)


@cache
def installed() -> Install:
    """The kustomize install, as in a cluster: namespace gpu-exporter."""
    return _install(_kustomize(ROOT / "deploy" / "overlays" / "nvidia"))


def policy() -> dict[str, Any]:
    return installed()[0]


@cache
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _activation(new: dict[str, Any], old: dict[str, Any], user: str, params: dict[str, Any] | None) -> dict[str, Any]:
    request = {"operation": "UPDATE", "resource": {"group": "", "version": "v1", "resource": "nodes"},
               "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}}
    act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
           "request": celpy.json_to_cel(request)}
    if params is not None:
        act["params"] = celpy.json_to_cel(params)
    return act


def matched(new: dict[str, Any], old: dict[str, Any], user: str, install: Install | None = None) -> bool:
    """Whether the policy applies: its parameter exists (parameterNotFoundAction Allow skips the
    binding otherwise) and every matchCondition is true."""
    found, params = install or installed()
    if "paramKind" in found["spec"] and params is None:
        return False
    act = _activation(new, old, user, params)
    return all(bool(_program(c["expression"]).evaluate(act)) for c in found["spec"]["matchConditions"])


def denials(new: dict[str, Any], old: dict[str, Any], user: str = PROFILER,
            install: Install | None = None) -> list[str]:
    """Messages of the validations that fail for this update (empty: admitted)."""
    if not matched(new, old, user, install):
        return []
    found, params = install or installed()
    act = _activation(new, old, user, params)
    return [v["message"] for v in found["spec"]["validations"] if not bool(_program(v["expression"]).evaluate(act))]


def changed(edit: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    new = copy.deepcopy(NODE)
    edit(new)
    return new, NODE


def test_policy_shape() -> None:
    spec = policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes", "nodes/status"] and rule["operations"] == ["UPDATE"]
    assert rule["apiGroups"] == [""]
    # The profiler's RBAC is get, list, patch on nodes and patch on nodes/status: UPDATE is the only
    # write that reaches admission.
    docs = yaml.safe_load_all((ROOT / "deploy" / "base" / "profiler-rbac.yaml").read_text())
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]


ALLOWED = {
    "changes its own annotation": lambda n: n["metadata"]["annotations"].update({"gpu-exporter.io/pattern": "busy"}),
    "adds its own annotation": lambda n: n["metadata"]["annotations"].update({"gpu-exporter.io/idle-since": "1"}),
    "removes its own annotation": lambda n: n["metadata"]["annotations"].pop("gpu-exporter.io/pattern"),
    "changes nothing": lambda n: None,
}


@pytest.mark.parametrize("case", ALLOWED)
def test_the_profilers_own_annotations_are_allowed(case: str) -> None:
    new, old = changed(ALLOWED[case])
    assert matched(new, old, PROFILER)
    assert denials(new, old) == []


def test_first_annotation_on_a_node_without_any() -> None:
    old = copy.deepcopy(NODE)
    del old["metadata"]["annotations"]
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"gpu-exporter.io/pattern": "idle"}
    assert denials(new, old) == []
    assert denials(old, new) == []  # and removing the last one


DENIED = {
    "adds a foreign annotation": (lambda n: n["metadata"]["annotations"].update({"example.com/owner": "me"}),
                                  "add or change only"),
    "changes a foreign annotation": (lambda n: n["metadata"]["annotations"].update(
        {"node.alpha.kubernetes.io/ttl": "30"}), "add or change only"),
    "removes a foreign annotation": (lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl"),
                                     "remove only"),
    "a key that only starts like ours": (lambda n: n["metadata"]["annotations"].update(
        {"gpu-exporter.io.evil.com/x": "1"}), "add or change only"),
    "a key with our name as a suffix": (lambda n: n["metadata"]["annotations"].update(
        {"evil.com/gpu-exporter.io/x": "1"}), "add or change only"),
    "changes a label": (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.present": "false"}), "labels"),
    "adds a label": (lambda n: n["metadata"]["labels"].update({"gpu-exporter.io/gpu": "nvidia"}), "labels"),
    "removes every label": (lambda n: n["metadata"].pop("labels"), "labels"),
    "adds a taint": (lambda n: n["spec"].update(
        {"taints": [{"key": "gpu-exporter.io/idle", "effect": "NoSchedule"}]}), "spec"),
    "cordons the node": (lambda n: n["spec"].update({"unschedulable": True}), "spec"),
    "adds a finalizer": (lambda n: n["metadata"].update({"finalizers": ["example.com/block"]}), "finalizers"),
}


@pytest.mark.parametrize("case", DENIED)
def test_anything_else_is_denied(case: str) -> None:
    edit, message = DENIED[case]
    new, old = changed(edit)
    found = denials(new, old)
    assert found, f"the profiler {case}: admitted"
    assert any(message in m for m in found), found


def test_own_and_foreign_change_together_is_denied() -> None:
    def edit(n: dict[str, Any]) -> None:
        n["metadata"]["annotations"]["gpu-exporter.io/pattern"] = "busy"
        n["metadata"]["labels"]["team"] = "x"

    assert denials(*changed(edit))


@pytest.mark.parametrize("user", [
    "system:serviceaccount:kube-system:node-controller",
    "system:node:gpu-node-1",
    "system:serviceaccount:other:gpu-exporter-profiler",  # same name, another namespace
    "admin",
])  # fmt: skip
def test_other_users_are_not_matched(user: str) -> None:
    new, old = changed(lambda n: n["metadata"]["labels"].update({"team": "x"}))
    assert not matched(new, old, user)
    assert denials(new, old, user) == []


def test_binding_denies() -> None:
    path = ROOT / "deploy" / "base" / "profiler-admission-policy.yaml"
    binding = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    (b,) = binding
    assert b["spec"]["policyName"] == policy()["metadata"]["name"]
    assert b["spec"]["validationActions"] == ["Deny"]


def test_the_parameter_is_the_profilers_own_service_account() -> None:
    """The binding's parameter is the ServiceAccount the profiler's pods run as, in the install's namespace;
    without it nobody can authenticate as the profiler, and every other user's Node update (the kubelets')
    must not be refused: Allow, not Deny."""
    docs = _kustomize(ROOT / "deploy" / "overlays" / "nvidia")
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-exporter-profiler"]
    params = installed()[1]
    assert params is not None, "the binding names a ServiceAccount the install does not create"
    assert params["kind"] == "ServiceAccount"
    assert params["metadata"]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert params["metadata"]["namespace"] == dep["metadata"]["namespace"] == "gpu-exporter"
    # No parameter found (the ServiceAccount deleted): the binding is skipped, nobody is refused.
    new, old = changed(lambda n: n["metadata"]["labels"].update({"team": "x"}))
    assert denials(new, old, PROFILER, (policy(), None)) == []


def _overlay(tmp_path: Path, name: str, **fields: Any) -> list[dict[str, Any]]:
    """A user's overlay above deploy/overlays/nvidia with these kustomization fields, rendered."""
    user = tmp_path / name
    user.mkdir()
    rel = os.path.relpath(ROOT / "deploy" / "overlays" / "nvidia", user)  # kustomize takes relative paths only
    (user / "kustomization.yaml").write_text(yaml.safe_dump({**fields, "resources": [rel]}))
    return _kustomize(user)


def _other_namespace_installs(tmp_path: Path) -> dict[str, tuple[str, Install]]:
    """Installs in namespace telemetry: the overlay docs/deploy.md shows (`namespace:` above a vendor
    overlay), the same with a namePrefix, and a Helm release; each with the profiler's user name there."""
    from tests.e2e.test_helm import render

    return {
        "kustomize": ("system:serviceaccount:telemetry:gpu-exporter-profiler",
                      _install(_overlay(tmp_path, "mine", namespace="telemetry"))),
        "kustomize namePrefix": ("system:serviceaccount:telemetry:team-gpu-exporter-profiler",
                                 _install(_overlay(tmp_path, "prefixed", namespace="telemetry", namePrefix="team-"))),
        "helm": ("system:serviceaccount:telemetry:team-a-gpu-exporter-profiler",
                 _install(list(render((), "telemetry", "team-a")))),
    }


def test_another_namespace_restricts_the_profiler_there(tmp_path: Path) -> None:
    for how, (profiler, install) in _other_namespace_installs(tmp_path).items():
        label = changed(lambda n: n["metadata"]["labels"].update({"team": "x"}))
        assert matched(*label, profiler, install), f"{how}: the profiler in telemetry is not matched"
        assert any("labels" in m for m in denials(*label, profiler, install)), how
        own = changed(ALLOWED["changes its own annotation"])
        assert denials(*own, profiler, install) == [], how
        # the same ServiceAccount name in the default namespace (no longer the profiler) is not matched
        for other in (PROFILER, profiler.replace(":telemetry:", ":gpu-exporter:"),
                      "system:serviceaccount:telemetry:gpu-exporter-profiler-x"):
            assert not matched(*label, other, install), f"{how}: {other} is matched"


# ---- the status subresource: the GPUHealthy condition and nothing else -------------------------

GPU_HEALTHY = {"type": "GPUHealthy", "status": "False", "reason": "GPULost", "message": "GPULost: GPU 3",
               "lastTransitionTime": "2026-11-26T07:00:00Z", "lastHeartbeatTime": "2026-11-26T07:00:00Z"}


def _conditions(n: dict[str, Any]) -> list[dict[str, Any]]:
    return n["status"]["conditions"]  # type: ignore[no-any-return]


def _with_gpu_healthy(n: dict[str, Any]) -> None:
    _conditions(n).append(dict(GPU_HEALTHY))


def _gpu_healthy(n: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in _conditions(n) if c["type"] == "GPUHealthy")


STATUS_ALLOWED = {
    "sets GPUHealthy the first time": _with_gpu_healthy,
    "turns GPUHealthy True": lambda n: _gpu_healthy(n).update(status="True", reason="AllGPUsHealthy",
                                                               message="8 GPUs healthy"),
    "changes its message only": lambda n: _gpu_healthy(n).update(message="GPULost: GPU 3, 4"),
}

STATUS_DENIED = {
    "changes Ready": lambda n: _conditions(n)[1].update(status="False"),
    "removes Ready": lambda n: _conditions(n).pop(1),
    "adds another condition": lambda n: _conditions(n).append({"type": "NetworkUnavailable", "status": "True"}),
    "reorders the other conditions": lambda n: _conditions(n).reverse(),
    "removes every condition": lambda n: n["status"].pop("conditions"),
    "changes the capacity": lambda n: n["status"]["capacity"].update({"nvidia.com/gpu": "0"}),
    "changes the allocatable": lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "7"}),
    "changes the addresses": lambda n: n["status"]["addresses"].append({"type": "ExternalIP", "address": "1.2.3.4"}),
    "changes the node info": lambda n: n["status"]["nodeInfo"].update({"kubeletVersion": "v9"}),
    "adds a status field": lambda n: n["status"].update({"phase": "Terminated"}),
    "GPUHealthy and capacity together": lambda n: (_gpu_healthy(n).update(status="True"),
                                                   n["status"]["capacity"].update({"nvidia.com/gpu": "0"})),
}


def _old_with_condition() -> dict[str, Any]:
    old = copy.deepcopy(NODE)
    _with_gpu_healthy(old)
    return old


def _status_change(edit: Any, first: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    old = copy.deepcopy(NODE) if first else _old_with_condition()
    new = copy.deepcopy(old)
    edit(new)
    return new, old


@pytest.mark.parametrize("case", STATUS_ALLOWED)
def test_the_gpu_healthy_condition_is_allowed(case: str) -> None:
    new, old = _status_change(STATUS_ALLOWED[case], first=case.startswith("sets"))
    assert new != old
    assert matched(new, old, PROFILER)
    assert denials(new, old) == []


@pytest.mark.parametrize("case", STATUS_DENIED)
def test_any_other_status_change_is_denied(case: str) -> None:
    new, old = _status_change(STATUS_DENIED[case])
    found = denials(new, old)
    assert found, f"the profiler {case}: admitted"
    assert any("status" in m for m in found), found


def test_fake_api_server_refuses_what_the_policy_refuses() -> None:
    # tests/harness/kubeapi.py's nodes/status rule agrees with the policy on every case above
    from tests.harness.kubeapi import status_refusal

    for case, edit in STATUS_ALLOWED.items():
        new, old = _status_change(edit, first=case.startswith("sets"))
        assert status_refusal(old, new) is None, case
    for case, edit in STATUS_DENIED.items():
        new, old = _status_change(edit)
        assert status_refusal(old, new), case
