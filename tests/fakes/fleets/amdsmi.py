"""The amdsmi backend's contract fleet: the fake libamd_smi with two GPUs."""

from __future__ import annotations

from pathlib import Path

from tests.fakes import fakeamdsmi
from tests.harness.exporter import ExporterProcess

BACKEND = "amdsmi"


def env(tmp: Path) -> dict[str, str]:
    """The environment in which the backend finds the fleet (the Python API's too)."""
    rocm = fakeamdsmi.built()  # compiled once per session (tests/harness/cbuild.py)
    fake = fakeamdsmi.FakeAmdSmi(rocm, tmp / "amd-fleet.conf")
    fake.write(fakeamdsmi.two_gpu_fleet())
    return fake.env()


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    return ExporterProcess(["--backend", "amdsmi", *args], env=env(tmp))
