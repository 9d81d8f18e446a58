"""A lane: one job at a time, on a thread its caller can leave behind, for callers that wait on it
with a deadline (a thread of the lane's own, or a thread that claims the lane and runs the job itself).

A vendor call that never returns (NVML while a GPU falls off the bus) cannot be interrupted: the
thread making it is lost until the driver answers. So the calls about one GPU run as jobs of that
GPU's lane (exporter/backends/base.py), and each backend's collection as a job of its own lane
(exporter/core/engine.py). A caller waits at most its deadline and goes on without the answer;
the lane stays *busy* with that job, and every later job is refused at once until the late one
returns. A GPU's lane therefore holds at most one outstanding job and one thread, however long the
job hangs; nothing queues behind it.

A job whose caller gave up is *abandoned*: when it gets control back, code that checks
:meth:`Lane.abandoned` (the backends' funnel does, at every vendor call) raises :class:`Abandoned`
so the job unwinds without another vendor call.

A collection's lane can also *forsake* its job (:meth:`Lane.forsake`): the thread running it reads
a GPU that has stopped answering, inline (exporter/backends/base.py ``on_gpus``), and the engine
starts the collection again on another of the lane's threads; the forsaken thread, held by that
GPU's lane alone, unwinds when its call returns and becomes a spare thread of the lane again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

# How long a collection's thread may stay in one vendor call about a GPU before the engine starts the
# collection again beside it (seconds): longer than a healthy GPU's whole read (about 0.3 ms), short
# beside any call deadline (exporter/core/engine.py).
STAGGER_S = 0.05

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
    __slots__ = ("abandoned", "done", "error", "finished", "fn", "forsaken", "key", "result", "started", "what")

    def __init__(self, fn: Callable[[], Any], what: str, key: object = None) -> None:
        self.fn = fn
        self.what = what
        self.key = key  # what the job reads (Lane.take: a later caller wanting the same takes this one over)
        self.started = time.monotonic()
        self.done = threading.Lock()  # held until the job finished: the callers' timed wait (one futex)
        self.done.acquire()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.forsaken = False  # the lane went on without it (Lane.forsake): its caller started it again


class Lane:
    """At most one job at a time, run by a thread of the lane's own (started at a :meth:`submit` that finds
    none spare), named ``name``, or by a thread that :meth:`claim` s the lane and :meth:`perform` s the job
    itself (a collection reading GPU after GPU inline, without a thread hand-off per GPU: a hand-off costs
    two thread wake-ups, and the work then runs on another CPU). Either way a thread stuck in a job holds
    that job's lane alone, and the lane refuses every job until it returns. ``on_return(what, seconds)``
    is called on the thread that ran an abandoned job when it finally returns."""

    def __init__(self, name: str, on_return: Callable[[str, float], None] | None = None) -> None:
        self.name = name
        self._on_return = on_return
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._free = threading.Condition(self._mu)  # callers queued behind a running job (rare)
        self._queued = 0  # how many: notified only when there are some (a notify_all is a dozen Python calls)
        self.job: Job | None = None  # the job given to the lane and not finished: at most one
        #: the job with a key that finished last (Lane.take: its result, for the same key); a job without
        #: one (an XID registration handed to the lane) leaves it, so a read is never made twice for it
        self.last: Job | None = None
        self._threads = 0  # the lane's own threads (one, unless a job was forsaken: see forsake)
        self._spare = 0  # of them, those idle for the next job
        self._stopped = False
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

    def submit(self, fn: Callable[[], Any], what: str = "", key: object = None) -> Job:
        """Start ``fn`` on one of the lane's threads, after the job it runs for another caller (who waits
        for that one with a deadline); :class:`LaneBusy` when the lane runs a job its caller gave up on.
        ``key``: what the job is (the engine's: which collection, the same for its every attempt)."""
        job = self.claim(fn, what, key)
        with self._mu:
            if self._spare:
                self._spare -= 1
            else:
                self._start()
        self._jobs.put(job)
        return job

    def reserve(self, n: int) -> None:
        """Have at least ``n`` threads (after a forsaken job: ``n`` as many as the threads GPUs can hold,
        plus one, so a collection started again later starts no thread, and the thread count stays flat)."""
        with self._mu:
            while self._threads < n and not self._stopped:
                self._start()
                self._spare += 1

    def _start(self) -> None:  # under _mu
        self._threads += 1
        threading.Thread(target=self._loop, name=f"{self.name}-{self._threads}" if self._threads > 1 else self.name,
                         daemon=True).start()

    def claim(self, fn: Callable[[], Any], what: str = "", key: object = None) -> Job:
        """Make ``fn`` the lane's job, for the calling thread to run at once with :meth:`perform` (or for
        :meth:`submit` to hand to the lane's thread); waits and refuses as :meth:`submit` says."""
        with self._mu:
            self._behind(None, None)
            return self._claim(fn, what, key)

    def take(self, fn: Callable[[], Any], what: str, key: object, deadline: float) -> tuple[Job, bool]:
        """:meth:`claim`, for a collection that reads GPUs inline: ``(job, True)`` to :meth:`perform` now;
        ``(job, False)`` when the lane runs, or last finished, a job with the same ``key`` (not None: what
        a forsaken attempt of the same collection started): that one is taken over, its caller waits for
        it or has its result. Behind any other job it waits at most until that job's call has run
        ``deadline`` seconds, then abandons it and raises :class:`LaneBusy` (a caller that will never
        abandon it may be gone)."""
        with self._mu:
            last = self.last
            if key is not None and last is not None and last.key == key and not last.abandoned:
                return last, False
            running = self._behind(key, deadline)
            if running is not None:
                return running, False
            return self._claim(fn, what, key), True

    def _behind(self, key: object, deadline: float | None) -> Job | None:  # under _mu
        """Wait while the lane runs a job its caller still waits for; then return None (:meth:`_claim`
        refuses an abandoned one). The running job itself when its ``key`` is ``key`` (not None). With a
        ``deadline``: once that job's call has run that long, abandon it and raise :class:`LaneBusy`."""
        while True:
            running = self.job
            if running is None or running.abandoned:
                return None
            if key is not None and running.key == key:
                return running
            left = None if deadline is None else self.since + deadline - time.monotonic()
            if left is not None and left <= 0:
                running.abandoned = True
                if self._queued:
                    self._free.notify_all()
                raise LaneBusy(self.what or running.what, self.since, late=False)
            self._queued += 1
            try:
                self._free.wait(left)
            finally:
                self._queued -= 1

    def _claim(self, fn: Callable[[], Any], what: str, key: object) -> Job:  # under _mu
        busy = self.job
        if busy is not None:
            raise LaneBusy(self.what or busy.what, self.since, late=True)
        job = Job(fn, what, key)
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
                            self._free.notify_all()
                        raise LaneBusy(self.what if self.job is job and self.what else job.what,
                                       self.since if self.job is job else job.started, late=False)
                break
            if job.done.acquire(timeout=left):
                job.done.release()  # for any other caller waiting on it (one taken over: Lane.take)
                break
        if job.error is not None:
            raise job.error
        return job.result

    def forsake(self, job: Job) -> None:
        """Go on without ``job``: its thread is held by another lane's call (a GPU's, that has stopped
        answering) and its caller starts it again. The job is abandoned and no longer the lane's; the
        lane is free, and its next job runs on another thread (see :meth:`reserve`)."""
        with self._mu:
            job.abandoned = job.forsaken = True
            self._vacate(job)

    def _vacate(self, job: Job) -> None:  # under _mu
        """``job`` is no longer the lane's (finished, or forsaken): the lane is free, callers behind it wake."""
        if self.job is job:
            self.job = None
            self.tid = None
            self.what = ""
            if self._queued:
                self._free.notify_all()

    def mark(self, what: str) -> None:
        """On the lane: the job now makes the call ``what`` (its deadline starts now)."""
        self.what, self.since = what, time.monotonic()

    def busy(self) -> tuple[str, float] | None:
        """(what, since) of the job the lane still runs, or None when it is idle."""
        job = self.job
        return None if job is None else (self.what or job.what, self.since)

    # --- the lane's side -------------------------------------------------------------------------

    def ident(self) -> int | None:
        """The id of the thread that runs the lane's job now (None when it runs none)."""
        return self.tid

    def current(self) -> bool:
        """Whether the calling thread runs this lane's job now."""
        return self.tid == threading.get_ident()

    def abandoned(self) -> bool:
        """On the lane: whether the caller of the running job gave up on it."""
        job = self.job
        return job is not None and job.abandoned

    def stop(self) -> None:
        """Let the lane's threads end once they are idle (a hung one ends when its call returns)."""
        with self._mu:
            self._stopped = True
            n = self._threads
        for _ in range(n):
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
            if job.key is not None:
                self.last = job
            self._vacate(job)  # forsaken: the lane went on with another job already, on another thread
            late = job.abandoned and not job.forsaken
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
            with self._mu:
                if self._stopped:  # stopped while it ran (a forsaken job's thread, back from its GPU): it ends
                    return
                self._spare += 1
