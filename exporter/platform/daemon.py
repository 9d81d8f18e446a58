"""What every daemon (``serve``, ``profile``) does with signals, the same way.

SIGTERM and SIGINT stop it (``stop`` is called once per signal, on a thread of its own);
SIGHUP re-reads ``--web.config.file`` and its certificates now, as the exporter-toolkit's
daemons do (docs/security.md), and without a web config logs that there is nothing to reload.
The default action of SIGHUP would end the process silently (exit 129).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.platform.http import HTTPServer

log = logging.getLogger("exporter")

# How often a daemon's main thread, waiting, wakes up so that Python runs pending signal handlers (they run
# in the main thread only; serve's serve_forever polls at this interval too).
SIGNAL_POLL_S = 0.5


def reload_web_config(server: HTTPServer) -> None:
    """SIGHUP: re-read --web.config.file and its certificates now; without one, say so and go on."""
    if server.live is None:
        log.info("SIGHUP: no --web.config.file to reload; ignored")
    else:
        server.live.reload("SIGHUP")


def install_signals(server: HTTPServer, stop: Callable[[int], None]) -> None:
    """SIGTERM and SIGINT call ``stop(signum)``, SIGHUP reloads ``server``'s web config; from the main thread,
    which must then wait in steps of at most :data:`SIGNAL_POLL_S` (never a bare ``Event.wait()``)."""

    def on_stop(signum: int, frame: FrameType | None) -> None:
        # threads: logging, shutting down or loading files inside a signal handler could deadlock on a
        # lock the interrupted code holds
        threading.Thread(target=stop, args=(signum,), daemon=True).start()

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=reload_web_config, args=(server,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hangup)
