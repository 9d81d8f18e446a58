"""TLS and basic auth from an exporter-toolkit web config, with real TLS handshakes."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.harness.exporter import REPO, ExporterProcess
from tests.harness.poll import wait_until

PASSWORD = "s3cret-Pa55word"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.cnf", "-out", "server.crt", cwd=d)
    return d


def web_config(d: Path, users: bool = True, tls: bool = True) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    lines = []
    if tls:
        lines += ["tls_server_config:", f"  cert_file: {d / 'server.crt'}", f"  key_file: {d / 'server.key'}"]
    if users:
        lines += ["basic_auth_users:", f"  prometheus: {hashed}"]
    path = d / f"web-{users}-{tls}.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def get(url: str, ca: Path | None, user: str | None = None, password: str | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    req = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


class TLSExporter(ExporterProcess):
    def wait_healthy(self, timeout: float = 15.0) -> None:  # the harness probes plain http
        ca = self.ca

        def ok() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(self.log())
            return get(f"https://127.0.0.1:{self.port}/healthz", ca) == 200

        wait_until(ok, timeout, what="https /healthz")


def test_tls_and_basic_auth(pki: Path) -> None:
    TLSExporter.ca = pki / "ca.crt"  # type: ignore[attr-defined]
    cfg = web_config(pki)
    with TLSExporter(["--backend", "simulated", "--web.config.file", str(cfg), "--log-level", "debug"]) as ex:
        base = f"https://127.0.0.1:{ex.port}"
        ca = pki / "ca.crt"
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200  # cached check
        assert get(base + "/metrics", ca, "prometheus", "wrong") == 401
        assert get(base + "/metrics", ca, "nobody", PASSWORD) == 401
        assert get(base + "/metrics", ca) == 401
        assert get(base + "/readyz", ca) == 401
        assert get(base + "/healthz", ca) == 200  # open by documented choice (kubelet probes)
        with pytest.raises(urllib.error.URLError) as info:
            get(base + "/metrics", pki / "other-ca.crt", "prometheus", PASSWORD)
        assert isinstance(info.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain http to a TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=5)
        assert get(base + "/metrics", ca, "prometheus", PASSWORD) == 200  # still serving after bad clients
        log = ex.log()
        assert "https://" in log
        hashed = cfg.read_text().split("prometheus: ", 1)[1].strip()
        assert PASSWORD not in log and hashed not in log and "s3cret" not in log


def test_basic_auth_without_tls(pki: Path) -> None:
    cfg = web_config(pki, tls=False)
    with ExporterProcess(["--backend", "simulated", "--web.config.file", str(cfg)]) as ex:
        assert get(ex.url + "/metrics", None) == 401
        assert get(ex.url + "/metrics", None, "prometheus", PASSWORD) == 200


@pytest.mark.parametrize(("content", "expect"), [
    ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "cannot load cert_file"),
    ("basic_auth_users:\n  bob: plaintext\n", "basic_auth_users.bob: expected a bcrypt hash"),
    ("tls_server_config:\n  cert_file: a\n", "needs both cert_file and key_file"),
    ("bogus: 1\n", "unknown key 'bogus'"),
    ("tls_server_config: [1\n", "not valid YAML"),
])
def test_bad_web_config_exits_2(tmp_path: Path, content: str, expect: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(content)
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--check-config",
                          "--web.config.file", str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert expect in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "plaintext" not in res.stderr
