"""Basic auth and TLS through Helm, scraped by a real Prometheus (issue 38, item 2).

With ``webConfig.secretName`` holding ``basic_auth_users`` the chart's ServiceMonitor carried only
``scheme: https``: Prometheus got 401 and ``GPUExporterDown`` fired. The chart now has each daemon's
scrape credentials (``basicAuth``, Secret references) and TLS settings (``tlsConfig``) as values. This
renders them, turns each ServiceMonitor endpoint into the scrape job prometheus-operator generates from
it, and lets a real Prometheus scrape a real exporter and a real profiler that demand the password
over TLS.

What the operator writes for an endpoint (prometheus-operator's API reference for ``Endpoint``,
``BasicAuth`` and ``SafeTLSConfig``, https://prometheus-operator.dev/docs/api-reference/api/): the
``basicAuth`` Secret keys' values become ``basic_auth.username`` / ``password``; a ``ca`` taken from a
Secret or ConfigMap becomes a file the config names in ``tls_config.ca_file``; ``serverName`` and
``insecureSkipVerify`` become ``server_name`` and ``insecure_skip_verify``; ``scheme`` and ``path``
become ``scheme`` and ``metrics_path``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from tests.harness.exporter import DaemonProcess
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.net import free_port
from tests.harness.prom import Prometheus
from tests.harness.tools import manifests, tool

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
USER, PASSWORD = "prometheus", "scrape-s3cret"
SERVER_NAME = "gpu-exporter.gpu-exporter.svc"

# The Secrets the ServiceMonitors refer to: (name, key) -> value, as the operator reads them.
SCRAPE_SECRET = "gpu-exporter-scrape"


def _render(*sets: str) -> list[dict[str, Any]]:
    args = ["template", "gpu-exporter", str(CHART), "--namespace", "gpu-exporter"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return manifests(proc.stdout)


def _credentials(prefix: str) -> list[str]:
    return [f"{prefix}.basicAuth.username.name={SCRAPE_SECRET}", f"{prefix}.basicAuth.username.key=username",
            f"{prefix}.basicAuth.password.name={SCRAPE_SECRET}", f"{prefix}.basicAuth.password.key=password"]


def operator_job(sm: dict[str, Any], target: str, secrets: dict[tuple[str, str], str], files: Path) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for the ServiceMonitor's one endpoint (see the
    module docstring), with ``target`` standing in for the discovered pod."""
    (ep,) = sm["spec"]["endpoints"]
    job: dict[str, Any] = {"job_name": sm["metadata"]["name"], "scheme": ep.get("scheme", "http"),
                           "metrics_path": ep.get("path", "/metrics"), "scrape_interval": "1s",
                           "scrape_timeout": "1s", "static_configs": [{"targets": [target]}]}
    if "basicAuth" in ep:
        ba = ep["basicAuth"]
        job["basic_auth"] = {"username": secrets[(ba["username"]["name"], ba["username"]["key"])],
                             "password": secrets[(ba["password"]["name"], ba["password"]["key"])]}
    tls = ep.get("tlsConfig", {})
    if tls:
        out: dict[str, Any] = {}
        if "ca" in tls:
            ref = tls["ca"].get("secret") or tls["ca"]["configMap"]
            ca = files / f"secret_{ref['name']}_{ref['key']}"
            ca.write_text(secrets[(ref["name"], ref["key"])])
            out["ca_file"] = str(ca)
        if "serverName" in tls:
            out["server_name"] = tls["serverName"]
        if "insecureSkipVerify" in tls:
            out["insecure_skip_verify"] = tls["insecureSkipVerify"]
        job["tls_config"] = out
    return job


def _web_config(tmp: Path) -> Path:
    """A web config demanding USER/PASSWORD over TLS, with a certificate for SERVER_NAME (not 127.0.0.1:
    the ServiceMonitor's serverName is what makes verification pass, as with a pod IP)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", f"/CN={SERVER_NAME}", "-addext", f"subjectAltName=DNS:{SERVER_NAME}",
                    "-keyout", "tls.key", "-out", "tls.crt"], cwd=tmp, check=True, capture_output=True, timeout=60)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp / "web-config.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp / 'tls.crt'}\n  key_file: {tmp / 'tls.key'}\n"
                   f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    return web


def test_both_daemons_are_scraped_with_the_charts_credentials(tmp_path: Path) -> None:
    web = _web_config(tmp_path)
    secrets = {(SCRAPE_SECRET, "username"): USER, (SCRAPE_SECRET, "password"): PASSWORD,
               ("gpu-exporter-web", "tls.crt"): (tmp_path / "tls.crt").read_text()}
    ca = ["{p}.tlsConfig.ca.secret.name=gpu-exporter-web", "{p}.tlsConfig.ca.secret.key=tls.crt",
          f"{{p}}.tlsConfig.serverName={SERVER_NAME}"]
    docs = _render("webConfig.secretName=gpu-exporter-web", "webConfig.tls=true", *_credentials("webConfig"),
                   *[c.format(p="webConfig") for c in ca],
                   "profiler.webConfig.secretName=gpu-exporter-web", "profiler.webConfig.tls=true",
                   *_credentials("profiler.webConfig"), *[c.format(p="profiler.webConfig") for c in ca])
    sms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    # what the chart rendered before: https and nothing else (the same values less the credentials)
    before = {d["metadata"]["name"]: d for d in _render("webConfig.secretName=gpu-exporter-web", "webConfig.tls=true",
                                                        *[c.format(p="webConfig") for c in ca])
              if d["kind"] == "ServiceMonitor"}
    files = tmp_path / "operator"
    files.mkdir()
    with FakeKubeAPI() as api, \
            DaemonProcess("serve", ["--backend", "simulated", "--web.config.file", str(web)], wait=False) as ex, \
            DaemonProcess("profile", ["--kubeconfig", str(api.kubeconfig(tmp_path / "kc")), "--prometheus-url",
                                      f"http://127.0.0.1:{free_port()}", "--web.config.file", str(web)],
                          wait=False) as prof:
        jobs = [operator_job(sms["gpu-exporter"], f"127.0.0.1:{ex.port}", secrets, files),
                operator_job(sms["gpu-exporter-profiler"], f"127.0.0.1:{prof.port}", secrets, files)]
        old = operator_job(before["gpu-exporter"], f"127.0.0.1:{ex.port}", secrets, files)
        old["job_name"] = "without-credentials"
        with Prometheus(tmp_path / "p", extra_scrape_configs=[*jobs, old]) as prom:
            prom.wait_for_up("gpu-exporter", timeout=60)
            prom.wait_for_up("gpu-exporter-profiler", timeout=60)
            assert prom.value('count(gpu_up{job="gpu-exporter"})') == 4  # the simulated GPUs, over TLS and auth
            assert (prom.value('count({job="gpu-exporter-profiler", __name__=~"gpu_profiler_.+"})') or 0) > 0
            prom.wait_for('up{job="without-credentials"} == 0', timeout=30)
            (target,) = [t for t in prom.targets() if t["labels"]["job"] == "without-credentials"]
            assert "401" in target["lastError"], target
