"""Recording GPU use over an interval: :class:`Monitor` (``gpu-exporter record`` in-process) and its
:class:`Recording`, whose per-GPU series are the field table's rows with a ``record``."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from exporter.core.engine import Engine
from exporter.core.readings import GpuReading
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, Field, GpuSource, iso_time, numbered
from exporter.python_api.checks import check_interval, settings_for, short_repr
from exporter.python_api.rows import rows_dataclass
from exporter.python_api.sessions import GpuUnavailable, session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Series:
    """One reading of one GPU over a recording: a value per sample (``None``: not read) and its
    min, max and mean over the samples that have one (``None`` when none has)."""

    samples: tuple[float | None, ...]

    @property
    def _values(self) -> list[float]:
        return [v for v in self.samples if v is not None]

    @property
    def min(self) -> float | None:
        return min(self._values, default=None)

    @property
    def max(self) -> float | None:
        return max(self._values, default=None)

    @property
    def mean(self) -> float | None:
        vs = self._values
        return sum(vs) / len(vs) if vs else None

    def scaled(self, factor: float, digits: int = 3) -> dict[str, float | None]:
        """min/max/mean times ``factor``, rounded (the record JSON's units)."""
        out: dict[str, float | None] = {}
        for k, v in (("min", self.min), ("max", self.max), ("mean", self.mean)):
            out[k] = None if v is None else round(v * factor, digits)
        return out


# what a recording samples: the field table's rows with a ``record`` (read as the JSON views read them: SI,
# unrounded)
RECORDED: tuple[Field, ...] = tuple(f for f in FIELDS if f.record is not None)


@rows_dataclass(RECORDED, after="name", row_type=lambda f: Series)
class GpuRecording:
    """One GPU of a :class:`Recording`, in SI units: a :class:`Series` for each field the table's rows
    record (``utilization_ratio``, ``memory_used_bytes``, ``memory_used_ratio``, ``temperature_celsius``,
    ``power_watts`` ...). ``lost``: it was lost (``gpu_up 0``) or gone from the device list in at least
    one sample; those samples are ``None``, never 0."""

    index: int
    uuid: str
    name: str | None
    # the recorded rows, typed for type checkers (a row added later is a Series too)
    utilization_ratio: Series
    memory_used_bytes: Series
    memory_used_ratio: Series
    temperature_celsius: Series
    power_watts: Series
    energy_joules: float | None  # counter difference over the run; None when unsupported or reset
    lost: bool = False
    lost_at_seconds: float | None = None  # seconds since start of the first sample that found it lost
    lost_reason: str | None = None
    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Series: ...  # a recorded row the class does not annotate


@dataclass(frozen=True)
class Recording:
    """GPU use over an interval: what ``gpu-exporter record`` writes, as objects.

    ``timestamps``: seconds since the start, one per sample. ``command`` and ``exit_code`` are
    those of ``gpu-exporter record``; a :class:`Monitor` has no command (``()``, ``None``).
    """

    started: float  # Unix time
    duration_seconds: float
    interval_seconds: float
    timestamps: tuple[float, ...]
    gpus: Mapping[int, GpuRecording]
    command: tuple[str, ...] = ()
    exit_code: int | None = None

    @property
    def sample_count(self) -> int:
        return len(self.timestamps)

    @property
    def lost(self) -> list[int]:
        """Indices of the GPUs lost during the recording."""
        return [i for i, g in sorted(self.gpus.items()) if g.lost]

    def to_dict(self) -> dict[str, Any]:
        """Exactly the JSON document ``gpu-exporter record -o`` writes (legacy units: %, MiB, C, W)."""
        stats: dict[str, Any] = {}
        for number, g in sorted(self.gpus.items()):
            gpu: dict[str, Any] = {"name": g.name, "uuid": g.uuid}
            for f in RECORDED:
                assert f.record is not None
                series: Series = getattr(g, f.name)
                gpu[f.record.key] = series.scaled(f.record.times)
                if f.record.samples:
                    gpu[f.record.key]["samples"] = [None if v is None else round(v * f.record.times, 3)
                                                    for v in series.samples]
            stats[str(number)] = {
                **gpu,
                "energy_joules": None if g.energy_joules is None else round(g.energy_joules, 3),
                "lost": g.lost,
                "lost_at_seconds": None if g.lost_at_seconds is None else round(g.lost_at_seconds, 3),
                "lost_reason": g.lost_reason,
            }
        return {
            "command": list(self.command),
            "exit_code": self.exit_code,
            "started": iso_time(self.started),
            "interval_seconds": self.interval_seconds,
            "monitoring_duration_seconds": round(self.duration_seconds, 3),
            "sample_count": self.sample_count,
            "gpu_stats": stats,
            "timestamps": [round(t, 3) for t in self.timestamps],
        }


class _Track:
    """The samples of one GPU (by backend and UUID, so a renumbered GPU is not mixed up)."""

    def __init__(self, number: int, uuid: str, name: str | None, pad: int) -> None:
        self.number, self.uuid, self.name = number, uuid, name
        self.values: dict[str, list[float | None]] = {f.name: [None] * pad for f in RECORDED}
        self.energy_first: float | None = None
        self.energy_last: float | None = None
        self.lost_at: float | None = None
        self.lost_reason: str | None = None

    def add(self, g: GpuReading | None, t: float) -> None:
        if g is None or not g.up:
            if self.lost_at is None:
                self.lost_at = t
                self.lost_reason = "gone from the device list" if g is None else g.up_reason or "unreadable"
            for values in self.values.values():
                values.append(None)
            return
        src = GpuSource("", self.number, g)
        for f in RECORDED:
            self.values[f.name].append(f.read(src))
        if g.energy_joules is not None:
            if self.energy_first is None:
                self.energy_first = g.energy_joules
            self.energy_last = g.energy_joules

    def result(self) -> GpuRecording:
        energy = None
        if self.energy_first is not None and self.energy_last is not None and self.energy_last >= self.energy_first:
            energy = self.energy_last - self.energy_first  # a counter that went backwards (driver reload): None
        s = {k: Series(tuple(v)) for k, v in self.values.items()}
        return GpuRecording(index=self.number, uuid=self.uuid, name=self.name, **s, energy_joules=energy,
                            lost=self.lost_at is not None, lost_at_seconds=self.lost_at, lost_reason=self.lost_reason)


class Recorder:
    """Collects samples (thread-safe) and aggregates them into a :class:`Recording`."""

    def __init__(self, only: Iterable[int] | None = None) -> None:
        self._lock = threading.Lock()
        self.only = None if only is None else set(only)
        self.times: list[float] = []
        self._tracks: dict[tuple[str, str], _Track] = {}

    def add(self, snap: Snapshot, t: float) -> None:
        """One sample taken ``t`` seconds after the start."""
        with self._lock:
            n = len(self.times)
            seen: set[tuple[str, str]] = set()
            for number, backend, g in numbered(snap):
                key = (backend, g.uuid)
                track = self._tracks.get(key)
                if track is None:
                    if self.only is not None and number not in self.only:
                        continue
                    used = {tr.number for tr in self._tracks.values()}
                    if number in used:  # a new GPU took a lost one's index: keep both apart
                        number = max(used) + 1
                    track = self._tracks[key] = _Track(number, g.uuid, g.name, n)
                track.name = g.name or track.name
                track.add(g, t)
                seen.add(key)
            for key, track in self._tracks.items():
                if key not in seen:
                    track.add(None, t)
            self.times.append(t)

    def numbers(self) -> list[int]:
        with self._lock:
            return sorted(tr.number for tr in self._tracks.values())

    def latest(self) -> list[tuple[int, float | None, float | None]]:
        """(index, utilisation ratio, power W) of each GPU at the last sample."""
        with self._lock:
            return [(tr.number, tr.values["utilization_ratio"][-1], tr.values["power_watts"][-1])
                    for tr in sorted(self._tracks.values(), key=lambda tr: tr.number) if self.times]

    def result(self, started: float, duration: float, interval: float, command: Sequence[str] = (),
               exit_code: int | None = None) -> Recording:
        with self._lock:
            gpus = {tr.number: tr.result() for tr in self._tracks.values()}
            return Recording(started=started, duration_seconds=duration, interval_seconds=interval,
                             timestamps=tuple(self.times), gpus=gpus, command=tuple(command), exit_code=exit_code)


def sample(engine: Engine, recorder: Recorder, t0: float) -> bool:
    """Take one sample into ``recorder``; False (and a warning) when the collection failed."""
    snap = engine.scrape()
    failed = [n for n, st in snap.stats.items() if not st.success]
    if failed:
        log.warning("sample skipped: collection failed for backend %s", ", ".join(failed))
        return False
    recorder.add(snap, time.monotonic() - t0)
    return True


def _indices(gpus: object) -> set[int] | None:
    if gpus is None:
        return None
    if isinstance(gpus, str | bytes) or not isinstance(gpus, Iterable):
        raise TypeError(f"gpus: expected a list of GPU indices or None, got {type(gpus).__name__}")
    out = set()
    for i in gpus:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"gpus: expected GPU indices (integers), got {type(i).__name__} {short_repr(i)}")
        if i < 0:
            raise ValueError(f"gpus: expected GPU indices >= 0, got {i}")
        out.add(i)
    if not out:
        raise ValueError("gpus: expected at least one GPU index, or None for every GPU")
    return out


class Monitor:
    """Samples the GPUs every ``interval`` seconds on a background thread (``gpu-exporter record``
    in-process). Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    ``gpus``: the indices to record (default every GPU). One sample is taken at :meth:`start`
    and one at :meth:`stop`, so even a short run has a first and a last reading.
    """

    def __init__(self, interval: float = 1.0, gpus: Iterable[int] | None = None, backend: str = "auto") -> None:
        self.interval = check_interval(interval)
        self.gpus = _indices(gpus)
        self._settings = settings_for(backend)
        self.recording: Recording | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exit: contextlib.ExitStack | None = None
        self._engine: Engine | None = None
        self._recorder = Recorder(self.gpus)
        self._t0 = 0.0
        self._started = 0.0

    def start(self) -> Monitor:
        """Initialise the backend (shared), take the first sample, start sampling; returns ``self``."""
        with self._lock:
            if self._exit is not None or self.recording is not None:
                raise RuntimeError("this Monitor was already started; create a new one")
            with contextlib.ExitStack() as stack:
                engine = stack.enter_context(session(self._settings))
                self._engine = engine
                self._started, self._t0 = time.time(), time.monotonic()
                if not sample(engine, self._recorder, self._t0):
                    raise GpuUnavailable("the first collection failed (see the warning logged)")
                missing = sorted((self.gpus or set()) - set(self._recorder.numbers()))
                if missing:
                    have = ", ".join(map(str, self._all_indices(engine))) or "none"
                    raise ValueError(f"gpus: no GPU {', '.join(map(str, missing))} on this machine "
                                     f"(indices: {have})")
                self._exit = stack.pop_all()
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()
        return self

    @staticmethod
    def _all_indices(engine: Engine) -> list[int]:
        return [n for n, _, _ in numbered(engine.scrape())]

    def _run(self) -> None:
        next_t = self._t0 + self.interval
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._sample()
            next_t += self.interval
            if next_t <= time.monotonic():  # a slow collection: skip the missed ticks, keep the rhythm
                next_t = time.monotonic() + self.interval

    def _sample(self) -> None:
        assert self._engine is not None
        try:
            sample(self._engine, self._recorder, self._t0)
        except Exception as exc:  # the monitor keeps sampling whatever one collection does
            log.warning("sample failed: %s: %s", type(exc).__name__, exc)
            log.debug("sample failed", exc_info=True)

    def stop(self) -> Recording:
        """Stop sampling, take the last sample, release the backend; returns the :class:`Recording`
        (also kept in :attr:`recording`). Calling it again returns the same recording."""
        with self._lock:
            if self.recording is not None:
                return self.recording
            if self._exit is None or self._thread is None:
                raise RuntimeError("this Monitor was not started")
            self._stop.set()
            self._thread.join()
            try:
                self._sample()
                duration = time.monotonic() - self._t0
            finally:
                self._exit.close()
            self.recording = self._recorder.result(self._started, duration, self.interval)
            return self.recording

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
