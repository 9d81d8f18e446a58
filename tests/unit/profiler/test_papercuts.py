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


def test_availability_score_accounts_for_health() -> None:
    """Issue 28, finding 4: the XID GPU was named best-gpu; the score ignored XIDs, ECC and throttling."""
    from exporter.profiler.classify import GpuStats, classify_gpu

    def score(**health: float) -> float:
        st = GpuStats(node="n", gpu="0", uuid="u", util_mean=0.1, util_std=0.01, util_p95=0.12, util_count=120,
                      util_early=60, mem_used_mean=8 * 2**30, mem_total=80 * 2**30, mem_count=120, mem_early=60,
                      **health)  # type: ignore[arg-type]
        s = classify_gpu(st).score
        assert s is not None
        return s

    healthy = score()
    assert healthy == round(0.6 * 0.9 + 0.4 * 0.9, 4)
    assert score(xid_rise=1.0) == 0.0
    assert score(ecc_rise=2.0) == 0.0
    assert score(throttle_ratio=0.5) == round(healthy * 0.5, 4)
    assert score(xid_rise=0.0, ecc_rise=0.0, throttle_ratio=0.0) == healthy
