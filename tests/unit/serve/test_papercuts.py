"""Issue 28, findings 6 and 12: the first-hour papercuts of ``gpu-exporter`` and ``serve``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.backends.simulated import SCENARIOS
from tests.harness.cli import gx
from tests.harness.exporter import REPO
from tests.harness.poll import wait_until


def test_serve_help_lists_every_scenario() -> None:
    proc = gx("serve", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for scenario in SCENARIOS:
        assert scenario in text, f"serve --help does not name the {scenario!r} scenario"
    assert "driver" in text


@pytest.mark.parametrize("flag", ["--version", "-V", "version"])
def test_version_flag(flag: str) -> None:
    from exporter import __version__

    proc = gx(flag)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gpu-exporter {__version__}"


def test_switch_usage_reads_as_a_switch() -> None:
    text = " ".join(gx("serve", "--help").stdout.split())
    usage = text[: text.index("Serve GPU metrics")]
    assert "ALLOW_SIMULATED" not in usage and "PER_PROCESS" not in usage, usage
    assert "[--allow-simulated [true|false]]" in usage


@pytest.mark.parametrize("backend", ["nvml,simulated", "simulated,amdsmi", "rocm-smi,simulated"])
def test_simulated_never_mixes_with_real_backends(backend: str) -> None:
    proc = gx("serve", "--backend", backend, "--check-config")
    assert proc.returncode == 2, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "backend" in line and "simulated" in line, line


def test_check_config_resolves_the_address() -> None:
    proc = gx("serve", "--address", "example.invalid", "--check-config")
    assert proc.returncode == 2, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "example.invalid" in line and "resolve" in line, line
    assert gx("serve", "--address", "localhost", "--check-config").returncode == 0


def test_ipv6_address_is_logged_in_brackets(tmp_path: Path) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--address",
                                 "::1", "--port", str(port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        line = wait_until(lambda: next((ln for ln in log.read_text().splitlines() if "/metrics" in ln), None),
                          timeout=30, what="the serving line")
        assert f"http://[::1]:{port}/metrics" in line, line
    finally:
        proc.terminate()
        proc.wait(10)


# ---- finding 7: the config file format, with a shipped example --------------------------------------

EXAMPLE = REPO / "docs" / "exporter.example.yaml"


def test_example_config_loads_and_names_every_setting(tmp_path: Path) -> None:
    import re

    from exporter.serve import config

    text = EXAMPLE.read_text()
    s = config.load(["--config", str(EXAMPLE)], environ={})
    assert (s.backend, s.address, s.collection_interval, s.log_format) == ("nvml", "0.0.0.0", 10.0, "json")
    assert s.fields_exclude == ["gpu_pcie_*"]
    # Every setting is shown, switched on or commented out; switched on, the commented ones load
    # too and, where a setting has a default, show it.
    commented = re.findall(r"^# ([a-z][a-z._-]*): (.*)$", text, re.M)
    active = re.findall(r"^([a-z][a-z._-]*):", text, re.M)
    shown = {k.replace("-", "_").replace(".", "_") for k in [*active, *(k for k, _ in commented)]}
    missing = {spec.name for spec in config.SPECS} - shown - ({"fields_exclude"} if "fields" in active else set())
    assert not missing, f"docs/exporter.example.yaml does not show {sorted(missing)}"
    on = tmp_path / "all.yaml"
    on.write_text(re.sub(r"^# ([a-z][a-z._-]*: )", r"\1", text, flags=re.M))
    everything = config.load(["--config", str(on)], environ={})
    defaults = config.load([], environ={})  # the built-in defaults, the backends' own settings' included
    for key, _ in commented:
        name = key.replace("-", "_").replace(".", "_")
        if getattr(defaults, name) is not None:
            assert getattr(everything, name) == getattr(defaults, name), f"{key}: the comment is not the default"


def test_config_file_format_is_documented() -> None:
    readme = (REPO / "README.md").read_text()
    assert "docs/exporter.example.yaml" in readme
