"""The amdsmi backend's contract fleet: the fake libamd_smi with two GPUs."""

from __future__ import annotations

from pathlib import Path

from tests.fakes import fakeamdsmi
from tests.harness.exporter import ExporterProcess

BACKEND = "amdsmi"


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    rocm = fakeamdsmi.built()  # compiled once per session (tests/harness/cbuild.py)
    fake = fakeamdsmi.FakeAmdSmi(rocm, tmp / "amd-fleet.conf")
    fake.write(fakeamdsmi.two_gpu_fleet())
    return ExporterProcess(["--backend", "amdsmi", *args], env=fake.env())
