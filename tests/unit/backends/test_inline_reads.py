"""Issue 39: a healthy collection reads its GPUs on the thread that collects, with no thread hand-off.

Handing each collection's GPUs to a reader thread cost a third of the collection (two wake-ups, and the
work run on the other CPU: docs/benchmarks.md). Now each GPU is read inside its lane's job on the
collecting thread (exporter/backends/base.py ``on_gpus``), and the deadline is watched by whoever
waits for that thread (the engine: tests/unit/backends/test_hang.py). Through the real pynvml / amdsmi
over the fake C libraries and the real backends: every GPU's read runs on the collecting thread, the
collecting thread never sleeps for it, and no thread is started.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import FieldFilter
from exporter.core.readings import Collection
from tests.unit.backends.test_hang import Vendor, amdsmi, nvml  # noqa: F401 - the fixtures

COLLECTIONS = 50


@pytest.fixture(params=["nvml", "amdsmi"])
def fleet(request: pytest.FixtureRequest) -> Vendor:
    """8 GPUs of the fake NVML or amdsmi, through the real binding and backend (test_hang's fixtures)."""
    return request.getfixturevalue(request.param)


def voluntary_switches() -> int:
    """How often the calling thread has slept (waited on a lock, a condition, I/O) so far."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


def record_reads(v: Vendor) -> list[int]:
    """The thread of every GPU read the backend makes from now on (its own per-GPU read, unchanged)."""
    b = v.backend
    name = "_read_one" if v.name == "nvml" else "_read_gpu"
    read = getattr(b, name)
    threads: list[int] = []

    def recorded(dev: object) -> object:
        threads.append(threading.get_ident())
        return read(dev)

    recorded.__name__ = read.__name__
    setattr(b, name, recorded)
    return threads


def test_a_collection_reads_every_gpu_on_the_calling_thread(fleet: Vendor) -> None:
    v = fleet
    b = v.backend
    b.collect(Collection(v.name))  # init, and the threads a backend starts once (the XID watcher)
    threads_before = threading.active_count()
    reads = record_reads(v)
    slept = voluntary_switches()
    for _ in range(COLLECTIONS):
        out = Collection(v.name)
        b.collect(out)
        assert len(out.gpus) == 8 and all(r.up for r in out.gpus)
    slept = voluntary_switches() - slept
    assert set(reads) == {threading.get_ident()} and len(reads) == 8 * COLLECTIONS
    # a hand-off would sleep at least once per collection; the odd GIL wait of another thread may not
    assert slept < COLLECTIONS // 5, f"the collecting thread slept {slept} times in {COLLECTIONS} collections"
    assert threading.active_count() == threads_before


def test_the_engine_reads_the_gpus_on_its_collecting_thread(fleet: Vendor) -> None:
    """Under the engine, the collecting thread is the backend's lane's: the GPUs are read there."""
    v = fleet
    engine = Engine([v.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=5.0,
                    cache_ttl=0.0, call_deadline=1.0)
    try:
        engine.scrape()
        threads_before = threading.active_count()
        reads = record_reads(v)
        collecting: set[str] = set()
        for _ in range(10):
            snap = engine.scrape()
            assert snap.stats[v.name].success
            collecting |= {t.name for t in threading.enumerate() if t.ident in set(reads)}
        assert len(reads) == 80 and len(set(reads)) == 1, "the GPUs were read on more than one thread"
        assert collecting == {f"collect-{v.name}"}
        assert threading.active_count() == threads_before
    finally:
        engine.stop()
