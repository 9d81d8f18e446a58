"""GPM activity (exporter/backends/nvml_gpm.py) through the real pynvml over the fake libnvidia-ml.so.1.

Each GPU's activity comes from two GPM samples, one per collection, so the families appear on
the second scrape; the fake answers each metric with the value configured when the later sample
was taken (tests/fakes/fake_nvml/fake_nvml.c, "GPM").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import fakenvml
from tests.fakes.fakenvml import (
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_GRAPHICS_UTIL,
    GPM_NVLINK_TOTAL_RX_PER_SEC,
    GPM_NVLINK_TOTAL_TX_PER_SEC,
    GPM_PCIE_RX_PER_SEC,
    GPM_PCIE_TX_PER_SEC,
    GPM_SM_OCCUPANCY,
    GPM_SM_UTIL,
    UNKNOWN,
    FakeNvml,
)
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.prom import check_metrics

ACTIVITY = ("gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_graphics_engine_active_ratio",
            "gpu_pipe_active_ratio", "gpu_dram_active_ratio", "gpu_nvlink_throughput_bytes_per_second")
PIPES = {"tensor": 5, "tensor_hmma": 7, "tensor_imma": 9, "tensor_dfma": 6, "fp64": 11, "fp32": 12, "fp16": 13,
         "integer": 4}
MIB = 1048576


def start(fleet: FakeNvml, *args: str) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", *args], env=fleet.env())


pytestmark = pytest.mark.fleet(gpus=3)  # the `fleet` fixture (tests/conftest.py)


@pytest.fixture
def exporter(fleet: FakeNvml) -> Iterator[ExporterProcess]:
    with start(fleet, "--pcie-throughput") as ex:
        yield ex


def names_of(s: dict[tuple[str, frozenset], float], gpu: str) -> set[str]:
    return {n for n, ls in s if ("gpu", gpu) in ls}


def test_activity_from_the_second_scrape_in_si_units(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    first = exporter.scrape()
    assert not {n for n, _ in first} & {*ACTIVITY, "gpu_pcie_throughput_bytes_per_second"}, "a first sample has no rate"
    text = exporter.scrape_text()
    assert check_metrics(text) == []
    s = exporter.scrape()
    for i, g in enumerate(fleet.gpus):
        gpm, gpu = g["gpm"], str(i)
        assert sample(s, "gpu_sm_active_ratio", gpu=gpu, gpu_instance="") == pytest.approx(gpm[GPM_SM_UTIL] / 100)
        assert sample(s, "gpu_sm_occupancy_ratio", gpu=gpu) == pytest.approx(gpm[GPM_SM_OCCUPANCY] / 100)
        assert sample(s, "gpu_graphics_engine_active_ratio", gpu=gpu) == pytest.approx(gpm[GPM_GRAPHICS_UTIL] / 100)
        assert sample(s, "gpu_dram_active_ratio", gpu=gpu) == pytest.approx(gpm[GPM_DRAM_BW_UTIL] / 100)
        for pipe, mid in PIPES.items():
            assert sample(s, "gpu_pipe_active_ratio", gpu=gpu, pipe=pipe) == pytest.approx(gpm[mid] / 100), pipe
        # PCIe from GPM (MiB/s), not from the legacy call (KB/s), although --pcie-throughput is on
        assert sample(s, "gpu_pcie_throughput_bytes_per_second", gpu=gpu, direction="tx") == \
            gpm[GPM_PCIE_TX_PER_SEC] * MIB != g["pcie_tx_kbps"] * 1024
        assert sample(s, "gpu_pcie_throughput_bytes_per_second", gpu=gpu, direction="rx") == \
            gpm[GPM_PCIE_RX_PER_SEC] * MIB
        assert sample(s, "gpu_nvlink_throughput_bytes_per_second", gpu=gpu, direction="tx") == \
            gpm[GPM_NVLINK_TOTAL_TX_PER_SEC] * MIB
        assert sample(s, "gpu_nvlink_throughput_bytes_per_second", gpu=gpu, direction="rx") == \
            gpm[GPM_NVLINK_TOTAL_RX_PER_SEC] * MIB
    # the next interval carries the new value
    fleet.set_gpm(1, GPM_SM_UTIL, 93.5)
    assert sample(exporter.scrape(), "gpu_sm_active_ratio", gpu="1") == pytest.approx(0.935)


def test_a_metric_failing_on_its_own_is_absent_alone(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    fleet.fail_gpm(GPM_SM_OCCUPANCY, UNKNOWN, gpu=1)
    fleet.set_gpm(2, GPM_ANY_TENSOR_UTIL, None)  # not supported on this GPU
    exporter.scrape()
    s = exporter.scrape()
    assert sample(s, "gpu_sm_occupancy_ratio", gpu="1") is None
    assert sample(s, "gpu_sm_occupancy_ratio", gpu="0") is not None
    assert sample(s, "gpu_sm_active_ratio", gpu="1") is not None
    assert sample(s, "gpu_pipe_active_ratio", gpu="2", pipe="tensor") is None
    assert sample(s, "gpu_pipe_active_ratio", gpu="2", pipe="fp32") is not None
    assert sample(s, "gpu_up", gpu="1") == 1.0


def test_gpu_without_gpm_uses_the_legacy_pcie_call_and_logs_once(fleet: FakeNvml) -> None:
    fleet.set(2, gpm_supported=0)
    with start(fleet, "--pcie-throughput") as ex:
        for _ in range(3):
            s = ex.scrape()
        assert not names_of(s, "2") & set(ACTIVITY)
        assert names_of(s, "1") >= set(ACTIVITY)
        assert sample(s, "gpu_pcie_throughput_bytes_per_second", gpu="2", direction="tx") == \
            fleet.gpus[2]["pcie_tx_kbps"] * 1024
        assert sample(s, "gpu_field_unsupported", gpu="2", field="gpu_sm_active_ratio") == 1.0
        assert ex.log().count("does not support GPM") == 1


def test_driver_without_gpm_logs_one_line(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=[f for f in fakenvml.symbols() if f.startswith("nvmlGpm")])
    with start(fake) as ex:
        for _ in range(3):
            s = ex.scrape()
        assert not {n for n, _ in s} & {*ACTIVITY, "gpu_pcie_throughput_bytes_per_second"}
        assert sample(s, "gpu_up", gpu="1") == 1.0
        assert sum("nvmlGpmQueryDeviceSupport" in line for line in ex.log().splitlines()) == 1


def test_mig_instances_are_labelled(fleet: FakeNvml) -> None:
    fleet.add_mig(0, 0, "3g.40gb", gi=1)
    fleet.add_mig(0, 1, "3g.40gb", gi=2, gpm={GPM_SM_UTIL: 12.0})
    with start(fleet) as ex:
        ex.scrape()
        s = ex.scrape()
    mig = fleet.gpus[0]["mig"]
    gi1 = mig[0]["gpm"][GPM_SM_UTIL] / 100
    assert sample(s, "gpu_sm_active_ratio", gpu="0", gpu_instance="1") == pytest.approx(gi1)
    assert sample(s, "gpu_sm_active_ratio", gpu="0", gpu_instance="2") == pytest.approx(0.12)
    assert sample(s, "gpu_sm_active_ratio", gpu="0", gpu_instance="") is None  # per instance only
    assert sample(s, "gpu_dram_active_ratio", gpu="0", gpu_instance="2") is None  # not reported for it
    assert sample(s, "gpu_sm_active_ratio", gpu="1", gpu_instance="") is not None


def test_a_gpu_back_from_an_outage_starts_without_a_rate(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    exporter.scrape()
    assert sample(exporter.scrape(), "gpu_sm_active_ratio", gpu="1") is not None
    fleet.lose(1)
    s = exporter.scrape()
    assert sample(s, "gpu_up", gpu="1") == 0.0 and sample(s, "gpu_sm_active_ratio", gpu="1") is None
    fleet.restore(1)
    s = exporter.scrape()
    assert sample(s, "gpu_up", gpu="1") == 1.0
    assert sample(s, "gpu_sm_active_ratio", gpu="1") is None, "no rate across the outage"
    assert sample(s, "gpu_sm_active_ratio", gpu="0") is not None
    assert sample(exporter.scrape(), "gpu_sm_active_ratio", gpu="1") is not None
