"""Hostile and careless settings (issue 16): each is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exporter.serve import config
from tests.harness.cli import gx


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return gx("serve", *args, "--check-config", env=env)


def one_line_exit_2(res: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    for part in parts:
        assert part in lines[0], (part, lines[0])


@pytest.mark.parametrize(("content", "expect"), [
    (b"sysfs_root: /sys\nport: !!timestamp 2024-02-30\n", "a value cannot be read"),
    (b"port: " + b"9" * 5000 + b"\n", "a value cannot be read"),
    (b"fields_include: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper than 32 levels"),
    (b"a: &x [1, 2]\nfields_include: *x\n", "aliases"),
    (b"port: \xff\xfe\n", "not UTF-8"),
    (b"port: 1\n\xef\xbb\xbfbackend: nvml\n", "unknown setting"),
    (b"\x00\x01", "not valid YAML"),
])
def test_hostile_config_files(tmp_path: Path, content: bytes, expect: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    one_line_exit_2(run_serve("--config", str(cfg)), expect, str(cfg))


def test_bom_and_dates_are_read(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\xef\xbb\xbfport: 9500\nsysfs_root: 2024-02-30\n")  # a BOM; a "date" that is a path
    s = config.load(["--config", str(cfg)], environ={})
    assert s.port == 9500 and s.sysfs_root == "2024-02-30"


@pytest.mark.parametrize("path", ["/", "/healthz", "/readyz", "//evil.example", "/a/../b", "/m<script>",
                                  "/x%zz", "metrics", "/stats"])
def test_metrics_path_must_not_shadow_or_leave_the_site(path: str) -> None:
    with pytest.raises(config.ConfigError, match="metrics_path"):
        config.load(["--metrics-path", path], environ={})


def test_reserved_paths_are_every_route_the_server_answers() -> None:
    from exporter.serve.api import register
    from exporter.serve.http import build_server

    class NoEngine:
        pass

    srv = build_server(NoEngine(), "127.0.0.1", 0, "/metrics", 60.0)  # type: ignore[arg-type]
    try:
        register(srv, NoEngine(), "/metrics")  # type: ignore[arg-type]
        assert set(srv.routes) - {"/metrics"} == set(config.RESERVED_PATHS)
    finally:
        srv.server_close()


@pytest.mark.parametrize("address", ["999.1.1.1", "1.2.3", "[::1]", "a..b", "ex_ample", "::g"])
def test_bad_address_exits_2(address: str) -> None:
    one_line_exit_2(run_serve("--address", address), "address")


def test_good_addresses() -> None:
    for a, canon in (("0.0.0.0", "0.0.0.0"), ("::", "::"), ("::0001", "::1"), ("gpu-node-1.example", None)):
        assert config.load(["--address", a], environ={}).address == (canon or a)


def test_log_level_warn_is_warning() -> None:
    assert config.load([], environ={"LOG_LEVEL": "WARN"}).log_level == "warning"
    assert config.load(["--log-level", "warn"], environ={}).log_level == "warning"


@pytest.mark.parametrize("flag", [s.flag for s in config.SPECS if s.kind in ("integer", "seconds")])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", "9" * 5000, "-1", "1_0", "\u0663", "0x10"])
def test_numeric_flags_reject_nan_inf_huge_negative(flag: str, value: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load([flag, value], environ={})
    assert "\n" not in str(info.value) and flag in str(info.value)


def test_duplicate_backends_are_rejected() -> None:
    one_line_exit_2(run_serve("--backend", "simulated,simulated"), "each backend at most once")
    one_line_exit_2(run_serve("--backend", "simulated, SIMULATED"), "each backend at most once")
