"""The HTTP server's limits on their own (exporter/platform/http/limits.py; the mutation module
``http-limits``): the failed-login limiter, the ``rate_limit`` bucket, the answering lanes and the
connection cap, in this process, on a fake clock, with no socket.

The I/O loop that uses them is tested through real sockets in test_http_server.py and
test_probe_starvation.py; those take seconds per test, these microseconds, so that every mutant of
this file is judged (docs/reliability.md, Mutation testing).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from exporter.platform.http import limits
from exporter.platform.http.limits import FailureLimiter, RateBucket, ThreadLane, connection_cap
from tests.harness.poll import wait_until


class Clock:
    """``time.monotonic`` for limits.py, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(limits, "time", c)
    return c


# ---- failed logins per address ---------------------------------------------------------------------


def test_the_defaults() -> None:
    assert (limits.FAILURE_BURST, limits.FAILURE_REFILL_S, limits.LANE_IDLE_S) == (10, 1.0, 2.0)
    f = FailureLimiter()
    assert (f.burst, f.refill_s) == (10, 1.0)


def test_a_burst_then_one_attempt_per_refill(clock: Clock) -> None:
    f = FailureLimiter(burst=3, refill_s=2.0)
    assert [f.charge("a") for _ in range(3)] == [0, 0, 0]
    assert f.charge("a") == 2  # empty: a whole refill to wait
    assert f.charge("b") == 0  # another address has its own bucket
    clock.now += 1.0
    assert f.charge("a") == 1  # half a token back: one second to wait
    clock.now += 0.5
    assert f.charge("a") == 1  # 0.75 of a token: 0.5 s, said as one whole second
    clock.now += 0.5
    assert f.charge("a") == 0  # exactly one token again
    assert f.charge("a") == 2
    clock.now += 1000
    assert [f.charge("a") for _ in range(4)] == [0, 0, 0, 2]  # refilled to the burst, never beyond


def test_the_wait_is_whole_seconds_rounded_up(clock: Clock) -> None:
    f = FailureLimiter(burst=1, refill_s=2.5)
    assert f.charge("a") == 0
    assert f.charge("a") == 3  # 2.5 s, rounded up
    clock.now += 2.4
    assert f.charge("a") == 1  # 0.1 s: at least one second
    f = FailureLimiter(burst=1, refill_s=0.25)
    f.charge("a")
    assert f.charge("a") == 1  # 0.25 s: at least one second


def test_a_refused_attempt_takes_nothing(clock: Clock) -> None:
    f = FailureLimiter(burst=1, refill_s=1.0)
    f.charge("a")
    for _ in range(5):
        assert f.charge("a") == 1
    clock.now += 1.0
    assert f.charge("a") == 0  # the refused ones did not dig the bucket deeper


def test_a_passing_login_gives_its_token_back(clock: Clock) -> None:
    f = FailureLimiter(burst=2, refill_s=10.0)
    f.charge("a")
    f.refund("a")
    f.charge("a")
    f.refund("a")
    assert [f.charge("a") for _ in range(3)] == [0, 0, 10]
    f.refund("a")
    assert f.charge("a") == 0 and f.charge("a") == 10
    for _ in range(5):  # never above the burst
        f.refund("a")
    assert [f.charge("a") for _ in range(3)] == [0, 0, 10]
    f.refund("never-seen")  # an address with no bucket gets none
    assert "never-seen" not in f._buckets


def test_the_warning_is_logged_once_when_the_bucket_runs_dry(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "exporter.platform.http.limits")
    f = FailureLimiter(burst=3, refill_s=1.0)
    f.charge("10.0.0.1")
    f.charge("10.0.0.1")
    assert caplog.records == []
    f.charge("10.0.0.1")  # the last token
    f.charge("10.0.0.1")  # refused: not said again
    assert [r.getMessage() for r in caplog.records] == [
        "basic auth: 3 failed attempts from 10.0.0.1; its next attempts get 429 for a while"]


def test_the_buckets_are_bounded_in_memory(clock: Clock) -> None:
    """Past 10,000 addresses the full buckets are forgotten; if none is full, all of them."""
    f = FailureLimiter(burst=2, refill_s=1.0)
    for i in range(10001):
        f.charge(f"a{i}")
    assert len(f._buckets) == 10001  # at the bound: kept
    clock.now += 5  # every bucket full again
    f.charge("b")
    assert set(f._buckets) == {"b"}
    for i in range(10000):
        f.charge(f"c{i}")
    assert len(f._buckets) == 10001
    f.charge("d")  # none is full: all forgotten, the newcomer kept
    assert set(f._buckets) == {"d"}
    g = FailureLimiter(burst=2, refill_s=1.0)
    for i in range(5000):
        g.charge(f"old{i}")
    clock.now += 5  # these are full again ...
    for i in range(5001):
        g.charge(f"new{i}")  # ... these are not
    g.charge("e")
    assert set(g._buckets) == {f"new{i}" for i in range(5001)} | {"e"}
    assert g._buckets["e"] == (1.0, clock.now) and g._buckets["new0"] == (1.0, clock.now)
    # the bounds exactly: 10,000 addresses are not "many" (full ones kept), and 10,000 left after
    # forgetting the full ones are not too many (kept, none cleared)
    h = FailureLimiter(burst=2, refill_s=1.0)
    for i in range(10000):
        h.charge(f"a{i}")
    clock.now += 5
    h.charge("b")
    assert len(h._buckets) == 10001
    k = FailureLimiter(burst=2, refill_s=1.0)
    k.charge("old")
    clock.now += 5
    for i in range(10000):
        k.charge(f"new{i}")
    k.charge("e")
    assert set(k._buckets) == {f"new{i}" for i in range(10000)} | {"e"}


# ---- the web config's rate_limit ---------------------------------------------------------------------


def test_the_rate_bucket(clock: Clock) -> None:
    r = RateBucket(interval=0.5, burst=2)
    assert [r.allow() for _ in range(3)] == [True, True, False]
    clock.now += 0.25
    assert r.allow() is False  # half a token
    clock.now += 0.25
    assert r.allow() is True and r.allow() is False  # exactly one
    clock.now += 100
    assert [r.allow() for _ in range(3)] == [True, True, False]  # never more than the burst saved
    r = RateBucket(interval=1.0, burst=1)
    clock.now += 0.999
    assert r.allow() is True and r.allow() is False
    clock.now += 0.999
    assert r.allow() is False
    clock.now += 0.001
    assert r.allow() is True


# ---- the answering lanes -------------------------------------------------------------------------


def _lane_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"http-{name}"]


def test_a_lane_runs_jobs_in_order_on_at_most_its_threads() -> None:
    lane = ThreadLane("t-order", 2)
    assert (lane.name, lane.limit, lane.pending) == ("t-order", 2, 0)
    gate = threading.Event()
    ran: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> Any:
        def run() -> None:
            gate.wait(5)
            with lock:
                ran.append(i)
        return run

    for i in range(6):
        lane.submit(job(i))
    assert lane.pending == 6 and lane._threads == 2
    threads = _lane_threads("t-order")
    assert len(threads) == 2 and all(t.daemon for t in threads)
    gate.set()
    wait_until(lambda: lane.pending == 0, 5, what="the jobs")
    assert sorted(ran) == list(range(6)) and lane._threads <= 2


def test_a_lane_starts_a_thread_only_when_every_thread_is_busy() -> None:
    lane = ThreadLane("t-busy", 4)
    done = threading.Event()
    lane.submit(done.set)
    assert done.wait(5)
    wait_until(lambda: lane.pending == 0, 5)
    lane.submit(lambda: None)  # one thread, idle: it takes the job, none started
    wait_until(lambda: lane.pending == 0, 5)
    assert lane._threads == 1 and len(_lane_threads("t-busy")) == 1


def test_a_failing_job_is_logged_and_the_lane_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "exporter.platform.http.limits")
    lane = ThreadLane("t-fail", 1)

    def boom() -> None:
        raise RuntimeError("bug")

    done = threading.Event()
    lane.submit(boom)
    lane.submit(done.set)
    assert done.wait(5)
    wait_until(lambda: lane.pending == 0, 5)
    (rec,) = [r for r in caplog.records if r.name == "exporter.platform.http.limits"]
    assert rec.getMessage() == "HTTP t-fail lane: a job failed" and rec.exc_info is not None


def test_idle_threads_end_and_a_new_job_starts_one_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "LANE_IDLE_S", 0.05)
    lane = ThreadLane("t-idle", 3)
    gate = threading.Event()
    for _ in range(3):
        lane.submit(lambda: gate.wait(5) and None)
    assert lane._threads == 3
    gate.set()
    wait_until(lambda: lane._threads == 0 and not _lane_threads("t-idle"), 5, what="idle threads ending")
    assert lane.pending == 0
    done = threading.Event()
    lane.submit(done.set)
    assert done.wait(5) and lane._threads <= 1


def test_a_thread_with_work_left_does_not_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle wait that times out ends the thread only when there are more threads than jobs."""
    monkeypatch.setattr(limits, "LANE_IDLE_S", 0.01)
    lane = ThreadLane("t-left", 1)
    lane.pending = 1  # a job counted but not yet queued (submit counts before it puts)
    lane._threads = 1
    t = threading.Thread(target=lane._run, name="http-t-left", daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive()  # it waits on for the job
    done = threading.Event()
    lane._jobs.put(done.set)
    assert done.wait(5)
    t.join(5)
    assert not t.is_alive() and lane._threads == 0 and lane.pending == 0


# ---- the connection cap ------------------------------------------------------------------------


@pytest.mark.parametrize(("max_connections", "soft", "cap"), [
    (64, 1024, 1024 - 64 - 64),  # ulimit -n 1024: what is left after the reserve and the probe listener
    (64, 4096, 1024),  # plenty of descriptors: 1024, or four per slot
    (255, 1 << 20, 1024),  # four per slot is 1,020: at least 1,024
    (256, 1 << 20, 1024),
    (257, 1 << 20, 1028),
    (512, 1 << 20, 2048),
    (8, 100, 16),  # a tiny limit: still 16
    (8, 16 + 128, 16),
    (8, 17 + 128, 17),
    (64, 1152, 1024),  # exactly enough descriptors
    (64, 1151, 1023),
])
def test_the_connection_cap_is_derived_from_the_file_limit(max_connections: int, soft: int, cap: int) -> None:
    assert (limits.FD_RESERVE, limits.PROBE_OPEN) == (64, 64)
    assert connection_cap(max_connections, soft) == cap


def test_the_cap_reads_the_soft_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda what: (500, 4096) if what == resource.RLIMIT_NOFILE else (0, 0))
    assert connection_cap(64) == 500 - 128
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert connection_cap(1000) == 4000  # unlimited: as if 2^20
    assert connection_cap(300_000) == (1 << 20) - 128

    def fails(what: int) -> tuple[int, int]:
        raise OSError("no")

    monkeypatch.setattr(resource, "getrlimit", fails)
    assert connection_cap(64) == 1024 - 128  # unknown: as if 1,024
    monkeypatch.setattr(resource, "getrlimit", lambda what: (_ for _ in ()).throw(ValueError("bad")))
    assert connection_cap(64) == 1024 - 128
