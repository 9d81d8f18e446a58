"""The traceback gate itself: it sees tracebacks in captured stderr and in log files, and only from our CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness import cli_gate


def fake_cli(tmp_path: Path) -> Path:
    script = tmp_path / "gpu-exporter"
    script.write_text('#!/bin/sh\necho "Traceback (most recent call last):" >&2\necho "  boom" >&2\nexit 1\n')
    script.chmod(0o755)
    return script


def test_captured_stderr_and_log_files_are_scanned(tmp_path: Path) -> None:
    script = fake_cli(tmp_path)
    cli_gate.take()
    subprocess.run([str(script)], capture_output=True, check=False)
    assert [h.split(":", 1)[0] for h in cli_gate.take()] == [str(script)]
    with (tmp_path / "log").open("wb") as log:
        subprocess.Popen([str(script)], stdout=log, stderr=subprocess.STDOUT).wait()
    assert len(cli_gate.take()) == 1


def test_clean_runs_and_other_programs_are_not_flagged(tmp_path: Path) -> None:
    cli_gate.take()
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--port", "x"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 2 and cli_gate.take() == []
    subprocess.run([sys.executable, "-c", "raise SystemExit('Traceback (most recent call last)')"],
                   capture_output=True, check=False)
    assert cli_gate.take() == []  # not our CLI


def test_is_cli() -> None:
    assert cli_gate.is_cli([sys.executable, "-m", "exporter", "serve"])
    assert cli_gate.is_cli(["/usr/bin/python3", "-m", "exporter.tools.gpucheck"])
    assert cli_gate.is_cli(["/venv/bin/gpu-exporter", "diff"])
    assert not cli_gate.is_cli(["openssl", "req"]) and not cli_gate.is_cli("ls -l")
