"""One backend initialisation per process, shared by every concurrent user of the same settings (two
:class:`~exporter.python_api.recording.Monitor` objects, concurrent ``query_gpus`` calls): the backend is
shut down when the last of them is done."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from exporter.core.engine import Engine
from exporter.core.options import BackendOptions, Settings
from exporter.core.snapshot import Snapshot

log = logging.getLogger(__name__)


class GpuUnavailable(RuntimeError):
    """The GPU backend cannot be used: no GPU found, the library failed to load, a collection failed."""


def _open_engine(settings: Settings) -> Engine:
    """Initialise the chosen backends now and wrap them in an Engine that collects on demand.

    Unlike ``serve`` (which keeps a failing explicit backend and retries it on every scrape),
    a caller here must hear at once, and ``auto`` never falls back to simulated GPUs.
    """
    from exporter import backends
    from exporter.backends.base import Backend, BackendError
    from exporter.core.engine import init_deadline
    from exporter.core.host import host_info

    options = BackendOptions.from_settings(settings)
    deadline = init_deadline(settings.collection_timeout, settings.call_deadline)  # a wedged driver: heard at once
    chosen: list[Backend] = []
    if settings.backend == "auto":
        found = backends.detect(options, deadline)
        if found.backend is None:
            raise GpuUnavailable("no GPU found (" + "; ".join(found.reasons) + "); use backend 'simulated' to try "
                                 "it on simulated GPUs")
        if found.hung_init is not None:  # a wedged driver: the caller hears it now (shut down when init returns)
            found.hung_init.forsake()
            raise GpuUnavailable(f"backend {found.reasons[-1]} (a wedged driver)")
        chosen = [found.backend]
    else:
        for name in settings.backend.split(","):
            b = backends.create(name, options)
            try:
                hung = backends.init_within(b, deadline)
                if hung is not None:
                    hung.forsake()  # shut down when the late init returns
                    raise BackendError(f"init did not return within {deadline:g} s (a wedged driver)")
            except Exception as exc:  # noqa: BLE001 - reported as one line
                for c in chosen:
                    c.shutdown()
                raise GpuUnavailable(f"backend {name}: {exc}") from None
            chosen.append(b)
            if name == "simulated":
                log.warning("backend simulated: these readings are SIMULATED, not real GPUs")
    engine = Engine(chosen, host_info(), options.fields, collection_interval=0.0,
                    collection_timeout=settings.collection_timeout, cache_ttl=0.0,
                    call_deadline=settings.call_deadline, xid_severity=settings.xid_severity)
    for b in chosen:
        engine.mark_initialised(b.name)
    return engine


class _Shared:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.users = 0


_lock = threading.Lock()  # held while a backend initialises: concurrent first users wait for that one
_shared: dict[str, _Shared] = {}


@contextlib.contextmanager
def session(settings: Settings) -> Iterator[Engine]:
    """The engine for ``settings``, shared with every concurrent user of the same settings."""
    key = repr((settings.backend, BackendOptions.from_settings(settings), settings.collection_timeout))
    with _lock:
        shared = _shared.get(key)
        if shared is None:
            shared = _shared[key] = _Shared(_open_engine(settings))
        shared.users += 1
    try:
        yield shared.engine
    finally:
        with _lock:
            shared.users -= 1
            last = shared.users == 0
            if last:
                del _shared[key]
        if last:
            shared.engine.stop()


def read(engine: Engine) -> Snapshot:
    """One fresh collection from every backend; a failed backend is an error, not missing GPUs."""
    snap = engine.scrape()
    failed = [name for name, st in snap.stats.items() if not st.success]
    if failed:
        raise GpuUnavailable(f"collection failed for backend {', '.join(failed)} (see the warning logged)")
    return snap
