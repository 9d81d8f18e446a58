"""AMD values that must be true on real boards: the real ``amdsmi`` package over the fake libamd_smi.

- every numeric reading fed amdsmi's "no value" sentinels (0xFFFF, 0xFFFFFFFF, UINT64_MAX, which the
  package turns into "N/A" for some fields) is absent and logged once, never published; the table
  below covers every numeric key of the fake's fleet, so a new reading needs a row;
- the ECC totals are the volatile counters (since the driver loaded), not lifetime ones;
- MI300-class boards have no edge sensor: ``sensor="gpu"`` is absent, junction and memory shown;
- the fan speed is published as the driver says, above 1 included;
- the maximum PCIe generation is the GPU's own (its link capability), not the link's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.backends.amdsmi import AmdSmiBackend
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import Collection, GpuReading
from tests.fakes.fakeamdsmi import FakeAmdSmi, two_gpu_fleet

U16, U32, U64 = 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
SENTINELS = (U16, U32, U64)
GAUGE, COUNT = "gauge", "count"  # COUNT: bytes or events, where 65535 is a true value

# fleet key -> (GpuReading attribute, dict key, reading name in the logs, kind, factor to SI)
READINGS: dict[str, tuple[str, Any, str, str, float]] = {
    "gfx_activity": ("utilization_ratio", None, "gpu_utilization_ratio", GAUGE, 0.01),
    "umc_activity": ("memory_utilization_ratio", None, "gpu_memory_utilization_ratio", GAUGE, 0.01),
    "vram_total": ("memory_total_bytes", None, "gpu_memory_total_bytes", COUNT, 1.0),
    "vram_used": ("memory_used_bytes", None, "gpu_memory_used_bytes", COUNT, 1.0),
    "temp.edge": ("temperature_celsius", "gpu", "gpu_temperature_celsius:gpu", GAUGE, 1.0),
    "temp.hotspot": ("temperature_celsius", "junction", "gpu_temperature_celsius:junction", GAUGE, 1.0),
    "temp.vram": ("temperature_celsius", "memory", "gpu_temperature_celsius:memory", GAUGE, 1.0),
    "current_socket_power": ("power_watts", None, "gpu_power_watts", GAUGE, 1.0),
    "power_cap_uw": ("power_limit_watts", None, "gpu_power_limit_watts", COUNT, 1e-6),
    "energy_accumulator": ("energy_joules", None, "gpu_energy_joules_total", COUNT, 15.25e-6),
    "clk.gfx": ("clock_hertz", "graphics", "gpu_clock_hertz:graphics", GAUGE, 1e6),
    "clk.mem": ("clock_hertz", "memory", "gpu_clock_hertz:memory", GAUGE, 1e6),
    "clk.soc": ("clock_hertz", "soc", "gpu_clock_hertz:soc", GAUGE, 1e6),
    "clk.vclk0": ("clock_hertz", "video", "gpu_clock_hertz:video", GAUGE, 1e6),
    "clk.gfx.max": ("clock_max_hertz", "graphics", "gpu_clock_max_hertz:graphics", GAUGE, 1e6),
    "clk.mem.max": ("clock_max_hertz", "memory", "gpu_clock_max_hertz:memory", GAUGE, 1e6),
    "clk.soc.max": ("clock_max_hertz", "soc", "gpu_clock_max_hertz:soc", GAUGE, 1e6),
    "clk.vclk0.max": ("clock_max_hertz", "video", "gpu_clock_max_hertz:video", GAUGE, 1e6),
    "pcie.width": ("pcie_link_width", None, "gpu_pcie_link_width", GAUGE, 1.0),
    "pcie.max_width": ("pcie_link_width_max", None, "gpu_pcie_link_width_max", GAUGE, 1.0),
    "pcie.speed": ("pcie_link_generation", None, "gpu_pcie_link_generation", GAUGE, 1.0),
    "pcie.replay": ("pcie_replay_total", None, "gpu_pcie_replays_total", COUNT, 1.0),
    "pci_replay_counter": ("pcie_replay_total", None, "gpu_pcie_replays_total", COUNT, 1.0),
    "ecc.correctable": ("ecc_errors", ("corrected", "volatile"), "gpu_ecc_errors_total:corrected", COUNT, 1.0),
    "ecc.uncorrectable": ("ecc_errors", ("uncorrected", "volatile"), "gpu_ecc_errors_total:uncorrected", COUNT,
                          1.0),
    "fan.speed": ("fan_speed_ratio", None, "gpu_fan_speed_ratio", GAUGE, 1.0),
    "fan.max": ("fan_speed_ratio", None, "gpu_fan_speed_ratio:max", GAUGE, 1.0),
}
# A source with a fallback: fed a sentinel, the reading keeps its true value from the other source.
FALLBACK = {
    "pcie.version": ("pcie_link_generation_max", 5.0),  # from max_pcie_speed (32000 MT/s)
    "pcie.max_speed": ("pcie_link_generation_max", 5.0),  # pcie_interface_version answers first
    "average_socket_power": ("power_watts", None),  # current_socket_power answers first (None: that GPU's)
}
NOT_READINGS = {
    "mm_activity": "video engine activity: no AMD family reads it",
    "temp.edge.critical": "a limit read once at start; only 0 (no edge sensor) matters: test_mi300_*",
    "energy_resolution_uj": "a float resolution, not an integer field with a sentinel",
    "partition_id": "identity (partitions), not a published number",
    "numa_node": "topology level input (node/system), not a published number",
    "link.1.hops": "topology pair key",
    "p2p.1": "topology pair key",
    "metrics.": "gpu_metrics bit masks and accumulators, read raw: test_throttle_status_sentinel_*",
    "ras.": "RAS block mask and states: an input of the health state, no family: test_amdsmi_ras.py",
}


@pytest.fixture
def fake(fake_rocm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAmdSmi:
    f = FakeAmdSmi(fake_rocm, tmp_path / "fleet.conf")
    monkeypatch.delenv("ROCM_HOME", raising=False)
    for k, v in f.env().items():
        monkeypatch.setenv(k, v)
    return f


@pytest.fixture
def backends() -> Iterator[list[AmdSmiBackend]]:
    started: list[AmdSmiBackend] = []
    yield started
    for b in started:
        b.shutdown()


def start(backends: list[AmdSmiBackend], fields: FieldFilter | None = None) -> AmdSmiBackend:
    b = AmdSmiBackend(BackendOptions(fields=fields or FieldFilter(exclude=["gpu_p2p_supported",
                                                                           "gpu_topology_level"])))
    b.init()
    backends.append(b)
    return b


def collect(b: AmdSmiBackend) -> list[GpuReading]:
    out = Collection("amdsmi")
    b.collect(out)
    return out.gpus


def value(r: GpuReading, attr: str, key: Any) -> Any:
    v = getattr(r, attr)
    return v.get(key) if key is not None else v


def one_gpu(**changes: object) -> dict[str, object]:
    g = {k: v for k, v in two_gpu_fleet()[0].items() if not k.startswith(("link.", "p2p."))}
    g.update(changes)
    return {k: v for k, v in g.items() if v is not None}


def numeric_keys() -> set[str]:
    return {k for g in two_gpu_fleet() for k, v in g.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def test_every_numeric_key_of_the_fake_has_a_row() -> None:
    covered = set(READINGS) | set(FALLBACK)
    missing = {k for k in numeric_keys() - covered if not any(k == n or (n.endswith(".") and k.startswith(n))
                                                              for n in NOT_READINGS)}
    assert missing == set(), f"add a row to READINGS, FALLBACK or NOT_READINGS for {sorted(missing)}"


@pytest.mark.parametrize("sentinel", SENTINELS, ids=hex)
def test_every_reading_fed_a_sentinel_is_absent_and_logged_once(
        sentinel: int, fake: FakeAmdSmi, backends: list[AmdSmiBackend], caplog: pytest.LogCaptureFixture) -> None:
    # GPU 0 is the control; GPU i + 1 carries the sentinel in the i-th key (and nothing else changed).
    keys = [*READINGS, *FALLBACK]
    fleet = [one_gpu()]
    for k in keys:
        fleet.append(one_gpu(**{k: sentinel}) if k in one_gpu() else one_gpu(**{k: sentinel, "pcie.replay": None}))
    fake.write(fleet, rocm_version="7.0.2")
    caplog.set_level(logging.INFO, logger="exporter.backends")
    b = start(backends)
    first, second = collect(b), collect(b)
    control = second[0]
    wrong = []
    for i, k in enumerate(keys, start=1):
        for r in (first[i], second[i]):
            assert r.up, (k, r.up_reason)
            if k in FALLBACK:
                attr, want = FALLBACK[k]
                want = value(control, attr, None) if want is None else want
                if value(r, attr, None) != want:
                    wrong.append(f"{k}={sentinel:#x}: {attr}={value(r, attr, None)!r}, want {want!r}")
                continue
            attr, key, reading, kind, factor = READINGS[k]
            assert value(control, attr, key) is not None, f"{attr}[{key}] missing on the control GPU"
            got = value(r, attr, key)
            if kind == COUNT and sentinel == U16:  # a true 65535 in a wider field
                if got != pytest.approx(U16 * factor):
                    wrong.append(f"{k}={sentinel:#x}: {attr}[{key}]={got!r}, want {U16 * factor}")
            elif got is not None:
                wrong.append(f"{k}={sentinel:#x}: {attr}[{key}]={got!r} published")
        if k in READINGS and not (READINGS[k][3] == COUNT and sentinel == U16):
            reading = READINGS[k][2]
            lines = [m for m in caplog.messages if f"GPU {i}: {reading} " in m]
            if len(lines) != 1:
                wrong.append(f"{k}={sentinel:#x}: {len(lines)} log lines for {reading} on GPU {i}: {lines}")
    assert wrong == []


def test_throttle_status_sentinel_is_no_reason(fake: FakeAmdSmi, backends: list[AmdSmiBackend]) -> None:
    # 0xFFFFFFFF in the 64-bit status: "not in this format", never 32 active throttle bits
    fake.write([one_gpu(**{"metrics.indep_throttle_status": U32})], rocm_version="7.0.2")
    g = collect(start(backends))[0]
    assert set(g.throttle_reasons.values()) <= {0.0}


def test_ecc_totals_are_the_volatile_counters(fake: FakeAmdSmi, backends: list[AmdSmiBackend]) -> None:
    # amdsmi_get_gpu_total_ecc_count sums the RAS blocks' sysfs err_count, kept by the driver since it
    # loaded: NVIDIA's "volatile". Only retired pages persist across reboots.
    fake.write([one_gpu(**{"ecc.correctable": 12, "ecc.uncorrectable": 3})], rocm_version="7.0.2")
    g = collect(start(backends))[0]
    assert g.ecc_errors == {("corrected", "volatile"): 12.0, ("uncorrected", "volatile"): 3.0}


def test_mi300_without_edge_sensor_shows_junction_and_memory(
        fake: FakeAmdSmi, backends: list[AmdSmiBackend], caplog: pytest.LogCaptureFixture) -> None:
    # MI300-class: the edge CRITICAL limit reads 0 (amd-smi prints N/A then) and so does the "current" edge
    fake.write([one_gpu(**{"temp.edge": 0, "temp.edge.critical": 0}), one_gpu()], rocm_version="7.0.2")
    caplog.set_level(logging.INFO, logger="exporter.backends")
    b = start(backends)
    mi300, other = collect(b)
    assert mi300.temperature_celsius == {"junction": 61.0, "memory": 52.0}
    assert other.temperature_celsius == {"gpu": 45.0, "junction": 61.0, "memory": 52.0}
    assert "gpu_temperature_celsius" not in mi300.unsupported  # absent by design, not a failure
    assert b.drain_errors() == {}
    assert sum("no edge temperature sensor" in m for m in caplog.messages) == 1
    collect(b)
    assert sum("no edge temperature sensor" in m for m in caplog.messages) == 1


def test_fan_speed_as_the_driver_says_above_one_included(fake: FakeAmdSmi, backends: list[AmdSmiBackend]) -> None:
    fake.write([one_gpu(**{"fan.speed": 280, "fan.max": 255}), one_gpu(**{"fan.speed": 51})], rocm_version="7.0.2")
    fast, slow = collect(start(backends))
    assert fast.fan_speed_ratio == 280 / 255 > 1.0  # no silent clamp to 1
    assert slow.fan_speed_ratio == 51 / 255


def test_pcie_generation_max_is_the_gpus_own(fake: FakeAmdSmi, backends: list[AmdSmiBackend]) -> None:
    # amdsmi derives the maximum from sysfs max_link_speed: the GPU's link capability, whatever the slot
    # trained at (NVIDIA's maximum is the lower of GPU and system). A Gen5 GPU in a Gen4 slot: 5, current 4.
    fake.write([one_gpu(**{"pcie.speed": 16000, "pcie.max_speed": 32000, "pcie.version": 5}),
                one_gpu(**{"pcie.speed": 16000, "pcie.max_speed": 32000, "pcie.version": 0})], rocm_version="7.0.2")
    a, b = collect(start(backends))
    assert (a.pcie_link_generation, a.pcie_link_generation_max) == (4.0, 5.0)
    assert (b.pcie_link_generation, b.pcie_link_generation_max) == (4.0, 5.0)  # version 0 (unknown): from the speed
