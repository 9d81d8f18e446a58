"""pynvml's internals and NVML's C structures: the one module of the exporter that touches either.

The NVML backend (``nvml.py``, ``nvml_gpm.py``, ``nvml_events.py``) calls ``nvidia-ml-py``'s public
wrappers, except where this module goes below them, each time for a reason:

- direct calls with reused C out values (``pynvml._nvmlGetFunctionPointer``): the one-value readings,
  ECC counts, violation times, memory, utilisation, codecs, retired-page counts and per-link NVLink
  values, without a wrapper frame and a new C value per call (docs/benchmarks.md);
- functions pynvml no longer wraps, for drivers older than their versioned names: ``nvmlInit_v2``
  before ``nvmlInitWithFlags`` (keeping pynvml's ``_nvmlLib_refcount`` right under its
  ``libLoadLock``), ``nvmlDeviceGetCount``/``nvmlDeviceGetHandleByIndex`` before ``_v2`` and the
  v1 processes call;
- structures pynvml declares wrongly or slowly: ``nvmlGpuFabricInfo_t.state`` is one byte, and GPM's
  ``nvmlGpmMetricsGet_t`` as plain ctypes (pynvml's printable structures cost a Python call per
  field read), around pynvml's ``c_nvmlGpmSample_t``.

Guarded: each internal is looked up once, when :class:`Binding` is made. One that the installed
nvidia-ml-py lacks is logged once per process (one line naming it), and each reading that needs it
raises :class:`MissingInternal` when asked, which the funnel (``base.Backend.call``) treats as
unsupported: that reading is absent, every other reading is served, and nothing fails at start-up.

No other module of the exporter names a pynvml internal or declares a ctypes structure, and no
other module imports ``pynvml`` (``tests/unit/backends/test_nvml_private.py`` checks the source).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from exporter.backends.base import si

log = logging.getLogger(__name__)
_K = TypeVar("_K", bound=Hashable)  # the key a per-link value is filed under

INSUFFICIENT_SIZE = 7  # NVML_ERROR_INSUFFICIENT_SIZE: a size query's "here is the count"
U32, U64 = ctypes.c_uint, ctypes.c_ulonglong

_GPM_READINGS = "GPM (SM, tensor, DRAM and NVLink activity; PCIe throughput from GPM) is absent"
_REFCOUNT = ("pynvml's count of nvmlInit calls is not raised for nvmlInit_v2 (drivers before nvmlInitWithFlags), "
             "which only its own nvmlShutdown reads")
# The internals used, and what is lost without each (the one log line says so).
INTERNALS: dict[str, str] = {
    "_nvmlGetFunctionPointer": "the direct-call readings (temperature, power, clocks, memory, utilisation, ECC, "
                               "violations, codecs, retired pages, NVLink per link, fabric state), GPM and the "
                               "calls older drivers need instead of the _v2 ones are absent",
    "libLoadLock": _REFCOUNT,
    "_nvmlLib_refcount": _REFCOUNT,
    "c_nvmlGpmSample_t": _GPM_READINGS,
    "NVML_GPM_METRIC_MAX": _GPM_READINGS,
    "NVML_GPM_METRICS_GET_VERSION": _GPM_READINGS,
}
_GPM = ("c_nvmlGpmSample_t", "NVML_GPM_METRIC_MAX", "NVML_GPM_METRICS_GET_VERSION")
_logged: set[str] = set()  # internals reported missing in this process
_logged_lock = threading.Lock()


class MissingInternal(NotImplementedError):
    """The installed nvidia-ml-py lacks an internal this call needs. A ``NotImplementedError``: the
    funnel makes the reading unsupported (absent, logged once, not asked again until the next init)."""


# --- NVML C structures (nvml.h), declared here only ----------------------------------------------


class ViolationTime(ctypes.Structure):
    """``nvmlViolationTime_t`` (pynvml's ``c_nvmlViolationTime_t``), as a plain structure: ns."""

    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]


class Utilization(ctypes.Structure):
    """``nvmlUtilization_t``: percent of the last sample period."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class MemoryV1(ctypes.Structure):
    """``nvmlMemory_t``: bytes; ``used`` includes the driver's reservation."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    """``nvmlMemory_v2_t`` (``version`` = nvmlMemory_v2): bytes; ``used`` excludes ``reserved``."""

    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


NVML_MEMORY_V2 = ctypes.sizeof(MemoryV2) | 2 << 24  # NVML_STRUCT_VERSION(Memory, 2)


class ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t`` (drivers before R470 have only the unversioned processes call)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class FabricInfo(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` (R525+): ``state`` is an ``unsigned char`` (nvmlGpuFabricState_t),
    which pynvml's structure declares wider."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


class _DeviceStruct(ctypes.Structure):
    """``struct nvmlDevice_st``: opaque; a device handle (``nvmlDevice_t``) points to one."""


DeviceHandle = ctypes.POINTER(_DeviceStruct)  # what pynvml's handles are (its wrappers take any ctypes pointer)


class GpmMetric(ctypes.Structure):
    """``nvmlGpmMetric_t``: one metric of an ``nvmlGpmMetricsGet_t`` (value: percent or MiB/s)."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_int), ("value", ctypes.c_double),
                ("shortName", ctypes.c_void_p), ("longName", ctypes.c_void_p), ("unit", ctypes.c_void_p)]


class PerLink(Generic[_K]):
    """One per-link NVML function for one GPU (``fn(handle, *args, &value)`` per argument tuple),
    set up once: each call writes into its own slot of one C array, so a collection is one C call
    per link and one pass over the array, with no per-call Python objects."""

    def __init__(self, binding: Binding, symbol: str, ctype: Any, args: Sequence[tuple[int, ...]],
                 keys: Sequence[_K]) -> None:
        self.symbol = symbol
        self.values = (ctype * len(args))()
        size = ctypes.sizeof(ctype)
        self.calls = [(*a, ctypes.byref(self.values, size * i)) for i, a in enumerate(args)]
        self.keys = list(keys)
        self._lookup = binding.lookup

    def call(self, h: Any, each: Callable[[Any, Any, list[tuple[Any, ...]]], list[int]] | None = None,
             ) -> tuple[list[int], list[Any]]:
        """Each call's NVML status and the values array as read after all of them (same order as ``keys``).
        ``each(fn, h, calls)`` makes the calls (the funnel's Backend.each_call: each call its own deadline,
        so a batch of 72 calls is 72 vendor calls, not one that must answer within one call's deadline)."""
        fn = self._lookup(self.symbol)
        if each is None:
            return [fn(h, *args) for args in self.calls], self.values[:]
        return each(fn, h, self.calls), self.values[:]


class Binding:
    """The loaded ``pynvml`` (:attr:`nv`, its public API) and every use of its internals."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.error: type[Exception] = nv.NVMLError
        self._have: dict[str, Any] = {name: getattr(nv, name, None) for name in INTERNALS}
        self.lacking = frozenset(name for name, v in self._have.items() if v is None)
        for name in sorted(self.lacking):
            with _logged_lock:
                first = name not in _logged
                _logged.add(name)
            if first:
                log.warning("nvml: the installed nvidia-ml-py lacks pynvml.%s: %s", name, INTERNALS[name])
        lookup = self._have["_nvmlGetFunctionPointer"]
        #: ``lookup(symbol)``: the C function; NVMLError FUNCTION_NOT_FOUND when the library lacks it
        self.lookup: Callable[[str], Any] = lookup if lookup is not None else self._no_lookup
        self._gpm_struct: Any = None  # nvmlGpmMetricsGet_t's ctypes type, made at the first gpm_request

    @classmethod
    def load(cls) -> Binding:
        """``import pynvml`` (lazily: backend discovery must stay cheap); ImportError if not installed."""
        import pynvml

        return cls(pynvml)

    def _need(self, name: str) -> Any:
        v = self._have[name]
        if v is None:
            raise MissingInternal(f"the installed nvidia-ml-py lacks pynvml.{name}")
        return v

    def _no_lookup(self, symbol: str) -> Any:
        raise MissingInternal(f"the installed nvidia-ml-py lacks pynvml._nvmlGetFunctionPointer (for {symbol})")

    def check(self, ret: int) -> None:
        """An NVML status: NVMLError unless SUCCESS."""
        if ret:
            raise self.error(ret)

    # --- functions pynvml no longer wraps (drivers older than the versioned names) ---------------

    def init_v2(self) -> None:
        """``nvmlInit_v2`` (drivers before nvmlInitWithFlags), counted in pynvml's refcount as its
        own nvmlInit would, so that its nvmlShutdown keeps the count right (where it has both)."""
        self.check(self.lookup("nvmlInit_v2")())
        lock = self._have["libLoadLock"]
        if lock is not None and self._have["_nvmlLib_refcount"] is not None:
            with lock:
                self.nv._nvmlLib_refcount += 1

    def count_v1(self) -> int:
        """``nvmlDeviceGetCount`` (before ``_v2``): GPUs."""
        n = ctypes.c_uint(0)
        self.check(self.lookup("nvmlDeviceGetCount")(ctypes.byref(n)))
        return int(n.value)

    def handle_v1(self, index: int) -> Any:
        """``nvmlDeviceGetHandleByIndex`` (before ``_v2``): a pynvml device handle."""
        h = DeviceHandle()
        self.check(self.lookup("nvmlDeviceGetHandleByIndex")(ctypes.c_uint(index), ctypes.byref(h)))
        return h

    def processes_v1(self, h: Any) -> list[Any]:
        """``nvmlDeviceGetComputeRunningProcesses`` with v1 structures (``pid``, ``usedGpuMemory`` bytes)."""
        fn = self.lookup("nvmlDeviceGetComputeRunningProcesses")
        count = ctypes.c_uint(0)
        ret = fn(h, ctypes.byref(count), None)
        if ret == 0:
            return []
        if ret != INSUFFICIENT_SIZE:
            raise self.error(ret)
        count.value = count.value * 2 + 5  # room for processes started in between
        infos = (ProcessInfoV1 * count.value)()
        self.check(fn(h, ctypes.byref(count), infos))
        return [infos[i] for i in range(count.value)]

    def fabric_state(self, h: Any) -> int:
        """``nvmlDeviceGetGpuFabricInfo(...).state`` (R525+), the raw nvmlGpuFabricState_t byte."""
        info = FabricInfo()
        self.check(self.lookup("nvmlDeviceGetGpuFabricInfo")(h, ctypes.byref(info)))
        return int(info.state)

    # --- direct calls with reused C out values ----------------------------------------------------

    def direct(self, symbol: str, out_type: Any, args: tuple[int, ...] = (), member: str = "value",
               factor: float = 1.0, trailing: int = 0) -> Callable[[Any], float]:
        """``symbol(handle, *args, &out)`` as ``si(out.member, factor)``, for the funnel; ``trailing``: that many
        ``unsigned int`` outs after ``out``, written by the call and not read (the sampling period of
        ``nvmlDeviceGetEncoderUtilization(device, &percent, &period)`` and its kind).

        What pynvml's one-value wrappers do, without a new C value, argument conversions and a
        wrapper frame per call (a third of a reading's cost at 40 readings per GPU). The out value
        is reused, so each GPU has its own (its calls run on its lane, one at a time; GPUs are read at
        once, and a shared out value would carry one GPU's value into another's reading). The function
        is looked up at each call (pynvml caches it), so a missing one fails that reading only.
        """
        out = out_type()
        tail = (*args, ctypes.byref(out), *(ctypes.byref(U32()) for _ in range(trailing)))
        lookup = self.lookup  # raises FUNCTION_NOT_FOUND as the wrappers do
        error = self.error

        def get(h: Any) -> float:
            ret = lookup(symbol)(h, *tail)
            if ret:
                raise error(ret)
            return si(getattr(out, member), factor)

        get.__name__ = symbol  # what the funnel's log lines name
        return get

    def direct_outs(self, symbol: str, outs: Sequence[Any], args: tuple[int, ...] = (),
                    version: int | None = None) -> Callable[[Any], Sequence[Any]]:
        """``symbol(handle, *args, &outs[0], &outs[1], ...)`` returning ``outs`` themselves (reused
        C values: the funnel's conversion reads them before the next call). ``version``: written
        into ``outs[0].version`` before each call (versioned NVML structures)."""
        tail = (*args, *(ctypes.byref(o) for o in outs))
        lookup = self.lookup
        error = self.error
        first = outs[0]

        def get(h: Any) -> Sequence[Any]:
            if version is not None:
                first.version = version
            ret = lookup(symbol)(h, *tail)
            if ret:
                raise error(ret)
            return outs

        get.__name__ = symbol
        return get

    def retired_count(self, cause: int) -> Callable[[Any], float]:
        """nvmlDeviceGetRetiredPages(device, cause, &count, NULL): the size query of pynvml's
        wrapper alone (we publish the count, not the addresses), SUCCESS or INSUFFICIENT_SIZE."""
        count = ctypes.c_uint(0)
        ref = ctypes.byref(count)
        lookup = self.lookup
        error = self.error

        def get(h: Any) -> float:
            count.value = 0
            ret = lookup("nvmlDeviceGetRetiredPages")(h, cause, ref, None)
            if ret and ret != INSUFFICIENT_SIZE:
                raise error(ret)
            return si(count.value)

        get.__name__ = "nvmlDeviceGetRetiredPages"
        return get

    def per_link(self, symbol: str, ctype: Any, args: Sequence[tuple[int, ...]], keys: Sequence[_K]) -> PerLink[_K]:
        return PerLink(self, symbol, ctype, args, keys)

    # --- GPM ------------------------------------------------------------------------------------------

    def gpm_probe(self) -> None:
        """Whether GPM can be used at all: the driver has ``nvmlGpmQueryDeviceSupport`` (R520+) and
        the binding has the GPM internals. Raises (for the funnel) if not."""
        for name in _GPM:
            self._need(name)
        self.lookup("nvmlGpmQueryDeviceSupport")

    def gpm_request(self, slots: int) -> tuple[Any, list[Any]]:
        """A new ``nvmlGpmMetricsGet_t`` as plain ctypes (the layout of nvml.h and pynvml's
        ``c_nvmlGpmMetricsGet_t``), and views of its first ``slots`` metric slots made once (indexing a
        ctypes array makes an object: views of all NVML_GPM_METRIC_MAX slots were 4 MiB at 64 GPUs, each
        GPU having its own request, where at most ``slots`` metrics are ever asked). ``version`` is set;
        the caller fills ``numMetrics``, the samples and the slots' ``metricId``."""
        cls = self._gpm_struct
        if cls is None:  # one structure type per binding, not one per GPU
            sample_t = self._need("c_nvmlGpmSample_t")

            class MetricsGet(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                            ("sample1", sample_t), ("sample2", sample_t),
                            ("metrics", GpmMetric * int(self._need("NVML_GPM_METRIC_MAX")))]

            cls = self._gpm_struct = MetricsGet
        request = cls()
        request.version = int(self._need("NVML_GPM_METRICS_GET_VERSION"))
        metrics = request.metrics
        return request, [metrics[i] for i in range(min(slots, len(metrics)))]
