"""``gpu-exporter profile --web.config.file``: the profiler's /metrics and /healthz on the shared
server, with real TLS handshakes and basic auth (issue 26/27: one HTTP layer under both daemons)."""

from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from exporter.platform.errors import ConfigError
from exporter.profiler.main import parse_args, run
from tests.harness.poll import wait_until
from tests.harness.profiler import closed_port_url

PASSWORD = "s3cret-Pa55word"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("PROMETHEUS_URL", "PROFILER_PORT", "PROFILER_WEB_CONFIG_FILE", "KUBECONFIG",
                "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def _web(d: Path, tls: bool = True) -> Path:
    if tls:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", "tls.key", "-out", "tls.crt"], cwd=d, check=True, capture_output=True, timeout=60)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    p = d / "web.yml"
    p.write_text(("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n" if tls else "")
                 + f"basic_auth_users:\n  prometheus: {hashed}\n")
    return p


def _get(url: str, ctx: ssl.SSLContext | None, user: str | None = None) -> tuple[int, bytes]:
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_flag_and_its_env_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    web = _web(tmp_path, tls=False)
    assert parse_args(["--prometheus-url", "http://p:9090", "--web.config.file", str(web)]).web is not None
    monkeypatch.setenv("PROFILER_WEB_CONFIG_FILE", str(web))
    s = parse_args(["--prometheus-url", "http://p:9090"])
    assert s.web is not None and set(s.web.users) == {"prometheus"}
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users:\n  prometheus: $2y$16$" + "a" * 53 + "\n")
    with pytest.raises(ConfigError, match=r"--web\.config\.file: .*bcrypt cost 16"):
        parse_args(["--prometheus-url", "http://p:9090", "--web.config.file", str(bad)])


def test_bad_web_config_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: {}\n")
    assert run(["--prometheus-url", "http://p:9090", "--web.config.file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "tls_server_config" in err, err


@contextlib.contextmanager
def _profiler(argv: list[str]) -> Iterator[int]:
    """``gpu-exporter profile`` running in a thread; yields its port, then stops it (exit status 0)."""
    ready: dict[str, Any] = {}
    stop, rc = threading.Event(), []
    loop = threading.Thread(target=lambda: rc.append(run(argv, install_signals=False, stop=stop,
                                                         on_ready=ready.update)), daemon=True)
    loop.start()
    try:
        wait_until(lambda: "port" in ready, timeout=30, what="the profiler to listen")
        yield int(ready["port"])
    finally:
        stop.set()
        loop.join(30)
    assert rc == [0]


def test_profiler_serves_tls_and_basic_auth(tmp_path: Path) -> None:
    web = _web(tmp_path)
    argv = ["--dry-run", "--prometheus-url", closed_port_url(), "--listen-address", "127.0.0.1", "--listen-port", "0",
            "--interval", "1s", "--log-level", "error", "--web.config.file", str(web)]
    with _profiler(argv) as port:
        base = f"https://127.0.0.1:{port}"
        ctx = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        assert _get(base + "/metrics", ctx)[0] == 401
        status, body = _get(base + "/metrics", ctx, "prometheus")
        assert status == 200 and b"gpu_profiler_cycle_duration_seconds" in body
        status, body = _get(base + "/healthz", ctx)  # open to probes, and says only up or down
        assert (status, body) in ((200, b"ok\n"), (503, b"not ok\n"))
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
