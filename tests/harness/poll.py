"""Polling with a timeout: the only way tests wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(fn: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.05, what: str = "") -> T:
    """Call ``fn`` until it returns a truthy value; return it, or fail after ``timeout`` s.

    Exceptions from ``fn`` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_val: object = None
    while True:
        try:
            val = fn()
            if val:
                return val
            last_val = val
        except Exception as exc:  # noqa: BLE001 - polling treats errors as "not yet"
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f"last error: {last_exc!r}" if last_exc else f"last value: {last_val!r}"
            raise AssertionError(f"timed out after {timeout}s waiting for {what or fn!r}; {detail}")
        time.sleep(interval)
