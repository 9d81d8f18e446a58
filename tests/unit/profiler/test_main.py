"""``gpu-exporter profile`` flags and run modes (exporter/profiler/main.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.profiler.main import parse_args, run
from tests.fakes.profiler_history import idle_shape, make_history, mem_constant, sample_times, steady_shape
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.profiler import closed_port_url, history_file
from tests.harness.prom import Prometheus, check_metrics


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("PROMETHEUS_URL", "PROFILER_PORT", "PROFILER_INTERVAL", "KUBECONFIG", "KUBERNETES_SERVICE_HOST",
                "LOG_LEVEL", "LOG_FORMAT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config to fall back on


@pytest.mark.parametrize(("argv", "needles"), [
    (["--window", "3x"], ["--window", "'3x'", "duration in 300..86400 seconds"]),
    (["--window", "1m"], ["--window", "'1m'", "300..86400"]),
    (["--interval", "0s"], ["--interval", "'0s'", "duration in 1..86400"]),
    (["--hysteresis", "0"], ["--hysteresis", "'0'", "integer in 1..100"]),
    (["--max-gpus-per-node", "0"], ["--max-gpus-per-node", "'0'"]),
    (["--max-annotation-bytes", "100"], ["--max-annotation-bytes", "'100'"]),
    (["--hysteresis", "two"], ["--hysteresis", "'two'", "integer"]),
    (["--idle-util", "30"], ["--idle-util", "'30'", "ratio"]),
    (["--idle-mem", "-0.1"], ["--idle-mem", "'-0.1'", "ratio"]),
    (["--annotation-prefix", "Bad_Prefix"], ["--annotation-prefix", "'Bad_Prefix'", "DNS subdomain"]),
    (["--listen-port", "70000"], ["--listen-port", "'70000'", "0..65535"]),
    (["--prometheus-url", "ftp://x"], ["--prometheus-url", "'ftp://x'", "http://"]),
    (["--prometheus-url", "http://:9090"], ["--prometheus-url", "'http://:9090'", "http://"]),
    (["--prometheus-url", "https://user@:9090/prom"], ["--prometheus-url", "'https://user@:9090/prom'", "http://"]),
    (["--log-level", "loud"], ["--log-level", "'loud'", "debug, info, warning, error"]),
    (["--log-format", "xml"], ["--log-format", "'xml'", "text, json"]),
    (["--step", "10m"], ["--step", "'10m'", "between"]),
    (["--node-label", "kube-node"], ["--node-label", "'kube-node'", "label name"]),
    (["--prometheus-ca-file", "/nonexistent/ca.pem"], ["--prometheus-ca-file", "/nonexistent/ca.pem", "no such file"]),
    (["--frobnicate"], ["--frobnicate"]),
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], needles: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    base = [] if "--prometheus-url" in argv else ["--prometheus-url", "http://127.0.0.1:9"]
    assert run(base + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu-exporter profile: ")
    for n in needles:
        assert n in err, err


def test_missing_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--once"]) == 2
    assert "--prometheus-url is required (or set PROMETHEUS_URL)" in capsys.readouterr().err


def test_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_URL", "http://prom:9090")
    monkeypatch.setenv("PROFILER_PORT", "9555")
    monkeypatch.setenv("PROFILER_INTERVAL", "2m")
    s = parse_args([])
    assert (s.prometheus_url, s.listen_port, s.interval_s) == ("http://prom:9090", 9555, 120.0)
    assert s.query.window_s == 1800 and s.plan.hysteresis == 2 and s.plan.prefix == "gpu-exporter.io"
    assert s.query.thresholds.node_idle_util == 0.3 and s.query.thresholds.node_idle_mem == 0.5
    s2 = parse_args(["--prometheus-url", "https://other:443/prom", "--listen-port", "0", "--idle-util", "0.2",
                     "--window", "1h", "--step", "30s"])
    assert s2.prometheus_url == "https://other:443/prom" and s2.listen_port == 0
    assert s2.plan.thresholds.node_idle_util == 0.2 and s2.query.window_s == 3600 and s2.query.step_s == 30


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("profiler-main")
    end = float(int(time.time()))
    ts = sample_times(end, 2100, 15)
    hist = [make_history(4, "m-0", "0", "steady", "s", ts, steady_shape(0.6, 0.02), mem_constant(0.3)),
            make_history(4, "m-0", "1", "idle", "i", ts, idle_shape, mem_constant(0.0))]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


def test_once_exit_status_reflects_errors(tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        kc = api.kubeconfig(tmp_path / "kc")
        assert run(["--once", "--prometheus-url", closed_port_url(), "--kubeconfig", str(kc),
                    "--prometheus-retries", "0", "--log-level", "error"]) == 1


def test_without_a_cluster_only_a_dry_run_can_start(prom: Prometheus, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--once", "--prometheus-url", prom.url, "--log-level", "error"]) == 1
    assert "no Kubernetes configuration found" in capsys.readouterr().err
    assert run(["--once", "--dry-run", "--prometheus-url", prom.url, "--log-level", "error"]) == 0
    line, status = capsys.readouterr().out.splitlines()
    doc = json.loads(line)
    assert doc["node"] == "m-0"
    assert doc["patch"]["metadata"]["annotations"]["gpu-exporter.io/gpu-0.pattern"] == "steady"
    cond = json.loads(status)  # and the GPUHealthy condition it would set
    assert cond["node"] == "m-0" and cond["patch"]["status"]["conditions"][0]["reason"] == "AllGPUsHealthy"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_loop_serves_metrics_and_health(prom: Prometheus, tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        api.add_node("m-0")
        kc = api.kubeconfig(tmp_path / "kc")
        ready: dict[str, Any] = {}
        stop = threading.Event()
        rc: list[int] = []
        argv = ["--prometheus-url", prom.url, "--kubeconfig", str(kc), "--listen-address", "127.0.0.1",
                "--listen-port", "0", "--interval", "1s", "--log-level", "warning"]
        t = threading.Thread(target=lambda: rc.append(run(argv, install_signals=False, stop=stop,
                                                          on_ready=ready.update)), daemon=True)
        t.start()
        try:
            wait_until(lambda: "port" in ready, timeout=30, what="the profiler to listen")
            base = f"http://127.0.0.1:{ready['port']}"
            steady = 'gpu_profile_pattern{node="m-0",gpu="0",pattern="steady"} 1\n'
            wait_until(lambda: steady in _get(base + "/metrics")[1], timeout=30, what="the pattern series")
            body = _get(base + "/metrics")[1]
            assert 'gpu_profile_pattern{node="m-0",gpu="1",pattern="idle"} 1\n' in body
            assert "gpu_profiler_cycle_duration_seconds_count" in body
            assert "gpu_profiler_nodes_patched_total 1\n" in body
            assert check_metrics(body) == []
            assert _get(base + "/healthz")[0] == 200
            assert _get(base + "/")[0] == 200 and _get(base + "/nope")[0] == 404
            wait_until(lambda: ready["profiler"].cycles_done >= 3, timeout=30, what="three cycles")
            # later cycles found nothing to change: one annotation patch, one GPUHealthy condition
            assert [p.resource for p in api.patches()] == ["nodes", "nodes/status"]
        finally:
            stop.set()
            t.join(30)
    assert rc == [0]


def test_profile_and_serve_listen_by_one_rule() -> None:
    """Issue 38, item 12: both daemons listen on 127.0.0.1 unless told otherwise (the manifests say
    0.0.0.0 explicitly); profile listened on 0.0.0.0 while serve kept to this machine."""
    from exporter.serve import config

    s = parse_args(["--prometheus-url", "http://127.0.0.1:9"])
    assert s.listen_address == config.load([], environ={}).address == "127.0.0.1"
    assert parse_args(["--prometheus-url", "http://127.0.0.1:9", "--listen-address", "::"]).listen_address == "::"
