"""What bounds the work one client can cause: the failed-login limiter per address, the web
config's ``rate_limit`` bucket, the answering lanes (threads, bounded), and the connection cap.

The I/O loop (``server.py``) decides when to use them; nothing here touches a socket.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

FAILURE_BURST = 10  # failed logins an address may make at once ...
FAILURE_REFILL_S = 1.0  # ... then one more per this many seconds
LANE_IDLE_S = 2.0  # a lane's thread with nothing to do for this long ends (a burst leaves no threads behind)


class FailureLimiter:
    """Failed basic-auth attempts per client address: a token bucket each, bounded in memory.

    A check takes its token *before* bcrypt runs (``charge``) and gives it back when the credentials
    pass (``refund``): concurrent guesses from one address cannot all get a check.
    """

    def __init__(self, burst: int = FAILURE_BURST, refill_s: float = FAILURE_REFILL_S) -> None:
        self.burst, self.refill_s = burst, refill_s
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self._lock = threading.Lock()

    def _tokens(self, addr: str, now: float) -> float:
        tokens, at = self._buckets.get(addr, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_s)

    def charge(self, addr: str) -> int:
        """Take one attempt: 0 when ``addr`` may try now, else whole seconds to wait (nothing taken)."""
        with self._lock:
            now = time.monotonic()
            tokens = self._tokens(addr, now)
            if tokens < 1:
                return max(1, math.ceil((1 - tokens) * self.refill_s))
            if len(self._buckets) > 10000:  # many addresses: forget the ones back at a full bucket
                self._buckets = {a: v for a, v in self._buckets.items() if self._tokens(a, now) < self.burst}
                if len(self._buckets) > 10000:
                    self._buckets.clear()
            self._buckets[addr] = (tokens - 1, now)
        if tokens - 1 < 1:
            log.warning("basic auth: %d failed attempts from %s; its next attempts get 429 for a while",
                        self.burst, addr)
        return 0

    def refund(self, addr: str) -> None:
        with self._lock:
            now = time.monotonic()
            if addr in self._buckets:
                self._buckets[addr] = (min(float(self.burst), self._tokens(addr, now) + 1), now)


class RateBucket:
    """The web config's ``rate_limit``: one token per ``interval`` seconds, at most ``burst`` saved."""

    def __init__(self, interval: float, burst: int) -> None:
        self.interval, self.burst = interval, burst
        self._tokens, self._at = float(burst), time.monotonic()

    def allow(self) -> bool:  # the I/O thread only
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.interval)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class ThreadLane:
    """At most ``limit`` daemon threads, started when needed and ended after ``LANE_IDLE_S`` without
    a job, taking jobs in arrival order.

    ``pending`` counts jobs waiting or running: the work lane's slots. Daemon threads, so that a
    route stuck in a driver call never holds the process at exit.
    """

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit = name, limit
        self.pending = 0
        self._threads = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self.pending += 1
            start = self.pending > self._threads and self._threads < self.limit
            if start:
                self._threads += 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._run, name=f"http-{self.name}", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=LANE_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self.pending < self._threads:  # more threads than jobs: this one ends
                        self._threads -= 1
                        return
                continue
            try:
                job()
            except Exception:  # a bug in one job must not end the lane
                log.exception("HTTP %s lane: a job failed", self.name)
            finally:
                with self._lock:
                    self.pending -= 1


FD_RESERVE = 64  # descriptors left for the rest of the process: logs, the driver, the kubelet, the selector
PROBE_OPEN = 64  # connections the probe listener (``--probe-port``) holds at most, on top of the cap


def connection_cap(max_connections: int, soft_limit: int | None = None) -> int:
    """Connections the server holds open at most, in every state (waiting for a request, being
    answered, writing, closing; issue 36: only the waiting ones used to count, and idle plus
    malformed-request connections took the process to its file limit). Derived from the soft
    ``RLIMIT_NOFILE``: what is left after ``FD_RESERVE`` and the probe listener's ``PROBE_OPEN``."""
    if soft_limit is None:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            soft_limit = 1 << 20 if soft == resource.RLIM_INFINITY else soft
        except (ImportError, OSError, ValueError):
            soft_limit = 1024
    return max(16, min(max(1024, 4 * max_connections), soft_limit - FD_RESERVE - PROBE_OPEN))
