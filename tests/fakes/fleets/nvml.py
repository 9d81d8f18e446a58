"""The nvml backend's contract fleet: the fake libnvidia-ml.so.1 with two GPUs and one fan each."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess

BACKEND = "nvml"


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    fleet = FakeNvml(tmp / "fleet.conf", gpus=2, fans=1)
    return ExporterProcess(["--backend", "nvml", *args], env=fleet.env())
