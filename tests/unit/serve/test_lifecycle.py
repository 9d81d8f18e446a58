"""The exporter process' life: signals and the children it starts (issue 16)."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

from tests.harness.exporter import ExporterProcess
from tests.harness.poll import wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: only its parent (init, here) has not reaped it yet
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_hung_rocm_smi_does_not_outlive_the_exporter(tmp_path: Path) -> None:
    """rocm-smi runs in its own session (so a timeout kills what it started); the exporter's exit kills it too."""
    child, go = tmp_path / "child.pid", tmp_path / "hang"
    script = tmp_path / "rocm-smi"
    script.write_text(f'#!/bin/sh\nif [ -e "{go}" ]; then echo $$ > "{child}"; exec sleep 300; fi\nexit 3\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    ex = ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(script), "--command-timeout", "100",
                          "--collection-timeout", "1", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys")])
    with ex:
        go.touch()
        ex.get("/metrics")  # starts a collection that meets the hung rocm-smi (the scrape gives up after 1 s)
        pid = int(wait_until(lambda: child.read_text().strip() if child.exists() else None, 30,
                             what="rocm-smi to start"))
        assert alive(pid)
        t0 = time.monotonic()
        assert ex.stop() == 0
        assert time.monotonic() - t0 < 10
    wait_until(lambda: not alive(pid), 5, what="the hung rocm-smi to be killed with the exporter")


def test_sighup_without_web_config_does_not_kill(tmp_path: Path) -> None:
    with ExporterProcess(["--backend", "simulated"]) as ex:
        for n in (1, 2, 3):  # one at a time: signals of one kind do not queue
            ex.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: ex.log().count("SIGHUP") >= n, 10, what=f"SIGHUP log line {n}")  # noqa: B023
        assert ex.proc.poll() is None and ex.get("/healthz")[0] == 200
