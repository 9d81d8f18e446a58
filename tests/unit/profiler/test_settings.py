"""Every profiler flag has an env twin (PROFILER_<FLAG>) and a YAML key in --config; --check-config
validates and prints them. Precedence: default < file < environment < flag (as for serve)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.platform import settings
from exporter.platform.errors import ConfigError
from exporter.profiler import main
from tests.harness.exporter import REPO


def test_every_flag_has_an_env_twin_and_a_config_key(tmp_path: Path) -> None:
    """Each row of the table is read from its flag's env twin and from its YAML key (issue 39: one loader)."""
    parser = main.build_parser()
    assert len(main.ROWS) > 30
    for row in main.ROWS:
        assert row.env == "PROFILER_" + row.name.upper(), row
        value = "true" if row.kind == "bool" else "7"
        try:
            got = settings.load(main.ROWS, [], parser, main.CONFIG_ENV, environ={row.env: value})
            assert got.sources[row.name] == "env", f"{row.flag}: {row.env} is not read"
        except ConfigError as exc:  # read, and refused as a value of its kind: it names the variable
            assert f"({row.env})" in str(exc), str(exc)
        key = row.flag.lstrip("-")
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"{key}: '{value}'\n")
        try:
            got = settings.load(main.ROWS, ["--config", str(cfg)], parser, main.CONFIG_ENV, environ={})
            assert got.sources[row.name] == "config", f"{row.flag}: config key {key} is not read"
        except ConfigError as exc:
            assert f"invalid {row.name} (config {cfg})" in str(exc), str(exc)
    assert "PROFILER_<FLAG>" in " ".join(parser.format_help().split())


def test_defaults_are_written_once_in_the_rows() -> None:
    """--help shows each row's default from the row itself (issue 39: --window's was written three times)."""
    text = " ".join(main.build_parser().format_help().split())
    assert "history each classification looks at (default 30m)" in text
    s = main.parse_args(["--prometheus-url", "http://x:1"], environ={})
    assert (s.query.window_s, s.interval_s, s.listen_port) == (1800.0, 60.0, 9401)


def _settings(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> main.ProfilerSettings:
    twins = {t for r in main.ROWS for t in r.twins}
    for k in [k for k in __import__("os").environ if k.startswith("PROFILER_") or k in twins]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return main.parse_args(argv)


def test_precedence_file_env_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "profiler.yaml"
    cfg.write_text("prometheus-url: http://from-file:9090\nwindow: 1h\ninterval: 90s\nidle-util: 0.2\n"
                   "dry-run: true\nprometheus-header: ['X-Scope-OrgID: a']\n")
    s = _settings(["--config", str(cfg), "--interval", "2m"], {"PROFILER_WINDOW": "2h"}, monkeypatch)
    assert s.prometheus_url == "http://from-file:9090"
    assert s.query.window_s == 7200  # env over file
    assert s.interval_s == 120  # flag over file
    assert s.dry_run is True and s.headers == {"X-Scope-OrgID": "a"}
    s = _settings(["--prometheus-url", "http://x:1"], {"PROFILER_CONFIG": str(cfg), "PROFILER_DRY_RUN": "false"},
                  monkeypatch)
    assert s.prometheus_url == "http://x:1" and s.dry_run is False and s.query.window_s == 3600


def test_historical_env_names_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings([], {"PROMETHEUS_URL": "http://old:9090", "PROFILER_PORT": "9555"}, monkeypatch)
    assert (s.prometheus_url, s.listen_port) == ("http://old:9090", 9555)
    s = _settings([], {"PROMETHEUS_URL": "http://old:9090", "PROFILER_PROMETHEUS_URL": "http://new:9090"}, monkeypatch)
    assert s.prometheus_url == "http://new:9090"


@pytest.mark.parametrize(("yaml_text", "env", "needle"), [
    ("windw: 1h\n", {}, "unknown setting 'windw' (did you mean window?); known: "),
    ("- a\n", {}, "expected a mapping"),
    ("dry-run: maybe\n", {}, "expected true or false"),
    ("window: [1, 2]\n", {}, "expected a string or a number"),
    ("", {"PROFILER_ONCE": "perhaps"}, "invalid once (PROFILER_ONCE) = 'perhaps': expected true or false"),
    ("", {"PROFILER_WINDOW": "5x"}, "invalid window (PROFILER_WINDOW) = '5x'"),
])
def test_bad_settings_exit_2_in_one_line(tmp_path: Path, yaml_text: str, env: dict[str, str], needle: str) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml_text or "prometheus-url: http://x:1\n")
    done = subprocess.run([sys.executable, "-m", "exporter", "profile", "--config", str(cfg),
                           "--prometheus-url", "http://x:1"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in __import__("os").environ.items() if not k.startswith("PROFILER_")},
                               **env})
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_check_config_prints_and_exits(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text("prometheus-url: http://x:1\nprometheus-max-response-bytes: 16M\n")
    done = subprocess.run([sys.executable, "-m", "exporter", "profile", "--config", str(cfg), "--check-config"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "prometheus-max-response-bytes: 16000000  # env PROFILER_PROMETHEUS_MAX_RESPONSE_BYTES" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "exporter", "profile", "--config", str(cfg), "--check-config",
                          "--window", "1m"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--window" in bad.stderr
