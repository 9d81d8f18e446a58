"""The rocm-smi backend's contract fleet: a rocm-smi script printing the same two GPUs' JSON."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.fakes import fakeamdsmi
from tests.harness.exporter import ExporterProcess

BACKEND = "rocm-smi"


def env(tmp: Path) -> dict[str, str]:
    """The environment in which the backend finds the fleet (the Python API's too): the script first on PATH."""
    (tmp / "bin").mkdir(parents=True, exist_ok=True)
    (tmp / "rocm-smi.json").write_text(fakeamdsmi.rocm_smi_json(fakeamdsmi.two_gpu_fleet()))
    script = tmp / "bin" / "rocm-smi"
    script.write_text(f"#!/bin/sh\ncat '{tmp / 'rocm-smi.json'}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    environment = env(tmp)
    return ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(tmp / "bin" / "rocm-smi"), *args],
                           env=environment)
