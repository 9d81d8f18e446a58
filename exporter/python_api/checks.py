"""The Python API's argument checks: a bad argument is a ValueError or TypeError of one line naming it;
the CLI tools run the same checks on their flags."""

from __future__ import annotations

import math

from exporter.core.options import Settings

MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0  # seconds between samples or polls
MAX_TIMEOUT = 7 * 86400.0  # a wait longer than a week is a mistake, not a plan


def short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_number(value: object, name: str, lo: float, hi: float, *, lo_open: bool = False,
                 what: str = "a number") -> float:
    """``value`` as a finite float in ``lo..hi`` (``(lo, hi]`` with ``lo_open``), else ValueError/TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__} {short_repr(value)}")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and lo <= v <= hi) or (lo_open and v == lo):
        low = f"{'more than' if lo_open else 'at least'} {lo:g}"
        bounds = low if hi == math.inf else f"{low} and at most {hi:g}"
        raise ValueError(f"{name}: expected {what} {bounds}, got {short_repr(value)}")
    return v


def check_count(value: object, name: str = "count") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a whole number of GPUs, got {type(value).__name__} {short_repr(value)}")
    if value < 1:
        raise ValueError(f"{name}: expected at least 1 GPU, got {short_repr(value)}")
    return value


def check_min_free(value: object) -> float:
    return 0.0 if value is None else check_number(value, "min_free_bytes", 0, math.inf, what="bytes")


def check_max_utilization(value: object) -> float:
    return check_number(value, "max_utilization", 0, 1, what="a ratio")


def check_interval(value: object, name: str = "interval") -> float:
    return check_number(value, name, MIN_INTERVAL, MAX_INTERVAL, what="seconds")


def check_timeout(value: object, name: str = "timeout") -> float:
    return check_number(value, name, 0, MAX_TIMEOUT, what="seconds")


def settings_for(backend: object) -> Settings:
    """The settings of the Python API: ``backend`` and the exporter's defaults (no environment)."""
    from exporter import backends

    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a string such as 'auto' or 'nvml', got {type(backend).__name__}")
    known = backends.names()
    parts = [p.strip().lower() for p in backend.split(",")]
    if backend.strip().lower() != "auto" and (not all(parts) or any(p not in known for p in parts)):
        raise ValueError(f"backend: unknown backend {short_repr(backend)}; expected auto, or one or more of "
                         f"{', '.join(known)} separated by commas")
    return Settings(backend=",".join(parts))
