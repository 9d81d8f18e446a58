"""Every NVIDIA driver generation: the fake NVML built with each real branch's exported symbols.

``tests/fakes/nvml_symbols/R*.txt`` hold the NVML functions each driver branch declares (from
the public ``nvml.h`` history, sources in that folder's README). For each branch the fake is
built without the functions that branch lacks, and the real exporter reads it through the
real ``pynvml``. The expectations are derived from what each family needs, not listed per
branch, so a branch added to the folder is tested the same way:

- the core readings (``gpu_up``, utilisation, memory, temperature, power, clocks) are
  served for every GPU on every branch;
- a family whose functions the branch lacks is absent, and says so in
  ``gpu_field_unsupported``; a family with an older version of its function is served.

The axis itself is tested too: random symbol sets (any function but the handful without
which no NVML program can start) never cost a core reading that the set still allows.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.fakes.fakenvml import FakeNvml, symbols
from tests.harness.exporter import ExporterProcess, sample

SYMBOL_DIR = Path(__file__).resolve().parents[2] / "fakes" / "nvml_symbols"
BRANCHES = sorted(p.stem for p in SYMBOL_DIR.glob("R*.txt"))
GPUS = 2

# Without these no NVML program starts: init, count, handle, shutdown (and pynvml's error strings).
ESSENTIAL = {"nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString", "nvmlDeviceGetCount_v2",
             "nvmlDeviceGetHandleByIndex_v2"}

# What a family needs: every group must have one function present (versioned alternatives in a group).
NEEDS: dict[str, list[set[str]]] = {
    "gpu_utilization_ratio": [{"nvmlDeviceGetUtilizationRates"}],
    "gpu_memory_used_bytes": [{"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"}],
    "gpu_memory_reserved_bytes": [{"nvmlDeviceGetMemoryInfo_v2"}],
    "gpu_temperature_celsius": [{"nvmlDeviceGetTemperature"}],
    "gpu_power_watts": [{"nvmlDeviceGetPowerUsage"}],
    "gpu_clock_hertz": [{"nvmlDeviceGetClockInfo"}],
    "gpu_energy_joules_total": [{"nvmlDeviceGetTotalEnergyConsumption"}],
    "gpu_processes": [{"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                       "nvmlDeviceGetComputeRunningProcesses"}],
    "gpu_throttle_reason_active": [{"nvmlDeviceGetCurrentClocksEventReasons",
                                    "nvmlDeviceGetCurrentClocksThrottleReasons"}],
    "gpu_remapped_rows": [{"nvmlDeviceGetRemappedRows"}],
    "gpu_violation_seconds_total": [{"nvmlDeviceGetViolationStatus"}],
    "gpu_ecc_errors_total": [{"nvmlDeviceGetTotalEccErrors"}],
    "gpu_pcie_link_width": [{"nvmlDeviceGetCurrPcieLinkWidth"}],
    "gpu_power_default_limit_watts": [{"nvmlDeviceGetPowerManagementDefaultLimit"}],
    "gpu_compute_mode": [{"nvmlDeviceGetComputeMode"}],
    "gpu_fabric_state": [{"nvmlDeviceGetGpuFabricInfo"}],  # R525+
}
CORE = ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_temperature_celsius", "gpu_power_watts",
        "gpu_clock_hertz")


def branch_symbols(branch: str) -> set[str]:
    lines = (SYMBOL_DIR / f"{branch}.txt").read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def available(family: str, present: set[str]) -> bool:
    return all(group & present for group in NEEDS[family])


def families_per_gpu(scrape: dict[tuple[str, frozenset], float]) -> dict[str, set[str]]:
    """family -> the gpu label values it has a sample for."""
    out: dict[str, set[str]] = {}
    for (name, labels), _ in scrape.items():
        gpu = dict(labels).get("gpu")
        if gpu is not None:
            out.setdefault(name, set()).add(gpu)
    return out


def read(tmp_path: Path, omit: set[str]) -> tuple[dict[tuple[str, frozenset], float], str]:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=GPUS, omit=sorted(omit))
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--collection-timeout", "30",
                          "--sysfs-root", str(tmp_path / "sys")], env=fleet.env()) as ex:
        return ex.scrape(), ex.log()


def test_every_branch_file_is_a_real_symbol_set() -> None:
    assert {"R470", "R525", "R535", "R550"} <= set(BRANCHES)
    for branch in BRANCHES:
        names = branch_symbols(branch)
        assert names >= ESSENTIAL, branch
        assert all(n.startswith("nvml") for n in names), branch


@pytest.mark.parametrize("branch", BRANCHES)
def test_driver_branch(branch: str, tmp_path: Path) -> None:
    present = branch_symbols(branch) & set(symbols())
    s, log = read(tmp_path, set(symbols()) - present)
    per_gpu = families_per_gpu(s)
    every = {str(i) for i in range(GPUS)}
    assert per_gpu.get("gpu_up") == every
    assert all(v == 1.0 for (n, _), v in s.items() if n == "gpu_up"), f"{branch}: a GPU is down"
    for family in NEEDS:
        if available(family, present):
            assert per_gpu.get(family) == every, f"{branch}: {family} missing although the driver has it"
        else:
            assert family not in per_gpu, f"{branch}: {family} served without its function"
    for family in CORE:
        assert per_gpu.get(family) == every, f"{branch}: core reading {family} missing"
    assert "Traceback" not in log


@pytest.mark.parametrize("branch", BRANCHES)
def test_unknown_error_loses_one_reading_on_every_branch(branch: str, tmp_path: Path) -> None:
    """NVML_ERROR_UNKNOWN (999) from one function is that reading's error on every driver generation
    (issue 26): the GPU stays up with its other readings; it is down only when its identity call
    (``nvmlDeviceGetUUID``) fails too."""
    present = branch_symbols(branch) & set(symbols())
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=GPUS, omit=sorted(set(symbols()) - present))
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--collection-timeout", "30",
                          "--sysfs-root", str(tmp_path / "sys")], env=fleet.env()) as ex:
        ex.scrape()
        for family in CORE:
            function = max(next(iter(NEEDS[family])) & present)  # the newest version: the one served
            fleet.fail(function, 999, gpu=1)
            per_gpu = families_per_gpu(s := ex.scrape())
            assert sample(s, "gpu_up", gpu="1") == 1.0, f"{branch}: 999 from {function} took GPU 1 down"
            one = {"gpu_temperature_celsius": {"sensor": "gpu"}, "gpu_clock_hertz": {"clock": "sm"}}.get(family, {})
            assert sample(s, family, gpu="1", **one) is None, (branch, function)
            assert sample(s, family, gpu="0", **one) is not None, (branch, function)
            assert all("1" in per_gpu.get(f, set()) for f in CORE if f != family), (branch, function)
            fleet.clear_fail(function)
        fleet.fail("nvmlDeviceGetPowerUsage", 999, gpu=1)
        fleet.fail("nvmlDeviceGetUUID", 999, gpu=1)
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="1") == 0.0 and sample(s, "gpu_up", gpu="0") == 1.0, branch
        assert not {f for f, gpus in families_per_gpu(s).items() if "1" in gpus} & set(CORE), branch
        assert "Traceback" not in ex.log()


def test_r470_uses_the_older_versions(tmp_path: Path) -> None:
    """R470 has no memory ``_v2``, no processes ``_v3`` and no clock event reasons: the older ones serve."""
    present = branch_symbols("R470") & set(symbols())
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in present
    s, _ = read(tmp_path, set(symbols()) - present)
    unsupported = {dict(ls)["field"] for (n, ls) in s if n == "gpu_field_unsupported"}
    assert "gpu_processes" not in unsupported and "gpu_throttle_reason_active" not in unsupported
    assert any(n == "gpu_processes" for n, _ in s) and any(n == "gpu_memory_free_bytes" for n, _ in s)
    assert not any(n == "gpu_memory_reserved_bytes" for n, _ in s)  # v1 has no reserved part


def test_pre_r470_unversioned_processes_call(tmp_path: Path) -> None:
    """Only the v1 (unversioned) processes symbol: still served, through its own struct layout."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1, omit=["nvmlDeviceGetComputeRunningProcesses_v3",
                                                            "nvmlDeviceGetComputeRunningProcesses_v2"])
    fleet.set(0, procs=[(1234, 2 * 2**30), (5678, 3 * 2**30)])
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys"),
                          "--per-process"], env=fleet.env()) as ex:
        s = ex.scrape()
    assert sample(s, "gpu_processes", gpu="0") == 2.0
    assert sample(s, "gpu_processes_memory_used_bytes", gpu="0") == 5 * 2**30
    per_pid = {dict(ls)["pid"]: v for (n, ls), v in s.items() if n == "gpu_process_memory_used_bytes"}
    assert per_pid == {"1234": 2 * 2**30, "5678": 3 * 2**30}


@pytest.mark.parametrize("seed", range(3))
def test_random_symbol_sets_keep_what_they_allow(seed: int, tmp_path: Path) -> None:
    """Any function missing (beyond the essentials) loses only the readings that need it."""
    rng = random.Random(seed)
    optional = sorted(set(symbols()) - ESSENTIAL)
    omit = set(rng.sample(optional, k=len(optional) // 3))
    present = set(symbols()) - omit
    s, log = read(tmp_path, omit)
    per_gpu = families_per_gpu(s)
    every = {str(i) for i in range(GPUS)}
    assert per_gpu.get("gpu_up") == every and all(v == 1.0 for (n, _), v in s.items() if n == "gpu_up"), (
        f"seed {seed}: omitting {sorted(omit)} took a GPU down")
    for family in NEEDS:
        if available(family, present):
            assert per_gpu.get(family) == every, f"seed {seed}: {family} lost; omitted {sorted(omit)}"
    assert "Traceback" not in log


def test_oldest_entry_points(tmp_path: Path) -> None:
    """A driver without ``nvmlInitWithFlags``, ``nvmlDeviceGetCount_v2`` and ``..HandleByIndex_v2``:
    the older ``nvmlInit_v2``, ``nvmlDeviceGetCount`` and ``nvmlDeviceGetHandleByIndex`` serve."""
    s, log = read(tmp_path, {"nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"})
    per_gpu = families_per_gpu(s)
    every = {str(i) for i in range(GPUS)}
    for family in CORE:
        assert per_gpu.get(family) == every, family
    assert "Traceback" not in log
