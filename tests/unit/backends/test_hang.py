"""Issue 35: a failing GPU costs only itself. A vendor call that never returns, made to hang in the fake
libraries (NVML and amdsmi), on 1 GPU of 8 and on 2 of 8, for each kind of call: a per-GPU reading, a
processes call, a call about no GPU (the device count, init).

Through the real stack: the real pynvml / amdsmi bindings over the fake C libraries (in this process,
so their counters are readable), the real backends and the real engine. What must hold, per hang:

- the hung GPUs are ``gpu_up 0`` with the hung call named, and none of their readings is published;
- the other GPUs keep fresh readings: a change made during the hang shows at the next collection;
- no further call reaches a hung GPU while its call is outstanding (the library's own call counter for
  that GPU stops), and the thread count stays flat: one outstanding call and one thread per GPU;
- once the call returns, the first collection reads the GPU again;
- a call about no GPU that hangs makes the backend ``stalled``: readiness says so, naming the call.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.backends import create
from exporter.backends.base import Backend
from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import GpuReading
from exporter.core.snapshot import Snapshot
from tests.fakes.fakeamdsmi import FakeAmdSmi, two_gpu_fleet
from tests.fakes.fakenvml import HANG, UNINITIALIZED, UNKNOWN, FakeNvml
from tests.harness.poll import wait_until
from tests.harness.threads import lane_threads

DEADLINE = 1.0  # seconds: --call-deadline for these tests (the default; a loaded 2-core machine can stall a
# thread for a few hundred ms, which must not pass for a hang)
TIMEOUT = 5.0  # --collection-timeout


def gpus(snap: Snapshot) -> dict[int, GpuReading]:
    return {r.index: r for c in snap.collections for r in c.gpus}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


# --- the two vendors, behind one small interface --------------------------------------------------


@dataclass
class Vendor:
    name: str
    backend: Backend
    hang: Callable[[str, int | None], None]  # (call, gpu or None) -> blocks until release
    release: Callable[[str, int | None], None]
    set_util: Callable[[int, int], None]  # (gpu, percent)
    hanging: Callable[[], int]  # calls blocked in the library now
    device_calls: Callable[[int], int]  # calls the library received for a GPU
    reading_call: str  # the power reading's function
    processes_call: str
    node_call: str  # a call about no GPU made at every collection ("" when the backend makes none)
    fake: Any = None  # the fake library's own handle (FakeNvml), for what the interface above lacks


@pytest.fixture
def nvml(tmp_path: Path) -> Iterator[Vendor]:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    fleet.activate()
    b = create("nvml", BackendOptions(call_deadline=DEADLINE))

    def set_util(gpu: int, pct: int) -> None:
        fleet.set(gpu, util_gpu=pct)

    yield Vendor("nvml", b, fleet.hang, fleet.release, set_util, fleet.hanging, fleet.device_calls,
                 "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetCount_v2",
                 fleet)
    fleet.clear_fail()  # whatever a failed test left hanging returns
    b.shutdown()


def _amd_fleet(n: int, util: dict[int, int], hangs: dict[tuple[str, int | None], int]) -> tuple[list, dict]:
    base = {k: v for k, v in two_gpu_fleet()[0].items() if not k.startswith(("link.", "p2p."))}
    out = []
    for i in range(n):
        g = dict(base)
        g.update({"uuid": f"9dff74a1-0000-1000-8020-5b1f1f2b6a{i:02x}", "asic_serial": f"0x9D205B1F1F2B6A{i:02X}",
                  "bdf": f"0000:{0x10 + i:02x}:00.0", "gfx_activity": util.get(i, 10 + i)})
        out.append(g)
    top: dict[str, object] = {"rocm_version": "6.2.1"}
    for (call, gpu), code in hangs.items():
        if gpu is None:
            top["init_status" if call == "init" else f"fail.{call}"] = code
        else:
            out[gpu][f"fail.{call}"] = code
    return out, top


@pytest.fixture
def amdsmi(fake_rocm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Vendor]:
    fake = FakeAmdSmi(fake_rocm, tmp_path / "fleet.conf")
    util: dict[int, int] = {}
    hangs: dict[tuple[str, int | None], int] = {}

    def write() -> None:
        fleet, top = _amd_fleet(8, util, hangs)
        fake.write(fleet, **top)

    write()
    monkeypatch.delenv("ROCM_HOME", raising=False)
    for k, v in fake.env().items():
        monkeypatch.setenv(k, v)
    lib = ctypes.CDLL(str(fake_rocm / "lib" / "libamd_smi.so"))
    lib.fakeAmdsmiHanging.restype = ctypes.c_int
    lib.fakeAmdsmiDeviceCalls.restype = ctypes.c_ulong
    lib.fakeAmdsmiDeviceCalls.argtypes = [ctypes.c_int]
    b = create("amdsmi", BackendOptions(call_deadline=DEADLINE))

    def hang(call: str, gpu: int | None) -> None:
        hangs[(call, gpu)] = HANG
        write()

    def release(call: str, gpu: int | None) -> None:
        hangs.pop((call, gpu), None)
        write()

    def set_util(gpu: int, pct: int) -> None:
        util[gpu] = pct
        write()

    yield Vendor("amdsmi", b, hang, release, set_util, lambda: int(lib.fakeAmdsmiHanging()),
                 lambda i: int(lib.fakeAmdsmiDeviceCalls(i)), "get_power_info", "get_gpu_process_list", "")
    hangs.clear()
    write()
    b.shutdown()


@pytest.fixture(params=["nvml", "amdsmi"])
def vendor(request: pytest.FixtureRequest) -> Vendor:
    return request.getfixturevalue(request.param)


def engine_for(v: Vendor) -> Engine:
    return Engine([v.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=TIMEOUT,
                  cache_ttl=0.0, call_deadline=DEADLINE)


def wait_returned(v: Vendor, hung: list[int]) -> None:
    """Until the released calls are back in the library and their lanes idle (the GPU's job unwound)."""
    lanes = v.backend._lanes  # the GPUs' lanes (exporter/core/lane.py)
    wait_until(lambda: v.hanging() == 0 and all(lanes[i].busy() is None for i in hung), 30,
               what="the hung calls to return")


# --- a per-GPU call hangs ------------------------------------------------------------------------


@pytest.mark.parametrize("hung", [[3], [2, 5]], ids=["1-of-8", "2-of-8"])
@pytest.mark.parametrize("kind", ["reading", "processes"])
def test_a_hung_call_costs_its_gpu_only(vendor: Vendor, kind: str, hung: list[int]) -> None:
    v = vendor
    engine = engine_for(v)
    try:
        first = gpus(engine.scrape())
        assert sorted(first) == list(range(8)) and all(r.up for r in first.values())
        call = v.reading_call if kind == "reading" else v.processes_call
        for i in hung:
            v.hang(call, i)
        healthy = [i for i in range(8) if i not in hung]
        threads = None
        calls_while_hung: list[dict[int, int]] = []
        for round_ in range(4):
            for i in healthy:  # a change made during the hang ...
                v.set_util(i, 50 + round_ * 10 + i)
            t0 = time.monotonic()
            snap = engine.scrape()
            took = time.monotonic() - t0
            now = gpus(snap)
            # ... shows at the very next collection, on every healthy GPU
            assert {i: now[i].utilization_ratio for i in healthy} == {
                i: pytest.approx((50 + round_ * 10 + i) / 100) for i in healthy}
            assert snap.stats[v.name].success, "one hung GPU failed the whole collection"
            assert took < TIMEOUT, "the scrape waited for the collection timeout"
            for i in hung:
                r = now[i]
                assert not r.up and r.up_reason is not None and "hung" in r.up_reason
                named = call if v.name == "nvml" else f"amdsmi_{call}"  # the fake's key drops the prefix
                assert r.up_reason == f"hung: {named} did not return within {DEADLINE:g} s"  # the same every time
                assert r.power_watts is None and r.utilization_ratio is None and r.process_count is None
                assert r.uuid == first[i].uuid  # still identified, as a lost GPU is
                assert (r.health_state, r.health_cause) == ("hung", r.up_reason)
            assert {now[i].health_state for i in healthy} == {"ok"}
            assert v.hanging() == len(hung)  # exactly one outstanding call per hung GPU
            calls_while_hung.append({i: v.device_calls(i) for i in hung})
            if round_ == 0:
                threads = threading.active_count()
            else:
                assert threading.active_count() == threads, "threads grow while the GPU hangs"
        # no call reached a hung GPU after its hang began
        assert calls_while_hung[1:] == calls_while_hung[:-1]
        for i in hung:
            v.release(call, i)
        wait_returned(v, hung)
        back = gpus(engine.scrape())  # the first collection after the return reads them again
        for i in hung:
            assert back[i].up and back[i].power_watts is not None, back[i].up_reason
    finally:
        engine.stop()


@pytest.mark.slow  # waits out call deadlines: make test
def test_a_hung_gpm_sample_costs_its_gpu_only(nvml: Vendor) -> None:
    """GPM keeps per-GPU samples in one reader: a GPU hung inside a GPM call must not hold anything the
    other GPUs' GPM reads wait for (seen failing: the reader's lock, held over the call, stalled the backend)."""
    v = nvml
    engine = engine_for(v)
    try:
        engine.scrape()
        engine.scrape()  # two samples: GPM rates from here on
        v.hang("nvmlGpmSampleGet", 3)
        for round_ in range(3):
            for i in range(8):
                if i != 3:
                    v.set_util(i, 40 + 10 * round_ + i)
            snap = engine.scrape()
            now = gpus(snap)
            assert snap.stats["nvml"].success
            assert now[3].up_reason == f"hung: nvmlGpmSampleGet did not return within {DEADLINE:g} s"
            assert {i: now[i].utilization_ratio for i in range(8) if i != 3} == {
                i: pytest.approx((40 + 10 * round_ + i) / 100) for i in range(8) if i != 3}
            assert all(now[i].pcie_throughput for i in range(8) if i != 3)  # their GPM rates: read on
            assert v.hanging() == 1
        v.release("nvmlGpmSampleGet", 3)
        wait_returned(v, [3])
        engine.scrape()  # GPU 3's first sample after the outage ...
        back = gpus(engine.scrape())
        assert back[3].up and back[3].pcie_throughput  # ... and its rates again
    finally:
        engine.stop()


# --- a call about no GPU hangs ---------------------------------------------------------------------


def test_a_hung_device_count_stalls_the_backend_and_readiness_says_so(nvml: Vendor) -> None:
    v = nvml
    engine = engine_for(v)
    try:
        assert all(r.up for r in gpus(engine.scrape()).values())
        assert engine.ready(60) == (True, "ok")
        v.hang(v.node_call, None)
        threads = None
        for round_ in range(3):
            snap = engine.scrape()
            now = gpus(snap)
            assert not snap.stats["nvml"].success
            assert sorted(now) == list(range(8))  # the GPUs it knew, shown down with the cause
            cause = f"stalled: {v.node_call} did not return within {DEADLINE:g} s"  # the same every time
            assert {r.up_reason for r in now.values()} == {cause}
            assert not any(r.up for r in now.values())
            assert {(r.health_state, r.health_cause) for r in now.values()} == {("hung", cause)}
            assert all(r.power_watts is None for r in now.values())
            ok, why = engine.ready(60, wait=False) or (None, "")
            assert ok is False and why.startswith(f"backend nvml: stalled: {v.node_call} has not returned"), why
            assert v.hanging() == 1  # no second call was started behind the hung one
            if round_ == 0:
                threads = threading.active_count()
            else:
                assert threading.active_count() == threads
        v.release(v.node_call, None)
        wait_until(lambda: v.hanging() == 0 and engine._lanes["nvml"].busy() is None, 30,
                   what="the device count to return")
        snap = engine.scrape()
        assert snap.stats["nvml"].success and all(r.up for r in gpus(snap).values())
        assert engine.ready(60) == (True, "ok")
    finally:
        engine.stop()


def test_a_hung_init_stalls_the_backend_until_it_returns(vendor: Vendor) -> None:
    v = vendor
    init = "nvmlInitWithFlags" if v.name == "nvml" else "init"
    v.hang(init, None)
    engine = Engine([v.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=3.0,
                    cache_ttl=0.0, call_deadline=DEADLINE)
    try:
        snap = engine.scrape()  # init may take seconds on a real driver: its deadline is the collection timeout
        assert not snap.stats[v.name].success and gpus(snap) == {}
        ok, why = engine.ready(60, wait=False) or (None, "")
        assert ok is False and why.startswith(f"backend {v.name}: stalled: init has not returned"), why
        engine.scrape()
        assert v.hanging() == 1  # the second collection did not call init again
        v.release(init, None)
        wait_until(lambda: v.hanging() == 0 and engine._lanes[v.name].busy() is None, 30, what="init to return")
        snap = engine.scrape()
        assert snap.stats[v.name].success and len(gpus(snap)) == 8 and all(r.up for r in gpus(snap).values())
        assert engine.ready(60) == (True, "ok")
    finally:
        engine.stop()


@pytest.mark.slow  # waits out the init deadline: make test
def test_a_hung_init_in_the_auto_probe_stalls_the_backend_not_the_start(nvml: Vendor) -> None:
    """``--backend auto`` probes each backend's init at start-up: a wedged driver must not wedge the start.
    The probe gives up at the init deadline (the collection timeout less one call deadline), serve keeps
    that backend, stalled (readiness says so, naming init), and the first collection after init returns
    reads the GPUs, without a second init behind the hung one."""
    from exporter.core.options import Settings
    from exporter.serve.main import open_engine

    v = nvml
    v.hang("nvmlInitWithFlags", None)
    settings = Settings(backend="auto", collection_timeout=3.0, call_deadline=DEADLINE, cache_ttl=0.0)
    done: list[Engine] = []
    starting = threading.Thread(target=lambda: done.append(open_engine(settings, BackendOptions.from_settings(
        settings))), daemon=True)
    starting.start()
    starting.join(30)  # on main: never (the probe's init has no deadline)
    assert done, "start-up wedged in the auto probe's init"
    engine = done[0]
    try:
        assert [b.name for b in engine.backends] == ["nvml"]
        ok, why = engine.ready(60, wait=False) or (None, "")
        assert ok is False and why.startswith("backend nvml: stalled: init has not returned after"), why
        snap = engine.scrape()
        assert not snap.stats["nvml"].success and gpus(snap) == {}
        ok, why = engine.ready(60) or (None, "")
        assert ok is False and why.startswith("backend nvml: stalled: init has not returned after"), why
        assert v.hanging() == 1  # the collection did not call init again behind the hung one
        v.release("nvmlInitWithFlags", None)
        wait_until(lambda: v.hanging() == 0 and engine._lanes["nvml"].busy() is None, 30, what="init to return")
        snap = engine.scrape()
        assert snap.stats["nvml"].success and len(gpus(snap)) == 8 and all(r.up for r in gpus(snap).values())
        assert engine.ready(60) == (True, "ok")
    finally:
        v.release("nvmlInitWithFlags", None)
        engine.stop()


@pytest.mark.slow  # waits out the init deadline: make test
@pytest.mark.parametrize("backend", ["auto", "nvml"])
def test_a_hung_init_reaches_a_python_api_caller_at_once(nvml: Vendor, backend: str) -> None:
    """The Python API initialises its backends when a session opens; its caller must hear a wedged driver
    (one line naming init) after the init deadline, not wait for ever (on main: no deadline)."""
    from exporter.core.options import Settings
    from exporter.python_api.sessions import GpuUnavailable, session

    v = nvml
    v.hang("nvmlInitWithFlags", None)
    raised: list[BaseException] = []

    def open_one() -> None:
        try:
            with session(Settings(backend=backend, collection_timeout=3.0, call_deadline=DEADLINE)):
                pass
        except BaseException as exc:  # noqa: BLE001 - what the caller hears, asserted below
            raised.append(exc)

    opening = threading.Thread(target=open_one, daemon=True)
    opening.start()
    opening.join(30)
    try:
        assert raised, "the session never opened nor failed: the caller waits on the wedged init"
        assert isinstance(raised[0], GpuUnavailable)
        assert str(raised[0]) == "backend nvml: init did not return within 2 s (a wedged driver)"
        assert v.hanging() == 1
        v.release("nvmlInitWithFlags", None)
        # the late init succeeds; the backend nobody uses is shut down then, its XID watcher with it
        wait_until(lambda: v.hanging() == 0 and not any(t.name in ("nvml-xid", "collect-nvml")
                                                        for t in threading.enumerate()), 30,
                   what="the forsaken backend to be shut down")
    finally:
        v.release("nvmlInitWithFlags", None)


# --- the XID watcher: a wait that never returns, or fails every time -----------------------------------


def not_collecting() -> int:
    """Threads, less the collection lane's (``collect-nvml``), whose count follows the machine's load."""
    return threading.active_count() - len(lane_threads("collect-nvml"))


def xids(engine: Engine) -> dict[tuple[int, str, str], float] | None:
    """The XID counts of a fresh collection (None: the collection failed)."""
    snap = engine.scrape()
    if not snap.stats["nvml"].success:
        return None
    return {k: n for c in snap.collections for k, n in c.xid_counts.items()}


@pytest.mark.slow  # waits out the wait's deadline: make test
def test_a_hung_xid_wait_costs_only_the_xid_reading(nvml: Vendor, caplog: pytest.LogCaptureFixture) -> None:
    """nvmlEventSetWait_v2 never returns (a wedged driver seen from the watcher's thread): the XID families
    are absent (the counts cannot be trusted to be current: never served as if watched), every other
    reading of every GPU stays fresh, a re-initialisation neither waits for the watcher nor starts a
    second one behind it (threads flat), and once the wait returns the XIDs are counted again, the
    ones queued meanwhile included."""
    v, fleet = nvml, nvml.fake
    engine = engine_for(v)
    try:
        engine.scrape()
        fleet.queue_xid(2, 79)
        wait_until(lambda: (xids(engine) or {}).get((2, fleet.gpus[2]["uuid"], "79")) == 1.0, 30, what="XID 79 counted")
        fleet.hang("nvmlEventSetWait_v2")
        wait_until(lambda: v.hanging() == 1, 30, what="the watcher to block in its wait")
        wait_until(lambda: xids(engine) == {}, 30, what="the XID counts to go absent")  # after the wait's deadline
        threads = not_collecting()
        # what the engine does when a loaded machine holds the collecting thread in one GPU's call past
        # STAGGER_S: it collects again beside it, its lane's threads reserved (CI of f34a285: 36 == 28)
        engine._lanes["nvml"].reserve(9)
        for round_ in range(3):
            for i in range(8):
                v.set_util(i, 30 + 10 * round_ + i)
            t0 = time.monotonic()
            snap = engine.scrape()
            assert time.monotonic() - t0 < TIMEOUT
            now = gpus(snap)
            assert snap.stats["nvml"].success
            assert {i: now[i].utilization_ratio for i in range(8)} == {
                i: pytest.approx((30 + 10 * round_ + i) / 100) for i in range(8)}
            assert all(r.up for r in now.values())
            assert {r.health_state for i, r in now.items() if i != 2} == {"ok"}  # GPU 2: its XID 79, still held
            assert not any(c.xid_counts or c.xid_last_seconds for c in snap.collections)
        # the driver fails once: the backend is initialised again, the watcher restarted ...
        fleet.fail("nvmlDeviceGetCount_v2", UNINITIALIZED)
        t0 = time.monotonic()
        assert xids(engine) is None
        fleet.clear_fail("nvmlDeviceGetCount_v2")
        assert xids(engine) == {}
        assert time.monotonic() - t0 < 1.5  # ... without waiting for the hung watcher (main joined it for 2 s)
        # ... and without a second watcher behind it: one, and no other thread started (the collection's
        # lane may reserve up to one thread per GPU, plus one, whenever a call outlasts STAGGER_S: bounded)
        assert [t.name for t in threading.enumerate() if t.name.startswith("nvml-xid")] == ["nvml-xid"]
        assert not_collecting() == threads
        assert len(lane_threads("collect-nvml")) <= 9
        assert v.hanging() == 1
        warned = [r for r in caplog.records if "XID events not watched" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        fleet.queue_xid(5, 48)
        fleet.release("nvmlEventSetWait_v2")
        want = {(2, fleet.gpus[2]["uuid"], "79"): 1.0, (5, fleet.gpus[5]["uuid"], "48"): 1.0}
        wait_until(lambda: xids(engine) == want, 30, what="the XIDs counted again, the one queued meanwhile included")
    finally:
        fleet.release("nvmlEventSetWait_v2")
        engine.stop()


@pytest.mark.slow  # a one-second back-off: make test
def test_an_xid_wait_failing_every_time_costs_only_the_xid_reading(nvml: Vendor,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """nvmlEventSetWait_v2 fails at once every time (UNKNOWN): the watcher rebuilds its event set with a
    back-off, the XID families are absent while it fails (one warning), the GPUs are untouched, and
    the XIDs are counted again once the wait answers."""
    v, fleet = nvml, nvml.fake
    engine = engine_for(v)
    try:
        engine.scrape()
        fleet.queue_xid(1, 13)
        key = (1, fleet.gpus[1]["uuid"], "13")
        wait_until(lambda: (xids(engine) or {}).get(key) == 1.0, 30, what="XID 13 counted")
        fleet.fail("nvmlEventSetWait_v2", UNKNOWN)
        wait_until(lambda: xids(engine) == {}, 30, what="the XID counts to go absent")
        for _ in range(3):
            snap = engine.scrape()
            assert snap.stats["nvml"].success and all(r.up and r.power_watts for r in gpus(snap).values())
            assert not any(c.xid_counts for c in snap.collections)
        warned = [r for r in caplog.records if "XID events not watched" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        fleet.clear_fail("nvmlEventSetWait_v2")
        wait_until(lambda: xids(engine) == {key: 1.0}, 30, what="the XIDs counted again")
    finally:
        engine.stop()


@pytest.mark.slow  # waits out a call deadline: make test
def test_a_thread_stuck_in_a_hung_call_at_stop_ends_once_the_call_returns(vendor: Vendor) -> None:
    """The engine stops while GPU 3's call hangs: once that call returns, the thread it held ends too, as
    every idle one did at the stop; no reader thread of the backend is left behind. (A relay worker stuck
    at the stop went back to the idle pool when its call returned, and lived on: seen failing so.)"""
    v = vendor
    before = {t.ident for t in threading.enumerate()}
    engine = engine_for(v)
    engine.scrape()
    v.hang(v.reading_call, 3)
    try:
        assert not gpus(engine.scrape())[3].up
    finally:
        engine.stop()
        v.release(v.reading_call, 3)
    wait_returned(v, [3])

    def started() -> list[str]:  # the daemon threads started since, still running
        return sorted(t.name for t in threading.enumerate() if t.daemon and t.ident not in before)

    try:
        wait_until(lambda: not started(), 30, what="every thread the backend started to end")
    except AssertionError:  # wait_until timed out: say which
        raise AssertionError(f"still running after the stop: {started()}") from None


# --- bounded however long it hangs ------------------------------------------------------------------


def hold_hang(v: Vendor, seconds: float) -> None:
    """Collect for ``seconds`` while GPU 3's power reading hangs: threads and RSS stay flat."""
    engine = engine_for(v)
    try:
        engine.scrape()
        v.hang(v.reading_call, 3)
        for _ in range(20):  # warm up: the first hung collection's growth
            engine.scrape()
        threads, rss = threading.active_count(), rss_bytes()
        start = time.monotonic()
        end = start + seconds
        n = complete = 0
        measured = False
        while time.monotonic() < end:
            if not measured and time.monotonic() >= start + seconds / 3:
                # RSS is measured over the last two thirds: the 8 lane threads' malloc arenas fill
                # up to a plateau in the first minute (a few MiB, Python's own objects flat under
                # tracemalloc), where a leak would go on growing with every collection
                rss, measured = rss_bytes(), True
            snap = engine.scrape()
            n += 1
            now = gpus(snap)
            assert 3 not in now or not now[3].up  # never a stale "up" reading of the hung GPU
            if len(now) == 8:  # else a starved machine ran a collection past the timeout: a partial answer
                complete += 1
                assert now[4].up
            assert threading.active_count() == threads
            assert v.hanging() == 1
        assert complete >= 0.9 * n, f"{n - complete} of {n} collections overran the timeout"
        growth = rss_bytes() - rss
        assert growth < 4 * 2**20, (f"RSS grew {growth / 2**20:.1f} MiB over the last two thirds of {n} "
                                    "collections of a hung GPU")
        v.release(v.reading_call, 3)
        wait_returned(v, [3])
        assert gpus(engine.scrape())[3].up
    finally:
        engine.stop()


@pytest.mark.slow  # waits out a hang for seconds; make test runs it
def test_threads_and_memory_stay_flat_while_a_gpu_hangs(vendor: Vendor) -> None:
    hold_hang(vendor, 5.0)  # ten minutes of it: tests/reliability/test_hang_long.py (make reliability)


# --- GPUs that start hanging in the same collection cost one deadline together -----------------------


@pytest.mark.slow  # a call deadline per case: make test, not make check's inner loop
@pytest.mark.parametrize(("hung", "kind"), [
    ([0, 1, 2, 3, 4], "reading"),
    (list(range(8)), "reading"),
    ([1, 3, 4, 6, 7], "processes"),  # a call late in each GPU's read: the hangs start mid-collection
], ids=["5-of-8", "8-of-8", "5-of-8-mid-collection"])
def test_gpus_starting_to_hang_at_once_cost_one_deadline(vendor: Vendor, hung: list[int], kind: str) -> None:
    """Read one after another, five GPUs hanging at the 1 s default would take five seconds: the collection
    would pass its 5 s timeout and miss the healthy GPUs read after them (seen failing so: GPUs 5-7 absent).
    Read at once, the hangs overlap: one deadline for all of them, and every healthy GPU is fresh."""
    v = vendor
    engine = engine_for(v)
    call = v.reading_call if kind == "reading" else v.processes_call
    try:
        assert all(r.up for r in gpus(engine.scrape()).values())
        for i in hung:
            v.hang(call, i)
        healthy = [i for i in range(8) if i not in hung]
        for round_ in range(2):  # the collection the hangs start in, then one that refuses the hung GPUs at once
            for i in healthy:
                v.set_util(i, 60 + 10 * round_ + i)
            t0 = time.monotonic()
            snap = engine.scrape()
            took = time.monotonic() - t0
            now = gpus(snap)
            assert snap.stats[v.name].success, "the collection ran past its timeout"
            assert took < TIMEOUT
            assert sorted(now) == list(range(8))
            assert {i: now[i].utilization_ratio for i in healthy} == {
                i: pytest.approx((60 + 10 * round_ + i) / 100) for i in healthy}
            named = call if v.name == "nvml" else f"amdsmi_{call}"
            assert {i: now[i].up_reason for i in hung} == {
                i: f"hung: {named} did not return within {DEADLINE:g} s" for i in hung}
            assert v.hanging() == len(hung)
        for i in hung:
            v.release(call, i)
        wait_returned(v, hung)
        back = gpus(engine.scrape())
        assert all(back[i].up for i in range(8)), {i: back[i].up_reason for i in hung}
    finally:
        for i in hung:
            v.release(call, i)
        engine.stop()


@pytest.mark.slow  # every NVML call sleeps 20 ms: seconds per collection
def test_a_slow_driver_that_answers_every_call_is_not_hung(nvml: Vendor) -> None:
    """--call-deadline is per vendor call: a driver that answers every call in 20 ms (well within the
    1 s deadline) keeps every GPU up, although one GPU's 72 NVLink error counters, read as one funnel
    reading, take about 1.4 s together. (Found by test_load's excess-connections case: every GPU of a
    slow fake driver was published as hung, `_per_link did not return within 1 s`.)"""
    fleet = nvml.fake
    engine = Engine([nvml.backend], host_info(), FieldFilter(), collection_interval=0.0, collection_timeout=60.0,
                    cache_ttl=0.0, call_deadline=DEADLINE)
    try:
        assert all(r.up for r in gpus(engine.scrape()).values())
        for g in range(8):
            fleet.set(g, delay_ms=20)
        for _ in range(2):
            now = gpus(engine.scrape())
            assert sorted(now) == list(range(8))
            assert {i: (r.up, r.up_reason) for i, r in now.items()} == {i: (True, None) for i in range(8)}
            assert all(len(r.link_errors) == 72 and len(r.link_up) == 18 for r in now.values())
    finally:
        for g in range(8):
            fleet.set(g, delay_ms=0)
        engine.stop()
