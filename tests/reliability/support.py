"""Helpers of the reliability suite: result records, /proc figures, a keep-alive load client, logs."""

from __future__ import annotations

import http.client
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from tests.harness.poll import wait_until

RESULTS_DIR = Path(__file__).resolve().parent / ".results"
MiB = 2**20

# What Prometheus 2.x sends on a scrape (it asks for gzip and prefers OpenMetrics when enabled).
PROM_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
}


@dataclass
class Result:
    """One row of docs/reliability.md: set by the test, written by the ``result`` fixture."""

    scenario: str = ""
    done: str = ""
    happened: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)  # e.g. (scrapes, RSS MiB)
    curve_label: str = ""
    see_also: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "done": self.done, "happened": self.happened,
                "figures": self.figures, "curve": self.curve, "curve_label": self.curve_label,
                "see_also": self.see_also}


# ---- /proc -------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` (bytes) and ``Threads`` of a process, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            out["rss"] = int(value.split()[0]) * 1024
        elif key == "Threads":
            out["threads"] = int(value)
    return out


def rss_mib(pid: int) -> float:
    return round(proc_status(pid)["rss"] / MiB, 2)


def threads(pid: int) -> int:
    return proc_status(pid)["threads"]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler:
    """Samples a process' thread count and RSS every ``every`` seconds in a daemon thread."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid = pid
        self.every = every
        self.max_threads = 0
        self.max_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                st = proc_status(self.pid)
            except OSError:
                return
            self.max_threads = max(self.max_threads, st["threads"])
            self.max_rss = max(self.max_rss, st["rss"])
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- numbers -------------------------------------------------------------------------------------


def percentile(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of a non-empty sequence."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def ms(x: float) -> float:
    return round(x * 1000, 2)


def median_slope_per(points: Sequence[tuple[float, float]], per: float) -> float:
    """The median of the slopes between consecutive (x, y) points, scaled to ``per`` units of x.

    Growth that goes on (a leak) rises in most intervals; a one-time step (an allocator arena
    growing once when two answers overlap) rises in one, which the median ignores and the
    least-squares slope does not."""
    slopes = sorted((y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in pairwise(points) if x2 > x1)
    if not slopes:
        return 0.0
    mid = len(slopes) // 2
    return (slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2) * per


# ---- HTTP load -----------------------------------------------------------------------------------


@dataclass
class LoadFigures:
    requests: int
    errors: list[str]
    latencies: list[float]

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def max(self) -> float:
        return max(self.latencies)


def scrape_once(conn: http.client.HTTPConnection, path: str = "/metrics",
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn.request("GET", path, headers=PROM_HEADERS if headers is None else headers)
    resp = conn.getresponse()
    body = resp.read()
    if resp.will_close:
        conn.close()
    return resp.status, body


def run_scrapers(port: int, scrapers: int, seconds: float, think: float, path: str = "/metrics") -> LoadFigures:
    """``scrapers`` threads, each on its own keep-alive connection, scraping until ``seconds`` pass.

    Each waits ``think`` seconds between scrapes (a paced client: 200 threads in one Python
    process would otherwise measure our own GIL, not the server). Every answer that is not a
    complete 200 is an error.
    """
    stop = threading.Event()
    lock = threading.Lock()
    lat: list[float] = []
    errors: list[str] = []
    count = [0]
    start = threading.Barrier(scrapers + 1)

    def one(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        bad: list[str] = []
        start.wait()
        stop.wait(think * i / scrapers)  # spread the first requests over one think time
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                status, body = scrape_once(conn, path)
                if status != 200 or not body:
                    bad.append(f"HTTP {status}")
                else:
                    mine.append(time.perf_counter() - t0)
            except (OSError, http.client.HTTPException) as exc:
                bad.append(type(exc).__name__)
                conn.close()
            stop.wait(think)
        conn.close()
        with lock:
            lat.extend(mine)
            errors.extend(bad)
            count[0] += len(mine) + len(bad)

    workers = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(scrapers)]
    for w in workers:
        w.start()
    start.wait()
    stop.wait(seconds)
    stop.set()
    for w in workers:
        w.join(60)
    return LoadFigures(count[0], errors, lat)


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Seconds until the peer closes ``sock`` (recv returns b"" or fails); fails after ``timeout``."""
    t0 = time.monotonic()
    sock.settimeout(0.05)

    def closed() -> bool:
        while True:  # drain an answer (e.g. a 408 or 503) until EOF or nothing more for now
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not data:
                return True

    wait_until(closed, timeout, interval=0.02, what="the server to close the connection")
    return time.monotonic() - t0


# ---- logs ----------------------------------------------------------------------------------------


def count_lines(log: str, needle: str) -> int:
    return sum(1 for line in log.splitlines() if needle in line)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0
