"""NVIDIA XID errors from NVML events (``nvmlEventSetWait_v2``, ``nvmlEventTypeXidCriticalError``).

``gpu_xid_errors_total`` / ``gpu_xid_last_timestamp_seconds``: what ``dmesg`` shows as
``NVRM: Xid (PCI:...): <code>``; nvidia-smi has no equivalent. A background thread waits on an NVML
event set, so no scrape ever waits for an event; collections read its counters under a short lock.

Every NVML call of the watcher goes through the backend's funnel (:meth:`Backend.call`,
:meth:`Backend.probe`), with probe state of its own (one :class:`~exporter.backends.base.Device`
per GPU and one for the event set), so the collection's and the watcher's state never mix: a
function the driver lacks is unsupported, logged once and not asked again until NVML is
initialised again; handles come from ``nvmlDeviceGetHandleByIndex_v2``, else the pre-``_v2``
call (probed once). A fault that would fail a collection (a GPU lost, the driver gone) ends this
event set's life here instead, logged once: the set is rebuilt with the GPUs that answer.

A watcher that cannot watch costs the XID families alone (:meth:`XidWatcher.trouble`): while its
event set fails (rebuilt with a one-second back-off) or one of its calls about no GPU has not
returned within its deadline (the wait: its own ``WAIT_MS`` plus ``--call-deadline``), the counts
are not served, as they could be missing events; every other reading is untouched. A hung watcher
thread is never joined nor doubled: a re-initialisation meanwhile leaves it be, and the watcher
it asked for starts when the late call returns (one watcher thread, however long it hangs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from exporter.backends.base import MISSING, BackendError, Device, GpuDown

if TYPE_CHECKING:
    from exporter.backends.nvml_private import Binding

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event within the wait


class _Host(Protocol):
    """What the watcher needs of the NVML backend (its funnel and the loaded binding); not
    imported, so the backend can import this module."""

    binding: Binding

    def call(self, dev: Device | None, reading: str, fn: Callable[..., Any], *args: Any,
             convert: Callable[[Any], Any] | None = None) -> Any: ...

    def probe(self, dev: Device, reading: str, candidates: Sequence[tuple[str, Callable[..., Any]]], *args: Any,
              convert: Callable[[Any], Any] | None = None) -> Any: ...

    def log_once(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None: ...

    def on_gpu(self, dev: Device, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    @property
    def call_deadline(self) -> float: ...


class _Watched(Device):
    """One GPU as the watcher sees it: its own probe state and handle."""

    handle: Any = None


class XidWatcher:
    """Background thread that waits on an NVML event set for XID errors.

    It survives a lost GPU (that GPU just stops reporting) and a driver reload (the backend
    stops it before nvmlShutdown and starts a new one after the next nvmlInit). Counts are kept
    for the life of the process, so ``gpu_xid_errors_total`` is a true counter.
    """

    WAIT_MS = 500  # bounds how long stop() waits for the thread

    def __init__(self, host: _Host) -> None:
        self.b = host
        self.counts: dict[tuple[int, str, str], float] = {}
        self.last: dict[tuple[int, str], float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set = Device(-1)  # probe state of the event-set calls (no GPU)
        self._gpus: list[_Watched] = []
        self._failing: str | None = None  # why the last event set failed, until a wait answers again
        self._calling: tuple[str, float, float] | None = None  # call about no GPU in progress, since, its limit
        self._pending: list[Device] | None = None  # GPUs to watch once the hung thread returns
        self._threads = threading.Lock()  # start/stop against the end of a hung thread

    def start(self, gpus: Sequence[Device]) -> None:
        """Watch ``gpus`` (index and UUID as the collection knows them) in a new thread; while the last
        one is still in a hung call, once that call returns (never two watcher threads)."""
        self.stop()
        with self._threads:
            if self._thread is not None:  # still in a hung call: it starts the new watcher when it returns
                self._pending = list(gpus)
                return
            self._spawn(gpus)

    def _spawn(self, gpus: Sequence[Device]) -> None:
        self._stop = threading.Event()
        self._set = Device(-1)  # a new initialisation: everything may be asked again
        self._gpus = [_Watched(g.index, g.uuid) for g in gpus]
        self._failing = None
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher: wait for it to end (a wait returns within WAIT_MS), unless it is in a hung
        call, which would keep a re-initialisation waiting: that thread ends when the call returns."""
        with self._threads:
            self._pending = None
            self._stop.set()
            thread = self._thread
        if thread is None:
            return
        if self.trouble() is None or self._calling is None:
            thread.join(timeout=self.WAIT_MS / 1000 * 4)
        with self._threads:
            if self._thread is thread and not thread.is_alive():
                self._thread = None

    def trouble(self) -> str | None:
        """Why the XID counts are not served now (the same words while it lasts), or None: the watcher
        watches (or has not started)."""
        calling = self._calling
        if calling is not None and time.monotonic() - calling[1] > calling[2]:
            return f"{calling[0]} did not return within {calling[2]:g} s"
        return self._failing

    def snapshot(self) -> tuple[dict[tuple[int, str, str], float], dict[tuple[int, str], float]]:
        with self.lock:
            return dict(self.counts), dict(self.last)

    def _run(self, stop: threading.Event) -> None:
        """Register every reachable GPU and wait; rebuild the event set after any error.

        A lost GPU makes the wait fail (or its registration fail): the set is rebuilt with
        the GPUs that still answer, and rebuilt again periodically while one is missing, so
        it rejoins when it comes back. Event sets unsupported: the thread ends (until the next init).
        """
        try:
            while not stop.is_set():
                try:
                    missing = self._watch(stop)
                except Exception as exc:  # noqa: BLE001 - a bug or a broken library: back off, keep going
                    self.b.log_once(f"xid:crash:{type(exc).__name__}", "nvml: XID watcher failed: %r", exc,
                                    level=logging.WARNING)
                    self._failing = f"the watcher failed: {type(exc).__name__}"
                    missing = None
                if "xid:nvmlEventSetCreate" in self._set.unsupported:
                    self._failing = None  # no XID events on this driver: the families are absent anyway
                    return
                if stop.wait(1.0 if missing is None else 0.0):
                    return
        finally:
            with self._threads:  # a watcher asked for while this one hung starts now
                if self._thread is threading.current_thread():
                    self._thread = None
                    pending, self._pending = self._pending, None
                    if pending is not None:
                        self._spawn(pending)

    def _call(self, dev: Device, reading: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The funnel, in the watcher's thread: MISSING when the reading is absent, and also when the
        fault would fail a collection (a GPU down, the driver gone), which is logged once here. A call
        about a GPU gets its deadline on the GPU's lane; one about no GPU (the event set's) is timed here
        for :meth:`trouble` (the wait: its own WAIT_MS more)."""
        if dev.index < 0:
            limit = self.b.call_deadline + (self.WAIT_MS / 1000 if reading == "xid:nvmlEventSetWait_v2" else 0.0)
            self._calling = (str(getattr(fn, "__name__", reading)), time.monotonic(), limit)
        try:
            return self.b.call(dev, reading, fn, *args)
        except (GpuDown, BackendError) as exc:
            self.b.log_once(f"{reading}:{dev.index}:{type(exc).__name__}", "nvml: XID events: GPU %s: %s",
                            dev.index if dev.index >= 0 else "-", exc)
            return MISSING
        finally:
            if dev.index < 0:
                self._calling = None

    def _watch(self, stop: threading.Event) -> int | None:
        """One event set's life. Returns how many GPUs are not watched, or None after an error
        (the caller backs off)."""
        nv, binding = self.b.binding.nv, self.b.binding
        self._set.begin()
        evset = self._call(self._set, "xid:nvmlEventSetCreate", nv.nvmlEventSetCreate)
        if evset is MISSING:
            self.b.log_once("xid:create", "nvml: XID events unavailable: nvmlEventSetCreate failed (logged above)")
            self._failing = "nvmlEventSetCreate failed"
            return None
        watched: dict[int, str] = {}
        unsupported = 0
        try:
            for g in self._gpus:
                g.begin()
            # each GPU's registration handed to its lane, this thread waiting under the call deadline (nobody
            # watches this thread, so it never makes a GPU's call itself); a GPU whose lane still runs a
            # late call, or whose call hangs now, is not watched now (as _call's MISSING)
            for g in self._gpus:
                try:
                    uuid = self.b.on_gpu(g, self._register, g, evset=evset, binding=binding)
                except GpuDown:
                    uuid = None
                if uuid is not None:
                    watched[g.index] = uuid
                elif "xid:register" in g.unsupported:
                    unsupported += 1  # this GPU cannot: rebuilding will not change that
            if not watched:
                if unsupported < len(self._gpus):
                    self._failing = "no GPU could be registered for events"
                return None
            missing = len(self._gpus) - len(watched) - unsupported
            rebuild_at = time.monotonic() + (30.0 if missing else float("inf"))
            wait = self._waiter(evset)
            while not stop.is_set() and time.monotonic() < rebuild_at:
                data = self._call(self._set, "xid:nvmlEventSetWait_v2", wait)
                if data is MISSING:
                    self.b.log_once("xid:wait", "nvml: XID wait failed (logged above); re-registering the GPUs "
                                    "that answer")
                    self._failing = "nvmlEventSetWait_v2 failed"
                    return None
                self._failing = None  # the wait answered: every event since the set was built is counted
                if data is None or not (data.eventType & XID_EVENT):
                    continue
                idx = self._call(self._set, "xid:nvmlDeviceGetIndex", nv.nvmlDeviceGetIndex, data.device)
                if idx is MISSING:
                    continue
                key = (int(idx), watched.get(int(idx), ""), str(int(data.eventData)))
                with self.lock:
                    self.counts[key] = self.counts.get(key, 0.0) + 1.0
                    self.last[(key[0], key[1])] = time.time()
            return missing
        finally:
            self._call(self._set, "xid:nvmlEventSetFree", nv.nvmlEventSetFree, evset)

    def _register(self, g: _Watched, evset: Any, binding: Binding) -> str | None:
        """Register ``g`` for XID events: its UUID, or None when it cannot be watched now."""
        nv = binding.nv
        try:
            h = self.b.probe(g, "xid:handle", (("nvmlDeviceGetHandleByIndex_v2", nv.nvmlDeviceGetHandleByIndex),
                                               ("nvmlDeviceGetHandleByIndex", binding.handle_v1)), g.index)
        except (GpuDown, BackendError) as exc:
            self.b.log_once(f"xid:handle:{g.index}:{type(exc).__name__}", "nvml: XID events: GPU %d: %s",
                            g.index, exc)
            return None
        if h is MISSING:
            return None
        g.handle = h
        if self._call(g, "xid:register", nv.nvmlDeviceRegisterEvents, h, XID_EVENT, evset) is MISSING:
            return None
        if g.uuid:
            return g.uuid
        uuid = self._call(g, "xid:uuid", nv.nvmlDeviceGetUUID, h)
        return "" if uuid is MISSING else str(uuid)

    def _waiter(self, evset: Any) -> Callable[[], Any]:
        """``nvmlEventSetWait_v2`` for WAIT_MS: the event, or None on TIMEOUT (no event: not an error)."""
        nv = self.b.binding.nv

        def nvmlEventSetWait_v2() -> Any:  # named for the funnel's log lines
            try:
                return nv.nvmlEventSetWait_v2(evset, self.WAIT_MS)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == TIMEOUT:
                    return None
                raise

        return nvmlEventSetWait_v2
