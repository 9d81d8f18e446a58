"""exporter/core/lane.py: what a collection that reads its GPUs inline relies on (issue 39).

A collection reads each GPU inside that GPU's lane's job on its own thread; when that thread stays in
one GPU's call, the engine forsakes the collection's job and starts it again on another of the lane's
threads, which takes over the GPU's job still running (same key) and waits for it. Real threads, real
locks; nothing is mocked. Every wait is on an event the test controls, never a sleep.
"""

from __future__ import annotations

import threading
import time

import pytest

from exporter.core.lane import Abandoned, Lane, LaneBusy
from tests.harness.poll import wait_until
from tests.harness.threads import lane_threads


class Held:
    """A job that runs until :attr:`release` is set, then returns ``result``: claimed with ``key`` and run
    on a thread of the test's (as a collection runs a GPU's read), or, with ``submit``, on the lane's."""

    def __init__(self, lane: Lane, what: str, key: object = None, result: object = None, submit: bool = False) -> None:
        self.release = threading.Event()
        self.running = threading.Event()
        self.ran_on: list[int] = []

        def fn() -> object:
            self.ran_on.append(threading.get_ident())
            self.running.set()
            self.release.wait(30)
            return result

        if submit:
            self.job = lane.submit(fn, what)
        else:
            self.job = lane.claim(fn, what, key=key)
            threading.Thread(target=lane.perform, args=(self.job,), daemon=True).start()
        assert self.running.wait(30)


def test_a_job_claimed_inline_runs_on_the_calling_thread_and_marks_it_the_lanes() -> None:
    lane = Lane("t-inline")
    seen: list[tuple[int, bool]] = []
    job = lane.claim(lambda: seen.append((threading.get_ident(), lane.current())) or 7, "read")
    lane.perform(job)
    assert seen == [(threading.get_ident(), True)]
    assert job.finished and job.result == 7
    assert not lane.current() and lane.busy() is None and lane.ident() is None
    assert lane_threads("t-inline") == []  # no thread of its own was needed


def test_take_takes_over_a_running_job_with_the_same_key() -> None:
    """A forsaken attempt left GPU 3's read running: the next attempt gets that job, not a second read."""
    lane = Lane("t-adopt")
    held = Held(lane, "read", key=("read", 3), result="first")
    try:
        taken, mine = lane.take(lambda: "second", "read", ("read", 3), deadline=30.0)
        assert taken is held.job and not mine
        held.release.set()
        assert lane.wait(taken, lambda: 30.0) == "first"
    finally:
        held.release.set()


def test_take_has_a_finished_reads_result_after_another_job_ran_on_the_lane() -> None:
    """A forsaken attempt finished GPU 3's read; then the XID watcher's registration (a job with no key)
    ran on GPU 3's lane, before the next attempt came to GPU 3: it has the read's result, not a second
    read of the GPU (seen failing so: Lane.last was whichever job finished last)."""
    lane = Lane("t-between")
    read = lane.claim(lambda: "first", "read", key=("read", 3))
    lane.perform(read)
    registration = lane.submit(lambda: "registered", "register")
    assert lane.wait(registration, lambda: 30.0) == "registered"
    taken, mine = lane.take(lambda: "second", "read", ("read", 3), deadline=30.0)
    assert taken is read and not mine
    assert lane.wait(taken, lambda: 30.0) == "first"
    other, mine = lane.take(lambda: "next", "read", ("read", 4), deadline=30.0)  # another collection's: its own
    assert mine and other is not read
    lane.perform(other)
    assert lane.wait(other, lambda: 30.0) == "next"


def test_take_behind_another_callers_job_gives_up_at_the_deadline_and_abandons_it() -> None:
    """Behind a job that is not the same read (a forsaken attempt's topology row), a collection waits at
    most the call deadline: the job is abandoned and the lane refuses, so the GPU is published hung."""
    lane = Lane("t-other")
    held = Held(lane, "row", key=("row", 3))
    try:
        t0 = time.monotonic()
        with pytest.raises(LaneBusy) as refused:
            lane.take(lambda: None, "read", ("read", 3), deadline=0.2)
        assert not refused.value.late and refused.value.what == "row"
        assert time.monotonic() - t0 < 10
        assert held.job.abandoned
        with pytest.raises(LaneBusy) as late:  # until it returns, every job is refused at once
            lane.take(lambda: None, "read", ("read", 3), deadline=30.0)
        assert late.value.late
    finally:
        held.release.set()
    wait_until(lambda: held.job.finished, 30, what="the abandoned job to return")
    taken, mine = lane.take(lambda: "again", "read", ("read", 3), deadline=30.0)  # back: the lane is free
    assert mine
    lane.perform(taken)
    assert taken.result == "again"


def test_a_forsaken_job_frees_the_lane_and_its_thread_comes_back_spare() -> None:
    """The engine forsakes a collection whose thread a GPU holds: the next collection runs at once on
    another thread; the forsaken thread, once its call returns, neither clobbers the lane's state nor
    ends up as an extra thread (reserve keeps the count flat), and stop ends every thread."""
    lane = Lane("t-forsake")
    held = Held(lane, "collect", result="late", submit=True)
    first = held.job
    ran_on = held.ran_on
    try:
        lane.forsake(first)
        assert first.abandoned and first.forsaken and lane.busy() is None
        lane.reserve(3)
        assert len(lane_threads("t-forsake")) == 3
        second_started = threading.Event()
        gate = threading.Event()

        def next_collection() -> str:
            ran_on.append(threading.get_ident())
            second_started.set()
            gate.wait(30)
            return "next"

        second = lane.submit(next_collection, "collect")
        assert second_started.wait(30)
        assert ran_on[1] != ran_on[0]
        held.release.set()  # the forsaken job returns while the next one runs: the lane stays the next one's
        wait_until(lambda: first.finished, 30, what="the forsaken job to return")
        assert lane.job is second and lane.busy() == ("collect", second.started)
        gate.set()
        assert lane.wait(second, lambda: 30.0) == "next"
        assert len(lane_threads("t-forsake")) == 3  # the forsaken thread is a spare again, nothing new
        third = lane.submit(lambda: "third", "collect")
        assert lane.wait(third, lambda: 30.0) == "third"
        assert len(lane_threads("t-forsake")) == 3
    finally:
        held.release.set()
        lane.stop()
    wait_until(lambda: not lane_threads("t-forsake"), 30, what="every thread of the lane to end")


def test_a_forsaken_job_held_at_stop_ends_its_thread_when_it_returns() -> None:
    lane = Lane("t-stop")
    held = Held(lane, "collect", submit=True)
    lane.forsake(held.job)
    lane.stop()
    assert len(lane_threads("t-stop")) == 1
    held.release.set()
    wait_until(lambda: not lane_threads("t-stop"), 30, what="the held thread to end")


def test_every_caller_waiting_on_one_job_gets_its_result() -> None:
    """A job taken over has two callers at most (the forsaken attempt's and the new one's): both wake."""
    lane = Lane("t-two")
    release = threading.Event()
    job = lane.submit(lambda: release.wait(30) and "done", "read")
    results: list[str] = []
    waiters = [threading.Thread(target=lambda: results.append(lane.wait(job, lambda: 30.0)), daemon=True)
               for _ in range(2)]
    for w in waiters:
        w.start()
    release.set()
    for w in waiters:
        w.join(10)  # well within the 30 s they would wait: one woken waiter wakes the next
    assert results == ["done", "done"]
    lane.stop()


def test_an_abandoned_job_unwinds_with_abandoned_and_its_caller_is_told_late() -> None:
    lane = Lane("t-abandon")
    release = threading.Event()
    unwound = threading.Event()

    def job_fn() -> None:
        release.wait(30)
        try:
            if lane.abandoned():
                raise Abandoned
        finally:
            unwound.set()

    job = lane.submit(job_fn, "read")
    with pytest.raises(LaneBusy) as busy:
        lane.wait(job, lambda: 0.0)
    assert not busy.value.late and job.abandoned and not job.forsaken
    release.set()
    assert unwound.wait(30)
    wait_until(lambda: job.finished, 30, what="the abandoned job to finish")
    assert job.error is None  # Abandoned is how a job unwinds, not an error
    lane.stop()
