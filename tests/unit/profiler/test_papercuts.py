"""Issue 28, finding 15: the profiler's errors say ``error:``, and pointing it at an exporter
instead of Prometheus says so instead of "HTTP 405"."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.harness.exporter import REPO, ExporterProcess


def profile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": os.devnull}
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "exporter", "profile", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_usage_errors_say_error() -> None:
    for args in (["--prometheus-url", "ftp://x"], ["--interval", "soon", "--prometheus-url", "http://127.0.0.1:9"],
                 ["--no-such-flag"]):
        proc = profile(*args)
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("gpu-exporter profile: error: "), line


def test_pointed_at_the_exporter_says_it_is_not_prometheus() -> None:
    with ExporterProcess(["--backend", "simulated"]) as ex:
        proc = profile("--once", "--dry-run", "--prometheus-url", ex.url)
    assert proc.returncode != 0
    assert "not a Prometheus API" in proc.stderr, proc.stderr
    assert ex.url in proc.stderr
