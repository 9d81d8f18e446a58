"""The backend interface: one small class per vendor (node_exporter style).

A backend discovers devices and fills a :class:`~exporter.readings.Collection`
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

import fnmatch
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from exporter.readings import Collection

log = logging.getLogger(__name__)


class BackendUnavailable(Exception):
    """This backend cannot run on this machine; the message says why."""


class BackendError(Exception):
    """A collection failed as a whole. ``kind`` labels the error counter."""

    def __init__(self, message: str, kind: str = "backend_error") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class FieldFilter:
    """Include/exclude lists of metric family names (shell globs, e.g. ``gpu_clock_*``)."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    _cache: dict[str, bool] = field(default_factory=dict, repr=False)

    def enabled(self, family: str) -> bool:
        hit = self._cache.get(family)
        if hit is None:
            inc = not self.include or any(fnmatch.fnmatchcase(family, p) for p in self.include)
            exc = any(fnmatch.fnmatchcase(family, p) for p in self.exclude)
            hit = self._cache[family] = inc and not exc
        return hit


@dataclass
class BackendOptions:
    fields: FieldFilter = field(default_factory=FieldFilter)
    sysfs_root: str = "/sys"
    simulated_gpus: int = 4
    simulated_leak: bool = True
    per_process: bool = False  # per-PID series are unbounded cardinality: opt-in
    pcie_throughput: bool = False  # about 20 ms per GPU per read on NVIDIA: opt-in
    command_timeout: float = 5.0  # CLI backends (rocm-smi)
    rocm_smi_path: str | None = None  # explicit rocm-smi binary; default: PATH, then /opt/rocm/bin


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
