"""Issue 35: a backend can read GPUs side by side, each on its own lane (exporter/backends/base.py
``on_gpus``: a collection the engine started again beside a thread that one GPU holds reads the others
while that GPU's read goes on), so GPUs that start hanging in the same collection cost one call deadline
together. That is only safe when no C out value, GPM request or sample is shared between GPUs: two GPUs'
calls in flight at the same time would write into one buffer, and a GPU would publish another GPU's value.

Through the real stack (the real pynvml / amdsmi over the fake C libraries, the real backends and
engine), with the interpreter switching threads as often as it can: every GPU's every reading, in
every collection, is its own (the fake gives each GPU distinct values).
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.backends import create
from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import GpuReading
from tests.fakes.fakenvml import FakeNvml
from tests.unit.backends.test_hang import _amd_fleet

COLLECTIONS = 40
pytestmark = pytest.mark.slow  # 80 collections with a thread switch every microsecond: make test, not make check


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Threads switch every microsecond: a value read from a shared buffer after another GPU's call
    wrote it shows up within a few collections."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def values(r: GpuReading) -> dict[str, Any]:
    """Every reading of one GPU that the fake makes distinct per GPU or that a shared buffer could carry."""
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "unsupported"}


def read_many(engine: Engine, n: int) -> list[dict[int, GpuReading]]:
    out = []
    for _ in range(n):
        snap = engine.scrape()
        out.append({r.index: r for c in snap.collections for r in c.gpus})
    return out


def check_own(rounds: list[dict[int, GpuReading]], expect: dict[int, dict[str, Any]]) -> None:
    first = rounds[0]
    assert sorted(first) == list(range(8)) and all(r.up for r in first.values())
    for i, want in expect.items():  # the first collection is each GPU's own ...
        got = {k: getattr(first[i], k) for k in want}
        assert got == want, f"GPU {i}"
    for n, now in enumerate(rounds[1:], 2):  # ... and so is every later one
        for i in range(8):
            a, b = values(first[i]), values(now[i])
            changed = {k: (a[k], b.get(k)) for k in a if k not in VARYING and a[k] != b.get(k)}
            assert not changed, f"collection {n}: GPU {i} read another GPU's values: {changed}"


# what changes between two collections of an unchanged fake (rates over the interval, sample times)
VARYING = frozenset({"graphics_engine_active_ratio", "sm_active_ratio", "sm_occupancy_ratio", "pipe_active_ratio",
                     "dram_active_ratio", "pcie_throughput", "nvlink_throughput", "link_transferred_bytes",
                     "process_utilization_by_pid", "throttle_reasons"})


def test_nvml_gpus_read_at_once_never_mix_their_values(tmp_path: Path, busy_switching: None) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    fleet.activate()
    b = create("nvml", BackendOptions(call_deadline=5.0))
    engine = Engine([b], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=30.0,
                    cache_ttl=0.0, call_deadline=5.0)
    try:
        rounds = read_many(engine, COLLECTIONS)
        expect = {i: {"power_watts": pytest.approx((70_123 + 10_000 * i) / 1000),
                      "utilization_ratio": pytest.approx(((10 + 11 * i) % 101) / 100),
                      "memory_used_bytes": float((i + 1) << 30),
                      "energy_joules": pytest.approx((1_000_000_000 + 12_345_678 * i) / 1000),
                      "decoder_utilization_ratio": pytest.approx(i / 100),
                      "temperature_celsius": {"gpu": 30.0 + i, "memory": 35.0 + i}}
                  for i in range(8)}
        check_own(rounds, expect)
        # GPM's interval rates are each GPU's own too (fleet defaults: distinct per GPU, unchanged)
        for now in rounds[1:]:
            assert [now[i].pcie_throughput.get("tx") for i in range(8)] == [
                pytest.approx((100.0 * (i + 1) + 0.5) * 1048576.0) for i in range(8)]
    finally:
        engine.stop()


def test_amdsmi_gpus_read_at_once_never_mix_their_values(fake_rocm: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          busy_switching: None) -> None:
    from tests.fakes.fakeamdsmi import FakeAmdSmi

    fake = FakeAmdSmi(fake_rocm, tmp_path / "fleet.conf")
    fleet, top = _amd_fleet(8, {i: 10 + 9 * i for i in range(8)}, {})
    fake.write(fleet, **top)
    monkeypatch.delenv("ROCM_HOME", raising=False)
    for k, v in fake.env().items():
        monkeypatch.setenv(k, v)
    ctypes.CDLL(str(fake_rocm / "lib" / "libamd_smi.so"))
    b = create("amdsmi", BackendOptions(call_deadline=5.0))
    engine = Engine([b], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=30.0,
                    cache_ttl=0.0, call_deadline=5.0)
    try:
        rounds = read_many(engine, COLLECTIONS)
        check_own(rounds, {i: {"utilization_ratio": pytest.approx((10 + 9 * i) / 100),
                               "pci_bus_id": f"0000:{0x10 + i:02x}:00.0"} for i in range(8)})
    finally:
        engine.stop()
