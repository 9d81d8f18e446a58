"""A family that is not selected is never collected: no NVML call, no thread (through the real pynvml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.fakenvml import GPU_IS_LOST, UNKNOWN, FakeNvml
from tests.harness.exporter import ExporterProcess, sample


def start(fleet: FakeNvml, tmp_path: Path, *args: str) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys"), *args],
                           env=fleet.env())


@pytest.mark.parametrize("excluded", [True, False])
def test_an_excluded_family_makes_no_vendor_call(excluded: bool, tmp_path: Path) -> None:
    """The power call answers GPU_IS_LOST (the GPU would be down). Excluded, it is never asked."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.fail("nvmlDeviceGetPowerUsage", GPU_IS_LOST, gpu=1)
    args = ("--fields-exclude", "gpu_power_watts") if excluded else ()
    with start(fleet, tmp_path, *args) as ex:
        s = ex.scrape()
    assert sample(s, "gpu_up", gpu="0") == 1.0
    assert sample(s, "gpu_up", gpu="1") == (1.0 if excluded else 0.0)


@pytest.mark.parametrize("excluded", [True, False])
def test_excluded_xid_families_start_no_event_thread(excluded: bool, tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    fleet.fail("nvmlEventSetCreate", UNKNOWN)  # the watcher's first call: it logs when it runs
    args = ("--fields-exclude", "gpu_xid_*") if excluded else ()
    with start(fleet, tmp_path, *args) as ex:
        ex.scrape()
        ex.scrape()
        log = ex.log()
    assert ("XID events unavailable" in log) is not excluded, log


def test_include_by_exact_name_over_nvml(tmp_path: Path) -> None:
    """The defect that started issue 14: an exact family name selected nothing on NVML."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    with start(fleet, tmp_path, "--fields-include", "gpu_memory_used_bytes") as ex:
        s = ex.scrape()
    assert sample(s, "gpu_memory_used_bytes", gpu="0") is not None
    assert sample(s, "gpu_memory_used_bytes", gpu="1") is not None
    assert {n for n, _ in s if n.startswith("gpu_") and not n.startswith("gpu_exporter_")} == {
        "gpu_memory_used_bytes", "gpu_host_info"}
