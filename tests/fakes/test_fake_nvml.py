"""Self-tests of the fake libnvidia-ml.so.1, driven through the real pynvml.

Most tests load the fake in this process (one build per process); the omitted-symbol and
cross-process tests run pynvml in a subprocess with ``FakeNvml.env()``.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.fakes import fakenvml
from tests.fakes.fakenvml import FakeNvml, build_library, load_in_process, make_sysfs, sysfs_address

REPO = Path(__file__).resolve().parents[2]


def _shutdown_all() -> None:
    for _ in range(16):
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            return


@pytest.fixture
def lib() -> ctypes.CDLL:
    cdll = load_in_process(build_library())
    cdll.fakeNvmlParseCount.restype = ctypes.c_ulong
    return cdll


@pytest.fixture
def fleet(fleet: FakeNvml, monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL) -> Iterator[FakeNvml]:
    """The suite's fleet (tests/conftest.py; FakeNvml's defaults), initialised in this process."""
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fleet.path))
    pynvml.nvmlInit()
    yield fleet
    _shutdown_all()


def handle(i: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


# ---------------------------------------------------------------- values


def test_every_value_and_unit_is_returned_exactly_as_written(fleet: FakeNvml) -> None:
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlSystemGetDriverVersion() == fleet.globals["driver_version"]
    assert pynvml.nvmlSystemGetNVMLVersion() == fleet.globals["nvml_version"]
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    for i, g in enumerate(fleet.gpus):
        h = handle(i)
        assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert pynvml.nvmlDeviceGetUUID(h) == g["uuid"]
        assert pynvml.nvmlDeviceGetSerial(h) == g["serial"]
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetMinorNumber(h) == i
        pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
        assert pci.busId == g["bus_id"]
        assert pci.busIdLegacy == g["bus_id"][4:]
        assert (pci.bus, pci.pciDeviceId, pci.pciSubSystemId) == (int(g["bus_id"][9:11], 16), 0x233010DE, 0x16C110DE)
        ext = pynvml.nvmlPciInfoExt_v1_t(version=pynvml.nvmlPciInfoExt_v1)
        pynvml.nvmlDeviceGetPciInfoExt(h, ctypes.byref(ext))
        assert (ext.busId, ext.baseClass, ext.subClass) == (g["bus_id"], 3, 2)
        assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
        assert pynvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        assert (util.gpu, util.memory) == (g["util_gpu"], g["util_mem"])
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        total, reserved, used = g["mem_total"], g["mem_reserved"], g["mem_used"]
        assert (mem.total, mem.used, mem.free) == (total, used + reserved, total - reserved - used)
        mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert (mem2.total, mem2.reserved, mem2.used, mem2.free) == (total, reserved, used, total - reserved - used)
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == g["temp_gpu"]
        assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == g["temp_gpu"]
        assert pynvml.nvmlDeviceGetPowerUsage(h) == g["power_mw"]
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == g["enforced_limit_mw"]
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == g["power_limit_mw"]
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == g["energy_mj"]
        for t, name in enumerate(("graphics", "sm", "mem", "video")):
            assert pynvml.nvmlDeviceGetClockInfo(h, t) == g[f"clock_{name}"]
            assert pynvml.nvmlDeviceGetMaxClockInfo(h, t) == g[f"max_clock_{name}"]
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == g["pcie_gen"]
        assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == g["pcie_max_gen"]
        assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == g["pcie_gpu_max_gen"]
        assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == g["pcie_width"]
        assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == g["pcie_max_width"]
        assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == g["pcie_replay"]
        assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == g["pcie_tx_kbps"]
        assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == g["pcie_rx_kbps"]
        assert pynvml.nvmlDeviceGetPerformanceState(h) == g["pstate"]
        assert pynvml.nvmlDeviceGetPowerState(h) == g["pstate"]
        assert pynvml.nvmlDeviceGetNumFans(h) == 0
        assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == g["clocks_event_reasons"]
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == g["clocks_event_reasons"]
        assert pynvml.nvmlDeviceGetSupportedClocksEventReasons(h) == 0x1FF
        assert pynvml.nvmlDeviceGetSupportedClocksThrottleReasons(h) == 0x1FF
        for policy, ns in g["violation"].items():
            v = pynvml.nvmlDeviceGetViolationStatus(h, policy)
            assert (v.referenceTime, v.violationTime) == (g["violation_ref"], ns)
        assert pynvml.nvmlDeviceGetEncoderUtilization(h) == [g["enc_util"], g["enc_period_us"]]
        assert pynvml.nvmlDeviceGetDecoderUtilization(h) == [g["dec_util"], g["dec_period_us"]]
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeXidCriticalError
    # Distinct per GPU, so a test can tell which GPU a value came from.
    assert len({pynvml.nvmlDeviceGetPowerUsage(handle(i)) for i in range(8)}) == 8


def test_fans_are_reported_only_on_boards_that_have_them(fleet: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle(0))
    fleet.set(0, fans=2, fan_speed=55)
    assert pynvml.nvmlDeviceGetNumFans(handle(0)) == 2
    assert pynvml.nvmlDeviceGetFanSpeed(handle(0)) == 55
    assert pynvml.nvmlDeviceGetFanSpeed_v2(handle(0), 1) == 55
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetFanSpeed_v2(handle(0), 2)


def test_field_values_carry_per_field_return_codes(fleet: FakeNvml) -> None:
    g = fleet.gpus[2]
    fleet.set(2, pcie_replay=17, ecc_uncorrected_aggregate=3, nvlink_err={(2, 3): 7, (5, 3): 1})
    ids = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
           pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
           pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 4242]
    vals = pynvml.nvmlDeviceGetFieldValues(handle(2), ids)
    assert [v.nvmlReturn for v in vals] == [0, 0, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert vals[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and vals[0].value.uiVal == g["temp_mem"]
    assert vals[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert [vals[1].value.ullVal, vals[2].value.uiVal, vals[3].value.ullVal, vals[4].value.ullVal] == [
        g["energy_mj"], 17, 3, 8]
    assert abs(vals[0].timestamp / 1e6 - time.time()) < 60  # microseconds since the epoch

    fleet.fail_field(pynvml.NVML_FI_DEV_MEMORY_TEMP, fakenvml.NOT_SUPPORTED, gpu=2)
    vals = pynvml.nvmlDeviceGetFieldValues(handle(2), ids[:2])
    assert [v.nvmlReturn for v in vals] == [fakenvml.NOT_SUPPORTED, 0]
    assert pynvml.nvmlDeviceGetFieldValues(handle(1), ids[:1])[0].nvmlReturn == 0
    fleet.fail("nvmlDeviceGetFieldValues", fakenvml.UNKNOWN)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetFieldValues(handle(1), ids[:1])


# ---------------------------------------------------------------- live changes


def test_a_change_is_visible_on_the_next_call_without_reinit(fleet: FakeNvml, lib: ctypes.CDLL) -> None:
    h = handle(3)
    for k in range(50):  # back-to-back writes: every one must be seen
        fleet.set(3, power_mw=200_000 + k, energy_mj=fleet.gpus[3]["energy_mj"] + 1000)
        assert pynvml.nvmlDeviceGetPowerUsage(h) == 200_000 + k
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == fleet.gpus[3]["energy_mj"]
    fleet.set_global(driver_version="560.35.03")
    assert pynvml.nvmlSystemGetDriverVersion() == "560.35.03"


def test_calls_do_not_reparse_an_unchanged_file(fleet: FakeNvml, lib: ctypes.CDLL) -> None:
    h = handle(0)
    pynvml.nvmlDeviceGetPowerUsage(h)
    before = lib.fakeNvmlParseCount()
    for _ in range(2000):
        pynvml.nvmlDeviceGetPowerUsage(h)
    assert lib.fakeNvmlParseCount() == before
    fleet.set(0, power_mw=1)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 1
    assert lib.fakeNvmlParseCount() == before + 1


def test_hand_written_file_without_gen_counter_is_stat_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL) -> None:
    path = tmp_path / "manual.conf"
    path.write_text("gpu.0.power_mw=1000\ngpu.1.power_mw=1001\n")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 2  # highest index + 1 when count= is absent
        assert pynvml.nvmlDeviceGetName(handle(1)) == "NVIDIA H100 80GB HBM3"
        assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == 1000
        tmp = tmp_path / "manual.tmp"
        tmp.write_text("count=1\ngpu.0.power_mw=250000\n")
        os.replace(tmp, path)
        assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == 250_000
        assert pynvml.nvmlDeviceGetCount() == 1
    finally:
        _shutdown_all()


def test_count_shrinks_and_stale_handles_become_invalid(fleet: FakeNvml) -> None:
    h5 = handle(5)
    fleet.set_count(4)
    assert pynvml.nvmlDeviceGetCount() == 4
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(h5)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(5)
    fleet.set_count(10)
    assert pynvml.nvmlDeviceGetPowerUsage(h5) == fleet.gpus[5]["power_mw"]
    assert pynvml.nvmlDeviceGetUUID(handle(9)) == fleet.gpus[9]["uuid"]


def test_handles_by_uuid_and_pci_bus_id(fleet: FakeNvml) -> None:
    g = fleet.gpus[6]
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(g["uuid"])) == 6
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(g["bus_id"])) == 6
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(sysfs_address(g["bus_id"]))) == 6
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-ffffffff-0000-0000-0000-000000000000")


def test_name_buffer_too_small_is_insufficient_size(fleet: FakeNvml, lib: ctypes.CDLL) -> None:
    small, big = ctypes.create_string_buffer(8), ctypes.create_string_buffer(96)
    assert lib.nvmlDeviceGetName(handle(0), small, ctypes.c_uint(8)) == fakenvml.INSUFFICIENT_SIZE
    assert lib.nvmlDeviceGetName(handle(0), big, ctypes.c_uint(96)) == fakenvml.SUCCESS
    assert big.value == b"NVIDIA H100 80GB HBM3"


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(("code", "exc"), [
    (fakenvml.NOT_SUPPORTED, pynvml.NVMLError_NotSupported),
    (fakenvml.NO_PERMISSION, pynvml.NVMLError_NoPermission),
    (fakenvml.TIMEOUT, pynvml.NVMLError_Timeout),
    (fakenvml.GPU_IS_LOST, pynvml.NVMLError_GpuIsLost),
    (fakenvml.UNKNOWN, pynvml.NVMLError_Unknown),
])
def test_injected_codes_raise_the_matching_pynvml_class(fleet: FakeNvml, code: int, exc: type) -> None:
    fleet.fail("nvmlDeviceGetPowerUsage", code, gpu=1)
    with pytest.raises(exc):
        pynvml.nvmlDeviceGetPowerUsage(handle(1))
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == fleet.gpus[0]["power_mw"]
    fleet.fail("nvmlDeviceGetCount_v2", code)
    with pytest.raises(exc):
        pynvml.nvmlDeviceGetCount()
    fleet.clear_fail()
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) == fleet.gpus[1]["power_mw"]


def test_check_order_injected_then_lost_then_unsupported(fleet: FakeNvml) -> None:
    fleet.fail("nvmlDeviceGetTemperature", fakenvml.UNKNOWN)               # every GPU
    fleet.fail("nvmlDeviceGetTemperature", fakenvml.NO_PERMISSION, gpu=2)  # this GPU wins
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetTemperature(handle(2), 0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(handle(3), 0)
    fleet.clear_fail("nvmlDeviceGetTemperature", gpu=3)  # only GPU 3's entries: none
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(handle(3), 0)
    fleet.clear_fail("nvmlDeviceGetTemperature")
    fleet.unsupported(4, "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetPowerUsage")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(handle(4))
    assert pynvml.nvmlDeviceGetEncoderUtilization(handle(3))[1] == 167_000
    h4 = handle(4)
    fleet.lose(4)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # lost beats unsupported
        pynvml.nvmlDeviceGetPowerUsage(h4)
    fleet.fail("nvmlDeviceGetPowerUsage", fakenvml.UNKNOWN, gpu=4)
    with pytest.raises(pynvml.NVMLError_Unknown):  # injected beats lost
        pynvml.nvmlDeviceGetPowerUsage(h4)


def test_lost_gpu_fails_every_call_until_restored(fleet: FakeNvml) -> None:
    h1 = handle(1)
    fleet.lose(1)
    for call in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetUUID,
                 pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetUtilizationRates):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        handle(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(fleet.gpus[1]["uuid"])
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) == fleet.gpus[0]["power_mw"]
    fleet.restore(1)
    assert pynvml.nvmlDeviceGetPowerUsage(h1) == fleet.gpus[1]["power_mw"]


def test_driver_not_loaded_then_recovery(fleet: FakeNvml) -> None:
    h = handle(0)
    fleet.fail("nvmlInitWithFlags", fakenvml.DRIVER_NOT_LOADED)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()  # while initialised: the driver is gone, so is the session
    for call in (pynvml.nvmlDeviceGetCount, lambda: pynvml.nvmlDeviceGetPowerUsage(h),
                 pynvml.nvmlSystemGetDriverVersion, pynvml.nvmlEventSetCreate):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()
    fleet.clear_fail("nvmlInitWithFlags")
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetPowerUsage(h) == fleet.gpus[0]["power_mw"]


def test_missing_config_is_driver_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL) -> None:
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(tmp_path / "absent.conf"))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    monkeypatch.delenv("FAKE_NVML_CONFIG")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_shutdown_is_reference_counted(fleet: FakeNvml) -> None:
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 8
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_error_strings_are_readable(lib: ctypes.CDLL) -> None:
    expected = {1: "Uninitialized", 3: "Not Supported", 9: "Driver Not Loaded", 13: "Function Not Found",
                15: "GPU is lost", 999: "Unknown Error"}
    for code, text in expected.items():
        assert pynvml.nvmlErrorString(code) == text


def test_omitted_symbol_raises_function_not_found(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=["nvmlDeviceGetPowerUsage"])
    assert fake.library != build_library()
    proc = run_python("""
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        try:
            pynvml.nvmlDeviceGetPowerUsage(h)
            print("no error")
        except pynvml.NVMLError_FunctionNotFound:
            print("FunctionNotFound")
        print(pynvml.nvmlDeviceGetTemperature(h, 0))
    """, fake.env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FunctionNotFound", str(fake.gpus[1]["temp_gpu"])]


def test_unknown_names_are_rejected_naming_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nvmlDeviceGetPowerUsag'"):
        build_library(["nvmlDeviceGetPowerUsag"])
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    with pytest.raises(ValueError, match="nvmlNoSuchThing"):
        fake.fail("nvmlNoSuchThing", 3)
    with pytest.raises(ValueError, match="power_watts"):
        fake.set(0, power_watts=3)
    with pytest.raises(ValueError, match="GPU 1"):
        fake.set(1, power_mw=3)


def test_build_is_cached_and_ignored_by_git() -> None:
    lib = build_library()
    mtime = lib.stat().st_mtime_ns
    assert build_library() == lib and lib.stat().st_mtime_ns == mtime
    assert lib.name == "libnvidia-ml.so.1" and lib.parent.name.startswith("fakenvml-")
    assert (fakenvml.BUILD_ROOT / ".gitignore").read_text() == "*\n"


# ---------------------------------------------------------------- subprocess, across processes


def test_subprocess_sees_changes_written_by_the_test(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    code = """
        import sys, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        for line in sys.stdin:
            print(pynvml.nvmlDeviceGetPowerUsage(h), flush=True)
    """
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **fake.env()},
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO) as child:
        assert child.stdin and child.stdout
        seen = []
        initial = fake.gpus[1]["power_mw"]
        for watts in (0, 123_456, 654_321):
            if watts:
                fake.set(1, power_mw=watts)
            child.stdin.write("\n")
            child.stdin.flush()
            seen.append(int(child.stdout.readline()))
        child.stdin.close()
    assert seen == [initial, 123_456, 654_321]


# ---------------------------------------------------------------- depth


def test_memory_v2_rejects_a_wrong_version(fleet: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle(0), version=0x01000028)
    bad = pynvml.nvmlPciInfoExt_v1_t(version=0x2000040)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetPciInfoExt(handle(0), ctypes.byref(bad))


def test_process_lists_follow_the_count_protocol(fleet: FakeNvml, lib: ctypes.CDLL) -> None:
    h = handle(2)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    fleet.set(2, procs=[(1111, 1 << 30), (2222, 2 << 30), (3333, None)], graphics_procs=[(4444, 5 << 20)])
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1111, 1 << 30), (2222, 2 << 30), (3333, None)]
    assert procs[0].gpuInstanceId == 0xFFFFFFFF
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [1111, 2222, 3333]
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3(h)] == [
        (4444, 5 << 20)]
    count = ctypes.c_uint(1)
    buf = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), buf)
    assert (rc, count.value) == (fakenvml.INSUFFICIENT_SIZE, 3)
    count = ctypes.c_uint(0)
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), None) == fakenvml.INSUFFICIENT_SIZE
    assert count.value == 3


def test_ecc_retired_pages_and_remapped_rows(fleet: FakeNvml) -> None:
    h = handle(1)
    fleet.set(1, ecc_corrected_volatile=5, ecc_corrected_aggregate=50, ecc_uncorrected_volatile=1,
              ecc_uncorrected_aggregate=2, retired_sbe=[(0x1000, 111), (0x2000, 222)], retired_dbe=[(0x3000, 333)],
              retired_pending=1, remap_corr=4, remap_unc=1, remap_pending=1, remap_failure=0)
    assert [pynvml.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)] == [5, 50, 1, 2]
    assert pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) == [
        0x1000, 0x2000]
    assert pynvml.nvmlDeviceGetRetiredPages_v2(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) == [
        {"address": 0x3000, "timestamp": 333}]
    assert pynvml.nvmlDeviceGetRetiredPages(handle(0), 0) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (4, 1, 1, 0)
    fleet.set(1, ecc_mode=0, ecc_pending=0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0)


def test_topology_p2p_and_nvlink(fleet: FakeNvml) -> None:
    h0, h1, h5 = handle(0), handle(1), handle(5)
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h1) == pynvml.NVML_TOPOLOGY_NODE
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h5) == pynvml.NVML_TOPOLOGY_SYSTEM
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h0) == pynvml.NVML_TOPOLOGY_INTERNAL
    fleet.set_topology(0, 5, pynvml.NVML_TOPOLOGY_SINGLE)
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h5, h0) == pynvml.NVML_TOPOLOGY_SINGLE
    assert pynvml.nvmlDeviceGetP2PStatus(h0, h5, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_OK
    fleet.set_p2p(0, 5, pynvml.NVML_P2P_STATUS_NOT_SUPPORTED, index=pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    assert pynvml.nvmlDeviceGetP2PStatus(h5, h0, 2) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetP2PStatus(h5, h0, 0) == pynvml.NVML_P2P_STATUS_OK
    fleet.lose(5)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetP2PStatus(h0, h5, 0)

    fleet.set(0, nvlink_active=[1] * 17 + [0], nvlink_err={(3, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 9})
    assert [pynvml.nvmlDeviceGetNvLinkState(h0, link) for link in (0, 17)] == [1, 0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h0, 18)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h0, 3, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) == 9
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h0, 4, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) == 0
    fleet.set(1, nvlinks=0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h1, 0)


def test_mig_devices(fleet: FakeNvml) -> None:
    h = handle(0)
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    uuid_a = fleet.add_mig(0, 0, "1g.10gb", gi=9, mem_total=10 << 30, mem_used=1 << 30)
    uuid_b = fleet.add_mig(0, 1, "3g.40gb", gi=2, mem_total=40 << 30, mem_used=3 << 30, mem_reserved=1 << 20)
    fleet.set(0, procs=[(100, 1 << 30, 9, 0), (200, 2 << 30, 2, 0), (300, 3 << 30)])
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    m0 = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 7)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(m0).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 0
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m0)) == 0
    assert (pynvml.nvmlDeviceGetGpuInstanceId(m0), pynvml.nvmlDeviceGetComputeInstanceId(m0)) == (9, 0)
    assert pynvml.nvmlDeviceGetName(m0) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert pynvml.nvmlDeviceGetUUID(m0) == uuid_a and uuid_a.startswith("MIG-")
    mem = pynvml.nvmlDeviceGetMemoryInfo(m0)
    assert (mem.total, mem.used, mem.free) == (10 << 30, 1 << 30, 9 << 30)
    m1 = pynvml.nvmlDeviceGetHandleByUUID(uuid_b)
    assert pynvml.nvmlDeviceGetName(m1).endswith("MIG 3g.40gb")
    mem2 = pynvml.nvmlDeviceGetMemoryInfo(m1, version=pynvml.nvmlMemory_v2)
    assert (mem2.total, mem2.reserved, mem2.used) == (40 << 30, 1 << 20, 3 << 30)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(m0)] == [100]
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [100, 200, 300]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(m0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
    fleet.set(0, mig_mode=0, mig_pending=0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a MIG handle outlives its instance
        pynvml.nvmlDeviceGetName(m0)


# ---------------------------------------------------------------- events


def test_xid_queued_while_a_thread_waits_arrives_exactly_once(fleet: FakeNvml) -> None:
    es = pynvml.nvmlEventSetCreate()
    for i in (0, 1):
        pynvml.nvmlDeviceRegisterEvents(handle(i), pynvml.nvmlEventTypeXidCriticalError, es)
    result: dict[str, Any] = {}
    started = threading.Event()

    def waiter() -> None:
        started.set()
        t0 = time.monotonic()
        try:
            result["data"] = pynvml.nvmlEventSetWait_v2(es, 10_000)
        except pynvml.NVMLError as exc:
            result["error"] = exc
        result["elapsed"] = time.monotonic() - t0

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(5)
    fleet.queue_xid(1, 79)
    thread.join(15)
    assert "error" not in result, result
    data = result["data"]
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert pynvml.nvmlDeviceGetIndex(data.device) == 1
    assert result["elapsed"] < 5  # delivered while waiting, long before the 10 s timeout

    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 30)
    fleet.set(0, power_mw=1)  # a re-parse must not re-deliver
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(es, 30)
    fleet.queue_xid(3, 48)  # GPU 3 is not registered in this set
    fleet.queue_xid(0, 31)
    data = pynvml.nvmlEventSetWait_v2(es, 1000)
    assert (pynvml.nvmlDeviceGetIndex(data.device), data.eventData) == (0, 31)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)
    fleet.lose(1)  # real NVML reports a fallen-off GPU from the wait
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(es, 1000)
    pynvml.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetFree(es)


def test_register_rejects_unsupported_event_types(fleet: FakeNvml) -> None:
    es = pynvml.nvmlEventSetCreate()
    fleet.set(2, supported_events=0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle(2), pynvml.nvmlEventTypeXidCriticalError, es)
    pynvml.nvmlEventSetFree(es)


# ---------------------------------------------------------------- helpers


def test_make_sysfs_writes_vendor_and_class(tmp_path: Path) -> None:
    base = make_sysfs(tmp_path, [("0000:18:00.0", 0x10DE, 0x030200), ("0000:03:00.0", 0x1A03, 0x030000)])
    assert base == tmp_path / "bus" / "pci" / "devices"
    assert (base / "0000:18:00.0" / "vendor").read_text() == "0x10de\n"
    assert (base / "0000:18:00.0" / "class").read_text() == "0x030200\n"
    assert (base / "0000:03:00.0" / "class").read_text() == "0x030000\n"
    assert sysfs_address("00000000:AB:00.0") == "0000:ab:00.0"


def test_fleet_file_is_plain_key_value_lines(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=2, fans=1)
    fake.fail("nvmlDeviceGetPowerUsage", 3, gpu=1)
    fake.queue_xid(0, 79)
    lines = fake.path.read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in lines if not line.startswith("#"))
    assert pairs["count"] == "2" and pairs["gpu.1.fans"] == "1"
    assert pairs["gpu.1.fail.nvmlDeviceGetPowerUsage"] == "3" and pairs["xid.1"] == "0:79"
    assert json.dumps(pairs)  # all plain strings
