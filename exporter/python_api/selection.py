"""Choosing GPUs: which qualify now (:func:`check_availability`, :func:`select_gpus`) or within a
timeout (:func:`wait_for_availability`), by one rule (:func:`assess`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from exporter.core.engine import Engine
from exporter.core.views import format_bytes
from exporter.python_api.checks import (
    check_count,
    check_interval,
    check_max_utilization,
    check_min_free,
    check_timeout,
    settings_for,
)
from exporter.python_api.sessions import read, session
from exporter.python_api.status import GpuStatus, statuses

DEFAULT_MAX_UTILIZATION = 0.5
# The memory floor of select_gpus/check_availability/wait_for_availability and of `pick --min-free`:
# one default for both (issue 28); None or 0 asks for no floor.
DEFAULT_MIN_FREE_BYTES = 8 * 2**30


@dataclass(frozen=True)
class Availability:
    """Whether ``count`` GPUs qualify now.

    ``gpus``: the best ``count`` qualifying GPUs (by score) when ``ok``, else every GPU that
    qualifies. ``reason``: one line saying what was found or what is missing. ``statuses``:
    every GPU that was looked at, best first.
    """

    ok: bool
    gpus: list[int]
    reason: str
    statuses: list[GpuStatus] = field(default_factory=list)


class InsufficientGpus(RuntimeError):
    """Fewer GPUs qualify than were asked for; the message says what is missing."""

    def __init__(self, availability: Availability) -> None:
        super().__init__(availability.reason)
        self.availability = availability


def why_not(s: GpuStatus, min_free: float, max_util: float) -> list[str]:
    """Why a GPU does not qualify; empty when it does."""
    if not s.up:
        return ["is down (lost or unreadable)"]
    out = []
    if s.memory_free_bytes is None and min_free > 0:
        out.append("does not report free memory")
    elif s.memory_free_bytes is not None and s.memory_free_bytes < min_free:
        out.append(f"has {format_bytes(s.memory_free_bytes)} free (needs {format_bytes(min_free)})")
    if s.utilization_ratio is None and max_util < 1:
        out.append("does not report utilisation")
    elif s.utilization_ratio is not None and s.utilization_ratio > max_util:
        out.append(f"is {s.utilization_ratio * 100:.0f}% busy (max {max_util * 100:.0f}%)")
    return out


def assess(found: Sequence[GpuStatus], count: int, min_free: float, max_util: float,
           waited: float | None = None) -> Availability:
    """The one selection rule: qualifying GPUs ranked by score (then index)."""
    ranked = sorted(found, key=lambda s: (-s.score, s.index))
    rejected = {s.index: why_not(s, min_free, max_util) for s in ranked}
    good = [s.index for s in ranked if not rejected[s.index]]
    if len(good) >= count:
        chosen = good[:count]
        return Availability(True, chosen, f"{len(good)} of {len(ranked)} GPUs qualify; best {count}: "
                            + ",".join(map(str, chosen)), list(ranked))
    if len(ranked) < count:
        return Availability(False, good, f"need {count} GPUs but this machine has {len(ranked)}", list(ranked))
    limits = ([f">= {format_bytes(min_free)} free"] if min_free > 0 else []) + \
        ([f"<= {max_util * 100:.0f}% utilisation"] if max_util < 1 else [])
    after = f" after waiting {waited:.0f} s" if waited else ""
    reasons = "; ".join(f"gpu {i} {' and '.join(r)}" for i, r in rejected.items() if r)
    return Availability(False, good, f"need {count} GPUs{' with ' + ' and '.join(limits) if limits else ''}, "
                        f"found {len(good)}{after}: {reasons}", list(ranked))


def check_availability(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES,
                       max_utilization: float = DEFAULT_MAX_UTILIZATION, *, backend: str = "auto") -> Availability:
    """Whether ``count`` GPUs each have ``min_free_bytes`` free and at most ``max_utilization`` busy, now."""
    n, free, util = check_count(count), check_min_free(min_free_bytes), check_max_utilization(max_utilization)
    with session(settings_for(backend)) as engine:
        return assess([s for _, s in statuses(read(engine))], n, free, util)


def select_gpus(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES,
                max_utilization: float = DEFAULT_MAX_UTILIZATION, *, backend: str = "auto") -> list[int]:
    """The indices of the best ``count`` qualifying GPUs, best first (for CUDA_VISIBLE_DEVICES with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); raises :class:`InsufficientGpus` saying what is missing."""
    a = check_availability(count, min_free_bytes, max_utilization, backend=backend)
    if not a.ok:
        raise InsufficientGpus(a)
    return a.gpus


Report = Callable[[Availability, float, float], None]  # (availability, next sleep, seconds left)


def wait(engine: Engine, count: int, min_free: float, max_util: float, timeout: float, interval: float,
         report: Report | None = None, on_check: Callable[[Availability], None] | None = None) -> Availability:
    """Check every ``interval`` seconds until ``count`` GPUs qualify or ``timeout`` seconds have passed.

    Never sleeps past the deadline: the last check is at the deadline. Returns at once when the
    machine has fewer GPUs than ``count`` (waiting cannot help).
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        found = [s for _, s in statuses(read(engine))]
        now = time.monotonic()
        a = assess(found, count, min_free, max_util, waited=(now - start) if now >= deadline and timeout else None)
        if on_check is not None:
            on_check(a)
        left = deadline - now
        if a.ok or len(found) < count or left <= 0:
            return a
        pause = min(interval, left)
        if report is not None:
            report(a, pause, left)
        time.sleep(pause)  # the wait between polls is the feature


def wait_for_availability(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES, timeout: float = 300.0,
                          interval: float = 30.0, max_utilization: float = DEFAULT_MAX_UTILIZATION, *,
                          backend: str = "auto") -> Availability:
    """:func:`check_availability` every ``interval`` seconds until it is ok or ``timeout`` seconds
    have passed; returns the last answer at the deadline at the latest."""
    n, free, util = check_count(count), check_min_free(min_free_bytes), check_max_utilization(max_utilization)
    t, i = check_timeout(timeout), check_interval(interval)
    with session(settings_for(backend)) as engine:
        return wait(engine, n, free, util, t, i)
