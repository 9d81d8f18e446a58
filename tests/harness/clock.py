"""The one fake clock of the tests (Node Problem Detector's injected clock): time moves only when a test
(or the code under test, by waiting) moves it, so nothing sleeps and timing holds on a loaded machine.

It is every shape of clock the code takes: a callable (``clock=`` of the leader elector, the simulated
backend, the Kubernetes client builder's refresh throttle: ``time.monotonic``'s place) and the watch's
``Clock`` (``monotonic()`` and ``wait(stop, seconds)``). A wait is recorded in ``waits``, moves the
time on and returns at once; after ``park_after`` waits the waiting thread parks until ``stop`` is set
(``parked`` says so), so a test reads a finished run of a background loop.
"""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, now: float = 1000.0, park_after: int = 1000) -> None:
        self.now = float(now)
        self.waits: list[float] = []
        self.park_after = park_after
        self.parked = threading.Event()

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """The watch's wait: recorded, the time moved on; whether ``stop`` is set (parks after ``park_after``)."""
        self.waits.append(seconds)
        self.now += seconds
        if len(self.waits) >= self.park_after:
            self.parked.set()
            return stop.wait(60)
        return stop.is_set()
