"""Both daemons handle signals the same way (exporter/platform/daemon.py): SIGHUP reloads the web
config and never kills, SIGTERM stops with status 0. Before issue 39 a SIGHUP killed the profiler."""

from __future__ import annotations

import base64
import signal
from pathlib import Path

import bcrypt
import pytest

from tests.harness.exporter import DaemonProcess
from tests.harness.poll import wait_until
from tests.harness.profiler import closed_port_url

PASSWORD = "s3cret-Pa55word"


def _args(command: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    if command == "serve":
        return ["--backend", "simulated"], {}
    # a dry run without a cluster, reading a Prometheus that is not there: the loop runs and fails each cycle
    return (["--prometheus-url", closed_port_url(), "--dry-run", "--interval", "1h"],
            {"KUBECONFIG": str(tmp_path / "no-kubeconfig")})


def _auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "profile"])
def test_sighup_reloads_the_web_config_and_never_kills(command: str, tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    cfg.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    args, env = _args(command, tmp_path)
    with DaemonProcess(command, [*args, "--web.config.file", str(cfg)], env=env) as d:
        assert d.get("/metrics", _auth("prometheus"))[0] == 200
        cfg.write_text(f"basic_auth_users:\n  scraper: {hashed}\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloaded (SIGHUP)" in d.log(), 60, what="the SIGHUP reload line")
        assert d.proc.poll() is None
        assert d.get("/metrics", _auth("scraper"))[0] == 200
        assert d.get("/metrics", _auth("prometheus"))[0] == 401
        assert d.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "profile"])
def test_sighup_without_a_web_config_is_ignored_with_a_line(command: str, tmp_path: Path) -> None:
    args, env = _args(command, tmp_path)
    with DaemonProcess(command, args, env=env) as d:
        for n in (1, 2):  # one at a time: signals of one kind do not queue
            d.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: d.log().count("SIGHUP: no --web.config.file") >= n, 60,  # noqa: B023
                       what=f"SIGHUP log line {n}")
        assert d.proc.poll() is None and d.get("/healthz")[0] == 200
        assert d.stop() == 0
