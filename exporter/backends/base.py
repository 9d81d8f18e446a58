"""The backend interface: one small class per vendor (node_exporter style).

A backend discovers devices and fills a :class:`~exporter.core.readings.Collection`
with vendor-neutral readings. It never builds metrics itself; the collector does.

Error contract:
- :class:`BackendUnavailable` from :meth:`Backend.init`: this vendor is not on this
  machine (library missing, no devices). ``--backend auto`` moves on to the next.
- :class:`BackendError` from :meth:`Backend.collect`: the whole collection failed
  (driver not loaded, library error). The collector reports it, calls
  :meth:`Backend.reset` and the next collection initialises again.
- A single unreadable GPU is not an error: the backend marks it ``up=False``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

from exporter.core.options import BackendOptions
from exporter.core.readings import Collection

log = logging.getLogger(__name__)


class BackendUnavailable(Exception):
    """This backend cannot run on this machine; the message says why."""


class BackendError(Exception):
    """A collection failed as a whole. ``kind`` labels the error counter."""

    def __init__(self, message: str, kind: str = "backend_error") -> None:
        super().__init__(message)
        self.kind = kind


class Backend(ABC):
    """One vendor. Subclasses live one per file in ``exporter/backends/``."""

    #: registry name, as given to ``--backend``
    name: ClassVar[str]
    #: position in ``--backend auto`` (lower first); None keeps it out of auto
    auto_priority: ClassVar[int | None] = None
    #: vendor label written on gpu_info
    vendor: ClassVar[str] = "unknown"
    #: minimum seconds between real reads (CLI backends); 0 means read on every scrape
    min_interval: ClassVar[float] = 0.0

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self._logged_once: set[str] = set()

    def enabled(self, family: str) -> bool:
        return self.options.fields.enabled(family)

    def log_once(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None:
        """Log ``msg`` the first time ``key`` is seen: no per-scrape noise."""
        if key not in self._logged_once:
            self._logged_once.add(key)
            log.log(level, msg, *args)

    @abstractmethod
    def init(self) -> None:
        """Load the vendor library and discover devices. Raise BackendUnavailable."""

    @abstractmethod
    def collect(self, out: Collection) -> None:
        """Append one reading per GPU to ``out.gpus`` as each GPU completes.

        Readings are appended GPU by GPU so that a collection cut off by the
        timeout can still serve what it has.
        """

    def reset(self) -> None:
        """Drop vendor state after a failed collection; init() runs again next time."""

    def shutdown(self) -> None:
        """Release the vendor library at exit."""
