"""Golden exposition: the exact /metrics text for a fixed fake fleet, both formats.

Regenerate after an intended schema change with ``make golden`` (GOLDEN_UPDATE=1), then
review the diff of ``tests/unit/serve/golden/`` like code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.fakes.fakenvml import FakeNvml, make_sysfs, sysfs_address
from tests.harness.exporter import ExporterProcess
from tests.harness.prom import check_metrics

GOLDEN = Path(__file__).parent / "golden"
# Values that change from run to run or machine to machine.
VOLATILE = ("gpu_exporter_collector_duration_seconds", "gpu_exporter_last_success_timestamp_seconds", "process_")


def normalise(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith(VOLATILE):
            line = re.sub(r" \S+$", " <volatile>", line)
        elif line.startswith("gpu_host_info{"):
            line = "gpu_host_info{<host>} 1"
        elif line.startswith("gpu_exporter_build_info{"):
            line = re.sub(r'python_version="[^"]*"', 'python_version="<python>"', line)
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(("fmt", "accept"), [("text", "text/plain"),
                                             ("openmetrics", "application/openmetrics-text; version=1.0.0")])
def test_golden_exposition(tmp_path: Path, fmt: str, accept: str) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1)
    fleet.set(0, ecc_corrected_volatile=3, remap_corr=1, clocks_event_reasons=0x24)
    sysfs = tmp_path / "sys"
    make_sysfs(sysfs, [(sysfs_address(g["bus_id"]), 0x10DE, 0x030200) for g in fleet.gpus]
               + [("0000:99:00.0", 0x10DE, 0x030200)])  # a third GPU on the bus that NVML does not see
    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(sysfs), "--cache-ttl", "0",
                          "--collection-timeout", "30"], env=fleet.env()) as ex:
        status, body, _ = ex.get("/metrics", {"Accept": accept})
        assert status == 200
    text = body.decode()
    if fmt == "text":
        assert check_metrics(text) == []
    got = normalise(text)
    path = GOLDEN / f"nvml-2gpu.{fmt}.prom"
    if os.environ.get("GOLDEN_UPDATE"):
        path.write_text(got)
    assert path.exists(), f"{path} missing: run make golden"
    assert got == path.read_text(), f"exposition differs from {path}; if intended, run make golden and review"
