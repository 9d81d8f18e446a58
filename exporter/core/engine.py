"""Collection engine: runs the backends, shares one collection between concurrent readers.

It returns a :class:`~exporter.core.snapshot.Snapshot`, never bytes: ``/metrics`` renders and
caches the exposition of a snapshot (exporter/serve/http.py), the JSON API and the Python API
(exporter/python_api/) read the snapshot itself. Two modes:

- collect on scrape (``COLLECTION_INTERVAL=0``, the default): the first scrape starts a
  collection on the worker thread; scrapes arriving meanwhile join it. Everyone gets the
  same snapshot object (so the HTTP route renders it once). A scrape waits at most
  ``collection_timeout`` and then answers with the GPUs read so far plus
  ``gpu_exporter_collector_success 0`` and a ``timeout`` error.
  A scrape arriving within ``cache_ttl`` (default 1 s) of the end of the last collection
  reuses it: NVML's utilisation is itself an average over 1/6-1 s, so a second
  Prometheus of an HA pair loses nothing, and a burst of scrapers costs one collection.
- background (``COLLECTION_INTERVAL>0``): a thread collects every interval; scrapes get
  the last snapshot. Samples never carry timestamps.

Backends with a ``min_interval`` (CLI-based, e.g. rocm-smi) are re-read at most that often.

Each backend's collection runs on a lane of its own (exporter/core/lane.py), which the worker
waits on. The backend reads its GPUs on that lane's thread, each inside its GPU's lane's job; once the
thread has been in one GPU's call for ``STAGGER_S``, the worker leaves it to that GPU (the lane
forsakes the job) and starts the collection again on another of the lane's threads, which takes the
GPU's job over and waits for it until ``--call-deadline`` (then that GPU is published ``hung``,
exporter/backends/base.py) while it reads the others. A call about no GPU (init, the device count) that
overruns the deadline (init: the collection timeout less one call deadline, as a driver may take
seconds to load) makes
the backend **stalled**: its last known GPUs are published ``gpu_up 0`` with the cause, readiness
fails naming the call, other backends are collected as usual, and no new collection of it starts
while the call is outstanding. The first collection after the call returns reads it again. A CLI
backend reports a run it had to kill the same way (``BackendError`` kind ``stalled``). An init that
``--backend auto`` started at start-up and that overran the same deadline is adopted with its lane
(:meth:`Engine.adopt_init`) and stalls the backend the same way.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from exporter.core import xid
from exporter.core.errors import STALLED, BackendError, BackendUnavailable
from exporter.core.gpu_health import HealthTracker
from exporter.core.lane import STAGGER_S, Job, Lane, LaneBusy
from exporter.core.options import DEFAULTS, FieldFilter
from exporter.core.readings import Collection, GpuReading, HostInfo, MigReading
from exporter.core.snapshot import BackendStats, LabelHook, MigLabelHook, Snapshot

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

FamilySource = Callable[[], Iterable["Metric"]]


def init_deadline(collection_timeout: float, call_deadline: float) -> float:
    """Seconds a backend's init may take before the backend is stalled: what a scrape can wait, less one
    call deadline (a real driver may take seconds to load), and never less than a call deadline."""
    return max(call_deadline, collection_timeout - call_deadline)


class PendingInit(Protocol):
    """A backend's init still running on its lane (exporter.backends.HungInit)."""

    lane: Lane
    job: Job

    def forsake(self) -> None: ...


class Backend(Protocol):
    """What the engine needs of a backend (:class:`exporter.backends.base.Backend` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def min_interval(self) -> float: ...  # seconds between real reads (CLI backends); 0: every collection

    def init(self) -> None: ...

    def collect(self, out: Collection) -> None: ...

    def count_bus(self, out: Collection) -> None: ...  # after collect: its GPUs on the PCI bus

    def drain_errors(self) -> dict[str, int]: ...

    def reset(self) -> None: ...

    def shutdown(self) -> None: ...

    # optional: node_call(thread) -> (call, since) | None, gpu_call(thread) -> (gpu, call, since) | None


@dataclass
class _Flight:
    started: float
    collections: list[Collection] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    result: Snapshot | None = None
    timed_out: bool = False
    current: str | None = None  # backend being collected


class Engine:
    def __init__(
        self,
        backends: Sequence[Backend],
        host: HostInfo,
        fields: FieldFilter,  # what /metrics and the JSON views publish (they read it here)
        collection_interval: float = DEFAULTS.collection_interval,
        collection_timeout: float = DEFAULTS.collection_timeout,
        cache_ttl: float = DEFAULTS.cache_ttl,
        call_deadline: float = DEFAULTS.call_deadline,
        xid_severity: Mapping[int | str, str] | None = None,
    ) -> None:
        self.backends: tuple[Backend, ...] = tuple(backends)
        self.host = host
        self.fields = fields
        self.interval = collection_interval
        self.timeout = collection_timeout
        self.cache_ttl = cache_ttl
        self.call_deadline = call_deadline
        # each GPU's health state and cause, XIDs and ECC rated by NVIDIA's catalogue and the overrides
        self.health = HealthTracker(xid.load_overrides(xid_severity))
        # each backend's collection runs on its lane: a call about no GPU that hangs stalls that backend only
        self._lanes: dict[str, Lane] = {b.name: Lane(f"collect-{b.name}") for b in backends}
        self._stalled: dict[str, str] = {}  # backend -> why, from its stall until a collection succeeds
        self._probing: dict[str, PendingInit] = {}  # backend -> its init as --backend auto started it, running
        self._last_done = 0.0
        self.stats: dict[str, BackendStats] = {b.name: BackendStats() for b in backends}
        self.gpu_labels: LabelHook | None = None
        self.mig_labels: MigLabelHook | None = None
        self.family_sources: list[FamilySource] = []
        # called with every reading of a finished collection, before its snapshot is built
        self.observers: list[Callable[[list[GpuReading]], None]] = []
        self._initialised: dict[str, bool] = {b.name: False for b in backends}
        self._failing: dict[str, str] = {}
        self._cached: dict[str, tuple[float, Collection]] = {}
        self._known: dict[str, list[GpuReading]] = {}  # backend -> GPUs of its last good collection
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._flight: _Flight | None = None
        self._pending = False
        self._last: Snapshot | None = None
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._work, name="collector", daemon=True)
        self._worker.start()
        self._ticker: threading.Thread | None = None
        if self.interval > 0:
            self._ticker = threading.Thread(target=self._tick, name="collector-ticker", daemon=True)
            self._ticker.start()

    # --- public ----------------------------------------------------------------------------

    def mark_initialised(self, name: str) -> None:
        """The backend's init() already ran (``--backend auto`` probed it)."""
        self._initialised[name] = True

    def adopt_init(self, name: str, init: PendingInit) -> None:
        """The backend's init(), which ``--backend auto`` probed, has not returned within its deadline and
        still runs as ``init.job`` on ``init.lane``: the engine takes that lane over as the backend's. The
        backend is stalled (readiness names init) until the init returns, as when an init the engine
        started hangs; the first collection after that uses the init's outcome (initialised, or init
        again). Stopped before it returns, the engine forsakes it (shut down when it returns)."""
        self._lanes[name].stop()
        self._lanes[name] = init.lane
        self._probing[name] = init
        self._stalled[name] = f"init did not return within {init_deadline(self.timeout, self.call_deadline):g} s"

    def scrape(self) -> Snapshot:
        """The snapshot to serve now (collect on scrape, or the last background one). Readers of one
        collection get the same object, so a renderer can key its cache on it."""
        if self.interval > 0:
            last = self._last
            if last is not None:
                return last
            flight = self._join_or_start()  # before the first background cycle has finished
        else:
            last = self._last
            if last is not None and time.monotonic() - self._last_done < self.cache_ttl:
                return last  # a collection that just finished: NVML averages over ~1 s anyway
            flight = self._join_or_start()
        return self._wait(flight)

    def cached(self) -> Snapshot | None:
        """What :meth:`scrape` would return now without waiting for a collection, or None (the HTTP
        server answers from it on its I/O thread, and hands the scrape to a thread otherwise)."""
        last = self._last
        if last is None or (self.interval <= 0 and time.monotonic() - self._last_done >= self.cache_ttl):
            return None
        return last

    def ready(self, max_age: float, wait: bool = True) -> tuple[bool, str] | None:
        """Readiness: every backend initialised and collected successfully within ``max_age``.

        ``wait=False``: None instead of collecting first (the HTTP server's I/O thread asks so).
        """
        if not self.backends:
            return False, "no GPU backend available"
        stalled = next(iter(self._stalled.items()), None)
        if stalled is not None:  # a wedged driver: not ready, whatever the age of the last success
            name, why = stalled
            b = next(b for b in self.backends if b.name == name)
            call = self._node_call(b, self._lanes[name])
            if call is not None:
                why = f"{call[0]} has not returned after {time.monotonic() - call[1]:.1f} s"
            return False, f"backend {name}: stalled: {why}"
        now = time.time()
        if self.interval <= 0 and any(self._stale(st, now, max_age) for st in self.stats.values()):
            if not wait:
                return None
            self.scrape()  # no scraper yet: collect once so readiness does not wait for Prometheus
            now = time.time()
        for name, st in self.stats.items():
            if self._stale(st, now, max_age):
                why = self._failing.get(name, "no successful collection yet")
                return False, f"backend {name}: {why}"
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        for b in self.backends:
            try:
                b.shutdown()
            except Exception:
                log.debug("shutdown of %s failed", b.name, exc_info=True)
            stop_lanes = getattr(b, "stop_lanes", None)
            if stop_lanes is not None:
                stop_lanes()
        for lane in self._lanes.values():
            lane.stop()
        for init in list(self._probing.values()):
            init.forsake()

    # --- flights ---------------------------------------------------------------------------

    @staticmethod
    def _stale(st: BackendStats, now: float, max_age: float) -> bool:
        return st.last_success_seconds is None or now - st.last_success_seconds > max_age

    def _join_or_start(self) -> _Flight:
        with self._lock:
            flight = self._flight
            if flight is None or flight.done.is_set():
                flight = _Flight(started=time.monotonic())
                self._flight = flight
                self._pending = True
                self._wake.notify()
            return flight

    def _wait(self, flight: _Flight) -> Snapshot:
        remaining = self.timeout - (time.monotonic() - flight.started)
        if flight.done.wait(max(0.0, remaining)) and flight.result is not None:
            return flight.result
        return self._partial(flight)

    def _partial(self, flight: _Flight) -> Snapshot:
        """Answer a scrape whose collection overran the timeout: what was read so far."""
        with self._lock:
            if not flight.timed_out:
                flight.timed_out = True
                name = flight.current or "collector"
                st = self.stats.get(name)
                if st is not None:
                    st.success = False
                    st.errors_total["timeout"] = st.errors_total.get("timeout", 0) + 1
                self._note_failure(name, "timeout", f"collection exceeded {self.timeout:g}s")
            # Readings older than one timeout window would be stale: serve only a fresh partial.
            fresh = time.monotonic() - flight.started <= 2 * self.timeout
            colls = [
                Collection(backend=c.backend, gpus=list(c.gpus), peers=c.peers)
                for c in flight.collections
            ] if fresh else []
        return self._snapshot(colls)

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                while not self._pending and not self._stop.is_set():
                    self._wake.wait()
                if self._stop.is_set():
                    return
                self._pending = False
                flight = self._flight
            assert flight is not None
            self._run(flight)

    def _tick(self) -> None:
        while not self._stop.is_set():
            flight = self._join_or_start()
            self._wait(flight)  # counts a timeout the same way a scrape would
            flight.done.wait()
            if self._stop.wait(self.interval):
                return

    def _run(self, flight: _Flight) -> None:
        try:
            for b in self.backends:
                coll = Collection(backend=b.name)
                with self._lock:
                    flight.collections.append(coll)
                    flight.current = b.name
                self._collect_backend(b, coll, flight)
            readings = [r for c in flight.collections for r in c.gpus]
            for observe in self.observers:
                try:
                    observe(readings)
                except Exception:  # a plugin must never break /metrics
                    log.exception("observer %r failed", observe)
            flight.result = self._snapshot(flight.collections)
            if not flight.timed_out:
                self._last = flight.result
                self._last_done = time.monotonic()
        finally:
            flight.current = None
            flight.done.set()

    def _snapshot(self, collections: list[Collection]) -> Snapshot:
        self.health.assess(collections, time.time())
        extra: list[Metric] = []
        for source in self.family_sources:
            try:
                extra.extend(source())
            except Exception:
                log.exception("metric source %r failed", source)
        stats = {k: BackendStats(**vars(v)) for k, v in self.stats.items()}
        for st in stats.values():
            st.errors_total = dict(st.errors_total)
        for b in self.backends:
            stats[b.name].interval_seconds = self.interval if self.interval > 0 else b.min_interval
        hook = None
        if self.gpu_labels is not None:
            # Freeze the extra labels now, so that one exposition agrees with the families above
            # even if the label source (pod attribution) changes before the bytes are rendered.
            frozen = {id(r): self.gpu_labels(r) for c in collections for r in c.gpus}

            def hook(r: GpuReading) -> dict[str, str]:
                return frozen.get(id(r), {})

        mig_hook = None
        if self.mig_labels is not None:
            mig_frozen = {(id(r), id(m)): self.mig_labels(r, m) for c in collections for r in c.gpus for m in r.mig}

            def mig_hook(r: GpuReading, m: MigReading) -> dict[str, str]:
                return mig_frozen.get((id(r), id(m)), {})

        return Snapshot(collections=collections, host=self.host, stats=stats, created=time.time(),
                        gpu_labels=hook, extra_families=extra, mig_labels=mig_hook)

    # --- one backend -----------------------------------------------------------------------

    def _collect_backend(self, b: Backend, coll: Collection, flight: _Flight) -> None:
        st = self.stats[b.name]
        every = self.interval if self.interval > 0 else b.min_interval
        cached = self._cached.get(b.name)
        now = time.monotonic()
        if every > 0 and cached is not None and now - cached[0] < every * 0.95:
            src = cached[1]
            coll.gpus.extend(src.gpus)
            coll.peers = src.peers
            coll.xid_counts, coll.xid_last_seconds, coll.pci_devices = (
                src.xid_counts, src.xid_last_seconds, src.pci_devices)
            return
        t0 = time.perf_counter()
        kind: str | None = None
        message = ""
        lane = self._lanes[b.name]
        probe = self._probing.get(b.name)
        if probe is not None and probe.job.finished:  # the auto probe's late init returned: use its outcome
            del self._probing[b.name]
            self._initialised[b.name] = probe.job.error is None
        collection = object()  # the key of this collection's every attempt (its GPUs' jobs are taken over)
        try:
            while True:
                job = lane.submit(functools.partial(self._init_and_collect, b, coll, lane), "collect", collection)
                held: list[int] = []  # the GPU that holds the collecting thread (_stall_left says)
                try:
                    lane.wait(job, functools.partial(self._stall_left, b, lane, t0, held))
                    break
                except LaneBusy:
                    if not held:
                        raise
                # The thread has been in one GPU's call for STAGGER_S: leave it to that GPU and collect
                # again on another thread, which takes that GPU's job over and waits for it until its call
                # deadline while it reads the others (Backend.on_gpus). A GPU holds one thread at most.
                lane.forsake(job)
                lane.reserve(len(self._known.get(b.name, ())) + 1)
                coll = self._fresh(flight, coll)  # the forsaken attempt may still append to coll
        except LaneBusy as busy:
            call = self._node_call(b, lane)
            # the same words at every collection while it hangs (the GPUs' cause); /readyz adds the age
            kind, message = STALLED, f"{busy.what} did not return" if call is None else (
                f"{call[0]} did not return within {self._node_limit(call[0]):g} s")
            coll = self._fresh(flight, coll)  # the late collection may still append to coll: publish a new one
        except BackendUnavailable as exc:
            kind, message = "unavailable", str(exc)
        except BackendError as exc:
            kind, message = exc.kind, str(exc)
        except Exception as exc:
            kind, message = "internal", f"{type(exc).__name__}: {exc}"
            log.debug("backend %s raised", b.name, exc_info=True)
        duration = time.perf_counter() - t0
        with self._lock:
            st.duration_seconds = duration
            st.collections_total += 1
            for k, n in (*coll.errors.items(), *b.drain_errors().items()):
                st.errors_total[k] = st.errors_total.get(k, 0) + n
            if kind == STALLED:
                self._stalled[b.name] = message
            elif kind is None and not flight.timed_out:
                self._stalled.pop(b.name, None)
            if kind is not None:
                st.success = False
                st.errors_total[kind] = st.errors_total.get(kind, 0) + 1
                # A failed collection publishes no readings, never stale ones; the GPUs it last
                # knew stay visible as gpu_up 0 (with their identity), so alerts see them go down.
                coll.gpus[:] = [r.down(f"{kind}: {message}", kind) for r in self._known.get(b.name, ())]
                coll.peers = []
                st.gpus = 0
            elif not flight.timed_out:
                st.success = True
                st.last_success_seconds = time.time()
                st.gpus = len(coll.gpus)
                self._known[b.name] = list(coll.gpus)
        if kind == STALLED and lane.busy() is not None:
            self._note_failure(b.name, kind, message)  # the late collection resets the backend if it fails
        elif kind is not None:
            self._note_failure(b.name, kind, message)
            self._initialised[b.name] = False
            try:
                b.reset()
            except Exception:
                log.debug("reset of %s failed", b.name, exc_info=True)
        else:
            self._note_recovery(b.name)
            if every > 0:
                self._cached[b.name] = (now, coll)

    def _fresh(self, flight: _Flight, coll: Collection) -> Collection:
        """An empty collection in ``coll``'s place in ``flight``, for a backend whose collection thread
        was left behind (it may still append to ``coll``)."""
        fresh = Collection(backend=coll.backend)
        with self._lock:
            i = next(i for i, c in enumerate(flight.collections) if c is coll)
            flight.collections[i] = fresh
        return fresh

    def _init_and_collect(self, b: Backend, coll: Collection, lane: Lane) -> None:
        """On the backend's lane: initialise it if needed (one call about no GPU named ``init``), collect."""
        mine = lane.job
        try:
            if not self._initialised[b.name]:
                node_wide = getattr(b, "node_wide", None)
                if node_wide is not None:
                    node_wide("init", b.init)
                else:
                    b.init()
                self._initialised[b.name] = True
            b.collect(coll)
            b.count_bus(coll)
        except BaseException:
            # nobody waits for this collection any more: leave the backend clean (unless it was started
            # again beside this one, which is using it)
            if mine is not None and mine.abandoned and not mine.forsaken:
                self._initialised[b.name] = False
                try:
                    b.reset()
                except Exception:
                    log.debug("reset of %s failed", b.name, exc_info=True)
            raise

    @staticmethod
    def _node_call(b: Backend, lane: Lane) -> tuple[str, float] | None:
        """The call about no GPU the backend's lane is in, and since when (monotonic), if it says."""
        node_call = getattr(b, "node_call", None)
        ident = lane.ident()
        return node_call(ident) if node_call is not None and ident is not None else None

    def _node_limit(self, what: str) -> float:
        """The deadline of a call about no GPU: the call deadline; ``init`` (a real driver may take seconds
        to load) what a scrape can wait, less one call deadline."""
        return init_deadline(self.timeout, self.call_deadline) if what == "init" else self.call_deadline

    def _stall_left(self, b: Backend, lane: Lane, started: float, held: list[int]) -> float:
        """Seconds before the backend's collection counts as stalled: the call about no GPU it is in
        overruns the call deadline (``init``: the collection timeout less one call deadline), or the
        whole collection runs past four collection timeouts (a hang outside the funnel). Or before its
        thread has been in one GPU's call for STAGGER_S: then that GPU is put in ``held``, and the
        collection starts again beside it. Asked again at least every 50 ms."""
        now = time.monotonic()
        left = 4 * self.timeout - (time.perf_counter() - started)
        call = self._node_call(b, lane)
        if call is not None:
            what, since = call
            left = min(left, since + self._node_limit(what) - now)
        gpu_call = getattr(b, "gpu_call", None)
        ident = lane.ident()
        on_gpu = gpu_call(ident) if gpu_call is not None and ident is not None else None
        if on_gpu is not None and left > 0:
            stagger = on_gpu[2] + STAGGER_S - now
            if stagger <= 0:
                held.append(on_gpu[0])
                return 0.0
            left = min(left, stagger)
        return min(left, 0.05) if left > 0 else left

    def _note_failure(self, name: str, kind: str, message: str) -> None:
        """One warning per outage (with its first cause), not one per scrape.

        The cause may change while the outage lasts (a failed collection, then the re-init
        failing differently): that goes to debug; the error counter has every kind.
        """
        previous = self._failing.get(name)
        self._failing[name] = kind
        if previous is None:
            log.warning("backend %s: collection failed (%s): %s", name, kind, message)
        elif previous != kind:
            log.debug("backend %s: still failing, now (%s): %s", name, kind, message)

    def _note_recovery(self, name: str) -> None:
        if self._failing.pop(name, None) is not None:
            log.info("backend %s: collection recovered", name)

