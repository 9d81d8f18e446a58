"""Settings: precedence, validation, and the one-line exit-2 errors of `gpu-exporter serve`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.platform.errors import ConfigError
from exporter.serve import config
from tests.harness.cli import gx
from tests.harness.exporter import REPO


def test_defaults() -> None:
    s = config.load([], environ={})
    assert (s.port, s.address, s.metrics_path, s.backend, s.collection_interval) == (9400, "127.0.0.1", "/metrics",
                                                                                      "auto", 0.0)


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 9500\ncollection_interval: 15\nfields:\n  exclude: [gpu_clock_*]\nlog_level: debug\n")
    s = config.load(["--config", str(cfg)], environ={"EXPORTER_PORT": "9600"})
    assert s.port == 9600 and s.collection_interval == 15.0 and s.fields_exclude == ["gpu_clock_*"]
    assert s.log_level == "debug"
    s = config.load(["--config", str(cfg), "--port", "9700"], environ={"EXPORTER_PORT": "9600"})
    assert s.port == 9700
    s = config.load([], environ={"EXPORTER_CONFIG": str(cfg), "COLLECTION_INTERVAL": "30s"})
    assert s.port == 9500 and s.collection_interval == 30.0


@pytest.mark.parametrize(
    ("args", "env", "must_contain"),
    [
        (["--port", "abc"], {}, ["port", "'abc'", "1..65535"]),
        ([], {"EXPORTER_PORT": "70000"}, ["EXPORTER_PORT", "'70000'", "1..65535"]),
        ([], {"COLLECTION_INTERVAL": "-1"}, ["COLLECTION_INTERVAL", "'-1'", "seconds"]),
        ([], {"COLLECTION_INTERVAL": "nan"}, ["COLLECTION_INTERVAL", "'nan'"]),
        (["--backend", "cuda"], {}, ["backend", "'cuda'", "nvml"]),
        (["--metrics-path", "metrics"], {}, ["metrics_path", "absolute URL path"]),
        (["--log-level", "loud"], {}, ["log_level", "debug, info, warning, error"]),
        (["--no-such-flag"], {}, ["unrecognized arguments: --no-such-flag"]),
        (["--fields-exclude", "gpu_clock;rm"], {}, ["fields_exclude", "metric family names"]),
    ],
)
def test_bad_values_exit_2_with_one_line(args: list[str], env: dict[str, str], must_contain: list[str]) -> None:
    res = gx("serve", *args, "--check-config", env=env)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for part in must_contain:
        assert part in lines[0], (part, lines[0])
    assert res.stdout == ""


@pytest.mark.parametrize(("name", "content", "expect"), [
    ("bad.yaml", "port: [1,\n", ["config file {path} line 2: not valid YAML"]),
    ("unknown.yaml", "prot: 9400\n",
     ["config file {path}: unknown setting 'prot' (did you mean port?); known: ", "port"]),
    ("wrong.yaml", "port: true\n", ["invalid port (config {path}) = True", "1..65535"]),
    ("missing.yaml", None, ["cannot read config file {path}: No such file or directory"]),
])
def test_bad_config_files(tmp_path: Path, name: str, content: str | None, expect: list[str]) -> None:
    """Each broken file gets its own message naming the file (and the line, the setting or the
    value), on one line, with exit status 2."""
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    res = gx("serve", "--config", str(path), "--check-config")
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-exporter serve: error: "), res.stderr
    for part in expect:
        assert part.format(path=path) in lines[0], (part, lines[0])
    assert res.stdout == ""


def test_check_config_prints_effective_settings() -> None:
    res = gx("serve", "--check-config", "--backend", "simulated", env={"EXPORTER_PORT": "9555"})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["port"] == 9555 and doc["backend"] == "simulated"


def test_serve_imports_no_kubernetes_or_profiler() -> None:
    code = (
        "import sys\n"
        "from exporter import cli, backends\n"
        "from exporter.core import engine\n"
        "from exporter.serve import main, http, render, config\n"
        "backends.registry(); config.load(['--backend','simulated'], environ={})\n"
        "heavy = [m for m in ('kubernetes', 'exporter.profiler', 'grpc', 'yaml') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"serve imported {res.stdout.strip()}"


def _known(tmp_path: Path) -> list[str]:
    """The keys the "unknown setting" error lists after "known: "."""
    path = tmp_path / "typo.yaml"
    path.write_text("prot: 9400\n")
    line = gx("serve", "--config", str(path), "--check-config").stderr.strip()
    return [k.strip() for k in line.split("; known: ", 1)[1].split(",")]


def test_every_key_the_known_list_names_is_accepted(tmp_path: Path) -> None:
    """Issue 38, item 8: the list names every key a config file accepts (fields among them, as the
    README shows it), and each key it names is one the file takes."""
    known = _known(tmp_path)
    assert "fields" in known, known
    for spec in config.SPECS:
        assert spec.flag.removeprefix("--") in known, (spec.flag, known)
    # in-process (the loader is where "unknown setting" is decided; one process per key took a minute)
    for key in known:
        path = tmp_path / "one.yaml"
        path.write_text(f"{key}: {{}}\n" if key == "fields" else f"{key}: null\n")
        try:
            config.load(["--config", str(path)], environ={})
        except ConfigError as e:
            assert "unknown setting" not in str(e), (key, str(e))


@pytest.mark.parametrize(("content", "want"), [
    ("fields:\n", None),  # an empty entry selects nothing: every family, as without it
    ("fields:\n  include: [gpu_power_watts]\n", ["gpu_power_watts"]),
    ("fields: {include: [gpu_power_watts], exclude: [gpu_clock_*]}\n", ["gpu_power_watts"]),
])
def test_fields_as_the_readme_shows_it(tmp_path: Path, content: str, want: list[str] | None) -> None:
    path = tmp_path / "fields.yaml"
    path.write_text(content)
    res = gx("serve", "--config", str(path), "--check-config")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fields_include"] == (want or [])


@pytest.mark.parametrize("content", ["fields: [gpu_power_watts]\n", "fields: gpu_power_watts\n"])
def test_fields_not_a_mapping_says_what_it_takes(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fields.yaml"
    path.write_text(content)
    res = gx("serve", "--config", str(path), "--check-config")
    assert res.returncode == 2
    line = res.stderr.strip()
    assert line.count("\n") == 0 and "unknown setting" not in line, line
    assert "fields" in line and "include" in line and "exclude" in line, line


def test_a_port_in_use_names_the_flag_that_moves_it() -> None:
    """Issue 38, item 17: "address already in use" says which setting picks another port, for both
    daemons (make run takes PORT=, as the README says)."""
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        res = gx("serve", "--backend", "simulated", "--port", str(port), timeout=60)
        assert res.returncode == 1, res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert "in use" in line and "--port" in line and "make run PORT=" in line, line
        prof = subprocess.run([sys.executable, "-m", "exporter", "profile", "--prometheus-url", "http://127.0.0.1:9",
                               "--dry-run", "--listen-port", str(port)], cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=False)
        assert prof.returncode != 0
        assert "in use" in prof.stderr and "--listen-port" in prof.stderr, prof.stderr
    finally:
        held.close()
    readme = (REPO / "README.md").read_text()
    assert "make run PORT=" in readme


def test_call_deadline_defaults_under_the_collection_timeout_and_must_stay_under_it() -> None:
    from exporter.platform.configfile import ConfigError

    assert config.load([], environ={}).call_deadline == 1.0  # a fifth of the 5 s collection timeout
    assert config.load(["--collection-timeout", "1"], environ={}).call_deadline == pytest.approx(0.2)
    assert config.load(["--collection-timeout", "60"], environ={}).call_deadline == 1.0  # at most 1 s
    assert config.load(["--call-deadline", "2.5"], environ={"COLLECTION_TIMEOUT": "10"}).call_deadline == 2.5
    assert config.load([], environ={"CALL_DEADLINE": "300ms"}).call_deadline == pytest.approx(0.3)
    with pytest.raises(ConfigError) as err:
        config.load(["--call-deadline", "5"], environ={})
    assert str(err.value) == ("invalid call_deadline = 5: must be below collection_timeout (5), or one hung GPU "
                              "costs every scrape its whole wait")
    with pytest.raises(ConfigError, match=r"^invalid call_deadline \(--call-deadline\) = '0': expected a duration"):
        config.load(["--call-deadline", "0"], environ={})


def test_xid_severity_from_flag_env_and_yaml_with_one_line_errors(tmp_path: Path) -> None:
    from exporter.platform.configfile import ConfigError

    assert config.load([], environ={}).xid_severity == {}
    assert config.load(["--xid-severity", "48=warn, 13=IGNORE,ecc_corrected=fatal"], environ={}).xid_severity == {
        48: "warn", 13: "ignore", "ecc_corrected": "fatal"}
    assert config.load([], environ={"XID_SEVERITY": "79=ignore"}).xid_severity == {79: "ignore"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("xid-severity:\n  48: ignore\n  '63': fatal\n")
    assert config.load(["--config", str(cfg)], environ={}).xid_severity == {48: "ignore", 63: "fatal"}
    for raw, message in (
        ("48=critical", "invalid xid_severity (--xid-severity) = '48=critical': 48: severity 'critical' is not one "
                        "of fatal, warn, ignore"),
        ("48", "invalid xid_severity (--xid-severity) = '48': expected CODE=SEVERITY pairs separated by commas"),
        ("48=warn,48=fatal", "invalid xid_severity (--xid-severity) = '48=warn,48=fatal': each XID code or event "
                             "at most once"),
        ("x=warn", "invalid xid_severity (--xid-severity) = 'x=warn': key 'x' is not an XID code"),
    ):
        with pytest.raises(ConfigError) as err:
            config.load(["--xid-severity", raw], environ={})
        assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
