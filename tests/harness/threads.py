"""The threads of a lane (exporter/core/lane.py), by the names it gives them: ``name``, ``name-2``, ..."""

from __future__ import annotations

import threading


def of_lane(thread: str, lane: str) -> bool:
    """Whether the thread named ``thread`` is one of lane ``lane``'s."""
    return thread == lane or thread.startswith(f"{lane}-")


def lane_threads(lane: str) -> list[threading.Thread]:
    """The running threads of lane ``lane``."""
    return [t for t in threading.enumerate() if of_lane(t.name, lane)]
