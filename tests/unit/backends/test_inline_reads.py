"""Issue 39: a healthy collection reads its GPUs on the thread that collects, with no thread hand-off.

Handing each collection's GPUs to a reader thread cost a third of the collection (two wake-ups, and the
work run on the other CPU: docs/benchmarks.md). Now each GPU is read inside its lane's job on the
collecting thread (exporter/backends/base.py ``on_gpus``), and the deadline is watched by whoever
waits for that thread (the engine: tests/unit/backends/test_hang.py). Through the real pynvml / amdsmi
over the fake C libraries and the real backends: every GPU's read runs on the collecting thread, and no
thread is started.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import FieldFilter
from exporter.core.readings import Collection
from exporter.core.snapshot import Snapshot
from tests.harness.poll import wait_until
from tests.harness.threads import of_lane
from tests.unit.backends.test_hang import Vendor, amdsmi, nvml  # noqa: F401 - the fixtures

COLLECTIONS = 50


@pytest.fixture(params=["nvml", "amdsmi"])
def fleet(request: pytest.FixtureRequest) -> Vendor:
    """8 GPUs of the fake NVML or amdsmi, through the real binding and backend (test_hang's fixtures)."""
    return request.getfixturevalue(request.param)


def started_since(before: set[int | None], v: Vendor) -> list[str]:
    """Threads started since ``before``, but the GPU lanes' own (``<backend>-gpu<i>``: the XID watcher's
    registrations are handed to them, on its thread, while the collections run)."""
    return sorted(t.name for t in threading.enumerate()
                  if t.ident not in before and not t.name.startswith(f"{v.name}-gpu"))


def record_reads(v: Vendor) -> list[tuple[int, int]]:
    """(thread, GPU) of every GPU read the backend starts from now on (its own per-GPU read, unchanged)."""
    b = v.backend
    name = "_read_one" if v.name == "nvml" else "_read_gpu"
    read = getattr(b, name)
    threads: list[tuple[int, int]] = []

    def recorded(dev: Any) -> object:
        threads.append((threading.get_ident(), dev.index))
        return read(dev)

    recorded.__name__ = read.__name__
    setattr(b, name, recorded)
    return threads


def test_a_collection_reads_every_gpu_on_the_calling_thread(fleet: Vendor) -> None:
    v = fleet
    b = v.backend
    b.collect(Collection(v.name))  # init, and the threads a backend starts once (the XID watcher)
    before = {t.ident for t in threading.enumerate()}
    reads = record_reads(v)
    for _ in range(COLLECTIONS):
        out = Collection(v.name)
        b.collect(out)
        assert len(out.gpus) == 8 and all(r.up for r in out.gpus)
    assert {t for t, _ in reads} == {threading.get_ident()} and len(reads) == 8 * COLLECTIONS
    assert started_since(before, v) == []


def test_the_engine_reads_the_gpus_on_its_collecting_thread(fleet: Vendor) -> None:
    """Under the engine, the collecting thread is the backend's lane's: the GPUs are read there (on a
    loaded machine a thread held for STAGGER_S is left and the collection goes on on another of the
    lane's threads, which takes the reads done over: never a GPU read twice)."""
    v = fleet
    engine = Engine([v.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=5.0,
                    cache_ttl=0.0, call_deadline=1.0)
    try:
        engine.scrape()
        before = {t.ident for t in threading.enumerate()}
        reads = record_reads(v)
        collecting: set[str] = set()
        for _ in range(10):
            snap = engine.scrape()
            assert snap.stats[v.name].success
            collecting |= {t.name for t in threading.enumerate() if t.ident in {r for r, _ in reads}}
        assert len(reads) == 80, "a GPU was read twice in one collection"
        lane = f"collect-{v.name}"  # the backend's collection lane: collect-nvml, collect-nvml-2 ...
        assert collecting and all(of_lane(name, lane) for name in collecting), collecting
        assert all(of_lane(name, lane) for name in started_since(before, v)), started_since(before, v)
    finally:
        engine.stop()


def patient_engine(v: Vendor) -> Engine:
    """An engine and backend whose deadlines (20 s) leave the test all the time it needs to release a held
    call (the backend's funnel waits by its own --call-deadline: the fixture's 1 s could pass on a loaded
    machine before the release, and GPU 3 would be published hung)."""
    v.backend.options = dataclasses.replace(v.backend.options, call_deadline=20.0)
    return Engine([v.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=30.0,
                  cache_ttl=0.0, call_deadline=20.0)


def scrape_held_by_gpu_3(engine: Engine, v: Vendor, reads: list[tuple[int, int]]) -> Snapshot:
    """A scrape during which GPU 3's power reading blocks until the collection started again beside it
    has read GPUs 4-7 (and waits for GPU 3's job): then the call returns, within the deadline."""
    v.hang(v.reading_call, 3)
    try:
        got: list[Snapshot] = []
        scrape = threading.Thread(target=lambda: got.append(engine.scrape()), daemon=True)
        scrape.start()
        wait_until(lambda: sorted(i for _, i in reads) == [0, 1, 2, 3, 4, 5, 6, 7], 15,
                   what="the collection started again to read GPUs 4-7")
        assert v.hanging() == 1
    finally:
        v.release(v.reading_call, 3)
    scrape.join(30)
    assert got, "the scrape did not return"
    return got[0]


def test_a_collection_started_again_takes_over_what_the_held_thread_read(fleet: Vendor) -> None:
    """GPU 3's power reading blocks: after STAGGER_S the engine leaves the collecting thread to GPU 3 and
    collects again on another thread. That attempt takes over GPUs 0-2 as read (no second read: a second
    GPM sample a few ms after the first would make a rate over nothing), reads GPUs 4-7, and waits for
    GPU 3's job; when the call returns within the deadline, GPU 3's own reading is published."""
    v = fleet
    engine = patient_engine(v)
    try:
        engine.scrape()
        reads = record_reads(v)
        snap = scrape_held_by_gpu_3(engine, v, reads)
        now = {r.index: r for c in snap.collections for r in c.gpus}
        assert snap.stats[v.name].success and sorted(now) == list(range(8))
        assert all(r.up for r in now.values()), {i: r.up_reason for i, r in now.items() if not r.up}
        assert now[3].power_watts is not None
        assert sorted(i for _, i in reads) == list(range(8)), "a GPU was read twice"
        first, second = {t for t, i in reads if i <= 3}, {t for t, i in reads if i >= 4}
        assert len(first) == 1 and len(second) == 1 and first != second
    finally:
        engine.stop()


@pytest.mark.parametrize("fleet", ["nvml"], indirect=True)  # the fake NVML can drop a GPU off the bus
def test_a_collection_started_again_counts_a_lost_gpu_once(fleet: Vendor) -> None:
    """GPU 1 fell off the bus and GPU 3's reading blocks: the forsaken attempt published GPU 1 as lost
    (counted), the attempt started again takes GPU 1's read over and publishes it too; the collection's
    error counter says one GPU lost, not two."""
    v = fleet
    engine = patient_engine(v)
    try:
        engine.scrape()
        v.fake.lose(1)
        lost_before = engine.scrape().stats["nvml"].errors_total.get("gpu_lost", 0)
        assert lost_before >= 1
        reads = record_reads(v)
        snap = scrape_held_by_gpu_3(engine, v, reads)
        assert len({t for t, _ in reads}) == 2  # it was started again
        now = {r.index: r for c in snap.collections for r in c.gpus}
        assert not now[1].up and now[3].up
        assert snap.stats["nvml"].errors_total.get("gpu_lost", 0) - lost_before == 1
    finally:
        v.fake.restore(1)
        engine.stop()
