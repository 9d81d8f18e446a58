"""AMD activity and link data from ``amdsmi_get_gpu_metrics_info``: the real ``amdsmi`` wrapper over
the fake ``libamd_smi.so`` (tests/fakes/fakeamdsmi.py), and rocm-smi's JSON for the same families."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from exporter.backends.amdsmi import AmdSmiBackend
from exporter.backends.rocm_smi import parse_rocm_smi_json
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import Collection, GpuReading
from tests.fakes.fakeamdsmi import FakeAmdSmi, rocm_smi_json, two_gpu_fleet

REPO = Path(__file__).resolve().parents[3]
ACTIVITY = ("gpu_graphics_engine_active_ratio", "gpu_dram_active_ratio", "gpu_encoder_utilization_ratio",
            "gpu_decoder_utilization_ratio", "gpu_link_transferred_bytes_total")


def collect(b: AmdSmiBackend) -> list[GpuReading]:
    out = Collection("amdsmi")
    b.collect(out)
    return out.gpus


def with_metrics(gpus: list[dict[str, object]] | None = None, gpu: int = 0,
                 **changes: Any) -> list[dict[str, object]]:
    """The two-GPU fleet with GPU ``gpu``'s gpu_metrics fields changed (None: the field left all ones)."""
    gpus = gpus or two_gpu_fleet()
    for key, value in changes.items():
        gpus[gpu].pop(f"metrics.{key}", None)
        if value is not None:
            gpus[gpu][f"metrics.{key}"] = value
    return gpus


def errors_after_warm_up(b: AmdSmiBackend) -> None:
    """Collect once and forget the errors of the fleet's other readings (a GPU without a VRAM sensor ...)."""
    collect(b)
    b.drain_errors()


def test_activity_and_link_data_exact_values(backend: AmdSmiBackend) -> None:
    errors_after_warm_up(backend)
    g0, g1 = collect(backend)
    assert g0.graphics_engine_active_ratio == {"": 0.85}
    assert g0.dram_active_ratio == {"": 0.40}
    # MI300 reports per-VCN activity only: the mean of the used slots (10 % and 30 %)
    assert g0.encoder_utilization_ratio == g0.decoder_utilization_ratio == 0.20
    # KB summed over the used links; read is what the GPU received
    assert g0.link_transferred_bytes == {("xgmi", "rx"): 3_000_000.0, ("xgmi", "tx"): 500_000.0}
    assert g1.graphics_engine_active_ratio == {"": 0.03} and g1.dram_active_ratio == {"": 0.01}
    assert g1.encoder_utilization_ratio == g1.decoder_utilization_ratio == 0.07  # average_mm_activity
    assert g1.link_transferred_bytes == {("xgmi", "rx"): 4000.0, ("xgmi", "tx"): 6000.0}
    for g in (g0, g1):
        assert not g.unsupported & set(ACTIVITY)
    assert backend.drain_errors() == {}


def test_pcie_bytes_from_the_mean_bandwidth_between_two_collections(backend: AmdSmiBackend,
                                                                    fake: FakeAmdSmi) -> None:
    g0, _ = collect(backend)
    assert ("pcie", "bidirectional") not in g0.link_transferred_bytes  # first sample: no interval yet
    # 500 firmware iterations summing 10,000 GB/s (a mean of 20 GB/s) over 0.5 s: 10 GB
    gpus = with_metrics(accumulation_counter=1500, pcie_bandwidth_acc=74_000, firmware_timestamp=150_000_000)
    fake.write(with_metrics(gpus, 1, accumulation_counter=1100, system_clock_counter=6_000_000_000))
    g0, g1 = collect(backend)
    assert g0.link_transferred_bytes[("pcie", "bidirectional")] == 10e9
    assert g1.link_transferred_bytes[("pcie", "bidirectional")] == 0.0  # nothing moved, from the kernel clock
    # the firmware restarted its counters: that interval is lost, the total is kept
    fake.write(with_metrics(accumulation_counter=10, pcie_bandwidth_acc=10, firmware_timestamp=160_000_000))
    assert collect(backend)[0].link_transferred_bytes[("pcie", "bidirectional")] == 10e9
    # then 100 iterations at a mean of 5 GB/s over 2 s add 10 GB
    fake.write(with_metrics(accumulation_counter=110, pcie_bandwidth_acc=510, firmware_timestamp=360_000_000))
    assert collect(backend)[0].link_transferred_bytes[("pcie", "bidirectional")] == 20e9
    assert "bad_value" not in backend.drain_errors()


def test_fields_left_all_ones_are_unsupported_once(fake: FakeAmdSmi, backend: AmdSmiBackend,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.backends")
    errors_after_warm_up(backend)
    # 0xFFFF written explicitly is the same "N/A" as a field the table does not carry
    fake.write(with_metrics(average_gfx_activity=0xFFFF, average_umc_activity=None, vcn_activity="-,-,-,-",
                            xgmi_read_data_acc="-,-", xgmi_write_data_acc=None, pcie_bandwidth_acc=None))
    for _ in range(3):
        g0, g1 = collect(backend)
        assert g0.graphics_engine_active_ratio == g0.dram_active_ratio == g0.link_transferred_bytes == {}
        assert g0.encoder_utilization_ratio is None and g0.decoder_utilization_ratio is None
        assert set(ACTIVITY) <= g0.unsupported
        assert g1.graphics_engine_active_ratio == {"": 0.03}  # the other GPU is unaffected
    assert backend.drain_errors() == {"unsupported": 6}  # once per reading, not per collection
    logged = [r.getMessage() for r in caplog.records if "gpu_dram_active_ratio not available" in r.getMessage()]
    assert len(logged) == 1 and "GPU 0" in logged[0] and "0xffff" in logged[0]


def test_activity_over_100_percent_is_a_bad_value_asked_again(fake: FakeAmdSmi,
                                                              backend: AmdSmiBackend) -> None:
    errors_after_warm_up(backend)
    fake.write(with_metrics(average_umc_activity=250))
    g0, _ = collect(backend)
    assert g0.dram_active_ratio == {} and "gpu_dram_active_ratio" not in g0.unsupported
    assert g0.graphics_engine_active_ratio == {"": 0.85}
    assert backend.drain_errors() == {"bad_value": 1}
    fake.write(with_metrics(average_umc_activity=100))
    assert collect(backend)[0].dram_active_ratio == {"": 1.0}


def test_no_gpu_metrics_table(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    gpus = two_gpu_fleet()
    gpus[0]["fail.get_gpu_metrics_info"] = 2  # AMDSMI_STATUS_NOT_SUPPORTED
    fake.write(gpus)
    g0, g1 = collect(backend)
    assert g0.up and g0.utilization_ratio == 0.87  # amdsmi_get_gpu_activity still answers
    assert g0.graphics_engine_active_ratio == {} and g0.link_transferred_bytes == {}
    assert g0.encoder_utilization_ratio is None
    assert set(ACTIVITY) | {"gpu_throttle_reason_active"} <= g0.unsupported
    assert g1.graphics_engine_active_ratio == {"": 0.03}


def test_selected_families_only(fake: FakeAmdSmi) -> None:
    b = AmdSmiBackend(BackendOptions(fields=FieldFilter(include=["gpu_dram_active_ratio", "gpu_decoder_*"])))
    b.init()
    try:
        g0, _ = collect(b)
    finally:
        b.shutdown()
    assert g0.dram_active_ratio == {"": 0.40} and g0.decoder_utilization_ratio == 0.20
    assert g0.graphics_engine_active_ratio == {} and g0.encoder_utilization_ratio is None
    assert g0.link_transferred_bytes == {} and g0.utilization_ratio is None


def test_rocm_smi_fills_what_its_json_carries() -> None:
    g0, g1 = parse_rocm_smi_json(rocm_smi_json(two_gpu_fleet()))
    assert g0.graphics_engine_active_ratio == {"": 0.87} and g0.dram_active_ratio == {"": 0.42}
    assert g1.graphics_engine_active_ratio == {"": 0.03}
    # no multimedia activity and no link data in rocm-smi's JSON
    assert g0.encoder_utilization_ratio is None and g0.link_transferred_bytes == {}
    fixtures = sorted((REPO / "tests" / "fixtures" / "rocm-smi").glob("*.json"))
    assert fixtures
    for path in fixtures:
        for g in parse_rocm_smi_json(path.read_text()):
            assert g.graphics_engine_active_ratio == {"": g.utilization_ratio} or g.utilization_ratio is None
            assert g.dram_active_ratio == {"": g.memory_utilization_ratio} or g.memory_utilization_ratio is None
