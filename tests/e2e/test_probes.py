"""The shipped DaemonSet probes work under basic auth and TLS (issue 16), on their own plain-HTTP listener (issue 36).

Each probe is taken from the rendered manifests (kustomize base, Helm chart with and without TLS)
and run the way the kubelet runs an ``httpGet`` probe: its scheme (HTTP unless set), its path and
port, no credentials, no certificate verification, success for a status in 200..399. The target
is a real exporter with a web config that turns on basic auth (and TLS where the chart says so).
"""

from __future__ import annotations

import http.client
import itertools
import ssl
import subprocess
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from tests.e2e.test_deploy import _render
from tests.e2e.test_helm import render
from tests.harness.exporter import ExporterProcess, free_port
from tests.harness.poll import wait_until


def exporter_probes(docs: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    ds = next(d for d in docs if d.get("kind") == "DaemonSet" and "exporter" in d["metadata"]["name"]
              and "profiler" not in d["metadata"]["name"])
    container = ds["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe") if k in container}
    assert set(probes) == {"livenessProbe", "readinessProbe"}, container
    # the port the exporter listens on: --port (either spelling) or the default
    args = [*container.get("command", []), *container.get("args", [])]
    listen = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--port=")),
                  next((int(b) for a, b in itertools.pairwise(args) if a == "--port"), 9400))
    probe_port = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--probe-port=")), None)
    for p in probes.values():
        # a named port must be one the container declares; either way it must be a listening port:
        # the probe port where one is set (issue 36 item 5), else the metrics port
        port = ports[p["port"]] if isinstance(p["port"], str) else p["port"]
        assert port == (probe_port or listen), (p, ports, listen, probe_port)
        p["on_probe_port"] = probe_port is not None
    return probes


def kubelet_probe(port: int, probe: dict[str, Any]) -> int:
    """One probe as the kubelet sends it; the status code (no credentials, TLS not verified)."""
    scheme = probe.get("scheme", "HTTP")
    if scheme == "HTTPS":
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", probe["path"], headers={"User-Agent": "kube-probe/1.35"})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.fixture(scope="module")
def web_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    d = tmp_path_factory.mktemp("web")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=gpu-exporter", "-keyout", "tls.key", "-out", "tls.crt"],
                   cwd=d, check=True, capture_output=True, timeout=60)
    users = "basic_auth_users:\n  prometheus: " + bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode() + "\n"
    (d / "auth.yml").write_text(users)
    (d / "tls.yml").write_text(f"tls_server_config:\n  cert_file: {d / 'tls.crt'}\n  key_file: {d / 'tls.key'}\n"
                               + users)
    return {False: d / "auth.yml", True: d / "tls.yml"}


@pytest.mark.parametrize(("manifests", "tls"), [
    ("kustomize base", False),
    ("kustomize base", True),  # a web config with TLS in the Secret an overlay mounts: the probes stay plain
    ("helm, basic auth", False),
    ("helm, TLS and basic auth", True),
    ("helm, TLS and basic auth, probe port moved", True),
])
def test_shipped_probes_pass_under_auth(web_configs: dict[bool, Path], manifests: str, tls: bool) -> None:
    if manifests == "kustomize base":
        docs: Any = _render("deploy/base")
    else:
        docs = render(("webConfig.secretName=web", f"webConfig.tls={str(tls).lower()}",
                       *(("exporter.probePort=9410",) if "probe port" in manifests else ())))
    probes = exporter_probes(docs)
    # every shipped install puts the probes on the probe listener, in plain HTTP (issue 36 item 5)
    assert all(p["on_probe_port"] and p.get("scheme", "HTTP") == "HTTP" for p in probes.values()), probes
    extra = ["--probe-port", str(free_port())]
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(web_configs[tls]), *extra],
                         wait=False) as ex:
        port = int(extra[1])  # the chart's port number, on a free port here
        live = probes["livenessProbe"]
        wait_until(lambda: kubelet_probe(port, live) == 200, 20, what="the liveness probe")
        wait_until(lambda: kubelet_probe(port, probes["readinessProbe"]) == 200, 20, what="the readiness probe")
        metrics = {"path": "/metrics", "scheme": "HTTPS" if tls else "HTTP"}
        assert kubelet_probe(ex.port, metrics) == 401  # the metrics themselves stay behind the password
        # the probe port serves the probes alone: nothing else is reachable there
        assert kubelet_probe(port, {"path": "/metrics"}) == 404
