"""A lane: one job at a time, on a thread its caller can leave behind, for callers that wait on it
with a deadline (the lane's own thread, or a thread that claims the lane and runs the job itself).

A vendor call that never returns (NVML while a GPU falls off the bus) cannot be interrupted: the
thread making it is lost until the driver answers. So the calls about one GPU run on that GPU's
lane (exporter/backends/base.py), and each backend's collection on its own lane
(exporter/core/engine.py). A caller waits at most its deadline and goes on without the answer;
the lane stays *busy* with that job, and every later job is refused at once until the late one
returns. A lane therefore holds at most one outstanding job and one thread, however long the job
hangs; nothing queues behind it.

A job whose caller gave up is *abandoned*: when it gets control back, code that checks
:meth:`Lane.abandoned` (the backends' funnel does, at every vendor call) raises :class:`Abandoned`
so the job unwinds without another vendor call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

_here = threading.local()  # .lane: the Lane whose job this thread runs now


def here() -> Lane | None:
    """The lane the calling thread runs (None when it is no lane's): the funnel's fast test, once per call."""
    return getattr(_here, "lane", None)


class Abandoned(BaseException):  # a BaseException: not an error, a job unwinding
    """Raised inside an abandoned job to unwind it (a backend's ``except Exception`` lets it pass)."""


class LaneBusy(Exception):
    """The lane still runs a job whose caller gave up on it; ``what`` names it, ``since`` (monotonic) is
    when it started."""

    def __init__(self, what: str, since: float, late: bool) -> None:
        self.what, self.since, self.late = what, since, late
        age = time.monotonic() - since
        super().__init__(f"{what} has not returned after {age:.1f} s" if late
                         else f"{what} did not return within {age:.1f} s")


class Job:
    __slots__ = ("abandoned", "done", "error", "finished", "fn", "result", "started", "what")

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.fn = fn
        self.what = what
        self.started = time.monotonic()
        self.done = threading.Lock()  # held until the job finished: the caller's timed wait (one futex)
        self.done.acquire()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False


class Lane:
    """At most one job at a time, run by the lane's own thread (started at the first :meth:`submit`),
    named ``name``, or by a thread that :meth:`claim` s the lane and :meth:`perform` s the job itself (a
    backend's relay worker, which reads GPU after GPU without a thread hand-off per GPU: a hand-off
    costs two thread wake-ups). Either way a thread stuck in a job holds that job's lane alone, and the
    lane refuses every job until it returns. ``on_return(what, seconds)`` is called on the thread that
    ran an abandoned job when it finally returns."""

    def __init__(self, name: str, on_return: Callable[[str, float], None] | None = None) -> None:
        self.name = name
        self._on_return = on_return
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._free = threading.Condition(self._mu)  # callers queued behind a running job (rare)
        self._queued = 0  # how many: notified only when there are some (a notify_all is a dozen Python calls)
        self.job: Job | None = None  # the job given to the lane and not finished: at most one
        self._thread: threading.Thread | None = None
        #: the id of the thread running the lane's job, while it does (the funnel's test "am I on this
        #: lane?", one C call)
        self.tid: int | None = None
        self.what = ""  # what the running job is doing now (the vendor call it is in: mark())
        self.since = 0.0  # since when (monotonic)

    # --- the caller's side ---------------------------------------------------------------------

    def run(self, fn: Callable[[], Any], deadline: float, what: str = "") -> Any:
        """``fn()`` on the lane: its result, or its exception. :class:`LaneBusy` when the lane still
        runs an earlier job (``late``: that job was abandoned), or when the call the job is in (see
        :meth:`mark`; the job itself when it marks none) has not returned within ``deadline`` seconds:
        the job is then abandoned, and the lane stays busy until it returns."""
        job = self.submit(fn, what)
        return self.wait(job, lambda: self.since + deadline - time.monotonic())

    def submit(self, fn: Callable[[], Any], what: str = "") -> Job:
        """Start ``fn`` on the lane's thread, after the job it runs for another caller (who waits for that
        one with a deadline); :class:`LaneBusy` when the lane runs a job its caller gave up on."""
        job = self.claim(fn, what)
        if self._thread is None:
            with self._mu:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                    self._thread.start()
        self._jobs.put(job)
        return job

    def claim(self, fn: Callable[[], Any], what: str = "") -> Job:
        """Make ``fn`` the lane's job, for the calling thread to run at once with :meth:`perform` (or for
        :meth:`submit` to hand to the lane's thread); waits and refuses as :meth:`submit` says."""
        with self._mu:
            while self.job is not None and not self.job.abandoned:
                self._queued += 1
                try:
                    self._free.wait()
                finally:
                    self._queued -= 1
            busy = self.job
            if busy is not None:
                raise LaneBusy(self.what or busy.what, self.since, late=True)
            job = Job(fn, what)
            self.job = job
            self.what, self.since = what, job.started
        return job

    def wait(self, job: Job, remaining: Callable[[], float]) -> Any:
        """Wait for ``job`` while ``remaining()`` (seconds, asked again after each wake-up) is positive;
        then abandon the job and raise :class:`LaneBusy`."""
        while True:
            left = remaining()
            if left <= 0:
                with self._mu:
                    if not job.finished:
                        job.abandoned = True
                        if self._queued:
                            self._free.notify_all()  # callers queued behind it: refused from now on
                        raise LaneBusy(self.what or job.what, self.since, late=False)
                break
            if job.done.acquire(timeout=left):
                break
        if job.error is not None:
            raise job.error
        return job.result

    def mark(self, what: str) -> None:
        """On the lane: the job now makes the call ``what`` (its deadline starts now)."""
        self.what, self.since = what, time.monotonic()

    def busy(self) -> tuple[str, float] | None:
        """(what, since) of the job the lane still runs, or None when it is idle."""
        job = self.job
        return None if job is None else (self.what or job.what, self.since)

    # --- the lane's side -------------------------------------------------------------------------

    def ident(self) -> int | None:
        """The lane's own thread's id (None before its first :meth:`submit`)."""
        return None if self._thread is None else self._thread.ident

    def current(self) -> bool:
        """Whether the calling thread runs this lane's job now."""
        return self.tid == threading.get_ident()

    def abandoned(self) -> bool:
        """On the lane: whether the caller of the running job gave up on it."""
        job = self.job
        return job is not None and job.abandoned

    def stop(self) -> None:
        """Let the thread end once it is idle (a hung one ends when its call returns)."""
        self._jobs.put(None)

    def perform(self, job: Job) -> None:
        """Run the lane's job ``job`` (from :meth:`claim`) on the calling thread, which is this lane's
        (:func:`here`, :meth:`current`) until it finishes; its caller gets the result from :meth:`wait`."""
        outer = getattr(_here, "lane", None)
        _here.lane = self
        self.tid = threading.get_ident()
        try:
            job.result = job.fn()
        except Abandoned:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who decides
            job.error = exc
        with self._mu:
            job.finished = True
            self.job = None
            self.tid = None
            self.what = ""
            late = job.abandoned
            if self._queued:
                self._free.notify_all()
        _here.lane = outer
        job.done.release()
        if late and self._on_return is not None:
            try:
                self._on_return(job.what, time.monotonic() - job.started)
            except Exception:  # noqa: BLE001 - a log line must never kill the lane
                pass

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.perform(job)
