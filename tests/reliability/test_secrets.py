"""No secret in logs or metrics: the profiler's bearer tokens, the exporter's basic-auth password.

Everything runs at debug level (the most talkative), with real credentials that the servers
check, so the secrets are known to have been used; then the captured logs and every metrics
page are searched for them (and for their base64 and bcrypt forms).
"""

from __future__ import annotations

import base64
import logging
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from exporter.profiler.main import run as profile
from tests.fakes.profiler_history import make_history, mem_constant, sample_times, steady_shape
from tests.harness.exporter import ExporterProcess, http_get
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.profiler import FaultProxy, history_file
from tests.harness.prom import Prometheus
from tests.reliability.support import Result


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("rel-secrets")
    ts = sample_times(float(int(time.time())), 2100, 15)
    hist = [make_history(3, "sec-0", "0", "steady", "steady", ts, steady_shape(0.7, 0.02), mem_constant(0.5))]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`gpu-exporter profile` sets up the root logger (handler, level): put it back for the next tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.prometheus
@pytest.mark.usefixtures("restore_logging")
def test_profiler_tokens_never_logged(prom: Prometheus, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch, result: Result) -> None:
    prom_token, kube_token = "prom-" + secrets.token_hex(16), "kube-" + secrets.token_hex(16)
    token_file = tmp_path / "prom-token"
    token_file.write_text(prom_token + "\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    with FaultProxy(prom.url, delay=3.0) as proxy, FakeKubeAPI(token=kube_token) as api:
        api.add_node("sec-0")
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        ready: dict[str, Any] = {}
        stop = threading.Event()
        argv = ["--prometheus-url", proxy.url, "--prometheus-token-file", str(token_file), "--kubeconfig",
                str(kubeconfig), "--interval", "1s", "--listen-address", "127.0.0.1", "--listen-port", "0",
                "--log-level", "debug"]
        loop = threading.Thread(target=profile, args=(argv,),
                                kwargs={"install_signals": False, "stop": stop, "on_ready": ready.update}, daemon=True)
        loop.start()
        try:
            wait_until(lambda: "port" in ready and ready["profiler"].cycles_done >= 2, 30, what="two cycles")
            with urllib.request.urlopen(f"http://127.0.0.1:{ready['port']}/metrics", timeout=5) as r:
                metrics = r.read().decode()
        finally:
            stop.set()
            loop.join(30)
        patched = len(api.patches("sec-0"))
        kube_auth = {r.headers.get("Authorization") or r.headers.get("authorization") for r in api.requests}
        # one --once run too: its own log lines, including the cycle summary and the dry-run patch output
        assert profile(["--once", "--dry-run", *argv[:6], "--log-level", "debug"]) == 0
    out, err = capfd.readouterr()
    logs = out + err
    forms = {"Prometheus token": prom_token, "Kubernetes token": kube_token,
             "Authorization header": f"Bearer {prom_token}", "Kubernetes header": f"Bearer {kube_token}"}
    leaks = {name: (value in logs, value in metrics) for name, value in forms.items()}
    result.scenario = "profiler tokens in logs and metrics"
    result.done = ("profiler loop (and a --once run) at --log-level debug with a Prometheus bearer-token file and a "
                   "kubeconfig token; both servers see and require the tokens")
    result.happened = "the tokens were sent on every request and appear in no log line and no metric"
    result.figures = {"log_lines": logs.count("\n"), "prometheus_requests_with_token":
                      sum(1 for a in proxy.authorization if a == f"Bearer {prom_token}"),
                      "node_patches": patched, "leaks": sum(a or b for a, b in leaks.values())}
    assert proxy.authorization and set(proxy.authorization) == {f"Bearer {prom_token}"}
    assert kube_auth == {f"Bearer {kube_token}"} and patched == 1
    assert "DEBUG" in logs, "debug logging was not on"
    assert leaks == dict.fromkeys(forms, (False, False)), leaks


def test_exporter_password_never_logged(tmp_path: Path, result: Result) -> None:
    password = "pw-" + secrets.token_hex(12)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    good = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}x".encode()).decode()}
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(web), "--log-level", "debug"]) as ex:
        bodies = []
        for path in ("/metrics", "/readyz", "/", "/api/v1/monitoring/gpu-metrics", "/stats", "/nope"):
            status, body, _ = http_get(ex.url + path, good)
            assert status in (200, 404)
            bodies.append(body.decode(errors="replace"))
            denied = 200 if path == "/readyz" else 401  # the probe is open: it says "ok", nothing more
            assert http_get(ex.url + path, wrong)[:2] == (denied, b"ok\n" if denied == 200 else b"unauthorized\n")
            assert http_get(ex.url + path)[0] == denied
        log = ex.log()
    forms = [password, hashed, good["Authorization"][6:], wrong["Authorization"][6:], password + "x"]
    found = [f for f in forms if f in log or any(f in b for b in bodies)]
    result.scenario = "exporter basic-auth password in logs and pages"
    result.done = ("exporter at --log-level debug with basic auth; every endpoint fetched with the right password, "
                   "a wrong one and none")
    result.happened = "200 with the password, 401 otherwise; neither password, its base64 nor its bcrypt hash " \
                      "appears in the debug log or on any page"
    result.figures = {"log_lines": log.count("\n"), "leaks": len(found)}
    result.see_also = ["tests/unit/serve/test_webconfig.py::test_tls_and_basic_auth"]
    assert found == []
