"""The simulated backend's contract fleet: two simulated GPUs."""

from __future__ import annotations

from pathlib import Path

from tests.harness.exporter import ExporterProcess

BACKEND = "simulated"


def start(tmp: Path, args: list[str]) -> ExporterProcess:
    return ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2", *args])
