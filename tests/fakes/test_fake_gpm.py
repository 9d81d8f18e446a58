"""Self-tests of the fake NVML's GPM functions (``nvmlGpm*``), driven through the real pynvml.

The structures are pynvml's own (``c_nvmlGpmMetricsGet_t`` with its version field and per-metric
``nvmlReturn``, ``c_nvmlGpmSupport_t``, opaque sample handles), so a layout mismatch between the
fake and nvidia-ml-py shows up here as wrong values.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.fakes import fakenvml
from tests.fakes.fakenvml import FakeNvml, build_library, load_in_process
from tests.fakes.test_fake_nvml import run_python

GPM_FUNCTIONS = ("nvmlGpmMetricsGet", "nvmlGpmMigSampleGet", "nvmlGpmQueryDeviceSupport",
                 "nvmlGpmQueryIfStreamingEnabled", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
                 "nvmlGpmSetStreamingEnabled")
SYMBOLS = Path(__file__).resolve().parent / "nvml_symbols"


@pytest.fixture
def lib() -> ctypes.CDLL:
    cdll = load_in_process(build_library())
    cdll.fakeNvmlGpmLiveSamples.restype = ctypes.c_ulong
    return cdll


pytestmark = pytest.mark.fleet(gpus=4)


@pytest.fixture
def fleet(fleet: FakeNvml, monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL) -> Iterator[FakeNvml]:
    """The suite's fleet (tests/conftest.py; four GPUs), initialised in this process."""
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fleet.path))
    live = lib.fakeNvmlGpmLiveSamples()
    pynvml.nvmlInit()
    yield fleet
    pynvml.nvmlShutdown()
    assert lib.fakeNvmlGpmLiveSamples() == live, "a test leaked GPM samples"


def metrics_get(s1: Any, s2: Any, ids: Sequence[int], version: int = pynvml.NVML_GPM_METRICS_GET_VERSION) -> Any:
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = version
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, m in enumerate(ids):
        mg.metrics[i].metricId = m
    return pynvml.nvmlGpmMetricsGet(mg)


def results(mg: Any) -> dict[int, tuple[int, float]]:
    return {mg.metrics[i].metricId: (mg.metrics[i].nvmlReturn, mg.metrics[i].value) for i in range(mg.numMetrics)}


class Samples:
    """Allocated sample handles, freed at exit."""

    def __init__(self, n: int) -> None:
        self.handles = [pynvml.nvmlGpmSampleAlloc() for _ in range(n)]

    def __enter__(self) -> list[Any]:
        return self.handles

    def __exit__(self, *exc: object) -> None:
        for s in self.handles:
            pynvml.nvmlGpmSampleFree(s)


def test_values_units_and_names_come_back_exactly(fleet: FakeNvml) -> None:
    ids = fakenvml.GPM_DEFAULT_METRICS
    for i, g in enumerate(fleet.gpus):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        support = pynvml.nvmlGpmQueryDeviceSupport(h)
        assert (support.version, support.isSupportedDevice) == (1, 1)
        with Samples(2) as (s1, s2):
            pynvml.nvmlGpmSampleGet(h, s1)
            pynvml.nvmlGpmSampleGet(h, s2)
            mg = metrics_get(s1, s2, ids)
        assert results(mg) == {m: (pynvml.NVML_SUCCESS, g["gpm"][m]) for m in ids}
        assert len(set(g["gpm"].values())) > 10, "default values should tell metrics apart"
    info = {mg.metrics[i].metricId: mg.metrics[i].metricInfo for i in range(mg.numMetrics)}
    assert (info[pynvml.NVML_GPM_METRIC_SM_UTIL].shortName, info[pynvml.NVML_GPM_METRIC_SM_UTIL].unit) == \
        (b"SM_UTIL", b"%")
    assert info[pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC].unit == b"MiB/sec"
    assert fleet.gpus[0]["gpm"][pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC] != fleet.gpus[1]["gpm"][21]


def test_the_value_is_the_one_configured_when_the_later_sample_was_taken(fleet: FakeNvml) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    sm = pynvml.NVML_GPM_METRIC_SM_UTIL
    with Samples(3) as (s1, s2, s3):
        pynvml.nvmlGpmSampleGet(h, s1)
        fleet.set_gpm(2, sm, 12.5)
        pynvml.nvmlGpmSampleGet(h, s2)
        fleet.set_gpm(2, sm, 87.25)  # after both samples: not in their interval
        assert results(metrics_get(s1, s2, [sm]))[sm] == (0, 12.5)
        pynvml.nvmlGpmSampleGet(h, s3)
        assert results(metrics_get(s2, s3, [sm]))[sm] == (0, 87.25)
        # a sample is reusable: refilling s1 makes it the later one
        pynvml.nvmlGpmSampleGet(h, s1)
        assert results(metrics_get(s3, s1, [sm]))[sm] == (0, 87.25)


def test_two_samples_are_needed_in_order_and_of_one_gpu(fleet: FakeNvml) -> None:
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    sm = [pynvml.NVML_GPM_METRIC_SM_UTIL]
    with Samples(3) as (s1, s2, other):
        pynvml.nvmlGpmSampleGet(h0, s1)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the first sample alone: no metrics
            metrics_get(s1, s2, sm)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            metrics_get(s1, s1, sm)
        pynvml.nvmlGpmSampleGet(h0, s2)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # reversed
            metrics_get(s2, s1, sm)
        pynvml.nvmlGpmSampleGet(h1, other)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # two GPUs
            metrics_get(s1, other, sm)
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            metrics_get(s1, s2, sm, version=2)
        assert results(metrics_get(s1, s2, sm))[sm[0]][0] == pynvml.NVML_SUCCESS


def test_a_metric_fails_on_its_own(fleet: FakeNvml) -> None:
    sm, occ, dram = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
                     pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    fleet.fail_gpm(occ, fleet.UNKNOWN, gpu=1)
    fleet.set_gpm(1, dram, None)
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    with Samples(2) as (s1, s2):
        pynvml.nvmlGpmSampleGet(h, s1)
        pynvml.nvmlGpmSampleGet(h, s2)
        got = results(metrics_get(s1, s2, [sm, occ, dram, pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL, 0]))
    assert got[sm] == (0, fleet.gpus[1]["gpm"][sm])
    assert got[occ][0] == fleet.UNKNOWN
    assert got[dram][0] == fleet.NOT_SUPPORTED
    assert got[pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL][0] == fleet.NOT_SUPPORTED
    assert got[0][0] == fleet.INVALID_ARGUMENT
    fleet.clear_fail()
    with Samples(2) as (s1, s2):
        pynvml.nvmlGpmSampleGet(h, s1)
        pynvml.nvmlGpmSampleGet(h, s2)
        assert results(metrics_get(s1, s2, [occ]))[occ][0] == pynvml.NVML_SUCCESS


def test_a_device_without_support(fleet: FakeNvml) -> None:
    fleet.set(3, gpm_supported=0)
    h = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    with Samples(1) as (s,), pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, s)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmQueryIfStreamingEnabled(h)
    # a wrong struct version is refused before anything else
    fn = pynvml._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    bad = pynvml.c_nvmlGpmSupport_t(version=2)
    assert fn(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(bad)) == fleet.ARGUMENT_VERSION_MISMATCH


def test_mig_instances_have_their_own_samples(fleet: FakeNvml) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with Samples(1) as (s,), pytest.raises(pynvml.NVMLError_NotSupported):  # MIG mode off
        pynvml.nvmlGpmMigSampleGet(h, 1, s)
    fleet.add_mig(0, 0, "3g.40gb", gi=1)
    fleet.add_mig(0, 1, "3g.40gb", gi=2, gpm={pynvml.NVML_GPM_METRIC_SM_UTIL: 33.0})
    sm, pcie = pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    fleet.fail_gpm(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, fleet.NO_PERMISSION, gpu=0)
    with Samples(5) as (a1, a2, b1, b2, whole):
        for s in (a1, b1, a2, b2):
            pynvml.nvmlGpmMigSampleGet(h, 1 if s in (a1, a2) else 2, s)
        a = results(metrics_get(a1, a2, [sm, pcie, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY]))
        b = results(metrics_get(b1, b2, [sm, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL]))
        assert a[sm] == (0, fleet.gpus[0]["mig"][0]["gpm"][sm])
        assert a[pcie][0] == fleet.NOT_SUPPORTED  # device-wide metric
        assert a[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY][0] == fleet.NO_PERMISSION  # the GPU's per-metric codes apply
        assert b == {sm: (0, 33.0), pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (fleet.NOT_SUPPORTED, 0.0)}
        assert a[sm][1] != b[sm][1]
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # two instances
            metrics_get(a1, b2, [sm])
        pynvml.nvmlGpmSampleGet(h, whole)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # instance vs whole GPU
            metrics_get(a1, whole, [sm])
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlGpmMigSampleGet(h, 7, a1)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # GPM takes the parent handle
            pynvml.nvmlGpmSampleGet(mig, a1)


def test_lost_gpu_and_injected_codes(fleet: FakeNvml) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    with Samples(2) as (s1, s2):
        pynvml.nvmlGpmSampleGet(h, s1)
        pynvml.nvmlGpmSampleGet(h, s2)
        fleet.lose(1)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlGpmSampleGet(h, s1)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            metrics_get(s1, s2, [pynvml.NVML_GPM_METRIC_SM_UTIL])
        fleet.restore(1)
        fleet.fail("nvmlGpmMetricsGet", fleet.UNKNOWN, gpu=1)
        with pytest.raises(pynvml.NVMLError_Unknown):
            metrics_get(s1, s2, [pynvml.NVML_GPM_METRIC_SM_UTIL])
        fleet.unsupported(1, "nvmlGpmSampleGet")
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmSampleGet(h, s1)


def test_sample_handles_are_checked_and_counted(fleet: FakeNvml, lib: ctypes.CDLL) -> None:
    before = lib.fakeNvmlGpmLiveSamples()
    s = pynvml.nvmlGpmSampleAlloc()
    assert lib.fakeNvmlGpmLiveSamples() == before + 1
    pynvml.nvmlGpmSampleFree(s)
    assert lib.fakeNvmlGpmLiveSamples() == before
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # double free
        pynvml.nvmlGpmSampleFree(s)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed handle
        pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), s)
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlGpmQueryIfStreamingEnabled(h) == 0
    pynvml.nvmlGpmSetStreamingEnabled(h, 1)
    assert pynvml.nvmlGpmQueryIfStreamingEnabled(h) == 1
    pynvml.nvmlGpmSetStreamingEnabled(h, 0)


def test_drivers_before_r520_have_no_gpm(tmp_path: Path) -> None:
    r470 = {ln for ln in (SYMBOLS / "R470.txt").read_text().split() if not ln.startswith("#")}
    r525 = {ln for ln in (SYMBOLS / "R525.txt").read_text().split() if not ln.startswith("#")}
    assert not r470 & set(GPM_FUNCTIONS)
    assert set(GPM_FUNCTIONS) - {"nvmlGpmQueryIfStreamingEnabled", "nvmlGpmSetStreamingEnabled"} <= r525
    assert set(GPM_FUNCTIONS) <= set(fakenvml.symbols())
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=1, omit=[f for f in fakenvml.symbols() if f not in r470])
    proc = run_python("""
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for call in (lambda: pynvml.nvmlGpmQueryDeviceSupport(h), pynvml.nvmlGpmSampleAlloc):
            try:
                call()
                print("present")
            except pynvml.NVMLError_FunctionNotFound:
                print("FunctionNotFound")
    """, fake.env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FunctionNotFound", "FunctionNotFound"]


def test_gpm_keys_in_the_fleet_file(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    fake.add_mig(0, 3, gi=5, gpm={2: 41.5})
    fake.fail_gpm(3, 999)
    lines = fake.path.read_text().splitlines()
    assert "gpu.0.gpm_supported=1" in lines
    assert f"gpu.0.gpm.2={fake.gpus[0]['gpm'][2]!r}" in lines
    assert "gpu.0.gpm_fail.3=999" in lines
    assert "gpu.0.mig.3.gpm.2=41.5" in lines
    with pytest.raises(ValueError, match="GPM metric id 477"):
        fake.set_gpm(0, 477, 1.0)
    with pytest.raises(ValueError, match="MIG slot 4"):
        fake.set_gpm(0, 2, 1.0, mig_slot=4)
