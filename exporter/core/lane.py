"""A lane: one thread that runs one job at a time, for callers that wait on it with a deadline.

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

_here = threading.local()  # .lane: the Lane whose thread this is


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
    __slots__ = ("abandoned", "done", "error", "finished", "fn", "result", "started", "then", "what")

    def __init__(self, fn: Callable[[], Any], what: str, then: Callable[[], None] | None = None) -> None:
        self.fn = fn
        self.what = what
        self.then = then  # run on the lane once the job has finished (its caller may be gone by then)
        self.started = time.monotonic()
        self.done = threading.Lock()  # held until the job finished: the caller's timed wait (one futex)
        self.done.acquire()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False


class Lane:
    """One worker thread (started at the first job), named ``name``. ``on_return(what, seconds)`` is
    called on the lane when an abandoned job finally returns. A hand-off costs a queue put and a lock
    wait (tens of microseconds): a backend hands over one job per GPU and collection."""

    def __init__(self, name: str, on_return: Callable[[str, float], None] | None = None) -> None:
        self.name = name
        self._on_return = on_return
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._free = threading.Condition(self._mu)  # callers queued behind a running job (rare)
        self.job: Job | None = None  # the job given to the lane and not finished: at most one
        self._thread: threading.Thread | None = None
        #: the lane thread's id while it runs (the funnel's test "am I on this lane?", one C call)
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

    def submit(self, fn: Callable[[], Any], what: str = "", then: Callable[[], None] | None = None) -> Job:
        """Start ``fn`` on the lane, after the job it runs for another caller (who waits for that one with
        a deadline); :class:`LaneBusy` when the lane runs a job its caller gave up on. ``then()`` runs on
        the lane right after the job has finished (and its waiter could see so): a relay of jobs over
        several lanes starts the next one there, with no hand-off back to the caller in between."""
        with self._mu:
            while self.job is not None and not self.job.abandoned:
                self._free.wait()
            busy = self.job
            if busy is not None:
                raise LaneBusy(self.what or busy.what, self.since, late=True)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            job = Job(fn, what, then)
            self.job = job
            self.what, self.since = what, job.started
        self._jobs.put(job)
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
        """The lane thread's id (None before its first job)."""
        return None if self._thread is None else self._thread.ident

    def current(self) -> bool:
        """Whether the calling thread is this lane's."""
        return self.tid == threading.get_ident()

    def abandoned(self) -> bool:
        """On the lane: whether the caller of the running job gave up on it."""
        job = self.job
        return job is not None and job.abandoned

    def stop(self) -> None:
        """Let the thread end once it is idle (a hung one ends when its call returns)."""
        self._jobs.put(None)

    def _loop(self) -> None:
        _here.lane = self
        self.tid = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                self.tid = None  # before the thread ends and its id can be another thread's
                return
            try:
                job.result = job.fn()
            except Abandoned:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who decides
                job.error = exc
            with self._mu:
                job.finished = True
                self.job = None
                self.what = ""
                late = job.abandoned
                self._free.notify_all()
            job.done.release()
            if job.then is not None:
                try:
                    job.then()
                except Exception:  # noqa: BLE001 - the relay's own bookkeeping must never kill the lane
                    pass
            if late and self._on_return is not None:
                try:
                    self._on_return(job.what, time.monotonic() - job.started)
                except Exception:  # noqa: BLE001 - a log line must never kill the lane
                    pass
