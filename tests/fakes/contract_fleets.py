"""One two-GPU fleet per backend, each served by the real exporter process (for the contract test)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tests.fakes import fakeamdsmi
from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess

BACKENDS = ("simulated", "nvml", "amdsmi", "rocm-smi")


@contextlib.contextmanager
def exporter_for(backend: str, tmp: Path, *args: str) -> Iterator[ExporterProcess]:
    """A running exporter reading a two-GPU fleet through ``backend`` (``args``: more flags)."""
    tmp.mkdir(parents=True, exist_ok=True)
    common = ["--cache-ttl", "0", "--collection-timeout", "30", "--sysfs-root", str(tmp / "sys"), *args]
    if backend == "simulated":
        ex = ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2", *common])
    elif backend == "nvml":
        fleet = FakeNvml(tmp / "fleet.conf", gpus=2, fans=1)
        ex = ExporterProcess(["--backend", "nvml", *common], env=fleet.env())
    elif backend == "amdsmi":
        rocm = fakeamdsmi.built()
        fake = fakeamdsmi.FakeAmdSmi(rocm, tmp / "amd-fleet.conf")
        fake.write(fakeamdsmi.two_gpu_fleet())
        ex = ExporterProcess(["--backend", "amdsmi", *common], env=fake.env())
    elif backend == "rocm-smi":
        (tmp / "bin").mkdir(exist_ok=True)
        (tmp / "rocm-smi.json").write_text(fakeamdsmi.rocm_smi_json(fakeamdsmi.two_gpu_fleet()))
        script = tmp / "bin" / "rocm-smi"
        script.write_text(f"#!/bin/sh\ncat '{tmp / 'rocm-smi.json'}'\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        ex = ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(script), *common],
                             env={"PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"})
    else:
        raise ValueError(backend)
    with ex:
        yield ex
