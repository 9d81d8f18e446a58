"""``--device-taints`` in the installs (issue 35): its RBAC exists only with the feature on, in Helm and
kustomize alike, and its ValidatingAdmissionPolicy lets the profiler touch only the DeviceTaintRules
it owns. The policy's CEL is evaluated with cel-python, as the API server evaluates it, on admission
requests carrying rules in the shape taints.py writes (and the upstream types define).
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest

from exporter.profiler.taints import EFFECT, MANAGED_BY, TAINT_KEY
from tests.e2e.test_admission_policy import Install, _install, _kustomize, _program
from tests.e2e.test_helm import OTHER_NAMESPACE, ROOT, render

OVERLAY = ROOT / "deploy" / "overlays" / "nvidia-dra-device-taints"
VERBS = {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
         "verbs": ["list", "create", "patch", "delete"]}
SLICES = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}


def _rules_for(docs: Any, account: str) -> list[dict[str, Any]]:
    """Every RBAC rule bound to the ServiceAccount ``account`` by a ClusterRoleBinding."""
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    out: list[dict[str, Any]] = []
    for b in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"]):
            out.extend(roles[b["roleRef"]["name"]]["rules"])
    return out


def _args(docs: Any) -> list[str]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and "profiler" in d["metadata"]["name"]]
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


@cache
def _kust(path: str) -> list[dict[str, Any]]:
    return _kustomize(ROOT / path)


INSTALLS = {
    "kustomize nvidia": (lambda: _kust("deploy/overlays/nvidia"), False),
    "kustomize nvidia-dra": (lambda: _kust("deploy/overlays/nvidia-dra"), False),
    "kustomize nvidia-dra-device-taints": (lambda: _kust("deploy/overlays/nvidia-dra-device-taints"), True),
    "helm default": (lambda: render(("vendor=nvidia",)), False),
    "helm dra": (lambda: render(("vendor=nvidia", "exporter.draAttribution=true")), False),
    "helm deviceTaints": (lambda: render(("vendor=nvidia", "exporter.draAttribution=true",
                                          "profiler.deviceTaints=true")), True),
}


@pytest.mark.parametrize("case", INSTALLS)
def test_rbac_and_flag_only_with_the_feature(case: str) -> None:
    docs, on = INSTALLS[case][0](), INSTALLS[case][1]
    rules = _rules_for(docs, "gpu-exporter-profiler")
    assert (VERBS in rules and SLICES in rules) == on, rules
    assert not on or not [r for r in rules if "resource.k8s.io" in r["apiGroups"] and r not in (VERBS, SLICES)]
    assert ("--device-taints=on" in _args(docs)) == on
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and "device-taints" in
                d["metadata"]["name"]]
    assert len(policies) == (1 if on else 0)


PROFILER = "system:serviceaccount:gpu-exporter:gpu-exporter-profiler"
RULE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
    "metadata": {"name": "gpu-exporter-0123456789abcdef01234567", "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
                 "annotations": {"gpu-exporter.io/healthy-cycles": "0"}},
    "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-7", "device": "gpu-3"},
             "taint": {"key": TAINT_KEY, "value": "GPULost", "effect": EFFECT}},
}
FOREIGN: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
    "metadata": {"name": "maintenance", "labels": {"team": "infra"}},
    "spec": {"deviceSelector": {"driver": "gpu.nvidia.com"}, "taint": {"key": "example.com/m", "effect": "NoExecute"}},
}


def _installed(which: str) -> Install:
    if which == "kustomize":
        docs: Any = _kust("deploy/overlays/nvidia-dra-device-taints")
    else:
        docs = render(("vendor=nvidia", "exporter.draAttribution=true", "profiler.deviceTaints=true",
                       "namespace.create=true"), namespace=OTHER_NAMESPACE)
    policy = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and "device-taints" in d["metadata"]["name"]]
    others = [d for d in docs if d not in policy and d["kind"] not in ("ValidatingAdmissionPolicy",
                                                                       "ValidatingAdmissionPolicyBinding")]
    binding = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
               and d["spec"]["policyName"] == policy[0]["metadata"]["name"]]
    return _install([*policy, *binding, *others])


def _user(which: str) -> str:
    return PROFILER if which == "kustomize" else f"system:serviceaccount:{OTHER_NAMESPACE}:gpu-exporter-profiler"


def denials(op: str, new: dict[str, Any] | None, old: dict[str, Any] | None, user: str,
            install: Install) -> list[str] | None:
    """Messages of the failing validations; None when the policy does not apply to the request."""
    import celpy

    found, params = install
    if params is None:
        return None
    request = {"operation": op, "resource": {"group": "resource.k8s.io", "version": "v1beta2",
                                             "resource": "devicetaintrules"},
               "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}}
    act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
           "request": celpy.json_to_cel(request), "params": celpy.json_to_cel(params)}
    if not all(bool(_program(c["expression"]).evaluate(act)) for c in found["spec"]["matchConditions"]):
        return None
    return [v["message"] for v in found["spec"]["validations"] if not bool(_program(v["expression"]).evaluate(act))]


def _edit(obj: dict[str, Any], fn: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    fn(new)
    return new


ALLOWED = {
    "creates its rule": ("CREATE", RULE, None),
    "counts healthy cycles on its rule": ("UPDATE", _edit(RULE, lambda r: r["metadata"]["annotations"].update(
        {"gpu-exporter.io/healthy-cycles": "1"})), RULE),
    "deletes its rule": ("DELETE", None, RULE),
}
DENIED = {
    "creates a rule without its label": ("CREATE", _edit(RULE, lambda r: r["metadata"].pop("labels")), None, "keep"),
    "deletes an operator's rule": ("DELETE", None, FOREIGN, "owns"),
    "changes an operator's rule": ("UPDATE", _edit(FOREIGN, lambda r: r["metadata"].update(
        labels={MANAGED_BY[0]: MANAGED_BY[1]})), FOREIGN, "owns"),
    "drops its label": ("UPDATE", _edit(RULE, lambda r: r["metadata"].update(labels={})), RULE, "keep"),
    "taints every device": ("CREATE", _edit(RULE, lambda r: r["spec"].pop("deviceSelector")), None, "one device"),
    "taints a whole pool": ("CREATE", _edit(RULE, lambda r: r["spec"]["deviceSelector"].pop("device")), None,
                            "one device"),
    "evicts pods": ("CREATE", _edit(RULE, lambda r: r["spec"]["taint"].update(effect="NoExecute")), None,
                    "NoSchedule"),
    "another taint key": ("CREATE", _edit(RULE, lambda r: r["spec"]["taint"].update(key="example.com/x")), None,
                          "NoSchedule"),
}


@pytest.mark.parametrize("which", ["kustomize", "helm"])
@pytest.mark.parametrize("case", ALLOWED)
def test_its_own_rules_are_allowed(which: str, case: str) -> None:
    op, new, old = ALLOWED[case]
    assert denials(op, new, old, _user(which), _installed(which)) == []


@pytest.mark.parametrize("which", ["kustomize", "helm"])
@pytest.mark.parametrize("case", DENIED)
def test_anything_else_is_denied(which: str, case: str) -> None:
    op, new, old, message = DENIED[case]
    found = denials(op, new, old, _user(which), _installed(which))
    assert found, f"the profiler {case}: admitted"
    assert any(message in m for m in found), found


@pytest.mark.parametrize("which", ["kustomize", "helm"])
def test_other_users_are_not_matched(which: str) -> None:
    assert denials("DELETE", None, FOREIGN, "system:serviceaccount:kube-system:admin", _installed(which)) is None
    assert denials("CREATE", FOREIGN, None, "alice", _installed(which)) is None
