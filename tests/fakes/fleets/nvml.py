"""The nvml backend's contract fleet: the fake libnvidia-ml.so.1 with two GPUs and one fan each."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess

BACKEND = "nvml"


def env(tmp: Path) -> dict[str, str]:
    """The environment in which the backend finds the fleet (the Python API's too)."""
    return FakeNvml(tmp / "fleet.conf", gpus=2, fans=1).env()


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", *args], env=env(tmp))
