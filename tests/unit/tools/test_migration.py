"""Issue 38, item 11: docs/migration.md's host install (a systemd unit, docker run) runs as printed,
and the internal history is gone from it."""

from __future__ import annotations

import configparser
import re
import shlex

from tests.harness.cli import gx
from tests.harness.exporter import REPO

DOC = (REPO / "docs" / "migration.md").read_text()


def _check(args: list[str]) -> None:
    assert args[0] == "serve", args
    res = gx(*args, "--check-config")
    assert res.returncode == 0, (args, res.stderr)


def test_the_systemd_unit_runs_serve_on_all_addresses() -> None:
    (unit,) = re.findall(r"```ini\n(.*?)```", DOC, re.S)
    ini = configparser.ConfigParser(interpolation=None, strict=False)
    ini.read_string(unit)
    cmd = shlex.split(ini["Service"]["ExecStart"])
    assert cmd[0].endswith("/bin/gpu-exporter")
    _check(cmd[1:])
    assert "--address" in cmd and cmd[cmd.index("--address") + 1] == "0.0.0.0"
    assert ini["Service"]["Restart"] and ini["Install"]["WantedBy"] == "multi-user.target"
    assert "HUP" in ini["Service"]["ExecReload"]


def test_docker_run_passes_serve_flags_the_exporter_takes() -> None:
    block = next(b for b in re.findall(r"```sh\n(.*?)```", DOC, re.S) if "docker run" in b)
    words = shlex.split(block.replace("\\\n", " "))
    image = next(i for i, w in enumerate(words) if w.startswith("ghcr.io/gpu-exporter/gpu-exporter:"))
    _check(words[image + 1:])
    assert "-p" in words and words[words.index("-p") + 1] == "9400:9400"


def test_port_and_address_differences_are_said() -> None:
    for needle in (":9835", ":9400", "127.0.0.1", "--address 0.0.0.0", "--port 9835"):
        assert needle in DOC, needle
    assert not re.search(r"\b[Ii]ssue \d+\b", DOC), "internal history (issue numbers) in user docs"
