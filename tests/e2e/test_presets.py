"""Platform presets (issue 38, item 1): one Helm values file (deploy/helm/presets/) and one kustomize
overlay (deploy/overlays/) per platform, rendered by the real helm and kubectl, validated strictly
with kubernetes-validate against Kubernetes 1.30 and the newest schema it has, and compared: Helm and
kustomize must render the same objects for each platform.

What each platform needs comes from its own published documentation (PLATFORMS cites it); the checks
below hold each preset to it. None of this ran on a real GKE, EKS or OpenShift cluster: the project's
machines have none.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_deploy import KUBERNETES_SCHEMA_VERSION, _validation_errors
from tests.e2e.test_helm import NEWEST_SCHEMA, _differences, _kustomize, _normal
from tests.harness.tools import manifests, tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
PRESETS = ROOT / "deploy" / "helm" / "presets"

# platform -> its sources and what its preset must do.
PLATFORMS: dict[str, dict[str, Any]] = {
    "gke": {
        "sources": [
            # "the GPU device drivers are installed in /home/kubernetes/bin/nvidia on the node and
            # mounted into containers at /usr/local/nvidia"; no RuntimeClass on GKE
            "https://cloud.google.com/kubernetes-engine/docs/how-to/gpus",
            # the driver installer's host directory, /home/kubernetes/bin/nvidia
            "https://github.com/GoogleCloudPlatform/container-engine-accelerators/blob/master/"
            "nvidia-driver-installer/cos/daemonset-preloaded.yaml",
            # its device plugin mounts -host-path at -container-path (/usr/local/nvidia) in GPU pods only
            "https://pkg.go.dev/github.com/GoogleCloudPlatform/container-engine-accelerators/cmd/nvidia_gpu",
        ],
        "vendor": "nvidia", "runtime_class": None, "privileged": True, "root": False,
        "libraries": {"/home/kubernetes/bin/nvidia": "/usr/local/nvidia"},
        "env": {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"},
    },
    "eks": {
        "sources": [
            # the EKS-optimized accelerated (NVIDIA) AMIs ship the driver and the NVIDIA container toolkit
            "https://docs.aws.amazon.com/eks/latest/userguide/ml-eks-optimized-ami.html",
            # with or without the GPU Operator on EKS
            "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/amazon-eks.html",
        ],
        "vendor": "nvidia", "runtime_class": None, "privileged": False, "root": True,
    },
    "no-runtimeclass": {
        "sources": [
            # nvidia-ctk runtime configure --runtime=containerd --set-as-default
            "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html",
        ],
        "vendor": "nvidia", "runtime_class": None, "privileged": False, "root": True,
    },
    "openshift": {
        "sources": [
            # restricted-v2: no hostPath, runAsUser MustRunAsRange
            "https://github.com/openshift/cluster-kube-apiserver-operator/blob/master/bindata/bootkube/"
            "scc-manifests/0000_20_kube-apiserver-operator_00_scc-restricted-v2.yaml",
            # the SCC API and granting one through RBAC's "use" verb
            "https://docs.redhat.com/en/documentation/openshift_container_platform/latest/html/security_apis/"
            "securitycontextconstraints-security-openshift-io-v1",
            # the GPU Operator on OpenShift creates the RuntimeClass "nvidia"
            "https://docs.nvidia.com/datacenter/cloud-native/openshift/latest/index.html",
        ],
        "vendor": "nvidia", "runtime_class": "nvidia", "privileged": False, "root": True, "scc": True,
    },
    "amd-gpu-operator": {
        "sources": [
            # its Node Feature Discovery rule labels GPU nodes feature.node.kubernetes.io/amd-gpu=true
            "https://instinct.docs.amd.com/projects/gpu-operator/en/latest/",
        ],
        "vendor": "amd", "runtime_class": None, "privileged": True, "root": False,
        "node_labels": ["feature.node.kubernetes.io/amd-gpu", "gpu-exporter.io/gpu"],
    },
    "amd-no-operator": {
        "sources": [
            # the amdgpu driver on the host, devices /dev/kfd and /dev/dri
            "https://instinct.docs.amd.com/projects/k8s-device-plugin/en/latest/",
            # Node Feature Discovery's PCI vendor label
            "https://kubernetes-sigs.github.io/node-feature-discovery/stable/usage/features.html",
        ],
        "vendor": "amd", "runtime_class": None, "privileged": True, "root": False,
        "node_labels": ["feature.node.kubernetes.io/pci-1002.present", "gpu-exporter.io/gpu"],
    },
}


def helm_render(preset: str, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "gpu-exporter", str(CHART), "--namespace", "gpu-exporter",
            "-f", str(PRESETS / f"{preset}.yaml")]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"helm template -f {preset}.yaml failed:\n{proc.stderr}"
    return manifests(proc.stdout)


def test_every_preset_has_an_overlay_a_platform_and_docs() -> None:
    presets = {p.stem for p in PRESETS.glob("*.yaml")}
    assert presets == set(PLATFORMS)
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    for name, platform in PLATFORMS.items():
        assert (ROOT / "deploy" / "overlays" / name / "kustomization.yaml").exists(), name
        assert platform["sources"] and all(s.startswith("https://") for s in platform["sources"])
        assert f"deploy/helm/presets/{name}.yaml" in deploy and f"deploy/overlays/{name}" in deploy, name
    for section in ("### GKE", "### EKS", "### OpenShift", "### No RuntimeClass", "### AMD"):
        assert section in deploy, section


@pytest.mark.parametrize("version", [KUBERNETES_SCHEMA_VERSION, NEWEST_SCHEMA])
@pytest.mark.parametrize("preset", PLATFORMS)
def test_preset_validates(preset: str, version: str) -> None:
    for docs in (helm_render(preset, "namespace.create=true"), _kustomize(f"deploy/overlays/{preset}")):
        errors = [e for obj in docs for e in _validation_errors(obj, version)]
        assert not errors, "\n".join(errors)


@pytest.mark.parametrize("preset", PLATFORMS)
def test_helm_preset_and_overlay_render_the_same_objects(preset: str) -> None:
    helm_docs = {(d["kind"], d["metadata"]["name"]): _normal(d) for d in helm_render(preset, "namespace.create=true")}
    kust_docs = {(d["kind"], d["metadata"]["name"]): _normal(d) for d in _kustomize(f"deploy/overlays/{preset}")}
    assert sorted(helm_docs) == sorted(kust_docs), "the two installs differ in their objects"
    differences = [f"{kind}/{name}{where}" for (kind, name), want in kust_docs.items()
                   for where in _differences(helm_docs[(kind, name)], want)]
    assert not differences, f"{preset}: helm != kustomize at\n" + "\n".join(differences)


@pytest.mark.parametrize("preset", PLATFORMS)
def test_preset_does_what_its_platform_needs(preset: str) -> None:
    want = PLATFORMS[preset]
    docs = _kustomize(f"deploy/overlays/{preset}")
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert pod.get("runtimeClassName") == want["runtime_class"]
    assert bool(c["securityContext"].get("privileged")) is want["privileged"]
    uid = pod["securityContext"]["runAsUser"]
    assert (uid == 0) is want["root"]
    assert env["POD_ATTRIBUTION"] == ("auto" if want["root"] else "off")
    assert c["args"][1] == ("--backend=nvml" if want["vendor"] == "nvidia" else "--backend=amdsmi")
    for k, v in want.get("env", {}).items():
        assert env[k] == v
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for path, mount in want.get("libraries", {}).items():
        (name,) = [n for n, p in host.items() if p == path]
        assert mounts[name]["mountPath"] == mount and mounts[name]["readOnly"] is True
    if want["vendor"] == "nvidia" and want["runtime_class"] is None and "libraries" not in want:
        # the node's default runtime injects NVML for these variables (no RuntimeClass to do it)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    if "node_labels" in want:
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert [e["key"] for t in terms for e in t["matchExpressions"]] == want["node_labels"]
    sccs = [d for d in docs if d["kind"] == "SecurityContextConstraints"]
    assert bool(sccs) is bool(want.get("scc"))
    if sccs:
        _check_scc(docs, sccs[0], ds)


def _check_scc(docs: list[dict[str, Any]], scc: dict[str, Any], ds: dict[str, Any]) -> None:
    """The SCC allows what the DaemonSet asks for and no more, for the exporter's ServiceAccount only;
    the profiler asks for nothing restricted-v2 refuses."""
    pod = ds["spec"]["template"]["spec"]
    assert scc["allowHostDirVolumePlugin"] is True
    assert not any(scc[k] for k in ("allowHostIPC", "allowHostNetwork", "allowHostPID", "allowHostPorts",
                                    "allowPrivilegedContainer", "allowPrivilegeEscalation"))
    assert scc["requiredDropCapabilities"] == ["ALL"] and scc["allowedCapabilities"] == []
    assert scc["runAsUser"] == {"type": "MustRunAs", "uid": pod["securityContext"]["runAsUser"]}
    assert scc["users"] == [] and scc["groups"] == []
    volumes = {k for v in pod["volumes"] for k in v if k != "name"}
    assert volumes <= set(scc["volumes"]) and "hostPath" in volumes
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-scc")]
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                              "resourceNames": [scc["metadata"]["name"]], "verbs": ["use"]}]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": ds["metadata"]["namespace"]}]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    psc = dep["spec"]["template"]["spec"]["securityContext"]
    assert "runAsUser" not in psc and "runAsGroup" not in psc and psc["runAsNonRoot"] is True


def test_the_runtime_class_is_a_component_presets_leave_out() -> None:
    """kustomize: the RuntimeClass is one component; the nvidia overlay takes it, the presets without
    one do not (they do not delete it from a render that has it)."""
    def components(overlay: str) -> list[str]:
        return yaml.safe_load((ROOT / "deploy" / "overlays" / overlay / "kustomization.yaml").read_text()).get(
            "components", [])

    assert "../../components/nvidia-runtime-class" in components("nvidia")
    for name in ("eks", "no-runtimeclass"):
        assert components(name) == ["../../components/nvidia"], name
    rc = yaml.safe_load((ROOT / "deploy" / "components" / "nvidia-runtime-class" / "kustomization.yaml").read_text())
    assert rc["kind"] == "Component"


@pytest.mark.parametrize("preset", PLATFORMS)
def test_helm_lint_passes_with_the_preset(preset: str) -> None:
    proc = subprocess.run([tool("helm"), "lint", "--strict", str(CHART), "-f", str(PRESETS / f"{preset}.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
