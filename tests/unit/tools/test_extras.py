"""Issue 28, finding 13: serving needs none of the Kubernetes clients (the ``k8s`` extra), and a
command that needs them says which extra to install, in one line with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.harness.exporter import REPO, ExporterProcess
from tests.harness.extras import env_without

K8S_PACKAGES = ("kubernetes", "grpc", "google.protobuf")


def test_kubernetes_client_is_an_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]]
    assert "kubernetes" not in names and "grpcio" not in names, names
    assert "amdsmi" in names, "make run must read AMD GPUs"
    assert any(d.startswith("kubernetes") for d in project["optional-dependencies"]["k8s"])
    # Everything that runs the profiler installs the extra.
    assert '".[k8s]"' in (REPO / "Dockerfile").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "[test,k8s]" in makefile
    assert "pip install -e '.[k8s]'" in (REPO / "README.md").read_text()


def test_serve_runs_without_the_k8s_extra(tmp_path: Path) -> None:
    env = env_without(tmp_path / "site", *K8S_PACKAGES)
    with ExporterProcess(["--backend", "simulated", "--pod-attribution", "auto",
                          "--pod-resources-socket", str(tmp_path / "none.sock")], env=env) as ex:
        text = ex.scrape_text()
        assert "gpu_up" in text
        assert "this machine only" in ex.log(), "a loopback listener says how to listen on all addresses"


def test_profile_without_the_k8s_extra_names_it(tmp_path: Path) -> None:
    env = {**os.environ, **env_without(tmp_path / "site", *K8S_PACKAGES)}
    proc = subprocess.run([sys.executable, "-m", "exporter", "profile", "--prometheus-url", "http://127.0.0.1:9",
                           "--once"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0] and "[k8s]" in lines[0] and "not on PyPI" in lines[0], lines[0]
    # --help still works: it needs nothing but the standard library.
    proc = subprocess.run([sys.executable, "-m", "exporter", "profile", "--help"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "--prometheus-url" in proc.stdout


def test_the_install_hint_works_without_pypi() -> None:
    """Issue 38, item 10: gpu-exporter is not on PyPI, so `pip install 'gpu-exporter[k8s]'` alone installs
    nothing. Every hint says how to install the extra from a checkout and from a release's wheel."""
    from exporter.core.extras import hint

    msg = hint("kubernetes", "gpu-exporter profile")
    assert msg.count("\n") == 0
    assert "not on PyPI" in msg and "pip install -e '.[k8s]'" in msg and ".whl[k8s]" in msg, msg
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("## Profiler"):readme.index("## Tools for benchmark engineers")]
    assert "not on PyPI" in block and "pip install -e '.[k8s]'" in block and ".whl[k8s]" in block, block
    for doc in ("docs/attribution.md", "docs/cli.md", "README.md"):
        text = (REPO / doc).read_text()
        assert "pip install 'gpu-exporter[k8s]'" not in text, doc


def test_readme_says_what_make_test_installs() -> None:
    """Issue 38, item 19: the README said make test installs "Debian's prometheus"; it also installs
    other Debian packages and npm tools. Each package the Makefile installs is named."""
    import re

    makefile = (REPO / "Makefile").read_text()
    debian = set(re.findall(r'missing="\$\$missing ([a-z0-9.+-]+)"', makefile))
    npm = re.search(r"NPM_TEST_DEPS := (.*?)\n(?=\S)", makefile, re.S)
    assert debian and npm
    packages = {p.rsplit("@", 1)[0] for p in npm.group(1).replace("\\", " ").split()}
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Backends")]
    for name in sorted(debian | packages):
        assert f"`{name}`" in quick, f"README's quick start does not name {name}"
    assert "`.[test,k8s]`" in quick
