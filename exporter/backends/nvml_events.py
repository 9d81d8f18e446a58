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

    def start(self, gpus: Sequence[Device]) -> None:
        """Watch ``gpus`` (index and UUID as the collection knows them) in a new thread."""
        self.stop()
        self._stop = threading.Event()
        self._set = Device(-1)  # a new initialisation: everything may be asked again
        self._gpus = [_Watched(g.index, g.uuid) for g in gpus]
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.WAIT_MS / 1000 * 4)
            self._thread = None

    def snapshot(self) -> tuple[dict[tuple[int, str, str], float], dict[tuple[int, str], float]]:
        with self.lock:
            return dict(self.counts), dict(self.last)

    def _run(self, stop: threading.Event) -> None:
        """Register every reachable GPU and wait; rebuild the event set after any error.

        A lost GPU makes the wait fail (or its registration fail): the set is rebuilt with
        the GPUs that still answer, and rebuilt again periodically while one is missing, so
        it rejoins when it comes back. Event sets unsupported: the thread ends (until the next init).
        """
        while not stop.is_set():
            try:
                missing = self._watch(stop)
            except Exception as exc:  # noqa: BLE001 - a bug or a broken library: back off, keep going
                self.b.log_once(f"xid:crash:{type(exc).__name__}", "nvml: XID watcher failed: %r", exc,
                                level=logging.WARNING)
                missing = None
            if "xid:nvmlEventSetCreate" in self._set.unsupported:
                return
            if stop.wait(1.0 if missing is None else 0.0):
                return

    def _call(self, dev: Device, reading: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The funnel, in the watcher's thread: MISSING when the reading is absent, and also when the
        fault would fail a collection (a GPU down, the driver gone), which is logged once here."""
        try:
            return self.b.call(dev, reading, fn, *args)
        except (GpuDown, BackendError) as exc:
            self.b.log_once(f"{reading}:{dev.index}:{type(exc).__name__}", "nvml: XID events: GPU %s: %s",
                            dev.index if dev.index >= 0 else "-", exc)
            return MISSING

    def _watch(self, stop: threading.Event) -> int | None:
        """One event set's life. Returns how many GPUs are not watched, or None after an error
        (the caller backs off)."""
        nv, binding = self.b.binding.nv, self.b.binding
        self._set.begin()
        evset = self._call(self._set, "xid:nvmlEventSetCreate", nv.nvmlEventSetCreate)
        if evset is MISSING:
            self.b.log_once("xid:create", "nvml: XID events unavailable: nvmlEventSetCreate failed (logged above)")
            return None
        watched: dict[int, str] = {}
        unsupported = 0
        try:
            for g in self._gpus:
                g.begin()
                uuid = self._register(g, evset, binding)
                if uuid is not None:
                    watched[g.index] = uuid
                elif "xid:register" in g.unsupported:
                    unsupported += 1  # this GPU cannot: rebuilding will not change that
            if not watched:
                return None
            missing = len(self._gpus) - len(watched) - unsupported
            rebuild_at = time.monotonic() + (30.0 if missing else float("inf"))
            wait = self._waiter(evset)
            while not stop.is_set() and time.monotonic() < rebuild_at:
                data = self._call(self._set, "xid:nvmlEventSetWait_v2", wait)
                if data is MISSING:
                    self.b.log_once("xid:wait", "nvml: XID wait failed (logged above); re-registering the GPUs "
                                    "that answer")
                    return None
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
