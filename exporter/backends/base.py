"""The backend interface and the one vendor-call policy (node_exporter style: one file per vendor).

A backend discovers devices and fills a :class:`~exporter.core.readings.Collection` with
vendor-neutral readings. It never builds metrics itself; the serving side does.

Every vendor call of a backend goes through :meth:`Backend.call` (or :meth:`Backend.probe` for
versioned functions). The backend only says what an exception means (:meth:`Backend.classify`);
what happens then is decided here, the same for every vendor:

``unsupported`` (:attr:`Outcome.UNSUPPORTED`: NVML ``NOT_SUPPORTED``/``FUNCTION_NOT_FOUND``/``NO_PERMISSION``,
    a function the library or the Python binding lacks, amdsmi "not supported"/"no data")
    The reading is absent and listed in ``gpu_field_unsupported``; it is logged once per GPU and
    reading, counted once as ``unsupported``, and not asked again until the library is
    initialised again.
``error`` (:attr:`Outcome.ERROR`: any other vendor error on one reading, or any other exception at
    all: a Python binding mismatch, a ctypes error, a malformed value, a "no value" sentinel)
    The reading is absent this time and asked again next time; logged once per GPU, reading and
    kind; counted as ``reading_error`` (a vendor status), ``bad_value`` (a value we cannot
    trust: malformed, out of range, a wrapper exception) or ``no_value`` (a sentinel such as
    ``0xFFFFFFFF`` or "N/A"). One failed reading never removes another reading or another GPU.
``suspect`` (:attr:`Outcome.SUSPECT`: a status that one function returns for its own reasons as
    well as for a sick device, NVML ``UNKNOWN`` (999))
    The backend's cheap identity calls on the same GPU decide (:meth:`Backend.identity_fault`,
    made at most once per GPU and collection): they answer, so it is an ``error`` of that reading
    (``reading_error``); they fail too, so the GPU is ``down``. A call outside any GPU is ``down``.
``down`` (:attr:`Outcome.DOWN`: NVML ``GPU_IS_LOST`` and device faults; amdsmi device faults)
    The GPU is published with ``gpu_up 0`` and no other reading; counted as ``gpu_lost`` or
    ``gpu_error``; logged once per outage. A GPU whose first :attr:`Backend.DOWN_AFTER` vendor
    calls of a collection all fail with vendor errors, and none succeeds, is down too.
``driver`` (:attr:`Outcome.DRIVER`: the library or the driver itself is gone)
    The whole collection fails (:class:`BackendError`, kind ``driver``); the engine publishes
    the GPUs it last knew with ``gpu_up 0``, calls :meth:`Backend.reset`, and initialises again
    on the next collection.

``hung`` (a call about one GPU that has not returned within ``--call-deadline``)
    Every call about one GPU (a :class:`Device` with an index >= 0) runs as a job of that GPU's lane
    (exporter/core/lane.py), on a thread the collection can leave behind; it waits for it at most the
    deadline.
    A call still running then is abandoned to its lane: the GPU is published ``gpu_up 0`` as
    ``hung`` (:class:`GpuHung`, counted as ``gpu_hung``) with the call named, the other GPUs are read
    on, and no call is sent to the GPU until the late one returns (at most one outstanding call and
    one thread per GPU, however long it hangs). It is read again at the first collection after.
    A backend runs a whole GPU's read as one job of its lane (:meth:`Backend.on_gpus`, the calls inside
    made directly), GPU after GPU on the collecting thread itself, with no thread hand-off. The engine,
    which waits for that thread, starts the collection again on another thread once the thread has
    been in one GPU's call for ``STAGGER_S``; that GPU keeps the thread, and its job is taken over and
    waited for until the deadline. So GPUs that start hanging in the same collection cost one deadline
    together, not one each; a thread stuck in a hung call holds that GPU's lane alone; nothing a call
    writes is shared between GPUs. A call made anywhere else is handed to its GPU's lane alone. So
    every vendor call about a GPU gets the deadline by construction, whatever the backend does, in a
    collection the engine runs. Calls about no GPU run where they are made: the engine runs each backend's
    collection on a lane of its own and publishes the backend ``stalled`` when one of them
    (:meth:`Backend.node_call`) overruns the deadline.

Only a failure to initialise, or the driver gone, fails a collection.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from threading import get_ident
from time import monotonic
from typing import Any, ClassVar, TypeVar

from exporter.core import schema
from exporter.core.errors import DRIVER as DRIVER
from exporter.core.errors import BackendError as BackendError
from exporter.core.errors import BackendUnavailable as BackendUnavailable
from exporter.core.k8s_names import KubernetesNames
from exporter.core.lane import Abandoned, Job, Lane, LaneBusy, here
from exporter.core.options import BackendOptions, BackendSetting
from exporter.core.pci import count_pci_gpus
from exporter.core.readings import Collection

log = logging.getLogger(__name__)
_D = TypeVar("_D", bound="Device")
_R = TypeVar("_R")

# Error kinds (gpu_exporter_collection_errors_total{kind}), the same on every backend.
UNSUPPORTED = "unsupported"
READING_ERROR = "reading_error"
BAD_VALUE = "bad_value"
NO_VALUE = "no_value"
GPU_LOST = "gpu_lost"
GPU_ERROR = "gpu_error"
GPU_HUNG = "gpu_hung"
# DRIVER ("driver"): exporter.core.errors, with the two collection failures the engine counts


# "No value" sentinels of NVML and amdsmi for 32- and 64-bit fields (NVML_VALUE_NOT_AVAILABLE
# as unsigned, UINT_MAX, ULLONG_MAX). A backend can add narrower ones (amdsmi's 0xFFFF).
SENTINELS = frozenset({0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF, -1})
NA_STRINGS = frozenset({"n/a", "na", "(secondary die)", "n/a (secondary die)", "", "not supported",
                        "[not supported]", "[n/a]", "unknown"})


#: Filled by the pod attribution plugins (exporter/k8s/: the kubelet's pod-resources API and DRA
#: ResourceSlices) for the GPUs of any backend that declares its ``kubernetes`` names: such a backend
#: fills them (:meth:`Backend.fills`) without listing them in its ``families``.
ATTRIBUTION_FAMILIES: frozenset[str] = frozenset({
    "gpu_allocation_info",
    "gpu_exporter_pod_attribution_up",
    "gpu_exporter_pod_resources_errors_total",
    "gpu_exporter_pod_resources_devices",
    "gpu_exporter_pod_resources_last_success_timestamp_seconds",
    "gpu_exporter_pod_resources_list_duration_seconds",
    "gpu_exporter_dra_attribution_up",
    "gpu_exporter_dra_resourceslices_errors_total",
    "gpu_exporter_watch_relists_total",  # the Pod (--per-process) and ResourceSlice watches
    "gpu_exporter_watch_errors_total",
})

#: Filled by the exporter for any backend that names the PCI vendor of its GPUs (``Backend.pci_vendor``):
#: its GPUs on the bus beside those its library sees (a GPU the driver lost), counted after each collection.
PCI_FAMILIES: frozenset[str] = frozenset({"gpu_pci_devices", "gpu_visible_devices"})


class GpuDown(Exception):
    """The GPU is unusable this collection: publish ``gpu_up 0`` and nothing else for it."""

    def __init__(self, reason: str, kind: str = GPU_ERROR) -> None:
        super().__init__(reason)
        self.kind = kind


class GpuHung(GpuDown):
    """A vendor call on this GPU has not returned within the call deadline (or an earlier one still
    has not): publish ``gpu_up 0``, state ``hung``, and send the GPU no call until it returns."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, GPU_HUNG)


class NoValue(ValueError):
    """A reading came back as a "no value" sentinel (``0xFFFFFFFF``, "N/A", NaN)."""


class Outcome(enum.Enum):
    UNSUPPORTED = "unsupported"
    ERROR = "error"
    SUSPECT = "suspect"
    DOWN = "down"
    DRIVER = "driver"


@dataclass(frozen=True)
class Verdict:
    """What one exception means (the backend's :meth:`Backend.classify`)."""

    outcome: Outcome
    kind: str
    detail: str


MISSING: Any = object()  # a call's result when the reading is absent


@dataclass
class Device:
    """Per-GPU call state kept across collections (until the library is initialised again)."""

    index: int
    uuid: str = ""
    unsupported: set[str] = field(default_factory=set)  # readings this GPU cannot give
    versions: dict[str, int] = field(default_factory=dict)  # versioned probe -> candidate that worked
    answered: int = 0  # this collection: calls that succeeded
    failed: int = 0  # this collection: vendor errors
    first_error: str = ""
    identity_checked: bool = False  # this collection: the identity calls were made
    identity_fault: Verdict | None = None  # and what their failure meant (None: they answered)

    def begin(self) -> None:
        """A new collection of this GPU starts."""
        self.answered = self.failed = 0
        self.first_error = ""
        self.identity_checked = False
        self.identity_fault = None


def si(value: Any, factor: float = 1.0, sentinels: frozenset[int] = SENTINELS) -> float:
    """``value`` times ``factor`` as a float, or :class:`NoValue` for a sentinel, N/A, NaN or infinity.

    Raises ``ValueError``/``TypeError`` for anything that is not a number: inside a
    :meth:`Backend.call` conversion that makes the reading absent, counted as ``bad_value``.
    """
    if type(value) is not int:  # an int from the binding (bool is its own type) is the common case
        if isinstance(value, bool):
            raise TypeError(f"expected a number, got {value!r}")
        if isinstance(value, str):
            if value.strip().lower() in NA_STRINGS:
                raise NoValue(f"no value ({value!r})")
            value = float(value)
    if isinstance(value, int):
        if value in sentinels:
            raise NoValue(f"no value (sentinel {value:#x})")
        x = float(value)
    else:
        x = float(value)
        if not math.isfinite(x):
            raise NoValue(f"no value ({x})")
    if factor == 1.0:
        return x
    # divide by 1000 rather than multiply by 1e-3: 1012345678 mJ is 1012345.678 J, not ...6780000001
    return x / round(1.0 / factor) if 0.0 < factor < 1.0 else x * factor


def _called(fn: Callable[..., Any], where: str | None, reading: str) -> str:
    """The name of a vendor call for the logs: ``where``, else the function's name, else the reading's."""
    return where or str(getattr(fn, "__name__", reading))


class Backend(ABC):
    """One vendor. Subclasses live one per file in ``exporter/backends/``."""

    #: registry name, as given to ``--backend``
    name: ClassVar[str]
    #: position in ``--backend auto`` (lower first); None keeps it out of auto
    auto_priority: ClassVar[int | None] = None
    #: vendor label written on gpu_info
    vendor: ClassVar[str] = "unknown"
    #: the schema families this backend fills, by name: the one declaration of vendor support
    #: (docs/metrics.md's support table is generated from it, and the contract test checks it
    #: against the live exposition). Rows marked ``every_backend`` (identity, self-metrics) are
    #: filled by the exporter for every backend and need not be listed.
    families: ClassVar[frozenset[str]] = frozenset()
    #: what this vendor's GPUs are called in Kubernetes: device-plugin resource names, an index
    #: prefix, DRA drivers (exporter/core/k8s_names.py); the pod attribution maps only these
    kubernetes: ClassVar[KubernetesNames] = KubernetesNames()
    #: settings of this backend alone (a binary's path, a timeout): ``serve`` makes each one a flag, an env
    #: twin and a YAML key and checks it up front; read with :meth:`setting`
    settings: ClassVar[tuple[BackendSetting, ...]] = ()
    #: minimum seconds between real reads (CLI backends); 0 means read on every scrape
    min_interval: ClassVar[float] = 0.0
    #: the vendor's command-line tool (``xpu-smi``): a CLI backend runs it; docs/metrics.md has a column of
    #: its ``equivalents`` (family name -> what the tool shows), where the schema rows do not give them
    tool: ClassVar[str] = ""
    equivalents: ClassVar[Mapping[str, str]] = {}
    #: the compute runtime whose version it reads into ``cuda_driver_version`` (gpu_info's ``cuda_version``):
    #: ``CUDA``, ``ROCm``; the live page and ``snapshot`` label that version with the registry's (``CUDA/ROCm``)
    runtime: ClassVar[str] = ""
    #: the oldest driver, library or tool release it supports, and how the suite holds it there; and what
    #: happens below it (the README's "Supported versions (floors)" table is generated from these)
    floor: ClassVar[str] = ""
    below_floor: ClassVar[str] = ""
    #: the PCI vendor id of its GPUs (0x10de NVIDIA, 0x1002 AMD): the exporter counts them on the bus after each
    #: collection (gpu_pci_devices beside gpu_visible_devices, :meth:`count_bus`); None: not counted
    pci_vendor: ClassVar[int | None] = None
    #: a GPU whose first DOWN_AFTER calls of a collection all fail (none answered) is down
    DOWN_AFTER: ClassVar[int] = 3

    @classmethod
    def fills(cls, family: str) -> bool:
        """Whether this backend fills ``family``: its own declaration, a row every backend gets, or, when it
        declares its GPUs' names in Kubernetes, the pod attribution's families."""
        return (family in cls.families or schema.family(family).every_backend
                or (family in ATTRIBUTION_FAMILIES and cls.kubernetes.declared)
                or (family in PCI_FAMILIES and cls.pci_vendor is not None))

    def count_bus(self, out: Collection) -> None:
        """After a collection (the engine calls it): this vendor's GPUs on the PCI bus, when the backend names
        their PCI vendor and the families are on (lspci -d <vendor>::0300 and ::0302, counted in sysfs)."""
        if self.pci_vendor is not None and out.pci_devices is None and self.any_enabled(*PCI_FAMILIES):
            out.pci_devices = count_pci_gpus(self.options.sysfs_root, self.pci_vendor)

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self._logged_once: set[str] = set()
        self._errors: dict[str, int] = {}
        self._errors_lock = threading.Lock()
        self._lanes: dict[int, Lane] = {}  # GPU index -> the thread its vendor calls run on
        self._lanes_lock = threading.Lock()
        self._node_calls: dict[int, tuple[str, float]] = {}  # thread -> the call about no GPU it is in, since

    def setting(self, name: str) -> Any:
        """The value of this backend's setting ``name`` (one of :attr:`settings`): as given, else its default."""
        for s in self.settings:
            if s.name == name:
                return self.options.backend_settings.get(name, s.default)
        raise KeyError(f"backend {self.name!r} declares no setting {name!r}")

    # --- field selection -------------------------------------------------------------------------

    def enabled(self, family: str) -> bool:
        """Whether ``family`` (an exact family name) is collected at all."""
        return self.options.fields.enabled(family)

    def any_enabled(self, *families: str) -> bool:
        return self.options.fields.any_enabled(*families)

    # --- logging and counting --------------------------------------------------------------------

    def log_once(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None:
        """Log ``msg`` the first time ``key`` is seen: no per-scrape noise."""
        if key not in self._logged_once:
            self._logged_once.add(key)
            log.log(level, msg, *args)

    def count_error(self, kind: str, n: int = 1) -> None:
        with self._errors_lock:
            self._errors[kind] = self._errors.get(kind, 0) + n

    def drain_errors(self) -> dict[str, int]:
        """Errors counted since the last drain (the engine adds them to the self-metrics)."""
        with self._errors_lock:
            out, self._errors = self._errors, {}
        return out

    # --- the funnel ------------------------------------------------------------------------------

    def classify(self, exc: BaseException) -> Verdict:
        """What ``exc`` from a vendor call means. Backends map their vendor's statuses and call
        ``super().classify`` for anything else: a non-vendor exception is a value we cannot use."""
        if isinstance(exc, NoValue):
            return Verdict(Outcome.ERROR, NO_VALUE, str(exc))
        if isinstance(exc, AttributeError | NotImplementedError):  # the Python binding lacks the function
            return Verdict(Outcome.UNSUPPORTED, UNSUPPORTED, f"{type(exc).__name__}: {exc}")
        return Verdict(Outcome.ERROR, BAD_VALUE, f"{type(exc).__name__}: {exc}"[:300])

    def call(self, dev: Device | None, reading: str, fn: Callable[..., Any], *args: Any,
             convert: Callable[[Any], Any] | None = None, where: str | None = None) -> Any:
        """``convert(fn(*args))``, or :data:`MISSING` when the reading is absent.

        ``reading`` names what is read (a family, or ``family:detail``) for the logs,
        ``gpu_field_unsupported`` and the once-only bookkeeping. ``dev`` None: a call outside
        any GPU (system-level); its unsupported/error outcomes are logged once and absent.
        Raises :class:`GpuDown` or :class:`BackendError` per the module's policy.
        """
        if dev is not None and reading in dev.unsupported:
            return MISSING
        outer = False
        if dev is not None and dev.index >= 0:
            # the hot path, about 40 times a GPU and collection: on the GPU's own lane, inside its job
            # (Backend.on_gpus); a dict look-up, one C call and attribute reads, no Python-level call
            lane = self._lanes.get(dev.index)
            if lane is None or lane.tid != get_ident():  # elsewhere: hand this one call over
                return self.on_gpu(dev, self.call, dev, reading, fn, *args,
                                   convert=convert, where=where)
            job = lane.job
            if job is not None and job.abandoned:  # back from a hung call: unwind without calling the GPU
                raise Abandoned
            lane.what = where if where else getattr(fn, "__name__", reading)  # Lane.mark inline: the deadline
            lane.since = monotonic()  # of this call starts now
        else:
            outer = self._enter_node(_called(fn, where, reading))
        try:
            value = fn(*args)
            if convert is not None:
                value = convert(value)
        except Exception as exc:  # noqa: BLE001 - the policy below decides for every exception type
            return self._fail(dev, reading, _called(fn, where, reading), exc)
        finally:
            if outer:
                self._node_calls.pop(threading.get_ident(), None)
        if dev is not None:
            dev.answered += 1
        return value

    def probe(self, dev: Device, reading: str, candidates: Sequence[tuple[str, Callable[..., Any]]], *args: Any,
              convert: Callable[[Any], Any] | None = None) -> Any:
        """A versioned call: ``candidates`` newest first. The first that is not unsupported is
        remembered for this GPU and called directly from then on; an unsupported one is never
        asked again until re-initialisation. All unsupported: the reading is unsupported."""
        if reading in dev.unsupported:
            return MISSING
        known = dev.versions.get(reading)
        if known is not None:
            name, fn = candidates[known]
            return self.call(dev, reading, fn, *args, convert=convert, where=name)
        lane = self._lane(dev)
        if lane is not None and not lane.current():
            return self.on_gpu(dev, self.probe, dev, reading, candidates, *args, convert=convert)
        outer = False
        for i, (name, fn) in enumerate(candidates):
            if lane is not None:
                if lane.abandoned():
                    raise Abandoned
                lane.mark(name)
            else:
                outer = self._enter_node(name)
            try:
                value = fn(*args)
                if convert is not None:
                    value = convert(value)
            except Exception as exc:  # noqa: BLE001 - classified below
                verdict = self.classify(exc)
                if verdict.outcome is Outcome.UNSUPPORTED and i + 1 < len(candidates):
                    self.log_once(f"probe:{dev.index}:{reading}:{name}", "%s: GPU %d: %s unavailable (%s); trying %s",
                                  self.name, dev.index, name, verdict.detail, candidates[i + 1][0])
                    continue
                return self._apply(dev, reading, name, verdict)
            finally:
                if lane is None and outer:
                    self._node_calls.pop(threading.get_ident(), None)
            dev.versions[reading] = i
            dev.answered += 1
            return value
        return MISSING  # pragma: no cover - the loop returns on the last candidate

    def _fail(self, dev: Device | None, reading: str, where: str, exc: Exception) -> Any:
        try:
            verdict = self.classify(exc)
        except Exception as inner:  # noqa: BLE001 - a classifier bug must not escape the funnel
            verdict = Verdict(Outcome.ERROR, BAD_VALUE, f"{type(exc).__name__} ({type(inner).__name__})")
        return self._apply(dev, reading, where, verdict)

    def identity_fault(self, dev: Device, where: str) -> Verdict | None:
        """Call the GPU's cheap identity functions (not ``where``, the one that just failed):
        None when they answer, else what their failure means. A backend without such calls
        cannot tell a suspect status from a device fault: down."""
        return Verdict(Outcome.DOWN, GPU_ERROR, "no identity call to tell a reading fault from a device fault")

    def _suspect(self, dev: Device | None, where: str, v: Verdict) -> Verdict:
        """A suspect status: a reading error while the GPU's identity answers, else down."""
        if dev is None:
            return Verdict(Outcome.DOWN, v.kind, v.detail)
        if not dev.identity_checked:
            dev.identity_checked = True
            try:
                dev.identity_fault = self.identity_fault(dev, where)
            except Exception as exc:  # noqa: BLE001 - a checker bug must not escape the funnel
                dev.identity_fault = Verdict(Outcome.DOWN, GPU_ERROR, f"identity check: {type(exc).__name__}")
            if dev.identity_fault is None:
                dev.answered += 1  # the GPU answered its identity: it is not silent
        fault = dev.identity_fault
        if fault is None:
            return Verdict(Outcome.ERROR, READING_ERROR, v.detail)
        if fault.outcome is Outcome.DRIVER:
            return fault
        return Verdict(Outcome.DOWN, fault.kind if fault.outcome is Outcome.DOWN else v.kind,
                       f"{v.detail}, and the identity call failed too: {fault.detail}")

    def _apply(self, dev: Device | None, reading: str, where: str, v: Verdict) -> Any:
        gpu = "-" if dev is None else str(dev.index)
        if v.outcome is Outcome.SUSPECT:
            v = self._suspect(dev, where, v)
        if v.outcome is Outcome.DRIVER:
            raise BackendError(f"{self.name}: {where} failed: {v.detail}", kind=v.kind)
        if v.outcome is Outcome.DOWN:
            if dev is None:
                raise BackendError(f"{self.name}: {where} failed: {v.detail}", kind=v.kind)
            raise GpuDown(f"{where}: {v.detail}", v.kind)
        if v.outcome is Outcome.UNSUPPORTED:
            if dev is not None:
                dev.unsupported.add(reading)
            self.count_error(UNSUPPORTED)
            self.log_once(f"unsupported:{gpu}:{reading}", "%s: GPU %s: %s not available (%s: %s); the series is "
                          "omitted", self.name, gpu, reading, where, v.detail)
            return MISSING
        self.count_error(v.kind)
        self.log_once(f"error:{gpu}:{reading}:{v.kind}", "%s: GPU %s: %s failed (%s: %s); the series is omitted "
                      "while it fails", self.name, gpu, reading, where, v.detail,
                      level=logging.WARNING if v.kind == BAD_VALUE else logging.INFO)
        if dev is not None and v.kind == READING_ERROR:
            dev.failed += 1
            dev.first_error = dev.first_error or f"{where}: {v.detail}"
            if dev.answered == 0 and dev.failed >= self.DOWN_AFTER:
                raise GpuDown(f"no answer, {dev.failed} errors, first: {dev.first_error}", GPU_ERROR)
        return MISSING

    # --- lanes: the call deadline ------------------------------------------------------------------

    @property
    def call_deadline(self) -> float:
        """Seconds a vendor call about one GPU may take before the GPU is ``hung`` (``--call-deadline``)."""
        return self.options.call_deadline

    @staticmethod
    def each_call(fn: Callable[..., _R], first: Any, calls: Iterable[tuple[Any, ...]]) -> list[_R]:
        """``[fn(first, *args) for args in calls]``: inside one funnel reading that makes many vendor calls
        (a batch, e.g. NVML's per-link counters), each call gets its own ``--call-deadline``, restarted
        before it, so a slow driver that answers every call is never ``hung`` for the batch's total; an
        abandoned job unwinds before its next call instead of calling the GPU again. The checks are
        inline: a batch of 72 calls pays no Python-level call per C call."""
        lane = here()
        if lane is None:
            return [fn(first, *args) for args in calls]
        job = lane.job
        out = []
        for args in calls:
            if job is not None and job.abandoned:
                raise Abandoned
            lane.since = monotonic()  # of this call starts now
            out.append(fn(first, *args))
        return out

    def _lane(self, dev: Device | None) -> Lane | None:
        """The lane of ``dev``'s GPU (MIG instances share their GPU's), or None for a call about no GPU."""
        if dev is None or dev.index < 0:
            return None
        lane = self._lanes.get(dev.index)
        if lane is None:
            with self._lanes_lock:
                lane = self._lanes.get(dev.index)
                if lane is None:
                    index = dev.index

                    def returned(what: str, seconds: float) -> None:
                        log.warning("%s: GPU %d: %s returned after %.1f s; the GPU is read again from the next "
                                    "collection", self.name, index, what, seconds)

                    lane = self._lanes[index] = Lane(f"{self.name}-gpu{index}", returned)
        return lane

    def on_gpu(self, dev: Device, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on ``dev``'s GPU lane, its vendor calls made there directly. Raises
        :class:`GpuHung` when a call in it has not returned within :attr:`call_deadline`, or when an
        earlier one still has not (no call is then sent to the GPU). On the lane already, or for a call
        about no GPU: runs here. A backend reads its GPUs with :meth:`on_gpus`."""
        lane = self._lane(dev)
        if lane is None or lane.current():
            return fn(*args, **kwargs)
        return self._await(dev, lane, self._hand_over(lane, lambda: fn(*args, **kwargs),
                                                   getattr(fn, "__name__", "read")))

    def on_gpus(self, devs: Sequence[_D], fn: Callable[[_D], Any]) -> Iterator[tuple[_D, Any, GpuDown | None]]:
        """``fn(dev)`` for every GPU of ``devs``, each as a job of its GPU's lane: yields ``(dev, result, None)``,
        or ``(dev, None, down)`` with the :class:`GpuDown` it raised (:class:`GpuHung` as :meth:`on_gpu`
        says), in the order of ``devs``.

        The GPUs are read one after another on the calling thread, each inside its lane's job
        (:meth:`Lane.claim`, :meth:`Lane.perform`): no thread hand-off (a hand-off to a reader thread cost a
        collection a third of its time: the wake-ups, and the work run on another CPU). The deadline is
        watched by whoever waits for the calling thread: the engine runs a collection as a job of the
        backend's lane, and once that thread has been in one GPU's call for ``lane.STAGGER_S`` it leaves the
        thread to that GPU (:meth:`Lane.forsake`) and starts the collection again on another thread. There
        each GPU's job of the forsaken attempt (the same ``fn``, GPU and collection) is taken over: its
        result when it finished (no second read), else waited for until its call deadline
        (:class:`GpuHung` after), while the other GPUs are read: GPUs that start hanging in the same
        collection cost one deadline together. The forsaken attempt stops at the first GPU it finishes
        (:class:`Abandoned`). A collection that nobody watches (a tool calling
        ``collect`` itself) waits for a hung call as the call does."""
        outer = here()
        started = outer.job if outer is not None else None  # this attempt's job (forsaken: it stops)
        # which collection (the engine's key, the same for its every attempt): a GPU's job with the same
        # read and key is this collection's, from a forsaken attempt (Lane.take)
        collection = started.key if started is not None else None
        name = getattr(fn, "__name__", "read")
        deadline = self.call_deadline
        pending: list[tuple[_D, Lane | None, Any]] = []  # read, not yet yielded (behind a GPU taken over)
        for dev in devs:
            lane = self._lane(dev)
            if lane is None or lane.current():  # no GPU's, or on this lane already: run in place
                try:
                    entry: Any = (fn(dev), None)
                except GpuDown as down:
                    entry = (None, down)
                lane = None
            else:
                try:
                    job, mine = lane.take(functools.partial(fn, dev), name,
                                          None if collection is None else (collection, fn, dev), deadline)
                except LaneBusy as busy:  # a late call still runs on that GPU: refused, the next one is read
                    entry = busy
                else:
                    if mine:
                        lane.perform(job)
                        if started is not None and started.forsaken:
                            raise Abandoned  # started again elsewhere, which takes this GPU's job over
                    entry = job
            if pending or (lane is not None and type(entry) is Job and not entry.finished):
                pending.append((dev, lane, entry))
                continue
            yield self._outcome(dev, lane, entry)
        for dev, lane, entry in pending:  # in order, each taken-over job waited for until its call deadline
            yield self._outcome(dev, lane, entry)

    def _outcome(self, dev: _D, lane: Lane | None, entry: Any) -> tuple[_D, Any, GpuDown | None]:
        if lane is None:
            return dev, entry[0], entry[1]
        try:
            return dev, self._await(dev, lane, entry), None
        except GpuDown as down:
            return dev, None, down

    def gpu_call(self, thread: int) -> tuple[int, str, float] | None:
        """(the GPU, the vendor call about it that thread ``thread`` is in, since when, monotonic), or None:
        the engine starts a collection again beside a thread held by one GPU for ``lane.STAGGER_S``."""
        for index, lane in list(self._lanes.items()):
            if lane.tid == thread:
                return index, lane.what, lane.since
        return None

    def _hand_over(self, lane: Lane, job: Callable[[], Any], what: str) -> Job | LaneBusy:
        """``job`` handed to ``lane``, or the :class:`LaneBusy` that refused it (a late call still runs)."""
        try:
            return lane.submit(job, what)
        except LaneBusy as busy:
            return busy

    def _await(self, dev: Device, lane: Lane, job: Job | LaneBusy | None) -> Any:
        """The result of ``job`` on ``dev``'s lane, waited for while its current call is within the call
        deadline; :class:`GpuHung` when it is not, or when the lane refused the job."""
        if type(job) is Job and job.finished:  # the common case: done, nothing to wait for
            if job.error is not None:
                raise job.error
            return job.result
        try:
            if isinstance(job, LaneBusy):
                raise job
            assert job is not None
            deadline = self.call_deadline
            return lane.wait(job, lambda: lane.since + deadline - time.monotonic())
        except LaneBusy as busy:
            if not busy.late:
                self.log_once(f"hung:{dev.index}:{busy.what}", "%s: GPU %d: %s; published as hung, the other "
                              "GPUs are read on", self.name, dev.index, busy, level=logging.WARNING)
                self.abandoned(dev)
            # the same words at every collection while it hangs: a cause, not a clock (it labels gpu_health_state)
            raise GpuHung(f"hung: {busy.what} did not return within {self.call_deadline:g} s") from None

    def abandoned(self, dev: Device) -> None:
        """A call on ``dev``'s GPU was left running on its lane: a backend drops here what the late call
        may still write when it returns (nvml: the GPU's GPM samples), so the GPU starts afresh."""

    def _enter_node(self, where: str) -> bool:
        """Note that this thread makes the call ``where`` about no GPU (unless it is inside one already,
        e.g. the engine's ``init``): True when this call is the outermost, which clears the note."""
        me = threading.get_ident()
        if me in self._node_calls:
            return False
        self._node_calls[me] = (where, time.monotonic())
        return True

    def node_wide(self, where: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` as one call about no GPU named ``where`` (the engine's ``init``), for :meth:`node_call`."""
        outer = self._enter_node(where)
        try:
            return fn()
        finally:
            if outer:
                self._node_calls.pop(threading.get_ident(), None)

    def node_call(self, thread: int) -> tuple[str, float] | None:
        """(the call about no GPU that thread ``thread`` is in, since when, monotonic), or None: the
        engine publishes the backend ``stalled`` when one overruns the deadline."""
        return self._node_calls.get(thread)

    def stop_lanes(self) -> None:
        for lane in list(self._lanes.values()):
            lane.stop()

    # --- lifecycle -------------------------------------------------------------------------------

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
