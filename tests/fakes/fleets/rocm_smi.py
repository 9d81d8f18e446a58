"""The rocm-smi backend's contract fleet: a rocm-smi script printing the same two GPUs' JSON."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.fakes import fakeamdsmi
from tests.harness.exporter import ExporterProcess

BACKEND = "rocm-smi"


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    (tmp / "bin").mkdir(exist_ok=True)
    (tmp / "rocm-smi.json").write_text(fakeamdsmi.rocm_smi_json(fakeamdsmi.two_gpu_fleet()))
    script = tmp / "bin" / "rocm-smi"
    script.write_text(f"#!/bin/sh\ncat '{tmp / 'rocm-smi.json'}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(script), *args],
                           env={"PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})
