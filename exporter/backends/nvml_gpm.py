"""NVIDIA activity metrics from GPM (GPU Performance Monitoring, ``nvmlGpm*``, R520+ on Hopper and later).

DCGM's profiling fields (``DCGM_FI_PROF_*``) without a DCGM host engine. GPM computes each metric
from two samples of the GPU's counters, so :class:`GpmReader` keeps the previous sample of every
GPU (and of every MIG GPU instance) and, on each collection, takes a new one and asks
``nvmlGpmMetricsGet`` for the interval between them: no sleep in the scrape. A GPU's first
collection, or its first after an outage (any collection that did not sample it), has no previous
sample, so its activity families are absent then, never 0.

Units: GPM gives percent (published as ratios 0-1) and MiB/s (published as bytes per second).
nvidia-smi shows the same counters with ``nvidia-smi dmon -s t`` (PCIe) and, for SM and tensor
activity, only through DCGM (``dcgmi dmon -e 1002,1004``).

Every NVML call goes through the backend's funnel (:meth:`Backend.call`): a GPU lost while
sampling is ``gpu_up 0`` as for any other call. A driver without GPM (before R520) or a GPU
without it (``isSupportedDevice`` 0: before Hopper) gives absent families and one log line.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from exporter.backends.base import MISSING, Device
from exporter.core.schema import FAMILY_OF_ATTR, GPU_FAMILIES, Family

if TYPE_CHECKING:
    from exporter.backends.nvml_private import Binding
    from exporter.core.readings import GpuReading

log = logging.getLogger(__name__)

MIB = 1048576.0
WHOLE_GPU = ""  # the gpu_instance key of a whole GPU's values (an empty label is no label)

RATIO = 0.01  # GPM's percent -> a ratio
_FACTORS = {"ratio": RATIO, "bytes per second": MIB}  # a row's unit -> what one GPM unit is in it
# how a value is filed in its GpuReading dict: by (label, gpu_instance), by gpu_instance, by label
BY_KEY_AND_INSTANCE, BY_INSTANCE, BY_KEY = 0, 1, 2


def _from_schema(rows: Iterable[Family] = GPU_FAMILIES) -> tuple[tuple[int, str, str | None, float, int], ...]:
    """The metrics GPM is asked for, from the schema rows that carry NVML_GPM_METRIC_* ids (their
    ``gpm`` column): (metric id, reading attribute, label value or None, factor, how it is filed).
    Adding a GPM family is its row (and the reading's field): nothing here."""
    out: list[tuple[int, str, str | None, float, int]] = []
    for f in rows:
        if not f.gpm:
            continue
        factor = _FACTORS.get(f.unit)
        if factor is None:
            raise ValueError(f"{f.name}: GPM gives percent or MiB/s, not {f.unit!r}")
        instance = "gpu_instance" in f.labels
        shape = (BY_KEY_AND_INSTANCE if len(f.labels) > 1 else BY_INSTANCE) if instance else BY_KEY
        out.extend((metric, f.attr, key or None, factor, shape) for metric, key in f.gpm)
    return tuple(out)


_METRICS = _from_schema()
# Device-wide counters (rows without gpu_instance): not per GPU instance.
_DEVICE_ONLY = frozenset(m[1] for m in _METRICS if m[4] == BY_KEY)
# the family each GpuReading attribute above carries: its schema row's
FAMILY_OF = {attr: FAMILY_OF_ATTR[attr] for _, attr, _, _, _ in _METRICS}
FAMILIES = tuple(FAMILY_OF.values())


class _Host(Protocol):
    """What the reader needs of the NVML backend (its funnel, field selection and the loaded
    binding); not imported, so the backend can import this module."""

    binding: Binding

    def call(self, dev: Device | None, reading: str, fn: Callable[..., Any], *args: Any,
             convert: Callable[[Any], Any] | None = None, where: str | None = None) -> Any: ...

    def log_once(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None: ...

    def enabled(self, family: str) -> bool: ...

    def any_enabled(self, *families: str) -> bool: ...


@dataclass
class _Pair:
    """The previous sample of one GPU or GPU instance, and a spare to sample into."""

    prev: Any
    spare: Any
    taken: bool = False  # prev holds a sample


class GpmReader:
    """Per-GPU (and per-GPU-instance) GPM samples across collections of one NVML initialisation.

    Call :meth:`begin` before a collection, :meth:`read` per readable GPU, :meth:`end` after it
    (which drops the samples of GPUs that were not read: lost, or gone), and :meth:`close` before
    ``nvmlShutdown``.
    """

    def __init__(self, backend: _Host) -> None:
        self._b = backend
        self._pairs: dict[tuple[int, str, str], _Pair] = {}  # (gpu index, uuid, gpu_instance) -> samples
        self._seen: set[tuple[int, str, str]] = set()
        self._available: bool | None = None  # the driver has GPM (probed once per initialisation)
        # per GPU index: its reused nvmlGpmMetricsGet_t (about 19 KB; nvml_private.py), the views of its
        # metrics[] (element by element, not copies) and its version (NVML_GPM_METRICS_GET_VERSION). A GPU's
        # own: GPUs are read at once, each on its lane, and a shared request would mix their metrics
        self._requests: dict[int, tuple[Any, list[Any], int]] = {}
        self._lock = threading.Lock()  # guards the dicts only, never held over an NVML call (a hung GPU's call)
        self._wanted: dict[bool, list[tuple[int, str, str | None, float, int]]] = {}  # whole GPU? -> metrics asked

    def wanted(self) -> bool:
        return self._b.any_enabled(*FAMILIES)

    def end(self) -> None:
        """Free the samples of every GPU / instance this collection did not sample, and start the next
        collection's count. Counted from the last end, not from the collection's start: a collection the
        engine started again (exporter/backends/base.py ``on_gpus``) takes over the GPUs its forsaken
        attempt sampled, and those must not be freed as unsampled."""
        with self._lock:
            for key in [k for k in self._pairs if k not in self._seen]:
                self._free(self._pairs.pop(key))
            self._seen = set()

    def abandon(self, index: int) -> None:
        """A call on GPU ``index`` was left running (hung): forget that GPU's samples and request without
        freeing them (the late call may still fill one; the GPU gets new ones when it answers again)."""
        with self._lock:
            for key in [k for k in self._pairs if k[0] == index]:
                del self._pairs[key]
            self._requests.pop(index, None)

    def close(self) -> None:
        with self._lock:
            for pair in self._pairs.values():
                self._free(pair)
            self._pairs.clear()
            self._seen = set()
            self._available = None
            self._requests.clear()

    def supported(self, gpu: Device, handle: Any, static: dict[str, Any]) -> bool:
        """GPM on this driver and this GPU (cached in the GPU's static readings); logs once if not."""
        nv = self._b.binding.nv
        if self._available is None:
            # One system-level probe, so a driver before R520 (or a binding without GPM's internals)
            # gives one log line, not one per GPU.
            ok = self._b.call(None, "gpm:nvmlGpmQueryDeviceSupport", self._b.binding.gpm_probe)
            self._available = ok is not MISSING
        if not self._available:
            return False
        if "gpm" not in static:
            s = self._b.call(gpu, "gpm:support", nv.nvmlGpmQueryDeviceSupport, handle,
                             convert=lambda s: bool(s.isSupportedDevice))
            static["gpm"] = s is True
            if s is False:
                gpu.unsupported.update(f for f in FAMILIES if f != "gpu_pcie_throughput_bytes_per_second")
                self._b.log_once("gpm:unsupported", "nvml: GPU %d does not support GPM (needs Hopper or later): "
                                 "its SM, tensor, DRAM and NVLink activity families are absent; PCIe throughput "
                                 "only with --pcie-throughput (logged once for all GPUs)", gpu.index)
        return bool(static["gpm"])

    def read(self, gpu: Device, handle: Any, r: GpuReading, instances: list[int]) -> bool:
        """Fill ``r``'s activity fields from a new sample and the previous one.

        ``instances``: the GPU instance ids when MIG is on (one sample each), else empty (one
        sample of the whole GPU). Returns whether the GPU supports GPM.
        """
        if not self.supported(gpu, handle, getattr(gpu, "static", {})):
            return False
        nv = self._b.binding.nv
        if instances:
            for gi in sorted(set(instances)):
                self._one(gpu, r, str(gi), "nvmlGpmMigSampleGet",
                          lambda s, gi=gi: nv.nvmlGpmMigSampleGet(handle, gi, s))
        else:
            self._one(gpu, r, WHOLE_GPU, "nvmlGpmSampleGet", lambda s: nv.nvmlGpmSampleGet(handle, s))
        return True

    # --- one GPU or GPU instance -----------------------------------------------------------------

    def _one(self, gpu: Device, r: GpuReading, gi: str, where: str, sample: Any) -> None:
        key = (gpu.index, gpu.uuid, gi)
        if "gpm:sample" in gpu.unsupported:
            return
        # Only this GPU's lane touches its pairs during a collection: the lock guards the dict, never a call.
        with self._lock:
            self._seen.add(key)
            pair = self._pairs.get(key)
        if pair is None:
            pair = self._alloc(gpu)
            if pair is None:
                return
            with self._lock:
                self._pairs[key] = pair
        target = pair.spare if pair.taken else pair.prev
        ok = self._b.call(gpu, "gpm:sample", sample, target, where=where)
        if ok is MISSING:
            # No new sample: the next one starts a new interval (absent, never a stale rate).
            with self._lock:
                gone = self._pairs.pop(key, None)
            if gone is not None:
                self._free(gone)
            return
        if not pair.taken:
            pair.taken = True  # the first sample: nothing to compare with yet
            return
        values = self._b.call(gpu, "gpm:metrics", self._metrics, gpu.index, pair.prev, pair.spare, gi == WHOLE_GPU)
        pair.prev, pair.spare = pair.spare, pair.prev
        if values is MISSING:
            return
        for attr, key2, shape, v in values:
            if gi != WHOLE_GPU and shape == BY_KEY:  # a device-wide counter
                continue
            slot = getattr(r, attr)
            if shape == BY_KEY_AND_INSTANCE:
                slot[(key2, gi)] = v
            elif shape == BY_INSTANCE:
                slot[gi] = v
            else:
                slot[key2] = v

    def _alloc(self, gpu: Device) -> _Pair | None:
        nv = self._b.binding.nv
        a = self._b.call(gpu, "gpm:alloc", nv.nvmlGpmSampleAlloc)
        if a is MISSING:
            return None
        b = self._b.call(gpu, "gpm:alloc", nv.nvmlGpmSampleAlloc)
        if b is MISSING:
            self._release(a)
            return None
        return _Pair(a, b)

    def _free(self, pair: _Pair) -> None:
        self._release(pair.prev)
        self._release(pair.spare)

    def _release(self, sample: Any) -> None:
        try:
            self._b.binding.nv.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - freeing after a driver reload may fail; nothing to do
            pass

    def _request_for(self, index: int) -> tuple[Any, list[Any], int]:
        """GPU ``index``'s ``nvmlGpmMetricsGet_t`` for the whole initialisation, its slots and version
        (nvml_private.py: plain ctypes, as pynvml's printable structures cost a Python call per field
        read, which is most of GPM's cost at 16 metrics per GPU)."""
        req = self._requests.get(index)
        if req is None:
            request, slots = self._b.binding.gpm_request(len(_METRICS))
            req = (request, slots, int(request.version))
            with self._lock:
                self._requests[index] = req
        return req

    def _metrics(self, index: int, s1: Any, s2: Any, whole: bool) -> list[tuple[str, str | None, int, float]]:
        """``nvmlGpmMetricsGet`` over (s1, s2), GPU ``index``'s samples: (attribute, key, how it is filed,
        value) of each metric that answered."""
        nv = self._b.binding.nv
        wanted = self._wanted.get(whole)
        if wanted is None:  # the field selection is fixed at start: filtered once per shape
            wanted = self._wanted[whole] = [m for m in _METRICS if (whole or m[1] not in _DEVICE_ONLY)
                                            and self._b.enabled(FAMILY_OF[m[1]])]
        mg, slots, version = self._request_for(index)
        mg.version = version
        mg.numMetrics = len(wanted)
        mg.sample1, mg.sample2 = s1, s2
        # slots: views into mg.metrics (NVML_GPM_METRIC_MAX of them), made once: indexing makes an object
        for slot, m in zip(slots, wanted, strict=False):
            slot.metricId = m[0]
        nv.nvmlGpmMetricsGet(mg)
        out = []
        for res, (_, attr, key, factor, shape) in zip(slots, wanted, strict=False):
            v = res.value
            # A metric's own error (e.g. NOT_SUPPORTED on this GPU or instance) leaves it absent.
            if res.nvmlReturn == 0 and math.isfinite(v) and v >= 0.0:
                out.append((attr, key, shape, v / 100.0 if factor == RATIO else v * factor))  # 47.25 % -> 0.4725
        return out
